"""Writing a month's statement to a file: what ``ipledger export monthly`` runs (the CLI is a thin shell over
:func:`export_file`, and ``bench.export`` times it in process).

A CSV is streamed from the receipt lines (:mod:`reports.long_csv`) where that answers the month; every other
format, and every month the stream declines, is built as a :class:`reports.export.Statement` and written by
:func:`reports.export.write`. Either way the file holds the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .alias import Aliaser
from . import export
from .long_csv import write_month_csv
from .monthly import month_bounds


def export_file(engine, month: str, fmt: str, path: str | Path, tenant: str | None = None,  # noqa: ANN001, PLR0913
                as_of: int | None = None, aliaser: Aliaser | None = None,
                progress: Callable[[int, int], None] | None = None, invoice_scheme: str | None = None):  # noqa: ANN201
    """Write the month's statement as ``fmt`` to ``path`` (``ipledger export monthly``'s work); returns what
    was written (its ``totals``, ``notes``, ``empty``, ``through_seq`` and ``head_hash``).

    A CSV is streamed from the receipt lines by :func:`reports.long_csv.write_month_csv` where that answers
    the month; everything else is :func:`reports.export.build_statement` then :func:`reports.export.write` (the
    same bytes)."""
    if fmt == "csv" and tenant is None and not (aliaser and aliaser.active):
        month_bounds(month)
        done = write_month_csv(engine, month, path, as_of=as_of, progress=progress)
        if done is not None:
            return done
    # through the module: what replaces reports.export's writer (a test's failing disk) replaces it here too
    st = export.build_statement(engine, month, tenant=tenant, as_of=as_of, aliaser=aliaser, progress=progress)
    export.write(st, fmt, path, invoice_scheme=invoice_scheme)
    return st
