"""`ipledger receipt`: one run's account of paid vs delivered GPU-hours (text, JSON or PDF), issue and verify;
`ipledger issue`: issue the receipts of every closed run (of a month) in bulk."""

from __future__ import annotations

import json

import click

from ..receipts import ReceiptError, issue_receipt, receipt_for, render_pdf, render_text, verify_receipt
from ..base.safeout import OutputError, output_file, write_output
from ..base.textsafe import echo, printable
from .context import AS_OF, RUN, SEQ, AppContext, UserError, emit_json, pass_app, reads_only


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
    engine = app.reader()
    # big runs read and attribute their devices in the site's worker processes
    skus, workers = app.site.sku_table, app.site.receipt_workers
    try:
        if verify:
            ok, issued, recomputed = verify_receipt(engine, job_id, run, cluster=cluster, sku_table=skus,
                                                    workers=workers, carbon=app.site.carbon)
            rec = issued.entry.data
            if fmt == "json":
                emit_json({"ok": ok, "issued_hash": rec.get("receipt_hash"), "recomputed_hash": recomputed.hash,
                           "through_seq": rec.get("through_seq"), "issued_seq": issued.seq})
            else:
                echo(f"{'OK' if ok else 'MISMATCH'}: issued {rec.get('receipt_hash')} (seq {issued.seq}), "
                           f"recomputed {recomputed.hash} through seq {rec.get('through_seq')}")
            if not ok:
                raise SystemExit(1)
            return
        status_lines: list[str] = []
        if issue:
            res = issue_receipt(engine, job_id, run, cluster=cluster, contract_id=contract_id, sku_table=skus,
                                workers=workers, lens=app.site.lens, carbon=app.site.carbon)
            r = res.receipt
            status_lines.append(f"{res.status}: {r.hash}")
            status_lines += [f"  changed {c}" for c in res.changes]
            if res.kept_months:
                status_lines.append(f"kept the contract of its last issue: exported month(s) "
                                    f"{', '.join(res.kept_months)} (ipledger issue --reprice-closed to reprice)")
        elif as_of is None and contract_id is None:  # at the head: the terms an issue would use
            res = issue_receipt(engine, job_id, run, cluster=cluster, sku_table=skus, workers=workers, dry_run=True,
                                lens=app.site.lens, carbon=app.site.carbon)
            r = res.receipt
            if res.kept_months:
                status_lines.append(f"kept the contract of its last issue: exported month(s) "
                                    f"{', '.join(res.kept_months)} (ipledger issue --reprice-closed to reprice)")
        else:
            r = receipt_for(engine, job_id, run, cluster=cluster, as_of=as_of, contract_id=contract_id,
                            sku_table=skus, workers=workers, lens=app.site.lens, carbon=app.site.carbon)
    except ReceiptError as exc:
        raise UserError(str(exc)) from None
    try:
        if fmt == "pdf":
            with output_file(out) as tmp:  # type: ignore[arg-type]
                render_pdf([r], tmp)
            echo(f"wrote {out}")
        elif fmt == "json":
            if out and out != "-":
                write_output(out, json.dumps(r.body, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
                echo(f"wrote {out}")
            else:
                emit_json(r.body)
        else:
            text = render_text(r)
            if out and out != "-":
                write_output(out, text)
                echo(f"wrote {out}")
            else:
                echo(text, nl=False)
    except OutputError as exc:
        raise UserError(str(exc)) from None
    for line in status_lines:
        echo(line, err=(fmt == "json" and not out))


@click.command("issue")
@click.option("--month", default=None, metavar="YYYY-MM", help="Only runs whose window overlaps this month (UTC).")
@click.option("--all", "all_runs", is_flag=True, help="Every closed run in the ledger.")
@click.option("--open", "include_open", is_flag=True,
              help="Also runs still open: their receipts are the usage accrued so far.")
@click.option("--reprice-closed", "reprice_closed", is_flag=True,
              help="Let a newer contract change receipts of months whose statement was exported (needs --yes).")
@click.option("--yes", is_flag=True, help="With --reprice-closed: do it (without: only list what would change).")
@click.option("--json", "as_json", is_flag=True, help="Print what was issued as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@pass_app
def issue_cmd(app: AppContext, month: str | None, all_runs: bool, include_open: bool, reprice_closed: bool,
              yes: bool, as_json: bool, quiet: bool) -> None:
    """Issue (or re-issue where changed) the receipt of every closed run, so statements can sum them.

    Idempotent: a run whose receipt is unchanged since its last issue gets no new entry, so running it
    twice issues nothing the second time. A run that cannot be computed is reported and skipped; the exit
    status is then 1. A run billed in a month whose statement was exported keeps the contract of its last
    issue (it is counted as kept); --reprice-closed lists the receipts and the money a newer contract would
    change there, and --reprice-closed --yes re-issues them (the next statement carries the corrections).

    \b
    Example:
      ipledger issue --all
      ipledger issue --month 2026-11 --json
      ipledger issue --month 2026-12 --open
      ipledger issue --month 2026-11 --reprice-closed --yes
    """
    from .. import api
    from ..base.periods import PeriodError, month_bounds
    from ..base.progressbar import Progress

    if all_runs == (month is not None):
        raise UserError("name exactly one of --month YYYY-MM or --all")
    if month is not None:
        try:
            month_bounds(month)
        except PeriodError as exc:
            raise UserError(str(exc)) from None
    if yes and not reprice_closed:
        raise UserError("--yes only confirms --reprice-closed")
    engine = app.engine()
    dry_run = reprice_closed and not yes
    bar = Progress(f"issue {month or 'all'}", quiet=quiet or as_json)
    try:
        res = api.issue(app.site, engine, month=month, include_open=include_open, reprice_closed=reprice_closed,
                        dry_run=dry_run, progress=bar)
    finally:
        bar.close()
    if as_json:
        emit_json({"month": month, "dry_run": dry_run, **res.to_json()})
    else:
        for key, why in res.failed:
            echo(f"failed: job {key.job_id} run {key.run} ({key.cluster}): {why}", err=True)
        for line in reprice_lines(res):
            echo(line)
        if not dry_run:
            echo(f"{res.runs} runs: {res.issued} issued, {res.reissued} re-issued, {res.unchanged} unchanged, "
                       f"{len(res.failed)} failed")
        if res.kept:
            months = sorted({m for _k, ms in res.kept for m in ms})
            echo(f"kept the contract of {len(res.kept)} receipt(s) of exported months ({', '.join(months)}): "
                       f"a newer contract applies; --reprice-closed lists what it would change", err=True)
    if dry_run:
        raise UserError(f"{len(res.repriced)} receipt(s) of exported months would change; nothing was issued "
                        f"(add --yes to re-issue them)")
    if res.failed:
        raise SystemExit(1)


def reprice_lines(res) -> list[str]:  # noqa: ANN001 - an IssueSummary
    """Each receipt of an exported month a newer contract changes, and the money per currency."""
    from decimal import Decimal

    out, delta = [], {}
    for r in res.repriced:
        d = Decimal(r.after) - Decimal(r.before)
        delta[r.currency] = delta.get(r.currency, Decimal(0)) + d
        out.append(printable(f"reprice {r.key.cluster} job {r.key.job_id} run {r.key.run} ({r.tenant}, "
                        f"{', '.join(r.months)}): {r.before} -> {r.after} {r.currency} ({d:+})"))
    if res.repriced:
        out.append(f"{len(res.repriced)} receipt(s) of exported months: "
                   + ", ".join(f"{v:+} {c}" for c, v in sorted(delta.items())))
    return out


def _proof_bundle(app: AppContext, job_id: str, run: int | None, cluster: str | None, head_path: str | None,
                  out: str | None, others: tuple) -> None:
    from ..chain.heads import HeadError, read_head
    from ..chain.merkle import TreeError
    from ..proofcheck import Failure
    from ..receipts.bundle import build_bundle, write_bundle

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
    echo(f"wrote {out}: receipt {bundle['receipt']['receipt_hash']}, {len(bundle['entries'])} entries "
               f"under the head of {bundle['head']['tree_size']} entries")


def register(cli: click.Group) -> None:
    cli.add_command(receipt_cmd)
    cli.add_command(issue_cmd)
