"""Spool -> ledger: idempotent, at-least-once safe. A spool file is moved aside only after its entries commit."""

from __future__ import annotations

import dataclasses
import operator
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from sqlalchemy.engine import Engine

from . import spool
from .db import write_tx
from .entries import Entry, entry_from_record
from .store import append_in

# A step run once a shipment's entries are in the ledger (e.g. issuing the receipts of runs that ended); it
# returns the problems it met, one line each, which the ship report carries.
ShipHook = Callable[[Engine, list[Entry]], list[str]]
# Work between appending and the after-ship steps that adds entries of its own (the accounting database's
# record of the runs that ended: ledger.hooks.accounting); returns what it appended and a report.
Enricher = Callable[[Engine], "tuple[list[Entry], dict]"]


@dataclass
class ShipReport:
    files: int = 0
    records: int = 0
    appended: int = 0
    duplicates: int = 0
    torn: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    after_errors: list[str] = field(default_factory=list)   # what the after-ship steps could not do
    accounting: dict | None = None  # the enricher's report, when one ran

    def to_json(self) -> dict:
        out = {"files": self.files, "records": self.records, "appended": self.appended,
               "duplicates": self.duplicates, "torn": self.torn, "errors": self.errors,
               "after_errors": self.after_errors}
        if self.accounting is not None:
            out["accounting"] = self.accounting
        return out


# SQLite's page cache while shipping (negative: KiB), instead of its 2 MiB default: inserting into the
# entries table's indexes (random entry ids) touches pages all over them, and once they outgrow the cache
# every insert reads pages back from the OS. Per connection, allocated only as pages are used.
_SQLITE_CACHE_KIB = -262_144
PARALLEL_MIN_FILES = 1000   # below this, reading in the shipping process is quicker than starting a worker
_CHUNK_FILES = 250          # files a worker prepares per task
_AHEAD = 4                  # prepared chunks in flight at most (bounds memory)


@dataclass
class _Prepared:
    """One spool file read and turned into entries (what a worker process hands back; no raw records)."""

    read: spool.SpoolRead
    entries: list
    segments: list
    errors: list

    def __reduce__(self):  # noqa: ANN204
        # Crossing from a worker: each Entry as the plain tuple of its fields (pickling a slotted dataclass
        # costs ≈ 30 µs per entry both ways; a tuple of str/int a few), rebuilt by _unpickle_prepared.
        entries = self.entries
        if self.segments:  # segments refer to their Entry objects: keep those exact objects
            return (_Prepared, (self.read, entries, self.segments, self.errors))
        return (_unpickle_prepared, (self.read, [astuple_entry(e) for e in entries], self.errors))


astuple_entry = operator.attrgetter(*(f.name for f in dataclasses.fields(Entry)))  # Entry(*fields) rebuilds it


def _unpickle_prepared(read: spool.SpoolRead, fields: list, errors: list) -> _Prepared:
    return _Prepared(read, [Entry(*f) for f in fields], [], errors)


def _prepare_file(path: Path) -> _Prepared | None:
    try:
        r = spool.read(path)
    except FileNotFoundError:  # another shipper took it
        return None
    bad = list(r.errors)
    file_entries: list[Entry] = []
    file_segments: list[tuple[Entry, list]] = []
    for i, rec in enumerate(r.records):
        try:
            file_entries.append(entry_from_record(rec))
            if rec.get("samples") is not None:
                file_segments.append((file_entries[-1], _sample_rows(rec["samples"])))
        except (KeyError, ValueError, TypeError) as exc:
            bad.append(f"{path}: record {i + 1}: {exc}")
    light = spool.SpoolRead(path=r.path, records=[], torn=r.torn, errors=[])
    return _Prepared(light, file_entries, file_segments, bad)


def _prepare_chunk(paths: list[Path]) -> list[_Prepared | None]:
    return [_prepare_file(p) for p in paths]


def _prepared(files: list[Path]) -> Iterator[_Prepared | None]:
    """Every file prepared, in order. Many files: worker processes read and rebuild entries (the CPU-bound
    half of shipping: JSON decoding, canonical re-encoding, ids) while this process chains and inserts."""
    import multiprocessing  # here, not at the top: only a big shipment uses it
    import os
    import threading
    from concurrent.futures import ProcessPoolExecutor

    # The shipping process does about half the per-entry work of a worker (chain, insert), so on 2 cores two
    # workers plus the shipper keep both busy; one worker would leave a core idle while the shipper waits.
    cpus = os.cpu_count() or 1
    workers = min(cpus, 3) if cpus > 1 else 0
    if (len(files) < PARALLEL_MIN_FILES or workers < 1 or threading.active_count() != 1
            or "fork" not in multiprocessing.get_all_start_methods()):
        for p in files:
            yield _prepare_file(p)
        return
    chunks = [files[i:i + _CHUNK_FILES] for i in range(0, len(files), _CHUNK_FILES)]
    # fork: a single-threaded caller forks safely and in milliseconds; workers only read spool files
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=spool.forget_inherited_locks) as pool:
        pending: deque = deque()
        nxt = 0
        while nxt < len(chunks) or pending:
            while nxt < len(chunks) and len(pending) < _AHEAD:
                pending.append(pool.submit(_prepare_chunk, chunks[nxt]))
                nxt += 1
            yield from pending.popleft().result()


