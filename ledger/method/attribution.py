"""Per-device attribution of allocated time to buckets (docs/method.md, "ipledger-attribution" 1.0.0).

Everything here is pure and vectorised (numpy): one call per device, arrays in, integers out. The unit of
account is the **nanohour** (1e-9 GPU-hour, 3.6 µs): each sample's share of each bucket is rounded to whole
nanohours once, then only integers are added, so the identity ``paid = Σ buckets`` holds exactly and the
result is the same in every process and on every database backend.

The method's plain scalar parts are the tenant's verifier's, imported from :mod:`ledger.proofcheck` (standard
library only, which imports nothing from here): its constants, the interval arithmetic (paid window, gap spans),
the settling of the rounding residue and the whole summary-only path. What is here is the vectorised per-sample
pass; ``ledger.proofcheck.attribute_device`` is the same pass one sample at a time, and
tests/test_method_reference.py holds the two equal under hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from .. import proofcheck as plain
from ..proofcheck import (  # noqa: F401  (the method's constants: one definition, the verifier's)
    B_DELIVERED,
    B_IDLE,
    B_STARVED,
    B_THROTTLED,
    B_UNDER,
    B_UNKNOWN,
    BUCKETS,
    METHOD_NAME,
    METHOD_VERSION,
    NANOHOURS_PER_SECOND,
    REASON_BITS,
    THROTTLE_REASONS,
    gap_spans,
    paid_window,
)
from ..proofcheck import hours as nanohours_to_hours  # noqa: F401  (exactly the decimal with 9 places)
from ..proofcheck import to_nanohours as seconds_to_nanohours
from ..proofcheck import union

TIMELINE_CODES = (*BUCKETS, "suspended")  # timeline strip values index this tuple


@dataclass(frozen=True)
class Thresholds:
    """The method's thresholds (changing one changes METHOD_VERSION)."""

    active_min: float = 0.05        # activity below this counts as "not working" (starved or idle_held)
    resident_fb_mib: float = 512.0  # framebuffer use above this means a process holds the device
    timeline_bins: int = 96         # resolution of the per-device timeline strip (PDF only, not hashed)


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class SampleArrays:
    """One device's samples as columns (NaN = not measured; reasons -1 = not measured)."""

    t: np.ndarray
    dt: np.ndarray
    activity: np.ndarray      # best activity signal in [0, 1]
    coarse: np.ndarray        # bool: activity came from the coarse gpu_util fallback
    sm_clock: np.ndarray      # MHz
    reasons: np.ndarray       # int64 clock-event reason bitmask
    procs: np.ndarray         # compute processes on the device
    fb_used: np.ndarray       # MiB
    # The raw pipe and memory fields the effective-compute lens reads (method 1.1, ledger.method.lens); NaN =
    # not measured, None = not read at all (the time identity never looks at them).
    sm: np.ndarray | None = None
    tensor: np.ndarray | None = None
    occupancy: np.ndarray | None = None
    dram: np.ndarray | None = None
    fp64: np.ndarray | None = None
    fp32: np.ndarray | None = None
    fp16: np.ndarray | None = None
    ops: np.ndarray | None = None   # floating-point operations counted in the sample's dt (AMD op counters)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    @classmethod
    def from_columns(cls, t, dt, sm_active=None, tensor_active=None, gpu_util=None, sm_clock=None,  # noqa: ANN001
                     reasons=None, procs=None, fb_used=None, sm_occupancy=None, dram_active=None,
                     fp64_active=None, fp32_active=None, fp16_active=None, ops=None) -> "SampleArrays":
        t = np.asarray(t, dtype=np.float64)
        n = t.shape[0]

        def col(x):  # noqa: ANN001, ANN202
            return np.full(n, np.nan) if x is None else np.asarray(x, dtype=np.float64)

        sm, ten, gu = col(sm_active), col(tensor_active), col(gpu_util)
        # Best signal: SM active (profiling); tensor active where SM active is absent; else coarse util.
        sm_missing = np.isnan(sm)
        if sm_missing.any():
            fine = np.where(sm_missing, ten, sm)
            fine_missing = np.isnan(fine)
            act = np.where(fine_missing, gu, fine)
            coarse = fine_missing & ~np.isnan(gu)
        else:  # the usual case, SM activity throughout: nothing to fall back on
            act, coarse = sm, np.zeros(n, dtype=bool)
        if reasons is None:
            r = np.full(n, -1, dtype=np.int64)
        else:
            rf = np.asarray(reasons, dtype=np.float64)
            # NaN (not measured) is -1; infinities as nan_to_num makes them (no bitmask is infinite)
            r = rf.astype(np.int64) if np.isfinite(rf).all() else np.where(np.isnan(rf), -1, np.nan_to_num(rf)).astype(np.int64)
        def lens_col(x):  # noqa: ANN001, ANN202 - a field only the lens reads: None when not read at all
            return None if x is None else np.asarray(x, dtype=np.float64)

        return cls(t=t, dt=col(dt), activity=act, coarse=coarse, sm_clock=col(sm_clock), reasons=r,
                   procs=col(procs), fb_used=col(fb_used), sm=sm, tensor=ten, occupancy=lens_col(sm_occupancy),
                   dram=lens_col(dram_active), fp64=lens_col(fp64_active), fp32=lens_col(fp32_active),
                   fp16=lens_col(fp16_active), ops=lens_col(ops))

    @classmethod
    def from_samples(cls, samples: Sequence[Any]) -> "SampleArrays":
        """From ledger.telemetry.model.Sample objects of one device."""
        def g(name):  # noqa: ANN001, ANN202
            return [np.nan if getattr(s, name) is None else getattr(s, name) for s in samples]

        return cls.from_columns(g("t"), g("dt"), g("sm_active"), g("tensor_active"), g("gpu_util"),
                                g("sm_clock_mhz"), g("clock_reasons"), g("compute_procs"), g("fb_used_mib"),
                                sm_occupancy=g("sm_occupancy"), dram_active=g("dram_active"),
                                fp64_active=g("fp64_active"), fp32_active=g("fp32_active"),
                                fp16_active=g("fp16_active"), ops=g("fp_ops"))


