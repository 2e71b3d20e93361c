"""Shipping collector segments in one pass stores exactly what storing them one by one does (bench.ship_segments
made the fast paths; these keep them honest).

- intake's column-at-a-time check of a segment's rows never passes what the cell-by-cell reference refuses,
  and passes the rows a collector writes;
- blocks.encode_many gives encode's blocks byte for byte, and both are _write_reference's (pyarrow's IPC
  writer used plainly);
- hours.aggregate_groups gives each group what aggregate of its rows alone gives, value for value;
- a shipment of a fleet's collector spool leaves the very rows (entries, sample_blocks, device_hours) the
  segment-by-segment path (telemetry.sealed.write_segment_in) leaves.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.ingest import intake
from ledger.chain.entries import entry_from_record
from ledger.telemetry import blocks, hours
from ledger.telemetry.model import SAMPLE_COLUMNS, Sample
from ledger.telemetry.sealed import sample_row_values, normalised
from tests.test_device_hours import fleets

LATEST = 4_000_000_000.0
GOOD = ["GPU-a", 1_760_000_000.0, 1.0, 0, *([0.5] * (len(SAMPLE_COLUMNS) - 4))]
ODD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3),
                       st.just([]), st.just(-(2**63)), st.just(2**63 - 1), st.just(1e300))


@st.composite
def segment_rows(draw) -> list:  # noqa: ANN001
    """Rows a segment may carry: mostly sound, with now and then one cell (or the row's shape) spoiled."""
    rows = [list(GOOD) for _ in range(draw(st.integers(1, 6)))]
    for r in rows:
        r[1] += draw(st.integers(0, 100))
        for j in draw(st.lists(st.integers(3, len(SAMPLE_COLUMNS) - 1), max_size=4)):
            r[j] = draw(st.one_of(st.none(), st.floats(0, 2000), st.integers(0, 2**40)))
    if draw(st.booleans()):
        i = draw(st.integers(0, len(rows) - 1))
        how = draw(st.sampled_from(["cell", "device", "shape", "t", "dt"]))
        if how == "cell":
            rows[i][draw(st.integers(1, len(SAMPLE_COLUMNS) - 1))] = draw(ODD_VALUES)
        elif how == "device":
            rows[i][0] = draw(st.one_of(ODD_VALUES, st.text(max_size=2000)))
        elif how == "shape":
            rows[i] = rows[i][:-1] if draw(st.booleans()) else tuple(rows[i])
        elif how == "t":
            rows[i][1] = draw(st.sampled_from([900_000_000.0, LATEST, LATEST + 1, 1_000_000_000]))
        else:
            rows[i][2] = draw(st.sampled_from([-1.0, 0, 86_400.0 * 366, 86_400 * 366 - 1]))
    return rows


def _reference_passes(rows: list) -> bool:
    try:
        intake.check_rows(rows, LATEST)
    except intake.Refused:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(segment_rows())
def test_row_shortcut_never_passes_what_the_reference_refuses(rows):
    verdict = intake._plain_check(rows, LATEST)[0]
    if verdict:
        assert _reference_passes(rows)
    if verdict == intake._EXACT:   # rows taken as they are must be what normalising gives, types included
        assert all(normalised(r) == tuple(r) and list(map(type, normalised(r))) == list(map(type, r)) for r in rows)


@settings(max_examples=300, deadline=None)
@given(st.lists(segment_rows(), min_size=1, max_size=3), st.booleans(), st.randoms(use_true_random=False))
def test_packed_columns_from_the_check_are_the_rows(segments, big_mask, rnd):
    """What a worker hands back (pack, taking the columns intake's check built where the rows are in order)
    is what packing the rows value by value gives: order, devices, values, exact clock masks."""
    from ledger.chain.kinds import Kind
    from ledger.telemetry.sealed import samples_digest

    checked = []
    for rows in segments:
        if big_mask and type(rows[0]) is list:
            rows[0][3] = 2**60 + 1   # past float64's exact integers
        if rnd.random() < 0.3:
            rnd.shuffle(rows)        # out of (device, t) order: packed from the rows
        else:
            try:
                rows.sort(key=lambda r: r[1])   # in order: the check's own columns are packed
            except (TypeError, IndexError):
                pass
        try:
            checked.append(intake._segment_rows(Kind.TELEMETRY_SEGMENT, {"samples_sha256": samples_digest(rows),
                                                                         "rows": len(rows)}, rows, LATEST))
        except (intake.Refused, ValueError, TypeError, OverflowError):
            continue
    if not checked:
        return
    got, want = blocks.pack(checked), blocks.pack_reference([list(c) for c in checked])
    assert got.rows == want.rows and got.devices == want.devices
    assert np.array_equal(got.values, want.values, equal_nan=True)
    assert np.array_equal(got.reasons, want.reasons) and np.array_equal(got.reasons_missing, want.reasons_missing)


def test_an_integer_past_a_floats_range_is_refused_not_raised():
    """JSON allows 10**400; math.isfinite of it raises OverflowError, which would have stopped the shipper."""
    from ledger.chain.kinds import Kind

    rows = [list(GOOD)]
    rows[0][5] = 10**400
    assert not intake._plain_check(rows, LATEST)[0]
    with pytest.raises(intake.Refused, match=r"samples\[0\]\.sm_occupancy"):
        intake._segment_rows(Kind.TELEMETRY_SEGMENT, {"samples_sha256": "x", "rows": 1}, rows, LATEST)


def test_row_shortcut_passes_a_collectors_rows():
    k = len(SAMPLE_COLUMNS) - 4
    rows = [list(GOOD), [*GOOD[:3], None, *([None] * k)], [GOOD[0], GOOD[1] + 1, 1.0, 4, *([1980.0] * k)]]
    assert _reference_passes(rows) and intake._plain_check(rows, LATEST)[0] == intake._EXACT


def test_a_collector_of_the_base_columns_ships_rows_that_seal_as_before():
    """A collector written before sample block format 2 ships rows of the 25 base columns: they are taken with
    the format 2 columns unmeasured, and their digest is the one the old collector sealed (the base columns)."""
    from ledger.chain.kinds import Kind
    from ledger.proofcheck import BASE_SAMPLE_COLUMNS, samples_digest as plain_digest

    old = [[*GOOD[:len(BASE_SAMPLE_COLUMNS)]], [GOOD[0], GOOD[1] + 1, 1.0, 4, *([1980.0] * 21)]]
    assert all(len(r) == len(BASE_SAMPLE_COLUMNS) == 25 for r in old)
    got = intake._segment_rows(Kind.TELEMETRY_SEGMENT, {"samples_sha256": plain_digest(old), "rows": 2},
                               [list(r) for r in old], LATEST)
    assert [tuple(r[:25]) for r in got] == [tuple(r) for r in old]
    assert all(r[25:] == (None,) * (len(SAMPLE_COLUMNS) - 25) for r in got)


def test_normalised_rows_are_the_reference_norm():
    from ledger.telemetry.sealed import _norm

    for row in ([*GOOD], [GOOD[0], 1_760_000_000, 1, 3, *([7] * 21)], [GOOD[0], 1.5, 2.0, None, *([None] * 21)]):
        assert normalised(row) == _norm(row)
        assert all(type(a) is type(b) for a, b in zip(normalised(row), _norm(row)))


def _rows(samples: list[Sample]) -> list[tuple]:
    return [sample_row_values(s) for s in samples]


def _same(a: hours.DeviceHour, b: hours.DeviceHour) -> bool:
    return all((x != x and y != y) or x == y for x, y in zip(hours.values(a), hours.values(b)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(fleets(), min_size=1, max_size=3))
def test_grouped_aggregation_is_each_segments_own(segments):
    rows = [_rows(s) for s in segments]
    idx = [SAMPLE_COLUMNS.index(c) for c in hours.NEEDED]
    cols = list(zip(*(r for seg in rows for r in seg)))
    group = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    got = hours.aggregate_groups({c: cols[i] for c, i in zip(hours.NEEDED, idx)}, group)
    want = [(g, h) for g, seg in enumerate(rows) for h in hours.aggregate_rows(seg)]
    assert [g for g, _ in got] == [g for g, _ in want]
    assert all(_same(a, b) for (_, a), (_, b) in zip(got, want)), "exact equality, not within a tolerance"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(fleets(), min_size=1, max_size=3))
def test_blocks_encoded_together_are_encodes_byte_for_byte(segments):
    rows = [_rows(s) for s in segments]
    assert [b.data for b in blocks.encode_many(rows)] == [blocks.encode(r).data for r in rows]


def _reference_blocks(monkeypatch, rows: list) -> list[bytes]:
    with monkeypatch.context() as m:
        m.setattr(blocks, "_write", blocks._write_reference)
        return [blocks.encode(r).data for r in rows]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(fleets(), min_size=1, max_size=3))
