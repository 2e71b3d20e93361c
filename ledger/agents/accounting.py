"""Accounting agent: the daily account of paid vs delivered GPU-hours per cluster, tenant, job class
(partition/QOS) and hour of day; lost work of requeued runs; and ``explain`` — where a scope's GPU-hours went in
a period, decomposed by bucket and by the causes the other agents found (docs/agents.md, "Accounting").
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Callable

import numpy as np
import pandas as pd

from ..chain.canonical import format_ts
from ..method import nanohours_to_hours
from ..receipts.progress import SAVED, lost_since_checkpoint
from .common import fmt_h, fmt_ts, label_equals, price
from .data import THROTTLE_REASONS, Dataset, bucket_totals
from .model import Evidence, Finding, make_scope

AGENT = "accounting"
LOSS_CAUSES_ORDER = ("cooling", "power_cap", "drift", "xid", "checkpoint_starved", "starved", "idle_held",
                     "unallocated", "requeue", "dcgm_host_engine_restart", "collector_down", "scrape_missing", "export_truncated")


def paid_hours(ds: Dataset, mask: pd.Series | None = None, start: float | None = None,
                end: float | None = None) -> float:
    al = ds.allocs if mask is None else ds.allocs[mask]
    if not len(al):
        return 0.0
    a = al["start"].to_numpy(float)
    b = al["end"].to_numpy(float)
    if start is not None:
        a = np.maximum(a, start)
    if end is not None:
        b = np.minimum(b, end)
    return float(np.clip(b - a, 0, None).sum() / 3600.0)


def requeue_findings(ds: Dataset) -> list[Finding]:
    out = []
    al = ds.allocs
    if not len(al):
        return out
    runs = al.groupby(["cluster", "job_id", "run"]).agg(start=("start", "min"), end=("end", "max"),
                                                        ndev=("device", "nunique"), state=("state", "first"),
                                                        tenant=("tenant", "first"), node=("node", "first"))
    pairs = set()
    for r in ds.requeues:
        prev = r.get("previous_run", r["run"] - 1 if r["run"] else None)
        if prev is not None:
            pairs.add((r["cluster"], r["job_id"], int(prev), r.get("reason", "requeued")))
    for (cl, job, run), row in runs.iterrows():
        if str(row["state"] or "").upper() in ("NODE_FAIL", "REQUEUED", "PREEMPTED") and \
                (cl, job, run + 1) in runs.index:
            pairs.add((cl, job, int(run), str(row["state"])))
    for cl, job, prev, reason in sorted(pairs, key=lambda p: (str(p[1]), p[2])):
        if (cl, job, prev) not in runs.index:
            continue
        row = runs.loc[(cl, job, prev)]
        prog = ds.progress
        marks = prog[(prog["job_id"] == job) & (prog["run"] == prev) & prog["kind"].isin(SAVED)]["t"]
        marks = marks[(marks >= row["start"]) & (marks <= row["end"])]
        # the receipt's lost_since_checkpoint, computed by the same function
        frm, lost_nanohours = lost_since_checkpoint(marks.tolist(), (float(row["start"]), float(row["end"])), int(row["ndev"]))
        last = float(row["start"]) if frm is None else frm
        hours = nanohours_to_hours(lost_nanohours)
        s = ds.samples[(ds.samples["job_id"] == job) & (ds.samples["run"] == prev)]
        rate = price(ds, s, "h") / max(float(s["h"].sum()), 1e-9) if len(s) else ds.rate(row["tenant"], None)
        ev = (Evidence("progress_marks_in_run", "count", None, float(len(marks)), None,
                       note=f"last mark {format_ts(last) if len(marks) else 'none (whole run lost)'}"),
              Evidence("run_paid_gpu_hours", "GPU-h", None, (row["end"] - row["start"]) / 3600.0 * row["ndev"], None),
              Evidence("lost_since_checkpoint", "GPU-h", None, hours, None, note=f"ended {reason}"))
        out.append(Finding(AGENT, "requeue_loss", make_scope(cluster=cl, job_id=job, tenant=row["tenant"],
                                                             node=row["node"]), float(row["start"]), float(row["end"]),
                           hours, hours * rate, 0.85 if len(marks) else 0.6, ev,
                           f"job {job} run {prev} ended {reason} and was requeued; the {fmt_h(hours)} GPU-hours "
                           f"since its last checkpoint ({fmt_ts(last)}) must be recomputed.", cause="requeue",
                           level="job", extra=(("run", prev),)))
    return out


def findings(ds: Dataset) -> list[Finding]:
    return requeue_findings(ds)


# --- one accounting: every lost GPU-hour of a slice under exactly one line -------------------------------------

# which per-sample bucket each cause can claim: thermal / power-cap / other-reason throttling, starved, idle held
_CLAIMS = {"cooling": ("thr", 0), "power_cap": ("thr", 1), "drift": ("thr", 4), "checkpoint_starved": ("starved", None),
           "starved": ("starved", None), "xid": ("idle", None), "idle_held": ("idle", None),
           "unallocated": ("idle", None)}
WORKLOAD_LINE, OTHER_LINE, UNKNOWN_LINE = "underutilized (workload)", "other / unattributed", "unknown (no finding)"
DISPLAY_DP = 1   # GPU-hours are shown to one decimal; lines are rounded once, totals are sums of shown lines


def _finding_mask(t: np.ndarray, label: Callable[[str, object], np.ndarray], f: Finding) -> np.ndarray:
    """The samples (times ``t``, labels compared by ``label``: :func:`common.label_equals`) inside a finding's
    window and scope (its narrowest label)."""
    sc = f.scope_dict()
    m = (t >= f.start) & (t < f.end)
    for key, col in (("device_uuid", "device"), ("job_id", "job_id"), ("node", "node"), ("rack", "rack")):
        if sc.get(key):
            return m & label(col, sc[key])
    return m


@dataclass(frozen=True)
class Claims:
    """Which finding claims each sample's lost part in a slice (:func:`loss_partition`'s first step, which does not
    depend on the slice's paid hours: `explain` works it out once for its account and its lines)."""

    keep: np.ndarray          # the slice's allocated samples
    label: np.ndarray         # per sample: the index of the claiming finding, -1 none
    per_finding: dict         # finding id -> GPU-hours it claims
    lines: dict               # cause -> GPU-hours claimed


