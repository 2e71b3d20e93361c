"""Exported statements close their month to repricing: the ``statement_exported`` entry and what it closes.

``ipledger export monthly`` records a ``statement_exported`` entry (an operator's act, never a spool's:
``ledger.ingest.intake.SPOOL_KINDS`` does not hold it) naming the month, the tenant (None: every tenant), the
format and the ledger cut the statement was computed from. A month with such an entry is *closed*: a new
contract never changes the receipts of a run billed in it unless the operator says so (``ipledger issue
--reprice-closed --yes``); other corrections (late telemetry, adjustments, gap resolutions) are re-issued as
before and booked in the next statement as corrections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from .canonical import now_ts
from .entries import ChainedEntry, Entry, Kind, make_entry
from ..base.periods import months_spanned

SOURCE = "ipledger.export"


def statement_exported_entry(month: str, tenant: str | None, fmt: str, through_seq: int, head_hash: str,
                             ts: str | None = None) -> Entry:
    """The entry recording that ``month``'s statement (of ``tenant``, or every tenant) was exported."""
    return make_entry(Kind.STATEMENT_EXPORTED, ts or now_ts(),
                      {"month": month, "tenant": tenant, "format": fmt, "through_seq": int(through_seq),
                       "head_hash": head_hash}, source=SOURCE)


@dataclass(frozen=True)
class ClosedMonths:
    """Months whose statement was exported: month -> the tenants exported (None in the set: all of them)."""

    months: Mapping[str, frozenset]

    def closes(self, month: str, tenant: str | None) -> bool:
        ts = self.months.get(month)
        return ts is not None and (None in ts or tenant in ts)

    def closed_parts(self, start: float, end: float, tenant: str | None) -> list[str]:
        """The closed months among those a run's window ``[start, end)`` is billed in (its start's month
        for an empty window)."""
        return [m for m, _lo, _hi in months_spanned(start, end) if self.closes(m, tenant)]


def closed_months(entries: Iterable[ChainedEntry]) -> ClosedMonths:
    out: dict[str, set] = {}
    for ce in entries:
        if ce.entry.kind != Kind.STATEMENT_EXPORTED:
            continue
        d = ce.entry.data
        out.setdefault(str(d.get("month")), set()).add(d.get("tenant"))
    return ClosedMonths({m: frozenset(t) for m, t in out.items()})


def read_closed(engine_or_conn) -> ClosedMonths:  # noqa: ANN001
    """The closed months of the ledger at its head."""
    from .store import iter_entries

    return closed_months(iter_entries(engine_or_conn, kinds=[Kind.STATEMENT_EXPORTED]))
