"""Each sample's ``fp_ops`` from cumulative op counters (AMD's TOTAL_16/32/64_OPS): pure, no I/O.

A sample at instant t_i stands for [t_i, t_i+1) (docs/telemetry.md, "Timelines"), so its ``fp_ops`` is the sum
over the counters of C(t_i+1) − C(t_i). A counter lower than its previous reading was reset (exporter or
profiler restart): the interval counts the new reading, the ops since the reset (bridged, never negative, the
ops before the reset in that interval not counted). An interval longer than ``tolerance_factor`` cadences is a
hole: unknown (NaN), as the timeline makes it. The last reading opens no interval: NaN. A series that falls
more often than resets can explain (more than one fall and more than a tenth of its intervals) is no
cumulative counter: no ``fp_ops`` is derived from it, and :func:`fp_ops` says why.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

MAX_FALL_SHARE = 0.1


def fp_ops(counters: Mapping[str, tuple[np.ndarray, np.ndarray]], tolerance_factor: float = 3.0
           ) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(times, fp_ops per interval starting there, None) — or empty arrays and why none can be derived."""
    empty = np.empty(0)
    if not counters:
        return empty, empty, "no op counter"
    cols = {k: (np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)) for k, (t, v) in counters.items()}
    times = np.unique(np.concatenate([t for t, _ in cols.values()]))
    n = times.size
    if n < 2:
        return empty, empty, "fewer than two readings"
    total = np.zeros(n - 1)
    for name, (t, v) in sorted(cols.items()):
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        full = np.full(n, np.nan)
        full[np.searchsorted(times, t)] = v     # a repeated instant keeps its last reading
        d = np.diff(full)
        falls = int(np.count_nonzero(d < 0))
        if falls > 1 and falls > MAX_FALL_SHARE * np.count_nonzero(d == d):
            return empty, empty, (f"{name} falls in {falls} of {np.count_nonzero(d == d)} intervals: not a "
                                  f"cumulative counter, no op count derived")
        total += np.where(d < 0, full[1:], d)   # a reset: the ops since it (NaN stays NaN)
    step = np.diff(times)
    pos = step[step > 0]
    cadence = float(np.median(pos)) if pos.size else 0.0
    total[step > tolerance_factor * cadence] = np.nan
    return times, np.append(total, np.nan), None