def claims_slice(ds: Dataset, sel: pd.Series | None = None, start: float | None = None,
                 end: float | None = None) -> np.ndarray:
    """The samples of a slice an account sums: allocated ones, in ``sel`` (default all), in [start, end)."""
    s = ds.samples
    keep = (s["ai"] >= 0).to_numpy().copy()
    if sel is not None:
        keep &= sel.to_numpy()
    if start is not None:
        keep &= ((s["t"] >= start) & (s["t"] < end)).to_numpy()
    return keep


def claims(ds: Dataset, found: list[Finding], sel: pd.Series | None = None, start: float | None = None,
           end: float | None = None) -> Claims:
    """Each sample's lost part in the slice given to the first finding, in cause order, whose scope and window hold
    the sample and whose cause explains that bucket (see :func:`loss_partition`)."""
    s = ds.samples
    keep = claims_slice(ds, sel, start, end)
    label = np.full(len(s), -1, dtype=np.int64)
    t, labels = s["t"].to_numpy(float), label_equals(s)
    buckets = {"thr": s["h_thr"].to_numpy(float), "starved": s["h_starved"].to_numpy(float),
               "idle": s["h_idle"].to_numpy(float)}
    rb = s["rbucket"].to_numpy()
    order = {c: i for i, c in enumerate(LOSS_CAUSES_ORDER)}
    claimers = sorted((f for f in found if f.agent != "recommendation" and f.cause in _CLAIMS),
                      key=lambda f: (order.get(f.cause, 99), -f.confidence, f.id))
    per_finding: dict[str, float] = {}
    lines: dict[str, float] = {}
    for k, f in enumerate(claimers):
        col, reason = _CLAIMS[f.cause]
        m = keep & (label < 0) & (buckets[col] > 0) & _finding_mask(t, labels, f)
        if reason is not None:
            m &= rb == reason
        label[m] = k
        h = float(buckets[col][m].sum())
        per_finding[f.id] = h
        lines[f.cause] = lines.get(f.cause, 0.0) + h
    return Claims(keep=keep, label=label, per_finding=per_finding, lines=lines)