@dataclass
class DeviceAccount:
    """The result for one device: integer nanohours per bucket, per gap and per unknown cause."""

    paid_nanohours: int
    buckets: np.ndarray                       # int64, len(BUCKETS); sums to paid_nanohours
    suspended_nanohours: int
    gap_nanohours: dict[str, int] = field(default_factory=dict)        # unknown_interval id -> nanohours here
    unknown_causes: dict[str, int] = field(default_factory=dict)  # unattributed unknown by cause
    fidelity: str = "none"                    # samples | summary | none
    coarse_nanohours: int = 0                        # nanohours classified from the coarse utilisation signal
    # per time bin, the share of each TIMELINE_CODES entry (rows sum to 1); drawn as the PDF strip only
    timeline: np.ndarray | None = None

    def as_dict(self) -> dict[str, int]:
        return {name: int(v) for name, v in zip(BUCKETS, self.buckets)}

    def plain(self) -> plain.Account:
        """The same integers as the verifier's :class:`ledger.proofcheck.Account` (no timeline strip)."""
        return plain.Account(int(self.paid_nanohours), [int(b) for b in self.buckets], int(self.suspended_nanohours),
                             dict(self.gap_nanohours), dict(self.unknown_causes), self.fidelity, int(self.coarse_nanohours))

    @classmethod
    def of_plain(cls, acc: plain.Account, timeline: np.ndarray | None = None) -> "DeviceAccount":
        """The verifier's account as the package's (buckets as an int64 vector, beside the timeline strip)."""
        return cls(paid_nanohours=acc.paid_nanohours, buckets=np.array(acc.buckets, dtype=np.int64),
                   suspended_nanohours=acc.suspended_nanohours, gap_nanohours=acc.gap_nanohours, unknown_causes=acc.causes,
                   fidelity=acc.fidelity, coarse_nanohours=acc.coarse_nanohours, timeline=timeline)


