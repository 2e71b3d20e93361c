"""`ipledger hook`, `ipledger hooks install`, `ipledger reconcile`: the Slurm side of the ledger."""

from __future__ import annotations

import os
import sys

import click

from ..base.textsafe import echo
from .context import AppContext, UserError, emit_json, pass_app


@click.command("hook")
@click.argument("kind", type=click.Choice(["prolog", "epilog", "prolog_slurmctld", "epilog_slurmctld"]))
@pass_app
def hook_cmd(app: AppContext, kind: str) -> None:
    """Run a Slurm hook (node prolog/epilog, or the controller's) for the job in the environment (exits 0).

    This is what the installed hook scripts run, without click; use it to try a hook by hand.

    \b
    Example:
      SLURM_JOB_ID=42 SLURM_JOB_GPUS=0,1 SLURMD_NODENAME=n1 ipledger hook prolog
    """
    from ..capture.hooks import run

    sys.exit(run(kind, os.environ, app.config_path))


@click.group("hooks")
def hooks_group() -> None:
    """Install the Slurm prolog/epilog hooks; sweep the drop places epilogs could not empty.

    \b
    Example:
      ipledger hooks install --dir /etc/slurm/ipledger --config /etc/ipledger/config.toml
      ipledger hooks sweep
    """


@hooks_group.command("install")
@click.option("--dir", "directory", required=True, metavar="DIR",
              help="Where to write DIR/prolog, DIR/epilog, DIR/prolog_slurmctld and DIR/epilog_slurmctld.")
@click.option("--config", "config_path", metavar="PATH",
              help="Site config baked into the scripts (default: the global --config / $IPLEDGER_CONFIG, if any).")
