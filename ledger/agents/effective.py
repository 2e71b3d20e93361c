"""The effective-compute lens over an analysed export or capture set (Path B; docs/agents.md, "Effective compute
in an analysis"): how much math the paid GPU-hours did against the devices' rating.

The same definitions as the receipts' lens (docs/method.md, "Effective compute"), over the allocated samples of
the dataset the agents read, per device:

* ``tensor_gpu_hours`` = Σ h × tensor_active × r (h the sample's allocated hours, r the clock ratio
  min(clock / rated clock, 1) the time identity uses; tensor clipped to [0, 1]);
* ``unmeasured_gpu_hours`` = Σ h of samples without tensor activity: unknown, never read as zero math;
* ``achieved_pflop_hours`` = the counted operations where an op counter was read (AMD: ops counted, not
  inferred), plus Σ h × tensor × r × peak for the rest; ``rated_pflop_hours`` = Σ h × peak over the samples with
  tensor measured (peak: the SKU's dense peak at ``precision``, from the SKU table); ``rated_share`` their
  ratio, left out (None) when a measured device has no rating (the share would mix rated and unrated parts).

One pure function of the dataset: :func:`effective_compute` (the allocated hours of the dataset's frame and the
sums the compute findings already hold per device-hour, :func:`ledger.agents.compute.lens_hours`), and
:func:`effective_compute_reference`, the same figures from a plain loop over the samples
(:func:`per_device_reference`), which a test holds it to.
"""

from __future__ import annotations

import math

import pandas as pd

from ..method.lens import peak_tflops
from ..method.skus import match_sku
from .data import Dataset

DEFAULT_PRECISION = "bf16"
DP = 4   # the analysis prints GPU-hours to 4 decimals (the account's rounding)
PER_DEVICE = ("h", "tensor_h", "tensor_del", "ops", "ops_tdel")


def _peak_pflops(sku: object, precision: str) -> float | None:
    rating = match_sku(sku) if isinstance(sku, str) and sku else None
    tf = peak_tflops(rating, precision)
    return None if tf is None else tf / 1000.0


def per_device(ds: Dataset) -> pd.DataFrame:
    """The per-device sums :func:`effective_compute` summarises: the allocated hours ``h`` from the dataset's own
    frame (samples or device-hours: every allocated hour, measured or not), the lens's parts from the sums the
    compute findings decide on (:func:`ledger.agents.compute.lens_hours`, computed once per dataset). A device or
    hour the lens sums leave out (no tensor field at all) adds its hours to ``h`` and nothing else: unmeasured."""
    from .compute import lens_hours

    s = ds.samples
    h = s.loc[s["h"] > 0].groupby("device", sort=False)["h"].sum() if len(s) and "h" in s else pd.Series(dtype=float)
    st = lens_hours(ds)
    parts = st.groupby("device", sort=False)[list(PER_DEVICE[1:])].sum() if len(st) else None
    out = pd.DataFrame({"h": h.astype(float)})
    for k in PER_DEVICE[1:]:
        out[k] = 0.0 if parts is None else parts[k].reindex(out.index, fill_value=0.0).astype(float)
    out.index.name = "device"
    return out


