"""Drift agent: each device's normal learned from its own history under load, compared with its SKU rating and
its siblings in the same node (rack when the node has too few), to find the device that has quietly become the
slow one, with what it costs per day (docs/agents.md, "Drift").

Signals: SM clock under load (6-hour medians; deficit against the siblings' median of the same bin, with the
device's own noise learned as a MAD over its earliest bins), throughput per watt, temperature at a given power,
correctable-ECC slope (daily increments, trend and against siblings), row remaps, XID events (meanings from
``xid_codes.csv``, dcgm-exporter's table of NVIDIA's XID catalogue).
"""

from __future__ import annotations

import csv
from functools import lru_cache

import numpy as np
import pandas as pd

from ..method.packaged import package_text
from .common import DAY, HOUR, evidence, fmt_h, fmt_ts, price
from .data import Dataset
from .hourstats import hour_stats
from .model import Evidence, Finding, clamp01, make_scope

AGENT = "drift"
BIN = 6 * 3600.0
SHORT_BIN = 3600.0          # bins on an export shorter than SHORT_SPAN: a 24-hour export has 24 of them
SHORT_SPAN = 3 * 86400.0
MIN_DEFICIT = 0.03          # 3 % of rated clock below the siblings: well before a "clock < 85 %" alarm
NOISE_K = 5.0               # ... and at least 5 robust sigmas of the device's own bin-to-bin noise
ONSET_K = 2.0
ECC_LAST2_MIN = 10          # correctable errors in the last two days
ECC_SIB_FACTOR = 5.0
ECC_HOUR_MIN = 5            # correctable errors in one hour that can count as a flagged hour ...
ECC_HOUR_FACTOR = 5.0       # ... at 5x (siblings' median that hour + 1) and 5x (the device's earlier hours + 1)
ECC_HOURS = 3               # flagged hours needed, with a rising trend (Spearman rho >= 0.6 from the first)
XID_STALL_S = 2 * 3600.0    # an XID's consequence: the idle stretch that starts within this time of it


@lru_cache(maxsize=1)
def xid_meanings() -> dict[int, str]:
    text = package_text(__package__, "xid_codes.csv")
    return {int(r["xid"]): r["text"] for r in csv.DictReader(text.splitlines())}


def xid_events(ds: Dataset) -> pd.DataFrame:
    """Samples where a new XID shows: non-zero and different from the previous sample (gauge semantics)."""
    s = ds.samples
    x = s["xid"].fillna(0.0)
    prev = x.groupby(s["device"]).shift(1).fillna(0.0)
    ev = s[(x > 0) & ((x != prev) | (prev == 0))]
    return ev[["device", "t", "node", "rack", "xid", "job_id", "tenant"]]


def xid_stall_mask(ds: Dataset, events: pd.DataFrame | None = None) -> pd.Series:
    """Idle-held samples that directly follow an XID on the same device (the process died with the error)."""
    s = ds.samples
    events = xid_events(ds) if events is None else events
    mask = np.zeros(len(s), dtype=bool)
    if not len(events):
        return pd.Series(mask, index=s.index)
    idx_by_dev = s.groupby("device").indices
    t_all = s["t"].to_numpy()
    idle = (s["h_idle"] > 0).to_numpy()
    # no process and no activity, allocated or not: a stall may run on past the end of the job that hit it
    dead = ~s["running"].to_numpy() & (np.nan_to_num(s["act"].to_numpy(float)) < 0.05)
    for r in events.itertuples():
        idx = idx_by_dev[r.device]
        t = t_all[idx]
        k = int(np.searchsorted(t, r.t))
        # the stall starts at the event sample or soon after, and lasts while the device stays dead;
        # only its allocated (paid, idle-held) part is counted
        while k < len(idx) and t[k] < r.t + XID_STALL_S and not dead[idx[k]]:
            k += 1
        while k < len(idx) and dead[idx[k]]:
            mask[idx[k]] = idle[idx[k]]
            k += 1
    return pd.Series(mask, index=s.index)


