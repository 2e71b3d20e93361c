"""What every agent reads: the ledger's samples, allocations, gaps and marks as pandas frames, bucketed per sample.

The per-sample buckets use the formulas and thresholds of the attribution method (:mod:`ledger.method`,
docs/method.md) applied to the whole fleet at once, so an agent's GPU-hours agree with the receipts':
``delivered = activity x clock ratio``, ``throttled = activity - delivered`` split by clock-event reason,
``underutilized = 1 - activity`` while working, ``starved`` / ``idle_held`` for near-zero activity with / without
a resident process. Allocated time with no sample is ``unknown``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..chain.canonical import ts_to_epoch
from ..chain.contracts import select_contract
from ..chain.entries import Kind
from ..method import THROTTLE_REASONS, reason_bucket
from ..method.attribution import DEFAULT_THRESHOLDS
from ..method.skus import match_sku

if TYPE_CHECKING:   # a ledger only where one is read: `ipledger analyze` of an export never loads SQLAlchemy
    from sqlalchemy.engine import Engine

# the method is the single source of thresholds and reason precedence
ACTIVE_MIN = DEFAULT_THRESHOLDS.active_min
RESIDENT_FB_MIB = DEFAULT_THRESHOLDS.resident_fb_mib

SAMPLE_READ_COLUMNS = ("device", "t", "dt", "clock_reasons", "sm_active", "tensor_active", "gpu_util", "sm_clock_mhz",
                       "power_w", "gpu_temp_c", "ecc_sbe_aggregate", "ecc_sbe_volatile", "row_remap_pending",
                       "row_remap_failure", "xid", "fb_used_mib", "compute_procs",
                       # the effective-compute lens's fields (agents.compute): DRAM, the FP pipes, counted FLOPs
                       "dram_active", "fp64_active", "fp32_active", "fp16_active", "fp_ops")
DEFAULT_RATE = Decimal("1.00")
BIT_THERMAL, BIT_POWER = 0x20 | 0x40, 0x4


PROGRESS_COLUMNS = ("job_id", "run", "t", "kind", "step", "note")


@dataclass
class Dataset:
    """Everything the agents look at, as of one ledger sequence number."""

    samples: pd.DataFrame
    allocs: pd.DataFrame          # one row per (run, device)
    devices: pd.DataFrame         # index device uuid: node, rack, sku, vendor, rated
    gaps: list[dict]
    progress: pd.DataFrame        # job_id, run, t, kind (checkpoint | output | step), step, note
    requeues: list[dict]
    statuses: dict[str, dict]     # finding id -> {"status": confirmed|dismissed, "by", "note", "ts"}
    recorded: list[dict]          # findings already in the ledger (their payloads)
    cadence: float
    start: float
    end: float
    through_seq: int
    currency: str = "USD"
    rates: dict = field(default_factory=dict)   # (tenant, sku) -> float price per GPU-hour
    hourly: pd.DataFrame | None = None           # per device-hour statistics (agents.hourstats); None: from samples
    sample_count: int | None = None              # the telemetry samples behind ``samples`` (None: one row each)
    lens_hours: pd.DataFrame | None = None       # per (device, hour, run) lens sums (agents.compute); None: from samples

    def rate(self, tenant: str | None, sku: str | None) -> float:
        return float(self.rates.get((tenant, sku), self.rates.get((None, sku), float(DEFAULT_RATE))))


def _rated(sku: str | None) -> tuple[float | None, str | None]:
    if not isinstance(sku, str) or not sku:  # NaN when no label named the model
        return None, None
    r = match_sku(sku)
    return (r.rated_sm_clock_mhz, r.key) if r else (None, None)


@dataclass
class EntryScan:
    """What :func:`load` takes from the entries, in sequence order (fed one entry at a time by :meth:`add`)."""

    starts: dict = field(default_factory=dict)        # run key -> (start epoch, allocation_started payload)
    ends: dict = field(default_factory=dict)          # run key -> (end epoch, allocation_ended payload)
    bound: list = field(default_factory=list)         # device_bound rows
    gaps: list = field(default_factory=list)
    prog: list = field(default_factory=list)
    requeues: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    recorded: list = field(default_factory=list)
    contracts: list = field(default_factory=list)     # contract_version ChainedEntries
    seg_nodes: dict = field(default_factory=dict)     # device -> node of its first telemetry segment
    seq: int = 0

    def add(self, ce) -> None:  # noqa: ANN001 - a ChainedEntry
        e = ce.entry
        self.seq = ce.seq
        key = (e.cluster, e.job_id, e.run or 0)
        k = e.kind
        if k == Kind.ALLOCATION_STARTED:
            self.starts[key] = (ts_to_epoch(e.ts), e.data)
        elif k == Kind.ALLOCATION_ENDED:
            self.ends[key] = (ts_to_epoch(e.ts), e.data)
        elif k == Kind.DEVICE_BOUND:
            d = e.data
            self.bound.append({"cluster": e.cluster, "job_id": e.job_id, "run": e.run or 0, "device": e.device,
                               "node": e.node or d.get("node"), "sku": d.get("sku"), "vendor": d.get("vendor"),
                               "rack": d.get("rack"), "index": d.get("index")})
        elif k == Kind.UNKNOWN_INTERVAL and e.ts_end:
            d = e.data
            self.gaps.append({"id": e.entry_id, "start": ts_to_epoch(e.ts), "end": ts_to_epoch(e.ts_end),
                              "node": e.node, "device": e.device, "cluster": e.cluster, "job_id": e.job_id,
                              "cause": d.get("cause", "unknown"), "scope": d.get("scope"),
                              "detail": d.get("detail", "")})
        elif k == Kind.PROGRESS:
            d = e.data
            self.prog.append({"job_id": e.job_id, "run": e.run or 0, "t": ts_to_epoch(e.ts),
                              "kind": d.get("kind") or "checkpoint", "step": d.get("step"), "note": d.get("note")})
        elif k == Kind.ALLOCATION_REQUEUED:
            self.requeues.append({"cluster": e.cluster, "job_id": e.job_id, "run": e.run or 0,
                                  "t": ts_to_epoch(e.ts), **e.data})
        elif k in (Kind.FINDING_CONFIRMED, Kind.FINDING_DISMISSED):
            d = e.data
            self.statuses[d.get("finding_id")] = {"status": "confirmed" if k == Kind.FINDING_CONFIRMED else
                                                  "dismissed", "by": d.get("by"), "note": d.get("note"), "ts": e.ts}
        elif k == Kind.FINDING_RECORDED:
            self.recorded.append(e.data)
        elif k == Kind.TELEMETRY_SEGMENT and e.node:
            for dev in e.data.get("devices", []):
                self.seg_nodes.setdefault(dev, e.node)
        elif k == Kind.CONTRACT_VERSION:
            self.contracts.append(ce)


def load(engine: Engine, through_seq: int | None = None, topology: dict | None = None) -> Dataset:
    """Read the ledger into a :class:`Dataset` (entries through ``through_seq``; all samples of those segments)."""
    from ..chain.store import iter_entries
    from ..telemetry.sealed import read_samples

    scan = EntryScan()
    with engine.connect() as conn:
        for ce in iter_entries(conn, through_seq=through_seq):
            scan.add(ce)
        s = read_samples(conn, columns=SAMPLE_READ_COLUMNS).to_pandas()
    return assemble(scan, s, topology)


def assemble(scan: EntryScan, s: pd.DataFrame, topology: dict | None = None) -> Dataset:
    """The :class:`Dataset` from what the entries said and the samples (SAMPLE_READ_COLUMNS, any order): what
    :func:`load` does after reading, and what an import analysed without a ledger does with its own parts."""
    devices = devices_frame(scan, s["device"].unique() if len(s) else [], topology)
    allocs = allocations_frame(scan)
    # --- samples ------------------------------------------------------------------------------------------------
    s = sample_frame(s)
    cadence = float(s["dt"].median()) if len(s) else 300.0
    start, end = close_allocations(allocs, float(s["t"].min()) if len(s) else None,
                                   float(s["t"].max()) + cadence if len(s) else 0.0)
    s = assign_runs(s, allocs)
    s = s.join(devices[["node", "rack", "sku", "vendor", "rated"]], on="device")
    fill_rated_clock(s, devices)
    add_bucket_hours(s)
    return finish(scan, s, allocs, devices, cadence, start, end)


def sample_frame(s: pd.DataFrame) -> pd.DataFrame:
    """Samples as read (SAMPLE_READ_COLUMNS) under the agents' short column names, floats, in (device, t) order."""
    s = s.rename(columns={"clock_reasons": "reasons", "sm_active": "sm", "sm_clock_mhz": "clk", "power_w": "power",
                          "gpu_temp_c": "temp", "ecc_sbe_aggregate": "ecc", "ecc_sbe_volatile": "eccv",
                          "fb_used_mib": "fb",
                          "compute_procs": "procs", "tensor_active": "tensor", "dram_active": "dram",
                          "fp64_active": "fp64", "fp32_active": "fp32", "fp16_active": "fp16", "fp_ops": "ops"})
    for col in s.columns:  # all-NULL columns come back as object dtype: the agents need floats (NaN = not measured)
        if col != "device" and s[col].dtype != np.float64:   # a float64 column is already what this makes
            s[col] = pd.to_numeric(s[col], errors="coerce").astype(float)
    if len(s) and devices_in_order(s["device"]):   # already in (device, t) order: a stable sort keeps it
        codes = pd.factorize(s["device"])[0]
        dev_start = np.r_[True, codes[1:] != codes[:-1]]
        t = s["t"].to_numpy(float)
        if bool(np.all(dev_start[1:] | (t[1:] >= t[:-1]))):
            return s.reset_index(drop=True)
    return s.sort_values(["device", "t"], kind="stable").reset_index(drop=True)


