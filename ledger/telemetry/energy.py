"""A device's energy from its telemetry columns: the ``energy_j`` counter and ``power_w`` as the method reads them.

The importers and the collector already convert field 156 / NVML / amd-smi counters to joules when they store
``energy_j`` (docs/telemetry.md), so each stored reading is one count of 1 J here; NaN and None (not measured)
are dropped, never read as zero. :func:`device_energy_of` hands them to :func:`ledger.method.energy.device_energy`,
or, for the ordinary counter, keeps them as columns (:mod:`ledger.method.energy_arrays`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..method.energy import CounterReading, DeviceEnergy, PowerSample, device_energy
from ..method.energy_arrays import SpanArrays, by_time, counter_arrays


def _pairs(col: tuple[Sequence[float], Sequence[float]] | None) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) as floats, the readings whose time or value is NaN or None (not measured) dropped."""
    if col is None:
        return np.empty(0), np.empty(0)
    ts, vs = col
    t = np.asarray(ts, dtype="float64")
    v = np.asarray([np.nan if x is None else x for x in vs] if isinstance(vs, (list, tuple)) else vs,
                   dtype="float64")
    keep = ~(np.isnan(t) | np.isnan(v))
    return (t, v) if keep.all() else (t[keep], v[keep])


def device_energy_of(device: str, columns: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                     start: float, end: float, modulus_j: float | None = None) -> DeviceEnergy | SpanArrays:
    """``columns`` maps a Sample field to (times, values), as an import's ``Collected.series[device]``.

    The ordinary counter (readings rising in time and count) is kept as columns
    (:func:`ledger.method.energy_arrays.counter_arrays`, the same figures to the bit); any other device goes
    through the reference :func:`ledger.method.energy.device_energy`."""
    et, ev = _pairs(columns.get("energy_j"))
    pt, pw = _pairs(columns.get("power_w"))
    pt, pw = by_time(pt, pw)
    fast = counter_arrays(device, et, ev, pt, pw, start, end)
    if fast is not None:
        return fast
    readings = [CounterReading(t, v, 1.0, modulus_j) for t, v in zip(et.tolist(), ev.tolist())]
    power = [PowerSample(t, w) for t, w in zip(pt.tolist(), pw.tolist())]
    return device_energy(device, readings, start, end, power)
