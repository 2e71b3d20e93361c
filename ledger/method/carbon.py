"""Carbon from energy: hourly grid intensity by zone, and kg CO2e = sum over hours of kWh x PUE x intensity.

Pure functions (docs/method.md, "Carbon"). :func:`parse_intensity` reads the two CSV shapes sites have:

* Electricity Maps' hourly export: ``Datetime (UTC)`` (the hour's start), ``Zone Id``, and the
  ``Carbon Intensity gCO₂eq/kWh (direct)`` and ``... (LCA)`` columns; which one is used is the caller's choice
  (``column = "lca"`` by default) and is named in the table's ``intensity_source``.
* WattTime's: ``point_time`` and ``value`` (MOER, lbs CO2 per MWh unless a ``units`` column says
  ``g_co2_per_kwh``), optionally ``region``; converted to gCO2e/kWh.

:func:`constant_intensity` is the labelled fallback (``intensity_source = "constant: <label>"``). The table's
``version`` is the SHA-256 of the file's text (its first 16 hex digits), so a receipt that names it can be
replayed against the very same file. :class:`CarbonSettings` is the site's ``[carbon]`` section once read
(zones by cluster or node, a table per zone); ledger.ingest.site builds it and passes it down.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping

from ledger.method.energy import J_PER_KWH, EnergySpan
from ledger.proofcheck import in_order_sum

LBS_PER_MWH_TO_G_PER_KWH = 453.59237 / 1000.0
EM_TIME = "Datetime (UTC)"
EM_ZONE = "Zone Id"
EM_COLUMNS = {"direct": "Carbon Intensity gCO₂eq/kWh (direct)", "lca": "Carbon Intensity gCO₂eq/kWh (LCA)"}


class IntensityError(ValueError):
    """A bad intensity file: one line naming the file, the row and the field."""


@dataclass(frozen=True)
class IntensityTable:
    zone: str
    intensity_source: str          # e.g. "electricitymaps:lca", "watttime:moer", "constant: site figure"
    version: str                   # sha256 prefix of the file's text, or "constant"
    hourly: Mapping[int, float] = field(default_factory=dict)   # hour start (epoch s) -> gCO2e/kWh
    constant: float | None = None

    def at(self, hour: int) -> float | None:
        return self.constant if self.constant is not None else self.hourly.get(hour)


def constant_intensity(zone: str, g_per_kwh: float, label: str) -> IntensityTable:
    if not g_per_kwh >= 0:
        raise IntensityError(f"carbon: constant intensity for {zone} must be >= 0, got {g_per_kwh!r}")
    return IntensityTable(zone, f"constant: {label}", "constant", {}, float(g_per_kwh))


def _hour(text: str, origin: str, row: int) -> int:
    s = text.strip().replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise IntensityError(f"{origin}: row {row}: time {text!r} is not a date and time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    t = int(dt.timestamp())
    return t - t % 3600


def _number(text: str, origin: str, row: int, name: str) -> float | None:
    if text is None or text.strip() == "":
        return None
    try:
        v = float(text)
    except ValueError:
        raise IntensityError(f"{origin}: row {row}: {name} {text!r} is not a number") from None
    if not v >= 0:
        raise IntensityError(f"{origin}: row {row}: {name} must be >= 0, got {text!r}")
    return v


def parse_intensity(text: str, zone: str, column: str = "lca", origin: str = "intensity_file") -> IntensityTable:
    """The hourly intensities of ``zone`` in an Electricity Maps or WattTime CSV (see the module docstring)."""
    version = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    head = reader.fieldnames or []
    hourly: dict[int, float] = {}
    if EM_TIME in head:
        if column not in EM_COLUMNS:
            raise IntensityError(f"{origin}: column must be one of {sorted(EM_COLUMNS)}, got {column!r}")
        col = EM_COLUMNS[column]
        if col not in head:
            raise IntensityError(f"{origin}: no {col!r} column")
        source = f"electricitymaps:{column}"
        for i, r in enumerate(reader, start=2):
            if EM_ZONE in head and (r.get(EM_ZONE) or "").strip() != zone:
                continue
            v = _number(r.get(col), origin, i, col)
            if v is not None:
                hourly[_hour(r[EM_TIME], origin, i)] = v
    elif "point_time" in head and "value" in head:
        source = "watttime:moer"
        acc: dict[int, list[float]] = {}
        for i, r in enumerate(reader, start=2):
            if "region" in head and (r.get("region") or "").strip() != zone:
                continue
            v = _number(r.get("value"), origin, i, "value")
            if v is None:
                continue
            units = (r.get("units") or "lbs_co2_per_mwh").strip().lower()
            if units == "lbs_co2_per_mwh":
                v *= LBS_PER_MWH_TO_G_PER_KWH
            elif units not in ("g_co2_per_kwh", "gco2_per_kwh"):
                raise IntensityError(f"{origin}: row {i}: units {units!r} not known")
            acc.setdefault(_hour(r["point_time"], origin, i), []).append(v)
        hourly = {h: in_order_sum(vs) / len(vs) for h, vs in acc.items()}   # 5-minute MOER points: the hour's mean
    else:
        raise IntensityError(f"{origin}: neither an Electricity Maps ({EM_TIME!r}) nor a WattTime "
                             "('point_time', 'value') CSV")
    if not hourly:
        raise IntensityError(f"{origin}: no intensity for zone {zone!r}")
    return IntensityTable(zone, source, version, hourly)


def hourly_kwh(spans: Iterable[EnergySpan], into: dict[int, float] | None = None) -> dict[int, float]:
    """Known energy by clock hour (epoch second of the hour's start), each span spread evenly over its time
    (added to ``into`` when given, which is returned)."""
    out: dict[int, float] = {} if into is None else into
    for s in spans:
        if s.joules is None or s.end <= s.start:
            continue
        h = int(s.start) - int(s.start) % 3600
        while h < s.end:
            ov = min(s.end, h + 3600) - max(s.start, h)
            if ov > 0:
                out[h] = out.get(h, 0.0) + s.joules * ov / (s.end - s.start) / J_PER_KWH
            h += 3600
    return out


@dataclass(frozen=True)
class Carbon:
    kg_co2e: float
    zone: str
    intensity_source: str
    intensity_version: str
    pue: float
    hours_without_intensity: int   # hours with energy the table has no figure for (their carbon is not counted)


def carbon(kwh_by_hour: Mapping[int, float], table: IntensityTable, pue: float | Mapping[int, float] = 1.0) -> Carbon:
    """kg CO2e = sum over hours of kWh x PUE x gCO2e/kWh / 1000. ``pue`` is a number or hour -> PUE."""
    kg, missing = 0.0, 0
    for h in sorted(kwh_by_hour):
        g = table.at(h)
        if g is None:
            missing += 1
            continue
        p = pue.get(h, 1.0) if isinstance(pue, Mapping) else pue
        kg += kwh_by_hour[h] * p * g / 1000.0
    shown = pue if not isinstance(pue, Mapping) else (in_order_sum(pue.values()) / len(pue) if pue else 1.0)
    return Carbon(kg, table.zone, table.intensity_source, table.version, float(shown), missing)


@dataclass(frozen=True)
class CarbonSettings:
    """The site's ``[carbon]`` settings, read once (ledger.ingest.site): the default zone, the zone of each cluster or
    node (``[carbon.zones]``, a node's own entry before its cluster's) and each zone's intensity table."""

    tables: Mapping[str, IntensityTable]       # zone -> its hourly (or constant) intensity
    zone: str | None = None                    # the default zone
    zones: Mapping[str, str] = field(default_factory=dict)   # cluster or node name -> zone

    def zone_for(self, cluster: str | None, node: str | None) -> str | None:
        """The zone of a device on ``node`` in ``cluster``: the node's entry, else the cluster's, else the default."""
        for name in (node, cluster):
            if name is not None and name in self.zones:
                return self.zones[name]
        return self.zone

    def table_for(self, cluster: str | None, node: str | None) -> IntensityTable | None:
        z = self.zone_for(cluster, node)
        return None if z is None else self.tables.get(z)
