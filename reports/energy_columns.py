"""Receipt 1.4's energy and carbon blocks (docs/receipts.md, "Energy and carbon") as statement columns.

One job: turn a receipt's ``energy`` and ``carbon`` blocks into summable columns, both from a receipt dict
(:func:`energy_values`, the dict path) and column-wise from the column reader's fields
(:func:`energy_columns_of`), plus the FOCUS ``x_`` names they are written under (:data:`ENERGY_FOCUS`). Kept
beside :mod:`reports.lens_columns` (the same shape) so neither edits the other.

Every column is a sum over receipts, so a tenant's or class's figure is the sum of its receipts':

* ``kwh``: ``energy.kwh``, the measured (or power-integrated) energy of the run's devices;
* ``energy_cost``: ``energy.cost.charged``, the energy line billed under the contract's ``energy_basis``;
* ``energy_cost_measured`` / ``energy_cost_tdp``: what measured pricing and TDP pricing give, side by side
  (a receipt whose measured figure is ``null``, some device unmeasured, adds 0 to the measured column);
* ``kg_co2e``: ``carbon.kg_co2e`` (a receipt without a carbon block adds 0);
* ``energy_unmeasured_gpu_hours``: ``energy.unknown_gpu_hours``; a receipt issued without the energy block
  (no ``energy_basis`` on its contract) adds its whole paid time here: its energy is unknown, never read as 0.

The receipt writes its money figures as decimal text (``"12.34"``); :func:`number` reads a finite number from a
JSON number or such text, in both paths alike. Receipts with the blocks are not ``plain`` in the receipt lines
(ledger/chain/receipt_lines.py), so the export reads them from their JSON, where these fields are.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

_COST_KEYS = (("energy_cost", "charged"), ("energy_cost_measured", "measured"), ("energy_cost_tdp", "tdp"))
ENERGY_COLUMNS = ("kwh", *(c for c, _ in _COST_KEYS), "kg_co2e", "energy_unmeasured_gpu_hours")
ENERGY_FOCUS = (("x_EnergyKwh", "kwh"), ("x_EnergyCost", "energy_cost"),
                ("x_EnergyCostMeasured", "energy_cost_measured"), ("x_EnergyCostTdp", "energy_cost_tdp"),
                ("x_CarbonKgCo2e", "kg_co2e"), ("x_EnergyUnmeasuredGpuHours", "energy_unmeasured_gpu_hours"))

# (column reader field name, path under the receipt, accepted JSON types): what energy_columns_of reads
_NUM = ("DOUBLE", "UBIGINT", "BIGINT")
_NUM_OR_TEXT = (*_NUM, "VARCHAR")
ENERGY_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("en", "energy", ("OBJECT",)),
    ("en_kwh", "energy.kwh", _NUM),
    ("en_unknown_gpu_hours", "energy.unknown_gpu_hours", _NUM),
    ("en_cost", "energy.cost", ("OBJECT",)),
    # money as text: read as text (the SQL's VARCHAR branch), turned into numbers by number() below
    *((f"en_cost_{k}", f"energy.cost.{k}", ("VARCHAR",)) for _, k in _COST_KEYS),
    ("co", "carbon", ("OBJECT",)),
    ("co_kg", "carbon.kg_co2e", _NUM),
)


def number(v: Any) -> float:
    """A finite number from a JSON number or decimal text, else 0.0 (null, missing, a bool, not finite)."""
    if isinstance(v, bool):
        return 0.0
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return 0.0
    if not isinstance(v, (int, float)):
        return 0.0
    f = float(v)
    return f if math.isfinite(f) else 0.0


def energy_values(receipt: Mapping[str, Any], paid: float) -> tuple[float, ...]:
    """The ``ENERGY_COLUMNS`` of one receipt (dict path)."""
    en = receipt.get("energy")
    if not isinstance(en, Mapping):
        return (0.0,) * (len(ENERGY_COLUMNS) - 1) + (paid,)
    cost = en.get("cost") if isinstance(en.get("cost"), Mapping) else {}
    co = receipt.get("carbon") if isinstance(receipt.get("carbon"), Mapping) else {}
    return (number(en.get("kwh")), *(number(cost.get(k)) for _, k in _COST_KEYS), number(co.get("kg_co2e")),
            number(en.get("unknown_gpu_hours")))


def energy_columns_of(d: pd.DataFrame, paid: np.ndarray) -> dict[str, np.ndarray]:
    """The ``ENERGY_COLUMNS`` column-wise from the fields of ``ENERGY_FIELDS`` (the column reader's frame)."""
    if "en" not in d.columns:  # rows from the receipt lines: receipts issued without the energy block
        return {**{c: np.zeros(len(d)) for c in ENERGY_COLUMNS[:-1]}, "energy_unmeasured_gpu_hours": paid.copy()}
    has = (d["en"] == "OBJECT").fillna(False).to_numpy(dtype=bool)
    has_cost = has & (d["en_cost"] == "OBJECT").fillna(False).to_numpy(dtype=bool)
    has_co = has & (d["co"] == "OBJECT").fillna(False).to_numpy(dtype=bool)

    def num(name: str, where: np.ndarray) -> np.ndarray:
        v = np.fromiter((number(x) for x in d[name].to_numpy(dtype=object)), dtype="float64", count=len(d))
        return np.where(where, v, 0.0)

    out = {"kwh": num("en_kwh", has)}
    for c, k in _COST_KEYS:
        out[c] = num(f"en_cost_{k}", has_cost)
    out["kg_co2e"] = num("co_kg", has_co)
    out["energy_unmeasured_gpu_hours"] = np.where(has, num("en_unknown_gpu_hours", has), paid)
    return out


def energy_sql_of_lines(paid: str) -> str:
    """The ``ENERGY_COLUMNS`` as SQL select items for rows read from the receipt lines (receipts without the
    blocks, which alone are plain): nothing measured, the paid time's energy unknown."""
    return ", ".join([*(f"0.0 AS {c}" for c in ENERGY_COLUMNS[:-1]), f"{paid} AS energy_unmeasured_gpu_hours"])
