"""`ipledger export monthly`: the monthly tenant accounting export (CSV, Parquet, FOCUS, JSON, PDF).

A thin command over :func:`reports.export.build_statement` and :func:`reports.export.write`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..base.textsafe import echo
from .context import AS_OF, SEQ, AppContext, UserError, emit_json, pass_app, reads_only


@click.group("export")
def export_group() -> None:
    """Exports for finance: the monthly tenant statement.

    \b
    Example:
      ipledger export monthly --month 2026-11 --format focus --out nov.focus.csv
    """


@export_group.command("monthly")
@click.option("--month", required=True, metavar="YYYY-MM", help="Calendar month (UTC) whose runs are billed.")
@click.option("--tenant", default=None, metavar="T", help="Only this tenant (Slurm account / namespace).")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "focus", "json", "pdf"]), default="csv",
              show_default=True, help="csv/parquet: the long table; focus: FinOps FOCUS 1.2 CSV; pdf: statement.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Output file (default statement-MONTH[-TENANT].EXT; '-' writes csv/focus/json to stdout).")
@click.option("--as-of", "as_of", type=AS_OF, default=None, metavar="SEQ|TIME",
              help="As the ledger stood at SEQ (or an RFC 3339 time): reproduces an export made then.")
@click.option("--alias-key", "alias_key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Replace hostnames and users by keyed-HMAC aliases (key read from FILE).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary of what was written.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@pass_app
@reads_only(writes_unless="as_of")   # records statement_exported (the month closes to repricing)
def monthly_cmd(app: AppContext, month: str, tenant: str | None, fmt: str, out: Path | None, as_of: int | None,
                alias_key: Path | None, as_json: bool, quiet: bool) -> None:
    """Write the month's tenant accounting statement, summed from issued receipts.

    Totals per tenant, per job class (partition, QOS) and per hour of day: runs, paid and delivered
    GPU-hours, every loss bucket, unknown (resolved/pending), adjustments and cost, with the ledger head
    hash the export was computed from. Receipts re-issued after their month closed appear as correction
    rows in the month they were re-issued. The export is recorded (a statement_exported entry, not with
    --as-of): a newer contract then leaves the month's receipts alone unless `issue --reprice-closed --yes`.

    \b
    Example:
      ipledger export monthly --month 2026-11
      ipledger export monthly --month 2026-11 --format pdf --out nov.pdf
      ipledger export monthly --month 2026-11 --tenant astro --format focus --alias-key /etc/ipledger/alias.key
      ipledger export monthly --month 2026-10 --as-of 18234 --format json --out -
    """
    from reports.alias import AliasError, Aliaser, read_key
    from reports.focus import DEFAULT_INVOICE_SCHEME, InvoiceSchemeError, check_invoice_scheme
    from reports.export import default_name
    from reports.statement_file import export_file
    from reports.monthly import ExportError, cents
    from ..base.progressbar import Progress

    from ..base.safeout import OutputError, output_file

    try:
        aliaser = Aliaser(read_key(alias_key) if alias_key else None)
    except AliasError as exc:
        raise UserError(str(exc)) from None
    focus_cfg = app.config.extra.get("focus") if fmt == "focus" else None
    scheme = focus_cfg.get("invoice_id", DEFAULT_INVOICE_SCHEME) if isinstance(focus_cfg, dict) \
        else DEFAULT_INVOICE_SCHEME
    try:
        check_invoice_scheme(str(scheme))
    except InvoiceSchemeError as exc:
        raise UserError(f"{app.config.path or 'config'}: {exc}") from None
    import pyarrow as pa

    # Arrow's buffers from the C allocator, as numpy's are: memory Arrow frees while the month is read into
    # the statement's frames is reused by them instead of held in mimalloc's pool (≈ 5 % less peak at 200,000
    # receipts, and no slower).
    pa.set_memory_pool(pa.system_memory_pool())
    to_stdout = out is not None and str(out) == "-"
    if to_stdout and fmt in ("pdf", "parquet"):
        raise UserError(f"--out -: a {fmt} file cannot go to stdout; name a file")
    path = None if to_stdout else (out or Path(default_name(month, fmt, tenant)))
    bar = Progress(f"export {month}", quiet=quiet or as_json)
    try:
        if to_stdout:
            import tempfile

            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d) / "out"
                st = export_file(app.engine(), month, fmt, tmp, tenant=tenant, as_of=as_of, aliaser=aliaser,
                                 progress=bar, invoice_scheme=scheme)
                bar.close()
                sys.stdout.write(tmp.read_text())
            _record_export(app, month, tenant, fmt, st, as_of)
            return
        with output_file(path) as tmp:  # the target is replaced only by a complete file, never truncated
            st = export_file(app.engine(), month, fmt, tmp, tenant=tenant, as_of=as_of, aliaser=aliaser,
                             progress=bar, invoice_scheme=scheme)
    except ExportError as exc:
        raise UserError(str(exc)) from None
    except (OSError, OutputError) as exc:
        raise UserError(str(exc) if isinstance(exc, OutputError) else f"{path}: cannot write ({exc.strerror})") \
            from None
    finally:
        bar.close()
    _record_export(app, month, tenant, fmt, st, as_of)
    t = st.totals
    summary = {"month": month, "format": fmt, "out": str(path), "tenant": tenant, "empty": st.empty,
               "runs": t["runs"], "corrections": t["corrections"], "paid_gpu_hours": round(t["paid"], 6),
               "delivered_gpu_hours": round(t["delivered"], 6), "billed": cents(t["billed"]),
               "currency": ",".join(t["currencies"]) or None,
               "ledger": {"through_seq": st.through_seq, "head_hash": st.head_hash}, "notes": st.notes}
    if as_json:
        emit_json(summary)
        return
    for note in st.notes:
        echo(note, err=True)
    echo(f"{path}: {t['runs']} runs, {t['paid']:.2f} GPU-hours paid, {t['delivered']:.2f} delivered, "
               f"billed {cents(t['billed']):.2f} {summary['currency'] or ''} "
               f"(ledger seq {st.through_seq}, head {st.head_hash[:16]})")


def _record_export(app: AppContext, month: str, tenant: str | None, fmt: str, st, as_of: int | None) -> None:  # noqa: ANN001
    """A statement that left the ledger closes its month to repricing (a ``statement_exported`` entry;
    ledger/chain/closed.py). An ``--as-of`` export reproduces an earlier one and records nothing."""
    if as_of is not None or st.empty:
        return
    from sqlalchemy.exc import SQLAlchemyError

    from ..chain.closed import statement_exported_entry
    from ..chain.entries import Kind
    from ..chain.store import append, iter_entries

    engine = app.engine()
    for ce in iter_entries(engine, kinds=[Kind.STATEMENT_EXPORTED]):
        d = ce.entry.data
        if (d.get("month"), d.get("tenant"), d.get("through_seq")) == (month, tenant, st.through_seq):
            return  # this very statement was exported before (in this or another format)
    try:
        append(engine, [statement_exported_entry(month, tenant, fmt, st.through_seq, st.head_hash)])
    except SQLAlchemyError as exc:  # e.g. a read-only role: the file is written, the month is not closed
        raise UserError(f"the {month} statement was written, but its export could not be recorded in the "
                        f"ledger ({type(exc).__name__}): the month is not closed to repricing") from None


def register(cli: click.Group) -> None:
    cli.add_command(export_group)
