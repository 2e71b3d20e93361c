"""Reconciliation: close the runs whose epilog never ran (node crashed, slurmd killed, hook state lost).

A run is *open* when the ledger has its ``allocation_started`` but no ``allocation_ended``. For each open run
the scheduler is asked (``scontrol show job -d -o``, then ``sacct`` where accounting exists): if the run is over
(a final state, a higher restart count, or a job Slurm no longer knows), the run is closed with
``allocation_ended {state, cause: "epilog_missing"}`` and, per bound device, an ``unknown_interval`` with cause
``epilog_missing`` from the allocation start to the scheduler's end time (or now, when the scheduler has none):
nothing the epilog would have measured is known for that span. Runs still running are left alone.

This runs in ``ipledger reconcile`` (off the hook path), so it may use the ledger store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .. import __version__
from ..base import commands as commands_mod
from ..chain.canonical import ts_to_epoch
from ..chain.entries import ChainedEntry, Entry, Kind, make_entry
from ..capture.hooks import slurm
from ..capture.hooks.core import FINAL_STATES

SOURCE = "reconcile"
JOB_LEVEL_SOURCES = frozenset({"hook.slurmctld", "sacct"})  # job-level entries (node null); see open_runs


@dataclass
class OpenRun:
    cluster: str | None
    job_id: str
    run: int
    node: str | None
    start: float
    devices: list[str | None] = field(default_factory=list)


@dataclass
class Closed:
    job_id: str
    run: int
    state: str
    end: float
    end_source: str


@dataclass
class ReconcileReport:
    open_runs: int = 0
    closed: list[Closed] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"open_runs": self.open_runs, "still_running": self.still_running, "errors": self.errors,
                "closed": [{"job_id": c.job_id, "run": c.run, "state": c.state,
                            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.end)),
                            "end_source": c.end_source} for c in self.closed]}


def open_runs(entries: Iterable[ChainedEntry]) -> list[OpenRun]:
    """Runs with a start and no end, per node (each node of a multi-node job has its own prolog and epilog).

    An end without a node closes the run on every node, except the job-level ones from the controller's hooks
    and the accounting database: they say the job ended, not that a node's epilog recorded what it measured.
    Job-level starts are not reconcile's (no node lost anything; the accounting database closes them). Path
    B's synthetic runs (payload ``synthetic``) are not Slurm's to judge: the scheduler never heard of
    ``node:gpu-07``, and they carry their own end anyway.
    """
    runs: dict[tuple, OpenRun] = {}
    ended: set[tuple] = set()
    devices: dict[tuple, list] = {}
    for ce in entries:
        e = ce.entry
        if e.job_id is None:
            continue
        key = (e.cluster, e.job_id, e.run or 0, e.node)
        if e.source in JOB_LEVEL_SOURCES:
            continue
        if e.kind == Kind.ALLOCATION_STARTED and key not in runs and not e.data.get("synthetic"):
            runs[key] = OpenRun(e.cluster, e.job_id, e.run or 0, e.node, ts_to_epoch(e.ts))
        elif e.kind == Kind.ALLOCATION_ENDED:
            ended.add(key)
        elif e.kind == Kind.DEVICE_BOUND:
            devices.setdefault(key, []).append(e.device)
    out = []
    for key, r in runs.items():
        if key in ended or key[:3] + (None,) in ended:
            continue
        r.devices = list(dict.fromkeys(devices.get(key, [])))
        out.append(r)
    return out


def _sacct_end(job_id: str, cmds: Mapping[str, str], timeout: float) -> tuple[str | None, float | None]:
    r = commands_mod.run("sacct", ["-n", "-X", "-P", "-j", job_id, "-o", "State,End"], commands=cmds,
                         timeout=timeout)
    if not r.ok or not r.stdout.strip():
        return None, None
    state, _, end = r.stdout.strip().splitlines()[-1].partition("|")
    return (state.split()[0] if state else None), slurm.parse_slurm_time(end.strip())


def decide(run: OpenRun, cmds: Mapping[str, str], timeout: float, now: float) -> tuple[str, float, str] | str | None:
    """(state, end, where the end came from) for a finished run; None while it runs; an error text otherwise."""
    r = commands_mod.run("scontrol", ["show", "job", "-d", "-o", run.job_id], commands=cmds, timeout=timeout)
    if r.ok:
        rec = slurm.job_record(slurm.parse_scontrol_oneline(r.stdout))
        if rec.restarts is not None and rec.restarts > run.run:
            # A later run exists: this one ended no later than the next one started.
            end = rec.start if rec.start and run.start <= rec.start <= now else now
            return "REQUEUED", end, "scontrol.next_run_start" if end != now else "now"
        if rec.state in FINAL_STATES:
            return rec.state, (rec.end if rec.end and rec.end >= run.start else now), \
                ("scontrol.EndTime" if rec.end and rec.end >= run.start else "now")
        return None
    text = (r.stdout + r.stderr)
    if "Invalid job id" in text:
        state, end = _sacct_end(run.job_id, cmds, timeout)
        if end is not None and end >= run.start:
            return state or "UNKNOWN", end, "sacct.End"
        return state or "UNKNOWN", now, "now"
    return f"job {run.job_id}: scontrol failed: {text.strip()[:200] or r.returncode}"


def reconcile(entries: list[ChainedEntry], cmds: Mapping[str, str], timeout: float = 10.0,
              now: float | None = None) -> ReconcileReport:
    """Decide which open runs are over and build the closing entries (the caller appends them)."""
    now = time.time() if now is None else now
    report = ReconcileReport()
    runs = open_runs(entries)
    report.open_runs = len(runs)
    for run in runs:
        d = decide(run, cmds, timeout, now)
        if d is None:
            report.still_running.append(f"{run.job_id}.{run.run}")
            continue
        if isinstance(d, str):
            report.errors.append(d)
            continue
        state, end, end_source = d
        keys = {"cluster": run.cluster, "job_id": run.job_id, "run": run.run, "node": run.node,
                "source": SOURCE, "source_version": __version__}
        detail = f"no epilog record for this run; closed by reconcile at the scheduler's end ({end_source})"
        for dev in (run.devices or [None]):
            if end > run.start:
                report.entries.append(make_entry(
                    Kind.UNKNOWN_INTERVAL, run.start, {"cause": "epilog_missing", "scope": "device" if dev else "run",
                                                       "detail": detail}, ts_end=end, device=dev, **keys))
        report.entries.append(make_entry(Kind.ALLOCATION_ENDED, end, {
            "state": state, "cause": "epilog_missing", "exit_code": None, "end_source": end_source}, **keys))
        report.closed.append(Closed(run.job_id, run.run, state, end, end_source))
    return report
