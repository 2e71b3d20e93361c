"""The vectorised attribution equals the method as written: the tenant's verifier ``ledger/proofcheck.py``,
one sample at a time (its stage "attribute", :func:`ledger.proofcheck.attribute_device`, standard library only).

hypothesis draws the same nasty devices as tests/test_attribution_equivalence.py (NaN in every column, gaps
and overlaps, unsorted and duplicated times, infinities, zero-length windows, suspended spans, unknown
intervals, odd thresholds), finite sample times only (a NaN time is refused by the reference); every
integer of the account must match.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ledger.method import DeviceAccount, SampleArrays, attribute_device
from ledger.method.attribution import BUCKETS, THROTTLE_REASONS, reason_bucket
from ledger import proofcheck as pc
from ledger.receipts.example import BLOCKS, EXPECTED_HOURS, START, example_entries
from tests.test_attribution_equivalence import cases


def attribute_device_reference(window, samples: SampleArrays | None, *, unknown=(), suspended=(),  # noqa: ANN001
                               rated_clock_mhz=None, thresholds=None) -> pc.Account:  # noqa: ANN001
    """proofcheck's plain attribution of the same device: the arrays as its per-sample tuples, plain floats."""
    rows = [] if samples is None else list(zip(
        samples.t.tolist(), samples.dt.tolist(), samples.activity.tolist(), samples.coarse.tolist(),
        samples.sm_clock.tolist(), samples.reasons.tolist(), samples.procs.tolist(), samples.fb_used.tolist()))
    kw = {} if thresholds is None else {"active_min": thresholds.active_min,
                                        "resident_fb_mib": thresholds.resident_fb_mib}
    return pc.attribute_device(window, rows, list(unknown), list(suspended), rated_clock_mhz, **kw)


def reason_of(mask: int) -> str:
    return THROTTLE_REASONS[pc.reason_index(mask)]


def _same_figures(fast: DeviceAccount, ref: pc.Account) -> None:
    assert (fast.paid_nanohours, fast.suspended_nanohours) == (ref.paid_nanohours, ref.suspended_nanohours)
    assert fast.buckets.tolist() == ref.buckets
    assert fast.gap_nanohours == ref.gap_nanohours and fast.unknown_causes == ref.causes
    assert (fast.fidelity, fast.coarse_nanohours) == (ref.fidelity, ref.coarse_nanohours)
    assert ref.paid_nanohours == sum(ref.buckets)
    assert pc.BUCKETS == BUCKETS and pc.THROTTLE_REASONS == THROTTLE_REASONS


def test_vectorised_attribution_equals_the_reference(soak) -> None:  # noqa: ANN001
    """``make test`` draws 120 cases (a few seconds); ``--soak`` / IPLEDGER_SOAK=1 draws 5,000."""
    @settings(max_examples=5_000 if soak else 120, deadline=None, derandomize=not soak,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def run(case) -> None:  # noqa: ANN001
        window, samples, suspended, unknown, rated, thresholds = case
        assume(not np.isnan(samples.t).any())
        kw = {"unknown": unknown, "suspended": suspended, "rated_clock_mhz": rated, "thresholds": thresholds}
        with np.errstate(all="ignore"):
            _same_figures(attribute_device(window, samples, **kw), attribute_device_reference(window, samples, **kw))

    run()


def test_reference_on_the_worked_example_of_the_document() -> None:
    """docs/method.md's worked example, through the reference alone, gives its hand-computed hours."""
    _entries, samples, spans = example_entries()
    t0 = START.timestamp()
    window = (t0, t0 + 36.0 * sum(b[1] for b in BLOCKS))
    kw = {"unknown": [(t0 + spans["H"][0], t0 + spans["H"][1], "H")],
          "suspended": [(t0 + spans["I"][0], t0 + spans["I"][1])], "rated_clock_mhz": 1980.0}
    arrays = SampleArrays.from_samples(samples)
    ref = attribute_device_reference(window, arrays, **kw)
    _same_figures(attribute_device(window, arrays, **kw), ref)
    want = {"delivered": EXPECTED_HOURS["delivered"], "underutilized": EXPECTED_HOURS["underutilized"],
            "starved": EXPECTED_HOURS["starved"], "idle_held": EXPECTED_HOURS["idle_held"],
            "unknown": EXPECTED_HOURS["unknown"],
            **{f"throttled.{k}": v for k, v in EXPECTED_HOURS["throttled"].items()}}
    assert {k: v / 1e9 for k, v in zip(pc.BUCKETS, ref.buckets)} == want
    assert (ref.paid_nanohours / 1e9, ref.suspended_nanohours / 1e9) == (EXPECTED_HOURS["paid"], EXPECTED_HOURS["suspended"])


def test_reason_precedence_is_the_table() -> None:
    masks = np.arange(-2, 0x200, dtype=np.int64)
    assert [THROTTLE_REASONS[i] for i in reason_bucket(masks)] == [reason_of(int(m)) for m in masks]


def _maybe(x: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), x)


_unit = st.floats(-0.5, 1.5, allow_nan=False)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), _maybe(st.floats(0, 100, allow_nan=False)),
                          _maybe(_unit), _maybe(_unit), _maybe(_unit), _maybe(st.floats(0, 3000, allow_nan=False)),
                          _maybe(st.integers(0, 0x1FF)), _maybe(st.integers(0, 8)),
                          _maybe(st.floats(0, 80_000, allow_nan=False))), max_size=30))
def test_the_frame_stage_reads_rows_as_the_sample_arrays_do(cols) -> None:  # noqa: ANN001
    """Stage "frame": proofcheck's sample tuples from bundle rows are the columns SampleArrays builds from the same
    samples (best activity signal, coarse flag, the clock-event mask with -1 for not measured)."""
    rows = []
    for t, dt, sm, ten, gu, clock, mask, procs, fb in cols:
        r = [None] * len(pc.SAMPLE_COLUMNS)
        for name, v in (("t", t), ("dt", dt), ("sm_active", sm), ("tensor_active", ten), ("gpu_util", gu),
                        ("sm_clock_mhz", clock), ("clock_reasons", mask), ("compute_procs", procs),
                        ("fb_used_mib", fb)):
            r[pc.SAMPLE_COLUMNS.index(name)] = v
        rows.append(r)

    def column(i: int) -> list:
        return [np.nan if c[i] is None else c[i] for c in cols]

    arrays = SampleArrays.from_columns(column(0), column(1), column(2), column(3), column(4), column(5),
                                       column(6), column(7), column(8))
    want = list(zip(arrays.t.tolist(), arrays.dt.tolist(), arrays.activity.tolist(), arrays.coarse.tolist(),
                    arrays.sm_clock.tolist(), arrays.reasons.tolist(), arrays.procs.tolist(),
                    arrays.fb_used.tolist()))
    got = pc.frame_samples(rows)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [x if x == x else "nan" for x in g] == [x if x == x else "nan" for x in w]