def silent_after(ds: Dataset, times: np.ndarray, events: np.ndarray,
                 dead: np.ndarray | None = None) -> list[tuple[float, float]]:
    """The stretches a device sent nothing after each event (fallen off the bus, lost until reset): the first hole
    in its samples (a step over 2 cadences) that opens within XID_STALL_S of the event, the device dead (no process,
    no activity: ``dead``, per sample of ``times``) from the event to the hole — a driver may report it a few more
    times before it is gone; the stretch runs from one cadence after its last sample to its next sample, or to the
    end of the data."""
    out = []
    dead = np.ones(len(times), dtype=bool) if dead is None else dead
    for te in events:
        k = int(np.searchsorted(times, te, side="left"))       # the event's sample
        while k + 1 < len(times) and times[k + 1] - times[k] <= 2 * ds.cadence and times[k + 1] < te + XID_STALL_S \
                and dead[k + 1]:
            k += 1
        last = float(times[k]) if k < len(times) else float(te)
        nxt = float(times[k + 1]) if k + 1 < len(times) else ds.end
        if nxt - last > 2 * ds.cadence:
            span = (last + ds.cadence, nxt)
            if not out or span[0] >= out[-1][1]:
                out.append(span)
    return out


def _allocated_hours(ds: Dataset, dev: str, spans: list[tuple[float, float]]) -> float:
    """Device-hours of ``dev``'s allocations inside ``spans`` (the account's own overlap, per span)."""
    from .accounting import paid_hours

    if not len(ds.allocs):
        return 0.0
    mine = ds.allocs["device"] == dev
    return sum(paid_hours(ds, mine, a, b) for a, b in spans)


