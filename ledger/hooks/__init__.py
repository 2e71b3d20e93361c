"""Slurm prolog/epilog hooks on a fast path: standard library only, always exit 0, spool first.

``run(kind, environ, config_path)`` is the one entry point: the installed scripts (``ipledger hooks install``),
``ipledger hook prolog|epilog`` and the benchmark all call it. Nothing here imports SQLAlchemy, click or pandas;
the interpreter can run it under ``python -I -S`` with only the package root on ``sys.path``.
"""

from __future__ import annotations

from typing import Mapping


def run(kind: str, environ: Mapping[str, str], config_path: str | None) -> int:
    """Run the ``prolog`` or ``epilog`` hook for the job in ``environ``; returns 0 whatever happened."""
    from .core import run_hook

    return run_hook(kind, environ, config_path)


def main(kind: str, config_path: str | None) -> int:
    """What the installed scripts call: the process environment, the baked-in config path."""
    import os

    return run(kind, os.environ, config_path or None)
