"""A device's energy from its telemetry columns: the ``energy_j`` counter and ``power_w`` as the method reads them.

The importers and the collector already convert field 156 / NVML / amd-smi counters to joules when they store
``energy_j`` (docs/telemetry.md), so each stored reading is one count of 1 J here; NaN and None (not measured)
are dropped, never read as zero. :func:`device_energy_of` hands them to :func:`ledger.method.energy.device_energy`.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from ..method.energy import CounterReading, DeviceEnergy, PowerSample, device_energy


def _pairs(col: tuple[Sequence[float], Sequence[float]] | None) -> Iterable[tuple[float, float]]:
    if col is None:
        return ()
    ts, vs = col
    return ((float(t), float(v)) for t, v in zip(ts, vs)
            if v is not None and not math.isnan(float(v)) and not math.isnan(float(t)))


def device_energy_of(device: str, columns: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                     start: float, end: float, modulus_j: float | None = None) -> DeviceEnergy:
    """``columns`` maps a Sample field to (times, values), as an import's ``Collected.series[device]``."""
    readings = [CounterReading(t, v, 1.0, modulus_j) for t, v in _pairs(columns.get("energy_j"))]
    power = [PowerSample(t, v) for t, v in _pairs(columns.get("power_w"))]
    return device_energy(device, readings, start, end, power)