def silent_spans(found: list[Finding]) -> dict[str, list[tuple[float, float]]]:
    """Device -> the spans its XID findings say it was silent after the XID (what an unknown gap there is)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for f in found:
        if f.kind == "xid":
            out.setdefault(f.scope_dict()["device_uuid"], []).extend(
                tuple(x) for x in dict(f.extra).get("silent_spans", []))
    return out


def xid_findings(ds: Dataset, events: pd.DataFrame, stall: pd.Series) -> list[Finding]:
    """Per device: its XID events, priced as the allocated idle stall after them plus the device-hours it was
    silent after them (capacity lost whether or not a job still held it)."""
    out = []
    s = ds.samples
    meanings = xid_meanings()
    for dev, g in events.groupby("device"):
        codes = sorted({int(c) for c in g["xid"]})
        st = s[stall & (s["device"] == dev)]
        ds_dev = s[s["device"] == dev].sort_values("t")
        dead = ~ds_dev["running"].to_numpy(bool) & (np.nan_to_num(ds_dev["act"].to_numpy(float)) < 0.05)
        silent = silent_after(ds, ds_dev["t"].to_numpy(float), np.sort(g["t"].to_numpy(float)), dead)
        silent_h = sum(y - x for x, y in silent) / 3600.0
        hours = float(st["h_idle"].sum()) + silent_h
        a = float(g["t"].min())
        b = float(max(g["t"].max() + ds.cadence, st["t"].max() + ds.cadence if len(st) else 0,
                      max((y for _, y in silent), default=0.0)))
        node = g["node"].iloc[0]
        ev = (Evidence("xid_events", "count", float(((events["device"] == dev) & (events["t"] < a)).sum()),
                       float(len(g)), 0.0, note="; ".join(f"XID {c}: {meanings.get(c, 'unknown code')}" for c in codes)),
              evidence(ds_dev, "act", "sm_active", "fraction", a, b),
              evidence(ds_dev, "procs", "compute_processes", "count", a, b),
              Evidence("gpu_hours_stalled_after_xid", "GPU-h", None, float(st["h_idle"].sum()), None),
              Evidence("hours_silent_after_xid", "h", None, silent_h, None,
                       note="no telemetry from the device until it came back (or the data ended)"))
        n = len(g)
        conf = clamp01(0.7 + 0.05 * min(n, 5))
        text = "; ".join(f"XID {c} ({meanings.get(c, 'unknown')})" for c in codes)
        lost = (f"then sent nothing for {fmt_h(silent_h)} hours" if silent_h else "its job's process died each time")
        cost = price(ds, st, "h_idle") + silent_h * ds.rate(g["tenant"].iloc[0], ds.devices["sku"].get(dev))
        out.append(Finding(AGENT, "xid", make_scope(device_uuid=dev, node=node, rack=g["rack"].iloc[0]), a, b,
                           hours, cost, conf, ev,
                           f"GPU {dev} on {node} raised {n} {text} events from {fmt_ts(a)}; it {lost}, losing "
                           f"{fmt_h(hours)} GPU-hours.", cause="xid",
                           level="device", extra=(("xid_codes", codes), ("events", n),
                                                  ("silent_spans", [[x, y] for x, y in silent]),
                                                  ("silent_allocated_gpu_hours",
                                                   round(_allocated_hours(ds, dev, silent), 6)))))
    return out


def bin_seconds(ds: Dataset) -> float:
    """6-hour bins over days of history; hourly ones over a short export, so a day holds a baseline and a trend."""
    return BIN if ds.end - ds.start >= SHORT_SPAN else SHORT_BIN


def _bins(ds: Dataset) -> pd.DataFrame:
    """Mean clock ratio under load per device and bin (whole UTC hours: 6-hour bins start at 00, 06, 12, 18),
    with the siblings' reference for that bin. Loaded: running, activity >= 0.3, a clock and no clock-event
    reason (what is left is the device itself); the ratio is the bin's mean loaded clock over the rated clock,
    capped at 1 (a sum the device-hours hold: :mod:`ledger.agents.hourstats`)."""
    h = hour_stats(ds)
    h = h[h["loaded_n"] > 0]
    width = bin_seconds(ds)
    b = pd.DataFrame({"device": h["device"].to_numpy(), "bin": np.floor(h["hour"].to_numpy(float) / width).astype(int),
                      "n": h["loaded_n"].to_numpy(float), "clk": h["loaded_clk"].to_numpy(float)})
    own = b.groupby(["device", "bin"])[["n", "clk"]].sum().reset_index()
    rated = own["device"].map(ds.devices["rated"]).astype(float).to_numpy()
    mean = own["clk"].to_numpy(float) / own["n"].to_numpy(float)
    own["ratio"] = np.where(np.isnan(rated), 1.0, np.clip(mean / np.where(rated > 0, rated, 1.0), 0.0, 1.0))
    own["node"] = own["device"].map(ds.devices["node"])
    own["rack"] = own["device"].map(ds.devices["rack"])
    own = own[own["n"] >= 6].drop(columns=["clk"])
    node_ref = own.groupby(["node", "bin"])["ratio"].agg(node_med="median", node_n="size").reset_index()
    rack_ref = own.groupby(["rack", "bin"])["ratio"].median().rename("rack_med").reset_index()
    own = own.merge(node_ref, on=["node", "bin"], how="left").merge(rack_ref, on=["rack", "bin"], how="left")
    # the node's median when it has at least 4 devices with data in that bin, else the rack's
    own["ref"] = np.where(own["node_n"] >= 4, own["node_med"], own["rack_med"])
    own = own.drop(columns=["node_med", "node_n", "rack_med"])
    own["deficit"] = own["ref"] - own["ratio"]
    return own


def clock_drift(ds: Dataset) -> dict[str, dict]:
    """Devices whose clock under load sits below their siblings beyond their own noise: {device: details}."""
    own = _bins(ds)
    out = {}
    for dev, g in own.dropna(subset=["deficit"]).groupby("device"):
        g = g.sort_values("bin")
        n_base = max(4, int(len(g) * 0.3))
        base = g["deficit"].iloc[:n_base]
        sigma = max(1.4826 * float(np.median(np.abs(base - base.median()))), 0.002)
        thr = max(MIN_DEFICIT, NOISE_K * sigma)
        flag = (g["deficit"] >= thr).to_numpy()
        # the longest stretch of flagged bins; at least two bins (12 hours)
        best, cur, best_end = 0, 0, -1
        for i, f in enumerate(flag):
            cur = cur + 1 if f else 0
            if cur > best:
                best, best_end = cur, i
        if best < 2:
            continue
        first = best_end - best + 1
        onset = first
        d = g["deficit"].to_numpy()
        while onset > 0 and d[onset - 1] >= max(0.006, ONSET_K * sigma):
            onset -= 1
        bins = g["bin"].to_numpy()
        width = bin_seconds(ds)
        out[dev] = {"start": max(ds.start, bins[onset] * width), "flag_start": max(ds.start, bins[first] * width),
                    "end": min(ds.end, (bins[best_end] + 1) * width), "sigma": sigma, "threshold": thr,
                    "max_deficit": float(d[first:best_end + 1].max()), "bins": g, "flagged_bins": best}
    return out


def _increments(ds: Dataset, width: float) -> pd.DataFrame:
    """Correctable-ECC increments per device (rows) and bin of ``width`` seconds from the epoch (columns: bin
    numbers; UTC days or hours), each the bin's highest count less its lowest (from the hours' extremes)."""
    h = hour_stats(ds)
    h = h[h["ecc_max"].notna()]
    b = np.floor(h["hour"].to_numpy(float) / width).astype(int)
    g = h.groupby([h["device"], b]).agg(hi=("ecc_max", "max"), lo=("ecc_min", "min"))
    return (g["hi"] - g["lo"]).unstack(fill_value=0.0)


def _rho(series: np.ndarray) -> float:
    if len(series) < 3 or series.std() == 0:
        return 0.0
    return float(pd.Series(series).rank().corr(pd.Series(np.arange(len(series))).rank()))


def ecc_hour_flags(row: np.ndarray, sib_med: np.ndarray) -> np.ndarray:
    """The hours whose correctable-ECC increment counts as flagged: at least :data:`ECC_HOUR_MIN`, and
    :data:`ECC_HOUR_FACTOR` times both the siblings' median that hour + 1 and the median of the device's earlier
    hours + 1. The earlier hours' median is taken only at the hours the first two tests pass (rare: a healthy
    device has none), not at every hour; :func:`ecc_hour_flags_reference` takes it at every hour, and a test
    holds the two equal."""
    flag = (row >= ECC_HOUR_MIN) & (row >= ECC_HOUR_FACTOR * (sib_med + 1))
    for k in np.flatnonzero(flag):
        earlier = np.median(row[:k]) if k else 0.0
        flag[k] = row[k] >= ECC_HOUR_FACTOR * (earlier + 1)
    return flag


def ecc_hour_flags_reference(row: np.ndarray, sib_med: np.ndarray) -> np.ndarray:
    """The plain version of :func:`ecc_hour_flags`: the earlier hours' median at every hour, then the three tests."""
    earlier = np.array([np.median(row[:k]) if k else 0.0 for k in range(len(row))])
    return (row >= ECC_HOUR_MIN) & (row >= ECC_HOUR_FACTOR * (sib_med + 1)) & \
        (row >= ECC_HOUR_FACTOR * (earlier + 1))