def devices_in_order(device: pd.Series) -> bool:
    """``device.is_monotonic_increasing``, from the column's integer codes (its first-seen order) where no
    device is missing: each device's rows together (codes never fall) and the devices in order (a few names
    compared, not every row's)."""
    codes, uniques = pd.factorize(device)
    if (codes < 0).any():
        return bool(device.is_monotonic_increasing)
    return bool(np.all(codes[1:] >= codes[:-1])) and bool(pd.Index(uniques).is_monotonic_increasing)


def devices_frame(scan: EntryScan, sample_devices, topology: dict | None = None) -> pd.DataFrame:  # noqa: ANN001
    """One row per device (index: uuid): node, rack, sku, vendor, rated clock and SKU key."""
    dev_rows: dict[str, dict] = {}
    for b in scan.bound:
        dev_rows.setdefault(b["device"], {}).update({k: v for k, v in b.items() if v is not None and k in
                                                    ("node", "sku", "vendor", "rack")})
    for dev in sample_devices:
        dev_rows.setdefault(dev, {}).setdefault("node", scan.seg_nodes.get(dev))
    topology = topology or {}
    devices = pd.DataFrame.from_dict(dev_rows, orient="index")
    for col in ("node", "sku", "vendor", "rack"):
        if col not in devices:
            devices[col] = None
    devices["rack"] = [r if r else topology.get(n) for n, r in zip(devices["node"], devices["rack"])]
    rated, keys = zip(*[_rated(x) for x in devices["sku"]]) if len(devices) else ((), ())
    devices["rated"] = list(rated)
    devices["sku_key"] = list(keys)
    return devices


