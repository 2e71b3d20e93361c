"""Energy per run and device from the devices' cumulative energy counters (docs/method.md, "Energy").

Pure functions, no I/O. Input: a device's counter readings (raw counts with the joules one count stands for,
taken from the source and its field id: :func:`joules_per_count`) and its power samples; output: the
run window cut into spans, each with its joules and where they came from:

* ``counter``: the delta between two consecutive readings. A reading lower than the one before is a wrap
  (when the counter's modulus is known and the earlier reading was in its upper half) or a reset (driver
  reload, host engine restart): the delta restarts from the new value, so what the device drew between the
  earlier reading and the reset itself is not counted (a reset is bridged, never priced as negative).
* ``power_integral``: a counter that did not move while power says the device drew (mean power above
  ``frozen_min_w``) is frozen (amd-smi on some parts, ROCm/amdsmi#38); the span is priced by the trapezoid
  integral of power instead. The same when there are no counter readings at all, or before the first /
  after the last reading.
* ``unknown``: neither a counter nor power covers the span; its joules are ``None`` and it names the cause.
  Never zero, never TDP.

:func:`by_bucket` splits spans over a run's buckets (delivered / idle / suspended / unknown ...) in proportion
to time inside each span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..proofcheck import in_order_sum

J_PER_KWH = 3_600_000.0

# One count of each source's counter, in joules.
MJ = 1e-3
AMD_MI300_UNIT = 15.259e-6     # amd-smi energy accumulator, counter_resolution on MI300 (15.259 uJ)
UNIT_CHANGE_ROUNDING = 1e-14  # relative: a count converted to a new unit may read a few ulps lower, not a reset


class EnergyUnitError(ValueError):
    """A source/field/version whose counter unit is not known (a one-line message naming them)."""


def joules_per_count(source: str, field_id: int | None = None, resolution_uj: float | None = None) -> float:
    """Joules one raw count stands for, from the source and its field id (never from a version).

    * ``dcgm`` / ``dmon`` / ``dcgm-exporter`` field 156 ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: millijoules,
      in every DCGM and dcgm-exporter version; field 1611 ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL`` (DCGM 4.7):
      joules. NVIDIA gives a unit change a new field id rather than rescaling an old one.
    * ``nvml`` (``nvmlDeviceGetTotalEnergyConsumption``) and ``nvidia-smi`` ``total_energy_consumption``: mJ.
    * ``amd-smi``: the reported ``counter_resolution`` in µJ when given, else 15.259 µJ (MI300).
    """
    s = source.lower()
    if s in ("dcgm", "dcgmi", "dmon", "dcgm-exporter", "dcgm_exporter"):
        if field_id in (None, 156):
            return MJ
        if field_id == 1611:
            return 1.0
        raise EnergyUnitError(f"{source}: field {field_id} is not an energy counter (156 mJ, 1611 J)")
    if s in ("nvml", "nvidia-smi", "nvidia_smi"):
        return MJ
    if s in ("amd-smi", "amdsmi"):
        if resolution_uj is not None:
            if not resolution_uj > 0:
                raise EnergyUnitError(f"{source}: counter_resolution must be positive, got {resolution_uj!r}")
            return resolution_uj * 1e-6
        return AMD_MI300_UNIT
    raise EnergyUnitError(f"{source}: no known energy counter unit")


@dataclass(frozen=True, slots=True)
class CounterReading:
    t: float                   # epoch seconds
    count: float               # raw counter value
    joules_per_count: float    # the unit at this reading (a source upgrade may change it mid-run)
    modulus: float | None = None   # the counter wraps at this many counts, when known


@dataclass(frozen=True, slots=True)
class PowerSample:
    t: float
    watts: float


@dataclass(frozen=True, slots=True)
class EnergySpan:
    start: float
    end: float
    joules: float | None       # None: unknown
    source: str                # "counter" | "power_integral" | "unknown"
    cause: str = ""            # why not "counter" (frozen_counter, no_counter, counter_reset, wrap, no_power ...)

    @property
    def kwh(self) -> float | None:
        return None if self.joules is None else self.joules / J_PER_KWH


@dataclass(frozen=True, slots=True)
class DeviceEnergy:
    device: str
    spans: tuple[EnergySpan, ...]

    @property
    def joules(self) -> float:
        return in_order_sum(s.joules for s in self.spans if s.joules is not None)

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH

    @property
    def unknown_seconds(self) -> float:
        return in_order_sum(s.end - s.start for s in self.spans if s.joules is None)

    @property
    def has_spans(self) -> bool:
        return bool(self.spans)

    @property
    def source(self) -> str:
        """``counter``, ``power_integral``, ``unknown``, or ``mixed`` when spans differ."""
        kinds = {s.source for s in self.spans if s.end > s.start}
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "unknown")


def power_integral(power: Sequence[PowerSample], start: float, end: float,
                   max_gap_s: float = 300.0) -> tuple[float, float]:
    """(joules, covered seconds) of the trapezoid integral of power over [start, end].

    Consecutive samples further apart than ``max_gap_s`` leave their span uncovered; so does the time before
    the first and after the last sample.
    """
    joules = covered = 0.0
    for a, b in zip(power, power[1:]):
        if b.t <= a.t or b.t - a.t > max_gap_s or b.t <= start or a.t >= end:
            continue
        lo, hi = max(a.t, start), min(b.t, end)
        slope = (b.watts - a.watts) / (b.t - a.t)
        w_lo, w_hi = a.watts + slope * (lo - a.t), a.watts + slope * (hi - a.t)
        joules += (w_lo + w_hi) / 2 * (hi - lo)
        covered += hi - lo
    return joules, covered


def _power_span(power, start, end, cause, max_gap_s) -> list[EnergySpan]:
    if end <= start:
        return []
    j, cov = power_integral(power, start, end, max_gap_s)
    if cov <= 0:
        return [EnergySpan(start, end, None, "unknown", f"{cause}+no_power" if cause else "no_power")]
    if cov >= (end - start) * (1 - 1e-9):
        return [EnergySpan(start, end, j, "power_integral", cause)]
    # partly covered: the covered seconds are priced by power, the rest stays unknown; the two are kept as one
    # span each (the covered one first), so their lengths are right but not where inside the span each lies
    mid = start + cov
    return [EnergySpan(start, mid, j, "power_integral", cause),
            EnergySpan(mid, end, None, "unknown", f"{cause}+power_gap" if cause else "power_gap")]


def device_energy(device: str, readings: Iterable[CounterReading], start: float, end: float,
                  power: Iterable[PowerSample] = (), frozen_min_w: float = 5.0,
                  max_gap_s: float = 300.0, max_w: float = 2000.0) -> DeviceEnergy:
    """The device's energy over the run window [start, end], span by span (see the module docstring).

    Readings outside the window are ignored; the first and last reading inside it bound the counter's part.
    A fall that would be a wrap but implies more than ``max_w`` watts over its span is a reset: a reset from
    within ``max_w`` x span of the modulus cannot be told from a wrap, and is read as one.
    """
    rs = sorted((r for r in readings if start <= r.t <= end), key=lambda r: r.t)
    ps = sorted(power, key=lambda p: p.t)
    spans: list[EnergySpan] = []
    if not rs:
        spans += _power_span(ps, start, end, "no_counter", max_gap_s)
        return DeviceEnergy(device, tuple(spans))
    spans += _power_span(ps, start, rs[0].t, "before_first_reading", max_gap_s)
    for a, b in zip(rs, rs[1:]):
        if b.t <= a.t:
            continue
        ja, jb = a.count * a.joules_per_count, b.count * b.joules_per_count
        delta, cause = jb - ja, ""
        if delta < 0 and a.joules_per_count != b.joules_per_count and -delta <= UNIT_CHANGE_ROUNDING * ja:
            delta = 0.0   # the same joules in the new unit, less its rounding: nothing used, not a reset
        if delta < 0:
            m = a.modulus
            wrapped = (b.count + m - a.count) * b.joules_per_count if m else 0.0
            if (m and a.joules_per_count == b.joules_per_count and a.count > m / 2 and b.count < m / 2
                    and wrapped <= max_w * (b.t - a.t)):
                delta, cause = wrapped, "wrap"
            else:
                delta, cause = jb, "counter_reset"
        if delta == 0:
            pj, cov = power_integral(ps, a.t, b.t, max_gap_s)
            if cov > 0 and pj / cov > frozen_min_w:
                spans += _power_span(ps, a.t, b.t, "frozen_counter", max_gap_s)
                continue
        spans.append(EnergySpan(a.t, b.t, delta, "counter", cause))
    spans += _power_span(ps, rs[-1].t, end, "after_last_reading", max_gap_s)
    return DeviceEnergy(device, tuple(spans))


@dataclass(frozen=True, slots=True)
class BucketEnergy:
    kwh: dict[str, float]              # bucket -> kWh drawn during it
    unknown_gpu_hours: dict[str, float]  # bucket -> hours of it whose energy is unknown


def by_bucket(spans: Iterable[EnergySpan], buckets: Sequence[tuple[float, float, str]]) -> BucketEnergy:
    """Each span's energy split over the (start, end, bucket) intervals it overlaps, in proportion to time.

    Within one span power is taken as even (a counter delta says nothing finer); time a span's bucket
    intervals do not cover is the ``unassigned`` bucket, so the buckets always add up to the device's kWh.
    """
    kwh: dict[str, float] = {}
    unk: dict[str, float] = {}
    add_by_bucket(kwh, unk, spans, buckets)
    return BucketEnergy(kwh, unk)


def add_by_bucket(kwh: dict[str, float], unk: dict[str, float], spans: Iterable[EnergySpan],
                  buckets: Sequence[tuple[float, float, str]]) -> None:
    """:func:`by_bucket`'s sums, added span by span into ``kwh`` and ``unk`` (the loop itself)."""
    for s in spans:
        length = s.end - s.start
        if length <= 0:
            continue
        assigned = 0.0
        for b0, b1, name in buckets:
            ov = min(s.end, b1) - max(s.start, b0)
            if ov <= 0:
                continue
            assigned += ov
            _add(s, ov, length, name, kwh, unk)
        if length - assigned > 1e-9:
            _add(s, length - assigned, length, "unassigned", kwh, unk)


