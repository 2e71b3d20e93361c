"""Attribution agent: turns clock-event reasons, clocks, power, temperatures, activity, memory and scheduler context
into causes, each priced in GPU-hours and money (docs/agents.md, "Attribution").

- hot because cooling: temperature above the device's own normal *at the same power* (a per-device linear
  temperature-vs-power model, fitted robustly) and above the other racks' at the same hour -> rack (most of a
  rack's nodes) or node (one node) facility problem, or one device hotter than its siblings at the same power
  (its own cooling); priced as the thermal-throttle GPU-hours in that window.
- hot because working: thermal throttling where temperature matches the device's own normal at that power.
- power cap: most loaded samples of a node carry the SW power-cap reason bit (0x4) -> node-scope finding.
- cool because starved: a run whose devices hold a resident process while activity collapses below the
  method's threshold (its start-up, loading with memory filling, excepted); joined with application progress
  marks and with other runs starving at the same hours.
- idle held: allocated devices with no process (XID-induced stalls are left to the drift agent).
- unknown gaps: every unknown_interval entry, and allocated time with no samples that no entry explains
  (a whole node silent = collector down).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .common import before_during_after, evidence, fmt_h, fmt_ts, label_equals, price, windows
from .data import ACTIVE_MIN, RESIDENT_FB_MIB, Dataset, coverage_gaps
from .hourstats import hour_stats
from .model import Evidence, Finding, clamp01, make_scope

AGENT = "attribution"
HOUR = 3600.0
COOL_RESID_C = 5.0          # median temperature excess at the same power that counts as "hot"
COOL_MARGIN_C = 4.0         # ... and by how much it must exceed the other racks at the same hour
COOL_NODE_FRAC = 0.6        # share of a rack's nodes that must be hot for a rack-scope finding
COOL_NODE_DEVICES = 0.5     # share of a node's devices (with data that hour) hot for a node-hour to be hot
COOL_DEVICE_SIBLINGS = 4    # devices of a node with data in an hour (the hot one included) to compare one GPU
COOL_DEVICE_POWER = 0.10    # ... drawing at most this much more power than their median (hot at the same power)
COOL_DEVICE_POWER_W = 10.0  # ... plus this much (a few watts of noise at low power)
PCAP_FRAC = 0.5             # share of a node's (or one device's) loaded samples with the power-cap bit
PCAP_DEVICE_MIN_H = 0.25    # GPU-hours a single capped device must lose to be a finding of its own
STARVED_MIN_H = 0.5         # GPU-hours of starvation before a run gets a finding
IDLE_MIN_H = 1.0            # GPU-hours idle held ...
IDLE_MIN_SHARE = 0.10       # ... and share of the run's paid time,
IDLE_ABS_H = 2.0            # ... or this many GPU-hours whatever the share (one idle GPU of a big, long job)
STARTUP_MAX_S = 20 * 60.0   # a run's start-up (loading, compiling) at low activity lasts at most this long ...
STARTUP_FB_SHARE = 0.9      # ... until its framebuffer reaches this share of what the run holds (its median while held)
WORKING_MIN_H = 0.25        # thermal-throttled GPU-hours of a device before it gets a hot-because-working finding
OWN_NORMAL_Q = 0.2          # a device's normal: this quantile of its hourly (temp - k * power) medians ...
OWN_NORMAL_CAP_C = 3.0      # ... at most this far above the fleet's median normal
OWN_SLOPE_HOURS = 6         # a device's level that follows its own power (its temperature per watt steeper than the
OWN_SLOPE_SPREAD_W = 25.0   # fleet's: its chassis, by design) over >= this many hours spread over >= this many W
OWN_SLOPE_R2 = 0.8          # ... this closely (R^2 of level on power) is its normal line: hot because it works
THERMAL = 0                 # index of "thermal" in THROTTLE_REASONS
POWER_CAP = 1
HW_SLOWDOWN = 2
SYNC_BOOST = 3
REASON_MIN_H = 0.25         # GPU-hours a device (hw slowdown) or a node's group (sync boost) must lose
REASON_NODE_MIN_H = 0.05    # GPU-hours the HW slowdown of most of a node's GPUs together must lose (the bits agree)
REASON_CONF = 0.65          # the reason bit is the board's own word, but not why it was asserted


@dataclass(frozen=True)
class ResidualModel:
    """Temperature against the device's own normal at that power: temp = b_dev + k * power, k shared by the fleet.

    One rule for a 24-hour export and a week of ledger, so that both decide cooling vs working alike, and one
    that the hourly statistics hold exactly (:mod:`ledger.agents.hourstats`), so device-hours and every sample
    decide alike:

    - k is the pooled slope of temperature on power *within* each device-hour (both demeaned per device-hour), over
      samples without a thermal reason bit: how a device's temperature follows its own power from minute to minute,
      which a cooling failure (a shift of the whole hour) does not bend; from the fit's sums,
      k = sum(S_pt - S_p S_t / n) / sum(S_pp - S_p^2 / n) over device-hours;
    - a device-hour's level is the *mean* of (temp - k * power) over its running samples with both measured;
    - b_dev is a low quantile (OWN_NORMAL_Q) of the device's hourly levels: its normal holds while a fault covers
      less than most of its history, where a median needs half;
    - a device hot for (nearly) all of its history would make that its normal: b_dev is capped at the fleet's
      median normal + OWN_NORMAL_CAP_C, so it still stands out against its siblings and the other racks.
    """

    k: float
    own: pd.Series        # device -> b_dev
    fleet: float
    hours: pd.DataFrame   # device, hour, n (samples), r (mean residual), power (mean power)
    slope: pd.Series | None = None   # device -> its own extra temperature per watt (own_slopes), where it has one

    def of(self, s: pd.DataFrame) -> pd.Series:
        """Each sample's residual (NaN where not running or power or temperature unmeasured)."""
        ok = s["running"].astype(bool) & s["temp"].notna() & s["power"].notna()
        b = s["device"].map(self.own).astype(float).fillna(self.fleet)
        k = self.k + (s["device"].map(self.slope).astype(float).fillna(0.0) if self.slope is not None else 0.0)
        return (s["temp"] - (b + k * s["power"])).where(ok)