def allocations_frame(scan: EntryScan) -> pd.DataFrame:
    """One row per (run, device) that started; ``end`` NaN while the run has not ended."""
    rows = []
    for b in scan.bound:
        key = (b["cluster"], b["job_id"], b["run"])
        if key not in scan.starts:
            continue
        t0, ctx = scan.starts[key]
        t1, endd = scan.ends.get(key, (None, {}))
        rows.append({"cluster": key[0], "job_id": key[1], "run": key[2], "device": b["device"], "node": b["node"],
                     "start": t0, "end": t1, "tenant": ctx.get("account"), "partition": ctx.get("partition"),
                     "qos": ctx.get("qos"), "state": endd.get("state"), "synthetic": bool(ctx.get("synthetic"))})
    return pd.DataFrame(rows, columns=["cluster", "job_id", "run", "device", "node", "start", "end", "tenant",
                                       "partition", "qos", "state", "synthetic"])


def close_allocations(allocs: pd.DataFrame, t_min: float | None, end_known: float) -> tuple[float, float]:
    """Runs still open end where the data ends (``end_known``: the last sample's start + cadence); returns the
    dataset's (start, end)."""
    if len(allocs):
        allocs["end"] = allocs["end"].fillna(max(end_known, allocs["start"].max()))
    start = float(min([t_min] if t_min is not None else [], default=0.0) or
                  (allocs["start"].min() if len(allocs) else 0.0))
    end = float(max([end_known, allocs["end"].max() if len(allocs) else 0.0]))
    return start, end


def finish(scan: EntryScan, s: pd.DataFrame, allocs: pd.DataFrame, devices: pd.DataFrame, cadence: float,
           start: float, end: float) -> Dataset:
    """The :class:`Dataset` of these (bucketed) samples: prices from the contracts, the entries' other parts."""
    currency, rates = "USD", {}
    tenants = set(allocs["tenant"].dropna()) | {None}
    for ten in tenants:
        c, _ = select_contract(scan.contracts, ten)
        currency = c.currency
        for sku in set(devices["sku"].dropna()):
            r = match_sku(sku)
            basis = c.basis_for(r.key if r else sku)
            try:
                rates[(ten, sku)] = float(basis.hourly(r.tdp_w if r else None))
            except (AssertionError, ArithmeticError):
                pass
    prog_df = pd.DataFrame(scan.prog, columns=list(PROGRESS_COLUMNS))
    return Dataset(samples=s, allocs=allocs, devices=devices, gaps=scan.gaps, progress=prog_df,
                   requeues=scan.requeues, statuses=scan.statuses, recorded=scan.recorded, cadence=cadence,
                   start=start, end=end, through_seq=scan.seq, currency=currency, rates=rates)


