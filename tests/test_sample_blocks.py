"""Columnar sample blocks: rows round-trip exactly, a tampered block is named by verify at its segment's seq,
ledgers whose segments are legacy `samples` rows still read (and give byte-identical receipts), and the
block table is append-only — on SQLite and the real PostgreSQL."""

from __future__ import annotations

import hashlib
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import store
from ledger.chain.db import write_tx
from ledger.chain.entries import Kind, make_entry
from ledger.receipts import receipt_for
from ledger.receipts.gather import load_sample_arrays
from ledger.telemetry import blocks
from ledger.telemetry.model import SAMPLE_COLUMNS, Sample
from ledger.telemetry.sealed import (
    INSERT_COLUMNS, sample_row_values, load_samples, read_samples, samples_digest, segment_entry, write_segment
)
from ledger.receipts.auto import verify_checks
from ledger.chain.verify import verify

_floats = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
_rows = st.lists(st.tuples(st.sampled_from(["GPU-a", "GPU-b", "GPU-ü]", "MI300X-0"]),
                           st.floats(0, 2e9, allow_nan=False), st.floats(0.001, 600, allow_nan=False),
                           st.one_of(st.none(), st.integers(0, 2**63 - 1)),
                           *[_floats] * (len(SAMPLE_COLUMNS) - 4)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(_rows, st.integers(1, 30))
def test_block_round_trips_rows_exactly_in_digest_order(rows, batch_rows):
    with patch.object(blocks, "BATCH_ROWS", batch_rows):  # devices alone in a batch, and several per batch
        block = blocks.encode(rows)
    assert block.rows == len(rows) and block.sha256 == hashlib.sha256(block.data).hexdigest()
    pieces = blocks.decode(block.format, block.data)
    back = [r for _, table in pieces for r in blocks.table_rows(table)]
    assert back == sorted(rows, key=lambda r: (r[0], r[1]))  # values, types, -0.0 and NULLs all kept
    assert [type(v) for r in back for v in r] == [type(v) for r in sorted(rows, key=lambda r: (r[0], r[1])) for v in r]
    assert samples_digest(back) == samples_digest(rows)
    assert [d for d, _ in pieces] == sorted({r[0] for r in rows})
    one = rows[0][0]
    # a slice: one device, some columns in an order of the caller's choosing (not the stored order)
    only = blocks.decode(block.format, block.data, ("power_w", "t", "clock_reasons"), devices=[one])
    assert [d for d, _ in only] == [one] and only[0][1].column_names == ["power_w", "t", "clock_reasons"]
    mine = sorted((r for r in rows if r[0] == one), key=lambda r: r[1])
    power = SAMPLE_COLUMNS.index("power_w")
    assert list(zip(*(only[0][1].column(i).to_pylist() for i in range(3)))) == [(r[power], r[1], r[3]) for r in mine]


@settings(max_examples=40, deadline=None)
@given(_rows)
def test_columns_encode_to_the_rows_block(rows):
    """encode_columns (a bulk loader's numpy columns, NaN for not measured) gives the block encode gives."""
    import numpy as np

    rows = [r[:3] + (None if r[3] is None else r[3] % 2**52,) + r[4:] for r in rows]  # a float holds the reasons
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    cols = {c: np.array([np.nan if r[i] is None else r[i] for r in ordered], dtype=object if c == "device" else float)
            for i, c in enumerate(SAMPLE_COLUMNS)}
    a, b = blocks.encode(rows), blocks.encode_columns(cols)
    assert a.data == b.data and a.rows == b.rows == len(rows)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=40), st.booleans(),
       st.integers(0, 10), st.integers(0, 10))
def test_float_values_equal_pyarrow_conversion(values, as_int, cut_front, cut_back):
    import numpy as np
    import pyarrow as pa

    if as_int:
        values = [None if v is None else int(max(min(v, 2**52), -2**52)) for v in values]
    arr = pa.array(values, type=pa.int64() if as_int else pa.float64())
    arr = arr.slice(min(cut_front, len(arr)), max(len(arr) - cut_front - cut_back, 0))  # offsets and NULL bits
    column = pa.chunked_array([arr, arr], type=arr.type)
    want = np.array([np.nan if v is None else float(v) for v in arr.to_pylist()] * 2, dtype=np.float64)
    got = blocks.float_values(column)
    assert got.dtype == np.float64 and got.tobytes() == want.tobytes()


def test_decode_refuses_unknown_format_and_damaged_bytes():
    block = blocks.encode([sample_row_values(s) for s in _samples(n=3)])
    with pytest.raises(blocks.BlockError, match="unknown sample block format"):
        blocks.decode("parquet/9", block.data)
    with pytest.raises(blocks.BlockError, match="does not decode"):
        blocks.decode(block.format, block.data[:40])