def ship(engine: Engine, spool_dir: str | Path, batch_files: int = 2000,
         progress: Callable[[int, int], None] | None = None, run_after: bool = True,
         batch_entries: int = 50_000, after: Sequence[ShipHook] = (), enrich: Enricher | None = None) -> ShipReport:
    """Ship every pending spool file; files whose records fail to decode are left in place and reported.

    ``after``: the steps run, in order, over the shipped entries once they are committed (skipped with
    ``run_after=False``); what they report goes into ``after_errors``.

    One transaction per batch (at most ``batch_files`` files or about ``batch_entries`` entries): large
    enough that the commit's fsync and the chain lock are paid rarely, small enough to keep memory flat.
    ``enrich`` runs after the spool's entries are in and before the after-ship work, which sees its entries.
    """
    report = ShipReport()
    with spool.shipping_lock(spool_dir):
        _ship_locked(engine, spool_dir, report, batch_files, progress, tuple(after) if run_after else (),
                     batch_entries, enrich)
    return report


def _ship_locked(engine: Engine, spool_dir: str | Path, report: ShipReport, batch_files: int,
                 progress: Callable[[int, int], None] | None, after: tuple[ShipHook, ...],
                 batch_entries: int, enrich: Enricher | None = None) -> None:
    files = spool.pending_files(spool_dir)
    shipped_entries: list[Entry] = []
    # Files whose entries the after-ship work (automatic receipts) still has to see are moved aside only after
    # it ran: a shipper killed in between finds them again, and the re-shipment (all duplicates) redoes it.
    after_pending: list[spool.SpoolRead] = []
    source = _prepared(files)
    pos = 0
    while pos < len(files):
        reads: list[spool.SpoolRead] = []
        entries: list[Entry] = []
        segments: list[tuple[Entry, list]] = []   # collector segments carry their sample rows beside the entry
        taken = 0
        while pos < len(files) and taken < batch_files and len(entries) < batch_entries:
            prep = next(source)
            pos += 1
            taken += 1
            if prep is None:
                continue
            if prep.errors:
                report.errors.extend(prep.errors)
                continue
            reads.append(prep.read)
            entries.extend(prep.entries)
            segments.extend(prep.segments)
            if prep.read.torn is not None:
                report.torn.append(str(prep.read.path))
        if reads:
            with write_tx(engine) as conn:
                if conn.dialect.name == "sqlite":
                    conn.exec_driver_sql(f"PRAGMA cache_size={_SQLITE_CACHE_KIB}")
                result = append_in(conn, entries)
                if segments:
                    _write_samples(conn, segments)
            report.files += len(reads)
            report.records += len(entries)
            report.appended += result.appended
            report.duplicates += len(entries) - result.appended
            if after:
                shipped_entries.extend(entries)
                after_pending.extend(reads)
            else:
                spool.mark_shipped_many(spool_dir, reads)
        if progress:
            progress(pos, len(files))
    source.close()
    if enrich is not None:
        added, report.accounting = enrich(engine)
        if after and added:
            shipped_entries.extend(added)
    if shipped_entries:
        for step in after:
            report.after_errors.extend(step(engine, shipped_entries))
    if after_pending:
        spool.mark_shipped_many(spool_dir, after_pending)


def _sample_rows(rows) -> list:  # noqa: ANN001
    """Check a segment record's embedded rows before anything is written (bad rows fail the file, not the batch)."""
    from .telemetry.model import SAMPLE_COLUMNS

    if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != len(SAMPLE_COLUMNS) for r in rows):
        raise ValueError("segment samples are not rows of the samples table")
    return rows


def _write_samples(conn, segments: list[tuple[Entry, list]]) -> None:  # noqa: ANN001
    """Insert the rows of collector segments (once per segment; the entry is already appended above)."""
    from .telemetry.model import Sample
    from .telemetry.store import write_segment_in

    for entry, rows in segments:
        write_segment_in(conn, [Sample(*r) for r in rows], entry)
