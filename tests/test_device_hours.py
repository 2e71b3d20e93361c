"""Device-hours (ledger/telemetry/hours.py): the numpy aggregate equals the one-sample-at-a-time reference,
pieces of a device-hour in several segments merge to the whole, the buckets read from them are the method's,
and they are written when a segment is sealed, backfilled by the migration and checked by `ipledger verify`."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.method import BUCKETS, SampleArrays, attribute_device, nanohours_to_hours
from ledger.receipts.auto import verify_checks
from ledger.telemetry import hours
from ledger.telemetry.model import SAMPLE_COLUMNS, Sample
from ledger.telemetry.sealed import segment_entry, write_segment
from ledger.chain.verify import verify

T0 = 1_760_000_000.0 - 1_760_000_000.0 % 3600

maybe = st.one_of(st.none(), st.floats(0, 1.2, allow_nan=False))


@st.composite
def fleets(draw) -> list[Sample]:  # noqa: ANN001
    out = []
    for d in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 25))
        t = T0 + draw(st.integers(0, 3000))
        for _ in range(n):
            dt = draw(st.sampled_from([10.0, 60.0, 300.0]))
            out.append(Sample(
                f"GPU-{d}", t, dt,
                clock_reasons=draw(st.one_of(st.none(), st.sampled_from([0, 0x4, 0x20, 0x8, 0x10, 0x1]))),
                sm_active=draw(maybe), tensor_active=draw(maybe), gpu_util=draw(maybe),
                sm_clock_mhz=draw(st.one_of(st.none(), st.floats(100, 2100))),
                power_w=draw(st.one_of(st.none(), st.floats(50, 700))),
                gpu_temp_c=draw(st.one_of(st.none(), st.floats(20, 95))),
                ecc_sbe_aggregate=draw(st.one_of(st.none(), st.integers(0, 50).map(float))),
                xid=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.0, 79.0, 48.0]))),
                row_remap_pending=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.0, 1.0]))),
                row_remap_failure=draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0]))),
                fb_used_mib=draw(st.one_of(st.none(), st.floats(0, 80000))),
                compute_procs=draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.0])))))
            t += dt + draw(st.sampled_from([0.0, 0.0, 600.0]))
    return out


def _rows(samples: list[Sample]) -> list[tuple]:
    return [tuple(getattr(s, c) for c in SAMPLE_COLUMNS) for s in samples]


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_aggregate_equals_reference(samples: list[Sample]) -> None:
    assert hours.first_mismatch(hours.aggregate_reference(samples), hours.aggregate_rows(_rows(samples))) is None


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.lists(st.integers(1, 100), max_size=4))
def test_segments_merge_to_the_whole(samples: list[Sample], cuts: list[int]) -> None:
    """Split the samples at any points into segments (as shipments cut them): the merged pieces are the
    device-hours of all samples at once."""
    ordered = sorted(samples, key=lambda s: s.t)
    bounds = sorted({0, len(ordered), *(c * len(ordered) // 100 for c in cuts)})
    pieces: dict = {}
    for a, b in zip(bounds, bounds[1:]):
        for h in hours.aggregate_rows(_rows(ordered[a:b])):
            pieces.setdefault((h.device, h.hour), []).append(h)
    merged = [hours.merge(pieces[k]) for k in sorted(pieces)]
    assert hours.first_mismatch(hours.aggregate_rows(_rows(samples)), merged) is None


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.floats(1000, 2200))
def test_buckets_are_the_methods(samples: list[Sample], rated: float) -> None:
    """Per device-hour, the buckets read from the aggregate equal the method's own account of that hour's
    samples (attribute_device, each sample counted whole, as the agents count it), to the nanohour rounding;
    exact delivery needs the clock never above rated, which ``clipped`` reports."""
    for h in hours.aggregate_rows(_rows(samples)):
        ss = sorted((s for s in samples if s.device == h.device and h.hour <= s.t < h.hour + 3600), key=lambda s: s.t)
        # non-overlapping whole samples: the method's window from the first start to the last end
        if any(a.t + a.dt > b.t for a, b in zip(ss, ss[1:])):
            continue
        acc = attribute_device((ss[0].t, max(s.t + s.dt for s in ss)), SampleArrays.from_samples(ss),
                               rated_clock_mhz=rated)
        got = dict(zip(BUCKETS, (nanohours_to_hours(int(v)) * 3600 for v in acc.buckets)))
        delivered, thr = h.throttle_split(rated)
        tol = 4e-6 * len(ss)   # a nanohour (3.6 µs) of rounding per sample and bucket
        if not h.clipped(rated):
            assert abs(got["delivered"] - delivered) <= tol
            for name, v in zip(("thermal", "power_cap", "hw_slowdown", "sync_boost", "other"), thr):
                assert abs(got[f"throttled.{name}"] - v) <= tol
        assert abs(got["delivered"] + sum(got[f"throttled.{r}"] for r in ("thermal", "power_cap", "hw_slowdown",
                                                                         "sync_boost", "other")) - h.busy_s) <= tol
        assert abs(got["underutilized"] - h.under_s) <= tol
        assert abs(got["starved"] - h.starved_s) <= tol and abs(got["idle_held"] - h.idle_s) <= tol


def _demo_samples(dev: str = "GPU-1", n: int = 900, t0: float = T0 + 1800) -> list[Sample]:
    return [Sample(dev, t0 + 10 * i, 10.0, clock_reasons=0x4 if i % 7 == 0 else 0, sm_active=0.6,
                   sm_clock_mhz=1700.0, power_w=400.0 + i % 5, gpu_temp_c=70.0, fb_used_mib=4000.0,
                   compute_procs=1.0, ecc_sbe_aggregate=float(i // 300)) for i in range(n)]


def test_sealed_with_the_segment_and_verified(engine) -> None:  # noqa: ANN001
    a, b = _demo_samples(), _demo_samples("GPU-2")
    for ss in (a, b, a):   # the same segment shipped twice is stored once, its hours too
        write_segment(engine, ss, segment_entry(ss, node="n1", source="test"))
    with engine.connect() as conn:
        got = hours.merged(conn)
        assert [(h.device, h.hour) for h in got] == [(d, T0 + k * 3600) for d in ("GPU-1", "GPU-2") for k in range(3)]
        assert hours.first_mismatch(hours.aggregate_rows(_rows(a + b)), got) is None
        day = conn.execute(text("SELECT device, day, n, covered_s FROM device_days ORDER BY device")).all()
    assert [(r[0], r[2], r[3]) for r in day] == [("GPU-1", 900, 9000.0), ("GPU-2", 900, 9000.0)]
    assert verify(engine, checks=verify_checks()).ok


def test_verify_names_a_wrong_and_a_stray_device_hour(engine) -> None:  # noqa: ANN001
    ss = _demo_samples()
    seg = segment_entry(ss, node="n1", source="test")
    write_segment(engine, ss, seg)
    with engine.connect() as conn:
        first = hours.stored(conn)[seg.entry_id][0]
    with engine.begin() as conn:
        # the table refuses updates: a forged row is added beside the true one under another segment
        conn.execute(text("DROP TRIGGER IF EXISTS device_hours_no_delete")) if engine.dialect.name == "sqlite" \
            else conn.execute(text("ALTER TABLE device_hours DISABLE TRIGGER USER"))
        conn.execute(text("DELETE FROM device_hours WHERE hour = :h"), {"h": first.hour})
        conn.execute(hours.device_hours_insert_sql(), [dict(zip(("segment_id", *hours.FIELDS),
                                                    (seg.entry_id, *map(hours.device_hours_db_value, _astuple(
                                                        replace(first, busy_s=first.busy_s + 1.0)))))),
                                           dict(zip(("segment_id", *hours.FIELDS),
                                                    ("0" * 64, *map(hours.device_hours_db_value, _astuple(first)))))])
    report = verify(engine, checks=verify_checks())
    text_ = "\n".join(map(str, report.problems))
    assert not report.ok
    assert f"device_hours (GPU-1, {first.hour:.0f}) field busy_s: stored {first.busy_s + 1.0!r}" in text_
    assert "holds rows of segment " + "0" * 64 in text_


def _astuple(h: hours.DeviceHour) -> tuple:
    from dataclasses import astuple

    return astuple(h)


def test_init_derives_the_hours_of_a_ledger_sealed_before(sqlite_url) -> None:  # noqa: ANN001
    eng = db_mod.make_engine(sqlite_url)
    ss = _demo_samples()
    write_segment(eng, ss, segment_entry(ss, node="n1", source="test"))
    with eng.begin() as conn:  # the ledger as 0005 left it
        conn.execute(text("DROP VIEW device_days"))
        conn.execute(text("DROP TABLE device_hours"))
        conn.execute(text("UPDATE alembic_version SET version_num = '0005'"))
    db_mod.upgrade(eng)
    report = verify(eng, checks=verify_checks())
    assert [p.reason for p in report.problems] == ["no device_hours rows for this segment (sealed before they existed? "
                                                   "`ipledger init` derives them)"]
    from click.testing import CliRunner

    from ledger.cli.main import cli

    assert CliRunner().invoke(cli, ["--db", sqlite_url, "init"]).exit_code == 0
    with eng.connect() as conn:
        assert hours.first_mismatch(hours.aggregate_rows(_rows(ss)), hours.merged(conn)) is None
    assert verify(eng, checks=verify_checks()).ok
    eng.dispose()


def test_aggregate_is_fast_enough_for_seal_time() -> None:
    """A shipment's segment of 1,000 samples is aggregated in well under a millisecond per 100 samples."""
    import time

    rows = _rows(_demo_samples(n=1000))
    t = time.perf_counter()
    for _ in range(5):
        hours.aggregate_rows(rows)
    assert (time.perf_counter() - t) / 5 < 0.05
    assert np.isfinite(hours.aggregate_rows(rows)[0].busy_s)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.data())
