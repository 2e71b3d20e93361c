"""Slurm hooks on a fast path: standard library only, always exit 0, spool first, no Slurm command.

Four kinds: ``prolog`` and ``epilog`` (slurmd, every node; :mod:`.core`), ``prolog_slurmctld`` and
``epilog_slurmctld`` (slurmctld, once per job; :mod:`.controller`). ``run(kind, environ, config_path)`` is the
one entry point: the installed scripts (``ipledger hooks install``),
``ipledger hook prolog|epilog`` and the benchmark all call it. Nothing here imports SQLAlchemy, click or pandas;
the interpreter can run it under ``python -I -S`` with only the package root on ``sys.path``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing (≈ 4 ms to import under -I -S) stays off the hook's path
    from typing import Mapping

SNAPSHOT_NAME = ".ipledger-config-snapshot"


def run(kind: str, environ: Mapping[str, str], config_path: str | None, snapshot: str | None = None) -> int:
    """Run the hook ``kind`` for the job in ``environ``; returns 0 whatever happened.

    ``snapshot``: a file where the parsed site config may be cached (re-parsed whenever the TOML changes).
    """
    from .core import run_hook

    if kind in ("prolog_slurmctld", "epilog_slurmctld"):
        from . import controller

        return run_hook(kind, environ, config_path, snapshot, controller.run)
    return run_hook(kind, environ, config_path, snapshot)


def main(kind: str, config_path: str | None, script: str | None = None) -> int:
    """What the installed scripts call: the process environment, the baked-in config path, and the script's
    own path (its directory keeps the config snapshot: the hooks run as root, the directory is root's)."""
    import os

    snapshot = os.path.join(os.path.dirname(os.path.abspath(script)), SNAPSHOT_NAME) if script else None
    return run(kind, os.environ, config_path or None, snapshot)
