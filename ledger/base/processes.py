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
