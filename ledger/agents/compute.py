"""Findings from the effective-compute lens (issue 29; docs/agents.md, "Effective compute"):

* ``busy_not_computing`` (job): a run whose GPUs kept their SMs busy (SM active >= ``SM_BUSY``) while every
  pipe was idle (tensor, and FP64 / FP32 / FP16 where measured, each below ``PIPE_IDLE``) and DRAM was not the
  bound (DRAM active below the lens's ``dram_high``: a memory-bound kernel is working, not spinning), for hours:
  spin-waiting on a lock, a hung collective, a busy poll. The time identity counts that time delivered (activity
  x clock ratio); the lens shows it did no math. It is the **tenant's** loss, not the provider's: its GPU-hours
  are inside delivered, so they are in no loss line (``accounting.loss_partition``) and no operator step; the
  recommendation tells the tenant. A sample whose tensor or DRAM field was not measured is unknown, never idle:
  a device without pipe fields is never judged.
* ``flops_behind_siblings`` (device): a GPU of a multi-GPU run whose counted FLOPs per tensor-active hour at the
  rated clock (op counters / Σ dt x tensor x clock ratio) fall behind its siblings' on the same run for hours —
  a slow part the clock ratio does not show (the clock is already divided out). Only counted FLOPs can show it:
  where achieved FLOPs are inferred from tensor activity (tensor x clock ratio x peak), FLOPs per tensor-active
  hour are the clock ratio by definition, which ``sibling_divergence`` reads.

Both rules decide on per (device, hour, run) sums (:func:`lens_hours`), computed from the agents' per-sample
frame (:func:`stats_from_samples`) or, for a dataset of device-hours, from the raw lens columns read a few
devices at a time (:func:`stats_from_source`): the same sums, so the two datasets decide alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..method.lens import DEFAULT_LENS_THRESHOLDS
from .common import HOUR, fmt_h, prices
from .data import ACTIVE_MIN, Dataset, activity_and_ratio
from .model import Evidence, Finding, clamp01, make_scope

AGENT = "attribution"
SM_BUSY = DEFAULT_LENS_THRESHOLDS.sm_high        # SM active at or above this: busy (the lens's "high")
PIPE_IDLE = 0.05                                  # every measured pipe below this: idle
DRAM_HIGH = DEFAULT_LENS_THRESHOLDS.dram_high     # DRAM active at or above this: memory-bound, not spinning
SPIN_HOUR_SHARE = 0.5      # a device-hour is spinning when >= half its allocated time spins
SPIN_MERGE_H = 1.0         # spinning hours of a run this close merge into one window
SPIN_MIN_WINDOW_H = 2.0    # "for hours"
SPIN_MIN_GPU_H = 1.0       # delivered GPU-hours without math, summed over the run's devices
SPIN_EDGE_SHARE = 0.1      # a window grows by the hours next to it where the run spun at least this share
FLOPS_MIN_TENSOR_H = 0.05  # a device-hour compared only with this much tensor time at rated clock (3 min)
FLOPS_DEFICIT = 0.06       # behind the siblings' median by at least this share
FLOPS_MIN_SIBLINGS = 2     # other devices of the run with counted FLOPs that hour
FLOPS_MERGE_H = 1.0
FLOPS_MIN_WINDOW_H = 2.0
FLOPS_EDGE = 0.02          # a window grows by the hours next to it at least this far behind the device's own standing
STAT_SUMS = ("h", "busy_h", "judged_h", "spin_h", "spin_del", "tensor_del", "sm_sum", "tensor_sum", "tensor_h",
             "dram_sum", "dram_h", "fp_sum", "fp_h", "ops", "ops_tdel", "ops_ratio", "ops_h")
STAT_COLUMNS = ("device", "hour", "ai", *STAT_SUMS)
# what stats_from_source reads of each raw sample (the activity, its clock and the lens's fields)
SOURCE_COLUMNS = ("device", "t", "dt", "sm_active", "tensor_active", "gpu_util", "sm_clock_mhz", "dram_active",
                  "fp64_active", "fp32_active", "fp16_active", "fp_ops")
SOURCE_ROWS = 100_000     # raw samples read and reduced at a time (a batch: ≈ 25 MB of arrays)
PIPES = ("fp64", "fp32", "fp16")


def stats_from_samples(s: pd.DataFrame) -> pd.DataFrame:
    """Per (device, hour, run row ``ai``) of allocated samples: the sums the two rules decide on (STAT_SUMS).

    ``h`` allocated hours; ``busy_h`` working with SM active >= SM_BUSY; ``judged_h`` of those, tensor and DRAM
    measured (the pipes can be judged); ``spin_h`` / ``spin_del`` of those, every measured pipe idle and DRAM
    below DRAM_HIGH (hours / hours x activity x clock ratio: the delivered part); ``tensor_del`` Σ h x tensor x
    ratio (the lens's tensor GPU-hours); means' sums of SM, tensor, DRAM and the highest FP pipe; ``ops`` the
    counted operations of samples with tensor measured, ``ops_tdel`` / ``ops_ratio`` / ``ops_h`` Σ h x tensor x
    ratio, Σ h x ratio and Σ h over the same samples."""
    if not len(s) or "tensor" not in s:
        return pd.DataFrame(columns=list(STAT_COLUMNS))

    def col(name: str) -> np.ndarray:
        return s[name].to_numpy(float) if name in s else np.full(len(s), np.nan)

    # the device column as the frame holds it (pyarrow strings: no Python string a sample; the group-by
    # below factorizes it either way)
    return _stats(s["device"].array, s["t"].to_numpy(float), s["ai"].to_numpy(), col("h"), col("act"),
                  col("ratio"), col("dt"), {k: col(k) for k in ("sm", "tensor", "dram", "ops", *PIPES)})


def _stats(device, t: np.ndarray, ai: np.ndarray, h: np.ndarray, act_raw: np.ndarray,  # noqa: ANN001
           ratio: np.ndarray, dt: np.ndarray, f: dict[str, np.ndarray]) -> pd.DataFrame:
    """:func:`stats_from_samples` from its columns as arrays (``f``: sm, tensor, dram, ops and the pipes;
    ``device`` a numpy or pandas array of names)."""
    keep = ai >= 0
    if not keep.any():
        return pd.DataFrame(columns=list(STAT_COLUMNS))
    if not keep.all():
        device, t, ai, h, act_raw, ratio, dt = (x[keep] for x in (device, t, ai, h, act_raw, ratio, dt))
        f = {k: v[keep] for k, v in f.items()}
    act = np.clip(np.nan_to_num(act_raw), 0.0, 1.0)
    sm, ten, dram, ops = f["sm"], f["tensor"], f["dram"], f["ops"]
    working = ~np.isnan(act_raw) & (act >= ACTIVE_MIN)
    fp = np.full(len(h), np.nan)
    for p in PIPES:
        fp = np.fmax(fp, f[p])                       # the highest measured FP pipe (NaN: none measured)
    busy = working & (np.nan_to_num(sm, nan=-1.0) >= SM_BUSY)
    judged = busy & ~np.isnan(ten) & ~np.isnan(dram)
    spin = judged & (ten < PIPE_IDLE) & (np.nan_to_num(fp, nan=0.0) < PIPE_IDLE) & (dram < DRAM_HIGH)
    ten_c = np.clip(np.nan_to_num(ten), 0.0, 1.0)
    counted = ~np.isnan(ops) & ~np.isnan(ten) & (dt > 0)
    frame = pd.DataFrame({
        "device": device, "hour": np.floor(t / HOUR) * HOUR,
        "ai": ai, "h": h, "busy_h": np.where(busy, h, 0.0), "judged_h": np.where(judged, h, 0.0),
        "spin_h": np.where(spin, h, 0.0), "spin_del": np.where(spin, h * act * ratio, 0.0),
        "tensor_del": h * ten_c * ratio, "sm_sum": np.where(np.isnan(sm), 0.0, h * np.nan_to_num(sm)),
        "tensor_sum": h * ten_c, "tensor_h": np.where(np.isnan(ten), 0.0, h),
        "dram_sum": h * np.nan_to_num(dram), "dram_h": np.where(np.isnan(dram), 0.0, h),
        "fp_sum": h * np.nan_to_num(fp), "fp_h": np.where(np.isnan(fp), 0.0, h),
        "ops": np.where(counted, np.maximum(np.nan_to_num(ops), 0.0), 0.0),
        "ops_tdel": np.where(counted, h * ten_c * ratio, 0.0), "ops_ratio": np.where(counted, h * ratio, 0.0),
        "ops_h": np.where(counted, h, 0.0)})
    return frame.groupby(["device", "hour", "ai"], sort=True)[list(STAT_SUMS)].sum().reset_index()


def _run_rows(device: np.ndarray, t: np.ndarray, allocs: pd.DataFrame) -> np.ndarray:
    """Each sample's allocation row (-1: none), as :func:`ledger.agents.data.assign_runs` decides it (the sample's
    start within [start, end) of one of its device's allocations), without the label columns it adds."""
    ai = np.full(len(t), -1, dtype=np.int64)
    if not len(t) or not len(allocs):
        return ai
    a = allocs.reset_index(drop=True)
    rows_of = a.groupby("device").indices
    st_all, en_all = a["start"].to_numpy(float), a["end"].to_numpy(float)
    for dev, idx in pd.Series(device).groupby(device, sort=False).indices.items():
        rows = rows_of.get(dev)
        if rows is None:
            continue
        order = np.argsort(st_all[rows])
        st, en, rows = st_all[rows][order], en_all[rows][order], rows[order]
        k = np.searchsorted(st, t[idx], side="right") - 1
        ok = (k >= 0) & (t[idx] < en[np.clip(k, 0, None)])
        ai[idx[ok]] = rows[k[ok]]
    return ai


def stats_from_source(src, ds: Dataset) -> pd.DataFrame:  # noqa: ANN001 - hourly.LedgerSamples / memory.ExportSamples
    """:func:`stats_from_samples` of every raw sample of ``src``, read in one pass in batches of about
    ``SOURCE_ROWS`` rows and bucketed by the full-resolution code (the run each sample belongs to, its activity
    and clock ratio), so a dataset of device-hours decides these rules on the same sums as the per-sample one.
    A batch whose samples measured no tensor activity is skipped (no rule can judge it: both need the field)."""
    parts = []
    for raw in src.sample_batches(SOURCE_COLUMNS, SOURCE_ROWS):
        if not len(raw) or not raw["tensor_active"].notna().any():
            continue
        col = {c: pd.to_numeric(raw[c], errors="coerce").to_numpy(float) for c in SOURCE_COLUMNS if c != "device"}
        device = raw["device"].to_numpy(object)
        ai = _run_rows(device, col["t"], ds.allocs)
        rated = pd.Series(device).map(ds.devices["rated"]).to_numpy(float)
        act, ratio = activity_and_ratio(col["sm_active"], col["tensor_active"], col["gpu_util"],
                                        col["sm_clock_mhz"], rated)
        h = col["dt"] / 3600.0 * (ai >= 0)
        parts.append(_stats(device, col["t"], ai, h, act, ratio, col["dt"],
                            {"sm": col["sm_active"], "tensor": col["tensor_active"], "dram": col["dram_active"],
                             "ops": col["fp_ops"], "fp64": col["fp64_active"], "fp32": col["fp32_active"],
                             "fp16": col["fp16_active"]}))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=list(STAT_COLUMNS))
    # a device-hour whose samples fell in two batches: its sums added (the order of the rows: as sorted)
    return pd.concat(parts, ignore_index=True).groupby(["device", "hour", "ai"], sort=True)[list(STAT_SUMS)] \
        .sum().reset_index()


