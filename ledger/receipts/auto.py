"""Receipt work bound to a site: issuing receipts after a shipment, and replaying every issued one in verify.

Both price under the site's SKU table (its ``[skus]`` overrides included), the same table ``ipledger receipt
--issue`` uses, so an automatically issued receipt and a hand-issued one of the same run have the same hash.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Callable, Iterable, Mapping, Sequence, TYPE_CHECKING


from ..base.processes import worker_start_method
from ..chain import receipt_lines
from ..chain.entries import ChainedEntry, Entry, Kind, make_entry
from ..chain.lite import text
from ..chain.rows import ENTRY_COLUMNS, to_chained
from ..chain.heads import check_tree
from ..ingest.site import Site
from ..chain.store import append, iter_entries
from ..telemetry.derived import check_segments
from ..telemetry.sealed import DecodedSegments
from ..chain.verify import ChainProblem, ExtraCheck, VerifyReport
from .issue import issue_receipt, replay, write_receipt_files

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..base.progressbar import Progress

log = logging.getLogger("ipledger.receipts")


def issue_ended_runs(engine: Engine, shipped: list[Entry], site: Site) -> list[str]:
    """Issue the receipt of every run whose ``allocation_ended`` is among ``shipped``; the failures, one line each.

    With the site's ``receipts_dir`` the JSON is also written there, a directory per account. One run that
    fails does not stop the others.
    """
    from ..ingest.ship import SHIP_SOURCE   # here: verify, which replays receipts, need not import shipping

    ended = sorted({(e.cluster, e.job_id, e.run or 0) for e in shipped
                    if e.kind == Kind.ALLOCATION_ENDED and e.job_id is not None}, key=str)
    errors = []
    failed = []
    for cluster, job_id, run in ended:
        try:
            res = issue_receipt(engine, job_id, run, cluster=cluster, sku_table=site.sku_table, lens=site.lens,
                               carbon=site.carbon)
            if site.receipts_dir:
                write_receipt_files(res.receipt, site.receipts_dir)
        except Exception as exc:  # noqa: BLE001 - any failure is reported; the shipment itself has committed
            cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            errors.append(f"automatic receipt for job {job_id} run {run} (cluster {cluster or '-'}) failed: {cause}")
            log.warning("%s", errors[-1])
            failed.append(make_entry(Kind.RECEIPT_FAILED, time.time(), {"cause": cause[:500], "step": "auto_receipt"},
                                     cluster=cluster, job_id=job_id, run=run, source=SHIP_SOURCE, recorded_at=time.time()))
    if failed:  # the ledger keeps the failure too: a run without its receipt says why
        try:
            append(engine, failed)
        except Exception as exc:  # noqa: BLE001 - the database may be what failed; the report still says so
            errors.append(f"the failures above could not be recorded in the ledger: {str(exc).splitlines()[0]}")
    return errors


def after_ship_steps(site: Site) -> list:
    """What a shipper of this site does once entries are committed: automatic receipts, unless turned off."""
    return [partial(issue_ended_runs, site=site)] if site.auto_receipts else []


def check_issued_receipts(engine: Engine, report: VerifyReport, site: Site | None = None,
                          decoded: DecodedSegments | None = None,
                          shared: SharedReplays | None = None) -> list[ChainProblem]:
    """Every issued receipt recomputes, under the site's SKU table, to the hash it recorded (``decoded``: the
    sample blocks verify's segment check decoded, read from there instead of decompressed again; ``shared``:
    the replays started in worker processes beside this one, :class:`SharedReplays`)."""
    if shared is not None and shared.started:
        return shared.finish(engine, decoded)
    return replay_problems(engine, iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]), site, decoded)


def replay_problems(engine: Engine, issued: Iterable[ChainedEntry], site: Site | None,
                    decoded: DecodedSegments | None = None) -> list[ChainProblem]:
    """The problems of replaying these issued receipts, in their order."""
    skus = None if site is None else site.sku_table
    carbon = None if site is None else site.carbon
    problems = []
    for ce in issued:
        try:
            issued_data = ce.entry.data   # the issue's payload (the whole receipt), parsed once
            r = replay(engine, ce, skus, carbon=carbon, decoded=decoded, timelines=False, issued_data=issued_data)
        except Exception as exc:  # noqa: BLE001 - whatever stops a replay (a damaged block too) is a named problem
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id, f"issued receipt cannot be replayed: {exc}"))
            continue
        if r.hash != issued_data.get("receipt_hash"):
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id,
                                         f"issued receipt {issued_data.get('receipt_hash')} replays as {r.hash}"
                                         + intensity_change(issued_data.get("receipt") or {}, r.body)))
    return problems


# --- the replays shared with worker processes ---------------------------------------------------------------
# check_issued_receipts' replays, run in order in this process, are the reference. With workers (verify's
# --workers, by default one per idle core) and enough receipts, verify starts them before its chain walk
# (verify_site; a caller of verify_checks alone: before the segment check): the
# issued receipts are cut into chunks of consecutive seqs, worker processes (forked from a single-threaded caller,
# the CLI, else spawned: ledger.base.processes) replay chunks from the back of the queue while this process
# checks the segments, then this process takes chunks from the front (its replays read the blocks the segment
# check kept; a worker keeps the blocks it decodes, each checked as the segment check checks it).
# Each chunk's problems are those replay_problems gives for it, put back in chunk order, so the report is the
# one-process report byte for byte (a test holds them equal).

PARALLEL_MIN_RECEIPTS = 64     # below this a worker's start (spawned: ~0.4 CPU-s) is not repaid
REPLAY_CHUNK = 24              # receipts per job at most: large enough to amortise a round trip to a worker
MIN_CHUNK = 4                  # and at least, as the queue empties (the sides then meet within a few receipts)


class SharedReplays:
    """One verify's issued-receipt replays, shared between this process and ``workers - 1`` worker processes."""

    def __init__(self, site: Site | None, workers: int) -> None:
        self.site, self.workers = site, workers
        self.started = False
        self.chunks = 0     # chunks replayed (a test reads it: the work was shared out)
        self._asked = False
        self._pool = None
        self._feeder = None

    def begin(self, engine: Engine) -> Callable[[], None]:
        """:meth:`start`, for verify to call before its chain walk (the workers replay while the chain is
        walked); returns :meth:`abandon`, which verify calls if the chain fails and no check runs."""
        self.start(engine)
        return self.abandon

    def start(self, engine: Engine) -> None:
        """Queue the replays and start the workers on them (nothing, leaving the in-process reference to
        check_issued_receipts, with one worker, few receipts or a database a worker cannot open). Once: a second
        call (the segment check's, after verify's :meth:`begin`) finds them started."""
        import threading

        from ..chain.db import sqlite_path

        if self._asked:
            return
        self._asked = True
        url = engine.url.render_as_string(hide_password=False)
        if self.workers < 2 or (engine.url.get_backend_name() == "sqlite" and sqlite_path(url) is None):
            return
        # the reference's own query (iter_entries'), asking only for seq: the same receipts, found the same way
        # (through the kind index), without reading each receipt's payload before the workers start
        with engine.connect() as conn:
            seqs = [int(s) for (s,) in conn.execute(text(
                "SELECT seq FROM entries WHERE seq > 0 AND kind IN (:k) ORDER BY seq"), {"k": Kind.RECEIPT_ISSUED})]
        if len(seqs) < PARALLEL_MIN_RECEIPTS:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self._url, self._seqs = url, seqs
        self._lo, self._hi = 0, len(seqs)    # seqs[lo:hi]: the receipts no process has taken yet
        self._lock = threading.Lock()
        self._futures: dict[int, object] = {}   # a worker's chunk: its first position -> its future
        started = min(self.workers - 1, len(seqs) // REPLAY_CHUNK or 1)
        self._pool = ProcessPoolExecutor(started, mp_context=multiprocessing.get_context(worker_start_method()),
                                         initializer=_start_worker)
        self.started = True
        # The first chunks are submitted from this thread: a fork pool forks its workers on the first submit,
        # and this process is then still single-threaded; the feeder thread keeps them fed from there.
        self._submit_next(2 * started)
        self._feeder = threading.Thread(target=self._feed, args=(2 * started,), daemon=True)
        self._feeder.start()

    def _take(self, from_back: bool = False) -> tuple[int, int] | None:
        """The next chunk, positions [a, b) of the queued receipts: this process takes them from the front, the
        workers from the back, so each side's consecutive chunks read the same segments (a worker decodes each
        block once, :func:`_start_worker`). Chunks shrink as the queue does (at most REPLAY_CHUNK, at least
        MIN_CHUNK receipts), so that the two sides meet with little left running on one of them."""
        with self._lock:
            left = self._hi - self._lo
            if left <= 0:
                return None
            k = min(left, max(MIN_CHUNK, min(REPLAY_CHUNK, left // (2 * self.workers))))
            if from_back:
                self._hi -= k
                return self._hi, self._hi + k
            self._lo += k
            return self._lo - k, self._lo

    def _submit_next(self, n: int) -> set:
        """Submit up to ``n`` chunks from the back of the queue to the workers; their futures (a pool that cannot
        start leaves the chunk without one: finish() replays what has no result)."""
        running: set = set()
        for _ in range(n):
            chunk = self._take(from_back=True)
            if chunk is None:
                break
            a, b = chunk
            try:
                f = self._pool.submit(_replay_chunk, (self._url, self.site, self._seqs[a:b]))
            except Exception:  # noqa: BLE001 - a broken pool: this chunk is replayed here
                with self._lock:
                    self._futures[a] = (b, None)
                break
            with self._lock:
                self._futures[a] = (b, f)
            running.add(f)
        return running

    def _feed(self, in_flight: int) -> None:
        """Keep ``in_flight`` chunks submitted to the workers until the queue is empty."""
        from concurrent.futures import FIRST_COMPLETED, wait

        with self._lock:
            running = {f for _b, f in self._futures.values() if f is not None and not f.done()}
        try:
            while self._hi > self._lo:
                if len(running) >= in_flight:
                    _done, running = wait(running, return_when=FIRST_COMPLETED)
                more = self._submit_next(in_flight - len(running))
                if not more:
                    return
                running |= more
        except Exception:  # noqa: BLE001 - a pool that cannot start: finish() replays what has no result
            return

    def finish(self, engine: Engine, decoded: DecodedSegments | None) -> list[ChainProblem]:
        """Take chunks from the queue until it is empty, then gather every chunk's problems in queue order."""
        done: dict[int, list[ChainProblem]] = {}
        try:
            while (chunk := self._take()) is not None:
                done[chunk[0]] = self._replay_here(engine, *chunk, decoded)
            self._feeder.join()
            for a, (b, f) in list(self._futures.items()):
                try:
                    if f is None:
                        raise RuntimeError("not submitted")
                    done[a] = f.result()
                except Exception:  # noqa: BLE001 - a worker lost (BrokenProcessPool): replay it here
                    done[a] = self._replay_here(engine, a, b, decoded)
            self.chunks = len(done)
            return [p for a in sorted(done) for p in done[a]]
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.started = False

    def abandon(self) -> None:
        """Stop the workers without their results (the chain failed: no receipt is judged): nothing more is
        submitted, what is queued is cancelled, and a chunk being replayed is let finish."""
        if not self.started:
            return
        with self._lock:
            self._lo = self._hi
        self._feeder.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.started = False

    def _replay_here(self, engine: Engine, a: int, b: int, decoded: DecodedSegments | None) -> list[ChainProblem]:
        return replay_problems(engine, _issued_at(engine, self._seqs[a:b]), self.site, decoded)


def _issued_at(engine: Engine, seqs: Sequence[int]) -> list[ChainedEntry]:
    """The entries at these seqs (the reference's query found them), read from the table by seq, in seq order."""
    marks = ",".join(f":s{i}" for i in range(len(seqs)))
    sql = text(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM entries WHERE seq IN ({marks}) ORDER BY seq")
    with engine.connect() as conn:
        return [to_chained(r) for r in conn.execute(sql, {f"s{i}": s for i, s in enumerate(seqs)})]


# A worker's decoded sample blocks, kept for all the chunks it replays (consecutive chunks read mostly the same
# segments): without them each receipt decompressed its blocks again (≈ 35 % more CPU per replay on the demo).
# Its engine is kept too (one per database; a chunk is a few receipts, an engine's start a round trip or two).
WORKER_KEPT_ROWS = 500_000   # samples a worker keeps decoded (the first kept make room), each column ~8 bytes twice
_worker_blocks: DecodedSegments | None = None
_worker_engines: dict[str, Engine] = {}


def _start_worker() -> None:
    """Worker initializer: its own empty cache of decoded blocks and no engine (a forked worker would otherwise
    share the parent's module state as it was at the fork)."""
    global _worker_blocks, _worker_engines
    _worker_blocks, _worker_engines = DecodedSegments(WORKER_KEPT_ROWS, evict_oldest=True), {}


def _replay_chunk(job: tuple) -> list[ChainProblem]:
    """Worker: replay_problems of one chunk of issued receipts, read through its own connection."""
    from ..chain.db import make_engine, make_reader

    url, site, seqs = job
    engine = _worker_engines.get(url)
    if engine is None:
        engine = _worker_engines[url] = make_reader(url) or make_engine(url)
    return replay_problems(engine, _issued_at(engine, seqs), site, _worker_blocks)


def intensity_change(issued: Mapping, replayed: Mapping) -> str:
    """``": the carbon intensity file changed (...)"`` when the two bodies' carbon blocks name different intensity
    tables (or one has a block and the other none), else ""."""
    a, b = issued.get("carbon"), replayed.get("carbon")
    if a is None and b is None:
        return ""
    va = None if a is None else f"{a.get('zone')} {a.get('intensity_version')}"
    vb = None if b is None else f"{b.get('zone')} {b.get('intensity_version')}"
    if va == vb:
        return ""
    return f": the carbon intensity changed (issued under {va or 'no carbon settings'}, the site now has " \
           f"{vb or 'no carbon settings'})"


def check_receipt_lines(engine: Engine, report: VerifyReport) -> list[ChainProblem]:
    """Every issued receipt's flat lines (``receipt_lines``) are the ones its entry derives: none missing,
    extra or altered (ledger/chain/receipt_lines.py)."""
    with engine.connect() as conn:
        if not receipt_lines.has_table(conn):
            return []
        return [ChainProblem(seq, "", problem) for seq, problem in receipt_lines.problems(conn)]


def verify_checks(site: Site | None = None, pinned: tuple = (), workers: int = 1,
                  deep: bool = False) -> tuple[ExtraCheck, ...]:
    """The checks ``ipledger verify`` runs after the chain: telemetry evidence and the device-hours derived from
    it (each segment read once), issued receipts replayed under ``site``'s SKU table (None: the built-in table,
    for a ledger with no site overrides), their flat lines re-derived, then the Merkle tree and the signed heads
    recorded in the ledger (each signed by one of the ``pinned`` public keys, when given); the flat lines are checked
    before the replays are gathered. The segment check
    keeps the sample blocks it decodes for the replays (each block decompressed once; a test holds the
    replays equal to plain ones).
    With ``workers`` > 1 the replays start in worker processes before the segment check (:class:`SharedReplays`;
    the same report). One by default here; the CLI asks for one per idle core (a worker on a busy core only adds
    its CPU: docs/ledger.md). ``deep``: every segment's canonical ``samples_sha256`` re-derived, also where its
    entry seals the cheaper ``values_sha256`` (``verify --deep``)."""
    return _checks_and_replays(site, pinned, workers, deep)[0]


def _checks_and_replays(site: Site | None, pinned: tuple, workers: int,
                        deep: bool) -> tuple[tuple[ExtraCheck, ...], SharedReplays]:
    decoded = DecodedSegments()
    shared = SharedReplays(site, workers)
    # The flat lines' check runs before the replays are gathered: it is this process's own work while the workers
    # still replay (after them it left a worker idle at the end); verify sorts the problems by seq either way.
    return (partial(check_segments, decoded=decoded, meanwhile=shared.start, canonical=deep),
            check_receipt_lines,
            partial(check_issued_receipts, site=site, decoded=decoded, shared=shared),
            partial(check_tree, pinned=pinned) if pinned else check_tree), shared


def verify_site(engine: Engine, site: Site | None, *, pinned: tuple = (), workers: int = 1, deep: bool = False,
                chain_only: bool = False, anchors: Sequence = (), progress: Progress | None = None) -> VerifyReport:
    """``ipledger verify`` as one call: the chain (its ``anchors``), then :func:`verify_checks`' checks for this
    site, each a named step of ``progress`` when given. With ``workers`` > 1 the receipt replays begin in worker
    processes before the chain walk (verify's ``begin``), so they run while the chain is walked too; the report
    is the one-process report."""
    from ..chain.verify import verify

    checks, shared = _checks_and_replays(site, pinned, workers, deep)
    if progress is not None:
        progress.steps = 1 + len(checks)
        progress.step("hash chain")
        checks = tuple(_named_step(progress, c) for c in checks)
    return verify(engine, chain_only=chain_only, anchors=anchors, deep=deep, checks=checks, begin=shared.begin)


def _named_step(progress: Progress, check: ExtraCheck) -> ExtraCheck:
    """The check, named on the progress bar when it starts."""
    name = getattr(getattr(check, "func", check), "__name__", "check").removeprefix("check_").replace("_", " ")

    def run(engine: Engine, report: VerifyReport) -> list:
        progress.step(name)
        return check(engine, report)

    return run
