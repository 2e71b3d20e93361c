"""`ipledger mark KIND`: an application's checkpoint, accepted output or step, recorded for its run.

The console script runs :func:`ledger.capture.marks.main` without click for speed; this click command is the same
library call, for ``--help``, global options (``ipledger --config PATH mark ...``) and tests.
"""

from __future__ import annotations

import sys

import click

from ..base.textsafe import echo
from .context import AppContext, UserError, pass_app


@click.command("mark")
@click.argument("kind", type=click.Choice(["checkpoint", "output", "step"]))
@click.option("--step", "step", metavar="N", help="The application's step or iteration number.")
@click.option("--note", "note", metavar="TEXT", help="A short label (at most 200 characters kept).")
@click.option("--at", "at", metavar="TIME", help="When (RFC 3339 or epoch seconds; default now), to backfill from logs.")
@click.option("--job", "job", metavar="ID", help="Job id (default $SLURM_JOB_ID).")
@click.option("--run", "run", metavar="N", help="Run = restart count (default $SLURM_RESTART_COUNT, else 0).")
@click.option("--strict", is_flag=True, help="Exit 1 when the mark cannot be recorded (default: log it, exit 0).")
@pass_app
def mark_cmd(app: AppContext, kind: str, step: str | None, note: str | None, at: str | None, job: str | None,
             run: str | None, strict: bool) -> None:
    """Record a progress mark (checkpoint, output or step) for the run in the environment.

    Root and the spool's owner write to the spool; the job's user writes to the run's drop place, which the
    epilog collects. A mark never fails the job: without --strict, a spool or drop place it cannot write is
    reported on stderr and the exit status is still 0.

    \b
    Example:
      ipledger mark checkpoint --step 12000 --note "epoch 3"
      ipledger mark output --note "eval accepted" --job 4242 --run 0 --at 2026-12-01T14:05:00Z
    """
    from ..capture.marks import MarkError, MarkUnavailable, mark

    try:
        where = mark(kind, step=step, note=note, at=at, job=job, run=run, strict=strict,
                     config_path=app.config_path)
    except MarkError as exc:
        raise UserError(str(exc)) from None
    except MarkUnavailable as exc:
        echo(f"ipledger mark: {exc.strerror or exc}", err=True)
        sys.exit(1)
    if where:
        echo(f"marked {kind} -> {where}")


def register(cli: click.Group) -> None:
    cli.add_command(mark_cmd)
