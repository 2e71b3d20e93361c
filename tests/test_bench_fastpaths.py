"""The performance fast paths give exactly the reference results (bench/ made them; these keep them honest).

- format_ts: canonical text skips the strftime round trip; same output and same errors as the slow path.
- make_entry / entry_from_record: ids computed without dataclasses.replace equal compute_entry_id.
- verify's fast path (raw rows, SQLite json_array encodings, parallel seq ranges) reports exactly what the
  reference check_chain reports, for honest ledgers and tampered ones, on both backends; SQLite's encodings
  are byte for byte the reference row_encodings; its one-pass tree check agrees with the reference
  heads.subtree_problems (tests/test_merkle.py holds it against every kind of damage).
- the shipper's record checks: the memoised time parse, the payload decoder built once and the shortcut for
  plain text fields give what their references give; the collector threshold is restored after shipping.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import store
from ledger.chain import verify as verify_mod
from ledger.chain.canonical import format_ts
from ledger.chain.entries import Kind, compute_entry_id, entry_from_record, make_entry
from ledger.chain.verify import check_chain, verify_chain

UTC = dt.timezone.utc


def _slow_format_ts(value: str) -> str:
    """format_ts as it was before the fast path (the reference)."""
    stripped = value.strip()
    if stripped.endswith(("Z", "z")):
        stripped = stripped[:-1] + "+00:00"
    v = dt.datetime.fromisoformat(stripped)
    if v.tzinfo is None:
        raise ValueError("naive")
    v = v.astimezone(UTC)
    out = v.strftime("%Y-%m-%dT%H:%M:%S")
    if v.microsecond:
        out += f".{v.microsecond:06d}".rstrip("0")
    return out + "Z"


def _same(a, b) -> None:  # noqa: ANN001
    try:
        want = a()
    except ValueError:
        with pytest.raises(ValueError):
            b()
        return
    assert b() == want


@settings(max_examples=300, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9999, 12, 30),
                    timezones=st.just(UTC)),
       st.sampled_from(["Z", "+00:00", "z"]), st.integers(0, 6))
def test_format_ts_fast_path_matches_reference_on_valid_times(d, suffix, digits):
    base = d.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f".{d.microsecond:06d}"[: digits + 1] if digits else ""
    text_ = base + frac + suffix
    _same(lambda: _slow_format_ts(text_), lambda: format_ts(text_))


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,7})?Z\Z"))
def test_format_ts_fast_path_matches_reference_on_any_canonical_looking_text(text_):
    _same(lambda: _slow_format_ts(text_), lambda: format_ts(text_))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.text(max_size=12) | st.integers() | st.none(), max_size=4),
       st.text(max_size=10) | st.none(), st.integers(0, 3) | st.none())
def test_entry_ids_match_compute_entry_id(payload, node, run):
    e = make_entry(Kind.PROGRESS, 1_700_000_000.5, payload, node=node, run=run, job_id="7", cluster="c")
    assert e.entry_id == compute_entry_id(e)
    again = entry_from_record(e.to_record())
    assert again == e and again.entry_id == compute_entry_id(again)


# Payload text that stresses the JSON escaping SQLite's json_array must agree on with canonical_json.
NASTY = ['quote " backslash \\ slash /', "ctl \x00\x01\x08\x09\x0a\x0c\x0d\x1f\x7f", "é ü 漢字 🎉",
         "\u2028\u2029 line seps", "", "x" * 3000]


def _entries(n: int) -> list:
    return [make_entry(Kind.PROGRESS, 1_700_000_000 + i, {"i": i, "s": NASTY[i % len(NASTY)], "f": i / 7},
                       job_id=str(i % 13), node=NASTY[i % len(NASTY)][:20].replace("\x00", "") or None,
                       run=i % 3)  # PostgreSQL text cannot hold NUL; the JSON payload can (escaped)
            for i in range(n)]


def _tamper(engine, column: str, value, seq: int) -> None:  # noqa: ANN001
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER entries_no_update"))
        else:
            conn.execute(text("DROP TRIGGER entries_no_update_delete ON entries"))
        conn.execute(text(f"UPDATE entries SET {column} = :v WHERE seq = :s"), {"v": value, "s": seq})


@pytest.fixture
def fast_everywhere(monkeypatch):
    monkeypatch.setattr(verify_mod, "FAST_MIN_ENTRIES", 1)


@pytest.mark.parametrize("workers", [1, 3])
def test_fast_verify_equals_reference_on_an_honest_ledger(engine, fast_everywhere, workers):
    store.append(engine, _entries(300))
    fast = verify_chain(engine, workers=workers)
    ref = check_chain(store.iter_entries(engine))
    assert fast.ok and fast == ref


@pytest.mark.parametrize("column,value,seq", [("payload", '{"i":2}', 150), ("kind", "adjustment", 299),
                                              ("prev_hash", "f" * 64, 101), ("node", "other", 1),
                                              ("seq", 100_000, 300), ("recorded_at", "2020-01-01T00:00:00Z", 50)])
def test_fast_verify_reports_the_reference_problem_on_tampering(engine, fast_everywhere, column, value, seq):
    store.append(engine, _entries(300))
    _tamper(engine, column, value, seq)
    fast = verify_chain(engine, workers=3)
    ref = check_chain(store.iter_entries(engine))
    assert not fast.ok
    assert fast == ref


def test_sqlite_encodings_are_the_reference_encodings_byte_for_byte(sqlite_url):
    """The json_array SQL (ledger.chain.entries.SQLITE_IDENTITY/SQLITE_CHAIN) against row_encodings on hostile text."""
    from ledger.chain import db as db_mod
    from ledger.chain.entries import CHAIN_COLUMNS, SQLITE_CHAIN, SQLITE_IDENTITY, row_encodings
    from ledger.chain.store import ENTRY_COLUMNS

    assert ENTRY_COLUMNS == CHAIN_COLUMNS + ("hash",)  # a stored row is read in the chain's own order
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _entries(60))
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT {', '.join(ENTRY_COLUMNS)}, {SQLITE_IDENTITY}, {SQLITE_CHAIN} "
                                    f"FROM entries ORDER BY seq").all()
    engine.dispose()
    assert len(rows) == 60
    for row in rows:
        assert (row[-2], row[-1]) == tuple(e.encode("utf-8") for e in row_encodings(tuple(row[:-2])))


def _forge_real(db_path, column: str, value: float, seq: int) -> None:
    """Store a REAL in ``column`` of entry ``seq`` and re-seal its id and hash over SQLite's own spelling of
    the row (what a forger targeting the json_array fast path would do). A text column takes a REAL only by
    an edit of the file: here, by dropping the column's declared type for the update (writable_schema)."""
    import hashlib
    import re
    import sqlite3

    from ledger.chain.entries import SQLITE_CHAIN, SQLITE_IDENTITY

    def set_schema(con, sql):  # noqa: ANN001, ANN202
        version = con.execute("PRAGMA schema_version").fetchone()[0]
        con.execute("PRAGMA writable_schema = ON")
        con.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'entries'", (sql,))
        con.execute(f"PRAGMA schema_version = {version + 1}")
        con.commit()

    con = sqlite3.connect(db_path)
    con.execute("DROP TRIGGER entries_no_update")
    declared = con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone()[0]
    untyped = re.sub(rf"(\n\t{column}) [A-Z]+(\(\d+\))?", r"\1", declared)
    assert untyped != declared
    set_schema(con, untyped)
    con.close()
    con = sqlite3.connect(db_path)
    con.execute(f"UPDATE entries SET {column} = ? WHERE rowid = ?", (value, seq))
    ident = con.execute(f"SELECT {SQLITE_IDENTITY} FROM entries WHERE rowid = ?", (seq,)).fetchone()[0]
    con.execute("UPDATE entries SET entry_id = ? WHERE rowid = ?",
                ("e" + hashlib.sha256(ident).hexdigest()[:39], seq))
    chain = con.execute(f"SELECT {SQLITE_CHAIN} FROM entries WHERE rowid = ?", (seq,)).fetchone()[0]
    con.execute("UPDATE entries SET hash = ? WHERE rowid = ?", (hashlib.sha256(chain).hexdigest(), seq))
    con.commit()
    set_schema(con, declared)
    con.close()


