"""The controller's hooks, ``PrologSlurmctld`` and ``EpilogSlurmctld``: one job-level record per job and run.

slurmctld runs them once per job (not once per node) with the job in the environment: node list, account,
partition, user, group, job name, constraints and, at the end, the exit codes. They follow the node hooks' rules
(standard library, spool first, exit 0, bounded, no Slurm command, no GPU tool either) and write:

* prolog_slurmctld: ``allocation_started`` with ``node`` null (the whole job's start, at allocation time —
  also for a requeued run whose node prolog slurmd skipped), source ``hook.slurmctld``;
* epilog_slurmctld: ``allocation_ended`` with ``node`` null {state, state_basis, exit_code, signal,
  derived_exit_code}, and ``allocation_requeued`` when Slurm already counts the next run.

The run number is kept from the prolog to the epilog in the hook state directory (``slurmctld-JOB.json``), as
on the nodes: in a requeued run's epilog Slurm already shows the next restart count. Job-level entries never
stand in for a node's: ``ipledger reconcile`` still closes a node whose epilog was lost.
"""

from __future__ import annotations

import time

from ... import __version__
from ...chain.kinds import Kind
from . import core

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any

SOURCE = "hook.slurmctld"


def _keys(h: core.Hook, run: int, cluster: str | None) -> dict[str, Any]:
    return {"cluster": cluster, "job_id": h.env.job_id, "run": run, "node": None, "source": SOURCE,
            "source_version": __version__}


def _state_name(h: core.Hook) -> str:
    return "slurmctld-" + core.state_name(h.env.job_id)


def prolog(h: core.Hook) -> None:
    now = time.time()
    e = h.env
    run = e.restart_count or 0
    cluster = h.cfg.cluster or e.cluster
    keys = _keys(h, run, cluster)
    payload = {"account": e.account, "user": e.user, "partition": e.partition, "nodes": e.nodes,
               "scope": "job"}
    for k in ("group", "job_name", "constraints", "qos"):
        if getattr(e, k):
            payload[k] = getattr(e, k)
    h.add(Kind.ALLOCATION_STARTED, now, payload, keys)
    h.write_spool("prolog_slurmctld")  # the start is on disk before anything else can go wrong
    try:
        core.save_state(h.settings.state_dir, _state_name(h), {"run": run, "cluster": cluster, "start": now})
    except OSError as exc:
        h.error("state", f"hook state not saved in {h.settings.state_dir}: {type(exc).__name__}: {exc}")
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "prolog_slurmctld", **err}, keys)
    h.write_spool("prolog_slurmctld")


def epilog(h: core.Hook) -> None:
    now = time.time()
    name = _state_name(h)
    state = core.load_state(h.settings.state_dir, name)
    if state is not None and isinstance(state.get("run"), int):
        run = state["run"]
    else:
        state = None
        run = h.env.restart_count or 0
        h.error("state", "no prolog_slurmctld state for this job (PrologSlurmctld not set, or its state was lost)")
    cluster = (state or {}).get("cluster") or h.cfg.cluster or h.env.cluster
    keys = _keys(h, run, cluster)
    core.record_end(h, keys, now, run, state is not None, scope="job")
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "epilog_slurmctld", **err}, keys)
    try:
        h.write_spool("epilog_slurmctld")
    finally:
        core.drop_state(h.settings.state_dir, name)


def run(h: core.Hook) -> None:
    (prolog if h.kind == "prolog_slurmctld" else epilog)(h)