def test_first_mismatch_shortcut_agrees_with_the_field_by_field_reference(samples: list[Sample], data) -> None:
    """verify's shortcut (every field exactly equal, in numpy) says "no mismatch" only where the field-by-field
    reference does, and otherwise leaves the naming to it: one field of one stored hour changed (to another
    number, to NaN, or an hour dropped or repeated) is named the same either way."""
    want = hours.aggregate_rows(_rows(samples))
    assert hours.exactly_equal(want, list(reversed(want))) and hours.first_mismatch(want, want) is None
    i = data.draw(st.integers(0, len(want) - 1))
    name = data.draw(st.sampled_from(hours.FIELDS[2:]))
    old = getattr(want[i], name)
    new = data.draw(st.sampled_from([float("nan"), old + 1, old * (1 + 1e-12), -old, old]))
    if name in hours.INT_FIELDS:
        new = int(new) if new == new else old + 1
    have = [*want[:i], replace(want[i], **{name: new}), *want[i + 1:]]
    how = data.draw(st.sampled_from(["edit", "drop", "repeat"]))
    if how == "drop":
        have = want[:i] + want[i + 1:]
    elif how == "repeat":
        have = [*want, want[i]]
    got = hours.first_mismatch(want, have)
    assert got == hours.first_mismatch_reference(want, have)
    # the same against the rows as the database returns them (NaN stored as NULL), verify's way
    rows = [tuple(None if v != v else v for v in hours.values(h)) for h in have]
    assert hours.stored_mismatch(want, rows) == got
    assert hours.stored_mismatch([hours.values(h) for h in want], rows) == got   # want as values
    as_rows = [tuple(None if v != v else v for v in hours.values(h)) for h in want]
    assert hours.stored_mismatch(as_rows, rows) == got   # want as verify has it: rows as the database holds them
    text = data.draw(st.sampled_from(hours.FIELDS[2:]))
    j = hours.FIELDS.index(text)
    as_text = [(*r[:j], str(r[j]), *r[j + 1:]) if k == 0 else r for k, r in enumerate(rows)]
    try:   # a value stored as text: the reference's float()/int() of it decides, never the shortcut
        expected = hours.first_mismatch_reference(want, [hours.from_db(r) for r in as_text])
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            hours.stored_mismatch(want, as_text)
    else:
        assert hours.stored_mismatch(want, as_text) == expected
    if got is None and how == "edit" and not (name in hours.LATER and new != new):
        # (NaN edited to NaN is no edit)
        assert new == old or (new != new and old != old) \
            or (new == new and abs(new - old) <= 1e-9 * max(abs(old), 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["GPU-b", "GPU-a", "MI300X-0", "GPU-ü"]), min_size=1, max_size=200), st.booleans())
