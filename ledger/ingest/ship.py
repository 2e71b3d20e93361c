"""Spool -> ledger: idempotent, at-least-once safe. A spool file is moved aside only after its entries commit."""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from sqlalchemy.engine import Engine

from . import intake
from ..capture import spool
from ..chain.db import write_tx
from ..chain.entries import Entry, Kind
from ..capture.sources import observed
from ..chain.store import append_in

# A step run once a shipment's entries are in the ledger (e.g. issuing the receipts of runs that ended); it
# returns the problems it met, one line each, which the ship report carries.
ShipHook = Callable[[Engine, list[Entry]], list[str]]
# Work between appending and the after-ship steps that adds entries of its own (the accounting database's
# record of the runs that ended: ledger.ingest.sacct); returns what it appended and a report.
Enricher = Callable[[Engine], "tuple[list[Entry], dict]"]


# The kinds the after-ship steps are handed (the automatic receipts look for runs that ended); the rest of a
# shipment is not kept in memory for them.
AFTER_SHIP_KINDS = frozenset({Kind.ALLOCATION_ENDED})


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
    # "file:line: reason" per refused line and "file: reason" per file refused unread: the first REPORT_MAX
    # of each; the totals count all of them, however many a hostile spool holds
    refused: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    refused_total: int = 0
    quarantined_total: int = 0

    def to_json(self) -> dict:
        out = {"files": self.files, "records": self.records, "appended": self.appended,
               "duplicates": self.duplicates, "torn": self.torn, "errors": self.errors,
               "after_errors": self.after_errors,
               "refused": self.refused, "quarantined": self.quarantined, "refused_total": self.refused_total,
               "quarantined_total": self.quarantined_total}
        if self.accounting is not None:
            out["accounting"] = self.accounting
        return out

    def note_refused(self, lines: list[str], file_reason: str | None) -> None:
        """Count refusals; keep the first REPORT_MAX of each in the report (its memory stays bounded)."""
        self.refused_total += len(lines)
        self.refused.extend(lines[:max(0, REPORT_MAX - len(self.refused))])
        if file_reason is not None:
            self.quarantined_total += 1
            if len(self.quarantined) < REPORT_MAX:
                self.quarantined.append(file_reason)


REPORT_MAX = 1000


# SQLite's page cache while shipping (negative: KiB), instead of its 2 MiB default: inserting into the
# entries table's indexes (random entry ids) touches pages all over them, and once they outgrow the cache
# every insert reads pages back from the OS. Per connection, allocated only as pages are used.
SQLITE_CACHE_KIB = -262_144
# Sample rows of collector segments per transaction: a fleet's hour is 10^6 of them, and a batch's columns,
# blocks and device-hours are held at once; smaller batches also let the worker processes prepare the next
# batch while this one is written (they run at most _AHEAD chunks ahead).
BATCH_SAMPLES = 200_000


@dataclass(frozen=True)
class Batches:
    """How much one shipping transaction takes at most: spool ``files``, about ``entries`` entries, about
    ``samples`` sample rows of collector segments (0: no sample bound). Large enough that the commit's fsync and
    the chain lock are paid rarely, small enough to keep memory flat."""
    files: int = 2000
    entries: int = 50_000
    samples: int = BATCH_SAMPLES
PARALLEL_MIN_FILES = 1000   # below this, reading in the shipping process is quicker than starting a worker
_CHUNK_FILES = 250          # files a worker prepares per task
_AHEAD = 4                  # prepared chunks in flight at most (bounds memory)


@dataclass
class _Prepared:
    """One spool file read and turned into entries (what a worker process hands back; no raw records)."""

    read: spool.SpoolRead
    entries: list
    segments: list             # positions in ``entries`` of the collector segments, whose rows are in ``packed``
    errors: list               # "file:line: reason" of refused lines (the file still ships)
    quarantine: str | None = None   # the reason the whole file is refused unread
    packed: object = None      # telemetry.blocks.Packed: the segments' rows as numpy columns, one span each

    def __reduce__(self):  # noqa: ANN204
        # Crossing from a worker: each Entry as the plain tuple of its fields (pickling a slotted dataclass
        # costs ≈ 30 µs per entry both ways; a tuple of str/int a few), rebuilt by _unpickle_prepared; sample
        # rows as numpy columns (a segment's 60 rows as float objects cost ≈ 1 µs each way per value).
        if self.quarantine:
            return (_Prepared, (self.read, self.entries, self.segments, self.errors, self.quarantine, self.packed))
        return (_unpickle_prepared, (self.read, [astuple_entry(e) for e in self.entries], self.errors,
                                     self.segments, self.packed))


astuple_entry = operator.attrgetter(*(f.name for f in dataclasses.fields(Entry)))  # Entry(*fields) rebuilds it


def _unpickle_prepared(read: spool.SpoolRead, fields: list, errors: list, segments: list = (),  # noqa: B006
                       packed: object = None) -> _Prepared:
    return _Prepared(read, [Entry(*f) for f in fields], list(segments), errors, packed=packed)