def lens_hours(ds: Dataset) -> pd.DataFrame:
    """The dataset's lens sums per (device, hour, run row): those it was built with, else computed from its
    samples once."""
    if ds.lens_hours is None:
        ds.lens_hours = stats_from_samples(ds.samples)
    return ds.lens_hours


def run(ds: Dataset) -> list[Finding]:
    """Both rules over the dataset."""
    st = lens_hours(ds)
    if not len(st) or not len(ds.allocs):
        return []
    al = ds.allocs.reset_index(drop=True)
    run_of = pd.factorize(pd.MultiIndex.from_frame(al[["cluster", "job_id", "run"]].astype(object).fillna("")))[0]
    st = st.assign(rk=run_of[st["ai"].to_numpy(int)],
                   cluster=al["cluster"].to_numpy(object)[st["ai"].to_numpy(int)],
                   job_id=al["job_id"].to_numpy(object)[st["ai"].to_numpy(int)],
                   run=al["run"].to_numpy()[st["ai"].to_numpy(int)],
                   tenant=al["tenant"].to_numpy(object)[st["ai"].to_numpy(int)],
                   node=st["device"].map(ds.devices["node"]).to_numpy(object),
                   sku=st["device"].map(ds.devices["sku"]).to_numpy(object))
    return busy_not_computing(ds, st) + flops_behind_siblings(ds, st)