# --- interval helpers (sorted, disjoint lists of (a, b)) ---------------------------------------------------

def _measure(spans: Sequence[tuple[float, float]]) -> float:
    return math.fsum(b - a for a, b in spans)


def _overlap_with(spans: Sequence[tuple[float, float]], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Vectorised |[a_i, b_i) ∩ spans| via the cumulative measure function of the (disjoint) spans."""
    if not spans or a.shape[0] == 0:
        return np.zeros_like(a)
    return _overlap_arrays(np.array([x for x, _ in spans]), np.array([y for _, y in spans]), a, b)


def _overlap_arrays(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The same over spans given as sorted, disjoint start/end arrays."""
    if starts.shape[0] == 0 or a.shape[0] == 0:
        return np.zeros_like(a)
    cum = np.concatenate([[0.0], np.cumsum(ends - starts)])

    def F(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, x, side="right")  # spans starting at or before x
        j = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.clip(x - starts[j], 0.0, ends[j] - starts[j]), 0.0)
        return cum[j] + inside

    return np.maximum(F(b) - F(a), 0.0)


def _reason_table() -> np.ndarray:
    """THROTTLE_REASONS index for every combination of the six bits REASON_BITS look at (mask >> 2, 0..63),
    plus entry 64 for an unknown mask: the precedence loop run once, so a sample costs one table look-up."""
    table = np.full(65, THROTTLE_REASONS.index("other"), dtype=np.int64)
    for code in range(64):
        for name, bits in REASON_BITS:
            if (code << 2) & bits:
                table[code] = THROTTLE_REASONS.index(name)
                break
    return table


_REASON_TABLE = _reason_table()
assert all(bits & ~0xFC == 0 for _name, bits in REASON_BITS), "the table covers bits 0x4..0x80 only"


def reason_bucket(mask: np.ndarray) -> np.ndarray:
    """THROTTLE_REASONS index for each clock-event reason bitmask (-1 = unknown mask -> "other")."""
    mask = np.asarray(mask, dtype=np.int64)
    code = np.right_shift(mask, 2)
    np.bitwise_and(code, 63, out=code)
    code[mask < 0] = 64
    return _REASON_TABLE[code]


def _nanohours(x: np.ndarray) -> np.ndarray:
    """Seconds -> whole nanohours, half up: floor(x * NH + 0.5) (a rule SQL can reproduce exactly, unlike
    numpy's half-to-even rint)."""
    return np.floor(x * NANOHOURS_PER_SECOND + 0.5).astype(np.int64)


