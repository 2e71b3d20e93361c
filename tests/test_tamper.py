"""Tamper evidence (issue 9, point 5): any single edit of a stored entry is caught by `ipledger verify`, which
exits non-zero and names the first bad sequence number in its JSON.

Attacker model (docs/ledger.md, "Tamper evidence"): someone who can write the database behind ipledger's back.
The triggers refuse UPDATE/DELETE to ipledger and to honest mistakes, so the attacker bypasses them: on SQLite
by writing bytes into the database file directly (a copy of an honest ledger, the value's bytes located by
parsing the file's b-tree pages) or by dropping the triggers; on PostgreSQL by dropping the triggers as the
schema owner in a private copy of the database. Each example builds nothing new: it copies one honest ledger
built through the real API (``store.append``, ``telemetry.sealed.write_segment``), applies ONE mutation:

- flip: change one byte of one stored value of one entry row (any column; SQLite at the byte level in the
  file, including the record header's type byte for values stored in no bytes: NULL, 0, 1, ''),
- delete: remove one entry,
- swap: exchange the seq of two entries,
- insert: add one forged entry at position k with a plausible hash (chained to entry k-1, later entries
  renumbered),

and asserts the CLI's exit code 1 and the first problem's seq. The verifier is given the head recorded before
the mutation as an anchor (``--anchor SEQ:HASH``: an auditor's copy); without it, removing the newest entry
leaves a shorter honest chain, which no check inside the database can tell (shown by a test below).
``--soak`` runs more examples per backend.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain import verify as verify_mod
from ledger.chain.entries import Kind, chain_hash, entry_from_record, make_entry
from ledger.chain.store import ENTRY_COLUMNS
from ledger.telemetry.model import SAMPLE_COLUMNS, Sample
from ledger.telemetry.sealed import segment_entry, write_segment

BASE = dt.datetime(2026, 11, 2, 8, tzinfo=dt.timezone.utc)
MUTATIONS = ("flip", "delete", "swap", "insert")


def _honest_entries() -> list[list]:
    """Three appends of varied kinds; NULLs, run 0 and 1, an empty source_version, non-ASCII text."""
    job = dict(cluster="c1", job_id="4242", run=0)
    first = [
        make_entry(Kind.ALLOCATION_STARTED, BASE, {"account": "astro-é", "user": "carol", "gpus": 2}, node="n1", **job),
        make_entry(Kind.DEVICE_BOUND, BASE, {"index": 0, "sku": "H100"}, node="n1", device="GPU-aaa", **job),
        make_entry(Kind.DEVICE_BOUND, BASE, {"index": 1, "sku": "H100"}, node="n1", device="GPU-bbb", **job),
    ]
    second = [
        make_entry(Kind.UNKNOWN_INTERVAL, BASE + dt.timedelta(minutes=5), {"scope": "device", "cause": "dcgm_timeout"},
                   ts_end=BASE + dt.timedelta(minutes=6), node="n1", device="GPU-bbb", source="hook.epilog",
                   source_version="1.2", recorded_at=BASE + dt.timedelta(minutes=7), **job),
        make_entry(Kind.ALLOCATION_ENDED, BASE + dt.timedelta(hours=1), {"exit_code": 0, "state": "COMPLETED"},
                   node="n1", cluster="c1", job_id="4242", run=1),
    ]
    third = [make_entry(Kind.PROGRESS, BASE + dt.timedelta(minutes=m), {"step": m}) for m in (10, 20)]
    return [first, second, third]


def _samples(device: str = "GPU-aaa") -> list[Sample]:
    return [Sample(device, BASE.timestamp() + 10 * i, 10.0, clock_reasons=0, power_w=300.0 + i,
                   sm_active=0.5, energy_j=1000.0 * i) for i in range(6)]


@dataclass(frozen=True)
class Honest:
    """What the honest ledger holds: entries, head hash, the seq of each telemetry segment by its storage."""

    n: int
    head: str
    segments: dict  # "block" (sample_blocks, as written today) and "legacy" (`samples` rows, older ledgers)


def build_honest_ledger(url: str) -> Honest:
    """The ledger every example starts from."""
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    first, second, third = _honest_entries()
    store.append(eng, first)
    samples = _samples()
    block = write_segment(eng, samples, segment_entry(samples, node="n1", source="collector", cluster="c1"))
    store.append(eng, second)
    legacy = _write_legacy_segment(eng, _samples("GPU-bbb"))
    store.append(eng, third)
    n, head = store.get_head(eng)
    eng.dispose()
    return Honest(n, head, {"block": block.first_seq, "legacy": legacy})


def _write_legacy_segment(eng, samples: list[Sample]) -> int:  # noqa: ANN001
    """A segment as ledgers before sample blocks stored it: one `samples` row per sample."""
    entry = segment_entry(samples, node="n1", source="import.dcgm", cluster="c1")
    with db_mod.write_tx(eng) as conn:
        result = store.append_in(conn, [entry])
        columns = ("segment_id", *SAMPLE_COLUMNS)
        conn.execute(text(f"INSERT INTO samples ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"),
                     [{"segment_id": entry.entry_id, **{c: getattr(s, c) for c in SAMPLE_COLUMNS}} for s in samples])
    return result.first_seq


# --- the verdict, from the CLI ------------------------------------------------------------------------------

def run_verify(url: str, anchor: tuple[int, str] | None, fast: bool) -> dict:
    """`ipledger verify --json` in-process (CliRunner); the fast path forced on or left at its threshold."""
    from click.testing import CliRunner

    from ledger.cli.main import cli

    argv = ["--db", url, "verify", "--json"]
    if anchor:
        argv += ["--anchor", f"{anchor[0]}:{anchor[1]}"]
    with mock.patch.object(verify_mod, "FAST_MIN_ENTRIES", 1 if fast else verify_mod.FAST_MIN_ENTRIES):
        res = CliRunner().invoke(cli, argv, catch_exceptions=False)
    out = json.loads(res.stdout)
    assert res.exit_code == (0 if out["ok"] else 1), res.output
    return out


def print_figures(name: str, counts: Counter) -> None:
    """One ``FIGURES`` line (``pytest -s``) for docs/reliability.md: mutations tried by kind, all caught."""
    print(f"\nFIGURES tamper.{name}: " + json.dumps({"mutations": sum(counts.values()), "missed": 0,
                                                     "by_kind": dict(sorted(counts.items()))}), flush=True)


def assert_caught_at(out: dict, seq: int, what: str) -> None:
    assert not out["ok"], f"{what}: verify passed"
    assert out["problems"], what
    assert out["problems"][0]["seq"] == seq, f"{what}: named {out['problems'][0]} instead of seq {seq}"


# --- SQLite at the byte level ---------------------------------------------------------------------------------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v = 0
    for k in range(8):
        b = buf[i + k]
        v = (v << 7) | (b & 0x7F)
        if b < 0x80:
            return v, i + k + 1
    return (v << 8) | buf[i + 8], i + 9


def _content_size(serial_type: int) -> int:
    if serial_type in (0, 8, 9):
        return 0
    if serial_type <= 7:
        return (1, 2, 3, 4, 6, 8, 8)[serial_type - 1]
    return (serial_type - 12) // 2 if serial_type % 2 == 0 else (serial_type - 13) // 2


@dataclass(frozen=True)
class StoredValue:
    """Where one column of one row lies in the database file (SQLite file format, "Record Format")."""

    rowid: int
    column: int
    type_offset: int  # the serial-type byte in the record header (-1 when it takes more than one byte)
    serial_type: int
    offset: int
    size: int


def stored_values(path: Path, table: str) -> list[StoredValue]:
    """Walk the table's b-tree pages in the file and locate every column value of every row."""
    with sqlite3.connect(path) as con:
        (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?",
                              (table,)).fetchone()
    con.close()
    data = path.read_bytes()
    page_size = struct.unpack(">H", data[16:18])[0] or 65536
    page_size = 65536 if page_size == 1 else page_size
    usable = page_size - data[20]
    found, pages = [], [root]
    while pages:
        page = pages.pop()
        base = (page - 1) * page_size
        header = base + (100 if page == 1 else 0)
        page_type, cells = data[header], struct.unpack(">H", data[header + 3:header + 5])[0]
        first_pointer = header + (12 if page_type == 5 else 8)
        pointers = [struct.unpack(">H", data[first_pointer + 2 * i:first_pointer + 2 * i + 2])[0] for i in range(cells)]
        if page_type == 5:  # interior table page: children, then the right-most child
            pages += [struct.unpack(">I", data[base + p:base + p + 4])[0] for p in pointers]
            pages.append(struct.unpack(">I", data[header + 8:header + 12])[0])
            continue
        assert page_type == 13, f"page {page}: not a table b-tree page"
        for p in pointers:
            size, i = _varint(data, base + p)
            rowid, i = _varint(data, i)
            assert size <= usable - 35, "test rows must not spill to overflow pages"
            header_len, j = _varint(data, i)
            body = i + header_len
            column = 0
            while j < i + header_len:
                at = j
                serial_type, j = _varint(data, j)
                n = _content_size(serial_type)
                found.append(StoredValue(rowid, column, at if j - at == 1 else -1, serial_type, body, n))
                body += n
                column += 1
    return found


