"""verify decodes each sample block once: its segment check keeps the decoded blocks
(:class:`ledger.telemetry.sealed.DecodedSegments`) and the receipt replays read them there. Held equal to the
plain reads here: every read served from the kept blocks gives the pieces the database read gives, and
``verify`` reports the same on the honest demo ledger and on tampered copies of it."""

from __future__ import annotations

import shutil
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ledger.base.config import load
from ledger.chain import db as db_mod
from ledger.chain.canonical import ts_to_epoch
from ledger.chain.entries import Kind
from ledger.chain.heads import check_tree
from ledger.chain.lite import text
from ledger.chain.store import iter_entries
from ledger.chain.verify import verify
from ledger.ingest.site import site_from_config
from ledger.receipts.auto import check_issued_receipts, check_receipt_lines, verify_checks, verify_site
from ledger.telemetry import blocks
from ledger.telemetry.derived import check_segments
from ledger.telemetry.model import SAMPLE_COLUMNS
from ledger.telemetry.sealed import DecodedSegments, iter_sample_pieces


def _site(out):
    return site_from_config(load(str(out / "site.toml"), {}))


def _plain_checks(site):
    """verify_checks(site) as it was before the kept blocks: each check reads its samples itself."""
    return (check_segments, partial(check_issued_receipts, site=site), check_receipt_lines, check_tree)


@pytest.fixture(scope="module", params=["segment check", "worker fill"])
def kept(demo, request):
    """The demo ledger's blocks, kept by its segment check as verify keeps them, or filled segment by segment as a
    verify worker keeps them (DecodedSegments.fill)."""
    out, _ = demo
    engine = db_mod.make_engine(f"sqlite:///{out / 'ledger.db'}")
    decoded = DecodedSegments()
    with engine.connect() as conn:
        sealed = list(iter_entries(conn, kinds=[Kind.TELEMETRY_SEGMENT]))
    if request.param == "segment check":
        assert check_segments(engine, None, decoded=decoded) == []
    else:
        with engine.connect() as conn:
            for ce in sealed:
                decoded.fill(conn, [ce.entry.entry_id])
    segments = [ce.entry.entry_id for ce in sealed]
    devices = sorted({d for ce in sealed for d in ce.entry.data.get("devices") or [ce.entry.device]})
    t0 = min(ts_to_epoch(ce.entry.ts) for ce in sealed)
    t1 = max(ts_to_epoch(ce.entry.ts_end or ce.entry.ts) for ce in sealed)
    yield engine, decoded, segments, devices, (t0, t1)
    engine.dispose()


