"""The attribution's fast per-sample path gives exactly what its straightforward formulation gave.

``ledger.method.attribution`` computes each device in as few numpy passes as it can (no sort of ordered
samples, in-place arithmetic, a reason look-up table, throttled time kept sparse). Below is a verbatim copy
of the formulation it replaced; hypothesis draws sample arrays -- NaN in every column, gaps and overlaps,
unsorted and duplicated times, infinities and zero-length windows, suspended spans and unknown intervals --
and both must give the same integer nanohours in every bucket, gap and cause, and the same timeline strip.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.method import THROTTLE_REASONS, SampleArrays, Thresholds, attribute_device, reason_bucket
from ledger.method.attribution import (
    B_DELIVERED,
    B_IDLE,
    B_STARVED,
    B_THROTTLED,
    B_UNDER,
    B_UNKNOWN,
    BUCKETS,
    DEFAULT_THRESHOLDS,
    NANOHOURS_PER_SECOND,
    REASON_BITS,
    TIMELINE_CODES,
    DeviceAccount,
    gap_portions,
    _measure,
    _nanohours,
    _overlap_with,
    finish_account,
    seconds_to_nanohours,
)

from ledger.proofcheck import union as _union


def _clip(spans, lo: float, hi: float) -> list[tuple[float, float]]:  # noqa: ANN001
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


# --- the replaced formulation, verbatim -------------------------------------------------------------------

def _old_reason_bucket(mask: np.ndarray) -> np.ndarray:
    """reason_bucket before the look-up table (verbatim)."""
    mask = np.asarray(mask, dtype=np.int64)
    out = np.full(mask.shape, THROTTLE_REASONS.index("other"), dtype=np.int64)
    decided = np.zeros(mask.shape, dtype=bool)
    valid = mask >= 0
    for name, bits in REASON_BITS:
        hit = valid & ~decided & ((mask & bits) != 0)
        out[hit] = THROTTLE_REASONS.index(name)
        decided |= hit
    return out



def _old_attribute_device(
    window: tuple[float, float],
    samples: SampleArrays | None = None,
    *,
    unknown: Sequence[tuple[float, float, str]] = (),
    suspended: Sequence[tuple[float, float]] = (),
    rated_clock_mhz: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> DeviceAccount:
    """ledger.method.attribute_device as of METHOD_VERSION 1.0.0 before its passes were cut (verbatim)."""
    s, e = float(window[0]), float(window[1])
    if e < s:
        e = s
    susp = _union(_clip(suspended, s, e))
    susp_s = _measure(susp)
    paid_nanohours = seconds_to_nanohours(e - s - susp_s)
    suspended_nanohours = seconds_to_nanohours(e - s) - paid_nanohours
    buckets = np.zeros(len(BUCKETS), dtype=np.int64)
    timeline = None
    if samples is not None and len(samples):
        order = np.argsort(samples.t, kind="stable")
        t = samples.t[order]
        end = t + np.nan_to_num(samples.dt[order])
        nxt = np.concatenate([t[1:], [np.inf]])
        a = np.clip(t, s, e)
        b = np.clip(np.minimum(end, nxt), s, e)
        length = np.maximum(b - a, 0.0)
        act = samples.activity[order]
        missing = np.isnan(act)
        # A sample with a measured activity beats a gap over the same time (the gap is another source's
        # missing evidence, e.g. an epilog that never ran); a sample without one yields to the gap's cause.
        has = ~missing & (length > 0)
        portions, gaps = gap_portions((s, e), susp, unknown, (a[has], b[has]))
        gap_total = sum(portions.values())
        covered = length - _overlap_with(susp, a, b)
        covered = np.maximum(np.where(missing, covered - _overlap_with(gaps, a, b), covered), 0.0)
        a_ = np.clip(np.nan_to_num(act), 0.0, 1.0)
        clk = samples.sm_clock[order]
        if rated_clock_mhz:
            ratio = np.where(np.isnan(clk), 1.0, np.clip(clk / float(rated_clock_mhz), 0.0, 1.0))
        else:
            ratio = np.ones_like(a_)
        procs, fb = samples.procs[order], samples.fb_used[order]
        resident = (np.nan_to_num(procs) > 0) | (np.nan_to_num(fb) > thresholds.resident_fb_mib)
        low = ~missing & (a_ < thresholds.active_min)
        working = ~missing & ~low
        # Each sample's covered time is rounded to nanohours once; its parts are split from that integer,
        # so per sample delivered + throttled + underutilized (or starved, idle, missing) == covered exactly.
        cov = _nanohours(covered)
        active = np.where(working, np.minimum(_nanohours(covered * a_), cov), 0)
        delivered = np.minimum(_nanohours(covered * a_ * ratio), active)
        throttled = active - delivered
        under = np.where(working, cov - active, 0)
        starved = np.where(low & resident, cov, 0)
        idle = np.where(low & ~resident, cov, 0)
        field_missing = np.where(missing, cov, 0)
        reason = _old_reason_bucket(samples.reasons[order])
        sums = {"delivered": int(delivered.sum()), "under": int(under.sum()), "starved": int(starved.sum()),
                "idle": int(idle.sum()), "field_missing": int(field_missing.sum()),
                "coarse": int(np.where(samples.coarse[order] & ~missing, cov, 0).sum()),
                **{f"thr{i}": int(throttled[reason == i].sum()) for i in range(len(THROTTLE_REASONS))}}
        if thresholds.timeline_bins and e > s:
            per_sample = np.stack([delivered, throttled, under, starved, idle, field_missing])
            timeline = _old_timeline((s, e), a, b, per_sample, reason, susp, thresholds.timeline_bins)
        return finish_account(paid_nanohours, suspended_nanohours, portions, sums, timeline)
    else:
        portions, _gaps = gap_portions((s, e), susp, unknown)
        gap_total = sum(portions.values())
        causes = {"field_missing": 0, "no_telemetry": paid_nanohours - gap_total}
        buckets[B_UNKNOWN] = paid_nanohours
        if thresholds.timeline_bins and e > s:
            timeline = _old_timeline((s, e), np.zeros(0), np.zeros(0), np.zeros((6, 0), dtype=np.int64),
                                 np.zeros(0, dtype=np.int64), susp, thresholds.timeline_bins)
    return DeviceAccount(paid_nanohours=paid_nanohours, buckets=buckets, suspended_nanohours=suspended_nanohours, gap_nanohours=portions,
                         unknown_causes=causes, fidelity="none", coarse_nanohours=0, timeline=timeline)



def _old_timeline(window: tuple[float, float], a: np.ndarray, b: np.ndarray, per_sample: np.ndarray,
              reason: np.ndarray, susp: list[tuple[float, float]], bins: int) -> np.ndarray:
    """_timeline before throttled time came sparse (verbatim)."""
    s, e = window
    width = (e - s) / bins
    mids = (a + b) / 2.0
    idx = np.clip(((mids - s) / width).astype(np.int64), 0, bins - 1) if mids.size else np.zeros(0, np.int64)
    mat = np.zeros((len(TIMELINE_CODES), bins))
    delivered, throttled, under, starved, idle, fmiss = per_sample
    mat[B_DELIVERED] = np.bincount(idx, weights=delivered, minlength=bins)
    for i, name in enumerate(THROTTLE_REASONS):
        sel = reason == i
        mat[B_THROTTLED[name]] = np.bincount(idx[sel], weights=throttled[sel], minlength=bins)
    mat[B_UNDER] = np.bincount(idx, weights=under, minlength=bins)
    mat[B_STARVED] = np.bincount(idx, weights=starved, minlength=bins)
    mat[B_IDLE] = np.bincount(idx, weights=idle, minlength=bins)
    edges = s + width * np.arange(bins + 1)
    susp_in = _overlap_with(susp, edges[:-1], edges[1:]) * NANOHOURS_PER_SECOND
    mat[len(BUCKETS)] = susp_in
    known = mat.sum(axis=0)
    mat[B_UNKNOWN] = np.maximum(width * NANOHOURS_PER_SECOND - known, 0.0) + np.bincount(idx, weights=fmiss, minlength=bins)
    return (mat / np.maximum(mat.sum(axis=0), 1e-300)).T.astype(np.float32)




def _old_from_columns(t, dt, sm_active=None, tensor_active=None, gpu_util=None, sm_clock=None,  # noqa: ANN001
                      reasons=None, procs=None, fb_used=None) -> SampleArrays:
    """SampleArrays.from_columns before its shortcut for columns without NaN (verbatim)."""
    t = np.asarray(t, dtype=np.float64)
    n = t.shape[0]

    def col(x):  # noqa: ANN001, ANN202
        return np.full(n, np.nan) if x is None else np.asarray(x, dtype=np.float64)

    sm, ten, gu = col(sm_active), col(tensor_active), col(gpu_util)
    fine = np.where(np.isnan(sm), ten, sm)
    act = np.where(np.isnan(fine), gu, fine)
    coarse = np.isnan(fine) & ~np.isnan(gu)
    r = np.full(n, -1, dtype=np.int64) if reasons is None else np.where(
        np.isnan(np.asarray(reasons, dtype=np.float64)), -1, np.nan_to_num(np.asarray(reasons, dtype=np.float64))
    ).astype(np.int64)
    return SampleArrays(t=t, dt=col(dt), activity=act, coarse=coarse, sm_clock=col(sm_clock), reasons=r,
                        procs=col(procs), fb_used=col(fb_used))


# --- the comparison -----------------------------------------------------------------------------------------

T0 = 1_780_000_000.0
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0]


def _same(new: DeviceAccount, old: DeviceAccount) -> None:
    assert new.paid_nanohours == old.paid_nanohours
    assert new.suspended_nanohours == old.suspended_nanohours
    assert new.buckets.dtype == old.buckets.dtype and new.buckets.tolist() == old.buckets.tolist()
    assert new.gap_nanohours == old.gap_nanohours
    assert new.unknown_causes == old.unknown_causes
    assert (new.fidelity, new.coarse_nanohours) == (old.fidelity, old.coarse_nanohours)
    assert (new.timeline is None) == (old.timeline is None)
    if new.timeline is not None:
        assert new.timeline.dtype == old.timeline.dtype
        assert np.array_equal(new.timeline, old.timeline, equal_nan=True)


def _same_arrays(new: SampleArrays, old: SampleArrays) -> None:
    for name in ("t", "dt", "activity", "coarse", "sm_clock", "reasons", "procs", "fb_used"):
        x, y = getattr(new, name), getattr(old, name)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name


def _column(draw, n: int, values) -> np.ndarray:  # noqa: ANN001
    """n values, about one in five of them NaN, an infinity or a signed zero."""
    special = st.sampled_from(SPECIAL)
    return np.array(draw(st.lists(st.one_of(values, values, values, special), min_size=n, max_size=n)),
                    dtype=np.float64)


@st.composite
def cases(draw):  # noqa: ANN001, ANN201
    start = T0 + draw(st.sampled_from([0.0, 0.25, 0.123456]))
    length = draw(st.one_of(st.just(0.0), st.just(-5.0), st.floats(0, 86400), st.integers(1, 4000).map(float)))
    window = (start, start + length)
    n = draw(st.integers(1, 60))
    cadence = draw(st.sampled_from([1.0, 10.0, 30.0]))
    t = start - draw(st.integers(0, 3)) * cadence + cadence * np.arange(n)
    t += np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.5, -0.5, 3.0, -cadence]), min_size=n, max_size=n)))
    layout = draw(st.sampled_from(["as drawn", "sorted", "shuffled", "duplicated", "reversed"]))
    if layout == "sorted":
        t = np.sort(t)
    elif layout == "shuffled":
        t = t[np.array(draw(st.permutations(range(n))), dtype=np.int64)]
    elif layout == "duplicated":
        t = np.sort(np.concatenate([t, t[: draw(st.integers(1, n))]]))
    elif layout == "reversed":
        t = t[::-1].copy()
    if draw(st.integers(0, 9)) == 0:
        t[draw(st.integers(0, len(t) - 1))] = np.nan
    m = len(t)
    frac = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 0.01, 0.049, 0.05, 1.0, 1.5, -0.2]))
    columns = {
        "dt": _column(draw, m, st.sampled_from([cadence, cadence, 2 * cadence, 0.5, 0.0, -1.0])),
        "sm_active": _column(draw, m, frac), "tensor_active": _column(draw, m, frac),
        "gpu_util": _column(draw, m, frac),
        "sm_clock": _column(draw, m, st.one_of(st.floats(0, 3000), st.sampled_from([1410.0, 1980.0]))),
        "reasons": _column(draw, m, st.one_of(st.integers(-1, 0x1FF), st.sampled_from([0x20, 0x4, 0x80, 0x10]))
                           .map(float)),
        "procs": _column(draw, m, st.integers(-1, 3).map(float)),
        "fb_used": _column(draw, m, st.sampled_from([0.0, 511.0, 512.0, 513.0, 70000.0])),
    }
    if draw(st.booleans()):  # SM activity measured throughout (from_columns' shortcut)
        columns["sm_active"] = np.nan_to_num(columns["sm_active"], nan=0.5)
    with np.errstate(invalid="ignore"):  # an infinite reason mask cast to int64, as before
        samples = SampleArrays.from_columns(t=t, **columns)
        _same_arrays(samples, _old_from_columns(t=t, **columns))
    if draw(st.booleans()):  # the coarse flag set directly, also where it cannot arise from the columns
        coarse = np.array(draw(st.lists(st.booleans(), min_size=m, max_size=m)), dtype=bool)
        samples = SampleArrays(**{**samples.__dict__, "coarse": coarse})

    def span():  # noqa: ANN202
        a = start + draw(st.floats(-100, max(length, 0) + 100))
        return a, a + draw(st.one_of(st.floats(-10, 2000), st.sampled_from([0.0, cadence])))

    suspended = [span() for _ in range(draw(st.integers(0, 2)))]
    unknown = [(*span(), f"gap-{draw(st.integers(0, 2))}") for _ in range(draw(st.integers(0, 3)))]
    rated = draw(st.sampled_from([None, 0.0, 1410.0, 1980.0]))
    thresholds = draw(st.sampled_from([DEFAULT_THRESHOLDS, Thresholds(timeline_bins=0), Thresholds(timeline_bins=1),
                                       Thresholds(active_min=0.0, resident_fb_mib=-1.0, timeline_bins=7),
                                       Thresholds(active_min=float("nan"), resident_fb_mib=float("nan"))]))
    return window, samples, suspended, unknown, rated, thresholds


def test_fast_attribution_equals_the_replaced_one(soak) -> None:  # noqa: ANN001
    """``make test`` draws 150 cases (about 15 s here); ``--soak`` / IPLEDGER_SOAK=1 draws 5,000."""
    @settings(max_examples=5_000 if soak else 150, deadline=None, derandomize=not soak,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def run(case) -> None:  # noqa: ANN001
        _compare(*case)

    run()


def _compare(window, samples, suspended, unknown, rated, thresholds) -> None:  # noqa: ANN001
    kw = {"unknown": unknown, "suspended": suspended, "rated_clock_mhz": rated, "thresholds": thresholds}
    with np.errstate(all="ignore"):
        try:
            old = _old_attribute_device(window, samples, **kw)
        except (OverflowError, ValueError) as exc:  # nonsense input (a NaN time): the same refusal
            try:
                attribute_device(window, samples, **kw)
            except type(exc):
                return
            raise AssertionError(f"the replaced formulation raised {exc!r}, the fast one did not") from None
        _same(attribute_device(window, samples, **kw), old)


def test_fast_attribution_equals_the_replaced_one_on_a_receipt_sized_device() -> None:
    """Bench-like devices (three days at 10 s, throttled now and then), ordered and not, with spans."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        n = 25_920
        t = T0 + 10.0 * np.arange(n)
        busy = np.sin(np.arange(n) / 300) > -0.6
        act = np.where(busy, rng.uniform(0.55, 0.98, n), rng.uniform(0.0, 0.03, n))
        act[rng.random(n) < 0.01] = np.nan
        reasons = np.where(rng.random(n) < 0.03, rng.choice([0x20, 0x4, 0x8, 0x10, 0x1], n), 0).astype(float)
        clock = np.where(reasons > 0, 1410.0, 1980.0)
        if seed == 2:
            t = t[rng.permutation(n)]
        samples = SampleArrays.from_columns(t=t, dt=np.full(n, 10.0), sm_active=act, sm_clock=clock, reasons=reasons,
                                            procs=busy.astype(float), fb_used=busy * 70000.0 + 1024.0)
        window = (T0 + 5.0, T0 + 10.0 * n - 7.0)
        for kw in ({}, {"rated_clock_mhz": 1980.0},
                   {"rated_clock_mhz": 1755.0, "suspended": [(T0 + 3600.0, T0 + 7300.5)],
                    "unknown": [(T0 + 7000.0, T0 + 9000.0, "g1"), (T0 + 8000.0, T0 + 20000.0, "g2")]}):
            new, old = attribute_device(window, samples, **kw), _old_attribute_device(window, samples, **kw)
            _same(new, old)
            assert new.paid_nanohours == int(new.buckets.sum())


def test_reason_table_equals_the_precedence_loop() -> None:
    masks = np.concatenate([np.arange(-3, 0x400), [1 << 40, (1 << 40) | 0x20, -(1 << 40), np.iinfo(np.int64).min,
                                                   np.iinfo(np.int64).max]]).astype(np.int64)
    assert reason_bucket(masks).tolist() == _old_reason_bucket(masks).tolist()
    assert reason_bucket(np.zeros(0, dtype=np.int64)).shape == (0,)
