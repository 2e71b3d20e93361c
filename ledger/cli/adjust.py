"""`ipledger adjust` and `ipledger resolve`: credits, debits and unknown-interval resolutions as new entries."""

from __future__ import annotations

import click

from ..chain import store
from ..chain.adjustments import RESOLUTIONS, AdjustmentError, adjustment_entry, check_bound, resolution_entry
from ..chain.entries import Kind
from ..receipts import ReceiptError
from ..receipts.gather import pick_run, runs_of_job
from ..base.textsafe import echo
from .context import RUN, AppContext, UserError, emit_json, pass_app


@click.command("adjust")
@click.argument("job_id")
@click.option("--run", "run", type=RUN, default=None, help="Restart count (default: the latest run).")
@click.option("--cluster", default=None, help="Cluster name, when the job id exists on several.")
@click.option("--credit", "credit", metavar="HOURS|AMOUNT", default=None, help="Credit, e.g. 2.5h or 120.00.")
@click.option("--debit", "debit", metavar="HOURS|AMOUNT", default=None, help="Debit, e.g. 1h or 40.00.")
@click.option("--reason", required=True, help="Why (shown on the receipt).")
@click.option("--by", "by", required=True, help="Who decided it.")
@click.option("--ref", "refs", multiple=True, help="Entry id this adjustment refers to (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded entry as JSON.")
@pass_app
def adjust_cmd(app: AppContext, job_id: str, run: int | None, cluster: str | None, credit: str | None,
               debit: str | None, reason: str, by: str, refs: tuple[str, ...], as_json: bool) -> None:
    """Credit or debit a job run by GPU-hours or an amount (an adjustment entry; usage is never edited).

    \b
    Example:
      ipledger adjust 4242 --credit 2.5h --reason "node D2 cooling fault" --by ops@example.org
      ipledger adjust 4242 --run 1 --debit 40.00 --reason "support time" --by billing
    """
    if (credit is None) == (debit is None):
        raise UserError("give exactly one of --credit or --debit")
    engine = app.engine()
    try:
        with engine.connect() as conn:
            key = pick_run(runs_of_job(conn, job_id, None), job_id, run, cluster)
        quantity = credit or debit or ""
        check_bound(quantity, *_paid(engine, key), app.site.max_adjustment_factor)
        entry = adjustment_entry(cluster=key.cluster, job_id=key.job_id, run=key.run,
                                 direction="credit" if credit else "debit", quantity=credit or debit or "",
                                 reason=reason, by=by, references=list(refs))
    except (ReceiptError, AdjustmentError) as exc:
        raise UserError(str(exc)) from None
    res = store.append(engine, [entry])
    out = {"entry_id": entry.entry_id, "seq": res.last_seq, "job_id": key.job_id, "run": key.run,
           "payload": entry.data}
    if as_json:
        emit_json(out)
    else:
        echo(f"adjustment {entry.entry_id} recorded at seq {res.last_seq} for job {key.job_id} run {key.run}")


def _paid(engine, key) -> tuple[float, float]:  # noqa: ANN001
    """The run's paid GPU-hours and paid cost, from its receipt at the ledger head."""
    from ..receipts import compute_receipt
    from ..receipts.gather import gather

    body = compute_receipt(gather(engine, key.job_id, key.run, cluster=key.cluster)).body
    return float(body["gpu_hours"]["paid"]), float(body["cost"]["paid"])


@click.command("resolve")
@click.argument("gap_id")
@click.option("--as", "as_", type=click.Choice(list(RESOLUTIONS)), required=True,
              help="How the unknown interval is billed.")
@click.option("--reason", required=True, help="Why (shown on the receipt).")
@click.option("--by", "by", required=True, help="Who decided it.")
@click.option("--job", "job_id", default=None, help="Job the resolution is for, when the gap names no job.")
@click.option("--run", "run", type=RUN, default=None, help="Run, with --job (default: latest).")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded entry as JSON.")
@pass_app
def resolve_cmd(app: AppContext, gap_id: str, as_: str, reason: str, by: str, job_id: str | None,
                run: int | None, as_json: bool) -> None:
    """Resolve an unknown interval as charge, credit or estimate. GAP_ID is the unknown_interval entry's id, or
    the id of an unknown_gap finding (`ipledger findings`): then every interval that finding stands for.

    \b
    Example:
      ipledger resolve e3f1c0... --as credit --reason "host engine restart, our fault" --by ops
      ipledger resolve F3a9c0d1e2f4a5b6 --as credit --reason "collector outage, ours" --by ops
    """
    engine = app.engine()
    gaps = {c.entry.entry_id: c for c in store.iter_entries(engine, kinds=[Kind.UNKNOWN_INTERVAL])}
    targets = [gaps[gap_id]] if gap_id in gaps else _gaps_of_finding(engine, gap_id, gaps)
    job = None
    try:
        if job_id is not None:
            with engine.connect() as conn:
                k = pick_run(runs_of_job(conn, job_id, None), job_id, run)
            job = (k.cluster, k.job_id, k.run)
        entries = [resolution_entry(g, resolution=as_, reason=reason, by=by, job=job) for g in targets]
    except (ReceiptError, AdjustmentError) as exc:
        raise UserError(str(exc)) from None
    res = store.append(engine, entries)
    out = {"entry_id": entries[0].entry_id, "seq": res.last_seq, "gap_id": targets[0].entry.entry_id,
           "resolution": as_, "resolved": [{"gap_id": g.entry.entry_id, "entry_id": e.entry_id}
                                            for g, e in zip(targets, entries)]}
    if as_json:
        emit_json(out)
    else:
        for g, e in zip(targets, entries):
            echo(f"gap {g.entry.entry_id} resolved as {as_}: entry {e.entry_id} at seq {res.last_seq}")


def _gaps_of_finding(engine, finding_id: str, gaps: dict) -> list:  # noqa: ANN001
    """The unknown_interval entries an unknown_gap finding stands for (its ``gap_ids``, else its ``gap_id``)."""
    from ..agents import recorded_findings

    f = next((x for x in recorded_findings(engine) if x["id"] == finding_id), None)
    if f is None:
        raise UserError(f"no unknown_interval entry with id {finding_id} (nor a recorded finding)")
    ids = f.get("gap_ids") or ([f["gap_id"]] if f.get("gap_id") else [])
    found = [gaps[i] for i in ids if i in gaps]
    if not found:
        raise UserError(f"finding {finding_id} ({f['kind']}) names no unknown_interval entry to resolve")
    return found


def register(cli: click.Group) -> None:
    cli.add_command(adjust_cmd)
    cli.add_command(resolve_cmd)
