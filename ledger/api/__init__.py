"""The library's entry points: each a whole piece of the ledger's work over a :class:`~ledger.ingest.site.Site`.

A Python caller does what the CLI does, with nothing of the CLI::

    from ledger import api
    from ledger.base.config import load
    from ledger.chain.db import make_engine
    from ledger.ingest.site import site_from_config

    site = site_from_config(load("/etc/ipledger/config.toml"))
    engine = make_engine(site.db, create=False)
    api.ship(site, engine)                                   # spool -> ledger, accounting, automatic receipts
    api.issue(site, engine, month="2026-11")                 # every closed run's receipt
    api.export_month(site, engine, "2026-11", "focus", "nov.focus.csv")   # the statement, recorded

Each builds what the step needs from the site (the after-ship steps, the accounting enricher, the SKU table,
the lens and carbon settings, the FOCUS InvoiceId scheme) and looks nothing up; each CLI command is its
options parsed, one of these called, and the result rendered. Heavy imports happen inside the functions, so
importing this package costs nothing.
May import: ``ledger.proofcheck``, ``ledger.base``, ``ledger.chain``, ``ledger.method``, ``ledger.telemetry``,
``ledger.importers``, ``ledger.capture``, ``ledger.ingest``, ``ledger.receipts``, ``reports``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..ingest.ship import ShipReport
    from ..ingest.site import Site
    from ..receipts.issue import IssueSummary

Progress = Callable[[int, int], None]


class ExportNotRecorded(RuntimeError):
    """The statement was written but its export could not be recorded (the month is not closed to repricing)."""


def ship(site: Site, engine: Engine, *, spool_dir: str | Path | None = None, receipts: bool = True,
         progress: Progress | None = None) -> ShipReport:
    """Ship the site's spool (or ``spool_dir``) into the ledger: the accounting (sacct) records of runs that
    ended where the site asks for them, then the automatic receipts of those runs unless ``receipts`` is
    false or the site turned them off. Raises :class:`~ledger.capture.spool.UnsafeSpool` for a spool another
    user could have written."""
    from ..ingest.ship import ship as ship_spool

    after: list = []
    if receipts and site.auto_receipts:
        from ..receipts.auto import after_ship_steps  # here: shipping without receipts need not import them

        after = after_ship_steps(site)
    enrich = site.accounting.enricher() if site.accounting is not None else None
    return ship_spool(engine, site.spool if spool_dir is None else spool_dir, progress=progress, after=after,
                      enrich=enrich)


def issue(site: Site, engine: Engine, *, month: str | None = None, include_open: bool = False,
          reprice_closed: bool = False, dry_run: bool = False, progress: Progress | None = None) -> IssueSummary:
    """Issue (or re-issue where changed) the receipt of every closed run whose window overlaps ``month``
    (YYYY-MM, UTC; None: every run), under the site's SKU table, lens and carbon settings. Idempotent.
    ``include_open``: runs still open too; ``reprice_closed``/``dry_run``: as ``ipledger issue``. Raises
    :class:`~ledger.base.periods.PeriodError` for a bad month."""
    from ..base.periods import month_bounds
    from ..receipts.issue import issue_runs, runs_to_issue

    period = None if month is None else tuple(b.timestamp() for b in month_bounds(month))
    keys = runs_to_issue(engine, period, include_open)
    return issue_runs(engine, keys, sku_table=site.sku_table, progress=progress, reprice_closed=reprice_closed,
                      dry_run=dry_run, lens=site.lens, carbon=site.carbon)


def export_month(site: Site, engine: Engine, month: str, fmt: str, path: str | Path, *, tenant: str | None = None,
                 as_of: int | None = None, aliaser: object = None, progress: Progress | None = None):  # noqa: ANN201
    """Write the month's tenant statement as ``fmt`` (csv, parquet, focus, json, pdf) to ``path`` (replaced only
    by a complete file), FOCUS InvoiceIds in the site's scheme; then record the export (a
    ``statement_exported`` entry: the month closes to repricing) unless ``as_of`` reproduces an earlier one.
    Returns the statement written (``totals``, ``notes``, ``empty``, ``through_seq``, ``head_hash``). Raises
    :class:`reports.monthly.ExportError`, :class:`~ledger.base.safeout.OutputError` or :class:`OSError` when
    nothing was written, :class:`ExportNotRecorded` when the file was written and the record was not."""
    from reports.statement_file import export_file

    from ..base.safeout import output_file

    with output_file(path) as tmp:  # the target is replaced only by a complete file, never truncated
        st = export_file(engine, month, fmt, tmp, tenant=tenant, as_of=as_of, aliaser=aliaser, progress=progress,
                         invoice_scheme=site.focus_invoice_scheme)
    record_export(engine, month, tenant, fmt, st, as_of)
    return st


def record_export(engine: Engine, month: str, tenant: str | None, fmt: str, st, as_of: int | None) -> bool:  # noqa: ANN001
    """A statement that left the ledger closes its month to repricing (a ``statement_exported`` entry;
    ledger/chain/closed.py); whether one was recorded now. An ``as_of`` export reproduces an earlier one and
    records nothing; so does an empty statement, or one exported before (in this or another format)."""
    if as_of is not None or st.empty:
        return False
    from sqlalchemy.exc import SQLAlchemyError

    from ..chain.closed import statement_exported_entry
    from ..chain.entries import Kind
    from ..chain.store import append, iter_entries

    for ce in iter_entries(engine, kinds=[Kind.STATEMENT_EXPORTED]):
        d = ce.entry.data
        if (d.get("month"), d.get("tenant"), d.get("through_seq")) == (month, tenant, st.through_seq):
            return False
    try:
        append(engine, [statement_exported_entry(month, tenant, fmt, st.through_seq, st.head_hash)])
    except SQLAlchemyError as exc:  # e.g. a read-only role: the file is written, the month is not closed
        raise ExportNotRecorded(f"the {month} statement was written, but its export could not be recorded in the "
                                f"ledger ({type(exc).__name__}): the month is not closed to repricing") from None
    return True