@pytest.mark.parametrize("column,value", [("run", 1e20), ("run", 0.1 + 0.2), ("run", 2.5), ("seq", 40.0),
                                          ("ts", 1e16), ("payload", 2.5), ("device", -0.0)])
def test_a_real_sealed_over_sqlites_spelling_is_the_reference_problem(sqlite_url, fast_everywhere, column, value):
    """SQLite's json_array spells a REAL its own way (1.0e+20, 15 digits); row_encodings spells it as Python
    does. A REAL in any column of the last entry, its id and hash re-sealed over SQLite's spelling: the fast
    path reports exactly the reference's problem at that seq, never "ok" (without the REAL guard it did)."""
    from ledger.chain import db as db_mod
    from ledger.chain.entries import CHAIN_COLUMNS, SQLITE_NO_REAL

    assert all(c in SQLITE_NO_REAL for c in CHAIN_COLUMNS if c not in ("entry_id", "prev_hash"))
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _entries(40))
    _forge_real(engine.url.database, column, value, 40)
    fast = verify_chain(engine, workers=2)
    ref = check_chain(verify_mod._sqlite_table_rows(engine))
    engine.dispose()
    assert not fast.ok and fast == ref and [p.seq for p in fast.problems] == [40]
    assert "floating-point" in fast.problems[0].reason or "does not match" in fast.problems[0].reason


