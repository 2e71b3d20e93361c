"""What the hooks' environment does not give, from Slurm's accounting database, at ship or reconcile time.

The node hooks know the job only from their environment (no Slurm command may run in a hook). QOS, TRES, the
time limit, suspensions and the final state (CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, ...)
come from here instead, off the hook path: after a shipment, every run whose end the ledger has but whose
accounting record it lacks is *pending*; the pending runs are asked for in batches (one ``sacct`` per
``batch`` runs, never one per run or per node) and each answer is recorded as job-level entries (``node``
null) with source ``sacct``:

* ``allocation_started`` at sacct's ``Start`` {scope: job, account, partition, qos, tres, time_limit_s, nodes};
* ``allocation_suspended`` {seconds, exact: false} when the job was suspended: the database keeps only the
  total, so the span is placed at the start and says it is not exact;
* ``allocation_ended`` at sacct's ``End`` {scope: job, state, state_basis: "sacct", exit_code, signal,
  derived_exit_code, elapsed_s}. **Its ``state`` is the run's final state**; :func:`end_state` picks it (else
  the controller's, else a node's view) for anything that shows one.

The runs of a requeued job are told apart with ``sacct --duplicates``: one record per run, in start order.
A run still running, or not (yet) in the database, stays pending. When ``sacct`` fails (slurmdbd or its
database down) nothing is recorded and nothing is lost: the same runs are pending at the next shipment, and
:func:`ledger.proofcheck.run_accounting` tells a receipt which fields are still waiting for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .. import __version__
from ..base import commands as commands_mod
from .. import proofcheck as plain
from ..chain.entries import Entry, Kind, make_entry
from ..capture.hooks import slurm
from ..capture.hooks.core import FINAL_STATES

SOURCE = "sacct"
FIELDS = ("JobIDRaw", "State", "ExitCode", "DerivedExitCode", "Start", "End", "ElapsedRaw", "Suspended", "QOS",
          "AllocTRES", "TimelimitRaw", "Account", "Partition", "NodeList")
# A run's own end: a later run exists (REQUEUED) or the job is over. Anything else (RUNNING, PENDING,
# SUSPENDED, COMPLETING, REQUEUE_HOLD...) is asked again at the next shipment.
RUN_FINAL = FINAL_STATES | {"REQUEUED", "REVOKED"}
# What a receipt lacks until accounting has answered (the environment of a hook does not hold them): the
# verifier's list, which its receipt names the same way.
ACCOUNTING_FIELDS = plain.ACCOUNTING_FIELDS
DEFAULT_BATCH = 1000
DEFAULT_LOOKBACK_DAYS = 14.0


@dataclass(frozen=True)
class AcctRecord:
    """One allocation as sacct reports it (times as epoch seconds; None where sacct had none)."""

    job_id: str
    state: str | None
    exit_code: int | None
    signal: int | None
    derived_exit_code: int | None
    start: float | None
    end: float | None
    elapsed_s: int | None
    suspended_s: float | None
    qos: str | None
    tres: str | None
    time_limit_s: int | None
    account: str | None
    partition: str | None
    nodes: str | None


@dataclass(frozen=True)
class RunKey:
    cluster: str | None
    job_id: str
    run: int


@dataclass
class EnrichReport:
    pending: int = 0           # runs that needed accounting
    recorded: int = 0          # runs whose accounting was recorded now
    still_pending: list[str] = field(default_factory=list)  # JOB.RUN
    calls: int = 0             # sacct invocations (one per batch)
    error: str | None = None   # why accounting could not be read (the runs stay pending)
    entries: list[Entry] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"pending": self.pending, "recorded": self.recorded, "still_pending": self.still_pending[:100],
                "still_pending_count": len(self.still_pending), "calls": self.calls, "error": self.error}


def _none(v: str) -> str | None:
    v = v.strip()
    return None if v in ("", "Unknown", "None", "N/A", "(null)", "INVALID") else v


def _int(v: str) -> int | None:
    v = v.strip()
    return int(v) if v.isdigit() and len(v) <= 18 else None


def parse(text: str) -> list[AcctRecord]:
    """``sacct -n -P -o`` + :data:`FIELDS` output -> records; lines with the wrong field count are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(FIELDS) or not parts[0].strip():
            continue
        f = dict(zip(FIELDS, parts))
        code = slurm.two_ints(f["ExitCode"].strip())
        derived = slurm.two_ints(f["DerivedExitCode"].strip())
        state = _none(f["State"])
        out.append(AcctRecord(
            job_id=f["JobIDRaw"].strip(), state=state.split()[0] if state else None,  # "CANCELLED by 0"
            exit_code=code[0] if code else None, signal=code[1] if code else None,
            derived_exit_code=derived[0] if derived else None,
            start=slurm.parse_slurm_time(_none(f["Start"])), end=slurm.parse_slurm_time(_none(f["End"])),
            elapsed_s=_int(f["ElapsedRaw"]), suspended_s=slurm.parse_duration(_none(f["Suspended"])),
            qos=_none(f["QOS"]), tres=_none(f["AllocTRES"]), time_limit_s=_time_limit(f["TimelimitRaw"]),
            account=_none(f["Account"]), partition=_none(f["Partition"]), nodes=_none(f["NodeList"])))
    return out


