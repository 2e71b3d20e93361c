"""The ledger store: appending entries to the hash chain (idempotently, in bulk) and reading them back.

Every view (receipts, findings, exports) reads entries through :func:`iter_entries`; nothing updates or
deletes a row (the database refuses it anyway, see schema/versions/0001_entries.py).

What an append derives is written in its transaction by one listed sequence of append steps: the ledger's own
(:data:`DERIVED_WRITES`: Merkle nodes, receipt lines), then the caller's (``also``: shipping adds its sealed
samples and their device-hours, ledger/ingest/ship.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from hashlib import sha256
from typing import Callable, Iterable, Sequence, TYPE_CHECKING

from .lite import text

from . import merkle, receipt_lines
from .db import write_tx
from .entries import GENESIS_HASH, Entry, hash_fields
from .kinds import Kind
from .rows import ENTRY_COLUMNS, iter_entries  # noqa: F401 - callers read the chain back through the store

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

_ADVISORY_LOCK_KEY = 0x1B1ED6E5  # one writer at a time extends the chain (PostgreSQL)
_IN_CHUNK = 50_000


@dataclass(frozen=True)
class AppendResult:
    appended: int
    duplicates: int
    first_seq: int | None
    last_seq: int | None
    head_hash: str


@dataclass(frozen=True)
class Appended:
    """What one :func:`append_in` added, handed to each append step: the first new sequence number, each new
    entry's chain encoding (its Merkle leaf) in order, and the (seq, payload) of the issued receipts among them."""

    first_seq: int | None
    leaves: list[bytes]
    issued: list[tuple[int, str]]


# A write derived from an append, made in the append's transaction (so it commits or rolls back with it).
AppendStep = Callable[["Connection", Appended], None]


def merkle_nodes(conn: Connection, appended: Appended) -> None:
    """The Merkle tree's nodes over the new leaves (ledger/chain/merkle.py)."""
    if appended.leaves:
        merkle.on_append(conn, appended.first_seq, appended.leaves)  # type: ignore[arg-type]


def receipt_line_rows(conn: Connection, appended: Appended) -> None:
    """The flat lines of each issued receipt (ledger/chain/receipt_lines.py)."""
    if appended.leaves:
        receipt_lines.on_append(conn, appended.issued)


# The ledger's own derived writes, in order: every append makes them, whoever appends.
DERIVED_WRITES: tuple[AppendStep, ...] = (merkle_nodes, receipt_line_rows)


def head(conn: Connection) -> tuple[int, str]:
    """(last sequence number, its hash), or (0, genesis) for an empty ledger."""
    row = conn.execute(text("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")).first()
    return (0, GENESIS_HASH) if row is None else (int(row[0]), row[1])


def lock_chain(conn: Connection) -> None:
    """Hold the chain's write lock for the rest of the caller's write transaction (re-entrant within it)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_LOCK_KEY})
    # SQLite: write_tx() began with BEGIN IMMEDIATE, which already holds the write lock.


def _existing_ids(conn: Connection, ids: Sequence[str]) -> set[str]:
    """Which of these ids the ledger already holds: one round trip per 50,000 ids (a JSON array on SQLite, a
    text[] on PostgreSQL) instead of one per 500 bound parameters."""
    found: set[str] = set()
    pg = conn.dialect.name == "postgresql"
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = list(ids[i:i + _IN_CHUNK])
        if pg:
            rows = conn.exec_driver_sql("SELECT entry_id FROM entries WHERE entry_id = ANY(%(ids)s)", {"ids": chunk})
        else:
            rows = conn.exec_driver_sql(
                "SELECT entry_id FROM entries WHERE entry_id IN (SELECT value FROM json_each(?))",
                (json.dumps(chunk),))
        found.update(r[0] for r in rows)
    return found


def _row(seq: int, e: Entry, prev: str, h: str) -> tuple:
    return (seq, e.entry_id, e.kind, e.ts, e.ts_end, e.recorded_at, e.cluster, e.job_id, e.run, e.node,
            e.device, e.payload, e.source, e.source_version, prev, h)


def _copy_rows(conn: Connection, rows: list[tuple]) -> None:
    raw = conn.connection.driver_connection  # psycopg 3
    with raw.cursor() as cur:
        with cur.copy(f"COPY entries ({', '.join(ENTRY_COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def append_in(conn: Connection, entries: Iterable[Entry], also: Sequence[AppendStep] = ()) -> AppendResult:
    """Append within the caller's transaction: skip facts already recorded, chain the rest, bulk insert; then
    the append steps, :data:`DERIVED_WRITES` and the caller's ``also``, in that order (each runs even when
    nothing was new: the caller's may have work of their own, the ledger's then do nothing)."""
    lock_chain(conn)
    unique: dict[str, Entry] = {}
    for e in entries:
        if not e.entry_id:
            raise ValueError("entry without an entry_id; build entries with make_entry()")
        unique.setdefault(e.entry_id, e)
    ids = list(unique)
    existing = _existing_ids(conn, ids) if ids else set()
    seq, prev = head(conn)
    first = None
    rows = []
    leaves = []  # each entry's chain encoding is also its Merkle leaf (ledger/chain/merkle.py)
    issued = []  # issued receipts get their flat lines in this same transaction (receipt_line_rows)
    for entry_id in ids:
        if entry_id in existing:
            continue
        e = unique[entry_id]
        seq += 1
        encoded = hash_fields(seq, e, prev).encode("utf-8")
        h = sha256(encoded).hexdigest()
        leaves.append(encoded)
        rows.append(_row(seq, e, prev, h))
        if e.kind == Kind.RECEIPT_ISSUED:
            issued.append((seq, e.payload))
        prev = h
        first = seq if first is None else first
    if rows:
        if conn.dialect.name == "postgresql":
            _copy_rows(conn, rows)
        else:
            marks = ",".join("?" * len(ENTRY_COLUMNS))
            conn.exec_driver_sql(f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({marks})", rows)
    appended = Appended(first, leaves, issued)
    for step in (*DERIVED_WRITES, *also):
        step(conn, appended)
    return AppendResult(appended=len(rows), duplicates=len(existing),
                        first_seq=first, last_seq=seq if rows else None, head_hash=prev)


def append(engine: Engine, entries: Iterable[Entry]) -> AppendResult:
    """Append entries in one transaction (all or nothing)."""
    with write_tx(engine) as conn:
        return append_in(conn, entries)


def get_head(engine: Engine) -> tuple[int, str]:
    with engine.connect() as conn:
        return head(conn)


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM entries")).scalar_one())