def _add(s: EnergySpan, ov: float, length: float, name: str, kwh: dict, unk: dict) -> None:
    if s.joules is None:
        unk[name] = unk.get(name, 0.0) + ov / 3600.0
        kwh.setdefault(name, 0.0)
    else:
        kwh[name] = kwh.get(name, 0.0) + s.joules * ov / length / J_PER_KWH


def summary_energy(device: str, joules: float | None, power_avg_w: float | None, start: float, end: float,
                   frozen_min_w: float = 5.0) -> DeviceEnergy:
    """A device's energy from a job summary (``dcgmi stats -v -j``: Energy Consumed and average power).

    The record's energy is used when positive (``source = "job_record"``). A zero or missing energy while the
    average power says the device drew (DCGM 2.x reports 0 J on some parts) is average power x duration,
    ``source = "power_integral"`` (cause ``job_record_zero`` / ``no_counter``); with neither, unknown.
    """
    if end <= start:
        return DeviceEnergy(device, ())
    if joules is not None and joules > 0:
        return DeviceEnergy(device, (EnergySpan(start, end, float(joules), "job_record"),))
    cause = "job_record_zero" if joules is not None else "no_counter"
    if power_avg_w is not None and power_avg_w > frozen_min_w:
        return DeviceEnergy(device, (EnergySpan(start, end, power_avg_w * (end - start), "power_integral", cause),))
    if joules is not None and power_avg_w is not None:   # a zero that power agrees with: nothing drawn
        return DeviceEnergy(device, (EnergySpan(start, end, 0.0, "job_record"),))
    return DeviceEnergy(device, (EnergySpan(start, end, None, "unknown", f"{cause}+no_power"),))