def _prepare_file(path: Path) -> _Prepared | None:
    """One spool file read and checked record by record (:mod:`ledger.ingest.intake`): what passes becomes entries,
    each refusal an ``evidence_refused`` entry (and, where it names a run and a time, an unknown interval on
    that run), a file that is not a writer's plain file is refused unread. Never raises for bad content."""
    try:
        r = spool.read(path)
    except FileNotFoundError:  # another shipper took it
        return None
    except spool.UnsafeFile as exc:
        light = spool.SpoolRead(path=path, records=[], torn=None, errors=[])
        return _Prepared(light, refusal_entries(path, None, str(exc), None, _mtime(path)), [], [], str(exc))
    import time

    now = time.time()
    refused = list(r.refused)
    file_entries: list[Entry] = []
    file_segments: list[int] = []
    file_rows: list[list] = []
    for line, rec in zip(r.lines, r.records):
        try:
            entry, rows = intake.check_record(rec, now)
        except intake.Refused as exc:
            refused.append((line, str(exc), _escaped(rec)))
            file_entries.extend(refusal_entries(path, line, str(exc), rec, _mtime(path), now))
            continue
        if rows is not None:
            file_segments.append(len(file_entries))
            file_rows.append(rows)
        file_entries.append(entry)
        if entry.kind == Kind.TOOL_OUTPUT:  # a hook's raw tool output: what it means, beside it
            file_entries.extend(observed.derive(entry))
    for line, reason, _text in r.refused:  # lines that were not even JSON
        file_entries.extend(refusal_entries(path, line, reason, None, _mtime(path)))
    light = spool.SpoolRead(path=r.path, records=[], torn=r.torn, errors=[], refused=refused)
    packed = None
    if file_rows:
        from ..telemetry.blocks import pack

        packed = pack(file_rows)
    return _Prepared(light, file_entries, file_segments, [f"{path}:{n}: {why}" for n, why, _ in refused],
                     packed=packed)


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _escaped(rec: object) -> str:
    import json

    return json.dumps(rec, ensure_ascii=True, sort_keys=True, default=repr)[:spool.MAX_QUARANTINED_LINE]


SHIP_SOURCE = "ipledger.ship"


def refusal_entries(path: Path, line: int | None, reason: str, rec: object, mtime: float,
                    now: float | None = None) -> list[Entry]:
    """The entries that record a refusal: ``evidence_refused`` (what, where, why), keyed to the run the record
    names where those fields are themselves sound; for a refused observation that names a run and a sane
    time, also an ``unknown_interval`` on that run with cause ``evidence_refused`` (a receipt shows the
    refused evidence as unknown, with the reason, instead of silently lacking it)."""
    from ..chain.canonical import format_ts, ts_to_epoch
    from ..chain.entries import make_entry

    rec = rec if isinstance(rec, dict) else {}
    key = intake.sound_key(rec)
    when = intake.sound_time(rec.get("ts"), now) or intake.sound_time(rec.get("recorded_at"), now)
    if when is None:
        when = mtime if intake.EARLIEST <= mtime < intake.LATEST else intake.EARLIEST
    claimed = rec.get("kind")
    payload = {"file": path.name, "line": line, "reason": reason,
               "claimed_kind": claimed[:64] if isinstance(claimed, str) else None}
    refusal = make_entry(Kind.EVIDENCE_REFUSED, when, payload, source=SHIP_SOURCE, **key)
    out = [refusal]
    end = intake.sound_time(rec.get("ts_end"), now)
    if claimed in intake.SPOOL_KINDS and key.get("job_id") is not None and intake.sound_time(rec.get("ts"), now):
        gap = {"cause": "evidence_refused", "scope": "device" if key.get("device") else "run", "detail": reason,
               "refused": refusal.entry_id}
        later = end is not None and ts_to_epoch(end) >= ts_to_epoch(format_ts(when))
        out.append(make_entry(Kind.UNKNOWN_INTERVAL, when, gap, ts_end=end if later else when,
                              source=SHIP_SOURCE, **key))
    return out


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


def ship(engine: Engine, spool_dir: str | Path, *, after: Sequence[ShipHook] = (), enrich: Enricher | None = None,
         progress: Callable[[int, int], None] | None = None, batches: Batches = Batches()) -> ShipReport:
    """Ship every pending spool file. Lines that fail their checks (:mod:`ledger.ingest.intake`) are refused, noted
    in ``quarantine/`` and recorded as ``evidence_refused`` entries; the rest of their file ships. Files that
    are not a writer's plain files are moved to ``quarantine/`` unread. Nothing in a spool can stop it.

    ``after``: the steps run, in order, over the shipped entries of the kinds in :data:`AFTER_SHIP_KINDS` once
    they are committed (none by default); what they report goes into ``after_errors``. ``enrich`` runs after the
    spool's entries are in and before the after-ship steps, which see its entries. One transaction per batch
    (:class:`Batches`).
    """
    report = ShipReport()
    with spool.shipping_lock(spool_dir), fewer_collections():
        _ship_locked(engine, spool_dir, report, batches, progress, tuple(after), enrich)
    return report