def ecc_trend(ds: Dataset) -> dict[str, dict]:
    """Devices whose correctable-ECC count is accelerating, against their own past and their siblings: over days
    (the last two days against the siblings') and within a day (hours against the device's earlier hours and the
    siblings' same hour). Each: start, count, sibling reference, rho, per-bin series and its unit."""
    nodes = ds.devices["node"]
    out: dict[str, dict] = {}
    daily = _increments(ds, DAY)
    if not len(daily):
        return {}
    if daily.shape[1] >= 3:
        last2 = daily.iloc[:, -2:].sum(axis=1)
        node_of_last2 = nodes.reindex(last2.index)
        for dev, v in last2.items():
            if v < ECC_LAST2_MIN:   # the first test alone rules it out: no sibling median or trend needed
                continue
            sib = last2[(node_of_last2 == nodes.get(dev)) & (last2.index != dev)]
            ref = float(sib.median()) if len(sib) else float(last2.median())
            if v < ECC_SIB_FACTOR * (ref + 1):
                continue
            series = daily.loc[dev].to_numpy()
            rho = _rho(series)
            if rho >= 0.6:
                out[dev] = {"start": max(ds.start, daily.columns[-2] * DAY), "count": float(v), "sibling": ref,
                            "rho": rho, "series": series.tolist(), "unit": "day", "span": "the last two days"}
    hourly = _increments(ds, HOUR)
    if hourly.shape[1] < 4:
        return out
    node_of = nodes.reindex(hourly.index)
    for node in node_of.dropna().unique():
        block = hourly[node_of == node]
        for dev in block.index:
            if dev in out:
                continue
            row = block.loc[dev].to_numpy()
            if (row >= ECC_HOUR_MIN).sum() < ECC_HOURS:   # too few hours can pass ecc_hour_flags' first test
                continue
            sib = block.drop(index=dev)
            sib_med = sib.median(axis=0).to_numpy() if len(sib) else np.zeros_like(row)
            flag = ecc_hour_flags(row, sib_med)
            if flag.sum() < ECC_HOURS:
                continue
            first = int(np.argmax(flag))
            rho = _rho(row[max(0, first - 2):])
            if rho < 0.6:
                continue
            out[dev] = {"start": max(ds.start, block.columns[first] * HOUR), "count": float(row[first:].sum()),
                        "sibling": float(sib_med[first:].sum()), "rho": rho, "series": row.tolist(), "unit": "hour",
                        "span": f"the {len(row) - first} hours since it began"}
    return out