def assign_runs(s: pd.DataFrame, allocs: pd.DataFrame) -> pd.DataFrame:
    """Attach the allocation (run) each sample belongs to: sample start within [alloc start, alloc end)."""
    n = len(s)
    ai = np.full(n, -1, dtype=np.int64)
    if n and len(allocs):
        a = allocs.reset_index(drop=True)
        rows_of = a.groupby("device").indices        # each device's allocation rows, in row order
        st_all, en_all, t_all = a["start"].to_numpy(float), a["end"].to_numpy(float), s["t"].to_numpy()
        for dev, idx in s.groupby("device", sort=False).indices.items():
            rows = rows_of.get(dev)
            if rows is None:
                continue
            st, en = st_all[rows], en_all[rows]
            order = np.argsort(st)
            st, en, rows = st[order], en[order], rows[order]
            t = t_all[idx]
            k = np.searchsorted(st, t, side="right") - 1
            ok = (k >= 0) & (t < en[np.clip(k, 0, None)])
            ai[idx[ok]] = rows[k[ok]]
    s["ai"] = ai
    for col in ("job_id", "run", "tenant", "partition", "qos", "cluster"):
        s[col] = label_column(allocs[col].to_numpy(object) if len(allocs) else np.array([], dtype=object), ai)
    return s