def summarise(per_device: pd.DataFrame, skus: pd.Series, precision: str = DEFAULT_PRECISION) -> dict | None:
    """The lens block from per-device sums (PER_DEVICE, indexed by device) and each device's SKU name."""
    if not len(per_device) or float(per_device["h"].sum()) <= 0:
        return None
    by_sku: dict[str, dict] = {}
    sources = set()
    unrated = False
    for dev, row in per_device.iterrows():
        sku = skus.get(dev)
        key = str(sku) if isinstance(sku, str) and sku else "(unnamed)"
        peak = _peak_pflops(sku, precision)
        b = by_sku.setdefault(key, {"sku": key, "devices": 0, "paid_gpu_hours": 0.0, "tensor_gpu_hours": 0.0,
                                    "achieved_pflop_hours": 0.0, "rated_pflop_hours": 0.0,
                                    "unmeasured_gpu_hours": 0.0, "peak_pflops": peak})
        b["devices"] += 1
        b["paid_gpu_hours"] += float(row["h"])
        b["tensor_gpu_hours"] += float(row["tensor_del"])
        b["unmeasured_gpu_hours"] += max(float(row["h"]) - float(row["tensor_h"]), 0.0)
        if row["ops"] > 0:
            sources.add("op_counters")
        if row["tensor_h"] > 0 and (row["ops"] <= 0 or row["tensor_del"] > row["ops_tdel"]):
            sources.add("tensor_active")
        b["achieved_pflop_hours"] += float(row["ops"]) / 1e15 / 3600.0
        if peak is None:
            unrated = unrated or row["tensor_h"] > 0
            continue
        b["achieved_pflop_hours"] += (float(row["tensor_del"]) - float(row["ops_tdel"])) * peak
        b["rated_pflop_hours"] += float(row["tensor_h"]) * peak
    rows = []
    for b in sorted(by_sku.values(), key=lambda r: r["sku"]):
        priced = b["peak_pflops"] is not None or b["achieved_pflop_hours"] > 0   # a rating, or counted operations
        share = (b["achieved_pflop_hours"] / b["rated_pflop_hours"]
                 if b["peak_pflops"] is not None and b["rated_pflop_hours"] > 0 else None)
        rows.append({k: (round(v, DP) if isinstance(v, float) and k != "peak_pflops" else v) for k, v in b.items()}
                    | {"achieved_pflop_hours": round(b["achieved_pflop_hours"], DP) if priced else None,
                       "rated_pflop_hours": round(b["rated_pflop_hours"], DP) if b["peak_pflops"] is not None
                       else None, "rated_share": None if share is None else round(share, 4)})
    achieved = sum(b["achieved_pflop_hours"] for b in by_sku.values())
    rated = sum(b["rated_pflop_hours"] for b in by_sku.values())
    priced_any = any(r["achieved_pflop_hours"] is not None for r in rows)
    return {"precision": precision,
            "source": "mixed" if len(sources) > 1 else (next(iter(sources)) if sources else None),
            "paid_gpu_hours": round(float(per_device["h"].sum()), DP),
            "tensor_gpu_hours": round(float(per_device["tensor_del"].sum()), DP),
            "achieved_pflop_hours": round(achieved, DP) if priced_any else None,
            "rated_pflop_hours": round(rated, DP) if rated > 0 else None,
            "rated_share": round(achieved / rated, 4) if rated > 0 and not unrated else None,
            "unmeasured_gpu_hours": round(sum(b["unmeasured_gpu_hours"] for b in by_sku.values()), DP),
            "by_sku": rows}


def effective_compute(ds: Dataset, precision: str = DEFAULT_PRECISION) -> dict | None:
    """The lens block of the dataset's allocated time (None: no allocated time)."""
    return summarise(per_device(ds), ds.devices["sku"], precision)


def effective_compute_reference(ds: Dataset, precision: str = DEFAULT_PRECISION) -> dict | None:
    """:func:`effective_compute` as a plain loop over the per-sample frame (exact sums; the test's reference)."""
    return summarise(per_device_reference(ds.samples), ds.devices["sku"], precision)


def per_device_reference(s: pd.DataFrame) -> pd.DataFrame:
    """The per-device sums (PER_DEVICE) as a plain loop over the samples, each sum exact (math.fsum)."""
    acc: dict = {}
    for dev, h, ten, ratio, ops, dt in zip(s["device"], s["h"], s["tensor"], s["ratio"],
                                          s["ops"] if "ops" in s else [math.nan] * len(s), s["dt"]):
        if not h > 0:
            continue
        a = acc.setdefault(dev, {k: [] for k in PER_DEVICE})
        a["h"].append(h)
        if math.isnan(ten):
            continue
        td = h * min(max(ten, 0.0), 1.0) * ratio
        a["tensor_h"].append(h)
        a["tensor_del"].append(td)
        if not math.isnan(ops) and dt > 0:
            a["ops"].append(max(ops, 0.0))
            a["ops_tdel"].append(td)
    return pd.DataFrame({k: [math.fsum(a[k]) for a in acc.values()] for k in PER_DEVICE},
                        index=pd.Index(list(acc), name="device"), dtype=float)