def _samples(dev="GPU-1", n=10, t0=1_760_000_000.0):
    return [Sample(device=dev, t=t0 + 10 * i, dt=10.0, sm_active=0.5, power_w=300.0 + i,
                   clock_reasons=0x4 if i % 3 == 0 else 0, fb_used_mib=None if i == 4 else 2048.0)
            for i in range(n)]


def _node_samples():
    """One node's batch: two devices interleaved, as the collector seals them."""
    a, b = _samples("GPU-b", 6), _samples("GPU-a", 6, t0=1_760_000_005.0)
    return [x for pair in zip(a, b) for x in pair]


def test_written_as_one_block_and_read_back(engine):
    s = _node_samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e)
    write_segment(engine, s, e)  # at-least-once: stored once
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar() == 0
        fmt, n = conn.execute(text("SELECT format, rows FROM sample_blocks WHERE segment_id = :s"),
                              {"s": e.entry_id}).one()
    assert (fmt, n) == (blocks.FORMAT, len(s))
    assert load_samples(engine) == sorted(s, key=lambda x: (x.device, x.t))
    assert load_samples(engine, ["GPU-b"], start=1_760_000_015, end=1_760_000_030) == _samples("GPU-b", 6)[1:3]
    table = read_samples(engine, segment_ids=[e.entry_id], devices=["GPU-a"], columns=("device", "t"))
    assert table.column_names == ["device", "t"] and set(table.column("device").to_pylist()) == {"GPU-a"}
    assert verify(engine, checks=verify_checks()).ok


def _other_entries(engine):
    store.append(engine, [make_entry(Kind.PROGRESS, 1_760_000_000 + i, {"step": i}, job_id="1") for i in range(3)])


def _drop_trigger(conn, table, action):
    """What an attacker with the schema owner's rights does first: remove the append-only trigger."""
    if conn.dialect.name == "sqlite":
        conn.execute(text(f"DROP TRIGGER {table}_no_{action}"))
    else:
        conn.execute(text(f"DROP TRIGGER {table}_no_update_delete ON {table}"))


def test_tampered_block_is_named_by_verify_at_its_segment_seq(engine):
    _other_entries(engine)
    s = _samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e)
    seq = [ce.seq for ce in store.iter_entries(engine, kinds=[Kind.TELEMETRY_SEGMENT])][0]
    assert seq == 4
    # an edit that keeps the block self-consistent (re-encoded, new sha256): only the entry's digest catches it
    edited = [sample_row_values(x) for x in s]
    edited[5] = edited[5][:4] + (0.99,) + edited[5][5:]
    forged = blocks.encode(edited)
    with engine.begin() as conn:
        _drop_trigger(conn, "sample_blocks", "update")
        conn.execute(text("UPDATE sample_blocks SET data = :d, sha256 = :h"), {"d": forged.data, "h": forged.sha256})
    report = verify(engine, checks=verify_checks())
    assert not report.ok and [(p.seq, p.reason) for p in report.problems] == [
        (seq, "samples do not match the segment digest")]
    # a damaged block (bytes changed, sha256 not) is named before anything is decoded
    damaged = forged.data[:100] + bytes([forged.data[100] ^ 1]) + forged.data[101:]
    with engine.begin() as conn:
        conn.execute(text("UPDATE sample_blocks SET data = :d"), {"d": damaged})
    report = verify(engine, checks=verify_checks())
    assert [(p.seq, p.entry_id) for p in report.problems] == [(seq, e.entry_id)]
    assert "does not match its sha256" in report.problems[0].reason


def test_missing_block_is_named(engine):
    s = _samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e)
    with engine.begin() as conn:
        _drop_trigger(conn, "sample_blocks", "delete")
        conn.execute(text("DELETE FROM sample_blocks"))
    report = verify(engine, checks=verify_checks())
    assert [(p.seq, p.reason) for p in report.problems] == [(1, "samples of this segment are missing")]


def test_sample_blocks_are_append_only(engine):
    s = _samples(n=2)
    write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    for sql in ("DELETE FROM sample_blocks", "UPDATE sample_blocks SET rows = 0"):
        with pytest.raises(Exception, match="append-only"):
            with engine.begin() as conn:
                conn.execute(text(sql))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT rows FROM sample_blocks")).scalar() == 2


def _write_legacy(engine, samples, entry, others=()):
    """What ledgers written before sample blocks hold: the segment's rows in the `samples` table."""
    with write_tx(engine) as conn:
        store.append_in(conn, [entry, *others])
        marks = ", ".join(f":c{i}" for i in range(len(INSERT_COLUMNS)))
        conn.execute(text(f"INSERT INTO samples ({', '.join(INSERT_COLUMNS)}) VALUES ({marks})"),
                     [{f"c{i}": v for i, v in enumerate((entry.entry_id, *sample_row_values(x)))} for x in samples])