def _as_lists(pieces):
    return [(device, table.column_names, table.to_pylist()) for device, table in pieces]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_read_from_the_kept_blocks_is_the_database_read(kept, data):
    engine, decoded, segments, devices, (t0, t1) = kept
    ids = data.draw(st.lists(st.sampled_from(segments), min_size=1, max_size=8))
    devs = data.draw(st.none() | st.lists(st.sampled_from(devices), min_size=1, max_size=6))
    columns = data.draw(st.lists(st.sampled_from(SAMPLE_COLUMNS), min_size=1, max_size=6, unique=True))
    start = data.draw(st.none() | st.floats(t0 - 3600, t1, allow_nan=False))
    end = data.draw(st.none() | st.floats(t0, t1 + 3600 * 24, allow_nan=False))
    assert decoded.holds(ids)   # the fast path is the one taken
    with engine.connect() as conn:
        read = partial(iter_sample_pieces, conn, segment_ids=ids, devices=devs, start=start, end=end,
                       columns=columns)
        assert _as_lists(read(decoded=decoded)) == _as_lists(read())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_replays_segment_entries_picked_from_the_kept_ones_are_the_querys(kept, data):
    """gather's segments of a window, picked from verify's once-read segment entries, are the database query's
    rows, in its order (windows around and across the ledger's time, with and without a through-seq)."""
    from datetime import datetime, timezone

    from ledger.receipts.gather import listed_devices, overlapping_entries, segments_overlapping

    engine, decoded, _segments, _devices, (t0, t1) = kept

    def ts(x: float) -> str:
        return datetime.fromtimestamp(x, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    with engine.connect() as conn:
        sealed = list(iter_entries(conn, kinds=[Kind.TELEMETRY_SEGMENT]))
    edges = sorted({ts_to_epoch(t) for ce in sealed for t in (ce.entry.ts, ce.entry.ts_end) if t})
    a = data.draw(st.floats(t0 - 7200, t1 + 7200, allow_nan=False) | st.sampled_from(edges))   # on a segment's
    b = data.draw(st.floats(a, a + 3 * 86400, allow_nan=False) | st.sampled_from([e for e in edges if e >= a] or [a]))
    as_of = data.draw(st.none() | st.integers(0, 10_000) | st.sampled_from([ce.seq for ce in sealed]))
    with engine.connect() as conn:
        got = segments_overlapping(conn, ts(a), ts(b), as_of, decoded)
        want = overlapping_entries(conn, Kind.TELEMETRY_SEGMENT, ts(a), ts(b), as_of)
    assert decoded.segment_entries is not None   # read once, then picked from
    assert got == want
    assert [listed_devices(s, decoded) for s in got] == [s.entry.data.get("devices") for s in want]


def test_a_segment_not_kept_is_read_from_the_database(kept):
    engine, decoded, segments, _, _ = kept
    budget = DecodedSegments(max_rows=0)
    with engine.connect() as conn:
        pieces = list(iter_sample_pieces(conn, segment_ids=segments[:1], check_blocks=True, decoded=budget))
    assert pieces and not budget.holds(segments[:1]) and budget.rows == 0


def test_a_workers_kept_blocks_stay_within_their_budget_the_first_kept_making_room(kept):
    """A verify worker keeps at most its budget of samples: filling past it drops the blocks kept first (and
    their converted columns), never the one being kept; what it holds still reads as the database does."""
    engine, _decoded, segments, _devices, _window = kept
    with engine.connect() as conn:
        sizes = {sid: sum(t.num_rows for _, t in iter_sample_pieces(conn, segment_ids=[sid])) for sid in segments}
        budget = 3 * max(sizes.values())
        worker = DecodedSegments(budget, evict_oldest=True)
        for i, sid in enumerate(segments):
            worker.fill(conn, [sid])
            assert worker.holds([sid]) and worker.rows <= budget
            assert worker.rows == sum(sizes[s] for s in segments[:i + 1] if worker.holds([s]))
            list(worker.float_pieces([sid], None, None, None, ["t", "sm_active"]))   # columns converted, kept
        held = [s for s in segments if worker.holds([s])]
        assert held == segments[len(segments) - len(held):] and 2 <= len(held) < len(segments)
        assert set(worker._floats) <= set(held)   # the dropped blocks' columns went with them
        read = partial(iter_sample_pieces, conn, segment_ids=held[-2:], columns=["t", "gpu_util", "device"])
        assert _as_lists(read(decoded=worker)) == _as_lists(read())


def test_a_worker_does_not_keep_a_block_that_fails_its_checks(demo, tmp_path):
    """A verify worker's fill refuses a block whose bytes no longer match its sha256, and its readers then read
    the database plainly (what they read without the cache); an honest block is kept."""
    out, _ = demo
    copy = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", copy)
    _tamper_used_block(copy, "bytes")
    engine = db_mod.make_engine(f"sqlite:///{copy}")
    try:
        with engine.connect() as conn:
            damaged = conn.execute(text("SELECT segment_id FROM sample_blocks ORDER BY rows DESC LIMIT 1")).scalar()
            honest = conn.execute(text("SELECT segment_id FROM sample_blocks WHERE segment_id != :s LIMIT 1"),
                                  {"s": damaged}).scalar()
            decoded = DecodedSegments()
            decoded.fill(conn, [damaged, honest])
            assert decoded.holds([honest]) and not decoded.holds([damaged])
            decoded.fill(conn, [damaged])   # refused once: not read again
            assert not decoded.holds([damaged])
    finally:
        engine.dispose()


def _verdict(url, checks):
    engine = db_mod.make_engine(url)
    try:
        return verify(engine, checks=checks).to_json()
    finally:
        engine.dispose()


def test_verify_with_kept_blocks_reports_as_the_plain_checks_on_the_honest_demo(demo):
    out, _ = demo
    url, site = f"sqlite:///{out / 'ledger.db'}", _site(out)
    fast = _verdict(url, verify_checks(site))
    assert fast["ok"] and fast == _verdict(url, _plain_checks(site))


def _tamper_used_block(path, damage):  # noqa: ANN001
    """Rewrite the block of the segment the most issued receipts read (``damage``: 'values', its samples
    changed and its sha256 fixed up; 'bytes', a byte of it flipped)."""
    engine = db_mod.make_engine(f"sqlite:///{path}")
    with db_mod.write_tx(engine) as conn:
        sid, format_, data = conn.execute(text(
            "SELECT segment_id, format, data FROM sample_blocks ORDER BY rows DESC LIMIT 1")).one()
        conn.execute(text("DROP TRIGGER IF EXISTS sample_blocks_no_update"))
        if damage == "values":
            rows = [list(r) for _, table in blocks.decode(format_, bytes(data)) for r in blocks.table_rows(table)]
            for r in rows:
                for c in ("sm_active", "gpu_util", "tensor_active"):
                    r[SAMPLE_COLUMNS.index(c)] = 0.0
            block = blocks.encode([tuple(r) for r in rows])
            conn.execute(text("UPDATE sample_blocks SET data = :d, sha256 = :h WHERE segment_id = :s"),
                         {"d": block.data, "h": block.sha256, "s": sid})
        else:
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0x5A
            conn.execute(text("UPDATE sample_blocks SET data = :d WHERE segment_id = :s"),
                         {"d": bytes(flipped), "s": sid})
    engine.dispose()


@pytest.mark.parametrize("damage", ["values", "bytes"])
def test_verify_with_kept_blocks_reports_as_the_plain_checks_on_a_tampered_demo(demo, tmp_path, damage):
    out, _ = demo
    copy = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", copy)
    _tamper_used_block(copy, damage)
    url, site = f"sqlite:///{copy}", _site(out)
    fast = _verdict(url, verify_checks(site))
    assert not fast["ok"]
    assert any("receipt" in p["reason"] for p in fast["problems"]), fast["problems"]  # the replays saw it
    assert fast == _verdict(url, _plain_checks(site))


# --- the replays shared with worker processes ---------------------------------------------------------------

@pytest.fixture
def shared_used(monkeypatch):
    """Shared replays on the small demo's receipts (few: the thresholds lowered), counting the runs that
    actually shared them."""
    from ledger.receipts import auto

    monkeypatch.setattr(auto, "PARALLEL_MIN_RECEIPTS", 2)
    monkeypatch.setattr(auto, "REPLAY_CHUNK", 3)
    used = []
    finish = auto.SharedReplays.finish

    def counted(self, engine, decoded):  # noqa: ANN001, ANN202
        problems = finish(self, engine, decoded)
        used.append(self.chunks)
        return problems

    monkeypatch.setattr(auto.SharedReplays, "finish", counted)
    return used


@pytest.fixture
def abandoned(monkeypatch):
    """Each SharedReplays.abandon call, as whether the workers were running when it came (and it stopped them)."""
    from ledger.receipts import auto

    calls = []
    abandon = auto.SharedReplays.abandon

    def counted(self):  # noqa: ANN001, ANN202
        calls.append(self.started)
        abandon(self)
        assert not self.started

    monkeypatch.setattr(auto.SharedReplays, "abandon", counted)
    return calls


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("damage", [None, "values", "bytes"])
def test_replays_shared_with_workers_report_as_one_process(demo, tmp_path, shared_used, monkeypatch, damage,
                                                           method):
    from ledger.receipts import auto

    out, _ = demo
    copy = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", copy)
    if damage:
        _tamper_used_block(copy, damage)
    monkeypatch.setattr(auto, "worker_start_method", lambda: method)   # each way workers start
    url, site = f"sqlite:///{copy}", _site(out)
    shared = _verdict(url, verify_checks(site, workers=2))
    assert shared_used and shared_used[0] > 2   # the workers were started and had chunks to take
    assert shared == _verdict(url, _plain_checks(site)) == _verdict(url, verify_checks(site, workers=1))
    assert shared["ok"] is (damage is None)
    engine = db_mod.make_engine(url)   # the CLI's way: the replays begun before the chain walk
    try:
        assert verify_site(engine, site, workers=2).to_json() == shared
    finally:
        engine.dispose()
    assert len(shared_used) == 2 and shared_used[1] > 2


def test_replays_begun_before_a_chain_that_fails_are_stopped_and_the_report_is_the_chains(demo, tmp_path,
                                                                                          shared_used, abandoned):
    out, _ = demo
    copy = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", copy)
    engine = db_mod.make_engine(f"sqlite:///{copy}")
    with db_mod.write_tx(engine) as conn:   # an entry's content edited in place: the chain walk names it
        conn.execute(text("DROP TRIGGER IF EXISTS entries_no_update"))
        conn.execute(text("UPDATE entries SET ts_end = ts WHERE seq = (SELECT MIN(seq) FROM entries "
                          "WHERE kind = 'allocation_ended')"))
    try:
        got = verify_site(engine, _site(out), workers=2).to_json()
        assert not got["ok"] and got == verify(engine).to_json()   # the chain's report, as without checks
        assert "content does not match" in got["problems"][0]["reason"]
    finally:
        engine.dispose()
    assert abandoned == [True] and shared_used == []   # the workers had started; no replay was gathered


def test_workers_fork_only_from_a_single_threaded_process():
    import threading

    from ledger.base.processes import worker_start_method

    assert worker_start_method() == "fork"   # pytest's one thread, on Linux
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert worker_start_method() == "spawn"
    finally:
        stop.set()
        other.join()


def test_a_core_other_processes_keep_busy_is_not_idle():
    import os
    import subprocess
    import sys
    import time

    from ledger.base.processes import idle_cores, workers_for

    cores = len(os.sched_getaffinity(0))
    assert 0 <= idle_cores() <= cores and 1 <= workers_for(4) <= 4
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores + 1)]
    try:
        time.sleep(0.3)
        assert idle_cores() == 0 and workers_for(4) == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()


