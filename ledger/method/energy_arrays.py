"""The energy method's speed trick, in one place: a device's counter spans as columns instead of objects.

A receipt of a long run reads tens of thousands of counter readings per device; building one
:class:`~ledger.method.energy.EnergySpan` per pair of readings, and splitting each over buckets and clock hours
in a Python loop, costs more than the rest of the receipt. For the ordinary case — readings strictly increasing
in time and in count (no reset, wrap, frozen or repeated reading) — :func:`counter_arrays` keeps the counter
spans as arrays (:class:`SpanArrays`), with the spans before the first and after the last reading as the plain
method builds them; any other device is left to :func:`ledger.method.energy.device_energy` (None).

Every figure is computed with the reference's arithmetic in the reference's order, so it is the same float to
the bit: element-wise operations are IEEE-exact either way, and each sum adds left to right
(:func:`array_in_order_sum`, a running sum, held bit for bit to the reference's
:func:`ledger.proofcheck.in_order_sum`; or a plain Python loop, where the values are few). :func:`bucket_energy` and :func:`energy_by_hour` take either form;
:func:`bucket_energy` visits, for each bucket interval, only the spans it overlaps (found by binary search in the
time-ordered spans), so its cost is that of the spans plus the intervals, not their product.
tests/test_energy_arrays.py holds every figure, and the receipt's blocks, equal to the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..proofcheck import in_order_sum
from .carbon import hourly_kwh
from .energy import (J_PER_KWH, BucketEnergy, DeviceEnergy, EnergySpan, PowerSample, add_by_bucket, by_bucket,
                     power_integral)


def array_in_order_sum(values: np.ndarray, start: float = 0) -> float:
    """:func:`ledger.proofcheck.in_order_sum` of a float64 array, the same to the bit: numpy's running sum
    (``cumsum``) adds each element to the sum before it, left to right, where ``np.sum`` would add pairwise."""
    if not len(values):
        return start
    return float(np.cumsum(np.concatenate(([start], values)))[-1])


def by_time(t: np.ndarray, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
    """``t`` and ``cols`` in the order ``np.argsort(t, kind="stable")`` gives (equal times keep their order),
    returned as they are when already in it: the usual case, a sort saved."""
    if len(t) < 2 or bool(np.all(t[1:] >= t[:-1])):
        return (t, *cols)
    order = np.argsort(t, kind="stable")
    return (t[order], *(c[order] for c in cols))


@dataclass(frozen=True, eq=False)
class SpanArrays:
    """A device's spans: ``head`` (before the first reading), the counter spans as columns, ``tail`` (after the
    last reading). The same figures as the :class:`~ledger.method.energy.DeviceEnergy` of its :attr:`spans`."""

    device: str
    head: tuple[EnergySpan, ...]
    start: np.ndarray      # the counter spans: source "counter", no cause, joules known, end > start
    end: np.ndarray
    joules_each: np.ndarray
    tail: tuple[EnergySpan, ...]

    @property
    def spans(self) -> tuple[EnergySpan, ...]:
        """Every span as objects (what the reference builds)."""
        mid = tuple(EnergySpan(a, b, j, "counter") for a, b, j in
                    zip(self.start.tolist(), self.end.tolist(), self.joules_each.tolist()))
        return self.head + mid + self.tail

    @property
    def has_spans(self) -> bool:
        return bool(self.head or self.tail or len(self.start))

    @property
    def joules(self) -> float:
        acc = in_order_sum(s.joules for s in self.head if s.joules is not None)
        acc = array_in_order_sum(self.joules_each, acc)
        return in_order_sum((s.joules for s in self.tail if s.joules is not None), acc)

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH

    @property
    def unknown_seconds(self) -> float:
        return in_order_sum(s.end - s.start for s in (*self.head, *self.tail) if s.joules is None)

    @property
    def source(self) -> str:
        kinds = {s.source for s in (*self.head, *self.tail) if s.end > s.start}
        if len(self.start):
            kinds.add("counter")
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "unknown")


def _power_between(pt: np.ndarray, pw: np.ndarray, lo: float, hi: float) -> list[PowerSample]:
    """The power samples whose pairs can overlap [lo, hi] (the reference skips every other pair)."""
    i0 = max(int(np.searchsorted(pt, lo, "right")) - 1, 0)
    i1 = int(np.searchsorted(pt, hi, "left")) + 1
    return [PowerSample(t, w) for t, w in zip(pt[i0:i1].tolist(), pw[i0:i1].tolist())]


def _edge(pt: np.ndarray, pw: np.ndarray, lo: float, hi: float, cause: str, max_gap_s: float) -> list[EnergySpan]:
    """The reference's ``_power_span`` of [lo, hi] (see ledger.method.energy)."""
    if hi <= lo:
        return []
    j, cov = power_integral(_power_between(pt, pw, lo, hi), lo, hi, max_gap_s)
    if cov <= 0:
        return [EnergySpan(lo, hi, None, "unknown", f"{cause}+no_power")]
    if cov >= (hi - lo) * (1 - 1e-9):
        return [EnergySpan(lo, hi, j, "power_integral", cause)]
    mid = lo + cov
    return [EnergySpan(lo, mid, j, "power_integral", cause), EnergySpan(mid, hi, None, "unknown", f"{cause}+power_gap")]


