"""`ipledger receipt`: one run's account of paid vs delivered GPU-hours (text, JSON or PDF), issue and verify;
`ipledger issue`: issue the receipts of every closed run (of a month) in bulk."""

from __future__ import annotations

import json

import click

from ..receipts import ReceiptError, issue_receipt, receipt_for, render_pdf, render_text, verify_receipt
from ..safeout import OutputError, output_file, write_output
from .context import AS_OF, RUN, AppContext, UserError, emit_json, pass_app, reads_only


@click.command("receipt")
@click.argument("job_id")
@click.option("--run", "run", type=RUN, default=None, help="Restart count (default: the latest run).")
@click.option("--cluster", default=None, help="Cluster name, when the job id exists on several.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "pdf"]), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write to this file (required for --format pdf; replaced only once the write succeeded; "
                   "- for standard output).")
@click.option("--as-of", "as_of", type=AS_OF, default=None, metavar="SEQ|TIME",
              help="As the ledger stood at SEQ, or at an RFC 3339 time.")
@click.option("--contract", "contract_id", default=None, metavar="ID",
              help="Price under this contract id (default: latest applicable contract_version).")
@click.option("--verify", "verify", is_flag=True, help="Recompute the issued receipt and compare hashes.")
@click.option("--issue", "issue", is_flag=True, help="Record a receipt_issued entry (a re-issue says what changed).")
@click.option("--proof", "proof", is_flag=True,
              help="Write a proof bundle (with --head and --out) that ipledger-verify checks offline.")
@click.option("--head", "head_path", type=click.Path(dir_okay=False), default=None,
              help="With --proof: the signed tree head (ipledger checkpoint) the bundle is made under.")
