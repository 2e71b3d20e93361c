"""Adjustments and gap resolutions: corrections recorded as their own entries, never edits of usage.

``adjustment`` credits or debits a run by GPU-hours (``2.5h``) or an amount (``120.00``, in the contract's
currency); ``gap_resolution`` decides how one unknown_interval is billed (charge | credit | estimate).
Both name who and why and reference what they adjust (docs/receipts.md).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from .canonical import now_ts
from .entries import ChainedEntry, Entry, Kind, make_entry

RESOLUTIONS = ("charge", "credit", "estimate")
# Absolute ceilings, before any run is looked at: beyond them a figure is a typo (or an attack on the
# receipts' arithmetic), not an adjustment. The per-run bound is :func:`check_bound`'s.
MAX_HOURS = Decimal(10) ** 9
MAX_AMOUNT = Decimal(10) ** 12
# An adjustment is at most the run's paid GPU-hours (or paid cost) times this; above 1, since a fee (a debit
# for support time) can exceed the usage. Sites set max_adjustment_factor in their config.
DEFAULT_MAX_FACTOR = 10.0
_HOURS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*h\s*$", re.IGNORECASE)


class AdjustmentError(ValueError):
    """Bad adjustment input, phrased as one line naming the field."""


def parse_quantity(text: str) -> tuple[str, Decimal]:
    """``"2.5h"`` -> ("hours", 2.5); ``"120.00"`` -> ("amount", 120.00). Must be positive."""
    m = _HOURS.match(text)
    try:
        if m:
            kind, value = "hours", Decimal(m.group(1))
        else:
            kind, value = "amount", Decimal(text.strip())
    except InvalidOperation:
        raise AdjustmentError(f"quantity {text!r}: expected hours like 2.5h or an amount like 120.00") from None
    if not value.is_finite() or value <= 0:
        raise AdjustmentError(f"quantity {text!r}: must be a positive number")
    if value > (MAX_HOURS if kind == "hours" else MAX_AMOUNT):
        raise AdjustmentError(f"quantity {text[:40]!r}: larger than any run could be adjusted by")
    if kind == "amount" and value != value.quantize(Decimal("0.01")):
        raise AdjustmentError(f"quantity {text!r}: an amount has at most 2 decimals")
    return kind, value


def check_bound(quantity: str, paid_hours: float, paid_cost: float, factor: float) -> None:
    """Refuse an adjustment larger than ``factor`` times what the run was paid (GPU-hours for ``2.5h``, money
    for an amount): the site's ``max_adjustment_factor``, so a mistyped figure cannot make a bill absurd."""
    kind, value = parse_quantity(quantity)
    paid = Decimal(repr(paid_hours if kind == "hours" else paid_cost))
    limit = paid * Decimal(repr(factor))
    if value > limit:
        unit = "GPU-hours" if kind == "hours" else "in the contract's currency"
        raise AdjustmentError(f"quantity {quantity!r}: more than {factor:g} x the run's paid {paid} {unit} "
                              f"(max_adjustment_factor in the site config)")


def adjustment_entry(*, cluster: str | None, job_id: str, run: int, direction: str, quantity: str,
                     reason: str, by: str, references: list[str] | None = None, ts: str | None = None) -> Entry:
    if direction not in ("credit", "debit"):
        raise AdjustmentError(f"direction must be credit or debit, got {direction!r}")
    if not reason.strip():
        raise AdjustmentError("--reason is required and must not be empty")
    if not by.strip():
        raise AdjustmentError("--by is required and must not be empty")
    kind, value = parse_quantity(quantity)
    payload = {"direction": direction, kind: str(value), "reason": reason, "by": by,
               "references": sorted(references or [])}
    return make_entry(Kind.ADJUSTMENT, ts or now_ts(), payload, cluster=cluster, job_id=job_id, run=run,
                      source="ipledger.adjust")


def resolution_entry(gap: ChainedEntry, *, resolution: str, reason: str, by: str,
                     job: tuple[str | None, str, int] | None = None, ts: str | None = None) -> Entry:
    """Resolve one unknown_interval (its entry_id is the gap id). ``job`` keys the entry to a run when the
    gap itself carries none (importer gaps are per device)."""
    if gap.entry.kind != Kind.UNKNOWN_INTERVAL:
        raise AdjustmentError(f"{gap.entry.entry_id} is a {gap.entry.kind} entry, not an unknown_interval")
    if resolution not in RESOLUTIONS:
        raise AdjustmentError(f"--as must be one of {', '.join(RESOLUTIONS)}, got {resolution!r}")
    if not reason.strip() or not by.strip():
        raise AdjustmentError("--reason and --by are required and must not be empty")
    cluster, job_id, run = (gap.entry.cluster, gap.entry.job_id, gap.entry.run)
    if job_id is None and job is not None:
        cluster, job_id, run = job
    payload = {"gap_id": gap.entry.entry_id, "gap_seq": gap.seq, "resolution": resolution, "reason": reason,
               "by": by}
    return make_entry(Kind.GAP_RESOLUTION, ts or now_ts(), payload, cluster=cluster, job_id=job_id, run=run,
                      device=gap.entry.device, source="ipledger.resolve")