# Values stored in no bytes are changed by their header byte, to another type of the same (zero) size.
_ZERO_SIZE_SWAPS = {0: (8, 9), 8: (0, 9), 9: (0, 8), 12: (13,), 13: (12,)}


def _same_size_types(serial_type: int) -> tuple[int, ...]:
    """Serial types whose value takes as many bytes: the record's layout survives the header byte's change."""
    if serial_type in _ZERO_SIZE_SWAPS:
        return _ZERO_SIZE_SWAPS[serial_type]
    if serial_type in (6, 7):
        return (13 - serial_type,)  # 8-byte integer <-> float: the same bytes read as the other type
    if serial_type >= 12:
        return (serial_type ^ 1,)   # text <-> blob of the same bytes
    return ()


@st.composite
def byte_flips(draw, values: list[StoredValue]):
    """One byte of one stored value changed to any other byte value, or its header type byte changed to a
    type of the same size (NULL -> 0, text -> blob, ...)."""
    v = draw(st.sampled_from(values))
    retype = _same_size_types(v.serial_type) if v.type_offset >= 0 else ()
    if retype and (not v.size or draw(st.integers(0, 3)) == 0):
        return v, v.type_offset, None, draw(st.sampled_from(retype))
    return v, v.offset + draw(st.integers(0, v.size - 1)), draw(st.integers(1, 255)), None


