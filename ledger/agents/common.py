"""Helpers the agents share: before/during/after evidence, window merging, pricing a slice of samples."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from .data import Dataset
from .model import Evidence

DAY = 86400.0
HOUR = 3600.0


def label_equals(frame: pd.DataFrame) -> Callable[[str, object], np.ndarray]:
    """``frame[col] == value`` as a boolean array, for many values of a few label columns (device, job, node,
    rack: Python strings, compared one by one by pandas): each column factorized once, on first use, and its
    codes compared. Missing labels (None, NaN) equal nothing, as with ``==``. tests/test_agents_label_equals.py
    holds it to ``==``."""
    seen: dict[str, tuple[np.ndarray, dict]] = {}

    def equals(col: str, value: object) -> np.ndarray:
        got = seen.get(col)
        if got is None:
            codes, uniques = pd.factorize(frame[col])
            got = seen[col] = (codes, {u: k for k, u in enumerate(uniques)})
        codes, code_of = got
        k = code_of.get(value)
        return codes == k if k is not None else np.zeros(len(codes), dtype=bool)
    return equals


def before_during_after(t: np.ndarray, v: np.ndarray, start: float, end: float, stat: str = "median",
        max_side: float = DAY) -> tuple[float | None, float | None, float | None]:
    """A statistic of v before [start-L, start), during [start, end) and after [end, end+L); L <= max_side."""
    side = min(max(end - start, 3600.0), max_side)
    out = []
    for a, b in ((start - side, start), (start, end), (end, end + side)):
        m = (t >= a) & (t < b) & ~np.isnan(v)
        if not m.any():
            out.append(None)
            continue
        x = v[m]
        out.append(float({"median": np.median, "mean": np.mean, "max": np.max, "p95": lambda y: np.percentile(y, 95),
                          "sum": np.sum}[stat](x)))
    return tuple(out)  # type: ignore[return-value]


def evidence(frame: pd.DataFrame, col: str, signal: str, unit: str, start: float, end: float,
             stat: str = "median", reference: float | None = None, reference_label: str | None = None,
             note: str = "") -> Evidence:
    t = frame["t"].to_numpy(float)
    v = frame[col].to_numpy(float)
    b, d, a = before_during_after(t, v, start, end, stat)
    return Evidence(signal, unit, b, d, a, reference, reference_label, note)


def windows(flag_t: np.ndarray, width: float, merge_gap: float, min_len: float) -> list[tuple[float, float]]:
    """Merge flagged bin starts (sorted) into windows; bins closer than merge_gap join; short windows drop."""
    if len(flag_t) == 0:
        return []
    flag_t = np.sort(flag_t)
    out = []
    a, b = flag_t[0], flag_t[0] + width
    for x in flag_t[1:]:
        if x - b <= merge_gap:
            b = x + width
        else:
            out.append((a, b))
            a, b = x, x + width
    out.append((a, b))
    return [(float(x), float(y)) for x, y in out if y - x >= min_len]


def price(ds: Dataset, frame: pd.DataFrame, col: str) -> float:
    """Money for the GPU-hours in ``col`` of these samples, at each run's tenant and SKU rate."""
    return prices(ds, frame, (col,))[col]


def prices(ds: Dataset, frame: pd.DataFrame, cols: tuple[str, ...]) -> dict[str, float]:
    """:func:`price` of several columns of the same samples, grouped once (the same sums, in the same order)."""
    if not len(frame):
        return {c: 0.0 for c in cols}
    g = frame.groupby([frame["tenant"].fillna("-"), frame["sku"].fillna("-")], dropna=False)[list(cols)].sum()
    rates = [ds.rate(None if ten == "-" else ten, None if sku == "-" else sku) for ten, sku in g.index]
    out = {}
    for c in cols:
        total = 0.0
        for hours, rate in zip(g[c].tolist(), rates):
            total += hours * rate
        out[c] = float(total)
    return out


def fmt_h(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def fmt_ts(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%a %d %b %H:%M")