@click.option("--python", "python", metavar="PATH", help="Interpreter to name (default: this one).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def install_cmd(app: AppContext, directory: str, config_path: str | None, python: str | None, as_json: bool) -> None:
    """Write the four hook scripts (executable) for slurm.conf's Prolog=, Epilog=, PrologSlurmctld= and
    EpilogSlurmctld=, and DIR/mark for jobs. None of them runs a Slurm command.

    The scripts name the interpreter and the config by absolute path and import only the standard library.

    \b
    Example:
      ipledger hooks install --dir /etc/slurm/ipledger --config /etc/ipledger/config.toml
    """
    from ..capture.hooks.core import checked_timeout
    from .install_hooks import TITLES, install, mark_path

    cfg = config_path or app.config_path
    if cfg and not os.path.isfile(cfg):
        raise UserError(f"{cfg}: config file not found")
    if cfg:
        from ..base import config as config_mod

        try:
            loaded = config_mod.load(cfg)
        except config_mod.ConfigError as exc:
            raise UserError(str(exc)) from None
        note = checked_timeout(loaded.hook_timeout_s)[1]
        if note:
            raise UserError(f"{cfg}: {note.split(';')[0]}")
        from ..capture.hooks.dropbox import Limits, shared_fs_problem, shares_spool_fs
        from ..base.textsafe import printable

        hooks = loaded.extra.get("hooks") if isinstance(loaded.extra.get("hooks"), dict) else None
        lim = Limits(loaded.spool, hooks)
        if not lim.shared_fs and shares_spool_fs(lim.drop_dir, loaded.spool):
            echo(f"ipledger: warning: {printable(shared_fs_problem(lim.drop_dir, loaded.spool))}; "
                       f"until then the prolog makes no drop places", err=True)
    try:
        paths = [*install(directory, cfg, python), mark_path(directory)]
    except (OSError, ValueError) as exc:
        raise UserError(f"hooks install: {exc}") from None
    if as_json:
        emit_json({**{p.name: str(p) for p in paths}, "config": cfg})
    else:
        for p in paths:
            echo(f"wrote {p}")
        echo("slurm.conf:\n" + "".join(f"  {TITLES[p.name]}={p}\n" for p in paths if p.name in TITLES)
                   + "  PrologFlags=Alloc")
        echo(f"jobs mark progress with: {paths[-1]} checkpoint --step N  (docs/progress.md)")


@hooks_group.command("doctor")
@click.option("--host", default="127.0.0.1", show_default=True, help="Where the DCGM host engine may listen.")
@click.option("--port", default=5555, show_default=True, type=click.IntRange(1, 65535), help="Its TCP port.")
@pass_app
def doctor_cmd(app: AppContext, host: str, port: int) -> None:
    """Warn when the DCGM host engine answers on TCP, where a job's user could remove its own job record
    (exit 1 with one line per finding, 0 when none). Run it as an ordinary user to see what a job sees.

    \b
    Example:
      runuser -u nobody -- ipledger hooks doctor
    """
    from ..capture.sources.hostengine import tcp_findings

    findings = tcp_findings(host, port)
    for f in findings:
        echo(f"warning: {f}", err=True)
    if findings:
        sys.exit(1)
    echo(f"ok: nothing answers on TCP {host}:{port}")


@hooks_group.command("sweep")
@click.option("--settle", "settle_s", type=float, default=300.0, show_default=True, metavar="SECONDS",
              help="Leave a drop place without hook state alone until it is this old (a prolog may be making it).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def sweep_cmd(app: AppContext, settle_s: float, as_json: bool) -> None:
    """Remove what epilogs could not: drop places they set aside (DROP_DIR/.unclean-*) and those of runs over
    on this node (no hook state). Run as root, from a timer, on every node.

    Never follows a symlink: every entry is removed relative to its directory's descriptor. Exits 1 when
    something could not be removed.

    \b
    Example:
      ipledger hooks sweep --json
    """
    from ..capture.hooks.core import HookSettings
    from ..capture.hooks.dropbox import Limits, sweep
    from ..base.textsafe import printable

    cfg = app.config
    hooks = cfg.extra.get("hooks") if isinstance(cfg.extra.get("hooks"), dict) else None
    drop_dir = Limits(cfg.spool, hooks).drop_dir
    try:
        done = sweep(drop_dir, HookSettings.from_config(cfg).state_dir, settle_s=settle_s)
    except FileNotFoundError:
        done = []
    except OSError as exc:
        raise UserError(f"hooks sweep: {printable(drop_dir)}: {exc.strerror or exc}") from None
    left = [d for d in done if d["action"] == "left"]
    if as_json:
        emit_json({"drop_dir": drop_dir, "entries": done})
    else:
        for d in done:
            if d["action"] != "kept":
                why = f" ({printable(d['why'])})" if d["why"] else ""
                echo(f"{d['action']} {printable(drop_dir)}/{printable(d['name'])}: {d['entries']} entries{why}")
        echo(f"{sum(d['action'] == 'removed' for d in done)} removed, {len(left)} left, "
                   f"{sum(d['action'] == 'kept' for d in done)} kept")
    if left:
        sys.exit(1)


@click.command("reconcile")
@click.option("--dry-run", is_flag=True, help="Report what would be closed; append nothing.")
@click.option("--no-ship", is_flag=True, help="Do not ship the local spool first.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def reconcile_cmd(app: AppContext, dry_run: bool, no_ship: bool, as_json: bool) -> None:
    """Close runs whose epilog never ran: allocation_ended + unknown interval (cause epilog_missing).

    Ships the local spool first (so epilogs already written are seen), then asks scontrol/sacct about every
    run that has a start but no end, and closes those the scheduler reports finished or no longer knows.

    \b
    Example:
      ipledger reconcile --json
      ipledger reconcile --dry-run
    """
    from .. import api
    from ..chain import store
    from .reconcile import reconcile

    engine = app.engine()
    site = app.site
    if not no_ship and os.path.isdir(site.spool):
        api.ship(site, engine)
    report = reconcile(list(store.iter_entries(engine)), site.commands, timeout=max(site.hook_timeout_s, 10.0))
    appended = 0
    if report.entries and not dry_run:
        appended = store.append(engine, report.entries).appended
    if as_json:
        emit_json({**report.to_json(), "appended": appended, "dry_run": dry_run})
    else:
        for c in report.closed:
            echo(f"{'would close' if dry_run else 'closed'} job {c.job_id} run {c.run}: {c.state} "
                       f"(end from {c.end_source})")
        echo(f"{report.open_runs} open runs, {len(report.closed)} closed, "
                   f"{len(report.still_running)} still running")
    for e in report.errors:
        echo(f"ipledger: {e}", err=True)
    if report.errors:
        sys.exit(1)


def register(cli: click.Group) -> None:
    for cmd in (hook_cmd, hooks_group, reconcile_cmd):
        cli.add_command(cmd)