def test_blocks_are_the_plain_writers_byte_for_byte(monkeypatch, segments):
    """The block writer's shortcuts (one compression thread, one record batch written as it is, a one-device
    block's layout) against _write_reference: one IPC file per block, written as plainly as pyarrow allows."""
    rows = [_rows(s) for s in segments]
    want = _reference_blocks(monkeypatch, rows)
    assert [blocks.encode(r).data for r in rows] == want
    assert [b.data for b in blocks.encode_many(rows)] == want


def test_a_long_block_of_several_devices_is_the_plain_writers(monkeypatch):
    """Past BATCH_ROWS a block holds several record batches (the table path of _write)."""
    rows = [_rows([Sample(f"GPU-{d}", 1_760_000_000.0 + i, 1.0, sm_active=(i % 7) / 7 if i % 5 else None)
                   for d in range(3) for i in range(blocks.BATCH_ROWS // 2 + 1)])]
    assert [blocks.encode(r).data for r in rows] == _reference_blocks(monkeypatch, rows)
    assert [b.data for b in blocks.encode_many(rows)] == _reference_blocks(monkeypatch, rows)


def test_encode_many_of_an_empty_segment_is_encodes():
    rows = [[], _rows([Sample("GPU-x", 1_760_000_000.0, 1.0)])]
    assert blocks.encode_many(rows) == [blocks.encode(r) for r in rows]


@pytest.mark.parametrize("parallel", [False, True])
def test_one_pass_ship_leaves_the_rows_the_one_by_one_path_leaves(tmp_path, monkeypatch, parallel):
    """Serial and with worker processes (the packed columns crossing the pipe), small batches (a segment's
    file split from its neighbours'), and a file shipped again beside a copy of itself (at-least-once: the
    segments already stored, and one repeated within a batch, are not stored twice)."""
    from bench import ship_segments as bench
    from ledger.chain import db as db_mod
    from ledger.ingest import ship as ship_mod
    from ledger.telemetry.sealed import write_segment_in

    counts = bench.write_spool(tmp_path / "pristine", nodes=3, batches=2)

    # the reference takes each segment's rows straight from its spool record, not from the packed columns
    rows_of = {}
    for path in (tmp_path / "pristine").glob("collector-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            entry = entry_from_record({k: v for k, v in rec.items() if k != "samples"})
            rows_of[entry.entry_id] = (entry, rec["samples"])

    def one_by_one(conn, sealed):  # noqa: ANN001, ANN202 - the path before the one-pass store
        for sid in sealed.ids:
            entry, rows = rows_of[sid]
            write_segment_in(conn, [Sample(*r) for r in rows], entry)

    monkeypatch.setattr(ship_mod, "PARALLEL_MIN_FILES", 2 if parallel else 10**9)
    monkeypatch.setattr(ship_mod, "_CHUNK_FILES", 3)
    again = sorted((tmp_path / "pristine").glob("collector-*.jsonl"))[1]
    got = []
    for name in ("one_pass", "one_by_one"):
        if name == "one_by_one":
            monkeypatch.setattr(ship_mod, "_write_samples", one_by_one)
        shutil.copytree(tmp_path / "pristine", tmp_path / name)
        shutil.copy(again, tmp_path / name / "collector-zz-copy.jsonl")   # a segment twice in one batch
        url = bench.fresh_db(tmp_path / f"{name}.db")
        eng = db_mod.make_engine(url)
        try:
            report = ship_mod.ship(eng, tmp_path / name, batches=ship_mod.Batches(samples=1000))
            assert not report.refused and report.appended == counts["records"]
            assert report.duplicates == len(again.read_text().splitlines())
            for copy in ("zz-again-1.jsonl", "zz-again-2.jsonl"):
                shutil.copy(again, tmp_path / name / copy)
            report = ship_mod.ship(eng, tmp_path / name)
            assert report.appended == 0 and report.duplicates == 2 * len(again.read_text().splitlines())
        finally:
            eng.dispose()
        got.append(bench.ledger_rows(tmp_path / f"{name}.db"))
    assert len(got[0]["sample_blocks"][1]) == counts["segments"] and len(got[0]["device_hours"][1]) > 0
    assert got[0] == got[1]
