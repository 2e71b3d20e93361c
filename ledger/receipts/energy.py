"""A receipt's energy and carbon blocks and their text lines (docs/receipts.md, "Energy and carbon").

Pure: from each device's :class:`ledger.method.energy.DeviceEnergy`, its bucket intervals, its TDP and its
paid GPU-hours, with the contract's cost basis and the site's intensity table, build

* ``energy`` = ``{kwh, source, by_bucket, unknown_gpu_hours, cost}``, ``cost`` = ``{currency, basis,
  charged, measured, tdp}`` (the charged line and what TDP pricing would have charged beside it);
* ``carbon`` = ``{kg_co2e, zone, intensity_source, intensity_version, pue, hours_without_intensity}``.

Figures are rounded (kWh and kg to 6 decimals, money to cents, as text) so the JSON is byte-stable on replay.
Kept apart from ``compute`` so the blocks can be added to a receipt version of their own. The adding up and
rounding are the tenant's verifier's (:func:`ledger.proofcheck.energy_totals`), so both write the same block.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Iterator, Sequence

from ..chain.contracts import CostBasis
from ..method.carbon import IntensityTable, carbon
from ..method.energy import DeviceEnergy
from ..method.energy_arrays import SpanArrays, bucket_energy, energy_by_hour
from ..proofcheck import energy_totals, in_order_sum, round6, scaled


@dataclass(frozen=True)
class DeviceEnergyInput:
    energy: DeviceEnergy | SpanArrays
    buckets: tuple[tuple[float, float, str], ...]   # (start, end, bucket) of the device's time
    tdp_w: float | None
    gpu_hours: Decimal                              # paid GPU-hours of the device (what TDP pricing bills)
    basis: CostBasis
    node: str | None = None                         # the device's node (its carbon zone may be the node's own)
    # receipt 1.5, a shared device (MIG slice, GPU several runs hold): (energy, buckets, share) of each part of
    # the window, whose share of the GPU's energy the run bears (ledger.proofcheck.energy_parts); gpu_hours is
    # then the run's share of the GPU's hours. Empty: the device's energy is all the run's (as before 1.5).
    parts: tuple[tuple[DeviceEnergy | SpanArrays, tuple[tuple[float, float, str], ...], Fraction], ...] = ()


def energy_block(devices: Sequence[DeviceEnergyInput], currency: str) -> dict:
    """Each device's energy by the vectorised spans (``ledger.method.energy_arrays``), added into the block by
    the verifier's :func:`ledger.proofcheck.energy_totals`."""
    def lines() -> Iterator[tuple]:
        for d in devices:
            if not d.parts:
                be = bucket_energy(d.energy, d.buckets)
                kwh, source = d.energy.kwh, d.energy.source
                known = Decimal(repr(round6(kwh))) if d.energy.has_spans and source != "unknown" else None
                yield (kwh, source, be.kwh, in_order_sum(be.unknown_gpu_hours.values()),
                       d.basis.energy_cost(known, d.tdp_w, d.gpu_hours))
                continue
            kwh, unknown_h, by_bucket, sources, any_spans = 0.0, 0.0, {}, set(), False
            for energy, buckets, share in d.parts:   # the verifier's energy_block, part by part, in its order
                be = bucket_energy(energy, buckets)
                kwh += scaled(energy.kwh, share)
                unknown_h += in_order_sum(scaled(v, share) for v in be.unknown_gpu_hours.values())
                for k, v in be.kwh.items():
                    by_bucket[k] = by_bucket.get(k, 0.0) + scaled(v, share)
                sources.add(energy.source)
                any_spans = any_spans or energy.has_spans
            source = sources.pop() if len(sources) == 1 else "mixed"
            known = Decimal(repr(round6(kwh))) if any_spans and source != "unknown" else None
            yield kwh, source, by_bucket, unknown_h, d.basis.energy_cost(known, d.tdp_w, d.gpu_hours)

    return energy_totals(lines(), currency)


def carbon_block(devices: Sequence[tuple[IntensityTable, DeviceEnergyInput]]) -> dict:
    """The run's carbon: each (zone table, device) by its own hourly kWh x its contract's PUE x the zone's
    intensity. Devices in several zones (or under several PUEs) sum, and the block names them all joined by "+"."""
    groups: dict[tuple[str, str, str, float], dict[int, float]] = {}
    tables: dict[tuple[str, str, str, float], IntensityTable] = {}
    for table, d in devices:
        k = (table.zone, table.intensity_source, table.version, float(d.basis.pue))
        tables[k] = table
        by_hour = groups.setdefault(k, {})
        for energy, share in ([(p[0], p[2]) for p in d.parts] or [(d.energy, None)]):
            for h, v in energy_by_hour(energy).items():
                by_hour[h] = by_hour.get(h, 0.0) + (v if share is None else scaled(v, share))
    kg, missing = 0.0, 0
    for k in sorted(groups):
        c = carbon(groups[k], tables[k], k[3])
        kg += c.kg_co2e
        missing += c.hours_without_intensity
    ks = sorted(groups)

    def joined(i: int) -> str:
        return "+".join(dict.fromkeys(str(k[i]) for k in ks))
    pues = sorted({k[3] for k in ks})
    return {"kg_co2e": round6(kg), "zone": joined(0), "intensity_source": joined(1), "intensity_version": joined(2),
            "pue": pues[0] if len(pues) == 1 else "+".join(str(p) for p in pues),
            "hours_without_intensity": missing}


def energy_lines(energy: dict, carbon_: dict | None = None) -> list[str]:
    """The receipt's text lines for the blocks (values only; the caller escapes and prints them)."""
    c = energy["cost"]
    out = [f"Energy: {energy['kwh']:.3f} kWh measured ({energy['source']})"
           + (f", {energy['unknown_gpu_hours']:.2f} GPU-h unknown" if energy["unknown_gpu_hours"] else ""),
           f"Energy cost ({c['basis']}): {c['charged']} {c['currency']}"
           f"   [measured {c['measured'] if c['measured'] is not None else 'n/a'}, TDP pricing {c['tdp']}]"]
    if energy["by_bucket"]:
        out.append("  by bucket: " + ", ".join(f"{k} {v:.3f} kWh" for k, v in energy["by_bucket"].items()))
    if carbon_ is not None:
        out.append(f"Carbon: {carbon_['kg_co2e']:.3f} kg CO2e (zone {carbon_['zone']}, "
                   f"{carbon_['intensity_source']} {carbon_['intensity_version']}, PUE {carbon_['pue']})"
                   + (f", {carbon_['hours_without_intensity']} h without intensity"
                      if carbon_["hours_without_intensity"] else ""))
    return out
