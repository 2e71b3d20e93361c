"""The agents' pass over one dataset in two lanes: a forked process runs the rules that read the per device-hour
statistics (the thermal attribution rules, the drift agent) and those that need the drift agent's XIDs (idle held,
unknown gaps), while this one runs the clock-reason and starved rules, the compute agent, the accounting rules,
the daily rows, the hour-of-day profile and the account's totals; this one then finishes with what needs every
cause (the account's loss lines, the recommendations).

The one speed trick of the agents' pass, used by ``ipledger analyze`` of an export small enough to be read
sample by sample (a 24-hour capture set of 64 GPUs at 15 s: ≈ 1.5 CPU-s of agents, of which ≈ 0.6 s leave the
command's wall time on two CPUs). :func:`ledger.agents.run_agents` is the plain reference, and its fallback:
where this process cannot fork (no ``fork``, another thread running, no second CPU) or the forked lane fails
to report, its part is run here. tests/test_agents_lanes.py holds the two to the same analysis, byte for byte.

The lane is a ``fork`` of this process (the dataset is shared copy-on-write, never pickled); it sends its
findings and nothing else back through a pipe, pickled, and leaves with ``os._exit``
(:func:`ledger.base.commands.fork_call`, beside every other way ipledger starts a process). The agents are pure
functions of the dataset; the per device-hour statistics (:func:`ledger.agents.hourstats.hour_stats`, cached on
the dataset) are computed in the forked lane only, as nothing this lane runs reads them.
"""

from __future__ import annotations

import os
import pickle
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Analysis
    from .data import Dataset
    from .model import Finding


def forked_lane(ds: Dataset) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """What the forked lane computes, all of it on the per device-hour statistics or the drift agent's XIDs: the
    thermal attribution findings (:func:`ledger.agents.causes.run_thermal`), the drift agent's findings, and the
    attribution findings that read its XIDs (:func:`ledger.agents.causes.run_after_xids`: idle held, unknown
    gaps)."""
    from . import causes as attribution, drift

    thermal = attribution.run_thermal(ds)
    drift_f, stall = drift.run(ds)
    return thermal, attribution.run_after_xids(ds, stall, drift.silent_spans(drift_f)), drift_f


def can_fork() -> bool:
    """Whether a second lane can run beside this process: ``fork`` exists, this is its only thread (a fork
    beside a running thread may inherit a lock it holds), and there is a second CPU."""
    import threading

    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus >= 2


def run_agents_in_lanes(ds: Dataset, lanes: int = 2) -> Analysis:
    """:func:`ledger.agents.run_agents` of ``ds`` with :func:`forked_lane` in a second process (``lanes`` 2, where
    :func:`can_fork`); ``lanes`` 1: the reference itself. The same analysis either way."""
    from . import accounting, analysis_of, causes as attribution, compute, run_agents

    if lanes < 2 or not len(ds.samples) or not can_fork():
        return run_agents(ds)
    lane = _fork(ds)
    # this lane: the rules that read neither the device-hour statistics nor the XIDs
    clock = attribution.run_clock_and_starved(ds)
    compute_f = compute.run(ds)
    acct_f = accounting.findings(ds)
    daily = accounting.daily(ds)
    hour_of_day = accounting.hour_of_day(ds)
    totals = accounting.slice_totals(ds)   # the account's parts that read no finding
    got = _join(lane)
    thermal, after, drift_f = got if got is not None else forked_lane(ds)
    # the causes in causes_of's order: attribution (causes.run's), compute, drift, accounting
    return analysis_of(ds, [*thermal, *clock, *after, *compute_f, *drift_f, *acct_f], daily=daily,
                       hour_of_day=hour_of_day, totals=totals)


def _fork(ds: Dataset) -> tuple[int, int] | None:
    """The forked lane (:func:`ledger.base.commands.fork_call`): its findings, pickled; None where the fork failed
    (its part is then run here)."""
    from ..base.commands import fork_call

    return fork_call(lambda: pickle.dumps(forked_lane(ds), protocol=pickle.HIGHEST_PROTOCOL))


def _join(lane: tuple[int, int] | None) -> tuple[list[Finding], list[Finding], list[Finding]] | None:
    """The forked lane's result; None where it failed (it raised, was killed, or never started)."""
    from ..base.commands import fork_join

    data = fork_join(lane)
    return None if data is None else pickle.loads(data)