# The cyclic garbage collector's first threshold while shipping (CPython's default: 700). A shipment allocates
# millions of objects that plain reference counting frees (decoded records, entries, row tuples; no cycles),
# and at the default each batch of 700 set off a collection that, as the batch's live entries are promoted,
# walked them all again: ≈ 14 % of the shipment's CPU at 100,000 entries (bench.ship_sqlite). Collections
# still run, 140× less often; the thresholds are restored after (tests/test_bench_fastpaths.py).
GC_THRESHOLD_SHIPPING = 100_000
_GC_LOCK = threading.Lock()


_gc_saved: list = []   # [thresholds before the first shipment, shipments in progress] (threads ship too)


@contextmanager
def fewer_collections() -> Iterator[None]:
    import gc

    with _GC_LOCK:
        if not _gc_saved:
            old = gc.get_threshold()
            _gc_saved[:] = [old, 0]
            gc.set_threshold(max(old[0], GC_THRESHOLD_SHIPPING), *old[1:])
        _gc_saved[1] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_saved[1] -= 1
            if not _gc_saved[1]:
                gc.set_threshold(*_gc_saved[0])
                _gc_saved.clear()


def _ship_locked(engine: Engine, spool_dir: str | Path, report: ShipReport, batches: Batches,
                 progress: Callable[[int, int], None] | None, after: tuple[ShipHook, ...],
                 enrich: Enricher | None) -> None:
    spool.check_spool_dir(spool_dir)
    files = spool.pending_files(spool_dir)
    # Only what the after-ship steps read (runs that ended) is kept across batches, not every shipped entry,
    # so memory stays flat however big the spool. Files they still have to see are moved aside only after
    # they ran: a shipper killed in between finds them again, and the re-shipment (all duplicates) redoes it.
    shipped_entries: list[Entry] = []
    after_pending: list[spool.SpoolRead] = []
    source = _prepared(files)
    pos = 0
    while pos < len(files):
        reads: list[spool.SpoolRead] = []
        quarantined: list[tuple[str, str]] = []
        entries: list[Entry] = []
        segments: list[Entry] = []   # collector segments: their rows are in packs, one span each
        packs: list = []
        taken = samples = 0
        while pos < len(files) and taken < batches.files and len(entries) < batches.entries \
                and (not batches.samples or samples < batches.samples):
            prep = next(source)
            pos += 1
            taken += 1
            if prep is None:
                continue
            entries.extend(prep.entries)
            report.note_refused(prep.errors, prep.quarantine)
            if prep.quarantine is not None:
                quarantined.append((prep.read.path.name, prep.quarantine))
                continue
            reads.append(prep.read)
            if prep.segments:
                segments.extend(prep.entries[i] for i in prep.segments)
                packs.append(prep.packed)
                samples += len(prep.packed.devices)
            if prep.read.torn is not None:
                report.torn.append(str(prep.read.path))
        if reads or quarantined:
            sealed = _seal(segments, packs) if segments else None   # before the chain's lock: CPU only
            with write_tx(engine) as conn:
                if conn.dialect.name == "sqlite":
                    conn.exec_driver_sql(f"PRAGMA cache_size={SQLITE_CACHE_KIB}")
                # the sealed samples and their device-hours: an append step after the ledger's own
                result = append_in(conn, entries, also=(samples_step(sealed),) if sealed is not None else ())
            report.files += len(reads)
            report.records += len(entries)
            report.appended += result.appended
            report.duplicates += len(entries) - result.appended
            spool.quarantine(spool_dir, reads, quarantined)
            if after:
                shipped_entries.extend(e for e in entries if e.kind in AFTER_SHIP_KINDS)
                after_pending.extend(spool.SpoolRead(path=r.path, records=[], torn=r.torn, errors=[]) for r in reads)
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


def _seal(segments: list[Entry], packs: list):  # noqa: ANN202
    """A batch's collector segments (rows checked by intake, packed as columns) sealed in one pass: a block
    and the device-hours each (telemetry.sealed.seal_segments)."""
    from ..telemetry.sealed import seal_segments

    return seal_segments(segments, packs)


def samples_step(sealed):  # noqa: ANN001, ANN201 - a ledger.chain.store.AppendStep
    """The append step that stores a batch's sealed segments and their device-hours, in the transaction that
    appends their entries (after the ledger's own derived writes)."""
    return lambda conn, _appended: _write_samples(conn, sealed)


def _write_samples(conn, sealed) -> None:  # noqa: ANN001
    """Store sealed segments (once each; their entries are appended in the same transaction, before this)."""
    from ..telemetry.sealed import store_sealed_in

    store_sealed_in(conn, sealed)