def _time_limit(v: str) -> int | None:
    minutes = _int(v)  # TimelimitRaw is in minutes; UNLIMITED / Partition_Limit are no number
    return minutes * 60 if minutes is not None else None


def runs_of(records: Iterable[AcctRecord]) -> dict[tuple[str, int], AcctRecord]:
    """(job id, run) -> record: with --duplicates each run of a requeued job is its own record; in start order
    (a run that never started sorts last)."""
    by_job: dict[str, list[AcctRecord]] = {}
    for r in records:
        by_job.setdefault(r.job_id, []).append(r)
    out = {}
    for job_id, recs in by_job.items():
        recs.sort(key=lambda r: (r.start is None, r.start or 0.0))
        for i, r in enumerate(recs):
            out[(job_id, i)] = r
    return out


def pending_runs(engine, since: float) -> list[RunKey]:  # noqa: ANN001 - a SQLAlchemy engine
    """Runs with an end from a hook or reconcile since ``since`` and no accounting record yet: one query, over
    the (kind, ts) index for the ends and the (cluster, job_id, run) index for their accounting records."""
    from sqlalchemy import text

    from ..chain.canonical import format_ts

    sql = text("""
        SELECT DISTINCT e.cluster, e.job_id, e.run FROM entries e
        WHERE e.kind = :k AND e.ts >= :since AND e.source <> :src AND e.job_id IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM entries a
                          WHERE a.kind = :k AND a.source = :src AND a.job_id = e.job_id
                            AND (a.cluster = e.cluster OR (a.cluster IS NULL AND e.cluster IS NULL))
                            AND COALESCE(a.run, 0) = COALESCE(e.run, 0))""")
    with engine.connect() as conn:
        rows = conn.execute(sql, {"k": Kind.ALLOCATION_ENDED, "since": format_ts(since), "src": SOURCE}).fetchall()
    keys = {RunKey(cluster, str(job_id), int(run or 0)) for cluster, job_id, run in rows if is_job_id(str(job_id))}
    return sorted(keys, key=lambda k: (str(k.cluster), k.job_id, k.run))


def is_job_id(text: str) -> bool:
    """A Slurm job id as sacct takes it (``123``, an array task's raw id, ``123_4``, ``123+1``): the ids come
    from spool records, and only these are put on sacct's command line."""
    head, sep, rest = text.partition("_") if "_" in text else text.partition("+")
    return len(text) <= 32 and all(p.isdigit() and p.isascii() for p in ((head, rest) if sep else (head,)))


def query(job_ids: Sequence[str], cmds: Mapping[str, str], timeout: float) -> tuple[list[AcctRecord], str | None]:
    """One ``sacct`` for these jobs (every run of each: --duplicates); (records, error)."""
    args = ["-n", "-P", "-X", "-D", "-S", "1970-01-01T00:00:00", "-j", ",".join(job_ids),
            "-o", ",".join(FIELDS)]
    r = commands_mod.run("sacct", args, commands=cmds, timeout=timeout)
    if not r.ok:
        why = "timed out" if r.timed_out else (r.stderr or r.stdout).strip().splitlines()[:1]
        return [], f"sacct: {why[0] if isinstance(why, list) and why else why or r.returncode}"[:300]
    return parse(r.stdout), None


