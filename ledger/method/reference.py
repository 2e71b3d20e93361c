"""The attribution method as a plain loop over one device's samples: docs/method.md, "Per sample", as code.

:func:`attribute_device_reference` takes the same arguments as :func:`ledger.method.attribute_device` and
returns the same integers (buckets, gap shares, unknown causes, coarse time); it leaves out only the timeline
strip, which is a picture for the PDF and not part of any figure or hash. It is written for a reader holding
it against the document, one sample at a time, and is far too slow for receipts: the vectorised path in
:mod:`ledger.method.attribution` is what receipts use, and tests/test_method_reference.py proves the two equal
under hypothesis. The interval arithmetic both share (suspended and unknown spans, which are few per device)
and the final settling of the rounding residue are the same functions.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Sequence

import numpy as np

from .attribution import (
    B_UNKNOWN,
    BUCKETS,
    DEFAULT_THRESHOLDS,
    NH_PER_SECOND,
    REASON_BITS,
    THROTTLE_REASONS,
    DeviceAccount,
    SampleArrays,
    Thresholds,
    gap_portions,
    finish_account,
    paid_window,
)

_FLOAT_MAX = float(np.finfo(np.float64).max)


def sample_nh(seconds: float) -> int:
    """Seconds of one sample to whole nanohours, half up: floor(x * 1e9/3600 + 0.5) (docs/method.md)."""
    return math.floor(seconds * NH_PER_SECOND + 0.5)


def reason_of(mask: int) -> str:
    """The one throttle reason of a sample's clock-event bitmask, by the documented precedence."""
    if mask >= 0:
        for name, bits in REASON_BITS:
            if mask & bits:
                return name
    return "other"  # no known bit set, or the mask was not measured (-1)


def _finite(x: float) -> float:
    """A not-a-number as 0 and an infinity as the largest float (so a sample's end stays a number)."""
    if x != x:
        return 0.0
    return max(-_FLOAT_MAX, min(x, _FLOAT_MAX))


def _within(x: float, s: float, e: float) -> float:
    return min(max(x, s), e)


def _time_in(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b) inside the disjoint, sorted spans: the spans' measure up to b minus that up to a."""
    if not spans:
        return 0.0
    starts = [x for x, _ in spans]
    cum = [0.0]
    for x, y in spans:
        cum.append(cum[-1] + (y - x))

    def before(v: float) -> float:
        i = bisect_right(starts, v)
        if i == 0:
            return cum[0]
        x, y = spans[i - 1]
        return cum[i - 1] + min(max(v - x, 0.0), y - x)

    return max(before(b) - before(a), 0.0)


def attribute_device_reference(
    window: tuple[float, float],
    samples: SampleArrays | None = None,
    *,
    unknown: Sequence[tuple[float, float, str]] = (),
    suspended: Sequence[tuple[float, float]] = (),
    rated_clock_mhz: float | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> DeviceAccount:
    """One device's allocated window [start, end) in integer nanohours per bucket (no timeline strip)."""
    s, e, susp, paid_nh, suspended_nh = paid_window(window, suspended)   # paid = window minus suspended time

    if samples is None or not len(samples):
        portions, _ = gap_portions((s, e), susp, unknown)
        buckets = np.zeros(len(BUCKETS), dtype=np.int64)
        buckets[B_UNKNOWN] = paid_nh
        return DeviceAccount(paid_nh=paid_nh, buckets=buckets, suspended_nh=suspended_nh, gap_nh=portions,
                             unknown_causes={"field_missing": 0, "no_telemetry": paid_nh - sum(portions.values())},
                             fidelity="none", coarse_nh=0, timeline=None)

    rows = sorted(zip(samples.t.tolist(), samples.dt.tolist(), samples.activity.tolist(), samples.coarse.tolist(),
                      samples.sm_clock.tolist(), samples.reasons.tolist(), samples.procs.tolist(),
                      samples.fb_used.tolist()), key=lambda r: r[0])
    if any(r[0] != r[0] for r in rows):
        raise ValueError("a sample's time is not a number")

    # Each sample covers [t, min(t + dt, next t)) clipped to the window.
    spans = []
    for i, (t, dt, *_rest) in enumerate(rows):
        end = t + _finite(dt)
        if i + 1 < len(rows):
            end = min(end, rows[i + 1][0])
        spans.append((_within(t, s, e), _within(end, s, e)))

    # Unknown intervals: each gap's share, minus the time samples with a measured activity cover.
    measured = [(a, b) for (a, b), r in zip(spans, rows) if r[2] == r[2] and b - a > 0]
    portions, gaps = gap_portions((s, e), susp, unknown, (np.array([a for a, _ in measured]),
                                                          np.array([b for _, b in measured])))

    sums = {"delivered": 0, "under": 0, "starved": 0, "idle": 0, "field_missing": 0, "coarse": 0,
            **{f"thr{i}": 0 for i in range(len(THROTTLE_REASONS))}}
    for (a, b), (t, dt, act, coarse, clock, mask, procs, fb) in zip(spans, rows):
        present = act == act                       # an activity signal was measured
        covered = max(b - a, 0.0) - _time_in(susp, a, b)   # suspended time is not paid
        if not present:
            covered -= _time_in(gaps, a, b)        # a sample without activity yields to a gap
        covered = max(covered, 0.0)
        cov = sample_nh(covered)                   # rounded once; the parts are split from this integer
        if not present:
            sums["field_missing"] += cov           # unknown, cause field_missing: never read as zero
            continue
        activity = min(max(act, 0.0), 1.0)
        if coarse:
            sums["coarse"] += cov
        if activity < thresholds.active_min:       # not working: starved if a process holds the device
            fb_seen = fb if thresholds.resident_fb_mib >= 0 else _finite(fb)
            resident = procs > 0 or fb_seen > thresholds.resident_fb_mib
            sums["starved" if resident else "idle"] += cov
            continue
        busy = covered * activity
        active = min(sample_nh(busy), cov)
        if rated_clock_mhz:                        # clock ratio r = min(clock / rated, 1); unmeasured: 1
            ratio = clock / float(rated_clock_mhz)
            ratio = max(1.0 if ratio != ratio else min(ratio, 1.0), 0.0)
            delivered = min(sample_nh(busy * ratio), active)
        else:
            delivered = active
        sums["delivered"] += delivered
        if active - delivered:
            sums[f"thr{THROTTLE_REASONS.index(reason_of(mask))}"] += active - delivered
        sums["under"] += cov - active
    return finish_account(paid_nh, suspended_nh, portions, sums, None)
