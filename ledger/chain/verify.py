"""Tamper evidence: walk the hash chain and name the first entry whose content or link does not match.

Pure over the rows it reads; errors are returned as values (:class:`ChainProblem`), not raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Iterable, Sequence, TYPE_CHECKING


from . import merkle
from .entries import (
    CHAIN_COLUMNS, GENESIS_HASH, SQLITE_CHAIN, SQLITE_IDENTITY, SQLITE_NO_REAL, ChainedEntry, Entry, chain_hash,
    compute_entry_id, row_encodings
)
from .store import iter_entries

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    entry_id: str
    reason: str

    def __str__(self) -> str:
        if not self.entry_id:   # an index or database problem: no single entry to name, or only its seq
            return f"entry seq {self.seq}: {self.reason}" if self.seq else self.reason
        return f"entry seq {self.seq} ({self.entry_id}): {self.reason}"


@dataclass(frozen=True)
class Note:
    """What a check could not establish, said beside its result (heads checked without a pinned key): never a
    failure. A check may return notes among its problems; :func:`verify` puts them in the report's notes."""

    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class VerifyReport:
    entries: int
    head_seq: int
    head_hash: str
    problems: tuple[ChainProblem, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()   # what could not be checked (e.g. --deep without amcheck), never a failure
    # The chain walk also recomputed every stored Merkle subtree from the entries and all matched (the fast
    # path's workers do, see verify_chain); the tree check then only checks the signed heads. Not a finding.
    tree_checked: bool = field(default=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"ok": self.ok, "entries": self.entries, "head_seq": self.head_seq, "head_hash": self.head_hash,
                "problems": [{"seq": p.seq, "entry_id": p.entry_id, "reason": p.reason} for p in self.problems],
                "notes": list(self.notes)}


def check_chain(rows: Iterable[ChainedEntry], anchors: Sequence[Anchor] = ()) -> VerifyReport:
    """Recompute every id, link and hash; stop at the first break (everything after it is unproven).

    Rows come in stored order (SQLite: the table's own row order, see :func:`_sqlite_table_rows`); the
    problem names the first *position* that is wrong: a missing entry's seq, not its successor's. An entry
    whose successor links to the entry before it was inserted, so it is the one named. ``anchors`` are
    (seq, hash) pairs recorded outside the database (an issued receipt, an earlier verify): only they can
    show that the newest entries were removed, or the chain rewritten from some point on.
    """
    expected_prev = GENESIS_HASH
    before_prev = None          # the hash two entries back: tells an inserted entry from an edited one
    expected_seq = 0
    n = 0
    wanted = {a.seq for a in anchors}
    hashes: dict[int, str] = {}
    for ce in rows:
        n += 1
        expected_seq += 1
        e = ce.entry
        named, problem = expected_seq, None
        try:
            if ce.seq != expected_seq:
                problem = (f"entry {expected_seq} is missing or out of place: found seq {ce.seq!r} "
                           f"({e.entry_id}) in its place")
            elif ce.prev_hash != expected_prev:
                if before_prev is not None and ce.prev_hash == before_prev:
                    named, problem = expected_seq - 1, (f"entry {expected_seq - 1} was inserted: entry "
                                                        f"{expected_seq} links to entry {expected_seq - 2}")
                else:
                    problem = "prev_hash does not link to the previous entry's hash"
            elif float in map(type, row := sample_row_values(ce)):
                col, value = next((c, v) for c, v in zip(CHAIN_COLUMNS, row) if type(v) is float)
                problem = (f"{col} holds a floating-point value ({value!r}); the ledger stores only text and "
                           f"integers (one canonical spelling each)")
            elif compute_entry_id(e) != e.entry_id:
                problem = "content does not match its entry_id"
            elif chain_hash(ce.seq, e, ce.prev_hash) != ce.hash:
                problem = "content does not match its hash"
        except (TypeError, ValueError, UnicodeError) as exc:  # a value of the wrong type cannot be hashed
            problem = f"entry cannot be encoded ({type(exc).__name__}: {exc})"
        if problem:
            return VerifyReport(entries=n, head_seq=named, head_hash=str(ce.hash),
                                problems=(ChainProblem(named, str(e.entry_id), problem),))
        if ce.seq in wanted:
            hashes[ce.seq] = ce.hash
        before_prev, expected_prev = expected_prev, ce.hash
    report = VerifyReport(entries=n, head_seq=expected_seq, head_hash=expected_prev)
    return check_anchors(report, anchors, hashes)


# A stored row's values in CHAIN_COLUMNS order: a REAL read from SQLite is a float here (see SQLITE_NO_REAL).
sample_row_values = attrgetter("seq", *(f"entry.{c}" for c in CHAIN_COLUMNS[1:-1]), "prev_hash")


@dataclass(frozen=True)
class Anchor:
    """A (seq, hash) the ledger must still hold, kept outside it: ``SEQ:HASH`` on the command line."""

    seq: int
    hash: str

    @classmethod
    def parse(cls, text: str) -> "Anchor":
        seq, sep, h = text.partition(":")
        h = h.strip().lower()
        if not sep or not seq.strip().isdigit() or int(seq) < 1 or len(h) != 64 or h.strip("0123456789abcdef"):
            raise ValueError(f"anchor {text!r}: expected SEQ:HASH (a sequence number and a 64-hex hash)")
        return cls(int(seq), h)


def check_anchors(report: VerifyReport, anchors: Sequence[Anchor], hashes: dict[int, str]) -> VerifyReport:
    """Compare a clean chain with anchors; ``hashes`` maps seq to hash for the anchored entries present."""
    for a in sorted(anchors, key=lambda a: a.seq):
        if a.seq > report.head_seq:
            missing = report.head_seq + 1
            problem = ChainProblem(missing, "", f"entry {missing} is missing: the ledger ends at seq "
                                                f"{report.head_seq} but anchor {a.seq}:{a.hash} is recorded")
        elif hashes.get(a.seq) != a.hash:
            problem = ChainProblem(a.seq, "", f"entry {a.seq} has hash {hashes.get(a.seq)} but the anchor "
                                              f"records {a.hash}: the chain was rewritten at or before it")
        else:
            continue
        return VerifyReport(report.entries, problem.seq, report.head_hash, (problem,))
    return report


# A check beyond the chain (telemetry evidence, issued receipts): the caller passes the ones it wants, bound
# to its site (ledger.receipts.auto.verify_checks), so verify itself depends on nothing above it. Besides its
# problems a check may return Notes (what it could not establish).
ExtraCheck = Callable[["Engine", VerifyReport], "list[ChainProblem | Note]"]


def verify(engine: Engine, chain_only: bool = False, workers: int | None = None,
           anchors: Sequence[Anchor] = (), deep: bool = False, checks: Sequence[ExtraCheck] = (),
           begin: Callable[[Engine], Callable[[], None]] | None = None) -> VerifyReport:
    """The chain (and anchors), then ``checks``; problems in sequence order, the first bad first.

    ``deep`` adds the database's own consistency check of tables against their indexes (SQLite's
    ``PRAGMA integrity_check``, PostgreSQL's amcheck): the chain is read from the table's rows, but receipts
    find entries through indexes, so an index edited to hide a row changes a receipt without touching the
    chain. Run first, so an index problem is reported even when the chain check stops at a bad entry.

    ``begin(engine)``, where the checks are to run, is called just before the chain walk: it starts work that the
    checks collect later in other processes (the receipt replays), so that it runs while the chain is walked. It
    returns what stops that work, called when the chain fails and the checks do not run, or when anything raises
    (a stop after the checks have collected the work does nothing). The report is the same."""
    index_problems, notes = deep_check(engine) if deep else ([], [])
    stop = begin(engine) if begin is not None and checks and not chain_only else None
    problems: list[ChainProblem] = []
    try:
        report = verify_chain(engine, workers=workers, anchors=anchors, tree=bool(checks) and not chain_only)
        if stop is not None and not report.ok:
            stop()
        problems.extend(report.problems)
        if report.ok and not chain_only:
            for check in checks:
                for found in check(engine, report):
                    (notes if isinstance(found, Note) else problems).append(found)  # type: ignore[arg-type]
    except BaseException:
        if stop is not None:
            stop()
        raise
    problems.extend(index_problems)
    if problems or notes:
        return VerifyReport(report.entries, report.head_seq, report.head_hash,
                            tuple(sorted(problems, key=lambda p: p.seq)), tuple(map(str, notes)),
                            report.tree_checked)
    return report


LEDGER_TABLES = ("entries", "sample_blocks", "samples")


def deep_check(engine: Engine) -> tuple[list[ChainProblem], list[str]]:
    """Index-against-table consistency: (problems, notes on what could not be checked)."""
    import re

    from .lite import text

    problems: list[ChainProblem] = []
    notes: list[str] = []
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            for (line,) in conn.exec_driver_sql("PRAGMA integrity_check"):
                if line == "ok":
                    continue
                m = re.search(r"\brow (\d+) missing from index|\browid (\d+)", line)
                seq = int(m.group(1) or m.group(2)) if m else 0
                problems.append(ChainProblem(seq, "", f"database integrity: {line}"))
            for table in LEDGER_TABLES:
                for row in conn.exec_driver_sql(f"PRAGMA index_list({table})"):
                    if row[4]:  # partial: an index that leaves rows out on purpose hides them from readers
                        problems.append(ChainProblem(0, "", f"database integrity: index {row[1]} on {table} is "
                                                            f"partial; ipledger creates none"))
        elif conn.dialect.name == "postgresql":
            try:
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS amcheck"))
                conn.commit()
            except Exception as exc:  # noqa: BLE001 - no privilege or no contrib package: say so, do not fail
                conn.rollback()
                notes.append(f"--deep: amcheck unavailable ({(str(exc).splitlines() or ['?'])[0][:160]}); "
                             f"indexes not checked")
                return problems, notes
            rows = conn.execute(text(
                "SELECT c.relname, i.indexrelid, i.indpred IS NOT NULL FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
                "JOIN pg_am a ON a.oid = c.relam "
                "WHERE t.relname = ANY(:tables) AND a.amname = 'btree' AND t.relnamespace = "
                "(SELECT oid FROM pg_namespace WHERE nspname = current_schema())"),
                {"tables": list(LEDGER_TABLES)}).all()
            for name, oid, partial in rows:
                if partial:
                    problems.append(ChainProblem(0, "", f"database integrity: index {name} is partial; "
                                                        f"ipledger creates none"))
                    continue
                try:
                    conn.execute(text("SELECT bt_index_check(:oid, true)"), {"oid": oid})
                except Exception as exc:  # noqa: BLE001 - amcheck reports corruption as an error
                    conn.rollback()
                    problems.append(ChainProblem(0, "", f"database integrity: index {name}: "
                                                        f"{(str(exc).splitlines() or ['?'])[0][:200]}"))
        else:
            notes.append(f"--deep: no index check for {conn.dialect.name}")
    return problems, notes


# --- the fast path -------------------------------------------------------------------------------------------
# check_chain() above is the reference: one ChainedEntry per row, every field re-encoded in Python. On a big
# ledger that costs ~20x the hashing itself. The fast path checks the same things (sequence without gaps,
# links, ids, hashes) over raw driver rows, in seq ranges verified by parallel worker processes whose ends
# are stitched together. On SQLite the canonical encodings are built by SQLite's json_array()
# (ledger.chain.entries.SQLITE_CHAIN, beside the reference encoding), which writes the same bytes as
# row_encodings for the column types the ledger holds; should it ever differ, or should anything at all not
# match, the whole chain is re-checked with the reference path, so the report (and the first problem it
# names) is always exactly the reference's. A fast-path "ok" can only come from sha256 matches over the
# encodings, so a divergent encoding can cause a slow re-check but never a false "ok".
#
# The same walk checks the Merkle tree (ledger/chain/merkle.py), whose leaves are those chain encodings: each
# worker hashes its leaves and checks the stored subtrees inside its range, the parent the few across ranges.
# A tree that does not match only leaves ``tree_checked`` false: the reference tree check then names the
# problem (heads.tree_problems).

FAST_MIN_ENTRIES = 2_000          # below this the reference path is as quick and simpler
PARALLEL_MIN_ENTRIES = 400_000    # below this one process beats starting workers
_FETCH = 2_000                    # rows per round trip (PostgreSQL's server-side cursor)

# The encodings come back as BLOBs: the UTF-8 bytes SQLite built, hashed as they are (as TEXT they would be
# decoded into str and encoded back, two copies of ~700 bytes per encoding per row for nothing).
# A row holding a REAL is left out (SQLITE_NO_REAL): the range then lacks a seq and fails, and the reference
# names the row.
_SQLITE_SQL = (f"SELECT seq, entry_id, prev_hash, hash, {SQLITE_IDENTITY}, {SQLITE_CHAIN} "
               f"FROM entries WHERE rowid BETWEEN ? AND ? AND {SQLITE_NO_REAL} ORDER BY rowid")
_PG_SQL = (f"SELECT {', '.join(CHAIN_COLUMNS)}, hash FROM entries WHERE seq BETWEEN %s AND %s ORDER BY seq")
_NODES_SQL = f"SELECT idx, hash FROM {merkle.TABLE} WHERE level = {{p}} AND idx >= {{p}} AND idx < {{p}} ORDER BY idx"


@dataclass(frozen=True)
class RangeResult:
    """One worker's verdict on seq lo..hi: clean (then its first prev_hash and last hash, for stitching);
    ``tree``: the stored subtrees inside the range match its entries (None: not asked, or not reached)."""

    lo: int
    hi: int
    ok: bool
    first_prev: str = ""
    last_hash: str = ""
    tree: bool | None = None


def _check_range(lo: int, hi: int, rows, subtrees: list | None = None) -> RangeResult:  # noqa: ANN001
    """The walk both backends share, over (seq, entry_id, prev_hash, hash, identity bytes, chain bytes) rows.

    ``subtrees``, when given, receives the hash of each complete 2^STORED_LEVEL-leaf subtree of the range (it
    starts at a multiple of 2^STORED_LEVEL): each chain encoding is also its entry's Merkle leaf."""
    from hashlib import sha256

    leaf0, width, group = sha256(b"\x00"), 1 << merkle.STORED_LEVEL, []
    expected, first_prev, prev = lo, None, None
    for seq, eid, ph, h, ident, chain in rows:
        if seq != expected or (prev is not None and ph != prev):
            return RangeResult(lo, hi, False)
        if "e" + sha256(ident).hexdigest()[:39] != eid or sha256(chain).hexdigest() != h:
            return RangeResult(lo, hi, False)
        if subtrees is not None:
            leaf = leaf0.copy()
            leaf.update(chain)
            group.append(leaf.digest())
            if len(group) == width:
                subtrees.append(merkle.perfect_hash(group))
                group = []
        if first_prev is None:
            first_prev = ph
        prev = h
        expected += 1
    return RangeResult(lo, hi, expected == hi + 1, first_prev or "", prev or "")


def _with_tree(result: RangeResult, subtrees: list | None, stored) -> RangeResult:  # noqa: ANN001
    """The range's verdict on the stored subtrees inside it (asked for, and the chain in it is clean)."""
    from dataclasses import replace

    if subtrees is None or not result.ok:
        return result
    try:
        return replace(result, tree=merkle.span_subtrees_ok(result.lo - 1, subtrees, stored))
    except Exception:  # noqa: BLE001 - no tree table, a value of the wrong type...: the reference names it
        return replace(result, tree=False)


def _verify_range_sqlite(path: str, lo: int, hi: int, tree: bool = False) -> RangeResult:
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        subtrees: list | None = [] if tree else None
        # Row by row from the cursor: each row is hashed while its bytes are still in the CPU's caches
        # (batches of 20,000 rows cost ≈ 1.3 µs a row more, 2,000 ≈ 0.8 µs).
        result = _check_range(lo, hi, con.execute(_SQLITE_SQL, (lo, hi)), subtrees)
        return _with_tree(result, subtrees, lambda lv, a, b: con.execute(_NODES_SQL.format(p="?"), (lv, a, b)))
    finally:
        con.close()


def _verify_range_pg(conninfo: str, lo: int, hi: int, tree: bool = False) -> RangeResult:
    import psycopg

    def rows(cur):  # noqa: ANN001, ANN202 - encodings built here by the one encoding function
        for row in cur:
            ident, chain = row_encodings(row)
            yield row[0], row[1], row[-2], row[-1], ident.encode("utf-8"), chain.encode("utf-8")

    with psycopg.connect(conninfo) as conn:
        subtrees: list | None = [] if tree else None
        with conn.cursor(name="ipledger_verify") as cur:  # server-side: memory stays flat
            cur.itersize = _FETCH
            cur.execute(_PG_SQL, (lo, hi))
            result = _check_range(lo, hi, rows(cur), subtrees)
        return _with_tree(result, subtrees, lambda lv, a, b: conn.execute(_NODES_SQL.format(p="%s"), (lv, a, b)))


def _range_job(args: tuple) -> RangeResult:
    kind, target, lo, hi, tree = args
    try:
        return (_verify_range_sqlite if kind == "sqlite" else _verify_range_pg)(target, lo, hi, tree)
    except Exception:  # noqa: BLE001 - undecodable text, a BLOB where text belongs...: the reference path names it
        return RangeResult(lo, hi, False)


def _fast_target(engine: Engine) -> tuple[str, str] | None:
    url = engine.url
    if url.get_backend_name() == "sqlite":
        if not url.database or url.database == ":memory:" or url.database.startswith("file:"):
            return None
        return "sqlite", url.database
    if url.get_backend_name() == "postgresql" and url.get_driver_name() == "psycopg":
        return "pg", url.set(drivername="postgresql").render_as_string(hide_password=False)
    return None


def verify_chain(engine: Engine, workers: int | None = None, anchors: Sequence[Anchor] = (),
                 tree: bool = False) -> VerifyReport:
    """The chain check of :func:`verify`: the fast path when it applies, the reference path otherwise.
    ``tree``: the fast path also checks the stored Merkle subtrees (``tree_checked`` in the report)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    from ..base.processes import worker_start_method
    from .lite import text

    target = _fast_target(engine)
    if target is not None:
        with engine.connect() as conn:
            # SQLite: the table's own rows (rowid == seq in every honest ledger), not the seq index, which a
            # direct edit of the file can leave disagreeing with the rows.
            lo, hi = conn.execute(text("SELECT MIN(rowid), MAX(rowid) FROM entries" if target[0] == "sqlite"
                                       else "SELECT MIN(seq), MAX(seq) FROM entries")).one()
        if lo == 1 and hi is not None and hi >= FAST_MIN_ENTRIES:
            n = int(hi)
            if workers is None:
                workers = min(os.cpu_count() or 1, 8) if n >= PARALLEL_MIN_ENTRIES else 1
            workers = max(1, min(workers, n // 1000 or 1))
            # Ranges start at a multiple of a stored subtree's width, so each worker holds whole subtrees.
            step = merkle.STORED_LEVEL
            bounds = [1 + (n * i // workers >> step << step) for i in range(workers)] + [n + 1]
            jobs = [(target[0], target[1], bounds[i], bounds[i + 1] - 1, tree) for i in range(workers)]
            if workers == 1:
                results = [_range_job(jobs[0])]
            elif worker_start_method() == "fork":
                # Worker processes by fork: a single-threaded caller (the CLI) forks safely, and fork starts
                # in milliseconds without re-running the caller's __main__ (spawn would). Workers open their
                # own connections and never touch the parent's pooled ones.
                with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                    results = list(pool.map(_range_job, jobs))
            else:
                # A threaded caller must not fork; threads still overlap the driver's work (SQLite and
                # psycopg release the GIL while the database produces rows).
                with ThreadPoolExecutor(workers) as tpool:
                    results = list(tpool.map(_range_job, jobs))
            ok = all(r.ok for r in results) and results[0].first_prev == GENESIS_HASH and all(
                results[i].first_prev == results[i - 1].last_hash for i in range(1, len(results)))
            if ok:
                tree_checked = False
                if tree and all(r.tree for r in results):
                    with engine.connect() as conn:
                        tree_checked = merkle.joins_ok(conn, n, [b - 1 for b in bounds[:-1]])
                report = VerifyReport(entries=n, head_seq=n, head_hash=results[-1].last_hash,
                                      tree_checked=tree_checked)
                return check_anchors(report, anchors, _hashes_at(engine, [a.seq for a in anchors]))
    rows = _sqlite_table_rows(engine) if engine.dialect.name == "sqlite" else iter_entries(engine)
    return check_chain(rows, anchors)


def _hashes_at(engine: Engine, seqs: Sequence[int]) -> dict[int, str]:
    from .lite import text

    if not seqs:
        return {}
    key = "rowid" if engine.dialect.name == "sqlite" else "seq"
    with engine.connect() as conn:
        return {int(s): h for s, h in conn.execute(
            text(f"SELECT seq, hash FROM entries WHERE {key} IN ({','.join(str(int(s)) for s in seqs)})"))}


def _sqlite_table_rows(engine: Engine, batch: int = 10_000) -> Iterable[ChainedEntry]:
    """Every row of the SQLite entries table in the table's own order (rowid), values as the row holds them.

    Not through the seq index: SQLite reads indexed columns from the index, so an edit of the file that
    changes a row's seq but not the index would be invisible to ``ORDER BY seq``. Text that is not UTF-8 is
    decoded with replacement characters, so it cannot hash as the original did and is named, not raised.
    """
    from .store import ENTRY_COLUMNS

    raw = engine.raw_connection()
    try:
        dbapi = raw.driver_connection
        dbapi.text_factory = lambda b: b.decode("utf-8", "replace")
        sql = f"SELECT rowid, {', '.join(ENTRY_COLUMNS)} FROM entries WHERE rowid > ? ORDER BY rowid LIMIT ?"
        last = 0
        while True:
            rows = dbapi.execute(sql, (last, batch)).fetchall()
            for rowid, seq, eid, kind, ts, ts_end, rec, cluster, job, run, node, device, payload, source, sv, \
                    ph, h in rows:
                e = Entry(kind=kind, ts=ts, payload=payload, ts_end=ts_end, recorded_at=rec, cluster=cluster,
                          job_id=job, run=run, node=node, device=device, source=source, source_version=sv,
                          entry_id=eid)
                yield ChainedEntry(seq=seq, entry=e, prev_hash=ph, hash=h)
            if len(rows) < batch:
                return
            last = rows[-1][0]
    finally:
        dbapi.text_factory = str
        raw.close()