def residual_model(ds: Dataset) -> ResidualModel:
    h = hour_stats(ds)
    fit = h[h["fit_n"] > 0]
    n = fit["fit_n"].to_numpy(float)
    sxx = float((fit["fit_pp"] - fit["fit_p"] ** 2 / n).sum()) if len(fit) else 0.0
    sxy = float((fit["fit_pt"] - fit["fit_p"] * fit["fit_t"] / n).sum()) if len(fit) else 0.0
    k = sxy / sxx if sxx > 0 else 0.0
    hot = h[h["hot_n"] > 0]
    hn = hot["hot_n"].to_numpy(float)
    level = pd.Series((hot["hot_t"].to_numpy(float) - k * hot["hot_p"].to_numpy(float)) / hn,
                      index=hot["device"].to_numpy())
    own = level.groupby(level=0).quantile(OWN_NORMAL_Q)
    fleet = float(own.median()) if len(own) else 0.0
    # the cap: the median normal of the device's node (>= 4 devices), else the fleet's: a GPU hot all along stands
    # out against its siblings; a whole node hot all along (a chassis with less airflow by design) is its own normal
    nd_of = own.index.map(ds.devices["node"]) if "node" in ds.devices else pd.Index([None] * len(own))
    by_node = own.groupby(np.asarray(nd_of, dtype=object)).agg(["median", "size"]) if len(own) else None
    ref = np.full(len(own), fleet)
    if by_node is not None:
        med = pd.Series(np.asarray(nd_of, dtype=object)).map(by_node["median"].where(by_node["size"] >= 4))
        ref = np.where(med.notna().to_numpy(), med.to_numpy(float, na_value=np.nan), fleet)
    own = own.clip(upper=pd.Series(ref, index=own.index) + OWN_NORMAL_CAP_C)
    power = hot["hot_p"].to_numpy(float) / hn
    devs = hot["device"].to_numpy()
    line_b, slope = own_slopes(devs, power, level.to_numpy(), hn)
    node = hot["device"].map(ds.devices["node"]).to_numpy(object) if "node" in ds.devices else None
    if node is not None:   # a chassis is every GPU of its node: their hours pooled, for devices of too little spread
        known = pd.notna(node)
        nb, nk = own_slopes(node[known].astype(str), power[known], level.to_numpy()[known], hn[known])
        for d, nd in zip(devs[known], node[known].astype(str)):
            if nd in nk and d not in slope:
                line_b[d], slope[d] = nb[nd], nk[nd]
    own = pd.Series(line_b, dtype=float).combine_first(own)
    b = hot["device"].map(own).to_numpy(float) + hot["device"].map(slope).fillna(0.0).to_numpy(float) * power
    hours = pd.DataFrame({"device": hot["device"].to_numpy(), "hour": hot["hour"].to_numpy(float), "n": hn,
                          "r": level.to_numpy() - b, "power": power})
    return ResidualModel(k, own, fleet, hours, pd.Series(slope, dtype=float))


def own_slopes(device: np.ndarray, power: np.ndarray, level: np.ndarray, n: np.ndarray) -> tuple[dict, dict]:
    """(device -> intercept, device -> slope) of the devices (or, pooled, nodes) whose hourly level (temp - k * power) follows their own
    hourly power in a line: >= OWN_SLOPE_HOURS hours, power spread (sd) >= OWN_SLOPE_SPREAD_W, a rising line that
    explains the level (weighted R^2 >= OWN_SLOPE_R2). Such a device is hotter per watt than the fleet all along (a
    chassis with less airflow by design) and only as hot as its power makes it: its normal is that line, not a
    constant. A cooling failure is a step in time the power does not explain (and a throttled device draws less
    while it is hotter), so it does not fit one rising line."""
    out_b: dict = {}
    out_k: dict = {}
    order = np.argsort(device, kind="stable")
    d, p, y, w = device[order], power[order], level[order], n[order]
    cuts = np.flatnonzero(d[1:] != d[:-1]) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(d)]):
        if hi - lo < OWN_SLOPE_HOURS:
            continue
        pp, yy, ww = p[lo:hi], y[lo:hi], w[lo:hi]
        mp, my = np.average(pp, weights=ww), np.average(yy, weights=ww)
        vp = np.average((pp - mp) ** 2, weights=ww)
        vy = np.average((yy - my) ** 2, weights=ww)
        if vp < OWN_SLOPE_SPREAD_W ** 2 or vy <= 0:
            continue
        cov = np.average((pp - mp) * (yy - my), weights=ww)
        beta = cov / vp
        if beta > 0 and cov * cov / (vp * vy) >= OWN_SLOPE_R2:
            out_b[d[lo]] = my - beta * mp
            out_k[d[lo]] = beta
    return out_b, out_k


def _group_col(ds: Dataset) -> str:
    return "rack" if ds.samples["rack"].notna().any() else "node"