def test_legacy_row_segments_still_read_and_verified(engine):
    old = _node_samples()
    old_entry = segment_entry(old, node="n1", source="test")
    _write_legacy(engine, old, old_entry)
    new = _samples("GPU-c")
    write_segment(engine, new, segment_entry(new, node="n2", source="test"))
    write_segment(engine, old, old_entry)  # re-shipped: already stored as rows, so no block is added
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_blocks")).scalar() == 1
    everything = sorted(old + new, key=lambda x: (x.device, x.t))
    assert load_samples(engine) == everything
    assert load_samples(engine, ["GPU-a", "GPU-c"], start=1_760_000_020) == [
        x for x in everything if x.device in ("GPU-a", "GPU-c") and x.t + x.dt > 1_760_000_020]
    assert verify(engine, checks=verify_checks()).ok
    with engine.begin() as conn:
        _drop_trigger(conn, "samples", "update")
        conn.execute(text("UPDATE samples SET power_w = 1 WHERE t = 1760000050"))
    report = verify(engine, checks=verify_checks())
    assert [(p.seq, p.reason) for p in report.problems] == [(1, "samples do not match the segment digest")]


def test_receipt_arrays_and_receipts_identical_from_blocks_and_legacy_rows(ledger_url, tmp_path, monkeypatch):
    from ledger.chain import db as db_mod
    import tests.test_receipt_replay as replay

    block_engine = db_mod.make_engine(ledger_url)
    legacy_url = f"sqlite:///{tmp_path / 'legacy.db'}"
    legacy_engine = db_mod.make_engine(legacy_url)
    db_mod.upgrade(legacy_engine)
    try:
        uuids = replay._noisy_run(block_engine)
        monkeypatch.setattr(replay, "write_segment", _write_legacy)
        assert replay._noisy_run(legacy_engine) == uuids
        with legacy_engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM sample_blocks")).scalar() == 0
        segs = [ce.entry.entry_id for ce in store.iter_entries(block_engine, kinds=[Kind.TELEMETRY_SEGMENT])]
        arrays = []
        for eng in (block_engine, legacy_engine):
            with eng.connect() as conn:
                w0 = replay.START.timestamp() + 300.5  # a window cutting samples at both ends
                arrays.append(load_sample_arrays(conn, segs, uuids[1:3], w0, w0 + 3000))
        assert list(arrays[0]) == list(arrays[1]) == uuids[1:3]
        for u in uuids[1:3]:
            assert 100 < len(arrays[0][u]) < 300 and arrays[0][u].t[0] < w0 + 10
            for name in ("t", "dt", "activity", "coarse", "sm_clock", "reasons", "procs", "fb_used"):
                assert getattr(arrays[0][u], name).tobytes() == getattr(arrays[1][u], name).tobytes(), (u, name)
        a, b = receipt_for(block_engine, "8001"), receipt_for(legacy_engine, "8001")
        assert a.canonical() == b.canonical() and a.body["method"]["fidelity"] == "samples"
    finally:
        block_engine.dispose()
        legacy_engine.dispose()


_BASE = len(SAMPLE_COLUMNS) - 4


@settings(max_examples=80, deadline=None)
@given(_rows, st.booleans())
def test_format_2_digest_is_the_plain_digest_of_the_carried_columns(rows, without_extension):
    """A segment's digest is proofcheck's plain digest of its rows in the columns it carries: rows that measured
    no format 2 column hash as their 25 base columns (what every segment sealed before format 2), and their
    block is format 1; otherwise the base columns and each format 2 column some row measured, in a block of
    format 2 that a format 1 label cannot pass for."""
    from ledger import proofcheck as pc
    from ledger.telemetry.sealed import carried_columns, digest_normalised

    if without_extension:
        rows = [(*r[:_BASE], None, None, None, None) for r in rows]
    cols = carried_columns(rows)
    assert cols[:_BASE] == pc.BASE_SAMPLE_COLUMNS and all(c in pc.EXTENSION_COLUMNS for c in cols[_BASE:])
    assert (cols == pc.BASE_SAMPLE_COLUMNS) == all(v is None for r in rows for v in r[_BASE:])
    keep = [SAMPLE_COLUMNS.index(c) for c in cols]
    projected = sorted(([r[j] for j in keep] for r in rows), key=lambda r: (r[0], r[1]))
    assert digest_normalised(rows) == pc.samples_digest(projected) == samples_digest(rows)
    block = blocks.encode(rows)
    assert block.format == (blocks.FORMAT if cols == pc.BASE_SAMPLE_COLUMNS else blocks.FORMAT_2)
    if block.format == blocks.FORMAT_2:
        with pytest.raises(blocks.BlockError, match="format 1 holds a column of format 2"):
            blocks.decode(blocks.FORMAT, block.data)
    assert pc.widen_rows(projected, cols) == [list(r) for r in sorted(rows, key=lambda r: (r[0], r[1]))]


