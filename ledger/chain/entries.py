"""Ledger entries: the immutable facts ipledger records, their identity and their place in the hash chain.

An :class:`Entry` is what a hook, collector or importer observed; it has a deterministic ``entry_id`` so that
the same fact recorded twice is one entry. A :class:`ChainedEntry` is an entry once the ledger has given it
a sequence number and linked it into the hash chain. Standard library only. The hooks build no entries: they
write spool records (:mod:`ledger.capture.hooks.records`) in the same canonical encoding, and the shipper
rebuilds each as an entry (:func:`entry_from_record`, which recomputes its id).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from operator import attrgetter, itemgetter
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (strings here): typing stays off the hook's import path
    from typing import Any, Mapping

from .canonical import (  # noqa: F401
    ID_COLUMNS, ID_DOMAIN, canonical_json, entry_fields, entry_id, format_ts, identity_encoding, sha256
)
from .kinds import Kind

HASH_DOMAIN = "ipledger-entry-hash-v1"
GENESIS_HASH = "0" * 64


ALL_KINDS = frozenset(v for k, v in vars(Kind).items() if k.isupper())


@dataclass(frozen=True, slots=True)
class Entry:
    """One observed fact, before it has a place in the chain.

    ``ts`` is the instant the fact describes (an interval's start), ``ts_end`` an interval's end, and
    ``recorded_at`` when ipledger first wrote it down (to the spool, usually).
    ``payload`` is kept as canonical JSON text so the bytes hashed are the bytes stored.
    """

    kind: str
    ts: str
    payload: str = "{}"
    ts_end: str | None = None
    recorded_at: str | None = None
    cluster: str | None = None
    job_id: str | None = None
    run: int | None = None
    node: str | None = None
    device: str | None = None
    source: str = "ipledger"
    source_version: str = ""
    entry_id: str = ""

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.payload)

    def to_record(self) -> dict[str, Any]:
        """The spool's JSON-lines form (what dataclasses.asdict gives; every field is an immutable scalar)."""
        return {name: getattr(self, name) for name in _ENTRY_FIELDS}


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(Entry))


# The two encodings, each defined once, by column name: a stored row (ledger.chain.store.ENTRY_COLUMNS, whose first
# fifteen columns are CHAIN_COLUMNS in this order), an Entry and SQLite's json_array() all read these lists.
# Identity: everything that says *what* was observed, nothing about *when it was written*.
# Chain: the row as stored, up to and including its link to the previous entry (docs/ledger.md).
CHAIN_COLUMNS = ("seq", "entry_id", "kind", "ts", "ts_end", "recorded_at", "cluster", "job_id", "run", "node",
                 "device", "payload", "source", "source_version", "prev_hash")

_id_of_fields = itemgetter(*(_ENTRY_FIELDS.index(c) for c in ID_COLUMNS))
_id_of_row = itemgetter(*(CHAIN_COLUMNS.index(c) for c in ID_COLUMNS))
_chain_of_entry = attrgetter(*CHAIN_COLUMNS[1:-1])


def compute_entry_id(e: Entry) -> str:
    """Identity of a fact: everything that says *what* was observed, nothing about *when it was written*."""
    return entry_id_of_fields(tuple(getattr(e, name) for name in _ENTRY_FIELDS[:-1]))


def entry_id_of_fields(f: tuple) -> str:
    """The entry id from Entry's positional fields (all but entry_id), before the Entry exists."""
    return entry_id(*_id_of_fields(f))


def chain_encoding(row: tuple) -> str:
    """The chain encoding of a stored row, its columns in CHAIN_COLUMNS order (more may follow)."""
    return canonical_json([HASH_DOMAIN, *row[:len(CHAIN_COLUMNS)]])


def row_encodings(row: tuple) -> tuple[str, str]:
    """(identity, chain) encodings of a stored row, its columns in CHAIN_COLUMNS order (more may follow)."""
    return identity_encoding(_id_of_row(row)), chain_encoding(row)


def _sqlite_json_array(domain: str, columns: tuple[str, ...]) -> str:
    return f"CAST(json_array('{domain}', {', '.join(columns)}) AS BLOB)"