@pass_app
@reads_only("issue")
def receipt_cmd(app: AppContext, job_id: str, run: int | None, cluster: str | None, fmt: str, as_json: bool,
                out: str | None, as_of: int | None, contract_id: str | None, verify: bool, issue: bool,
                proof: bool, head_path: str | None) -> None:
    """Print the receipt of one job run: where every paid GPU-hour went, priced under the contract.

    \b
    Example:
      ipledger receipt 4242
      ipledger receipt 4242 --run 1 --format json --as-of 1200
      ipledger receipt 4242 --format pdf --out receipt-4242.pdf
      ipledger receipt 4242 --issue
      ipledger receipt 4242 --verify
      ipledger receipt 4242 --proof --head head.json --out bundle.json
    """
    if proof:
        _proof_bundle(app, job_id, run, cluster, head_path, out, (as_of, contract_id, verify, issue))
        return
    if as_json:
        fmt = "json"
    if fmt == "pdf" and (not out or out == "-"):
        raise UserError("--format pdf needs --out PATH (a file, not standard output)")
    if (verify or issue) and as_of is not None:
        raise UserError("--as-of cannot be combined with --issue or --verify (they work at the ledger head)")
    engine = app.engine()
    # big runs read and attribute their devices in the site's worker processes
    skus, workers = app.site.sku_table, app.site.receipt_workers
    try:
        if verify:
            ok, issued, recomputed = verify_receipt(engine, job_id, run, cluster=cluster, sku_table=skus,
                                                    workers=workers)
            rec = issued.entry.data
            if fmt == "json":
                emit_json({"ok": ok, "issued_hash": rec.get("receipt_hash"), "recomputed_hash": recomputed.hash,
                           "through_seq": rec.get("through_seq"), "issued_seq": issued.seq})
            else:
                click.echo(f"{'OK' if ok else 'MISMATCH'}: issued {rec.get('receipt_hash')} (seq {issued.seq}), "
                           f"recomputed {recomputed.hash} through seq {rec.get('through_seq')}")
            if not ok:
                raise SystemExit(1)
            return
        status_lines: list[str] = []
        if issue:
            res = issue_receipt(engine, job_id, run, cluster=cluster, contract_id=contract_id, sku_table=skus,
                                workers=workers)
            r = res.receipt
            status_lines.append(f"{res.status}: {r.hash}")
            status_lines += [f"  changed {c}" for c in res.changes]
        else:
            r = receipt_for(engine, job_id, run, cluster=cluster, as_of=as_of, contract_id=contract_id,
                            sku_table=skus, workers=workers)
    except ReceiptError as exc:
        raise UserError(str(exc)) from None
    try:
        if fmt == "pdf":
            with output_file(out) as tmp:  # type: ignore[arg-type]
                render_pdf([r], tmp)
            click.echo(f"wrote {out}")
        elif fmt == "json":
            if out and out != "-":
                write_output(out, json.dumps(r.body, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
                click.echo(f"wrote {out}")
            else:
                emit_json(r.body)
        else:
            text = render_text(r)
            if out and out != "-":
                write_output(out, text)
                click.echo(f"wrote {out}")
            else:
                click.echo(text, nl=False)
    except OutputError as exc:
        raise UserError(str(exc)) from None
    for line in status_lines:
        click.echo(line, err=(fmt == "json" and not out))


@click.command("issue")
@click.option("--month", default=None, metavar="YYYY-MM", help="Only runs whose window overlaps this month (UTC).")
@click.option("--all", "all_runs", is_flag=True, help="Every closed run in the ledger.")
@click.option("--open", "include_open", is_flag=True,
              help="Also runs still open: their receipts are the usage accrued so far.")
@click.option("--json", "as_json", is_flag=True, help="Print what was issued as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@pass_app
def issue_cmd(app: AppContext, month: str | None, all_runs: bool, include_open: bool, as_json: bool,
              quiet: bool) -> None:
    """Issue (or re-issue where changed) the receipt of every closed run, so statements can sum them.

    Idempotent: a run whose receipt is unchanged since its last issue gets no new entry, so running it
    twice issues nothing the second time. A run that cannot be computed is reported and skipped; the exit
    status is then 1.

    \b
    Example:
      ipledger issue --all
      ipledger issue --month 2026-11 --json
      ipledger issue --month 2026-12 --open
    """
    from reports.periods import PeriodError, month_bounds
    from ..progressbar import Progress

    from ..receipts.issue import issue_runs, runs_to_issue

    if all_runs == (month is not None):
        raise UserError("name exactly one of --month YYYY-MM or --all")
    period = None
    if month is not None:
        try:
            period = tuple(b.timestamp() for b in month_bounds(month))
        except PeriodError as exc:
            raise UserError(str(exc)) from None
    engine = app.engine()
    skus = app.site.sku_table
    keys = runs_to_issue(engine, period, include_open)
    bar = Progress(f"issue {month or 'all'}", quiet=quiet or as_json)
    try:
        res = issue_runs(engine, keys, sku_table=skus, progress=bar)
    finally:
        bar.close()
    if as_json:
        emit_json({"month": month, **res.to_json()})
    else:
        for key, why in res.failed:
            click.echo(f"failed: job {key.job_id} run {key.run} ({key.cluster}): {why}", err=True)
        click.echo(f"{res.runs} runs: {res.issued} issued, {res.reissued} re-issued, {res.unchanged} unchanged, "
                   f"{len(res.failed)} failed")
    if res.failed:
        raise SystemExit(1)


def _proof_bundle(app: AppContext, job_id: str, run: int | None, cluster: str | None, head_path: str | None,
                  out: str | None, others: tuple) -> None:
    from ..heads import HeadError, read_head
    from ..merkle import TreeError
    from ..proofcheck import Failure
    from ..proofs import build_bundle, write_bundle

    if not head_path or not out:
        raise UserError("--proof needs --head HEAD.json and --out BUNDLE.json")
    if any(o not in (None, False) for o in others):
        raise UserError("--proof cannot be combined with --as-of, --contract, --verify or --issue "
                        "(the bundle is the receipt as the ledger stood at the signed head)")
    try:
        bundle = build_bundle(app.engine(), job_id, run, read_head(head_path), cluster=cluster,
                              sku_table=app.site.sku_table)
    except (ReceiptError, HeadError, Failure, TreeError) as exc:
        raise UserError(str(exc)) from None
    write_bundle(bundle, out)
    click.echo(f"wrote {out}: receipt {bundle['receipt']['receipt_hash']}, {len(bundle['entries'])} entries "
               f"under the head of {bundle['head']['tree_size']} entries")


def register(cli: click.Group) -> None:
    cli.add_command(receipt_cmd)
    cli.add_command(issue_cmd)