def loss_partition(ds: Dataset, found: list[Finding], sel: pd.Series | None = None, start: float | None = None,
                   end: float | None = None, paid: float | None = None,
                   claimed: Claims | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """The lost GPU-hours (paid - delivered) of a slice split so that each hour is under exactly one line.

    Each sample's lost part (throttled, starved or idle held) goes to the first finding, in cause order, whose scope
    and window hold the sample and whose cause explains that bucket (cooling: thermal throttling; power cap:
    power-cap throttling; drift: throttling with no reason bit; starved / checkpoint: starved; XID, idle held:
    idle held); what no finding claims is ``other / unattributed``; the workload's own underuse is its own line;
    allocated time without samples goes to the unknown-interval findings over it (by their overlap), the rest
    ``unknown (no finding)``. Returns (lines, GPU-hours per finding id inside the slice); the lines sum to
    paid - delivered. ``requeue`` (delivered work redone) is not a part of it. ``claimed``: :func:`claims` of the
    same slice, when already worked out."""
    s = ds.samples
    c = claims(ds, found, sel, start, end) if claimed is None else claimed
    keep, label = c.keep, c.label
    per_finding, lines = dict(c.per_finding), dict(c.lines)
    buckets = {"thr": s["h_thr"].to_numpy(float), "starved": s["h_starved"].to_numpy(float),
               "idle": s["h_idle"].to_numpy(float)}
    loss = (buckets["thr"] + buckets["starved"] + buckets["idle"]) * keep
    other = float(loss[label < 0].sum())
    observed = float(s["h"][keep].sum())   # a column at a time: the same sums as of the slice's frame
    under = float(s["h_under"][keep].sum())
    missing = float(s["h_missing"][keep].sum())   # samples without an activity reading
    unknown = max((paid if paid is not None else observed) - observed, 0.0) + missing
    gap_total = 0.0
    gaps = []
    for f in found:
        if f.agent == "recommendation":
            continue
        if f.kind == "xid":   # its silence after the XID: allocated time without samples, claimed as the gaps are
            share = _silence_share(f, start, end)
        elif f.kind != "unknown_gap" or f.gpu_hours <= 0:
            continue
        else:
            a, b = max(f.start, start if start is not None else f.start), min(f.end, end if end is not None else f.end)
            share = f.gpu_hours * (b - a) / max(f.end - f.start, 1e-9) if b > a else 0.0
        if sel is not None:
            share *= _scope_share(ds, f, sel)
        if share > 0:
            gaps.append((f, share))
            gap_total += share
    scale = min(1.0, unknown / gap_total) if gap_total > 0 else 0.0
    for f, share in gaps:
        per_finding[f.id] = share * scale
        lines[f.cause] = lines.get(f.cause, 0.0) + share * scale
    out = {k: v for k, v in sorted(lines.items(), key=lambda kv: -kv[1])}
    out[WORKLOAD_LINE] = under
    out[OTHER_LINE] = other
    out[UNKNOWN_LINE] = max(unknown - gap_total * scale, 0.0)
    return out, per_finding


def _silence_share(f: Finding, start: float | None, end: float | None) -> float:
    """The allocated GPU-hours of an XID finding's silence after the XID inside [start, end) (all of them when
    no period is given), spread evenly over the silent spans."""
    x = dict(f.extra)
    spans, hours = x.get("silent_spans") or [], float(x.get("silent_allocated_gpu_hours") or 0.0)
    length = sum(b - a for a, b in spans)
    if hours <= 0 or length <= 0:
        return 0.0
    lo, hi = (-np.inf, np.inf) if start is None else (start, end)
    inside = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)
    return hours * inside / length


def _scope_share(ds: Dataset, f: Finding, sel: pd.Series) -> float:
    """The fraction of a gap finding's devices that the selection covers (a node gap seen from a job or tenant)."""
    sc = f.scope_dict()
    s = ds.samples
    devs = [sc["device_uuid"]] if sc.get("device_uuid") else list(ds.devices.index[ds.devices["node"] == sc.get("node")])
    if not devs:
        return 1.0
    win = (s["t"] >= f.start - 3600) & (s["t"] < f.end + 3600) & s["device"].isin(devs)
    if not win.any():
        return 1.0 if sel.all() else 0.0
    return float((win & sel).sum()) / float(win.sum())


def shown_lines(lines: dict[str, float], lost: float, dp: int = DISPLAY_DP) -> tuple[list[tuple[str, float]], float]:
    """Lines as displayed (each rounded once) with a rounding line where their sum misses the rounded total;
    returns (lines, total) with total == the sum of the shown lines."""
    shown = [(k, round(v, dp)) for k, v in lines.items() if round(v, dp) != 0]
    total = round(lost, dp)
    diff = round(total - sum(v for _, v in shown), dp)
    if diff:
        shown.append(("rounding", diff))
    return shown, round(sum(v for _, v in shown), dp)


@dataclass(frozen=True)
class SliceTotals:
    """The parts of a slice's :func:`account` that read no finding: its paid hours, its buckets, its money."""

    paid: float
    buckets: dict
    cost_paid: float
    cost_delivered: float