def label_column_reference(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each sample's label from its allocation row (``values[rows]``; None where ``rows`` is -1), one Python
    object a sample, for a frame's column (pandas infers its type): the plain version of :func:`label_column`."""
    return np.where(rows >= 0, values[np.clip(rows, 0, None)] if len(values) else None, None)


def label_column(values: np.ndarray, rows: np.ndarray):  # noqa: ANN201 - an ndarray or a pandas string array
    """:func:`label_column_reference`'s column, without a Python object per sample where the labels are strings:
    pandas infers the column's type from the distinct labels taken (the same inference as over every sample: it
    depends on which kinds of values occur, not on how often), and a string column is then taken by pyarrow
    from the few labels. Any other type goes the plain way. tests/test_agents_label_column.py holds them equal."""
    if not len(rows):
        return label_column_reference(values, rows)
    taken = np.bincount(rows + 1, minlength=len(values) + 1) > 0     # [no row, row 0, row 1, ...]
    if all(v is None for v in values[taken[1:]]):
        return np.full(len(rows), None, dtype=object)   # no label at all (a capture's partition, qos, tenant)
    kinds = pd.Series(np.array([*values[taken[1:]], *([None] if taken[0] else [])], dtype=object))
    if not isinstance(kinds.dtype, pd.StringDtype) or kinds.dtype.storage != "pyarrow":
        return label_column_reference(values, rows)
    import pyarrow as pa

    labels = pa.array([v if isinstance(v, str) else None for v in values] + [None], type=pa.string())
    picked = labels.take(pa.array(np.where(rows >= 0, rows, len(values)), type=pa.int64()))
    return pd.array(picked, dtype=kinds.dtype)


def fill_rated_clock(s: pd.DataFrame, devices: pd.DataFrame) -> None:
    """A device with no SKU rating gets the 99th percentile of its own loaded clock (documented fallback)."""
    missing = s["rated"].isna()
    if missing.any():
        loaded = s.loc[missing & (s["sm"].fillna(s["gpu_util"]) > 0.3), ["device", "clk"]]   # not every column
        p99 = loaded.groupby("device")["clk"].quantile(0.99)
        codes, names = pd.factorize(s.loc[missing, "device"])   # each device looked up once, not each sample
        s.loc[missing, "rated"] = p99.reindex(names).to_numpy(float)[codes]
        for dev, v in p99.items():
            if pd.isna(devices.at[dev, "rated"]):
                devices.at[dev, "rated"] = v


def activity_and_ratio(sm: np.ndarray, tensor: np.ndarray, util: np.ndarray, clk: np.ndarray,
                       rated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's activity (SM active, else tensor active, else coarse utilisation; NaN: none measured) and
    clock ratio min(clock / rated, 1) (1 where either is unknown): the method's choice and ratio."""
    act = np.where(np.isnan(sm), np.where(np.isnan(tensor), util, tensor), sm)
    ratio = np.where(np.isnan(clk) | np.isnan(rated), 1.0, np.clip(clk / np.where(rated > 0, rated, 1.0), 0.0, 1.0))
    return act, ratio


def add_bucket_hours(s: pd.DataFrame) -> None:
    """Per-sample GPU-hours in each bucket (only for allocated samples), the method's formulas vectorised."""
    act, ratio = activity_and_ratio(s["sm"].to_numpy(float), s["tensor"].to_numpy(float),
                                    s["gpu_util"].to_numpy(float), s["clk"].to_numpy(float), s["rated"].to_numpy(float))
    s["act"] = act
    missing = np.isnan(act)
    a = np.clip(np.nan_to_num(act), 0.0, 1.0)
    s["ratio"] = ratio
    resident = (np.nan_to_num(s["procs"].to_numpy(float)) > 0) | (np.nan_to_num(s["fb"].to_numpy(float)) >
                                                                   RESIDENT_FB_MIB)
    low = ~missing & (a < ACTIVE_MIN)
    working = ~missing & ~low
    h = s["dt"].to_numpy(float) / 3600.0 * (s["ai"].to_numpy() >= 0)
    s["h"] = h
    s["h_del"] = np.where(working, h * a * ratio, 0.0)
    s["h_thr"] = np.where(working, h * a * (1.0 - ratio), 0.0)
    s["h_under"] = np.where(working, h * (1.0 - a), 0.0)
    s["h_starved"] = np.where(low & resident, h, 0.0)
    s["h_idle"] = np.where(low & ~resident, h, 0.0)
    s["h_missing"] = np.where(missing, h, 0.0)
    reasons = s["reasons"].to_numpy(float)
    s["rbucket"] = reason_bucket(np.where(np.isnan(reasons), -1, reasons).astype(np.int64))
    s["running"] = working | (low & resident)
    s["resident"] = resident


def bucket_totals(s: pd.DataFrame) -> dict[str, float]:
    """Sum the per-sample buckets of a slice of samples (hours)."""
    out = {"delivered": float(s["h_del"].sum()), "underutilized": float(s["h_under"].sum()),
           "starved": float(s["h_starved"].sum()), "idle_held": float(s["h_idle"].sum())}
    thr = s.groupby("rbucket")["h_thr"].sum() if len(s) else pd.Series(dtype=float)
    out["throttled"] = {name: float(thr.get(i, 0.0)) for i, name in enumerate(THROTTLE_REASONS)}
    out["unknown_field_missing"] = float(s["h_missing"].sum())
    return out


def coverage_gaps(ds: Dataset) -> pd.DataFrame:
    """Allocated device time without any sample: rows (device, node, start, end, hours), per contiguous gap."""
    if not len(ds.allocs):
        return pd.DataFrame(columns=["device", "node", "start", "end"])
    out = []
    step = ds.cadence
    # A row may stand for a run of samples from t to span_end with no step longer than 2.5 cadences between
    # them (the device-hour dataset, agents/hourly.py): no gap inside it, and where an allocation cuts it, a
    # sample no further than that from the cut, as the samples themselves would have.
    spans = "span_end" in ds.samples
    by_dev = {d: (g["t"].to_numpy(), g["span_end"].to_numpy() if spans else g["t"].to_numpy())
              for d, g in ds.samples.groupby("device")}
    for a in ds.allocs.itertuples():
        t, e = by_dev.get(a.device, (np.zeros(0), np.zeros(0)))
        keep = (e >= a.start - step) & (t < a.end)
        t, e = t[keep], e[keep]
        if spans:
            t, e = np.maximum(t, a.start - step), np.minimum(e, a.end - step)
            e = np.maximum.accumulate(np.maximum(e, t)) if len(t) else e   # rows of one span share its t
        edges = np.concatenate([[a.start], e + step, ]) if len(t) else np.array([a.start])
        nexts = np.concatenate([t, [a.end]]) if len(t) else np.array([a.end])
        # a gap is where the next sample starts more than 1.5 cadences after the previous one ended
        gap = nexts - edges > 1.5 * step
        for s0, e0 in zip(edges[gap], nexts[gap]):
            out.append({"device": a.device, "node": a.node, "start": float(max(s0, a.start)),
                        "end": float(min(e0, a.end)), "job_id": a.job_id})
    return pd.DataFrame(out, columns=["device", "node", "start", "end", "job_id"])


def payload(obj) -> dict:  # noqa: ANN001
    return obj if isinstance(obj, dict) else json.loads(obj)