def gap_portions(window: tuple[float, float], suspended: list[tuple[float, float]],
                  unknown: Sequence[tuple[float, float, str]],
                  measured: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[dict[str, int], list[tuple[float, float]]]:
    """(nanohours per gap, union of all gap spans). ``measured``: sorted disjoint (starts, ends) of samples
    that carry a measurement; a gap yields to them (evidence from another source beats a missing one)."""
    spans = gap_spans(window, suspended, unknown)
    portions = {}
    for gap_id, sp in spans.items():
        secs = _measure(sp)
        if measured is not None and sp:
            secs -= float(_overlap_arrays(measured[0], measured[1], np.array([x for x, _ in sp]),
                                          np.array([y for _, y in sp])).sum())
        portions[gap_id] = seconds_to_nanohours(max(secs, 0.0))
    return portions, union([x for sp in spans.values() for x in sp])


def attribute_device(
    window: tuple[float, float],
    samples: SampleArrays | None = None,
    *,
    unknown: Sequence[tuple[float, float, str]] = (),
    suspended: Sequence[tuple[float, float]] = (),
    rated_clock_mhz: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> DeviceAccount:
    """Bucket one device's allocated window [start, end) (epoch seconds) from its samples.

    ``unknown`` are (start, end, gap_id) spans of unknown_interval entries that apply to this device, in
    ledger order; ``suspended`` are suspended spans (reported beside the buckets, not inside them).
    """
    return _attribute(window, samples, unknown, suspended, rated_clock_mhz, thresholds, None)[0]


T = TypeVar("T")


@dataclass(frozen=True)
class CoveredSamples:
    """Per-sample figures of one device that :func:`attribute_device` computes on the way to its integers and
    method 1.1's lens (:func:`ledger.method.lens.lens_device`) reads instead of computing them again. Columns
    are in ``order`` (an index into the device's samples, or a slice standing for the identity); the arrays are
    the attribution's own, valid only while :func:`attribute_device_covered` runs ``use``."""

    order: np.ndarray | slice
    covered: np.ndarray          # covered seconds c
    ratio: np.ndarray | None     # clock ratio r = min(clock / rated, 1), at least 0 (None: no rated clock, r = 1)
    delivered: np.ndarray        # c x activity x r seconds (activity clipped to [0, 1], unmeasured as 0)
    working: np.ndarray          # bool: activity measured and at least active_min


def attribute_device_covered(window: tuple[float, float], samples: SampleArrays | None, *,
                             use: Callable[[CoveredSamples], T], unknown: Sequence[tuple[float, float, str]] = (),
                             suspended: Sequence[tuple[float, float]] = (), rated_clock_mhz: float | None = None,
                             thresholds: Thresholds = DEFAULT_THRESHOLDS) -> tuple[DeviceAccount, T | None]:
    """:func:`attribute_device` (the same account, integer for integer) and what ``use`` made of its per-sample
    figures (None without samples): the lens reads them in the attribution's own pass. The arrays are valid only
    during the call (the attribution then rounds them to nanohours in place)."""
    return _attribute(window, samples, unknown, suspended, rated_clock_mhz, thresholds, use)


def _attribute(window: tuple[float, float], samples: SampleArrays | None,
               unknown: Sequence[tuple[float, float, str]], suspended: Sequence[tuple[float, float]],
               rated_clock_mhz: float | None, thresholds: Thresholds, use: Callable[[CoveredSamples], T] | None
               ) -> tuple[DeviceAccount, T | None]:
    s, e, susp, paid_nanohours, suspended_nanohours = paid_window(window, suspended)
    if samples is not None and len(samples):
        return _attribute_samples((s, e), samples, susp, unknown, paid_nanohours, suspended_nanohours, rated_clock_mhz,
                                  thresholds, use)
    portions, _gaps = gap_portions((s, e), susp, unknown)
    gap_total = sum(portions.values())
    causes = {"field_missing": 0, "no_telemetry": paid_nanohours - gap_total}
    buckets = np.zeros(len(BUCKETS), dtype=np.int64)
    buckets[B_UNKNOWN] = paid_nanohours
    timeline = None
    if thresholds.timeline_bins and e > s:
        none = np.zeros(0, dtype=np.int64)
        timeline = _timeline((s, e), np.zeros(0), np.zeros(0), (none, (none, none, none), none, none, none, none),
                             susp, thresholds.timeline_bins)
    return DeviceAccount(paid_nanohours=paid_nanohours, buckets=buckets, suspended_nanohours=suspended_nanohours, gap_nanohours=portions,
                         unknown_causes=causes, fidelity="none", coarse_nanohours=0, timeline=timeline), None


def _attribute_samples(window: tuple[float, float], samples: SampleArrays, susp: list[tuple[float, float]],
                       unknown: Sequence[tuple[float, float, str]], paid_nanohours: int, suspended_nanohours: int,
                       rated_clock_mhz: float | None, thresholds: Thresholds,
                       use: Callable[[CoveredSamples], T] | None = None) -> tuple[DeviceAccount, T | None]:
    """The per-sample half of :func:`attribute_device`, in as few numpy passes as the formulas allow; ``use``
    is handed the per-sample seconds (:class:`CoveredSamples`) before they are rounded in place (one array
    more: delivered seconds beside the clock ratio).

    This is the receipt's hot loop (tens of thousands of samples per device, a thousand devices), so work is
    done in place and skipped where it cannot change a result (no reordering of ordered samples, no overlap
    with spans that are absent); every float operation is the one docs/method.md defines, in the same order,
    so the integers are exactly those of the method as written, one sample at a time, in
    :func:`ledger.proofcheck.attribute_device`, the tenant's verifier (tests/test_method_reference.py compares
    under hypothesis).
    """
    s, e = window
    t = samples.t
    # Samples arrive time-ordered from the ledger; a stable sort of ordered times is the identity.
    ordered = t.shape[0] < 2 or bool(np.all(t[1:] >= t[:-1]))
    if ordered:
        def take(x: np.ndarray) -> np.ndarray:
            return x
    else:
        order = np.argsort(t, kind="stable")

        def take(x: np.ndarray) -> np.ndarray:
            return x[order]
        t = take(t)
    act = take(samples.activity)
    a, b, covered, present, portions = covered_time(t, take(samples.dt), act, (s, e), susp, unknown)
    # Activity clipped to [0, 1], unmeasured as 0 (fmax drops the NaN).
    activity = np.fmax(act, 0.0)
    np.fmin(activity, 1.0, out=activity)
    resident = np.greater(take(samples.procs), 0.0)
    fb = take(samples.fb_used)
    if thresholds.resident_fb_mib >= 0:
        resident |= fb > thresholds.resident_fb_mib
    else:  # a negative threshold counts unmeasured framebuffer (0) as resident
        resident |= np.nan_to_num(fb) > thresholds.resident_fb_mib
    below = activity < thresholds.active_min
    low = below & present
    working = np.logical_xor(present, low)  # present and not low
    # Each sample's covered time is rounded to nanohours once; its parts are split from that integer,
    # so per sample delivered + throttled + underutilized (or starved, idle, missing) == covered exactly.
    busy = np.multiply(covered, activity)  # seconds at work, before the clock ratio
    ratio = None
    if rated_clock_mhz:
        ratio = np.divide(take(samples.sm_clock), float(rated_clock_mhz))
        np.fmin(ratio, 1.0, out=ratio)  # an unmeasured clock (NaN) counts as full speed
        np.maximum(ratio, 0.0, out=ratio)
        # (in place of the ratio; where ``use`` reads the ratio too, in the clipped activity's array, which
        # nothing reads after ``busy``: no new array for the lens)
        delivered_s = np.multiply(busy, ratio, out=activity if use else ratio)
    else:  # full speed throughout: delivered starts from the same integers as active
        delivered_s = busy
    used = None
    if use is not None:
        used = use(CoveredSamples(order=slice(None) if ordered else order, covered=covered, ratio=ratio,
                                  delivered=delivered_s, working=working))
    cov = _nanohours_inplace(covered)
    if rated_clock_mhz:
        delivered = _nanohours_inplace(delivered_s)
        active = _nanohours_inplace(busy)
    else:
        active = _nanohours_inplace(busy)
        delivered = active.copy()
    np.minimum(active, cov, out=active)
    active *= working
    np.minimum(delivered, active, out=delivered)
    throttled = np.subtract(active, delivered)
    under = np.subtract(cov, active)
    under *= working
    starved_mask = low & resident
    starved = cov * starved_mask
    idle = cov * np.logical_xor(low, starved_mask)
    field_missing = cov * ~present
    throttled_at = np.flatnonzero(throttled)  # usually few samples: only these need their reason decoded
    throttled_nz = throttled[throttled_at]
    reason_nz = reason_bucket(samples.reasons[throttled_at if ordered else order[throttled_at]])
    coarse = take(samples.coarse) & present
    sums = {"delivered": int(delivered.sum()), "under": int(under.sum()), "starved": int(starved.sum()),
            "idle": int(idle.sum()), "field_missing": int(field_missing.sum()),
            "coarse": int(cov.sum(where=coarse)),
            **{f"thr{i}": int(throttled_nz[reason_nz == i].sum()) for i in range(len(THROTTLE_REASONS))}}
    timeline = None
    if thresholds.timeline_bins and e > s:
        timeline = _timeline((s, e), a, b, (delivered, (throttled_at, throttled_nz, reason_nz), under, starved,
                                            idle, field_missing), susp, thresholds.timeline_bins)
    return finish_account(paid_nanohours, suspended_nanohours, portions, sums, timeline), used


def covered_time(t: np.ndarray, dt: np.ndarray, act: np.ndarray, window: tuple[float, float],
                 susp: list[tuple[float, float]], unknown: Sequence[tuple[float, float, str]]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """Samples in time order -> (span starts, span ends, covered seconds, activity measured, nanohours per gap):
    the covered time ``c`` both the time identity and method 1.1's lens use."""
    s, e = window
    # A sample lasts dt (none without one) and at most until the next sample starts.
    b = np.add(t, dt) if np.isfinite(dt).all() else np.add(t, np.nan_to_num(dt))
    np.minimum(b[:-1], t[1:], out=b[:-1])
    np.clip(b, s, e, out=b)
    a = np.clip(t, s, e)
    covered = np.subtract(b, a)
    np.maximum(covered, 0.0, out=covered)
    present = np.equal(act, act)  # activity measured (not NaN)
    # A sample with a measured activity beats a gap over the same time (the gap is another source's
    # missing evidence, e.g. an epilog that never ran); a sample without one yields to the gap's cause.
    measured = None
    if unknown:
        has = present & (covered > 0)
        measured = (a[has], b[has])
    portions, gaps = gap_portions((s, e), susp, unknown, measured)
    if susp:
        covered -= _overlap_with(susp, a, b)
    if gaps:
        np.subtract(covered, _overlap_with(gaps, a, b), out=covered, where=~present)
    if susp or gaps:
        np.maximum(covered, 0.0, out=covered)
    return a, b, covered, present, portions


def _nanohours_inplace(seconds: np.ndarray) -> np.ndarray:
    """:func:`_nanohours` of non-negative (or NaN) seconds, reusing the argument's memory: x * NH + 0.5 is then at
    least 0.5, where the integer conversion's truncation is the floor, so that pass is left out."""
    seconds *= NANOHOURS_PER_SECOND
    seconds += 0.5
    return seconds.astype(np.int64)


def finish_account(paid_nanohours: int, suspended_nanohours: int, portions: dict[str, int], sums: Mapping[str, int],
                   timeline: np.ndarray | None) -> DeviceAccount:
    """From a device's integer sums per bucket to its account: settle the rounding residue, split unknown by
    cause (kept separate so any other way of producing the sums ends exactly alike)."""
    buckets = np.zeros(len(BUCKETS), dtype=np.int64)
    buckets[B_DELIVERED] = sums["delivered"]
    for i, name in enumerate(THROTTLE_REASONS):
        buckets[B_THROTTLED[name]] = sums[f"thr{i}"]
    buckets[B_UNDER] = sums["under"]
    buckets[B_STARVED] = sums["starved"]
    buckets[B_IDLE] = sums["idle"]
    # field_missing is unknown but not a gap: it stays inside the settled vector for the residue step.
    buckets[B_UNKNOWN] = sums["field_missing"]
    settled = plain.finish_account(paid_nanohours, suspended_nanohours, portions, buckets.tolist(), "samples", sums["coarse"])
    return DeviceAccount.of_plain(settled, timeline)


def _timeline(window: tuple[float, float], a: np.ndarray, b: np.ndarray, per_sample: tuple,
              susp: list[tuple[float, float]], bins: int) -> np.ndarray:
    """Share of each bucket (TIMELINE_CODES order) per time bin, (bins, codes) float32, for the PDF strip.

    ``per_sample``: nanohours per sample of delivered, (throttled as sample indices, nanohours, reasons),
    underutilized, starved, idle_held, field_missing."""
    s, e = window
    width = (e - s) / bins
    if a.size:
        mids = np.add(a, b)
        mids /= 2.0
        mids -= s
        mids /= width
        idx = mids.astype(np.int64)
        np.clip(idx, 0, bins - 1, out=idx)
    else:
        idx = np.zeros(0, np.int64)
    mat = np.zeros((len(TIMELINE_CODES), bins))
    delivered, (throttled_at, throttled, reason), under, starved, idle, fmiss = per_sample
    mat[B_DELIVERED], mat[B_UNDER], mat[B_STARVED], mat[B_IDLE], fmiss_in = _bin_sums(
        idx, bins, (delivered, under, starved, idle, fmiss))
    # Throttled time comes as (sample index, nanohours, reason) of the samples that have any: the bins get
    # the same additions in the same order as from the full arrays, without their zeros.
    throttled_idx = idx[throttled_at]
    for i, name in enumerate(THROTTLE_REASONS):
        sel = reason == i
        mat[B_THROTTLED[name]] = np.bincount(throttled_idx[sel], weights=throttled[sel], minlength=bins)
    edges = s + width * np.arange(bins + 1)
    susp_in = _overlap_with(susp, edges[:-1], edges[1:]) * NANOHOURS_PER_SECOND
    mat[len(BUCKETS)] = susp_in
    known = mat.sum(axis=0)
    mat[B_UNKNOWN] = np.maximum(width * NANOHOURS_PER_SECOND - known, 0.0) + fmiss_in
    return (mat / np.maximum(mat.sum(axis=0), 1e-300)).T.astype(np.float32)


def _bin_sums(idx: np.ndarray, bins: int, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per bin, the sum of each integer weight array over the samples in that bin, as float64.

    ``np.bincount(idx, weights=w)`` adds the weights as floats one at a time. While they are non-negative
    integers whose total is below 2**53, every partial sum is an integer a float holds exactly, so its result
    is the exact integer sum -- which, for samples in bin order (the usual case), one integer reduction per
    bin gives at a fraction of the cost. Anything else goes to bincount itself.
    """
    if idx.size and bool(np.all(idx[1:] >= idx[:-1])) and all(int(w.min()) >= 0 for w in weights):
        bounds = np.searchsorted(idx, np.arange(bins + 1))
        filled = bounds[:-1] < bounds[1:]
        starts = bounds[:-1][filled]  # one run of samples per filled bin, each to the next one's start
        sums = [np.add.reduceat(w, starts) for w in weights]
        if sum(int(x.sum()) for x in sums) < 2 ** 53:  # each bin's partial sums lie below its total
            out = []
            for x in sums:
                full = np.zeros(bins)
                full[filled] = x
                out.append(full)
            return out
    return [np.bincount(idx, weights=w, minlength=bins) for w in weights]



# --- summary-only runs (DCGM job stats) --------------------------------------------------------------------

def attribute_summary(
    window: tuple[float, float],
    payload: Mapping[str, Any],
    *,
    unknown: Sequence[tuple[float, float, str]] = (),
    suspended: Sequence[tuple[float, float]] = (),
    rated_clock_mhz: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> DeviceAccount:
    """Bucket one device from its DCGM job-stats summary alone (fidelity "summary"): the verifier's plain
    :func:`ledger.proofcheck.attribute_summary` (a few integers, nothing to vectorise), and its timeline strip."""
    settled = plain.attribute_summary(window, payload, unknown, suspended, rated_clock_mhz, thresholds.active_min)
    s, e, susp, _paid, _suspended = paid_window(window, suspended)
    buckets = np.array(settled.buckets, dtype=np.int64)
    timeline = None
    if thresholds.timeline_bins and e > s:  # a summary has no time structure: the same shares in every bin
        bins = thresholds.timeline_bins
        width = (e - s) / bins
        edges = s + width * np.arange(bins + 1)
        sus = _overlap_with(susp, edges[:-1], edges[1:]) / width
        shares = buckets / buckets.sum() if buckets.sum() else np.eye(len(BUCKETS))[B_UNKNOWN]
        timeline = np.zeros((bins, len(TIMELINE_CODES)), dtype=np.float32)
        timeline[:, :len(BUCKETS)] = np.outer(1.0 - sus, shares)
        timeline[:, len(BUCKETS)] = sus
    return DeviceAccount.of_plain(settled, timeline)