def test_device_codes_by_runs_or_by_hash_are_np_unique(labels: list[str], by_runs: bool) -> None:
    """The device codes the aggregate groups by: from runs of one label (rows in device order, a segment's)
    or from a hash of every row, both what np.unique gives."""
    dev = np.array(sorted(labels) if by_runs else labels, dtype=object)
    names, codes = hours._device_codes(dev)
    want_names, want_codes = np.unique(dev.astype(str), return_inverse=True)
    assert names.tolist() == want_names.tolist() and codes.tolist() == want_codes.tolist()


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_a_tables_device_hours_as_rows_are_its_device_hours_values(samples: list[Sample]) -> None:
    """verify's device-hours as the stored rows hold them (no DeviceHour made) are the DeviceHours' values, None
    (NULL) where NaN, and read back through from_db are the DeviceHours."""
    import pyarrow as pa

    from ledger.telemetry import blocks

    schema = blocks.arrow_schema()
    rows = sorted(_rows(samples), key=lambda r: (r[0], r[1]))
    table = pa.Table.from_arrays([pa.array(list(v), type=f.type) for f, v in zip(schema, zip(*rows))], schema=schema)
    hours_, rows_ = hours.aggregate_table(table), hours.aggregate_table(table, as_rows=True)
    assert len(hours_) == len(rows_) and all(type(v) is tuple for v in rows_)
    assert all(len(a) == len(b) and all(x == y if x == x else y is None for x, y in zip(a, b))
               for a, b in zip(map(hours.values, hours_), rows_))
    assert all(hours.first_mismatch_reference([h], [hours.from_db(r)]) is None for h, r in zip(hours_, rows_))
