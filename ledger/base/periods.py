"""Billing periods: half-open UTC months and days, and the exact split of a receipt's figures over them.

Every period is ``[start, end)``: the instant 2026-12-01T00:00:00Z belongs to December, so a run whose
window ends at that instant paid its last second in November. A window ``[s, e)`` with ``e > s`` is placed
by its last paid instant (just before ``e``); an empty or end-less window by its start.

Under the default period rule (``split``) a receipt's figures are allocated to the months (and, in FOCUS,
to the days) its window overlaps, in proportion to the seconds of the window in each, in whole nano-units
(1e-9 GPU-hour, 1e-9 of the currency) by the largest-remainder method: the parts are exact to the
nanohour and sum to the receipt's figure exactly. Under ``end`` (sites that invoice on completion) the whole
receipt belongs to the month its window ends in, and a receipt of a still-open run belongs nowhere yet.
"""

from __future__ import annotations

import datetime as dt
import math
import re

PERIOD_RULES = ("split", "end")
DEFAULT_PERIOD_RULE = "split"
NANO = 1_000_000_000
_UTC = dt.timezone.utc
_MONTH_RE = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class PeriodError(ValueError):
    """A month that is not ``YYYY-MM`` or that has no following month to end it (one line)."""


def month_bounds(month: str) -> tuple[dt.datetime, dt.datetime]:
    """[first instant, first instant of the next month) in UTC for ``YYYY-MM`` (years 0001 to 9998, and
    9999-01 to 9999-11: 9999-12 has no next month to end it)."""
    m = _MONTH_RE.match(month or "")
    if not m:
        raise PeriodError(f"--month {month!r}: expected YYYY-MM, e.g. 2026-11")
    y, mo = int(m.group(1)), int(m.group(2))
    try:
        start = dt.datetime(y, mo, 1, tzinfo=_UTC)
        end = dt.datetime(y + (mo == 12), mo % 12 + 1, 1, tzinfo=_UTC)
        start.timestamp(), end.timestamp()
    except (ValueError, OverflowError):
        raise PeriodError(f"--month {month!r}: out of range (0001-01 to 9999-11)") from None
    return start, end


def calendar_month(start: float, end: float) -> str | None:
    """"YYYY-MM" when [start, end) is exactly one UTC calendar month, else None."""
    a = dt.datetime.fromtimestamp(start, _UTC)
    if (a.day, a.hour, a.minute, a.second, a.microsecond) != (1, 0, 0, 0, 0):
        return None
    nxt = (a.replace(year=a.year + 1, month=1) if a.month == 12 else a.replace(month=a.month + 1)).timestamp()
    return a.strftime("%Y-%m") if abs(end - nxt) < 1e-6 else None


def month_of(epoch: float) -> str:
    """The month containing the instant ``epoch`` (a month starts at its first instant)."""
    return dt.datetime.fromtimestamp(epoch, tz=_UTC).strftime("%Y-%m")


def placement(start: float, end: float) -> float:
    """The instant that places a window in one period: its last paid instant (half-open ``[start, end)``),
    or its start when it is empty or has no end. NaN when it has neither."""
    if math.isnan(end) or not end > start:
        return start if not math.isnan(start) else end
    # the last microsecond of the window (the clock's resolution: datetime rounds finer values)
    return max(start, end - 1e-6)


def billing_month(start: float, end: float) -> str | None:
    t = placement(start, end)
    return None if math.isnan(t) else month_of(t)


def months_spanned(start: float, end: float) -> list[tuple[str, float, float]]:
    """``(month, lo, hi)`` for every month the window ``[start, end)`` overlaps, in order; an empty or
    end-less window gives its start's month with ``lo == hi``."""
    if math.isnan(start):
        m = billing_month(start, end)
        return [] if m is None else [(m, end, end)]
    if math.isnan(end) or not end > start:
        return [(month_of(start), start, start)]
    out = []
    lo = start
    while lo < end:
        m = month_of(lo)
        hi = min(month_bounds(m)[1].timestamp(), end)
        out.append((m, lo, hi))
        lo = hi
    return out


def days_spanned(lo: float, hi: float) -> list[tuple[float, float]]:
    """``(day_lo, day_hi)`` for every UTC day the window ``[lo, hi)`` overlaps (the window itself when empty)."""
    if not hi > lo:
        return [(lo, hi)]
    out = []
    t = lo
    while t < hi:
        nxt = min((math.floor(t / 86400.0) + 1) * 86400.0, hi)
        out.append((t, nxt))
        t = nxt
    return out


def weights_of(spans: list[tuple[float, float]]) -> list[int]:
    """Integer weights (milliseconds) of each span; a window without length puts everything in its first."""
    w = [max(int(round((hi - lo) * 1000)), 0) for lo, hi in spans]
    if not sum(w):
        w = [1] + [0] * (len(w) - 1)
    return w


def split_int(n: int, weights: list[int]) -> list[int]:
    """The integer ``n`` split in proportion to ``weights`` by largest remainder (ties to the earlier part):
    the parts sum to ``n`` exactly; zero weights everywhere put it all in the first part."""
    if not sum(weights):
        weights = [1] + [0] * (len(weights) - 1)
    sign = -1 if n < 0 else 1
    n = abs(n)
    total = sum(weights)
    base = [n * w // total for w in weights]
    order = sorted(range(len(weights)), key=lambda k: (-(n * weights[k] % total), k))
    for k in order[:n - sum(base)]:
        base[k] += 1
    return [sign * b for b in base]


def split_nano(value: float, weights: list[int]) -> list[float]:
    """``value`` in whole nano-units split by :func:`split_int`: the parts' nano-units sum exactly to the
    value's."""
    if value != value or value in (math.inf, -math.inf):
        return [value] + [0.0] * (len(weights) - 1)
    return [b / NANO for b in split_int(int(round(value * NANO)), weights)]


def part_spans(start: float, end: float, rule: str, is_open: bool = False) -> list[tuple[str, float, float]]:
    """The billing parts of a receipt's window under ``rule``: ``(month, lo, hi)`` each."""
    if rule == "end":
        if is_open:
            return []
        m = billing_month(start, end)
        return [] if m is None else [(m, start, end)]
    return months_spanned(start, end)
