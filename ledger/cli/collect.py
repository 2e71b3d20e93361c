"""`ipledger collect`: the node collector (ledger/capture/collector.py) as a command, for systemd or a container."""

from __future__ import annotations

import time

import click

from ..capture import collector, k8s
from ..capture.sources.kubelet import DEFAULT_SOCKET
from ..base.textsafe import echo
from .context import AppContext, UserError, emit_json, pass_app
from .importers import parse_duration


def register(cli: click.Group) -> None:
    @cli.command("collect")
    @click.option("--source", type=click.Choice(["auto", "dcgmi", "nvml", "amd-smi", "none"]), default="auto",
                  show_default=True, help="Telemetry source; auto = dcgmi, else NVML, else amd-smi; none = "
                  "only the kubelet's pods (with --kubelet-socket).")
    @click.option("--kubelet-socket", "kubelet_socket", default=None, is_flag=False, flag_value=DEFAULT_SOCKET,
                  help=f"Read pods as runs from the kubelet's pod-resources socket before every batch "
                  f"(bare flag: {DEFAULT_SOCKET}).")
    @click.option("--interval", default="1s", show_default=True, help="Sampling cadence.")
    @click.option("--count", default=60, show_default=True, type=click.IntRange(1, 100_000),
                  help="Samples per batch (one spool file per batch).")
    @click.option("--node", help="This node's name (default: the short hostname).")
    @click.option("--spool", "spool_dir", help="Spool directory (default: config / IPLEDGER_SPOOL).")
    @click.option("--once", is_flag=True, help="Collect one batch and exit (tests, cron).")
    @click.option("--batches", type=int, help="Stop after this many batches.")
    @click.option("--json", "as_json", is_flag=True, help="Print each batch report as JSON.")
    @pass_app
    def collect(app: AppContext, source: str, kubelet_socket: str | None, interval: str, count: int, node: str | None, spool_dir: str | None,
                once: bool, batches: int | None, as_json: bool) -> None:
        """Sample GPU telemetry into the spool at a cadence; record gaps when the source fails.

        \b
        Example:
          ipledger collect --interval 1s --count 60          # forever, one spool file a minute
          ipledger collect --source dcgmi --once --json      # one batch, then exit
          ipledger collect --kubelet-socket /var/lib/kubelet/pod-resources/kubelet.sock --source none --once
        """
        cfg_file = app.config
        if source == "none" and not kubelet_socket:
            raise UserError("--source none collects nothing without --kubelet-socket")
        cfg = collector.CollectorConfig(spool=spool_dir or cfg_file.spool, node=node or collector.default_node(),
                                        source="auto" if source == "none" else source, interval=parse_duration(interval, "--interval") or 1.0,
                                        count=count, cluster=cfg_file.cluster, commands=dict(cfg_file.commands))
        if not cfg.spool:
            raise UserError("no spool directory: give --spool or set IPLEDGER_SPOOL")

        def show(rep: collector.BatchReport) -> None:
            if as_json:
                emit_json(rep.to_json())
            else:
                state = f"ERROR {rep.error}" if rep.error else "ok"
                echo(f"{rep.source}: {rep.devices} devices, {rep.samples} samples, {rep.gaps} gaps: {state}")

        pods = None if not kubelet_socket else k8s.PodRunsConfig(
            spool=cfg.spool, node=cfg.node, socket=kubelet_socket, cluster=cfg.cluster,
            max_gap_s=max(3 * cfg.interval * cfg.count, 3 * cfg.interval))

        def pod_tick() -> None:
            assert pods is not None
            rep = k8s.collect_tick(pods)
            if as_json:
                emit_json({"kubelet": rep.to_json()})
            else:
                state = f"ERROR {rep.error}" if rep.error else "ok"
                echo(f"kubelet: {rep.pods} pods, {rep.started} started, {rep.ended} ended, {rep.gaps} gaps: {state}")

        if source == "none":
            done = 0
            try:
                while True:
                    pod_tick()
                    done += 1
                    if once or (batches is not None and done >= batches):
                        return
                    time.sleep(cfg.interval * cfg.count)
            except KeyboardInterrupt:
                return
        collector.run(cfg, once=once, batches=batches, on_batch=show, before_batch=pod_tick if pods else None)
