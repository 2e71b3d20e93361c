"""`ipledger demo`: the demo hall — a simulated fleet with injected faults, end to end on an SQLite ledger."""

from __future__ import annotations

from pathlib import Path

import click

from ..base.textsafe import echo
from .context import emit_json


@click.command("demo")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-out"),
              show_default=True, help="Directory for the ledger, receipts, findings, ground truth and reports.")
@click.option("--seed", type=int, default=0, show_default=True, help="Simulation seed (deterministic).")
@click.option("--small", is_flag=True, help="A smaller hall (3 racks of 3 nodes, 5 days): faster.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo_cmd(out: Path, seed: int, small: bool, as_json: bool) -> None:
    """Run the demo hall: simulate a week of a GPU hall with known faults, fill a ledger, issue receipts, run
    the agents, and write findings beside the ground truth (docs/demo.md).

    \b
    Example:
      ipledger demo --out /tmp/demo
      ipledger demo --out /tmp/demo --seed 3 --json
      ipledger --db sqlite:////tmp/demo/ledger.db findings
    """
    from ..sim.hall import DEMO_STEPS, run_demo
    from ..base.progressbar import Progress
    from ..sim import FleetSpec

    with Progress("demo", quiet=as_json, steps=len(DEMO_STEPS)) as bar:
        summary = run_demo(out, seed=seed, spec=FleetSpec.small() if small else None, step=bar.step)
    if as_json:
        emit_json(summary)
        return
    for k, v in summary.items():
        echo(f"{k}: {v}")
    echo(f"demo output is in {summary['out']}  (try: ipledger --db sqlite:///{summary['ledger']} "
               f"ask \"why did rack R3 lose GPU-hours this week?\")")
    echo(f"verify it under the demo's site (its carbon zone replays the receipts' carbon blocks): ipledger --db "
         f"sqlite:///{summary['ledger']} --config {summary['site_config']} verify")
    echo(f"open the demo hall in the web view: ipledger --db sqlite:///{summary['ledger']} serve --local-operator, "
         "then http://127.0.0.1:8787/fleet (docs/web.md)")


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)
