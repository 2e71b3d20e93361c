"""`ipledger demo`: the demo hall, end to end on an embedded SQLite ledger."""

from __future__ import annotations

from pathlib import Path

import click

from .context import emit_json


@click.command("demo")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-out"),
              show_default=True, help="Directory for the ledger, receipts and reports.")
@click.option("--seed", type=int, default=0, show_default=True, help="Simulation seed (deterministic).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo_cmd(out: Path, seed: int, as_json: bool) -> None:
    """Run the demo: simulate jobs, ship them into a fresh SQLite ledger, verify, issue receipts.

    \b
    Example:
      ipledger demo --out /tmp/demo
    """
    from ..demo import run_demo

    summary = run_demo(out, seed=seed)
    if as_json:
        emit_json(summary)
    else:
        for k, v in summary.items():
            click.echo(f"{k}: {v}")
        click.echo(f"demo output is in {summary['out']}")


def register(cli: click.Group) -> None:
    cli.add_command(demo_cmd)