_DEVICES = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
_value = st.one_of(st.none(), st.floats(-0.5, 1.5, allow_nan=False))


@st.composite
def _segments(draw):
    """Segments of one to four devices (some sealed as legacy rows), times that overlap, repeat and come out of
    order across segments, and every column the receipt reads (lens and energy ones too) measured or not."""
    segs = []
    for _ in range(draw(st.integers(1, 5))):
        devs = draw(st.lists(st.sampled_from(_DEVICES), min_size=1, max_size=4, unique=True))
        t0 = 1_760_000_000.0 + 10 * draw(st.integers(0, 30))
        rows = []
        for d in devs:
            for i in range(draw(st.integers(1, 12))):
                rows.append(Sample(device=d, t=t0 + 10 * i + draw(st.sampled_from([0.0, 2.5])), dt=10.0,
                                   clock_reasons=draw(st.sampled_from([None, 0, 0x20])), sm_active=draw(_value),
                                   tensor_active=draw(_value), gpu_util=draw(_value), sm_clock_mhz=1700.0,
                                   fb_used_mib=draw(st.sampled_from([None, 1024.0])), compute_procs=1.0,
                                   sm_occupancy=draw(_value), dram_active=draw(_value), fp64_active=draw(_value),
                                   fp32_active=draw(_value), fp16_active=draw(_value), energy_j=draw(_value),
                                   power_w=draw(_value)))
        segs.append((draw(st.booleans()) and draw(st.booleans()), rows))   # a quarter as legacy rows
    return segs


@settings(max_examples=40, deadline=None)
@given(_segments(), st.lists(st.sampled_from(_DEVICES), min_size=1, max_size=4, unique=True),
       st.integers(0, 40), st.integers(5, 60), st.booleans(), st.booleans(), st.randoms(use_true_random=False))
def test_a_batch_read_a_device_at_a_time_equals_the_whole_batch_read(tmp_path_factory, segs, batch, w0, width, lens,
                                                                    energy, rnd):
    """DeviceReader (the receipt's read: a batch's blocks fetched at once, each decoded when a device it holds
    is asked for) gives every device the arrays and energy columns load_sample_arrays (the whole batch in one
    pass, the plain way) gives it, bit for bit, whatever order the devices are asked in, asked twice or not at
    all, blocks of several devices, legacy row segments in the batch, and a window cutting segments."""
    import numpy as np

    from ledger.chain import db as db_mod
    from ledger.receipts.gather import DeviceReader

    url = f"sqlite:///{tmp_path_factory.mktemp('reader') / 'ledger.db'}"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    ids = []
    for legacy, rows in segs:
        entry = segment_entry(rows, node="n1", source="test")
        (_write_legacy if legacy else write_segment)(engine, rows, entry)
        ids.append(entry.entry_id)
    start = 1_760_000_000.0 + 10 * w0
    ids = sorted(set(ids))
    try:
        with engine.connect() as conn:
            plain_energy: dict | None = {} if energy else None
            plain = load_sample_arrays(conn, ids, batch, start, start + 10 * width, lens, energy_out=plain_energy)
            reader = DeviceReader(conn, ids, batch, start, start + 10 * width, lens, energy=energy)
        asked = [d for d in batch if rnd.random() < 0.8]
        asked += [d for d in asked if rnd.random() < 0.3]     # some asked again
        rnd.shuffle(asked)
        for d in asked:
            got = reader.arrays(d)
            if d not in plain:
                assert got is None
                continue
            for name in ("t", "dt", "activity", "coarse", "sm_clock", "reasons", "procs", "fb_used", "sm",
                         "tensor", "occupancy", "dram", "fp64", "fp32", "fp16", "ops"):
                a, b = getattr(plain[d], name), getattr(got, name)
                assert (a is None) == (b is None), (d, name)
                assert a is None or (a.dtype == b.dtype and a.tobytes() == b.tobytes()), (d, name)
        if energy:   # every device asked has its columns; any other the reader read (a batch read whole) too
            assert {d for d in asked if d in plain} <= set(reader.energy) <= set(plain_energy)
            for d in reader.energy:
                for col in ("energy_j", "power_w"):
                    assert all(np.array_equal(x, y, equal_nan=True) and x.dtype == y.dtype
                               for x, y in zip(plain_energy[d][col], reader.energy[d][col])), (d, col)
    finally:
        engine.dispose()