def _windows(hours: np.ndarray, merge_h: float, min_h: float) -> list[tuple[float, float]]:
    """Flagged hour starts (sorted, unique) merged into [start, end) windows across gaps up to ``merge_h``."""
    out: list[tuple[float, float]] = []
    for x in np.sort(np.unique(hours)):
        if out and x - out[-1][1] <= merge_h * HOUR:
            out[-1] = (out[-1][0], float(x) + HOUR)
        else:
            out.append((float(x), float(x) + HOUR))
    return [w for w in out if w[1] - w[0] >= min_h * HOUR]


def _side(a: float, b: float) -> float:
    return min(max(b - a, HOUR), 24 * HOUR)   # before / after reach, as agents.common.before_during_after's


def _mean(g: pd.DataFrame, a: float, b: float, num: str, den: str) -> float | None:
    m = (g["hour"] >= a) & (g["hour"] < b)
    d = float(g.loc[m, den].sum())
    return float(g.loc[m, num].sum()) / d if d > 0 else None


def _bda(g: pd.DataFrame, a: float, b: float, num: str, den: str) -> tuple[float | None, ...]:
    side = _side(a, b)
    return tuple(_mean(g, x, y, num, den) for x, y in ((a - side, a), (a, b), (b, b + side)))


def busy_not_computing(ds: Dataset, st: pd.DataFrame) -> list[Finding]:
    """Runs whose devices spun (SM busy, every measured pipe idle, DRAM not the bound) for hours."""
    out = []
    flagged = st[(st["spin_h"] >= SPIN_HOUR_SHARE * st["h"]) & (st["spin_h"] > 0)]
    by_run = st.groupby("rk", sort=True)
    for rk, fl in flagged.groupby("rk", sort=True):
        g = by_run.get_group(rk)
        cluster, job, run_no = g["cluster"].iloc[0], g["job_id"].iloc[0], g["run"].iloc[0]
        per_hour = g.groupby("hour")[["spin_h", "h"]].sum()
        for a, b in _windows(fl["hour"].to_numpy(float), SPIN_MERGE_H, SPIN_MIN_WINDOW_H):
            a, b = _grown(per_hour, a, b)
            w = g[(g["hour"] >= a) & (g["hour"] < b)]
            hours = float(w["spin_del"].sum())
            if hours < SPIN_MIN_GPU_H:
                continue
            devs = sorted(fl.loc[(fl["hour"] >= a) & (fl["hour"] < b), "device"].unique())
            judged = float(w["judged_h"].sum())
            share = float(w["spin_h"].sum()) / judged if judged > 0 else 0.0
            conf = clamp01(min(0.95, 0.6 + 0.2 * min(1.0, (b - a) / HOUR / 6.0 - 1.0 / 3.0)
                                    + 0.15 * max(0.0, share - 0.5) / 0.5))
            tenant = w["tenant"].dropna().iloc[0] if w["tenant"].notna().any() else None
            nodes = sorted(w["node"].dropna().unique())
            ev = (Evidence("sm_active", "fraction", *_bda(g, a, b, "sm_sum", "h")),
                  Evidence("tensor_active", "fraction", *_bda(g, a, b, "tensor_sum", "tensor_h")),
                  Evidence("fp_pipe_active_highest", "fraction", *_bda(g, a, b, "fp_sum", "fp_h"),
                           note="the highest of FP64 / FP32 / FP16 where measured"),
                  Evidence("dram_active", "fraction", *_bda(g, a, b, "dram_sum", "dram_h")),
                  Evidence("share_of_busy_time_with_every_pipe_idle", "fraction", None, share, None),
                  Evidence("tensor_gpu_hours", "GPU-h", None, float(w["tensor_del"].sum()), None,
                           note="the lens's Σ dt x tensor active x clock ratio over the window"),
                  Evidence("delivered_gpu_hours_without_math", "GPU-h", None, hours, None,
                           note="counted delivered by the time identity; the tenant's loss, in no loss line"))
            cost = prices(ds, w, ("spin_del",))["spin_del"]
            who = f"job {job} (tenant {tenant})" if tenant else f"run {job}"
            one = devs[0] if len(devs) == 1 else None
            out.append(Finding(
                AGENT, "busy_not_computing",
                make_scope(cluster=cluster, job_id=job, tenant=tenant,
                           node=nodes[0] if len(nodes) == 1 else None, device_uuid=one),
                a, b, hours, cost, conf, ev,
                f"{who} kept {'GPU ' + one if one else f'{len(devs)} GPUs'} busy (SM active "
                f"{_pct(_mean(w, a, b, 'sm_sum', 'h'))}) with every measured pipe idle for {fmt_h((b - a) / HOUR)} h: "
                f"{fmt_h(hours)} GPU-hours the receipt counts as delivered did no math (spin-waiting, a lock or a "
                f"hung collective). This is the tenant's loss, not the provider's: tell the tenant.",
                cause="not_computing", level="job",
                extra=(("run", int(run_no)), ("devices", devs), ("addressed_to", "tenant"),
                       ("provider_loss", False))))
    return out