def entries_for(key: RunKey, rec: AcctRecord) -> list[Entry]:
    """The job-level entries recording one run's accounting record."""
    keys = {"cluster": key.cluster, "job_id": key.job_id, "run": key.run, "node": None, "source": SOURCE,
            "source_version": __version__}
    out = []
    start = rec.start
    if start is not None:
        out.append(make_entry(Kind.ALLOCATION_STARTED, start, {
            "scope": "job", "account": rec.account, "partition": rec.partition, "qos": rec.qos, "tres": rec.tres,
            "time_limit_s": rec.time_limit_s, "nodes": rec.nodes}, **keys))
        if rec.suspended_s:
            out.append(make_entry(Kind.ALLOCATION_SUSPENDED, start, {
                "seconds": rec.suspended_s, "exact": False, "source": SOURCE,
                "detail": "the accounting database keeps the total only; placed at the start"},
                ts_end=start + rec.suspended_s, **keys))
    end = rec.end if rec.end is not None else (start + rec.elapsed_s if start is not None and rec.elapsed_s
                                               is not None else None)
    if end is not None:
        out.append(make_entry(Kind.ALLOCATION_ENDED, end, {
            "scope": "job", "state": rec.state, "state_basis": SOURCE, "exit_code": rec.exit_code,
            "signal": rec.signal, "derived_exit_code": rec.derived_exit_code, "elapsed_s": rec.elapsed_s}, **keys))
    return out


def enrich(engine, cmds: Mapping[str, str], *, batch: int = DEFAULT_BATCH,  # noqa: ANN001
           lookback_days: float = DEFAULT_LOOKBACK_DAYS, timeout: float = 60.0, now: float | None = None,
           append: bool = True) -> EnrichReport:
    """Record the accounting of every pending run: one sacct per ``batch`` runs; failures leave them pending."""
    from ..chain import store

    now = time.time() if now is None else now
    report = EnrichReport()
    pending = pending_runs(engine, now - lookback_days * 86400)
    report.pending = len(pending)
    for i in range(0, len(pending), max(1, batch)):
        chunk = pending[i:i + max(1, batch)]
        report.calls += 1
        records, err = query(sorted({k.job_id for k in chunk}), cmds, timeout)
        if err is not None:
            report.error = err
            report.still_pending += [f"{k.job_id}.{k.run}" for k in pending[i:]]
            break  # the database is down: the rest waits for the next shipment too
        by_run = runs_of(records)
        for key in chunk:
            rec = by_run.get((key.job_id, key.run))
            if rec is None or rec.state not in RUN_FINAL:
                report.still_pending.append(f"{key.job_id}.{key.run}")
                continue
            new = entries_for(key, rec)
            report.entries += new
            report.recorded += 1
    if append and report.entries:
        store.append(engine, report.entries)
    return report


def end_state(entries: Iterable[Entry]) -> tuple[str | None, str | None]:
    """(final state, its source) for one run's entries: the accounting database's, else the controller's
    epilog's, else a node epilog's (or reconcile's) view, among equals the latest; (None, None) without any end.
    The tenant's verifier's rule (:func:`ledger.proofcheck.final_state`), so a receipt's end is the same in both."""
    return plain.final_state(list(entries))


@dataclass(frozen=True)
class AccountingSettings:
    """``[accounting]`` in the site config (read and checked by :func:`ledger.ingest.site.site_accounting`): the
    sacct command, batch (runs per sacct call), lookback_days (how far back an end is still waiting for
    accounting), timeout_s (per call)."""

    commands: Mapping[str, str]
    batch: int = DEFAULT_BATCH
    lookback_days: float = DEFAULT_LOOKBACK_DAYS
    timeout_s: float = 60.0

    def enricher(self):  # noqa: ANN201 - a ledger.ingest.ship.Enricher
        def run(engine) -> tuple[list[Entry], dict]:  # noqa: ANN001
            rep = enrich(engine, self.commands, batch=self.batch, lookback_days=self.lookback_days,
                         timeout=self.timeout_s)
            return rep.entries, rep.to_json()

        return run
