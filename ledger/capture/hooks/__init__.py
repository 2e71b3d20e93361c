"""Slurm hooks on a fast path: standard library only, always exit 0, spool first, no Slurm command.

Four kinds: ``prolog`` and ``epilog`` (slurmd, every node; :mod:`.core`), ``prolog_slurmctld`` and
``epilog_slurmctld`` (slurmctld, once per job; :mod:`.controller`). ``run(kind, environ, config_path)`` is the
one entry point: the installed scripts (``ipledger hooks install``, through :func:`run_script`),
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
    """The hook ``kind`` as a script runs it: the process environment, the baked-in config path, and the script's
    own path (its directory keeps the config snapshot: the hooks run as root, the directory is root's)."""
    import os

    snapshot = os.path.join(os.path.dirname(os.path.abspath(script)), SNAPSHOT_NAME) if script else None
    return run(kind, os.environ, config_path or None, snapshot)


def run_script(kind: str, config_path: str | None, script: str | None = None) -> None:
    """What the installed scripts call: :func:`main`, then the process ends at once with its status, its
    standard streams flushed, without the interpreter's teardown (clearing every module and object the hook
    loaded: ≈ 2 ms, a quarter of a bare interpreter's start; bench/hook.py). That teardown has nothing left to
    do for a hook: the spool and state files are written through descriptors it has closed, the trace file in
    a ``with`` block, syslog's messages are sent as they are logged, and every tool it ran is reaped. The plain
    equivalent is ``sys.exit(main(...))`` (what scripts installed before this wrote; tests/test_hooks.py holds
    the two equal: the same records, the same log lines, the same status)."""
    import os
    import sys

    status = main(kind, config_path, script)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or absent stream (slurmd may close them): nothing to flush
            pass
    os._exit(status)
