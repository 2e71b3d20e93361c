"""Spool and ship: at-least-once delivery gives exactly one entry; torn lines and crashes lose nothing committed."""

from __future__ import annotations

import json
import os
import shutil
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.ingest import intake
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.entries import Kind, entry_from_record, make_entry
from ledger.ingest.ship import Batches, ship
from ledger.chain.verify import verify


def _records(n, job="7"):
    return [make_entry(Kind.PROGRESS, 1_760_000_000 + i, {"step": i}, cluster="c", job_id=job, run=0).to_record()
            for i in range(n)]


def _ledger_rows(engine):
    return [(c.seq, c.entry_id, c.hash) for c in store.iter_entries(engine)]


def test_ship_moves_files_only_after_commit_and_is_idempotent(engine, tmp_path):
    sp = tmp_path / "spool"
    f1 = spool.write(sp, _records(3))
    spool.write(sp, _records(5))  # overlaps the first: at-least-once writers repeat themselves
    rep = ship(engine, sp)
    assert (rep.files, rep.records, rep.appended) == (2, 8, 5)
    assert not list(sp.glob("*.jsonl")) and (sp / "shipped" / f1.name).exists()
    before = _ledger_rows(engine)
    # Ship the very same files again (as if the move had been lost in a crash).
    for p in (sp / "shipped").iterdir():
        shutil.copy(p, sp / p.name)
    rep2 = ship(engine, sp)
    assert rep2.appended == 0 and rep2.duplicates == 8
    assert _ledger_rows(engine) == before
    assert verify(engine).ok


def test_torn_last_line_is_set_aside_and_the_rest_ships(engine, tmp_path):
    sp = tmp_path / "spool"
    good = spool.write(sp, _records(4))
    text = good.read_text()
    torn = sp / "entries-crashed.jsonl.tmp"
    torn.write_text(text + text.splitlines()[0][:25])  # a writer died mid-line, before its rename
    old = time.time() - 3600
    os.utime(torn, (old, old))
    rep = ship(engine, sp)
    assert rep.appended == 4 and rep.duplicates == 4
    assert rep.torn == [str(torn)]
    assert (sp / "torn" / "entries-crashed.jsonl.tmp.torn").exists()
    assert store.count(engine) == 4


def test_fresh_tmp_file_is_left_for_its_writer(engine, tmp_path):
    sp = tmp_path / "spool"
    sp.mkdir()
    (sp / "entries-writing.jsonl.tmp").write_text(json.dumps(_records(1)[0]) + "\n")
    rep = ship(engine, sp)
    assert rep.files == 0 and (sp / "entries-writing.jsonl.tmp").exists()


def test_bad_record_is_refused_and_recorded_and_the_rest_ships(engine, tmp_path):
    sp = tmp_path / "spool"
    bad = sp / "entries-bad.jsonl"
    sp.mkdir()
    good = _records(1)[0]
    bad.write_text(json.dumps({"kind": "no_such_kind", "ts": "2026-01-01T00:00:00Z"}) + "\n" + json.dumps(good) + "\n")
    spool.write(sp, _records(2))
    rep = ship(engine, sp)
    assert not bad.exists() and "no_such_kind" in rep.refused[0] and not rep.errors
    kinds = [c.kind for c in store.iter_entries(engine)]
    assert kinds.count(Kind.PROGRESS) == 2 and kinds.count(Kind.EVIDENCE_REFUSED) == 1
    note = json.loads((sp / "quarantine" / "entries-bad.jsonl.refused").read_text())
    assert note["line"] == 1 and "no_such_kind" in note["reason"] and "no_such_kind" in note["text"]
    assert verify(engine).ok


def test_parse_distinguishes_inner_garbage_from_torn_tail(tmp_path):
    r = spool.parse('{"a":1}\nnot json\n{"b":2}\n{"c"', tmp_path / "x")
    assert r.records == [{"a": 1}, {"b": 2}]
    assert r.torn == '{"c"' and len(r.errors) == 1 and ":2:" in r.errors[0]


def test_after_ship_work_is_handed_only_the_ends_of_runs(engine, tmp_path):
    """Memory stays flat: across batches the shipper keeps only what the after-ship work reads (the runs
    that ended), not every shipped entry; the files still move aside only after that work ran."""
    sp = tmp_path / "spool"
    for job in ("1", "2", "3"):
        spool.write(sp, [*_records(50, job), make_entry(Kind.ALLOCATION_ENDED, 1_760_000_100, {"state": "COMPLETED"},
                                                        cluster="c", job_id=job, run=0).to_record()])
    seen: list = []

    def hook(_engine, shipped):
        assert len(list(sp.glob("*.jsonl"))) == 3, "files stay until the after-ship work is done"
        seen.extend(shipped)
        return []

    rep = ship(engine, sp, batches=Batches(files=1), after=[hook])
    assert rep.appended == 153
    assert sorted(e.job_id for e in seen) == ["1", "2", "3"] and {e.kind for e in seen} == {Kind.ALLOCATION_ENDED}
    assert not list(sp.glob("*.jsonl"))


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
_KEY = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False,
                     allow_infinity=False) | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                     max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(intake.SPOOL_KINDS - {Kind.TELEMETRY_SEGMENT, Kind.DEVICE_BOUND,
                                                            Kind.ALLOCATION_STARTED, Kind.UNKNOWN_INTERVAL})),
       ts=st.floats(1e9, 1.7e9), span=st.none() | st.floats(0, 1e6), payload=st.dictionaries(_TEXT, _JSON, max_size=4),
       cluster=st.none() | _KEY, job=st.none() | _KEY | st.integers(0, 2**40), run=st.none() | st.integers(0, 99),
       node=st.none() | _KEY, device=st.none() | _KEY)
def test_a_sound_record_is_accepted_as_exactly_the_entry_it_stands_for(kind, ts, span, payload, cluster, job, run,
                                                                       node, device):
    """The intake checks take every honest writer's record (key fields fit their columns and hold no NUL: a
    writer's names come from C strings), and build the very entry (same id) that entry_from_record rebuilds
    from it: checking costs no fact."""
    rec = make_entry(kind, ts, payload, ts_end=None if span is None else ts + span, recorded_at=ts, cluster=cluster,
                     job_id=job, run=run, node=node, device=device, source="hook.slurm").to_record()
    rec = json.loads(json.dumps(rec))
    entry, rows = intake.check_record(rec, now=1.8e9)
    assert entry == entry_from_record(rec) and rows is None


def test_text_a_database_cannot_store_is_refused_not_a_stuck_batch(engine, tmp_path):
    """A NUL in a key field, or a value wider than its column, would fail PostgreSQL's insert of the whole
    batch on every ship; they are refused,
    and the rest (a NUL inside a payload string, which JSON escapes, included) ships on both backends."""
    sp = tmp_path / "spool"
    recs = _records(2)
    recs.append({**_records(1, job="8")[0], "node": "n\x00"})
    recs.append({**_records(1, job="8")[0], "cluster": "c" * 129})   # wider than its column
    recs.append(make_entry(Kind.PROGRESS, 1_760_000_000, {"note": "a\x00b"}, cluster="c", job_id="9").to_record())
    spool.write(sp, recs)
    rep = ship(engine, sp)
    assert rep.refused_total == 2 and "NUL" in rep.refused[0] and "longer than 128" in rep.refused[1]
    assert not rep.errors
    kinds = [c.kind for c in store.iter_entries(engine)]
    assert kinds.count(Kind.PROGRESS) == 3 and kinds.count(Kind.EVIDENCE_REFUSED) == 2
    assert not list(sp.glob("*.jsonl")) and verify(engine).ok
