"""How worker processes are started: fork where it is safe, spawn otherwise (one rule for every pool of workers
that may fork).

A forked worker starts in milliseconds with the parent's modules already imported; a spawned one pays an
interpreter start and its imports (≈ 0.5 s and as many CPU-seconds, on the 2-core machine measured). Fork is
safe only from a single-threaded process (a lock another thread held is copied held) on a platform that has it;
the worker must then open its own connections and never use the parent's.
"""

from __future__ import annotations


def worker_start_method() -> str:
    """``"fork"`` when this process is single-threaded and the platform forks, else ``"spawn"``."""
    import multiprocessing
    import threading

    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def idle_cores(samples: int = 5, interval_s: float = 0.002) -> int:
    """The cores this process may run on that no other process keeps busy: Linux's count of runnable processes
    (``procs_running`` in /proc/stat, this one counted out), the fewest of a few readings ``interval_s`` apart (a
    process that only wakes for a moment is not a busy core; a computing one is runnable at every reading);
    every core where that count cannot be read. A busy machine's cores are not idle: a second worker there only
    queues behind the others and adds its own start (measured: verify 7.7 -> 10 s at load 3 on 2 cores)."""
    import os
    import time

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    others = None
    try:
        for i in range(samples):
            if i:
                time.sleep(interval_s)
            with open("/proc/stat", "rb") as stat:
                for line in stat:
                    if line.startswith(b"procs_running "):
                        now = max(0, int(line.split()[1]) - 1)
                        others = now if others is None else min(others, now)
                        break
    except (OSError, ValueError, IndexError):
        return cores
    return cores if others is None else max(0, cores - others)


def workers_for(limit: int) -> int:
    """A default count of processes for work shared between this process and its workers: one per idle core
    (this one's included), at most ``limit``, at least 1."""
    return max(1, min(idle_cores(), limit))