def _grown(per_hour: pd.DataFrame, a: float, b: float) -> tuple[float, float]:
    """The window with the hours on each side where the run spun >= SPIN_EDGE_SHARE of its time (the fault's
    first and last hours, partly spinning)."""
    def spun(h: float) -> bool:
        return h in per_hour.index and per_hour.at[h, "spin_h"] >= SPIN_EDGE_SHARE * per_hour.at[h, "h"] > 0

    while spun(a - HOUR):
        a -= HOUR
    while spun(b):
        b += HOUR
    return a, b


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def flops_behind_siblings(ds: Dataset, st: pd.DataFrame) -> list[Finding]:
    """Devices whose counted FLOPs per tensor-active hour (at rated clock) trail their siblings' on the same run."""
    out = []
    c = st[(st["ops_tdel"] >= FLOPS_MIN_TENSOR_H) & (st["ops"] > 0)]
    if not len(c):
        return out
    c = c.assign(rate=c["ops"] / (c["ops_tdel"] * 3600.0))   # FLOP per tensor-active second at rated clock
    parts = []
    for _, g in c.groupby("rk", sort=True):
        if g["device"].nunique() < FLOPS_MIN_SIBLINGS + 1:
            continue
        ref = np.full(len(g), np.nan)
        hours, devs, rates = g["hour"].to_numpy(float), g["device"].to_numpy(object), g["rate"].to_numpy(float)
        for hr in np.unique(hours):
            idx = np.flatnonzero(hours == hr)
            for i in idx:
                sib = [rates[j] for j in idx if devs[j] != devs[i]]
                if len(sib) >= FLOPS_MIN_SIBLINGS:
                    ref[i] = float(np.median(sib))
        parts.append(g.assign(ref=ref, deficit=1.0 - rates / np.where(ref > 0, ref, np.nan)))
    if not parts:
        return out
    allg = pd.concat(parts)
    behind = allg["deficit"].to_numpy() >= FLOPS_DEFICIT
    for _, g in allg.groupby("rk", sort=True):
        for dev, d in g.groupby("device", sort=True):
            flagged = (d["deficit"] >= FLOPS_DEFICIT).to_numpy()
            wins = _windows(d.loc[flagged, "hour"].to_numpy(float), FLOPS_MERGE_H, FLOPS_MIN_WINDOW_H)
            if not wins:
                continue
            a, b = max(wins, key=lambda w: (w[1] - w[0], -w[0]))
            # the part's own standing against its siblings, over all its runs, away from this window and from
            # any hour it was behind (a part a little faster or slower all along): the hours short count what
            # changed, not what always was
            mine = (allg["device"] == dev).to_numpy() & ~behind & allg["ref"].notna().to_numpy() & \
                ((allg["hour"] < a - HOUR) | (allg["hour"] >= b + HOUR)).to_numpy()
            rest = allg.loc[mine, "deficit"]
            base = float(np.clip(np.median(rest), -FLOPS_DEFICIT / 2, FLOPS_DEFICIT / 2)) if len(rest) >= 2 else 0.0
            excess = (d["deficit"] - base).set_axis(d["hour"].to_numpy(float))
            while a - HOUR in excess.index and excess.get(a - HOUR, 0.0) >= FLOPS_EDGE:
                a -= HOUR   # the first and last hours, partly slow
            while b in excess.index and excess.get(b, 0.0) >= FLOPS_EDGE:
                b += HOUR
            inw = d[(d["hour"] >= a) & (d["hour"] < b) & d["ref"].notna()]
            lost = float((inw["ops_tdel"] * (inw["deficit"] - base).clip(lower=0.0)).sum())
            deficit = float(np.median(inw["deficit"]))
            length_h = (b - a) / HOUR
            far = deficit - base   # how far behind its own standing: what changed
            conf = clamp01(min(0.95, 0.55 + 0.3 * min(1.0, max(0.0, far - FLOPS_DEFICIT) / 0.12)
                                    + 0.1 * min(1.0, (length_h - FLOPS_MIN_WINDOW_H) / 6.0)))
            sibs = g[(g["device"] != dev) & (g["hour"] >= a) & (g["hour"] < b)]
            per_device = {str(x): round(float(y["ops"].sum() / (y["ops_tdel"].sum() * 3600.0)) / 1e12, 3)
                          for x, y in g[(g["hour"] >= a) & (g["hour"] < b)].groupby("device")}
            own = d.assign(rate_num=d["ops"] / 3600.0 / 1e12)
            clk_own = _mean(d, a, b, "ops_ratio", "ops_h")
            clk_sib = float(sibs["ops_ratio"].sum() / sibs["ops_h"].sum()) if float(sibs["ops_h"].sum()) > 0 else None
            ev = (Evidence("tflops_per_tensor_active_second_at_rated_clock", "TFLOP/s", *_bda(own, a, b, "rate_num",
                                                                                            "ops_tdel"),
                           reference=float(np.median(inw["ref"])) / 1e12, reference_label="siblings on the same run "
                           "(median of the others each hour)"),
                  Evidence("deficit_against_siblings", "fraction", None, deficit, None, reference=base,
                           reference_label="its own deficit outside the window (the hours short count past it)"),
                  Evidence("clock_ratio", "fraction", None, clk_own, None, reference=clk_sib,
                           reference_label="siblings on the same run"),
                  Evidence("tensor_gpu_hours", "GPU-h", None, float(inw["ops_tdel"].sum()), None,
                           note="Σ dt x tensor active x clock ratio with counted FLOPs, in the window"))
            cluster, job, run_no = g["cluster"].iloc[0], g["job_id"].iloc[0], g["run"].iloc[0]
            rack = ds.devices.at[dev, "rack"] if dev in ds.devices.index else None
            tenant = d["tenant"].dropna().iloc[0] if d["tenant"].notna().any() else None
            node = d["node"].iloc[0]
            cost = prices(ds, inw.assign(lost=inw["ops_tdel"] * (inw["deficit"] - base).clip(lower=0.0)), ("lost",))["lost"]
            out.append(Finding(
                AGENT, "flops_behind_siblings",
                make_scope(cluster=cluster, job_id=job, tenant=tenant, node=node, device_uuid=dev,
                           rack=rack if isinstance(rack, str) and rack else None),
                a, b, lost, cost, conf, ev,
                f"GPU {dev} on {node} did {deficit:.0%} fewer counted FLOPs per tensor-active hour than its "
                f"siblings on {('job ' + str(job)) if job else 'the same run'} for {fmt_h(length_h)} h, at the clock "
                f"ratio {_pct(clk_own)} against their {_pct(clk_sib)}: a slow part the clock does not show "
                f"({fmt_h(lost)} tensor GPU-hours short).", cause="slow_part", level="device",
                extra=(("run", int(run_no)), ("per_device_tflops", per_device))))
    return out