@pytest.mark.parametrize("damage", [None, "values"])
def test_verify_cli_default_workers_give_the_one_process_output(runner, cli, demo, tmp_path, shared_used,
                                                                monkeypatch, damage):
    from ledger.base import processes

    out, _ = demo
    copy = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", copy)
    if damage:
        _tamper_used_block(copy, damage)
    argv = ["--db", f"sqlite:///{copy}", "--config", str(out / "site.toml"), "verify", "--json"]
    one = runner.invoke(cli, argv + ["--workers", "1"])
    assert not shared_used   # --workers 1: every replay in this process
    monkeypatch.setattr(processes, "idle_cores", lambda: 2)
    default = runner.invoke(cli, argv)
    assert shared_used       # the default shares them with a worker, one per idle core
    many = runner.invoke(cli, argv + ["--workers", "3"])
    assert len(shared_used) == 2
    assert one.exit_code == default.exit_code == many.exit_code == (1 if damage else 0)
    assert one.output == default.output == many.output
    monkeypatch.setattr(processes, "idle_cores", lambda: 0)
    runner.invoke(cli, argv)
    assert len(shared_used) == 2   # no idle core: one process


def test_replay_without_timelines_is_the_same_receipt(demo):
    """verify's replays leave out the PDF's timeline strip: the same body, byte for byte, for every issued receipt."""
    from ledger.chain.canonical import canonical_json
    from ledger.receipts.issue import replay

    out, _ = demo
    site = _site(out)
    engine = db_mod.make_engine(f"sqlite:///{out / 'ledger.db'}")
    try:
        issued = list(iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]))
        assert issued
        for ce in issued:
            full = replay(engine, ce, site.sku_table, carbon=site.carbon)
            lean = replay(engine, ce, site.sku_table, carbon=site.carbon, timelines=False)
            assert canonical_json(lean.body) == canonical_json(full.body)
            assert lean.hash == full.hash == ce.entry.data["receipt_hash"]
            assert all(t is None for t in lean.timelines.values())
        assert any(t is not None for ce in issued[:5]
                   for t in replay(engine, ce, site.sku_table, carbon=site.carbon).timelines.values())
    finally:
        engine.dispose()