@settings(max_examples=25, deadline=None)
@given(st.floats(allow_nan=False))
def test_any_float_in_run_verifies_as_the_reference_does(tmp_path_factory, value):
    """Whatever SQLite stores for a float written to run (a REAL, or an integer when it is integral and fits),
    with the row re-sealed over SQLite's spelling: the fast path's report is the reference's."""
    import shutil

    from ledger.chain import db as db_mod

    template = tmp_path_factory.getbasetemp() / "real-run-template.db"
    if not template.exists():
        eng = db_mod.make_engine(f"sqlite:///{template}")
        db_mod.upgrade(eng)
        store.append(eng, _entries(30))
        eng.dispose()
    db = tmp_path_factory.mktemp("real") / "ledger.db"
    shutil.copy(template, db)
    _forge_real(db, "run", value, 30)
    engine = db_mod.make_engine(f"sqlite:///{db}")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(verify_mod, "FAST_MIN_ENTRIES", 1)
            fast = verify_chain(engine, workers=2)
        assert fast == check_chain(verify_mod._sqlite_table_rows(engine))
    finally:
        engine.dispose()


def test_fast_verify_checks_the_tree_in_the_same_pass(engine, fast_everywhere):
    """Both backends: the chain walk's workers also check every stored Merkle subtree; a rewritten one leaves
    the tree unchecked for the reference check to name, and the chain verdict unchanged."""
    from ledger.chain.heads import subtree_problems

    for start in range(0, 2100, 700):
        store.append(engine, [make_entry(Kind.PROGRESS, 1_700_000_000 + i, {"i": i})
                              for i in range(start, start + 700)])
    report = verify_chain(engine, workers=2, tree=True)
    assert report.ok and report.tree_checked and subtree_problems(engine, 2100) == []
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER merkle_nodes_no_update"))
        else:
            conn.execute(text("DROP TRIGGER merkle_nodes_no_update_delete ON merkle_nodes"))
        conn.execute(text("UPDATE merkle_nodes SET hash = :h WHERE level = 6 AND idx = 0"), {"h": b"\x02" * 32})
    damaged = verify_chain(engine, workers=2, tree=True)
    assert damaged == report and not damaged.tree_checked
    assert [p.seq for p in subtree_problems(engine, 2100)] == [1]


def test_fast_verify_in_threads_when_the_caller_is_threaded(engine, fast_everywhere):
    import threading

    store.append(engine, _entries(2100))  # two ranges of 1,000 entries or more
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()  # a second live thread: verify must not fork
    try:
        fast = verify_chain(engine, workers=2, tree=True)
    finally:
        stop.set()
        t.join()
    assert fast.ok and fast == check_chain(store.iter_entries(engine)) and fast.tree_checked


def test_parallel_ship_equals_serial_ship(tmp_path, monkeypatch):
    """Worker processes preparing spool files change nothing: same report, same chain, same files left."""
    from bench import data
    from ledger.chain import db as db_mod
    from ledger.ingest import ship as ship_mod

    def one(parallel: bool) -> tuple:
        root = tmp_path / ("par" if parallel else "ser")
        spool_dir = root / "spool"
        data.write_spool(spool_dir, 700)
        (spool_dir / "entries-zz-bad.jsonl").write_text('{"kind": "no_such_kind", "ts": "2026-01-01T00:00:00Z"}\n')
        (spool_dir / "entries-zz-torn.jsonl").write_text(
            (spool_dir / "entries-000000000003-bench.jsonl").read_text() + '{"kind": "progr')
        url = f"sqlite:///{root / 'l.db'}"
        eng = db_mod.make_engine(url)
        db_mod.upgrade(eng)
        monkeypatch.setattr(ship_mod, "PARALLEL_MIN_FILES", 2 if parallel else 10**9)
        monkeypatch.setattr(ship_mod, "_CHUNK_FILES", 7)
        rep = ship_mod.ship(eng, spool_dir, batches=ship_mod.Batches(files=11)).to_json()
        rows = [(c.seq, c.entry.entry_id, c.hash) for c in store.iter_entries(eng)]
        left = sorted(p.name for p in spool_dir.iterdir() if p.is_file())
        eng.dispose()
        rep["torn"] = [p.replace(str(root), "") for p in rep["torn"]]
        rep["refused"] = [p.replace(str(root), "") for p in rep["refused"]]
        return rep, rows, left

    serial, parallel = one(False), one(True)
    assert serial == parallel
    rep, rows, left = parallel
    assert rep["refused"] and rep["torn"] and not rep["errors"] and left == []
    assert rep["appended"] == len(rows) and rows[-1][0] == len(rows)


