"""The append-only, hash-chained ledger on both backends: idempotence, refusal of UPDATE/DELETE, tamper evidence."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings, strategies as st
from sqlalchemy import text

from ledger.chain import store
from ledger.chain.canonical import canonical_json, format_ts, parse_ts
from ledger.chain.entries import GENESIS_HASH, Kind, chain_hash, entry_from_record, make_entry
from ledger.chain.verify import check_chain, verify


def _entries(n: int, job: str = "100"):
    base = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    return [make_entry(Kind.TELEMETRY_SUMMARY, base + dt.timedelta(seconds=i), {"i": i, "v": i * 0.5},
                       cluster="c1", job_id=job, run=0, node="n1", device=f"GPU-{i % 4}") for i in range(n)]


def test_append_assigns_contiguous_sequence_and_links_chain(engine):
    res = store.append(engine, _entries(5))
    assert (res.appended, res.first_seq, res.last_seq) == (5, 1, 5)
    rows = list(store.iter_entries(engine))
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_hash == GENESIS_HASH
    for a, b in zip(rows, rows[1:]):
        assert b.prev_hash == a.hash
    assert verify(engine).ok


def test_same_fact_twice_is_one_entry(engine):
    store.append(engine, _entries(3))
    again = store.append(engine, _entries(3) + _entries(3))
    assert again.appended == 0
    assert store.count(engine) == 3
    more = store.append(engine, _entries(4))
    assert more.appended == 1 and more.first_seq == 4


def test_recorded_at_does_not_change_identity():
    a = make_entry(Kind.PROGRESS, "2026-11-01T00:00:00Z", {"step": 1}, recorded_at="2026-11-01T00:00:01Z")
    b = make_entry(Kind.PROGRESS, "2026-11-01T00:00:00Z", {"step": 1}, recorded_at="2026-11-02T00:00:00Z")
    assert a.entry_id == b.entry_id
    c = make_entry(Kind.PROGRESS, "2026-11-01T00:00:00Z", {"step": 2})
    assert c.entry_id != a.entry_id


@pytest.mark.parametrize("statement", ["UPDATE entries SET kind = 'progress' WHERE seq = 1",
                                       "DELETE FROM entries WHERE seq = 1"])
def test_database_refuses_update_and_delete(engine, statement):
    store.append(engine, _entries(2))
    with pytest.raises(Exception) as excinfo:
        with engine.begin() as conn:
            conn.execute(text(statement))
    assert "append-only" in str(excinfo.value)
    assert store.count(engine) == 2
    assert verify(engine).ok


def test_postgres_truncate_refused(postgres, tmp_path):
    from ledger.chain import db as db_mod

    url = postgres.create_db("ipledger_truncate")
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    store.append(eng, _entries(2))
    with pytest.raises(Exception, match="append-only"):
        with eng.begin() as conn:
            conn.execute(text("TRUNCATE entries"))
    with eng.connect() as conn:
        privs = conn.execute(text(
            "SELECT privilege_type FROM information_schema.role_table_grants "
            "WHERE grantee = 'ipledger_writer' AND table_name = 'entries' ORDER BY 1")).scalars().all()
    assert privs == ["INSERT", "SELECT"]
    eng.dispose()


def _drop_triggers(conn):
    if conn.dialect.name == "sqlite":
        conn.execute(text("DROP TRIGGER entries_no_update"))
    else:
        conn.execute(text("DROP TRIGGER entries_no_update_delete ON entries"))


@pytest.mark.parametrize("column,value", [("payload", '{"i":2,"v":99.0}'), ("kind", "progress"),
                                          ("job_id", "999"), ("prev_hash", "f" * 64)])
def test_tamper_is_found_at_exactly_that_entry(engine, column, value):
    store.append(engine, _entries(6))
    with engine.begin() as conn:
        _drop_triggers(conn)
        conn.execute(text(f"UPDATE entries SET {column} = :v WHERE seq = 3"), {"v": value})
    report = verify(engine)
    assert not report.ok
    assert report.problems[0].seq == 3


def test_edit_that_also_fixes_its_own_hash_breaks_the_next_link(engine):
    store.append(engine, _entries(4))
    rows = list(store.iter_entries(engine))
    forged = entry_from_record({**rows[1].entry.to_record(), "payload": {"i": 1, "v": 1000.0}})
    forged_hash = chain_hash(2, forged, rows[1].prev_hash)
    with engine.begin() as conn:
        _drop_triggers(conn)
        conn.execute(text("UPDATE entries SET payload = :p, entry_id = :i, hash = :h WHERE seq = 2"),
                     {"p": forged.payload, "i": forged.entry_id, "h": forged_hash})
    report = verify(engine)
    assert [p.seq for p in report.problems] == [3]


def test_iter_entries_filters_and_through_seq(engine):
    store.append(engine, _entries(5, job="1") + _entries(3, job="2"))
    assert len(list(store.iter_entries(engine, job_id="2"))) == 3
    assert [c.seq for c in store.iter_entries(engine, through_seq=4)] == [1, 2, 3, 4]
    assert len(list(store.iter_entries(engine, batch=2))) == 8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted([Kind.PROGRESS, Kind.ADJUSTMENT, Kind.TELEMETRY_SUMMARY])),
                          st.integers(0, 10**6), st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8)
                                                                 | st.floats(allow_nan=False, allow_infinity=False),
                                                                 max_size=4)),
                max_size=25))
def test_chain_check_accepts_any_honest_chain_and_is_deterministic(items):
    entries = [make_entry(k, 1_700_000_000 + t, p, job_id="j") for k, t, p in items]
    unique = list({e.entry_id: e for e in entries}.values())
    prev = GENESIS_HASH
    chained = []
    from ledger.chain.entries import ChainedEntry

    for i, e in enumerate(unique, start=1):
        h = chain_hash(i, e, prev)
        chained.append(ChainedEntry(i, e, prev, h))
        prev = h
    report = check_chain(chained)
    assert report.ok and report.entries == len(unique) and report.head_hash == prev
    # Rebuilding from the spool form gives the same ids and hashes (a second process would too).
    for ce in chained:
        again = entry_from_record(ce.entry.to_record())
        assert again == ce.entry


def test_canonical_forms():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    assert format_ts("2026-11-30T01:02:03+01:00") == "2026-11-30T00:02:03Z"
    assert format_ts(1_700_000_000.25) == "2023-11-14T22:13:20.25Z"
    with pytest.raises(ValueError):
        parse_ts("2026-11-30T01:02:03")
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
