"""Per device-hour statistics for the rules that look past an hour's GPU-hours: the temperature-on-power residual
(cooling, hot because working), the loaded clock (drift), correctable-ECC extremes (the aggregate counter's, else
the volatile counter's: :func:`correctable`) and row-remap flags.

One definition, two sources, so the agents decide alike on either: over device-hours the columns are the
`device_hours` table's own (:mod:`ledger.telemetry.hours`, derived when a segment is sealed); over every sample
(the full-resolution reference, and an export analysed without a ledger) :func:`from_samples` computes the same
columns from the agents' per-sample frame. Everything a rule reads from here is a sum, a count or an extreme of
an hour, so the two agree to the rounding of a sum (docs/method.md, "Agents on hourly statistics").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..telemetry.hours import HOUR, LOADED_ACT, OTHER, THERMAL  # the seal-time definitions, so both sources agree

SUM_COLS = ("hot_n", "hot_p", "hot_t", "fit_n", "fit_p", "fit_t", "fit_pp", "fit_pt", "loaded_n", "loaded_clk")
EXT_COLS = {"ecc_min": "min", "ecc_max": "max", "remap_pending_max": "max", "remap_failure_max": "max",
            "eccv_min": "min", "eccv_max": "max"}
COLUMNS = ("device", "hour", *SUM_COLS, *EXT_COLS)


def from_samples(s: pd.DataFrame) -> pd.DataFrame:
    """The statistics of every (device, hour) of the agents' per-sample frame (``data.add_bucket_hours`` columns), as
    `device_hours` defines them: running samples with power and temperature (``hot``), those without a thermal
    reason bit (the fit's), running samples at activity >= 0.3 with a clock and no reason bit (``loaded``)."""
    if not len(s):
        return pd.DataFrame(columns=list(COLUMNS))
    running = s["running"].to_numpy(bool)
    power, temp, clk = (s[c].to_numpy(float) for c in ("power", "temp", "clk"))
    rb = s["rbucket"].to_numpy()
    ok = running & ~np.isnan(power) & ~np.isnan(temp)
    fit = ok & (rb != THERMAL)
    loaded = running & (np.nan_to_num(s["act"].to_numpy(float)) >= LOADED_ACT) & ~np.isnan(clk) & (rb == OTHER)
    p, tc = np.nan_to_num(power), np.nan_to_num(temp)
    f = pd.DataFrame({"device": s["device"].to_numpy(), "hour": np.floor(s["t"].to_numpy(float) / HOUR) * HOUR,
                      "hot_n": ok.astype(np.int64), "hot_p": np.where(ok, p, 0.0), "hot_t": np.where(ok, tc, 0.0),
                      "fit_n": fit.astype(np.int64), "fit_p": np.where(fit, p, 0.0), "fit_t": np.where(fit, tc, 0.0),
                      "fit_pp": np.where(fit, p * p, 0.0), "fit_pt": np.where(fit, p * tc, 0.0),
                      "loaded_n": loaded.astype(np.int64), "loaded_clk": np.where(loaded, np.nan_to_num(clk), 0.0),
                      "ecc_min": s["ecc"].to_numpy(float), "ecc_max": s["ecc"].to_numpy(float),
                      "remap_pending_max": s["row_remap_pending"].to_numpy(float),
                      "remap_failure_max": s["row_remap_failure"].to_numpy(float),
                      "eccv_min": s["eccv"].to_numpy(float) if "eccv" in s else np.nan,
                      "eccv_max": s["eccv"].to_numpy(float) if "eccv" in s else np.nan})
    agg = {c: "sum" for c in SUM_COLS} | EXT_COLS
    return correctable(f.groupby(["device", "hour"], sort=True).agg(agg).reset_index())[list(COLUMNS)]


def correctable(h: pd.DataFrame) -> pd.DataFrame:
    """``ecc_min`` / ``ecc_max`` of each device-hour from whichever correctable-ECC counter it has: the aggregate
    counter's extremes, else the volatile counter's (``eccv_*``: DCGM field 310 where 312 is not exported). The
    drift agent's ECC rule reads the increments of these, so either counter's rise is seen."""
    if "eccv_max" not in h:
        return h
    none = h["ecc_max"].isna() & h["eccv_max"].notna()
    if not none.any():
        return h
    h = h.copy()
    h.loc[none, "ecc_min"] = h.loc[none, "eccv_min"]
    h.loc[none, "ecc_max"] = h.loc[none, "eccv_max"]
    return h


def hour_stats(ds) -> pd.DataFrame:  # noqa: ANN001 - a Dataset
    """The dataset's statistics per device-hour: those it was built with (device-hours), else computed from its
    samples once."""
    if ds.hourly is None:
        ds.hourly = from_samples(ds.samples)
    return ds.hourly