@pytest.fixture(scope="module")
def honest_sqlite(tmp_path_factory):
    path = tmp_path_factory.mktemp("honest") / "ledger.db"
    honest = build_honest_ledger(f"sqlite:///{path}")
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0  # all in the main file
    return path, honest


def _examples(soak: bool, quick: int, full: int) -> settings:
    return settings(max_examples=full if soak else quick, deadline=None, derandomize=not soak,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.soak
def test_sqlite_any_single_byte_changed_in_the_file_is_caught_at_its_entry(honest_sqlite, tmp_path, soak):
    path, honest = honest_sqlite
    n, head = honest.n, honest.head
    values = [v for v in stored_values(path, "entries") if v.size or v.serial_type in _ZERO_SIZE_SWAPS]
    with sqlite3.connect(path) as con:
        seq_of_rowid = dict(con.execute("SELECT rowid, seq FROM entries"))
    con.close()
    assert sorted(seq_of_rowid.values()) == list(range(1, n + 1))
    assert {v.column for v in values} == set(range(len(ENTRY_COLUMNS)))  # every column can be hit
    honest = path.read_bytes()
    seen: Counter = Counter()

    @_examples(soak, 120, 3000)
    @given(flip=byte_flips(values), fast=st.booleans())
    def run(flip, fast):
        value, at, xor, new_type = flip
        data = bytearray(honest)
        data[at] = data[at] ^ xor if xor is not None else new_type
        copy = tmp_path / "tampered.db"
        copy.write_bytes(data)
        out = run_verify(f"sqlite:///{copy}", (n, head), fast)
        assert_caught_at(out, seq_of_rowid[value.rowid],
                         f"byte {at} ({ENTRY_COLUMNS[value.column]} of seq {seq_of_rowid[value.rowid]})")
        seen[ENTRY_COLUMNS[value.column]] += 1

    run()
    assert len(seen) >= 8, seen  # the examples really spread over the columns
    print_figures("sqlite_bytes", seen)


# --- row-level mutations, both backends -------------------------------------------------------------------------

@dataclass(frozen=True)
class Backend:
    """One honest ledger and how to make a private, trigger-less copy of it to tamper with."""

    name: str
    url: str
    n: int
    head: str
    segments: dict
    copy: object  # () -> url of a fresh copy


def _drop_triggers(conn) -> None:  # noqa: ANN001
    if conn.dialect.name == "sqlite":
        for name in ("entries_no_update", "entries_no_delete", "samples_no_update", "samples_no_delete"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {name}"))
    else:
        for table in ("entries", "samples"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_no_update_delete ON {table}"))


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def honest(request, tmp_path_factory):
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("rows") / "ledger.db"
        url = f"sqlite:///{path}"
        h = build_honest_ledger(url)
        counter = iter(range(10**6))

        def copy() -> str:
            target = path.with_name(f"copy{next(counter)}.db")
            shutil.copy(path, target)
            return f"sqlite:///{target}"
        yield Backend("sqlite", url, h.n, h.head, h.segments, copy)
        return
    import psycopg

    pg = request.getfixturevalue("postgres")
    template = f"ipledger_tamper_{os.getpid()}"
    url = pg.create_db(template)
    h = build_honest_ledger(url)
    counter = iter(range(10**6))
    admin = f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres"

    def copy() -> str:
        name = f"{template}_{next(counter)}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return pg.url(name)
    yield Backend("postgresql", url, h.n, h.head, h.segments, copy)


def _flip_text(value: str, at: int, xor: int) -> str:
    """One byte of the UTF-8 text changed, kept valid text without NUL (PostgreSQL stores nothing else)."""
    raw = bytearray(value.encode("utf-8"))
    ascii_positions = [i for i, b in enumerate(raw) if b < 0x80]
    i = ascii_positions[at % len(ascii_positions)]
    raw[i] ^= xor & 0x7F or 1
    if raw[i] == 0:
        raw[i] = 0x7F
    return raw.decode("utf-8")


def mutate(conn, backend: Backend, kind: str, k: int, j: int, column: str, at: int, xor: int) -> int:  # noqa: ANN001
    """Apply one mutation to entry k (j: the other entry of a swap); returns the seq verify must name."""
    n = backend.n
    q = lambda sql, **p: conn.execute(text(sql), p)  # noqa: E731
    if kind == "delete":
        q("DELETE FROM entries WHERE seq = :k", k=k)
        return k
    if kind == "swap":
        lo, hi = sorted((k, j))
        q("UPDATE entries SET seq = -1 WHERE seq = :lo", lo=lo)
        q("UPDATE entries SET seq = :lo WHERE seq = :hi", lo=lo, hi=hi)
        q("UPDATE entries SET seq = :hi WHERE seq = -1", hi=hi)
        return lo
    if kind == "insert":
        prev = q("SELECT hash FROM entries WHERE seq = :s", s=k - 1).scalar() if k > 1 else "0" * 64
        forged = make_entry(Kind.ADJUSTMENT, BASE, {"direction": "credit", "hours": "100", "reason": "forged"},
                            cluster="c1", job_id="4242", run=0)
        for s in range(n, k - 1, -1):  # one at a time, from the top: seq stays unique throughout
            q("UPDATE entries SET seq = :t WHERE seq = :s", t=s + 1, s=s)
        row = (k, forged.entry_id, forged.kind, forged.ts, forged.ts_end, forged.recorded_at, forged.cluster,
               forged.job_id, forged.run, forged.node, forged.device, forged.payload, forged.source,
               forged.source_version, prev, chain_hash(k, forged, prev))
        q(f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({', '.join(':' + c for c in ENTRY_COLUMNS)})",
          **dict(zip(ENTRY_COLUMNS, row)))
        return k
    old = q(f"SELECT {column} FROM entries WHERE seq = :k", k=k).scalar()
    if column in ("seq", "run"):
        new = (old or 0) ^ ((xor or 1) << (8 * (at % 2)))
        if column == "seq" and new <= n:
            new = old + 1000  # the primary key keeps seq unique: moved past the head instead
    else:
        new = "" if old is None else "x" if old == "" else _flip_text(old, at, xor)
    q(f"UPDATE entries SET {column} = :v WHERE seq = :k", v=new, k=k)
    return k


def _row_mutations(n: int):
    return st.tuples(st.sampled_from(MUTATIONS), st.integers(1, n), st.integers(1, n),
                     st.sampled_from(ENTRY_COLUMNS), st.integers(0, 200), st.integers(1, 255))


@pytest.mark.soak
def test_one_row_level_mutation_is_caught_at_the_first_bad_seq(honest, soak):
    b: Backend = honest
    seen: Counter = Counter()

    @_examples(soak, 60 if b.name == "sqlite" else 25, 1500 if b.name == "sqlite" else 300)
    @given(m=_row_mutations(b.n).filter(lambda m: m[0] != "swap" or m[1] != m[2]), fast=st.booleans())
    def run(m, fast):
        kind, k, j, column, at, xor = m
        url = b.copy()
        eng = db_mod.make_engine(url)
        try:
            with eng.begin() as conn:
                _drop_triggers(conn)
                expected = mutate(conn, b, kind, k, j, column, at, xor)
        finally:
            eng.dispose()
        out = run_verify(url, (b.n, b.head), fast)
        assert_caught_at(out, expected, f"{b.name}: {kind} at {k} ({column if kind == 'flip' else j})")
        seen[kind] += 1

    run()
    assert set(seen) == set(MUTATIONS)
    print_figures(f"rows_{b.name}", seen)


def test_the_honest_ledger_and_its_copies_verify(honest):
    out = run_verify(honest.copy(), (honest.n, honest.head), fast=False)
    assert out["ok"] and out["head_seq"] == honest.n and out["head_hash"] == honest.head
    assert run_verify(honest.copy(), (honest.n, honest.head), fast=True)["ok"]


def test_removing_the_newest_entry_needs_an_anchor(honest):
    """Without a record of the head kept elsewhere, a shortened chain is an honest shorter chain."""
    url = honest.copy()
    eng = db_mod.make_engine(url)
    with eng.begin() as conn:
        _drop_triggers(conn)
        conn.execute(text("DELETE FROM entries WHERE seq = :n"), {"n": honest.n})
    eng.dispose()
    assert run_verify(url, None, fast=False)["ok"]  # the limit of any chain checked from inside
    out = run_verify(url, (honest.n, honest.head), fast=False)
    assert_caught_at(out, honest.n, "tail removed")
    assert "missing" in out["problems"][0]["reason"]


def test_a_rewritten_chain_is_caught_only_by_an_anchor(honest):
    """Edit entry 2 and recompute every later hash: the chain holds, the anchor does not."""
    from ledger.chain.verify import check_chain

    url = honest.copy()
    eng = db_mod.make_engine(url)
    rows = list(store.iter_entries(eng))
    with eng.begin() as conn:
        _drop_triggers(conn)
        prev = rows[0].hash
        for ce in rows[1:]:
            e = ce.entry if ce.seq != 2 else entry_from_record({**ce.entry.to_record(), "payload": {"sku": "B200"}})
            h = chain_hash(ce.seq, e, prev)
            conn.execute(text("UPDATE entries SET entry_id = :i, payload = :p, prev_hash = :ph, hash = :h "
                              "WHERE seq = :s"), {"i": e.entry_id, "p": e.payload, "ph": prev, "h": h, "s": ce.seq})
            prev = h
    assert check_chain(store.iter_entries(eng)).ok
    eng.dispose()
    out = run_verify(url, (honest.n, honest.head), fast=False)
    assert_caught_at(out, honest.n, "rewritten chain")


# --- telemetry samples: caught through the segment digest ---------------------------------------------------------

@pytest.mark.soak
def test_a_changed_sample_is_caught_by_its_segment_digest(honest, soak):
    """Row level, both storages: one value of one sample changed, the block re-encoded with its own sha256
    fixed up (so only the segment digest in the chain can tell)."""
    b: Backend = honest
    seen: Counter = Counter()

    @_examples(soak, 10 if b.name == "sqlite" else 6, 200)
    @given(storage=st.sampled_from(sorted(b.segments)), row=st.integers(0, len(_samples()) - 1),
           column=st.sampled_from(["device", "t", "dt", "clock_reasons", "power_w", "sm_active", "energy_j",
                                   "gpu_temp_c"]))
    def run(storage, row, column):
        url = b.copy()
        eng = db_mod.make_engine(url)
        try:
            with eng.begin() as conn:
                _drop_triggers(conn)
                _change_one_sample(conn, storage, row, column)
        finally:
            eng.dispose()
        out = run_verify(url, (b.n, b.head), fast=False)
        assert_caught_at(out, b.segments[storage], f"{storage} sample {row}.{column}")
        assert "sample" in out["problems"][0]["reason"]
        seen[storage] += 1

    run()
    print_figures(f"samples_{b.name}", seen)


def _change_one_sample(conn, storage: str, row: int, column: str) -> None:  # noqa: ANN001
    if storage == "block":
        from ledger.telemetry import blocks

        [(segment_id, format_, data)] = conn.execute(text("SELECT segment_id, format, data FROM sample_blocks"))
        [(_, table)] = blocks.decode(format_, bytes(data))
        rows = [list(r) for r in blocks.table_rows(table)]
        i = SAMPLE_COLUMNS.index(column)
        rows[row][i] = rows[row][i] + "x" if column == "device" else (rows[row][i] or 0) + 1
        block = blocks.encode([tuple(r) for r in rows])
        triggers = (["sample_blocks_no_update"] if conn.dialect.name == "sqlite"
                    else ["sample_blocks_no_update_delete ON sample_blocks"])
        for trigger in triggers:
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger}"))
        conn.execute(text("UPDATE sample_blocks SET data = :d, sha256 = :h, rows = :n WHERE segment_id = :s"),
                     {"d": block.data, "h": block.sha256, "n": block.rows, "s": segment_id})
        return
    key = "rowid" if conn.dialect.name == "sqlite" else "ctid"
    ids = [r[0] for r in conn.execute(text(f"SELECT {key} FROM samples ORDER BY device, t"))]
    new = f"{column} || 'x'" if column == "device" else f"COALESCE({column}, 0) + 1"
    where = "rowid = :r" if conn.dialect.name == "sqlite" else "ctid = CAST(:r AS tid)"
    conn.execute(text(f"UPDATE samples SET {column} = {new} WHERE {where}"), {"r": str(ids[row])
                                                                              if key == "ctid" else ids[row]})


# Stored values a changed byte of which no reader sees: the segment_id key is read through its index (the
# row's own copy is not consulted, so the samples a reader gets are the sealed ones), and a block's `rows`
# column is informative only (the decoded block is what is digested).
_UNREAD = {"sample_blocks": {"segment_id", "rows"}, "samples": {"segment_id"}}


@pytest.mark.soak
def test_sqlite_any_byte_of_stored_samples_changed_in_the_file_is_caught(honest_sqlite, tmp_path, soak):
    path, honest = honest_sqlite
    with sqlite3.connect(path) as con:
        names = {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in _UNREAD}
        segment_of = {t: dict(con.execute(f"SELECT rowid, segment_id FROM {t}")) for t in _UNREAD}
        seq_of_segment = dict(con.execute("SELECT entry_id, seq FROM entries WHERE kind = 'telemetry_segment'"))
    con.close()
    values = [(t, v) for t in _UNREAD for v in stored_values(path, t)
              if names[t][v.column] not in _UNREAD[t] and (v.size or v.serial_type in _ZERO_SIZE_SWAPS)]
    assert {t for t, _ in values} == set(_UNREAD)
    honest_bytes = path.read_bytes()
    seen: Counter = Counter()

    by_table = {t: [v for u, v in values if u == t] for t in _UNREAD}

    @_examples(soak, 40, 1000)
    @given(table=st.sampled_from(sorted(by_table)), data=st.data())
    def run(table, data):
        value, at, xor, new_type = data.draw(byte_flips(by_table[table]))
        tampered = bytearray(honest_bytes)
        tampered[at] = tampered[at] ^ xor if xor is not None else new_type
        copy = tmp_path / "tampered.db"
        copy.write_bytes(tampered)
        out = run_verify(f"sqlite:///{copy}", (honest.n, honest.head), fast=False)
        assert_caught_at(out, seq_of_segment[segment_of[table][value.rowid]],
                         f"{table}.{names[table][value.column]} of row {value.rowid}, byte {at}")
        seen[table] += 1

    run()
    print_figures("sqlite_sample_bytes", seen)


# --- the installed command ------------------------------------------------------------------------------------

def test_installed_ipledger_verify_exits_1_and_names_the_entry(honest_sqlite, tmp_path):
    path, honest = honest_sqlite
    n, head = honest.n, honest.head
    copy = tmp_path / "t.db"
    shutil.copy(path, copy)
    eng = db_mod.make_engine(f"sqlite:///{copy}")
    with eng.begin() as conn:
        _drop_triggers(conn)
        conn.execute(text("DELETE FROM entries WHERE seq = 3"))
    eng.dispose()
    exe = Path(sys.executable).with_name("ipledger")
    res = subprocess.run([str(exe), "--db", str(copy), "verify", "--json", "--anchor", f"{n}:{head}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert json.loads(res.stdout)["problems"][0]["seq"] == 3
    assert "entry seq 3" in res.stderr