def counter_arrays(device: str, t: np.ndarray, count: np.ndarray, pt: np.ndarray, pw: np.ndarray, start: float,
                   end: float, max_gap_s: float = 300.0) -> SpanArrays | None:
    """The device's spans over [start, end] from readings of 1 J per count (``t``, ``count``, NaN dropped) and
    power (``pt``, ``pw``, NaN dropped, sorted by time), or None when the readings are not the ordinary case."""
    keep = (t >= start) & (t <= end)
    if not keep.all():
        t, count = t[keep], count[keep]
    t, count = by_time(t, count)
    if len(t) < 2 or not (np.all(np.diff(t) > 0) and np.all(np.diff(count) > 0)):
        return None
    head = _edge(pt, pw, start, float(t[0]), "before_first_reading", max_gap_s)
    tail = _edge(pt, pw, float(t[-1]), end, "after_last_reading", max_gap_s)
    return SpanArrays(device, tuple(head), t[:-1], t[1:], count[1:] - count[:-1], tuple(tail))


def bucket_energy(energy: DeviceEnergy | SpanArrays, buckets) -> BucketEnergy:  # noqa: ANN001
    """:func:`ledger.method.energy.by_bucket` of either form, the same to the bit."""
    if not isinstance(energy, SpanArrays):
        return by_bucket(energy.spans, buckets)
    kwh: dict[str, float] = {}
    unk: dict[str, float] = {}
    add_by_bucket(kwh, unk, energy.head, buckets)
    s, e, j = energy.start, energy.end, energy.joules_each
    length = e - s
    assigned = np.zeros(len(s))
    # name -> (first span, bucket position, span indices, contributions) of each interval the spans overlap
    hits: dict[str, list[tuple[int, int, np.ndarray, np.ndarray]]] = {}
    for k, (b0, b1, name) in enumerate(buckets):
        hits.setdefault(name, [])
        # the spans are in time order and touch end to start: those overlapping [b0, b1] are one run of them
        i0, i1 = int(np.searchsorted(e, b0, "right")), int(np.searchsorted(s, b1, "left"))
        if i1 <= i0:
            continue
        ov = np.minimum(e[i0:i1], b1) - np.maximum(s[i0:i1], b0)
        hit = ov > 0
        if hit.all():
            idx: np.ndarray | slice = slice(i0, i1)
            first = i0
        else:
            idx = np.arange(i0, i1)[hit]
            if not len(idx):
                continue
            ov, first = ov[hit], int(idx[0])
        assigned[idx] += ov          # bucket by bucket within a span, as the reference adds
        hits[name].append((first, k, idx, j[idx] * ov / length[idx] / J_PER_KWH))
    rest = length - assigned
    left = np.flatnonzero(rest > 1e-9)
    if len(left):
        hits.setdefault("unassigned", []).append((int(left[0]), len(buckets), left,
                                                  j[left] * rest[left] / length[left] / J_PER_KWH))
    for name, found in hits.items():
        if not found:
            continue
        # span by span, then interval by interval within a span: the reference's order of additions
        found.sort(key=lambda h: (h[0], h[1]))
        vals = np.concatenate([h[3] for h in found]) if len(found) > 1 else found[0][3]
        if len(found) > 1:
            idx = np.concatenate([np.arange(len(s))[h[2]] for h in found])
            if not bool(np.all(idx[1:] > idx[:-1])):   # a span in several of the intervals
                vals = vals[np.lexsort((np.concatenate([np.full(len(h[3]), h[1]) for h in found]), idx))]
        kwh[name] = array_in_order_sum(vals, kwh.get(name, 0.0))
    add_by_bucket(kwh, unk, energy.tail, buckets)
    return BucketEnergy(kwh, unk)


def energy_by_hour(energy: DeviceEnergy | SpanArrays) -> dict[int, float]:
    """:func:`ledger.method.carbon.hourly_kwh` of either form, the same to the bit.

    Each counter span's part in the hour it starts in is computed for all spans at once (the reference's
    arithmetic, element-wise); the few spans that run past that hour add their later parts one by one. The spans
    touch end to start in time order, so each hour's parts are: the one span running into it from before (if
    any), then the spans starting in it, in order; they are added in that order, as the reference adds them
    (a plain Python sum: a receipt's device has a few hundred spans, where numpy's per-call cost dominates)."""
    if not isinstance(energy, SpanArrays):
        return hourly_kwh(energy.spans)
    s, e, j = energy.start, energy.end, energy.joules_each
    if len(s) > 1 and not (bool(np.all(s[1:] == e[:-1])) and bool(np.all(e > s))):
        return hourly_kwh(energy.spans)   # not spans touching in time order: the reference's own walk
    out = hourly_kwh(energy.head)
    if len(s):
        whole = np.floor(s).astype(np.int64)     # int(start) of a positive epoch
        h = whole - whole % 3600
        first = (j * (np.minimum(e, h + 3600) - np.maximum(s, h)) / (e - s) / J_PER_KWH).tolist()
        later: dict[int, float] = {}   # hour -> the part of the span that runs into it from an earlier hour
        for i in np.flatnonzero(e > h + 3600).tolist():
            a, b, jj, hh = float(s[i]), float(e[i]), float(j[i]), int(h[i]) + 3600
            while hh < b:
                later[hh] = jj * (min(b, hh + 3600) - max(a, hh)) / (b - a) / J_PER_KWH
                hh += 3600
        cuts = (np.flatnonzero(h[1:] != h[:-1]) + 1).tolist()
        starting = dict(zip(h[[0, *cuts]].tolist(), zip([0, *cuts], [*cuts, len(first)])))
        for hour in sorted(starting.keys() | later.keys()):
            acc = out.get(hour, 0.0)
            if hour in later:
                acc += later[hour]
            lo, hi = starting.get(hour, (0, 0))
            for v in first[lo:hi]:
                acc += v
            out[hour] = acc
    return hourly_kwh(energy.tail, out)
