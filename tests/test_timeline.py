"""Timelines: coverage identity, gaps, duplicates, out-of-order, counter resets, and every "not measured" marker."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from ledger.telemetry.timeline import BadValue, build_timeline, check_range, clean, infer_cadence


def _check_partition(tl):
    """Samples and gaps are ordered, never overlap, and exactly tile [start, end)."""
    pieces = sorted([(s.t, s.t + s.dt) for s in tl.samples] + [(g.start, g.end) for g in tl.gaps])
    for (a0, a1), (b0, b1) in zip(pieces, pieces[1:]):
        assert a1 <= b0 + 1e-6, (a0, a1, b0, b1)
    for a, b in pieces:
        assert b > a
    assert math.isclose(tl.covered_s + tl.unknown_s, tl.end - tl.start, rel_tol=1e-9, abs_tol=1e-6)
    assert pieces[0][0] == pytest.approx(tl.start) and pieces[-1][1] == pytest.approx(tl.end)


times = st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(ts=times, cadence=st.sampled_from([1.0, 10.0, 60.0]), shuffle=st.randoms(use_true_random=False))
def test_partition_invariant(ts, cadence, shuffle):
    pts = [(float(t), float(t % 7)) for t in ts]
    shuffle.shuffle(pts)          # out of order and duplicated on purpose
    tl = build_timeline("GPU-x", {"power_w": pts}, cadence=cadence)
    _check_partition(tl)
    assert [s.t for s in tl.samples] == sorted(set(float(t) for t in ts))
    for g in tl.gaps:             # every gap is a hole longer than the tolerance, minus the one covered cadence
        assert g.seconds > tl.tolerance_s - cadence - 1e-9


@settings(max_examples=100, deadline=None)
@given(ts=times, lo=st.integers(-500, 5000), width=st.integers(1, 30_000))
def test_partition_with_span(ts, lo, width):
    tl = build_timeline("GPU-x", {"gpu_util": [(float(t), 0.5) for t in ts]}, cadence=10.0,
                        span=(float(lo), float(lo + width)))
    if tl.start is None:
        return
    _check_partition(tl)
    assert tl.start >= lo and tl.end <= lo + width + 1e-9


def test_twenty_minute_hole_is_one_gap():
    pts = [(t, 0.5) for t in range(0, 7200, 60) if not (3600 <= t < 4800)]
    tl = build_timeline("G", {"sm_active": pts})
    assert tl.cadence == 60 and tl.cadence_source == "inferred"
    assert len(tl.gaps) == 1
    g = tl.gaps[0]
    assert (g.start, g.end, g.cause) == (3600, 4800, "scrape_missing")


def test_short_hole_is_covered_not_unknown():
    pts = [(t, 1.0) for t in (0, 60, 180, 240)]   # one missed scrape: 2 cadences < tolerance
    tl = build_timeline("G", {"power_w": pts}, cadence=60)
    assert tl.gaps == ()
    assert tl.samples[1].dt == 120


def test_edges_with_span_become_gaps_with_edge_cause():
    pts = [(t, 1.0) for t in range(1000, 2000, 10)]
    tl = build_timeline("G", {"power_w": pts}, cadence=10, span=(0, 3000), edge_cause="export_truncated")
    assert [(g.start, g.end, g.cause) for g in tl.gaps] == [(0, 1000, "export_truncated"),
                                                            (2000, 3000, "export_truncated")]
    _check_partition(tl)


def test_duplicates_merge_and_conflicts_become_none():
    series = {"power_w": [(0, 100.0), (0, 100.0), (10, 50.0), (10, 60.0), (20, 70.0)],
              "gpu_temp_c": [(10, 40.0)]}
    tl = build_timeline("G", series, cadence=10)
    by_t = {s.t: s for s in tl.samples}
    assert by_t[0].power_w == 100.0
    assert by_t[10].power_w is None and by_t[10].gpu_temp_c == 40.0
    assert tl.missing["power_w"]["conflicting_duplicate"] == 1
    assert len(tl.samples) == 3


def test_value_beats_not_measured_at_same_instant():
    tl = build_timeline("G", {"power_w": [(0, None), (0, 5.0)]}, cadence=1)
    assert tl.samples[0].power_w == 5.0


def test_counter_reset_is_recorded_and_raw_value_kept():
    pts = [(0, 1000.0), (10, 2000.0), (20, 50.0), (30, 60.0)]
    tl = build_timeline("G", {"energy_j": pts, "ecc_dbe_aggregate": [(0, 3.0), (30, 1.0)]}, cadence=10)
    assert [(r.field, r.t_before, r.t_after, r.before, r.after) for r in tl.resets] == [
        ("energy_j", 10, 20, 2000.0, 50.0), ("ecc_dbe_aggregate", 0, 30, 3.0, 1.0)]
    assert tl.samples[2].energy_j == 50.0


@pytest.mark.parametrize("raw,reason", [
    ("N/A", "not_available"), ("[N/A]", "not_available"), ("N/W", "not_watched"),
    ("[Not Supported]", "not_supported"), ("Not Supported", "not_supported"), ("NaN", "nan"),
    (float("nan"), "nan"), (float("inf"), "infinite"), ("-1", "negative"), (-3.5, "negative"),
    (9223372036854775794, "dcgm_blank"), ("9223372036854775794", "dcgm_blank"), (9223372036854775792, "dcgm_blank"),
    (2147483632, "dcgm_blank"), ("2147483634", "dcgm_blank"), (140737488355328.0, "dcgm_blank"),
    ("", "empty"), (None, "absent"), ("Insf. Permission", "no_permission"),
])
def test_not_measured_markers_become_none_with_reason(raw, reason):
    assert clean(raw, "power_w") == (None, reason)


def test_energy_counter_may_legitimately_equal_an_int32_blank():
    assert clean(2147483634, "energy_j") == (2147483634.0, None)


def test_real_zero_stays_zero_and_garbage_is_an_error():
    assert clean("0", "gpu_util") == (0.0, None)
    assert clean("0.000", "sm_active") == (0.0, None)
    with pytest.raises(BadValue):
        clean("abc", "power_w")
    assert check_range("sm_active", 1.5) == (None, "out_of_range")
    assert check_range("power_w", 1500.0) == (1500.0, None)


def test_infer_cadence_is_robust_to_holes():
    assert infer_cadence([0, 15, 30, 45, 600, 615, 630]) == 15
    assert infer_cadence([5]) is None


def test_lone_sample_uses_default_cadence():
    tl = build_timeline("G", {"power_w": [(100.0, 1.0)]})
    assert tl.cadence_source == "default" and tl.samples[0].dt == tl.cadence


_series = st.dictionaries(
    st.sampled_from(["power_w", "energy_j", "clock_reasons", "sm_active", "ecc_dbe_aggregate"]),
    st.lists(st.tuples(st.integers(0, 3000).map(float),
                       st.one_of(st.none(), st.integers(0, 50).map(float))), max_size=40),
    max_size=5)


@settings(max_examples=200, deadline=None)
@given(series=_series, cadence=st.sampled_from([None, 10.0, 60.0]),
       span=st.one_of(st.none(), st.tuples(st.integers(-100, 500).map(float), st.integers(600, 4000).map(float))))
def test_array_path_equals_the_per_reading_path(series, cadence, span):
    """The numpy timeline is the same function as the reference implementation, duplicates included."""
    import numpy as np

    from ledger.telemetry.timeline import build_timeline_arrays

    arrays = {k: (np.array([t for t, _ in v], dtype=float),
                  np.array([np.nan if x is None else x for _, x in v], dtype=float)) for k, v in series.items()}
    a = build_timeline_arrays("G", arrays, cadence=cadence, span=span, edge_cause="export_truncated")
    b = build_timeline("G", series, cadence=cadence, span=span, edge_cause="export_truncated")
    assert (a.cadence, a.cadence_source, a.start, a.end) == (b.cadence, b.cadence_source, b.start, b.end)
    assert a.samples == b.samples
    assert a.gaps == b.gaps
    assert a.resets == b.resets
    assert a.missing == b.missing
    assert len(a.samples) == len(b.samples) and a.covered_s == b.covered_s
    _columns_hold_to_the_samples(a, b)


def _columns_hold_to_the_samples(a, b):
    """The array path's columns (what export analysis reads instead of samples) say what the reference
    path's samples say: as rows (what a segment stores) and as the agents' sample frame."""
    import pandas as pd

    from ledger.agents.memory import _sample_frame
    from ledger.telemetry.sealed import sample_row_values
    from ledger.telemetry.timeline import timeline_columns

    if a.columns is not None:   # else a duplicate instant sent it down the reference path (no rows kept)
        assert a.rows == tuple(sample_row_values(s) for s in b.samples)
    if b.samples:
        pd.testing.assert_frame_equal(_sample_frame([("G", timeline_columns(a))]),
                                      _sample_frame([("G", timeline_columns(b))]))


def test_columns_hold_to_the_samples_with_fractional_clock_reasons():
    """clock_reasons is stored as an integer: a fractional or negative-zero reading reads back truncated."""
    import numpy as np

    from ledger.telemetry.timeline import build_timeline_arrays

    ts = np.array([0.0, 10.0, 20.0])
    arrays = {"clock_reasons": (ts, np.array([2.5, -0.0, np.nan])), "power_w": (ts, np.array([1.0, np.nan, 3.0]))}
    series = {k: [(float(t), None if v != v else float(v)) for t, v in zip(*arrays[k])] for k in arrays}
    a = build_timeline_arrays("G", arrays, cadence=10.0)
    b = build_timeline("G", series, cadence=10.0)
    assert a.columns is not None and a.samples == b.samples
    _columns_hold_to_the_samples(a, b)


@settings(max_examples=150, deadline=None)
@given(times=st.lists(st.integers(0, 3000).map(float), min_size=1, max_size=40, unique=True).map(sorted),
       fields=st.lists(st.sampled_from(["power_w", "energy_j", "clock_reasons", "sm_active"]), min_size=1,
                       max_size=4, unique=True),
       values=st.lists(st.one_of(st.none(), st.integers(0, 50).map(float)), min_size=160, max_size=160),
       cadence=st.sampled_from([None, 10.0, 60.0]),
       span=st.one_of(st.none(), st.tuples(st.integers(-100, 500).map(float), st.integers(600, 4000).map(float))))
def test_fields_read_at_the_same_instants_take_the_short_path_to_the_same_timeline(times, fields, values, cadence,
                                                                                   span):
    """Every field scraped at every instant (the usual export): the shortcut past np.unique / np.isin holds."""
    import numpy as np

    from ledger.telemetry.timeline import build_timeline_arrays

    series = {f: [(t, values[(k * 40 + i) % 160]) for i, t in enumerate(times)] for k, f in enumerate(fields)}
    arrays = {k: (np.array([t for t, _ in v], dtype=float),
                  np.array([np.nan if x is None else x for _, x in v], dtype=float)) for k, v in series.items()}
    a = build_timeline_arrays("G", arrays, cadence=cadence, span=span)
    b = build_timeline("G", series, cadence=cadence, span=span)
    assert (a.cadence, a.cadence_source, a.start, a.end, a.gaps, a.resets, a.missing) == \
        (b.cadence, b.cadence_source, b.start, b.end, b.gaps, b.resets, b.missing)
    assert a.samples == b.samples
    _columns_hold_to_the_samples(a, b)
