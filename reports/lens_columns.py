"""The effective-compute lens (method 1.1, docs/method.md "Effective compute") as statement columns.

One job: turn a receipt's ``effective_compute`` block into summable hour columns, both from a receipt dict
(:func:`lens_values`, the dict path) and column-wise from the column reader's fields (:func:`lens_columns_of`),
plus the FOCUS ``x_`` names they are written under (:data:`LENS_FOCUS`). Kept apart from the time-identity
columns so that other extension columns (energy) merge beside them.

Every column is a sum over receipts, so a tenant's or class's figure is the sum of its receipts' lens:

* ``tensor_gpu_hours``, ``fp64/fp32/fp16_gpu_hours``, ``achieved_pflop_hours``, ``rated_pflop_hours``: the
  block's figures (a pipe or rating the block leaves null adds 0 here; the block itself says null);
* ``<bound>_bound_gpu_hours``: the block's bound share × the receipt's delivered GPU-hours;
* ``lens_unmeasured_gpu_hours``: the block's ``unmeasured_gpu_hours``; a receipt issued without the lens
  (method 1.0) adds its whole paid time here — unknown to the lens, never read as zero math.

The statement's rated share is ``achieved_pflop_hours / rated_pflop_hours`` of the summed columns.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

BOUNDS = ("compute", "memory", "latency", "other")
_BLOCK_KEYS = ("tensor_gpu_hours", "fp64_gpu_hours", "fp32_gpu_hours", "fp16_gpu_hours", "achieved_pflop_hours",
               "rated_pflop_hours")
LENS_COLUMNS = (*_BLOCK_KEYS, *(f"{b}_bound_gpu_hours" for b in BOUNDS), "lens_unmeasured_gpu_hours")
LENS_FOCUS = (("x_TensorGpuHours", "tensor_gpu_hours"), ("x_Fp64GpuHours", "fp64_gpu_hours"),
              ("x_Fp32GpuHours", "fp32_gpu_hours"), ("x_Fp16GpuHours", "fp16_gpu_hours"),
              ("x_AchievedPflopHours", "achieved_pflop_hours"), ("x_RatedPflopHours", "rated_pflop_hours"),
              ("x_ComputeBoundGpuHours", "compute_bound_gpu_hours"),
              ("x_MemoryBoundGpuHours", "memory_bound_gpu_hours"),
              ("x_LatencyBoundGpuHours", "latency_bound_gpu_hours"),
              ("x_OtherBoundGpuHours", "other_bound_gpu_hours"),
              ("x_LensUnmeasuredGpuHours", "lens_unmeasured_gpu_hours"))

# The method versions whose receipts carry the lens (ledger.method.lens.LENS_METHOD_VERSION; a test holds the
# two equal). The flat receipt lines (ledger/chain/receipt_lines.py) carry no lens figures, so the export reads such
# receipts from their JSON.
LENS_METHOD_VERSIONS = ("1.1.0", "1.2.0")
LINES_WITHOUT_LENS = ("(method_version IS NULL OR method_version NOT IN ("
                      + ", ".join(f"'{v}'" for v in LENS_METHOD_VERSIONS) + "))")

# (column reader field name, path under the receipt, accepted JSON types): what lens_columns_of reads
_NUM = ("DOUBLE", "UBIGINT", "BIGINT")
LENS_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ec", "effective_compute", ("OBJECT",)),
    *((f"ec_{k}", f"effective_compute.{k}", _NUM) for k in (*_BLOCK_KEYS, "unmeasured_gpu_hours")),
    ("ec_bound", "effective_compute.bound_split", ("OBJECT",)),
    *((f"ec_b_{b}", f"effective_compute.bound_split.{b}", _NUM) for b in BOUNDS),
)


def _n(v: Any) -> float:
    """A finite number, else 0.0 (null, missing, or not a number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0.0
    f = float(v)
    return f if math.isfinite(f) else 0.0


def lens_values(receipt: Mapping[str, Any], paid: float, delivered: float) -> tuple[float, ...]:
    """The ``LENS_COLUMNS`` of one receipt (dict path)."""
    ec = receipt.get("effective_compute")
    if not isinstance(ec, Mapping):
        return (0.0,) * (len(LENS_COLUMNS) - 1) + (paid,)
    split = ec.get("bound_split") if isinstance(ec.get("bound_split"), Mapping) else {}
    return (*(_n(ec.get(k)) for k in _BLOCK_KEYS), *(_n(split.get(b)) * delivered for b in BOUNDS),
            _n(ec.get("unmeasured_gpu_hours")))


def lens_columns_of(d: pd.DataFrame, paid: np.ndarray, delivered: np.ndarray) -> dict[str, np.ndarray]:
    """The ``LENS_COLUMNS`` column-wise from the fields of ``LENS_FIELDS`` (the column reader's frame)."""
    if "ec" not in d.columns:  # rows from the receipt lines: receipts issued without the lens
        return {**{c: np.zeros(len(d)) for c in LENS_COLUMNS[:-1]}, "lens_unmeasured_gpu_hours": paid.copy()}
    has = (d["ec"] == "OBJECT").fillna(False).to_numpy(dtype=bool)

    def num(name: str) -> np.ndarray:
        v = np.nan_to_num(d[name].to_numpy(dtype="float64", na_value=np.nan), nan=0.0, posinf=0.0, neginf=0.0)
        return np.where(has, v, 0.0)

    out = {k: num(f"ec_{k}") for k in _BLOCK_KEYS}
    for b in BOUNDS:
        out[f"{b}_bound_gpu_hours"] = num(f"ec_b_{b}") * delivered
    out["lens_unmeasured_gpu_hours"] = np.where(has, num("ec_unmeasured_gpu_hours"), paid)
    return out


def lens_sql_of_lines(paid: str) -> str:
    """The ``LENS_COLUMNS`` as SQL select items for rows read from the receipt lines (receipts without the
    lens, by :data:`LINES_WITHOUT_LENS`): nothing measured, the paid time unmeasured."""
    return ", ".join([*(f"0.0 AS {c}" for c in LENS_COLUMNS[:-1]), f"{paid} AS lens_unmeasured_gpu_hours"])


def rated_share(achieved: float, rated: float) -> float | None:
    """The statement's MFU-like figure for summed columns (None without a rating)."""
    return round(achieved / rated, 6) if rated > 0 else None