def _wmean(f: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group: the samples' mean residual (device-hour means weighted by their samples) and the samples."""
    g = f.assign(rn=f["r"] * f["n"]).groupby(keys)[["rn", "n"]].sum()
    return pd.DataFrame({"median": g["rn"] / g["n"], "size": g["n"]}).reset_index()


def cooling_windows(ds: Dataset, model: ResidualModel) -> list[tuple]:
    """(level, name, start, end, flagged hours) of each cooling window, decided from the hourly residuals: a rack
    (most of its nodes) or a node hotter than its own normal at the same power and than the others that hour."""
    gcol = _group_col(ds)
    topo = ds.devices.sort_index()
    f = model.hours.assign(node=model.hours["device"].map(topo["node"]))
    f = f[f["node"].notna()]
    if not len(f):
        return []
    node_grp = topo.dropna(subset=["node"]).drop_duplicates("node").set_index("node")["rack"]
    f["grp"] = f["node"].map(node_grp) if gcol == "rack" else f["node"]
    node_h = _wmean(f, ["node", "hour"]).rename(columns={"median": "nr", "hour": "hb"}).drop(columns=["size"])
    node_h["grp"] = node_h["node"].map(node_grp) if gcol == "rack" else node_h["node"]
    grp_h = _wmean(f.dropna(subset=["grp"]), ["grp", "hour"]).rename(columns={"hour": "hb"})
    fleet_h = grp_h.groupby("hb")["median"].agg(list)
    out: list[tuple] = []
    rack_flag_hours: dict[str, np.ndarray] = {}
    if gcol == "rack":
        others = []
        for row in grp_h.itertuples():
            meds = [m for m in fleet_h[row.hb]]
            rest = [m for m in meds if m != row.median] or [0.0]
            others.append(float(np.median(rest)))
        grp_h["others"] = others
        hot_nodes = node_h.assign(hot=node_h["nr"] >= COOL_MARGIN_C).groupby(["grp", "hb"])["hot"].mean()
        grp_h["node_frac"] = [hot_nodes.get((g, h), 0.0) for g, h in zip(grp_h["grp"], grp_h["hb"])]
        flag = (grp_h["median"] >= COOL_RESID_C) & (grp_h["median"] - grp_h["others"] >= COOL_MARGIN_C) & \
               (grp_h["node_frac"] >= COOL_NODE_FRAC) & (grp_h["size"] >= 4)
        for rack, g in grp_h[flag].groupby("grp"):
            rack_flag_hours[rack] = g["hb"].to_numpy()
            for a, b in windows(g["hb"].to_numpy(), HOUR, 2 * HOUR, 2 * HOUR):
                out.append(("rack", rack, a, b))
    # a single hot node whose rack is fine
    med_map = grp_h.set_index(["grp", "hb"])["median"]
    node_h["rack_med"] = med_map.reindex(pd.MultiIndex.from_arrays([node_h["grp"], node_h["hb"]])).fillna(0.0).to_numpy()
    if gcol == "node":  # no topology (imported telemetry): compare each node with the other nodes at the same hour
        node_h["rack_med"] = _others_median(node_h)
    # a node is hot when most of it is: one GPU far hotter than its siblings lifts the node's mean, but it is that
    # GPU's cooling (the device rule below), not the node's
    dev_hot = f.assign(h=f["r"] >= COOL_MARGIN_C).groupby(["node", "hour"])["h"].mean()
    node_h["dev_frac"] = dev_hot.reindex(pd.MultiIndex.from_arrays([node_h["node"], node_h["hb"]])).fillna(0.0).to_numpy()
    nflag = (node_h["nr"] >= COOL_RESID_C) & (node_h["nr"] - node_h["rack_med"] >= COOL_MARGIN_C) & \
            (node_h["dev_frac"] >= COOL_NODE_DEVICES)
    node_flag_hours: dict[str, np.ndarray] = {}
    for node, g in node_h[nflag].groupby("node"):
        hrs = g["hb"].to_numpy()
        rack_hours = rack_flag_hours.get(g["grp"].iloc[0], np.zeros(0))
        node_flag_hours[node] = np.concatenate([g["hb"].to_numpy(), rack_hours])
        hrs = hrs[~np.isin(hrs, rack_hours)]
        for a, b in windows(hrs, HOUR, 2 * HOUR, 2 * HOUR):
            out.append(("node", node, a, b))
    for grp, hrs in rack_flag_hours.items():   # a hot rack's nodes that were not hot themselves
        for node in node_grp.index[node_grp == grp]:
            node_flag_hours.setdefault(node, hrs)
    return out + _hot_devices(f, node_flag_hours)


def _hot_devices(f: pd.DataFrame, node_flag_hours: dict[str, np.ndarray]) -> list[tuple]:
    """("device", uuid, start, end) of one GPU hotter than its own normal at the same power *and* than its siblings
    in the node, drawing no more power than they do (the board's own cooling: a fan, a heatsink, its paste), outside
    the hours its node or rack is hot. Per device-hour (``f``: the model's hours with their node): residual >=
    COOL_RESID_C, >= COOL_MARGIN_C above the node-hour's median residual (>= COOL_DEVICE_SIBLINGS devices with data
    that hour), mean power <= the node-hour's median power x (1 + COOL_DEVICE_POWER) + COOL_DEVICE_POWER_W;
    windows as the node's."""
    f = f[f["n"] >= 3]
    g = f.groupby(["node", "hour"])
    f = f.assign(sib_r=g["r"].transform("median"), sib_p=g["power"].transform("median"), m=g["r"].transform("size"))
    flag = (f["r"] >= COOL_RESID_C) & (f["r"] - f["sib_r"] >= COOL_MARGIN_C) & (f["m"] >= COOL_DEVICE_SIBLINGS) & \
           (f["power"] <= f["sib_p"] * (1 + COOL_DEVICE_POWER) + COOL_DEVICE_POWER_W)
    out = []
    for (node, dev), d in f[flag].groupby(["node", "device"]):
        hrs = d["hour"].to_numpy(float)
        hrs = hrs[~np.isin(hrs, node_flag_hours.get(node, np.zeros(0)))]
        for a, b in windows(hrs, HOUR, 2 * HOUR, 2 * HOUR):
            out.append(("device", dev, a, b))
    return out


def cooling(ds: Dataset, model: ResidualModel) -> list[Finding]:
    return [_cool_finding(ds, model, level, name, a, b) for level, name, a, b in cooling_windows(ds, model)]


def _others_median(node_h: pd.DataFrame) -> np.ndarray:
    """Per node-hour: the median of the *other* nodes' residuals that hour (all of them when fewer than 3)."""
    out = np.zeros(len(node_h))
    nr = node_h["nr"].to_numpy(float)
    for idx in node_h.groupby("hb").indices.values():
        v = nr[idx]
        out[idx] = np.median(v) if len(v) < 3 else [np.median(np.delete(v, i)) for i in range(len(v))]
    return out


def _cool_finding(ds: Dataset, model: ResidualModel, level: str, name: str, a: float, b: float) -> Finding:
    s = ds.samples
    col = {"rack": "rack", "node": "node", "device": "device"}[level]
    inscope = s[col] == name
    sl = s[inscope]
    sl = sl.assign(resid=model.of(sl))
    win = sl[(sl["t"] >= a) & (sl["t"] < b)]
    loss_rows = win[win["rbucket"] == THERMAL]
    hours = float(loss_rows["h_thr"].sum())
    cost = price(ds, loss_rows, "h_thr")
    # the others' reference from their device-hours (the median of their hourly means), not their every sample
    mh = model.hours
    scope_devs = {name} if level == "device" else set(ds.devices.index[ds.devices[col] == name])
    oth = mh[~mh["device"].isin(scope_devs) & (mh["hour"] >= a) & (mh["hour"] < b)]
    if level == "device":   # the reference is its siblings in the node, not the fleet
        node = sl["node"].iloc[0]
        oth = oth[oth["device"].isin(ds.devices.index[ds.devices["node"] == node])]
    ref_label = ("its siblings in the node, same hours (median of their device-hour means)" if level == "device"
                 else "other racks/nodes, same hours (median of their device-hour means)")
    loaded = sl[sl["running"] & (sl["act"] >= 0.2)]
    mres = float(win["resid"].median()) if win["resid"].notna().any() else 0.0
    nodes = sorted(win.loc[win["resid"] > COOL_MARGIN_C, "node"].dropna().unique())
    ev = (
        evidence(sl, "resid", "gpu_temp_c_above_own_normal_at_same_power", "degC", a, b,
                 reference=float(oth["r"].median()) if len(oth) else None, reference_label=ref_label),
        evidence(loaded, "temp", "gpu_temp_c_under_load", "degC", a, b),
        evidence(loaded, "power", "power_w_under_load", "W", a, b,
                 reference=float(oth["power"].median()) if len(oth) else None,
                 reference_label=ref_label.replace(", same", " running, same")),
        evidence(loaded, "clk", "sm_clock_mhz_under_load", "MHz", a, b),
        evidence(loaded.assign(th=(loaded["rbucket"] == THERMAL) & (loaded["h_thr"] > 0)), "th",
                 "share_of_samples_with_thermal_reason_bit", "fraction", a, b, stat="mean"),
    )
    frac = len(nodes) / max(1, sl["node"].nunique())
    conf = clamp01(0.55 + 0.04 * (mres - COOL_RESID_C) + 0.25 * frac + (0.05 if hours > 1 else 0.0))
    conf = min(conf, 0.97)
    node = sl["node"].iloc[0] if len(sl) else None
    where = {"rack": f"rack {name}", "node": f"node {name}", "device": f"GPU {name} on {node}"}[level]
    others_word = {"rack": "the other racks", "node": "its siblings", "device": "its siblings at the same power"}[level]
    what = "the board's own cooling (fan, heatsink, thermal paste)" if level == "device" else "a cooling problem"
    summary = (f"{where} ran {mres:.0f} degC hotter than its normal at the same power from {fmt_ts(a)} to "
               f"{fmt_ts(b)} while {others_word} did not: {what}, costing {fmt_h(hours)} GPU-hours of "
               f"thermal throttling.")
    rack = name if level == "rack" else (sl["rack"].dropna().iloc[0] if sl["rack"].notna().any() else None)
    scope = make_scope(rack=rack, node=None if level == "rack" else node,
                       device_uuid=name if level == "device" else None)
    return Finding(AGENT, "hot_because_cooling", scope, a, b, hours, cost, conf, ev, summary, cause="cooling",
                   level=level, extra=(("nodes", nodes),))


def hot_because_working(ds: Dataset, model: ResidualModel, cooling_found: list[Finding]) -> list[Finding]:
    s = ds.samples
    th = s[(s["rbucket"] == THERMAL) & (s["h_thr"] > 0)]
    th = th.assign(resid=model.of(th))
    for f in cooling_found:
        sc = f.scope_dict()
        col, name = {"rack": ("rack", sc["rack"]), "device": ("device", sc["device_uuid"])}.get(f.level,
                                                                                             ("node", sc["node"]))
        th = th[~((th[col] == name) & (th["t"] >= f.start) & (th["t"] < f.end))]
    # a run that throttled on several of its devices is one finding at job scope, its loss summed over them
    ndev = th[th["job_id"].notna()].groupby(list(RUN_KEY), dropna=False)["device"].transform("nunique")
    multi = pd.Series(False, index=th.index)
    multi.loc[ndev.index] = ndev >= 2
    jobs = _working_jobs(ds, model, th[multi])
    out = []
    for dev, g in th[~multi].groupby("device"):
        hours = float(g["h_thr"].sum())
        if hours < WORKING_MIN_H or g["resid"].median() > 3.0:
            continue
        a, b = float(g["t"].min()), float(g["t"].max() + ds.cadence)
        full = s[s["device"] == dev]
        full = full.assign(resid=model.of(full))
        ev = (evidence(full[full["act"] >= 0.2], "power", "power_w_under_load", "W", a, b),
              evidence(full, "resid", "gpu_temp_c_above_own_normal_at_same_power", "degC", a, b),
              Evidence("thermal_throttled_samples", "count", None, float(len(g)), None))
        node = g["node"].iloc[0]
        out.append(Finding(AGENT, "hot_because_working", make_scope(device_uuid=dev, node=node,
                           rack=g["rack"].iloc[0]), a, b, hours, price(ds, g, "h_thr"), 0.6, ev,
                           f"GPU {dev} on {node} throttled for heat {len(g)} times at high power, with temperatures "
                           f"normal for that power: the workload, not the facility ({fmt_h(hours)} GPU-hours).",
                           cause="workload", level="device"))
    return out + jobs


def _working_jobs(ds: Dataset, model: ResidualModel, th: pd.DataFrame) -> list[Finding]:
    """Hot because working at job scope: a run that throttled for heat on several of its devices and lost at least
    WORKING_MIN_H over all of them (each may lose less), at temperatures normal for their power."""
    s = ds.samples
    out = []
    for key, g in _runs(th[th["job_id"].notna()]):
        hours = float(g["h_thr"].sum())
        if hours < WORKING_MIN_H or not g["resid"].notna().any() or g["resid"].median() > 3.0:
            continue
        cluster, job, run = key
        a, b = float(g["t"].min()), float(g["t"].max() + ds.cadence)
        devs = sorted(str(d) for d in g["device"].unique())
        full = s[s["device"].isin(devs) & (s["job_id"] == job) & (s["run"] == run)]
        full = full.assign(resid=model.of(full))
        loaded = full[full["act"] >= 0.2]
        ev = (evidence(loaded, "power", "power_w_under_load", "W", a, b),
              evidence(loaded, "act", "activity_under_load", "fraction", a, b,
                       note="SM activity, tensor activity where SM is not exported"),
              evidence(full, "resid", "gpu_temp_c_above_own_normal_at_same_power", "degC", a, b,
                       note="the cooling is normal when this is near 0"),
              Evidence("thermal_throttled_samples", "count", None, float(len(g)), None),
              Evidence("devices_throttled", "count", None, float(len(devs)), None))
        tenant = g["tenant"].dropna().iloc[0] if "tenant" in g and g["tenant"].notna().any() else None
        out.append(Finding(AGENT, "hot_because_working", make_scope(cluster=cluster, job_id=job, tenant=tenant), a, b, hours, price(ds, g, "h_thr"), 0.6, ev,
                           f"{_who(job, tenant)} throttled for heat on {len(devs)} GPUs at high power, with "
                           f"temperatures normal for that power: the workload, not the facility "
                           f"({fmt_h(hours)} GPU-hours over the job).", cause="workload", level="job",
                           extra=(("devices", devs),)))
    return out


def _capped_hours(loaded: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per (key, hour): the share of loaded samples carrying the SW power-cap bit, and how many there were."""
    f = pd.DataFrame({key: loaded[key], "hb": (loaded["t"] // HOUR) * HOUR,
                      "cap": loaded["rbucket"].eq(POWER_CAP) & (loaded["h_thr"] > 0)})
    return f.groupby([key, "hb"])["cap"].agg(["mean", "size"]).reset_index()


def _edges(rows: pd.DataFrame, a: float, b: float, cadence: float) -> tuple[float, float]:
    """A window of whole flagged hours tightened (or widened, by up to an hour) to its first and last capped
    sample, so a cap that starts or ends mid-hour is counted whole and the window says when it held."""
    cap = rows[(rows["rbucket"] == POWER_CAP) & (rows["h_thr"] > 0) & (rows["t"] >= a - HOUR) & (rows["t"] < b + HOUR)]
    if not len(cap):
        return a, b
    return float(cap["t"].min()), float(cap["t"].max() + cadence)


def power_cap(ds: Dataset) -> list[Finding]:
    """Node scale when most of a node's loaded samples are capped; device scale for one capped GPU of a node
    (a misset limit on one board) when its loss passes an absolute floor."""
    s = ds.samples
    # the columns _capped_hours reads: a copy of every column of the loaded samples is most of the frame
    loaded = s.loc[s["running"] & (s["act"] >= 0.2), ["node", "device", "t", "rbucket", "h_thr"]]
    if not len(loaded):
        return []
    out = []
    node_windows: dict[str, list[tuple[float, float]]] = {}
    for node, g in _capped_hours(loaded, "node").groupby("node"):
        flagged = g[(g["mean"] >= PCAP_FRAC) & (g["size"] >= 3)]["hb"].to_numpy()
        for a, b in windows(flagged, HOUR, 6 * HOUR, HOUR):
            node_windows.setdefault(node, []).append((a, b))
            frac = float(g[(g["hb"] >= a) & (g["hb"] < b)]["mean"].mean())
            out.append(_cap_finding(ds, "node", node, s[s["node"] == node], a, b, frac))
    dh = _capped_hours(loaded, "device")
    dh = dh[(dh["mean"] >= PCAP_FRAC) & (dh["size"] >= 3)]
    rows_of = s.groupby("device").indices if len(dh) else {}
    for dev, g in dh.groupby("device"):
        flagged = g["hb"].to_numpy()
        sl = s.iloc[rows_of[dev]]
        node = sl["node"].iloc[0]
        for a, b in windows(flagged, HOUR, 6 * HOUR, HOUR):
            if any(a < nb and b > na for na, nb in node_windows.get(node, [])):
                continue   # the node's finding covers it
            a, b = _edges(sl, a, b, ds.cadence)
            f = _cap_finding(ds, "device", dev, sl, a, b, float(g[(g["hb"] >= a - HOUR) & (g["hb"] < b)]["mean"].mean()))
            if f.gpu_hours >= PCAP_DEVICE_MIN_H:
                out.append(f)
    return out


def _cap_finding(ds: Dataset, level: str, name: str, sl: pd.DataFrame, a: float, b: float, frac: float) -> Finding:
    win = sl[(sl["t"] >= a) & (sl["t"] < b)]
    rows = win[win["rbucket"] == POWER_CAP]
    hours = float(rows["h_thr"].sum())
    ld = sl[sl["running"] & (sl["act"] >= 0.2)]
    ev = (evidence(ld.assign(c=(ld["rbucket"] == POWER_CAP) & (ld["h_thr"] > 0)), "c",
                   "share_of_loaded_samples_with_power_cap_bit_0x4", "fraction", a, b, stat="mean"),
          evidence(ld, "power", "power_w_under_load_p95", "W", a, b, stat="p95"),
          evidence(ld, "clk", "sm_clock_mhz_under_load", "MHz", a, b,
                   reference=float(ld["rated"].median()), reference_label="SKU rated SM clock"),
          evidence(ld, "act", "sm_active_under_load", "fraction", a, b))
    ceiling = float(win.loc[win["running"], "power"].quantile(0.99)) if win["running"].any() else 0.0
    conf = min(clamp01(0.6 + 0.35 * frac), 0.97)
    rack = sl["rack"].dropna().iloc[0] if sl["rack"].notna().any() else None
    node = sl["node"].iloc[0]
    if level == "node":
        scope, what = make_scope(node=node, rack=rack), f"node {node} held its GPUs"
    else:
        scope, what = make_scope(node=node, rack=rack, device_uuid=name), f"GPU {name} on {node} was held"
    return Finding(AGENT, "power_cap", scope, a, b, hours, price(ds, rows, "h_thr"), conf, ev,
                   f"{what} at a {ceiling:.0f} W power cap from {fmt_ts(a)} to {fmt_ts(b)}, slowing "
                   f"{'their' if level == 'node' else 'its'} clocks under load: {fmt_h(hours)} GPU-hours lost.",
                   cause="power_cap", level=level, extra=(("power_ceiling_w", round(ceiling, 1)),))


def _who(job: str, tenant: str | None) -> str:
    return f"job {job} (tenant {tenant})" if tenant else f"run {job}"


RUN_KEY = ("cluster", "job_id", "run")
NO_SCHEDULER_RUN = "node:"   # the importers' run per node of a capture with no job labels (importers/pipeline.py)


def _runs(frame: pd.DataFrame) -> pd.core.groupby.DataFrameGroupBy:
    return frame.groupby(list(RUN_KEY), dropna=False)


def _run_rows(s: pd.DataFrame, columns: tuple[str, ...]):  # noqa: ANN202
    """(cluster, job, run) -> that run's samples (these columns), from one groupby (not a scan per run, nor a
    copy of the allocated samples: the rows are taken from ``s`` when asked for, and only the columns read)."""
    alloc = np.flatnonzero(s["ai"].to_numpy() >= 0)
    idx = s[list(RUN_KEY)].iloc[alloc].groupby(list(RUN_KEY), dropna=False).indices   # the keys' columns only
    cols = s[list(columns)]
    return lambda key: cols.iloc[alloc[idx[key]]] if key in idx else cols.iloc[0:0]


def startup_mask(ds: Dataset) -> pd.Series:
    """The samples of each run's start-up on each of its devices (loading a model, compiling): from the run's start
    (its first sample within 2 cadences of the allocation's start) until the framebuffer is loaded (its first
    reading at STARTUP_FB_SHARE or more of the run's median while the device is held), when that comes within
    STARTUP_MAX_S of the start. Memory filling is the sign, not activity: loading and compiling flicker above the
    method's ``active_min`` and back. Normal life, not a starved job; the receipt's starved bucket is unchanged.

    A capture with no job labels has one run per node (``node:...``) over the whole capture, so its jobs' starts
    are not the allocation's: there a job starts wherever a device that held nothing (no process, framebuffer at
    most the method's ``resident_fb_mib``) is held again one cadence later, and the same rule reads from there."""
    s = ds.samples
    out = np.zeros(len(s), dtype=bool)
    ai = s["ai"].to_numpy()
    sel = np.flatnonzero(ai >= 0)
    if not len(sel) or not len(ds.allocs):
        return pd.Series(out, index=s.index)
    fb = s["fb"].to_numpy(float)[sel]
    held = (np.nan_to_num(s["procs"].to_numpy(float)[sel]) > 0) | (np.nan_to_num(fb) > RESIDENT_FB_MIB)
    f = pd.DataFrame({"i": sel, "ai": ai[sel], "t": s["t"].to_numpy(float)[sel],
                      "act": s["act"].to_numpy(float)[sel], "fb": fb, "held": held})
    f = f.sort_values(["ai", "t"], kind="stable")
    a0 = ds.allocs["start"].to_numpy(float)[f["ai"].to_numpy()]
    capture = ds.allocs["job_id"].astype(str).str.startswith(NO_SCHEDULER_RUN).to_numpy()[f["ai"].to_numpy()]
    # a job's start inside a label-less capture: held now, free at the sample one cadence before (same device)
    prev_t = f["t"].groupby(f["ai"]).shift(1)
    prev_free = ~f["held"].groupby(f["ai"]).shift(1, fill_value=True).astype(bool)
    arrived = capture & f["held"].to_numpy() & prev_free.to_numpy() & \
        (f["t"] - prev_t <= 1.01 * ds.cadence).to_numpy()
    stretch = pd.Series(arrived, index=f.index).groupby(f["ai"]).cumsum()
    by = [f["ai"], stretch]
    # loaded: the framebuffer has reached STARTUP_FB_SHARE of what the run holds (its median while held); the
    # start-up is the stretch before that, when it comes within STARTUP_MAX_S of the start
    plateau = f["fb"].where(f["held"]).groupby(by).transform("median")
    loaded = pd.Series(f["fb"].to_numpy() >= STARTUP_FB_SHARE * plateau.to_numpy(), index=f.index)
    lead = ~loaded.groupby(by).cummax()
    t_first = f["t"].groupby(by).transform("min")
    t_on = f["t"].where(loaded).groupby(by).transform("min")
    began = np.where(stretch.to_numpy() > 0, True, (t_first - a0 <= 2 * ds.cadence).to_numpy())
    ok = lead & began & (t_on - t_first <= STARTUP_MAX_S)
    out[f["i"].to_numpy()[ok.to_numpy()]] = True
    return pd.Series(out, index=s.index)


def starved(ds: Dataset) -> list[Finding]:
    s = ds.samples
    st = s.loc[(s["h_starved"] > 0) & ~startup_mask(ds), [*RUN_KEY, "t", "device", "h_starved", "tenant", "sku",
                                                           "node"]]
    if not len(st):
        return []
    hours_by_hour = st.groupby((st["t"] // HOUR) * HOUR)["job_id"].nunique()
    rows_of = _run_rows(s, ("t", "h_starved", "act", "power", "fb"))
    out = []
    for (cluster, job, run), g in _runs(st):
        hours = float(g["h_starved"].sum())
        if hours < STARVED_MIN_H:
            continue
        if _longest_stretch(g, ds.cadence) < 2:   # consecutive starved samples on one device
            continue
        a, b = float(g["t"].min()), float(g["t"].max() + ds.cadence)
        runs = rows_of((cluster, job, run))
        prog = ds.progress
        # the application's checkpoint marks (ipledger mark checkpoint); a step or an output is no checkpoint
        marks = prog[(prog["job_id"] == job) & (prog["run"] == run) & (prog["kind"] == "checkpoint")]["t"].to_numpy()
        ends = g.groupby((g["t"].diff() > ds.cadence * 1.01).cumsum())["t"].max().to_numpy() + ds.cadence
        aligned = float(np.mean([np.any(np.abs(marks - e) <= 2 * ds.cadence) for e in ends])) if len(marks) else 0.0
        hb = np.unique((g["t"] // HOUR) * HOUR)
        concurrent = int(hours_by_hour.reindex(hb).max() - 1) if len(hb) else 0
        cause = "checkpoint_starved" if aligned >= 0.5 else "starved"
        conf = clamp01(0.55 + 0.25 * aligned + (0.15 if concurrent >= 2 else 0.0))
        stv = runs["h_starved"] > 0
        ev = (_masked(runs, stv, "act", "sm_active", "fraction", a, b),
              _masked(runs, stv, "power", "power_w", "W", a, b),
              _masked(runs, stv, "fb", "fb_used_mib (process resident)", "MiB", a, b),
              Evidence("starved_stretches_ending_at_a_progress_mark", "fraction", None, aligned, None,
                       note=f"{len(marks)} checkpoint marks in this run"),
              Evidence("other_runs_starved_in_the_same_hours", "count", None, float(concurrent), None))
        tenant = g["tenant"].iloc[0]
        what = "checkpoints (starved stretches end at its progress marks)" if aligned >= 0.5 else "data"
        more = f"; {concurrent} other jobs starved in the same hours (shared storage?)" if concurrent >= 2 else ""
        out.append(Finding(AGENT, "starved", make_scope(cluster=cluster, job_id=job, tenant=tenant,
                                                        node=g["node"].iloc[0]), a, b, hours,
                           price(ds, g, "h_starved"), conf, ev,
                           f"{_who(job, tenant)} held its GPUs with activity near zero for {fmt_h(hours)} "
                           f"GPU-hours while waiting on {what}{more}.", cause=cause, level="job",
                           extra=(("run", int(run)), ("concurrent_runs", concurrent))))
    return out


def _longest_stretch(g: pd.DataFrame, cadence: float) -> int:
    """The most consecutive samples (one cadence apart) of one device in ``g``."""
    g = g.sort_values(["device", "t"])
    t = g["t"].to_numpy(float)
    dev = g["device"].to_numpy()
    brk = np.ones(len(t), dtype=bool)
    brk[1:] = (np.diff(t) > cadence * 1.01) | (dev[1:] != dev[:-1])
    ids = np.cumsum(brk)
    return int(np.bincount(ids).max()) if len(t) else 0


def _masked(frame: pd.DataFrame, mask: pd.Series, col: str, signal: str, unit: str, a: float, b: float) -> Evidence:
    """Median before the window, over the flagged samples inside it ("during"), and after it."""
    v = frame[col]
    t = frame["t"]
    side = min(max(b - a, 3600.0), 86400.0)

    def med(m: pd.Series) -> float | None:
        x = v[m].dropna()
        return float(x.median()) if len(x) else None

    return Evidence(signal, unit, med((t >= a - side) & (t < a) & ~mask), med(mask & (t >= a) & (t < b)),
                    med((t >= b) & (t < b + side) & ~mask),
                    med(~mask & (t >= a) & (t < b)), "same run, between the flagged samples")


def idle_held(ds: Dataset, exclude: pd.Series | None = None) -> list[Finding]:
    s = ds.samples
    mask = s["h_idle"] > 0
    if exclude is not None:
        mask &= ~exclude
    idle = s.loc[mask, [*RUN_KEY, "t", "device", "h_idle", "tenant", "sku", "node"]]
    out = []
    paid = _runs(s.loc[s["ai"] >= 0, [*RUN_KEY, "h"]])["h"].sum()
    rows_of = _run_rows(s, ("t", "procs", "act", "power", "fb"))
    for (cluster, job, run), g in _runs(idle):
        hours = float(g["h_idle"].sum())
        total = float(paid.get((cluster, job, run), 0.0))
        if hours < IDLE_MIN_H or (hours < IDLE_MIN_SHARE * total and hours < IDLE_ABS_H):
            continue
        a, b = float(g["t"].min()), float(g["t"].max() + ds.cadence)
        runs = rows_of((cluster, job, run))
        ndev = g["device"].nunique()
        one = g["device"].iloc[0] if ndev == 1 else None   # one GPU of the job: name it
        ev = (evidence(runs, "procs", "compute_processes", "count", a, b),
              evidence(runs, "act", "sm_active", "fraction", a, b),
              evidence(runs, "power", "power_w", "W", a, b),
              evidence(runs, "fb", "fb_used_mib", "MiB", a, b),
              Evidence("share_of_paid_gpu_hours_idle", "fraction", None, hours / total if total else None, None))
        if str(job).startswith(NO_SCHEDULER_RUN):   # nothing held it: a node of a capture with no job labels
            out.append(_unallocated(ds, g, ev, cluster, a, b, hours))
            continue
        tenant = g["tenant"].iloc[0]
        conf = clamp01(0.7 + 0.25 * min(1.0, hours / max(total, 1e-9)))
        out.append(Finding(AGENT, "idle_held", make_scope(cluster=cluster, job_id=job, tenant=tenant,
                                                          node=g["node"].iloc[0], device_uuid=one), a, b, hours,
                           price(ds, g, "h_idle"), conf, ev,
                           f"{_who(job, tenant)} held {'GPU ' + one if one else f'{ndev} GPUs'} with no process on "
                           f"{'it' if one else 'them'} for "
                           f"{fmt_h(hours)} GPU-hours ({hours / total:.0%} of what it paid).", cause="idle_held",
                           level="job", extra=(("run", int(run)),)))
    return out


def _unallocated(ds: Dataset, g: pd.DataFrame, ev: tuple, cluster: str, a: float, b: float,
                 hours: float) -> Finding:
    """A node of a capture with no job labels (the importer's one run per node) idle with no process: capacity
    no one used, not time a job held idle."""
    node, ndev = g["node"].iloc[0], g["device"].nunique()
    return Finding(AGENT, "unallocated", make_scope(cluster=cluster, node=node), a, b, hours,
                   price(ds, g, "h_idle"), 0.6, ev,
                   f"{ndev} GPUs on {node} ran no process and carry no job label for {fmt_h(hours)} GPU-hours: "
                   f"unallocated capacity (no job held them).", cause="unallocated", level="node")


def _alloc_overlap_hours(ds: Dataset, a: float, b: float, node: str | None, device: str | None) -> float:
    al = ds.allocs
    if not len(al):
        return 0.0
    m = np.ones(len(al), dtype=bool)
    if device:
        m &= (al["device"] == device).to_numpy()
    elif node:
        m &= (al["node"] == node).to_numpy()
    ov = np.clip(np.minimum(al["end"].to_numpy(float), b) - np.maximum(al["start"].to_numpy(float), a), 0, None)
    return float((ov * m).sum() / 3600.0)


def _whole_node_gaps(ds: Dataset) -> list[list[dict]]:
    """The unknown-interval entries grouped into one per silent node: device entries of the same node over the
    same span (to the minute) that cover most of its devices are one outage (the collector or exporter), not one
    gap per GPU; every other entry is a group of its own."""
    groups: dict[tuple, list[dict]] = {}
    for g in ds.gaps:
        key = (g["node"], round(g["start"] / 60), round(g["end"] / 60), g["cause"]) if g["device"] else (g["id"],)
        groups.setdefault(key, []).append(g)
    out = []
    for key, gs in groups.items():
        n_dev = int((ds.devices["node"] == gs[0]["node"]).sum()) if gs[0]["node"] else 0
        if len(key) > 1 and len(gs) >= 2 and len(gs) >= 0.75 * n_dev:
            out.append(gs)
        else:
            out.extend([g] for g in gs)
    return out


def _silent_after_xid(silent: dict, device: str | None, a: float, b: float) -> bool:
    """Is most of [a, b) on ``device`` a silence its XID finding already counts (fallen off the bus)?"""
    spans = silent.get(device) if device else None
    if not spans or b <= a:
        return False
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans) >= 0.5 * (b - a)


def unknown_gaps(ds: Dataset, silent: dict | None = None) -> list[Finding]:
    """Unknown-interval entries and uncovered allocated spans, less a device's silence after an XID (``silent``:
    device -> spans, :func:`ledger.agents.drift.silent_spans`), which is the XID finding's."""
    silent = silent or {}
    out = []
    node_is = label_equals(ds.samples)
    node_cols = ["t", "act", "rack"]    # what the evidence and the rack read of a node's samples
    for gs in _whole_node_gaps(ds):
        g = gs[0]
        whole = len(gs) > 1
        if not whole and _silent_after_xid(silent, g["device"], g["start"], g["end"]):
            continue
        hours = sum(_alloc_overlap_hours(ds, x["start"], x["end"], x["node"], x["device"]) for x in gs)
        if hours <= 0 and g["job_id"] is None:
            continue
        cause = "collector_down" if whole and g["cause"] in ("scrape_missing", "no_telemetry", "unknown") else g["cause"]
        level = "node" if whole else "device" if g["device"] else ("node" if g["node"] else "run")
        node_s = ds.samples.loc[node_is("node", g["node"]) if g["node"] else np.zeros(len(ds.samples), bool),
                                node_cols]
        ev = (evidence(node_s, "act", "sm_active (node)", "fraction", g["start"], g["end"]),
              Evidence("unknown_interval_entry", "seconds", None, g["end"] - g["start"], None,
                       note=f"cause {g['cause']}: {g.get('detail') or ''}".strip()
                       + (f"; {len(gs)} devices silent together" if whole else "")))
        rack = node_s["rack"].dropna().iloc[0] if len(node_s) and node_s["rack"].notna().any() else None
        device = None if whole else g["device"]
        where = f"every GPU of node {g['node']}" if whole else f"GPU {g['device']}" if g["device"] else f"node {g['node']}"
        out.append(Finding(AGENT, "unknown_gap", make_scope(cluster=g["cluster"], node=g["node"],
                                                            device_uuid=device, job_id=g["job_id"], rack=rack),
                           g["start"], g["end"], hours, hours * ds.rate(None, _sku(ds, g["node"])), 0.95, ev,
                           f"{where} has no trustworthy telemetry from {fmt_ts(g['start'])} to {fmt_ts(g['end'])} "
                           f"({cause}): {fmt_h(hours)} allocated GPU-hours are unknown, held for resolution.",
                           cause=cause, level=level,
                           extra=(("gap_id", g["id"]),) + ((("gap_ids", [x["id"] for x in gs]),) if whole else ())))
    # allocated time without samples that no entry explains
    cg = coverage_gaps(ds)
    if len(cg):
        for gp in ds.gaps:
            m = (cg["start"] < gp["end"]) & (cg["end"] > gp["start"])
            m &= (cg["device"] == gp["device"]) if gp["device"] else (cg["node"] == gp["node"]) if gp["node"] \
                else False
            cg = cg[~m]
    for node, g in cg.groupby("node"):
        g = g.sort_values("start")
        clusters, cur = [], None
        for r in g.itertuples():
            if cur and r.start <= cur["end"]:
                cur["end"] = max(cur["end"], r.end)
                cur["rows"].append(r)
            else:
                cur = {"start": r.start, "end": r.end, "rows": [r]}
                clusters.append(cur)
        node_devs = ds.devices.index[ds.devices["node"] == node]
        for c in clusters:
            hours = sum((r.end - r.start) for r in c["rows"]) / 3600.0
            if hours < 0.25:
                continue
            devs = {r.device for r in c["rows"]}
            whole = len(devs) >= max(1, 0.75 * len(node_devs))
            if not whole and len(devs) == 1 and _silent_after_xid(silent, next(iter(devs)), c["start"], c["end"]):
                continue
            cause = "collector_down" if whole else "scrape_missing"
            dev = None if whole else sorted(devs)[0] if len(devs) == 1 else None
            node_s = ds.samples.loc[node_is("node", node), node_cols]
            ev = (evidence(node_s, "act", "sm_active (node)", "fraction", c["start"], c["end"]),
                  Evidence("devices_without_samples", "count", 0.0, float(len(devs)), 0.0,
                           note="no unknown_interval entry covers this span"))
            rack = node_s["rack"].dropna().iloc[0] if node_s["rack"].notna().any() else None
            out.append(Finding(AGENT, "unknown_gap", make_scope(node=node, device_uuid=dev, rack=rack),
                               c["start"], c["end"], hours, hours * ds.rate(None, _sku(ds, node)),
                               0.85 if whole else 0.6, ev,
                               f"{'every GPU of' if whole else len(devs)} {'node ' + node if whole else 'GPUs on ' + node}"
                               f" sent no telemetry from {fmt_ts(c['start'])} to {fmt_ts(c['end'])} while allocated "
                               f"({'the collector was down' if whole else 'scrapes missing'}): {fmt_h(hours)} "
                               f"GPU-hours unknown.", cause=cause, level="node" if whole else "device"))
    return out


def _sku(ds: Dataset, node: str | None) -> str | None:
    d = ds.devices[ds.devices["node"] == node]["sku"].dropna()
    return d.iloc[0] if len(d) else None


def _reason_groups(ds: Dataset, idx: int, key: str, floor: float = REASON_MIN_H):  # noqa: ANN202
    """Per ``key`` (device or node): its samples throttled for reason ``idx``, when they lost >= ``floor``; yields
    (name, rows, hours, start, end)."""
    s = ds.samples
    for name, g in s[(s["rbucket"] == idx) & (s["h_thr"] > 0)].groupby(key):
        hours = float(g["h_thr"].sum())
        if hours >= floor:
            yield name, g, hours, float(g["t"].min()), float(g["t"].max() + ds.cadence)


def hw_slowdown(ds: Dataset) -> list[Finding]:
    """The HW slowdown / power brake bits (0x8, 0x80): the loss already in the account's ``throttled.hw_slowdown``
    bucket, named. On at least half of a node's GPUs (>= 2) it is the node's (its power supply, its BMC's brake):
    one finding at node scope when their loss together reaches REASON_NODE_MIN_H GPU-hours, however small on each;
    otherwise one finding per device that lost at least REASON_MIN_H."""
    s = ds.samples
    out = []
    per_node = ds.devices.groupby("node").size() if "node" in ds.devices else pd.Series(dtype=int)
    node_wide = set()
    for node, g, hours, a, b in _reason_groups(ds, HW_SLOWDOWN, "node", REASON_NODE_MIN_H):
        devs = sorted(str(d) for d in g["device"].unique())
        if len(devs) < max(2, 0.5 * int(per_node.get(node, len(devs)))):
            continue
        node_wide.add(node)
        sl = s[(s["node"] == node) & s["running"] & (s["act"] >= 0.2)]
        ev = (evidence(sl.assign(c=(sl["rbucket"] == HW_SLOWDOWN) & (sl["h_thr"] > 0)), "c",
                       "share_of_samples_with_hw_slowdown_bit", "fraction", a, b, stat="mean"),
              evidence(sl, "clk", "sm_clock_mhz_under_load", "MHz", a, b),
              evidence(sl, "power", "power_w_under_load", "W", a, b),
              Evidence("hw_slowdown_samples", "count", None, float(len(g)), None),
              Evidence("devices_slowed", "count", None, float(len(devs)), None))
        out.append(Finding(AGENT, "hw_slowdown", make_scope(node=node, rack=g["rack"].iloc[0]), a, b, hours,
                           price(ds, g, "h_thr"), REASON_CONF, ev,
                           f"{len(devs)} GPUs on {node} were slowed in hardware (HW slowdown / power brake) together "
                           f"from {fmt_ts(a)} to {fmt_ts(b)}: {fmt_h(hours)} GPU-hours; check the node's power "
                           f"supplies and the BMC's power brake.", cause="hw_slowdown", level="node",
                           extra=(("devices", devs),)))
    for dev, g, hours, a, b in _reason_groups(ds, HW_SLOWDOWN, "device"):
        if g["node"].iloc[0] in node_wide:
            continue
        full = s[s["device"] == dev]
        loaded = full[full["running"] & (full["act"] >= 0.2)]
        ev = (evidence(loaded.assign(c=(loaded["rbucket"] == HW_SLOWDOWN) & (loaded["h_thr"] > 0)), "c",
                       "share_of_samples_with_hw_slowdown_bit", "fraction", a, b, stat="mean"),
              evidence(loaded, "clk", "sm_clock_mhz_under_load", "MHz", a, b),
              evidence(loaded, "power", "power_w_under_load", "W", a, b),
              Evidence("hw_slowdown_samples", "count", None, float(len(g)), None))
        node = g["node"].iloc[0]
        out.append(Finding(AGENT, "hw_slowdown", make_scope(device_uuid=dev, node=node, rack=g["rack"].iloc[0]),
                           a, b, hours, price(ds, g, "h_thr"), REASON_CONF, ev,
                           f"GPU {dev} on {node} was slowed in hardware (HW slowdown / power brake) {len(g)} times "
                           f"from {fmt_ts(a)} to {fmt_ts(b)}: {fmt_h(hours)} GPU-hours; check the board's power "
                           f"supply and the BMC's power brake.", cause="hw_slowdown", level="device"))
    return out


def sync_boost(ds: Dataset) -> list[Finding]:
    """One finding per node whose devices carry the sync-boost bit (0x10) for at least REASON_MIN_H GPU-hours
    together: the group held at its slowest member's clock. The slowest member is the loaded device of the node
    *without* the bit whose median clock over the window is nearest the held devices' median clock (the clock they
    were held to; a device slowed for another reason runs below it); with no such device, the lowest clock."""
    s = ds.samples
    out = []
    for node, g, hours, a, b in _reason_groups(ds, SYNC_BOOST, "node"):
        sl = s[(s["node"] == node) & (s["t"] >= a) & (s["t"] < b) & s["running"] & (s["act"] >= 0.2)]
        held = sorted(str(d) for d in g["device"].unique())
        clk = sl.groupby("device")["clk"].median().dropna()
        held_clk = float(g["clk"].median()) if g["clk"].notna().any() else np.nan
        free = clk[~clk.index.isin(held)]
        pick = free if len(free) and np.isfinite(held_clk) else clk
        slowest = str((pick - held_clk).abs().idxmin() if pick is free else pick.idxmin()) if len(pick) else None
        rest = sl[sl["device"] != slowest]
        ev = (evidence(sl[sl["device"] == slowest], "clk", "slowest_member_sm_clock_mhz", "MHz", a, b,
                       reference=float(rest["clk"].median()) if len(rest) else None,
                       reference_label="the other members, same window (median clock)"),
              evidence(sl.assign(c=(sl["rbucket"] == SYNC_BOOST) & (sl["h_thr"] > 0)), "c",
                       "share_of_samples_with_sync_boost_bit", "fraction", a, b, stat="mean"),
              Evidence("devices_held_back", "count", None, float(len(held)), None))
        out.append(Finding(AGENT, "sync_boost", make_scope(node=node, rack=g["rack"].iloc[0]), a, b, hours,
                           price(ds, g, "h_thr"), REASON_CONF, ev,
                           f"{len(held)} GPUs on {node} were held to their sync-boost group's slowest member "
                           f"{slowest} from {fmt_ts(a)} to {fmt_ts(b)}: {fmt_h(hours)} GPU-hours.",
                           cause="sync_boost", level="node",
                           extra=(("slowest_device", slowest), ("held_devices", held))))
    return out


def run(ds: Dataset, xid_mask: pd.Series | None = None, silent: dict | None = None) -> list[Finding]:
    """All attribution findings over a dataset (``silent``: device -> its silences after an XID, not gaps)."""
    if not len(ds.samples):
        return unknown_gaps(ds, silent)
    return [*run_thermal(ds), *run_clock_and_starved(ds), *run_after_xids(ds, xid_mask, silent)]


def run_thermal(ds: Dataset) -> list[Finding]:
    """The first part of :func:`run`: the rules on the temperature-on-power residual (cooling, hot because
    working), which read the per device-hour statistics. The agents' two lanes (:mod:`ledger.agents.lanes`) run
    the parts of :func:`run` apart; a dataset with samples only."""
    model = residual_model(ds)
    cool = cooling(ds, model)
    return [*cool, *hot_because_working(ds, model, cool)]


def run_clock_and_starved(ds: Dataset) -> list[Finding]:
    """The second part of :func:`run`: the clock-reason rules and starved jobs, from the samples alone."""
    return [*power_cap(ds), *hw_slowdown(ds), *sync_boost(ds), *starved(ds)]


def run_after_xids(ds: Dataset, xid_mask: pd.Series | None = None, silent: dict | None = None) -> list[Finding]:
    """The last part of :func:`run`: the findings that need the drift agent's XID stall mask and silences (idle
    held, unknown gaps)."""
    return [*idle_held(ds, xid_mask), *unknown_gaps(ds, silent)]


__all__ = ["run", "run_thermal", "run_clock_and_starved", "run_after_xids", "residual_model", "ResidualModel",
           "before_during_after"]