# --- the segment read without pyarrow's compute module -------------------------------------------------------

_labels = st.sampled_from(["GPU-a", "GPU-b", "GPU-ü", "", "GPU-a\x00", "Ω"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.none() | _labels, max_size=6), min_size=1, max_size=4), _labels, st.integers(0, 2))
def test_every_row_is_reads_the_buffers_as_pyarrow_reads_the_values(chunks, label, cut):
    import pyarrow as pa

    from ledger.telemetry.sealed import every_row_is

    column = pa.chunked_array([pa.array(c, type=pa.string()) for c in chunks], type=pa.string())
    for col in (column, column.slice(min(cut, len(column)))):   # offsets into the buffers too
        assert every_row_is(col, label) == (col.null_count == 0 and all(v == label for v in col.to_pylist()))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_labels, st.lists(st.floats(0, 100, allow_nan=False) | st.just(float("nan")), min_size=1,
                                            max_size=5), st.booleans()), min_size=2, max_size=5))
def test_pieces_said_in_order_are_what_the_sort_gives(drawn):
    import pyarrow as pa

    from ledger.telemetry.sealed import pieces_in_order

    pieces = []
    for label, ts, mislabel in drawn:
        devices = [label] * len(ts) if not mislabel else [label + "x"] + [label] * (len(ts) - 1)
        pieces.append((label, pa.table({"device": pa.array(devices, type=pa.string()),
                                        "t": pa.array(ts, type=pa.float64())})))
    table = pa.concat_tables([t for _, t in pieces])
    if pieces_in_order(pieces):
        assert table.to_pylist() == table.sort_by([("device", "ascending"), ("t", "ascending")]).to_pylist()


