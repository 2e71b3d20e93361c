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


def idle_cores() -> int:
    """The cores this process may run on that no other runnable process wants at this instant (Linux's count of
    runnable processes, ``procs_running`` in /proc/stat, this one counted out); every one of them where that
    count cannot be read. A busy machine's cores are not idle: a second worker there only queues behind the
    others and adds its own start (measured: verify 7.7 -> 10 s at load 3 on 2 cores)."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/proc/stat", "rb") as stat:
            for line in stat:
                if line.startswith(b"procs_running "):
                    others = max(0, int(line.split()[1]) - 1)
                    return max(0, cores - others)
    except (OSError, ValueError, IndexError):
        pass
    return cores


def workers_for(limit: int) -> int:
    """A default count of processes for work shared between this process and its workers: one per idle core
    (this one's included), at most ``limit``, at least 1."""
    return max(1, min(idle_cores(), limit))
