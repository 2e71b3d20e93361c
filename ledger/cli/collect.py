"""`ipledger collect`: the node collector (ledger/collector.py) as a command, for systemd or a container."""

from __future__ import annotations

import click

from .. import collector
from ..textsafe import echo
from .context import AppContext, UserError, emit_json, pass_app
from .importers import parse_duration


def register(cli: click.Group) -> None:
    @cli.command("collect")
    @click.option("--source", type=click.Choice(["auto", "dcgmi", "nvml", "amd-smi"]), default="auto",
                  show_default=True, help="Telemetry source; auto = dcgmi, else NVML, else amd-smi.")
    @click.option("--interval", default="1s", show_default=True, help="Sampling cadence.")
    @click.option("--count", default=60, show_default=True, type=click.IntRange(1, 100_000),
                  help="Samples per batch (one spool file per batch).")
    @click.option("--node", help="This node's name (default: the short hostname).")
    @click.option("--spool", "spool_dir", help="Spool directory (default: config / IPLEDGER_SPOOL).")
    @click.option("--once", is_flag=True, help="Collect one batch and exit (tests, cron).")
    @click.option("--batches", type=int, help="Stop after this many batches.")
    @click.option("--json", "as_json", is_flag=True, help="Print each batch report as JSON.")
    @pass_app
    def collect(app: AppContext, source: str, interval: str, count: int, node: str | None, spool_dir: str | None,
                once: bool, batches: int | None, as_json: bool) -> None:
        """Sample GPU telemetry into the spool at a cadence; record gaps when the source fails.

        \b
        Example:
          ipledger collect --interval 1s --count 60          # forever, one spool file a minute
          ipledger collect --source dcgmi --once --json      # one batch, then exit
        """
        cfg_file = app.config
        cfg = collector.CollectorConfig(spool=spool_dir or cfg_file.spool, node=node or collector.default_node(),
                                        source=source, interval=parse_duration(interval, "--interval") or 1.0,
                                        count=count, cluster=cfg_file.cluster, commands=dict(cfg_file.commands))
        if not cfg.spool:
            raise UserError("no spool directory: give --spool or set IPLEDGER_SPOOL")

        def show(rep: collector.BatchReport) -> None:
            if as_json:
                emit_json(rep.to_json())
            else:
                state = f"ERROR {rep.error}" if rep.error else "ok"
                echo(f"{rep.source}: {rep.devices} devices, {rep.samples} samples, {rep.gaps} gaps: {state}")

        collector.run(cfg, once=once, batches=batches, on_batch=show)
