"""`ipledger receipt`: one run's account of paid vs delivered GPU-hours."""

from __future__ import annotations

import click

from .. import store
from ..receipts import ReceiptError, build_receipt
from .context import AppContext, UserError, emit_json, pass_app


@click.command("receipt")
@click.argument("job_id")
@click.option("--run", "run", type=int, default=None, help="Restart count (default: the latest run).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--as-of", "as_of", type=int, default=None, metavar="SEQ", help="As the ledger stood at SEQ.")
@pass_app
def receipt_cmd(app: AppContext, job_id: str, run: int | None, fmt: str, as_of: int | None) -> None:
    """Print the receipt of one job run.

    \b
    Example:
      ipledger receipt 4242 --format json
      ipledger receipt 4242 --run 1 --as-of 1200
    """
    entries = list(store.iter_entries(app.engine(), through_seq=as_of))
    try:
        r = build_receipt(entries, job_id, run)
    except ReceiptError as exc:
        raise UserError(str(exc)) from None
    if fmt == "json":
        emit_json(r)
        return
    j = r["job"]
    click.echo(f"receipt {r['receipt_hash']}\njob {j['job_id']} run {j['run']} account {j['account']}"
               f"\nwindow {r['window']['start']} .. {r['window']['end']}\npaid GPU-hours {r['gpu_hours']['paid']:.4f}")


def register(cli: click.Group) -> None:
    cli.add_command(receipt_cmd)