def drift_findings(ds: Dataset) -> list[Finding]:
    s = ds.samples
    clocks = clock_drift(ds)
    ecc = ecc_trend(ds)
    out = []
    for dev in sorted(set(clocks) | set(ecc)):
        c, e = clocks.get(dev), ecc.get(dev)
        sl = s[s["device"] == dev]
        node = sl["node"].iloc[0]
        rack = sl["rack"].iloc[0]
        if c:
            a, b = c["start"], c["end"]
            bins = c["bins"].set_index("bin")["ref"]
            sbin = (sl["t"] // bin_seconds(ds)).astype(int)
            ref = sbin.map(bins)
            work = (sl["h_del"] + sl["h_thr"]) > 0
            # samples with no clock-event reason: a thermal or power-capped sample is another cause's loss
            inwin = (sl["t"] >= a) & (sl["t"] < b) & work & ref.notna() & sl["rbucket"].eq(4)
            loss_h = sl["h"] * sl["act"] * (ref - sl["ratio"])
            hours = float(loss_h[inwin].sum())
            last_day = inwin & (sl["t"] >= b - DAY)
            rate = price(ds, sl[inwin], "h") / max(float(sl.loc[inwin, "h"].sum()), 1e-9)
            per_day = float(loss_h[last_day].sum()) * rate
        else:
            a, b = e["start"], ds.end
            hours, rate, per_day = 0.0, 0.0, 0.0
        ld = sl[sl["running"] & (sl["act"] >= 0.3)].assign(
            ppw=lambda x: x["act"] * x["clk"] / x["power"], tpp=lambda x: x["temp"] / x["power"])
        sib = s[(s["node"] == node) & (s["device"] != dev) & s["running"] & (s["act"] >= 0.3)]
        sib_w = sib[(sib["t"] >= a) & (sib["t"] < b)]
        ev = [evidence(ld, "clk", "sm_clock_mhz_under_load", "MHz", a, b,
                       reference=float(sib_w["clk"].median()) if len(sib_w) else None,
                       reference_label="siblings in the node, same window"),
              evidence(ld, "ppw", "throughput_per_watt (activity x MHz / W)", "MHz/W", a, b,
                       reference=float((sib_w["act"] * sib_w["clk"] / sib_w["power"]).median()) if len(sib_w) else None,
                       reference_label="siblings in the node, same window"),
              evidence(ld, "tpp", "temperature_per_watt", "degC/W", a, b)]
        width, unit = (HOUR, "hour") if e and e["unit"] == "hour" else (DAY, "day")
        inc = _increments(ds, width)
        per = inc.loc[dev] if dev in inc.index else pd.Series(dtype=float)
        dd = pd.DataFrame({"t": per.index.to_numpy(float) * width, "v": per.to_numpy(float)})
        ev.append(evidence(dd, "v", f"ecc_correctable_per_{unit}", f"errors/{unit}", a, b,
                           reference=e["sibling"] / max(1.0, (b - a) / width) if e else None,
                           reference_label=f"siblings' median per {unit}, same window"))
        hs = hour_stats(ds)
        rr = hs.loc[hs["device"] == dev, ["remap_pending_max", "remap_failure_max"]].max()
        if rr.notna().any():
            ev.append(Evidence("row_remap_pending_or_failure", "flag", None, float(np.nanmax(rr.to_numpy())), None))
        kind = "ecc_drift" if e else "sibling_divergence"
        conf = 0.0
        if c:
            conf = 0.6 + 0.2 * min(1.0, (c["max_deficit"] - c["threshold"]) / c["threshold"]) + \
                   0.05 * min(4, c["flagged_bins"] - 1) / 4
        conf = conf + (0.15 if e and c else 0.6 if e else 0.0)
        conf = clamp01(min(conf, 0.97))
        parts = []
        if c:
            parts.append(f"has run {c['max_deficit']:.0%} below its siblings' SM clock under load since "
                         f"{fmt_ts(c['flag_start'])} (drifting from {fmt_ts(a)}), costing {fmt_h(hours)} GPU-hours "
                         f"so far and about {per_day:,.2f} {ds.currency}/day now")
        if e:
            parts.append(f"its correctable ECC errors are accelerating ({e['count']:.0f} in {e['span']} vs "
                         f"{e['sibling']:.0f} for its siblings)")
        out.append(Finding(AGENT, kind, make_scope(device_uuid=dev, node=node, rack=rack), a, b, hours,
                           hours * rate, conf, tuple(ev), f"GPU {dev} on {node} " + "; ".join(parts) + ".",
                           cause="drift", level="device", extra=(("cost_per_day", round(per_day, 2)),)))
    return out


def row_remap_findings(ds: Dataset) -> list[Finding]:
    """A row-remap failure (the device ran out of spare rows) or remaps pending a reset: hardware to look at."""
    s = ds.samples
    out = []
    for col, kind, conf, what in (("row_remap_failure", "row_remap_failure", 0.9,
                                   "reports a row-remapping failure (no spare rows left): the memory is degrading"),
                                  ("row_remap_pending", "row_remap_pending", 0.6,
                                   "has row remaps pending that only a GPU reset applies")):
        hit = s[s[col].fillna(0) > 0]
        for dev, g in hit.groupby("device"):
            if kind == "row_remap_pending" and dev in {f.scope_dict()["device_uuid"] for f in out}:
                continue
            a, b = float(g["t"].min()), float(g["t"].max() + ds.cadence)
            full = s[s["device"] == dev]
            ev = (evidence(full, col, col, "flag", a, b, stat="max"),
                  evidence(full.assign(e=full["ecc"].diff()), "e", "ecc_correctable_increments", "count", a, b,
                           stat="sum"))
            out.append(Finding(AGENT, kind, make_scope(device_uuid=dev, node=g["node"].iloc[0],
                                                       rack=g["rack"].iloc[0]), a, b, 0.0, 0.0, conf, ev,
                               f"GPU {dev} on {g['node'].iloc[0]} {what} (from {fmt_ts(a)}).", cause="drift",
                               level="device"))
    return out


def run(ds: Dataset) -> tuple[list[Finding], pd.Series]:
    """Drift and XID findings, and the mask of samples explained by XIDs (for the attribution agent)."""
    if not len(ds.samples):
        return [], pd.Series(dtype=bool)
    events = xid_events(ds)
    stall = xid_stall_mask(ds, events)
    return [*drift_findings(ds), *xid_findings(ds, events, stall), *row_remap_findings(ds)], stall