def slice_totals(ds: Dataset, sel: pd.Series | None = None, start: float | None = None, end: float | None = None,
                 alloc_mask: pd.Series | None = None, claimed: Claims | None = None) -> SliceTotals:
    """:class:`SliceTotals` of a slice (the arguments as :func:`account`'s)."""
    keep = claimed.keep if claimed is not None else claims_slice(ds, sel, start, end)
    s = ds.samples[keep]   # one selection of the frame: the rows (and order) of selecting by each mask in turn
    paid = paid_hours(ds, alloc_mask, start, end)
    b = bucket_totals(s)
    known = b["delivered"] + sum(b["throttled"].values()) + b["underutilized"] + b["starved"] + b["idle_held"]
    b["unknown"] = max(paid - known, 0.0)
    cost_paid, cost_del = run_money(ds, s, alloc_mask, start, end)
    return SliceTotals(paid, b, cost_paid, cost_del)


def account(ds: Dataset, found: list[Finding], sel: pd.Series | None = None, start: float | None = None,
            end: float | None = None, alloc_mask: pd.Series | None = None, claimed: Claims | None = None,
            totals: SliceTotals | None = None) -> dict:
    """paid / delivered / buckets / by_cause for a slice (default: everything); ``claimed``: :func:`claims` of the
    same slice, when already worked out; ``totals``: :func:`slice_totals` of the same slice, when already worked
    out (the agents' two lanes work them out before the findings are all known)."""
    t = totals if totals is not None else slice_totals(ds, sel, start, end, alloc_mask, claimed)
    paid, b = t.paid, t.buckets
    lost = paid - b["delivered"]
    by_cause, _ = loss_partition(ds, found, sel, start, end, paid, claimed)
    cost_paid, cost_del = t.cost_paid, t.cost_delivered
    r = lambda x: round(float(x), 4)  # noqa: E731
    return {"paid": r(paid), "delivered": r(b["delivered"]), "lost": r(lost),
            "buckets": {"delivered": r(b["delivered"]), "underutilized": r(b["underutilized"]),
                        "starved": r(b["starved"]), "idle_held": r(b["idle_held"]), "unknown": r(b["unknown"]),
                        "throttled": {k: r(v) for k, v in b["throttled"].items()}},
            "by_cause": {k: r(v) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])},
            "currency": ds.currency, "cost": {"paid": cost_paid, "delivered": cost_del,
                                              "lost": cents(cost_paid - cost_del)}}