# The same two encodings built by SQLite from a row of the entries table, as UTF-8 BLOBs: json_array() writes
# canonical_json's bytes for the column types the ledger holds (text, integers, NULL; tests/
# test_bench_fastpaths.py holds them byte-identical to row_encodings on hostile text). A speed trick for the
# readers that walk the whole chain (verify); anything that must be right without a check uses row_encodings.
SQLITE_IDENTITY = _sqlite_json_array(ID_DOMAIN, ID_COLUMNS)
SQLITE_CHAIN = _sqlite_json_array(HASH_DOMAIN, CHAIN_COLUMNS)

# A row whose encodings above are canonical_json's: no REAL in any column. REAL is the one storage class
# json_array spells its own way (1.0e+20 where Python writes 1e+20, 15 significant digits where Python
# round-trips), so a REAL forged into a column with hashes over SQLite's spelling would match here and not in
# row_encodings; BLOBs make json_array raise. seq and run have integer affinity (UPDATE can store a REAL there);
# in the text columns only an edit of the file can, and there min(...) >= '' holds only if all are text (numbers
# sort before text). entry_id, prev_hash and hash are compared as text by the reader, so they need no test.
_TEXT_COLUMNS = ("kind", "ts", "payload", "source", "source_version")
_NULLABLE_TEXT_COLUMNS = ("ts_end", "recorded_at", "cluster", "job_id", "node", "device")
_ALL_TEXT = ", ".join([*_TEXT_COLUMNS, *(f"ifnull({c}, '')" for c in _NULLABLE_TEXT_COLUMNS)])
SQLITE_NO_REAL = f"typeof(seq) = 'integer' AND typeof(run) <> 'real' AND min({_ALL_TEXT}) >= ''"


def make_entry(
    kind: str,
    ts: Any,
    payload: Mapping[str, Any] | None = None,
    *,
    ts_end: Any = None,
    recorded_at: Any = None,
    cluster: str | None = None,
    job_id: str | int | None = None,
    run: int | None = None,
    node: str | None = None,
    device: str | None = None,
    source: str = "ipledger",
    source_version: str = "",
) -> Entry:
    """Build an entry with canonical timestamps and payload and its deterministic id."""
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    return Entry(*entry_fields(kind, ts, payload, ts_end, recorded_at, cluster, job_id, run, node, device, source,
                               source_version))


def entry_from_record(rec: Mapping[str, Any]) -> Entry:
    """Rebuild an entry from its spool record; the id is recomputed, so a tampered record cannot pass as another."""
    kind = rec["kind"]
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    payload = rec.get("payload", "{}")
    payload = canonical_json(json.loads(payload) if isinstance(payload, str) else payload)
    get = rec.get
    job_id = get("job_id")
    run = get("run")
    fields = (kind, format_ts(rec["ts"]), payload, format_ts(get("ts_end")), format_ts(get("recorded_at")),
              get("cluster"), None if job_id is None else str(job_id), None if run is None else int(run),
              get("node"), get("device"), get("source") or "ipledger", get("source_version") or "")
    return Entry(*fields, entry_id_of_fields(fields))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ChainedEntry:
    """An entry as the ledger holds it: with its sequence number and its links in the hash chain."""

    seq: int
    entry: Entry
    prev_hash: str
    hash: str

    def __getattr__(self, name: str) -> Any:  # convenient read-through to the entry's fields
        return getattr(self.entry, name)


def hash_fields(seq: int, e: Entry, prev_hash: str) -> str:
    """The canonical encoding the chain hashes (docs/ledger.md, "Canonical encoding")."""
    # chain_encoding's list built directly: this runs for every entry shipped, and a tuple in between costs ≈ 10 %
    return canonical_json([HASH_DOMAIN, seq, *_chain_of_entry(e), prev_hash])


def chain_hash(seq: int, e: Entry, prev_hash: str) -> str:
    return sha256(hash_fields(seq, e, prev_hash).encode("utf-8")).hexdigest()