def test_prepared_files_cross_from_workers_unchanged(tmp_path):
    """What a worker hands back (entries as plain field tuples over the pipe) rebuilds the very same entries."""
    import pickle

    from bench import data
    from ledger.ingest import ship as ship_mod

    data.write_spool(tmp_path / "spool", 60)
    for path in sorted((tmp_path / "spool").iterdir()):
        prep = ship_mod._prepare_file(path)
        back = pickle.loads(pickle.dumps(prep))
        assert prep.entries and back.entries == prep.entries and back.read == prep.read
        assert all(type(e) is type(prep.entries[0]) for e in back.entries)
        assert back.segments == prep.segments == [] and back.errors == prep.errors


# --- the shipper's record checks (ledger/ingest/intake.py) and its collector setting (ledger/ingest/ship.py) ---------------

def _outcome(fn):  # noqa: ANN001, ANN202
    """What a call gives: its value, or its exception's type and message."""
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return (type(exc).__name__, str(exc))


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{0,6})?Z\Z")
       | st.text(max_size=30))
def test_memoised_time_parse_matches_its_reference_cold_and_warm(text_):
    from ledger.ingest import intake

    want = _outcome(lambda: intake.canonical_epoch(text_))
    intake._EPOCHS.pop(text_, None)
    assert _outcome(lambda: intake._canonical_epoch_memo(text_)) == want  # cold
    assert _outcome(lambda: intake._canonical_epoch_memo(text_)) == want  # warm (kept, if it parsed)
    assert text_ not in intake._EPOCHS or want == ("ok", intake._EPOCHS[text_])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.just("\ufeff{}"), st.just('{"a": NaN}'), st.just('{"a": -Infinity}'),
                 st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=5),
                              lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                              max_leaves=8).map(lambda v: __import__("json").dumps(v))))
def test_payload_decoder_built_once_matches_json_loads(raw):
    import json

    from ledger.ingest import intake

    assert _outcome(lambda: intake.decode_payload(raw)) == \
        _outcome(lambda: json.loads(raw, parse_constant=intake._refuse_constant))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["cluster", "node", "device", "source", "source_version"]),
       st.text(max_size=140) | st.text(alphabet="ab\x00\udc80é", max_size=6) | st.integers() | st.none())
def test_record_text_fields_refused_exactly_as_the_full_check_does(name, value):
    """check_record's shortcut for plain ASCII fields refuses what intake._text refuses, with its reason."""
    from ledger.ingest import intake

    rec = {"kind": Kind.PROGRESS, "ts": "2026-01-01T00:00:00Z", "cluster": "c", "job_id": "7", "payload": "{}",
           name: value}
    if name == "source" and isinstance(value, str) and (value in intake.RESERVED_SOURCES or
                                                        value.startswith(intake.RESERVED_SOURCE_PREFIXES)):
        return  # refused as reserved, whatever its text
    want = _outcome(lambda: intake._text(name, value))
    got = _outcome(lambda: intake.check_record(rec))
    assert got[0] == "ok" if want[0] == "ok" else got == want


def test_shipping_raises_the_collector_threshold_and_restores_it(tmp_path):
    import gc

    from ledger.ingest import ship as ship_mod

    before = gc.get_threshold()
    with ship_mod.fewer_collections():
        assert gc.get_threshold() == (max(before[0], ship_mod.GC_THRESHOLD_SHIPPING), *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), ship_mod.fewer_collections():
        raise RuntimeError("a failed shipment")
    assert gc.get_threshold() == before
    # overlapping shipments (threads): the last one out restores what was there before the first
    a, b = ship_mod.fewer_collections(), ship_mod.fewer_collections()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert gc.get_threshold()[0] >= ship_mod.GC_THRESHOLD_SHIPPING
    b.__exit__(None, None, None)
    assert gc.get_threshold() == before