def cents(x: float) -> float:
    """Money rounded once, to the cent, half to even (the receipts' rule)."""
    return float(Decimal(repr(float(x))).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


RUN_KEY = ["cluster", "job_id", "run"]


def _run_keys(frame: pd.DataFrame) -> pd.Series:
    """One text key per row naming its run (cluster, job, run number), the same for samples and allocations."""
    run = pd.to_numeric(frame["run"], errors="coerce").fillna(-1).astype("int64").astype(str)
    return frame["cluster"].fillna("-").astype(str) + "\x1f" + frame["job_id"].fillna("-").astype(str) + "\x1f" + run


def _delivered_by_run_rate(samples: pd.DataFrame) -> list[tuple[str, str, str, float]]:
    """(run key, tenant, SKU, delivered GPU-hours) per distinct triple, in the order of the sorted text keys
    ("-" for a missing tenant or SKU): the samples grouped on their own columns, and only the groups' keys turned
    into text, so the per-sample frame is never formatted (tests/test_agents_hourly.py holds it to
    :func:`delivered_by_run_rate_reference`)."""
    cols = ["cluster", "job_id", "run", "tenant", "sku"]
    g = samples.groupby([samples[c] for c in cols], dropna=False, sort=False)["h_del"].sum()
    if not len(g):
        return []
    keys = g.index.to_frame(index=False).astype(object)   # an all-missing level comes back as float
    keys.columns = cols
    run_key = _run_keys(keys)
    ten = keys["tenant"].fillna("-")
    sku = keys["sku"].fillna("-")
    rows = [(k, str(t), str(u), float(h)) for k, t, u, h in zip(run_key, ten, sku, g.to_numpy(float))]
    rows.sort(key=lambda r: r[:3])
    return rows


def delivered_by_run_rate_reference(samples: pd.DataFrame) -> list[tuple[str, str, str, float]]:
    """The plain version of :func:`_delivered_by_run_rate`: every sample's key formatted, then grouped."""
    g = samples.groupby([_run_keys(samples), samples["tenant"].fillna("-"), samples["sku"].fillna("-")],
                        dropna=False)["h_del"].sum()
    return [(k, str(t), str(u), float(h)) for (k, t, u), h in g.items()]


def run_money(ds: Dataset, samples: pd.DataFrame, alloc_mask: pd.Series | None = None, start: float | None = None,
              end: float | None = None) -> tuple[float, float]:
    """(cost of paid, cost of delivered) of a slice, priced the way the receipts price it: each run's part of the
    slice at each device's tenant and SKU rate (paid: its allocated time in the period, unknown time included;
    delivered: its samples' delivered hours), rounded once per run to the cent, then summed. Over whole runs this
    is the sum of their receipts' ``cost.paid`` / ``cost.delivered``, so the statement's figure to the cent."""
    al = ds.allocs if alloc_mask is None else ds.allocs[alloc_mask]
    paid: dict = {}
    if len(al):
        a = al["start"].to_numpy(float)
        b = al["end"].to_numpy(float)
        if start is not None:
            a, b = np.maximum(a, start), np.minimum(b, end)
        hours = np.clip(b - a, 0, None) / 3600.0
        sku = al["device"].map(ds.devices["sku"]) if "sku" in ds.devices else pd.Series(None, index=al.index)
        rate = np.array([ds.rate(t if isinstance(t, str) else None, k if isinstance(k, str) else None)
                         for t, k in zip(al["tenant"], sku)], dtype=float)
        key = _run_keys(al)
        paid = pd.Series(hours * rate, index=al.index).groupby(key).sum().to_dict()
    delivered: dict = {}
    if len(samples):
        for k, ten, sku_, h in _delivered_by_run_rate(samples):
            delivered[k] = delivered.get(k, 0.0) + h * ds.rate(None if ten == "-" else ten,
                                                               None if sku_ == "-" else sku_)
    return (cents(sum(cents(v) for v in paid.values())), cents(sum(cents(v) for v in delivered.values())))


def _day_names(t: pd.Series) -> pd.Series:
    """"YYYY-MM-DD" (UTC) of each epoch second: formatted once per distinct day, not once per sample."""
    when = pd.to_datetime(t, unit="s", utc=True)
    codes, days = pd.factorize(when.dt.normalize())
    if (codes < 0).any():  # a missing time: the per-sample formatting says what it becomes
        return when.dt.strftime("%Y-%m-%d")
    return pd.Series(np.asarray(days.strftime("%Y-%m-%d"), dtype=object)[codes], index=t.index)


def alloc_day_hours(ds: Dataset, start: float | None = None, end: float | None = None) -> pd.DataFrame:
    """Each allocation's paid hours per UTC day it overlaps (within [start, end) when given): the columns of
    ``ds.allocs`` with ``day`` and ``paid``. The same overlap :func:`account` sums, cut at midnight."""
    al = ds.allocs
    if not len(al):
        return al.assign(day=pd.Series(dtype=object), paid=pd.Series(dtype=float))
    a = al["start"].to_numpy(float)
    b = al["end"].to_numpy(float)
    if start is not None:
        a, b = np.maximum(a, start), np.minimum(b, end)
    lo = np.floor(np.nanmin(a) / DAY_S) * DAY_S
    parts = []
    for d0 in np.arange(lo, np.nanmax(b), DAY_S):
        ov = np.clip(np.minimum(b, d0 + DAY_S) - np.maximum(a, d0), 0, None)
        m = ov > 0
        if m.any():
            parts.append(al[m].assign(day=format_ts(float(d0))[:10], paid=ov[m] / 3600.0))
    return pd.concat(parts) if parts else al.iloc[:0].assign(day=pd.Series(dtype=object), paid=pd.Series(dtype=float))


DAY_S = 86400.0
DAILY_KEYS = ("day", "cluster", "tenant", "partition", "qos")


def daily(ds: Dataset, start: float | None = None, end: float | None = None) -> list[dict]:
    """Rows per (day, cluster, tenant, partition, qos): paid (the allocations' overlap with the day, as
    :func:`account` counts it), delivered and each bucket from the samples of that day, and unknown = paid less
    the measured buckets; GPU-hours. Summed over a period's rows, paid is that period's :func:`account` paid."""
    ad = alloc_day_hours(ds, start, end)
    if not len(ad):
        return []
    keys = [ad["day"], *(ad[c].fillna("-") for c in DAILY_KEYS[1:])]
    paid = ad.groupby(keys)["paid"].sum()
    cols = {"h_del": "delivered", "h_under": "underutilized", "h_starved": "starved", "h_idle": "idle_held",
            "h_thr": "throttled"}
    s = ds.samples.loc[ds.samples["ai"] >= 0, ["t", *DAILY_KEYS[1:], *cols]]   # the columns read, not all
    if start is not None:
        s = s[(s["t"] >= start) & (s["t"] < end)]
    paid.index.names = list(DAILY_KEYS)
    frame = pd.DataFrame({"paid": paid})
    if len(s):
        g = s.groupby([_day_names(s["t"]).rename("day"), *(s[c].fillna("-") for c in DAILY_KEYS[1:])])[
            list(cols)].sum().rename(columns=cols)
        g.index.names = list(DAILY_KEYS)
        frame = frame.join(g, how="left")
    frame = frame.reindex(columns=["paid", *cols.values()]).fillna(0.0)
    out = []
    for k, row in frame.sort_index().iterrows():
        known = sum(float(row[c]) for c in cols.values())
        d = dict(zip(DAILY_KEYS, k))
        d.update({"paid": round(float(row["paid"]), 4), "unknown": round(max(float(row["paid"]) - known, 0.0), 4)})
        d.update({c: round(float(row[c]), 4) for c in cols.values()})
        out.append(d)
    return out


def hour_of_day(ds: Dataset) -> list[dict]:
    s = ds.samples.loc[ds.samples["ai"] >= 0, ["t", "h", "h_del"]]
    hour = pd.to_datetime(s["t"], unit="s", utc=True).dt.hour
    g = s.groupby(hour)[["h", "h_del"]].sum()
    return [{"hour": int(h), "paid_observed": round(float(r["h"]), 4), "delivered": round(float(r["h_del"]), 4)}
            for h, r in g.iterrows()]


# --- explain ---------------------------------------------------------------------------------------------------

class ExplainError(LookupError):
    pass


def scope_masks(ds: Dataset, kind: str, name: str) -> tuple[pd.Series, pd.Series]:
    """(sample mask, allocation mask) for node / rack / tenant / job / fleet."""
    s, al = ds.samples, ds.allocs
    if kind == "fleet":
        return pd.Series(True, index=s.index), pd.Series(True, index=al.index)
    if kind == "node":
        known = set(ds.devices["node"].dropna())
        if name not in known:
            raise ExplainError(f"unknown node {name!r} (known: {', '.join(sorted(known)[:12])})")
        return s["node"] == name, al["node"] == name
    if kind == "rack":
        known = set(ds.devices["rack"].dropna())
        if name not in known:
            raise ExplainError(f"unknown rack {name!r} (known: {', '.join(sorted(known)[:12])})")
        devs = set(ds.devices.index[ds.devices["rack"] == name])
        return s["rack"] == name, al["device"].isin(devs)
    if kind == "tenant":
        known = set(al["tenant"].dropna())
        if name not in known:
            raise ExplainError(f"unknown tenant {name!r} (known: {', '.join(sorted(known)[:12])})")
        return s["tenant"] == name, al["tenant"] == name
    if kind == "job":
        if name not in set(al["job_id"].dropna()):
            raise ExplainError(f"unknown job {name!r}")
        return s["job_id"] == name, al["job_id"] == name
    raise ExplainError(f"cannot explain a {kind!r}")


def _finding_in_scope(f: Finding, ds: Dataset, kind: str, name: str) -> bool:
    sc = f.scope_dict()
    if kind == "fleet":
        return True
    if kind == "node":
        if sc["node"] == name:
            return True
        if f.level == "rack" and sc["rack"] is not None:
            return name in set(ds.devices.loc[ds.devices["rack"] == sc["rack"], "node"])
        return False
    if kind == "rack":
        return sc["rack"] == name or (sc["node"] is not None and
                                      sc["node"] in set(ds.devices.loc[ds.devices["rack"] == name, "node"]))
    if kind == "tenant":
        return sc["tenant"] == name
    if kind == "job":
        return sc["job_id"] == name
    return False


def _share_in_scope(f: Finding, ds: Dataset, smask: pd.Series, start: float, end: float) -> float:
    """The part of a finding's GPU-hours that falls inside this scope and period (by its samples' share)."""
    sc = f.scope_dict()
    s = ds.samples
    fm = (s["t"] >= f.start) & (s["t"] < f.end)
    if sc["device_uuid"]:
        fm &= s["device"] == sc["device_uuid"]
    elif sc["job_id"]:
        fm &= s["job_id"] == sc["job_id"]
    elif sc["node"]:
        fm &= s["node"] == sc["node"]
    elif sc["rack"]:
        fm &= s["rack"] == sc["rack"]
    tot = float(s.loc[fm, "h"].sum()) or float(fm.sum())
    if tot <= 0:
        overlap = max(0.0, min(end, f.end) - max(start, f.start)) / max(f.end - f.start, 1.0)
        return f.gpu_hours * overlap
    inside = fm & smask & (s["t"] >= start) & (s["t"] < end)
    part = float(s.loc[inside, "h"].sum()) if float(s.loc[fm, "h"].sum()) else float(inside.sum())
    return f.gpu_hours * part / tot


def explain(ds: Dataset, found: list[Finding], kind: str, name: str | None, start: float, end: float) -> dict:
    """Where a scope's GPU-hours went in a period: the account, the loss split into lines that add up
    (:func:`loss_partition`), the findings in scope with their GPU-hours inside it, the next steps, and a
    headline written from the lines it heads. A job's period is clipped to the job's own allocation."""
    smask, amask = scope_masks(ds, kind, name or "")
    if kind == "job" and amask.any():
        al = ds.allocs[amask]
        start, end = max(start, float(al["start"].min())), min(end, float(al["end"].max()))
    claimed = claims(ds, found, smask, start, end)   # the same slice for the account and its lines
    acct = account(ds, found, sel=smask, start=start, end=end, alloc_mask=amask, claimed=claimed)
    lines, per_finding = loss_partition(ds, found, smask, start, end, acct["paid"], claimed)
    causes = []
    for f in found:
        if f.agent == "recommendation" or not f.cause or f.end <= start or f.start >= end:
            continue
        if not _finding_in_scope(f, ds, kind, name or ""):
            continue
        h = per_finding[f.id] if f.id in per_finding else _share_in_scope(f, ds, smask, start, end)
        if h <= 0 and f.gpu_hours > 0:
            continue
        causes.append((h, f))
    causes.sort(key=lambda x: (-x[0], x[1].id))
    recs = [f for f in found if f.agent == "recommendation" and
            set(dict(f.extra).get("based_on", [])) & {f2.id for _, f2 in causes}]
    table = loss_table(acct, lines)
    label = "the fleet" if kind == "fleet" else f"{kind} {name}"
    listed = [dict(f.to_json(), gpu_hours_in_scope=round(h, 4)) for h, f in causes[:5]]
    out = {"scope": {"kind": kind, "name": name}, "period": {"start": format_ts(start), "end": format_ts(end)},
           "account": acct, "by_cause": {k: round(v, 4) for k, v in lines.items()}, "table": table,
           "findings": listed,
           "recommendations": [f.to_json() for f in recs[:3]],
           "answer": headline(label, start, end, table, no_math=[round(h, DISPLAY_DP) for h, f in causes[:5]
                                                                 if f.cause == "not_computing"],
                              redone=[round(h, DISPLAY_DP) for h, f in causes[:5]
                                                                if f.cause == "requeue"])}
    if kind == "job":
        out["timeline"] = job_timeline(ds, found, name or "", start, end)
    return out


def job_timeline(ds: Dataset, found: list[Finding], job: str, start: float, end: float) -> list[dict]:
    """A job's runs in time order: each start and end (with its state), the application's progress marks, and
    what a failure cost since the last checkpoint (requeue_loss findings)."""
    events: list[tuple[float, int, dict]] = []
    al = ds.allocs[ds.allocs["job_id"] == job]
    for run, g in al.groupby("run"):
        a, b = float(g["start"].min()), float(g["end"].max())
        events.append((a, 0, {"run": int(run), "event": "start", "detail": f"{g['device'].nunique()} devices"}))
        events.append((b, 2, {"run": int(run), "event": "end", "detail": str(g["state"].iloc[0] or "running")}))
    pr = ds.progress[ds.progress["job_id"] == job]
    for m in pr.itertuples(index=False):
        detail = " ".join(x for x in (f"step {m.step}" if m.step is not None and m.step == m.step else "",
                                      str(m.note) if isinstance(m.note, str) else "") if x)
        events.append((float(m.t), 1, {"run": int(m.run), "event": m.kind, "detail": detail}))
    for f in found:
        if f.kind == "requeue_loss" and f.scope_dict().get("job_id") == job:
            last = next((e.note for e in f.evidence if e.signal == "progress_marks_in_run"), "")
            events.append((f.end, 3, {"run": int(dict(f.extra).get("run", 0)), "event": "lost_since_checkpoint",
                                      "detail": f"{fmt_h(f.gpu_hours)} GPU-h ({last})"}))
    return [{"t": format_ts(t), **e} for t, _o, e in sorted(events, key=lambda x: (x[0], x[1]))
            if start <= t <= end]


def loss_table(acct: dict, lines: dict[str, float]) -> dict:
    """What a reader sees: paid, delivered and the loss lines, each rounded once, the lost total their sum."""
    shown, total = shown_lines(lines, round(acct["paid"], DISPLAY_DP) - round(acct["delivered"], DISPLAY_DP))
    return {"paid": round(acct["paid"], DISPLAY_DP), "delivered": round(acct["delivered"], DISPLAY_DP),
            "lost": total, "lines": [{"cause": k, "gpu_hours": v} for k, v in shown]}


def headline(label: str, start: float, end: float, table: dict, top: int = 3, redone: list[float] = (),
             no_math: list[float] = ()) -> str:
    """One sentence made of the table's own shown figures (never recomputed); ``redone``: the shown GPU-hours of
    the requeue findings listed beside it (delivered work to redo, not a line of paid - delivered); ``no_math``:
    those of the busy-not-computing findings listed (delivered time that did no math: the tenant's, no line)."""
    causes = [ln for ln in table["lines"] if ln["cause"] not in (WORKLOAD_LINE, OTHER_LINE, UNKNOWN_LINE, "rounding")]
    under = next((ln["gpu_hours"] for ln in table["lines"] if ln["cause"] == WORKLOAD_LINE), 0.0)
    head = (f"{label} was paid for {table['paid']:,.{DISPLAY_DP}f} GPU-hours from {fmt_ts(start)} to {fmt_ts(end)} "
            f"and delivered {table['delivered']:,.{DISPLAY_DP}f}; of the {table['lost']:,.{DISPLAY_DP}f} lost, ")
    after = (f" Beside the loss, requeue loss: {sum(redone):,.{DISPLAY_DP}f} GPU-hours of delivered work to redo "
             "(not a part of paid - delivered)." if redone else "")
    after += (f" Beside the loss, busy but not computing: {sum(no_math):,.{DISPLAY_DP}f} delivered GPU-hours did no "
              "math (the tenant's own loss, not a part of paid - delivered)." if no_math else "")
    if causes:
        lead = "; ".join(f"{ln['cause'].replace('_', ' ')} {ln['gpu_hours']:,.{DISPLAY_DP}f}" for ln in causes[:top])
        return head + f"the largest causes: {lead}; the workload itself left {under:,.{DISPLAY_DP}f} unused." + after
    return head + (f"no finding explains a part of it; the workload itself left {under:,.{DISPLAY_DP}f} unused."
                   + after)


# --- per-entity figures: the daily/weekly account and rankings ------------------------------------------------

ENTITY_COLS = {"tenant": "tenant", "job": "job_id", "node": "node", "rack": "rack"}


def per_entity(ds: Dataset, by: str, start: float, end: float) -> pd.DataFrame:
    """Paid, delivered and lost GPU-hours per tenant / job / node / rack in [start, end): paid from the
    allocations' overlap with the period, delivered from the samples (the same figures :func:`account` gives one
    scope at a time). Index: the entity; rows sorted by lost, largest first."""
    col = ENTITY_COLS[by]
    al = ds.allocs
    if by == "rack":
        al = al.assign(rack=al["device"].map(ds.devices["rack"]))
    ov = np.clip(np.minimum(al["end"].to_numpy(float), end) - np.maximum(al["start"].to_numpy(float), start), 0, None)
    paid = pd.Series(ov / 3600.0, index=al.index).groupby(al[col].fillna("-")).sum()
    s = ds.samples
    m = (s["ai"] >= 0) & (s["t"] >= start) & (s["t"] < end)
    delivered = s.loc[m, "h_del"].groupby(s.loc[m, col].fillna("-")).sum()
    out = pd.DataFrame({"paid": paid}).join(delivered.rename("delivered"), how="outer").fillna(0.0)
    out = out[out["paid"] > 0]
    out["lost"] = out["paid"] - out["delivered"]
    return out.sort_values(["lost", "paid"], ascending=False)


__all__ = ["account", "daily", "hour_of_day", "explain", "findings", "job_timeline", "loss_partition", "loss_table",
           "headline", "per_entity", "alloc_day_hours", "run_money", "paid_hours", "cents",
           "ExplainError", "THROTTLE_REASONS"]