def test_the_demo_segments_read_unsorted_as_sorted(kept):
    """Every demo segment read whole (verify's read) is the sorted table, without the sort."""
    import pyarrow as pa

    from ledger.telemetry.sealed import pieces_in_order, read_samples

    engine, _decoded, segments, _, _ = kept
    with engine.connect() as conn:
        for sid in segments:
            pieces = list(iter_sample_pieces(conn, segment_ids=[sid], check_blocks=True))
            assert len(pieces) > 1 and pieces_in_order(pieces)
            table = read_samples(conn, segment_ids=[sid], check_blocks=True)
            concat = pa.concat_tables([t for _, t in pieces])
            assert table.to_pylist() == concat.sort_by([("device", "ascending"), ("t", "ascending")]).to_pylist()
            backwards = pieces[::-1]
            assert not pieces_in_order(backwards)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_kept_float_columns_are_the_pieces_values(kept, data):
    """DecodedSegments.float_pieces: each piece's columns as float_values gives them, with their NULL counts, for
    any segments, devices, window and columns (the same reads twice: the second from the converted columns)."""
    import numpy as np

    from ledger.receipts.gather import LENS_READ_COLUMNS

    _engine, decoded, segments, devices, (t0, t1) = kept
    numeric = [c for c in SAMPLE_COLUMNS if c != "device"]
    ids = data.draw(st.lists(st.sampled_from(segments), min_size=1, max_size=8))
    devs = data.draw(st.none() | st.lists(st.sampled_from(devices), min_size=1, max_size=6))
    columns = data.draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=6, unique=True))
    start = data.draw(st.none() | st.floats(t0 - 3600, t1, allow_nan=False))
    end = data.draw(st.none() | st.floats(t0, t1 + 3600 * 24, allow_nan=False))
    for _ in range(2):
        plain = [(d, [blocks.float_values(c) for c in t.columns], [c.null_count for c in t.columns])
                 for d, t in decoded.pieces(ids, devs, start, end, columns)]
        fast = list(decoded.float_pieces(ids, devs, start, end, columns, count_nulls=columns))
        assert [d for d, _, _ in fast] == [d for d, _, _ in plain]
        for (_, want, nulls), (_, got, counted) in zip(plain, fast):
            assert all(np.array_equal(w, g, equal_nan=True) for w, g in zip(want, got))
            assert [counted[c] for c in columns] == nulls
            assert not any(g.flags.writeable for g in got)   # shared by every read
        assert all(set(n) == set(columns) & set(LENS_READ_COLUMNS) for _, _, n in
                   decoded.float_pieces(ids, devs, start, end, columns, count_nulls=LENS_READ_COLUMNS))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_receipts_arrays_from_the_kept_columns_are_the_database_reads(kept, data):
    """load_sample_arrays (and its energy columns) from verify's kept blocks is the plain read, array for array."""
    import dataclasses

    import numpy as np

    from ledger.receipts.gather import load_sample_arrays

    engine, decoded, segments, devices, (t0, t1) = kept
    ids = data.draw(st.lists(st.sampled_from(segments), min_size=1, max_size=8))
    devs = data.draw(st.lists(st.sampled_from(devices), min_size=1, max_size=6, unique=True))
    start = data.draw(st.floats(t0 - 3600, t1, allow_nan=False))
    end = data.draw(st.floats(start, t1 + 3600 * 24, allow_nan=False))
    lens, energy = data.draw(st.booleans()), data.draw(st.booleans())

    def same(a, b):  # noqa: ANN001, ANN202
        return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b, equal_nan=True))

    with engine.connect() as conn:
        reads = []
        for kept_blocks in (decoded, None):
            out: dict | None = {} if energy else None
            reads.append((load_sample_arrays(conn, ids, devs, start, end, lens, out, decoded=kept_blocks), out))
    (fast, fast_energy), (plain, plain_energy) = reads
    assert list(fast) == list(plain)
    for d in plain:
        assert all(same(getattr(fast[d], f.name), getattr(plain[d], f.name)) for f in dataclasses.fields(plain[d]))
    if energy:
        assert list(fast_energy) == list(plain_energy)
        assert all(same(fast_energy[d][k][i], plain_energy[d][k][i]) for d in plain_energy
                   for k in ("energy_j", "power_w") for i in (0, 1))


def test_replays_begun_are_stopped_when_a_check_raises(demo, shared_used, abandoned, monkeypatch):
    """Anything raised after the replays began (here the flat lines' check, which runs while the workers replay)
    stops them before it goes on up: no worker is left replaying for an interpreter that is ending."""
    from ledger.receipts import auto

    out, _ = demo

    def broken(engine, report):  # noqa: ANN001, ANN202
        raise RuntimeError("a check that fails")

    monkeypatch.setattr(auto, "check_receipt_lines", broken)
    engine = db_mod.make_engine(f"sqlite:///{out / 'ledger.db'}")
    try:
        with pytest.raises(RuntimeError, match="a check that fails"):
            verify_site(engine, _site(out), workers=2)
    finally:
        engine.dispose()
    assert abandoned == [True] and shared_used == []
