"""The agents' dataset from device-hours instead of every sample: memory O(devices x hours), not O(samples).

:func:`load_compact` returns a :class:`~ledger.agents.data.Dataset` whose ``samples`` frame holds one row per
(device, hour, run) — and one per throttle reason with throttled time — carrying that piece's summed GPU-hours in
the same columns the per-sample frame has (``h``, ``h_del``, ``h_thr``, ``h_under``, ``h_starved``, ``h_idle``,
``h_missing``, ``rbucket``, the run's cluster / job / tenant / partition / QOS). The accounting that only sums
those columns — the daily account, the hour-of-day profile, bucket totals, prices — runs unchanged on it and gives
the full-resolution figures (tests/test_agents_hourly.py holds it to :func:`ledger.agents.data.load`).

Exactness, where an hour's sums are not enough:

- an hour in which a run starts or ends on the device (its samples belong to two runs), or whose clock went above
  the device's rated clock (the clock ratio is clipped there), brings its raw samples, bucketed by the
  full-resolution code (:func:`ledger.agents.data.add_bucket_hours`), instead of its piece: a bounded read, two hours
  per run and device;
- coverage gaps (allocated time with no sample) need the sample times: an hour whose longest step between
  samples is at most 2.5 cadences (no room for a gap inside it) is one row spanning its first to its last sample
  (``span_end``, which :func:`~ledger.agents.data.coverage_gaps` reads), any other hour brings all its sample
  times.

The rated clock of a device whose SKU has no rating is the 99th percentile of its loaded clock (the documented
fallback), read from its raw clock column.

:func:`analyze` runs every agent on this dataset with the raw samples of the device-hours :func:`detail_hours`
screens for what the agents will find (their scopes and windows, with their evidence's reach); the rules that
look past an hour's GPU-hours decide on the device-hours' own statistics (:mod:`ledger.agents.hourstats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from ..chain.store import iter_entries
from ..telemetry import hours as dh
from ..telemetry.blocks import float_values
from ..telemetry.sealed import iter_sample_pieces, read_samples
from . import compute, hourstats
from .common import DAY
from .data import (SAMPLE_READ_COLUMNS, Dataset, EntryScan, assign_runs, add_bucket_hours, fill_rated_clock, allocations_frame,
                   close_allocations, coverage_gaps, devices_frame, finish, sample_frame)

if TYPE_CHECKING:   # the engine is the caller's
    from sqlalchemy.engine import Engine

ALLOC_COLS = ("cluster", "job_id", "run", "tenant", "partition", "qos")
PIECE_COLS = ("device", "t", "span_end", "ai", "h", "h_del", "h_thr", "h_under", "h_starved", "h_idle", "h_missing",
              "rbucket")
OTHER = 4   # THROTTLE_REASONS index of "other"
REFINE_DEVICES = 16   # devices whose raw samples _refine reads and buckets at a time
LENS_COLS = ("dram", "fp64", "fp32", "fp16", "ops")   # read by agents.compute from its own pass, not kept here
RAW_COLS = ("dt", "sm", "clk", "power", "temp", "ecc", "row_remap_pending", "row_remap_failure", "xid", "fb", "procs",
            "act", "ratio")


def load_compact(engine: Engine, through_seq: int | None = None, topology: dict | None = None,
                 detail: bool = False) -> Dataset:
    """The agents' dataset over device-hours (see the module docstring); ``detail``: with the raw samples of
    the device-hours :func:`detail_hours` picks for the agents' findings (:func:`analyze`)."""
    scan = EntryScan()
    with engine.connect() as conn:
        for ce in iter_entries(conn, through_seq=through_seq):
            scan.add(ce)
        return compact_dataset(scan, LedgerSamples(conn), topology, detail)


def compact_dataset(scan: EntryScan, src: "LedgerSamples", topology: dict | None = None,  # noqa: F821
                    detail: bool = False) -> Dataset:
    """:func:`load_compact` from what the entries said and a source of device-hours and raw samples (the
    ledger's, or an export's held in memory: :class:`ledger.agents.memory.ExportSamples`)."""
    from dataclasses import replace

    hrs = src.hours()
    ds = replace(_compact(src, scan, hrs, topology), sample_count=int(hrs["n"].sum()) if len(hrs) else 0)
    ds.lens_hours = compute.stats_from_source(src, ds)   # the lens rules' sums, before the raw reads end
    return _refine(src, ds, detail_hours(ds, hrs)) if detail else ds


class LedgerSamples:
    """The ledger's stored device-hours (merged over segments) and its sample blocks, as :func:`compact_dataset`
    reads them."""

    def __init__(self, conn) -> None:  # noqa: ANN001 - a Connection
        self.conn = conn

    def hours(self) -> pd.DataFrame:
        return dh.merged_frame(self.conn)

    def done_reading(self) -> None:
        """No more reads (the ledger's samples stay where they are)."""

    def device_samples(self, devices: list[str], columns: tuple[str, ...]) -> pd.DataFrame:
        """Every sample of these devices, these columns."""
        return read_samples(self.conn, devices=devices, columns=columns).to_pandas()

    def sample_batches(self, columns: tuple[str, ...], rows: int):  # noqa: ANN201 - Iterator[pd.DataFrame]
        """Every sample, these columns, in one pass over the blocks: frames of about ``rows`` rows (a device's
        samples may fall in several, in any order)."""
        tables, n = [], 0
        for _dev, table in iter_sample_pieces(self.conn, columns=columns):
            tables.append(table)
            n += table.num_rows
            if n >= rows:
                yield pa.concat_tables(tables).to_pandas()
                tables, n = [], 0
        if tables:
            yield pa.concat_tables(tables).to_pandas()

    def hour_samples(self, want: dict[str, set]) -> pd.DataFrame:
        """The samples (SAMPLE_READ_COLUMNS) of these hours per device."""
        sids = dh.segments_of(self.conn, {(d, h) for d, hs in want.items() for h in hs})
        tables = []
        for dev, table in iter_sample_pieces(self.conn, segment_ids=sids, devices=sorted(want),
                                             columns=SAMPLE_READ_COLUMNS):
            hb = (float_values(table.column("t")) // dh.HOUR) * dh.HOUR
            keep = np.isin(hb, list(want[dev]))
            if keep.any():
                tables.append(table.filter(pa.array(keep)))
        return pa.concat_tables(tables).to_pandas() if tables else pd.DataFrame(columns=list(SAMPLE_READ_COLUMNS))


def cadence_of(hrs: pd.DataFrame) -> float:
    """The median sample duration, from each device-hour's mean duration weighted by its samples (the sample
    median when a device-hour's samples share one duration, as a scrape or collector cadence does)."""
    if not len(hrs):
        return 300.0
    mean_dt = (hrs["covered_s"] / hrs["n"]).to_numpy(float)
    w = hrs["n"].to_numpy(float)
    order = np.argsort(mean_dt, kind="stable")
    cum = np.cumsum(w[order])
    total = cum[-1]
    lo = mean_dt[order][np.searchsorted(cum, total / 2.0, side="left")]
    if total % 2 == 0:  # an even count: the mean of the two middle samples, as a median is
        hi = mean_dt[order][np.searchsorted(cum, total / 2.0 + 1, side="left")]
        return float((lo + hi) / 2.0)
    return float(mean_dt[order][np.searchsorted(cum, (total + 1) / 2.0, side="left")])


def _compact(src, scan: EntryScan, hrs: pd.DataFrame, topology: dict | None) -> Dataset:  # noqa: ANN001
    devices = devices_frame(scan, sorted(hrs["device"].unique()) if len(hrs) else [], topology)
    allocs = allocations_frame(scan)
    cadence = cadence_of(hrs)
    start, end = close_allocations(allocs, float(hrs["t_first"].min()) if len(hrs) else None,
                                   float(hrs["t_last"].max()) + cadence if len(hrs) else 0.0)
    _rate_fallback(src, devices)
    rated = hrs["device"].map(devices["rated"]).to_numpy(float) if len(hrs) else np.zeros(0)
    ai, edge = _assign_hours(hrs, allocs)
    clipped = hrs["clk_max"].to_numpy(float) > np.where(np.isnan(rated), np.inf, rated)
    refine = edge | clipped
    # an hour with a step over 2.5 cadences between samples (or one unknown) may hold a coverage gap
    gap_room = ~((hrs["n"] == 1) | (hrs["gap_max"] <= 2.5 * cadence)).to_numpy()
    clean = hrs[~refine]
    parts = [_pieces(clean, ai[~refine], rated[~refine], ~gap_room[~refine])]
    times = []
    raw_keys = hrs[refine | gap_room][["device", "hour"]]
    if len(raw_keys):
        raw = _raw(src, raw_keys, allocs, devices)
        want = set(zip(hrs.loc[refine, "device"], hrs.loc[refine, "hour"]))
        sel = _in_keys(raw["device"], (raw["t"] // dh.HOUR) * dh.HOUR, want)
        parts.append(_raw_part(raw[sel]))
        rest = raw.loc[~sel, ["device", "t", "ai"]]
        times.append(rest.assign(span_end=rest["t"].to_numpy()))
        del raw, rest   # the frame is built from copies: drop the sources before the next copy
    s = _assemble(parts + times, allocs, devices)
    del parts, times
    ds = finish(scan, s, allocs, devices, cadence, start, end)
    ds.hourly = hourstats.correctable(hrs)[list(hourstats.COLUMNS)].reset_index(drop=True)
    return ds


def _raw_part(raw: pd.DataFrame) -> pd.DataFrame:
    """What the agents read of raw samples (the run's and the device's labels are set on assembly)."""
    keep = [c for c in raw.columns if c not in ("rated", "reasons", "tensor", "gpu_util", "eccv", *LENS_COLS,
                                                *ALLOC_COLS)]
    return raw[keep].assign(span_end=raw["t"].to_numpy())


def _columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A frame's columns as arrays of their own (none a view of a shared block), so each can be freed alone;
    a text column as references to one string per distinct value (not a new string object per row)."""
    out = {}
    for c in frame.columns:
        col = frame[c]
        if col.dtype.kind in "biufcmM":
            out[c] = col.to_numpy(copy=True)
        else:
            codes, uniq = pd.factorize(col, use_na_sentinel=False)
            out[c] = np.asarray(uniq, dtype=object)[codes]
    return out


def _assemble(parts: list, allocs: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:
    """The dataset's rows from pieces, raw samples and sample times, in (device, t) order, labelled with their
    run and device. Built a column at a time, each part's column dropped once copied (``parts``, frames or
    :func:`_columns` dicts, is emptied), so the rows are held about once, not once per step."""
    parts = [p if isinstance(p, dict) else _columns(p) for p in parts if len(p)]
    if not parts:
        parts = [{c: np.zeros(0, dtype=object if c == "device" else float) for c in PIECE_COLS}]
    sizes = [len(p["t"]) for p in parts]
    labels = (*ALLOC_COLS, "node", "rack", "sku", "vendor", "rated")   # set below from the run and the device
    names = [c for c in dict.fromkeys(c for p in parts for c in p) if c not in labels]
    # no raw sample read: the columns the agents read of one are there, unmeasured (and no sample running)
    names += [c for c in (*RAW_COLS, "running", "resident") if c not in names]

    def blank(col: str, n: int) -> np.ndarray:
        if col == "device":
            return np.full(n, None, dtype=object)
        if col in ("running", "resident"):   # a piece or a time row is no sample the count-based agents look at
            return np.zeros(n, dtype=bool)
        if col == "rbucket":
            return np.full(n, float(OTHER))
        return np.full(n, 0.0 if col in PIECE_COLS[4:] else np.nan)

    cols: dict[str, np.ndarray] = {}
    for col in names:
        pieces = [p.pop(col) if col in p else blank(col, n) for p, n in zip(parts, sizes)]
        kinds = {x.dtype.kind for x in pieces}
        if col == "device" or "O" in kinds:
            v = np.concatenate([x.astype(object) for x in pieces])
        elif col in ("running", "resident"):
            v = np.concatenate([pd.array(x, dtype="boolean").fillna(False).to_numpy(bool) for x in pieces])
        else:
            v = np.concatenate([x.astype(float) for x in pieces])
        del pieces
        if col in PIECE_COLS[4:]:
            v = np.where(np.isnan(v), float(OTHER) if col == "rbucket" else 0.0, v)
        cols[col] = v
    parts.clear()
    cols["span_end"] = np.where(np.isnan(cols["span_end"]), cols["t"], cols["span_end"])
    cols["ai"] = cols["ai"].astype(np.int64)
    dev, t = cols["device"], cols["t"]
    if not _in_order(dev, t):
        codes = pd.factorize(dev, sort=True)[0]
        order = np.lexsort((t, codes))   # stable: (device, t) as a stable sort_values gives it
        for col in names:   # a column at a time: one extra column held, not a sorted copy of the frame
            cols[col] = cols[col][order]
    index = pd.RangeIndex(len(cols["t"]))
    s = pd.DataFrame(index=index)

    def labels(v: np.ndarray) -> pd.Series:
        # references to a few shared strings (8 B a row), not a string column's copy of each row's text
        return pd.Series(v, index=index, dtype=object, copy=False)

    for col in names:
        v = cols.pop(col)
        s[col] = labels(v) if v.dtype == object else v
    ai_s = s["ai"].to_numpy()
    dev_codes, dev_names = pd.factorize(s["device"].to_numpy(object), use_na_sentinel=False)
    for col in ALLOC_COLS:
        vals = allocs[col].to_numpy(object) if len(allocs) else np.array([], dtype=object)
        s[col] = labels(np.where(ai_s >= 0, vals[np.clip(ai_s, 0, None)] if len(vals) else None, None))
    for col in ("node", "rack", "sku", "vendor", "rated"):   # column by column: a join would copy the frame
        per_device = devices[col].reindex(dev_names).to_numpy(object)[dev_codes]
        s[col] = per_device.astype(float) if col == "rated" else labels(per_device)
    return s


def _in_order(dev: np.ndarray, t: np.ndarray) -> bool:
    """Whether the rows are in (device, t) order (what sorting would give)."""
    return bool(np.all((dev[1:] > dev[:-1]) | ((dev[1:] == dev[:-1]) & (t[1:] >= t[:-1]))))


def _refine(src, ds: Dataset, keys: frozenset) -> Dataset:  # noqa: ANN001
    """The dataset with these device-hours' raw samples in place of their rows (pieces or sample times), read
    and bucketed :data:`REFINE_DEVICES` devices at a time (the reading's copies are a chunk's, not the fleet's)."""
    from dataclasses import replace

    if not keys:
        return ds
    s = ds.samples
    kept = _columns(s[~_in_keys(s["device"], (s["t"] // dh.HOUR) * dh.HOUR, keys)])
    ds.samples = s = None   # the caller's dataset is rebuilt: its full frame is not kept beside the new one
    by_dev: dict[str, list] = {}
    for dev, hour in sorted(keys):
        by_dev.setdefault(dev, []).append(hour)
    devs = sorted(by_dev)
    parts = [kept]
    for i in range(0, len(devs), REFINE_DEVICES):
        chunk = pd.DataFrame([(d, h) for d in devs[i:i + REFINE_DEVICES] for h in by_dev[d]],
                             columns=["device", "hour"])
        parts.append(_columns(_raw_part(_raw(src, chunk, ds.allocs, ds.devices))))
    src.done_reading()   # the last read: an export held in memory lets its raw columns go before the assembly
    return replace(ds, samples=_assemble(parts, ds.allocs, ds.devices))


def _in_keys(device: pd.Series, hour: pd.Series, keys) -> np.ndarray:  # noqa: ANN001 - a set of (device, hour)
    """Which (device, hour) pairs are among ``keys``, by hashing in pandas rather than a Python loop per row."""
    if not keys:
        return np.zeros(len(device), dtype=bool)
    want = pd.MultiIndex.from_tuples(list(keys))
    return pd.MultiIndex.from_arrays([device.to_numpy(object), hour.to_numpy(float)]).isin(want)


def _rate_fallback(src, devices: pd.DataFrame) -> None:  # noqa: ANN001
    """Devices without a rated clock get the method's fallback from their own raw clocks (one column read)."""
    missing = [d for d, r in devices["rated"].items() if r is None or r != r]
    if not missing:
        return
    s = src.device_samples(missing, ("device", "t", "sm_active", "tensor_active", "gpu_util", "sm_clock_mhz"))
    s = s.rename(columns={"sm_active": "sm", "tensor_active": "tensor", "sm_clock_mhz": "clk"})
    s["rated"] = np.nan
    fill_rated_clock(s, devices)


def _assign_hours(hrs: pd.DataFrame, allocs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per device-hour: the run its samples belong to (-1: none) as data.assign_runs decides per sample, and whether
    a run starts or ends among them (an edge hour: its samples belong to more than one)."""
    n = len(hrs)
    ai, edge = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=bool)
    if not n or not len(allocs):
        return ai, edge
    a = allocs.reset_index(drop=True)
    by_dev = a.groupby("device").indices
    t0, t1 = hrs["t_first"].to_numpy(float), hrs["t_last"].to_numpy(float)
    for dev, idx in hrs.groupby("device", sort=False).indices.items():
        rows = by_dev.get(dev)
        if rows is None:
            continue
        st = a.loc[rows, "start"].to_numpy(float)
        en = a.loc[rows, "end"].to_numpy(float)
        order = np.argsort(st)
        st, en, rows = st[order], en[order], rows[order]
        k = np.searchsorted(st, t0[idx], side="right") - 1
        ok = (k >= 0) & (t0[idx] < en[np.clip(k, 0, None)])
        ai[idx[ok]] = rows[k[ok]]
        bounds = np.sort(np.concatenate([st, en]))
        # any start or end in (first sample, last sample]: the assignment may change inside the hour
        lo = np.searchsorted(bounds, t0[idx], side="right")
        hi = np.searchsorted(bounds, t1[idx], side="right")
        edge[idx] = hi > lo
    return ai, edge


def _pieces(h: pd.DataFrame, ai: np.ndarray, rated: np.ndarray, runs: np.ndarray) -> pd.DataFrame:
    """Rows of summed GPU-hours per clean device-hour: one row (reason "other") with every bucket, and one per
    other throttle reason with throttled time. The first row spans the hour's samples where ``runs`` (no step
    between them long enough to hide a coverage gap)."""
    if not len(h):
        return pd.DataFrame(columns=list(PIECE_COLS))
    allocated = (ai >= 0).astype(float) / 3600.0
    busy = np.stack([h[f"busy_r{r}"].to_numpy(float) for r in range(5)])
    busyclk = np.stack([h[f"busyclk_r{r}"].to_numpy(float) for r in range(5)])
    noclk = np.stack([h[f"busynoclk_r{r}"].to_numpy(float) for r in range(5)])
    has_rated = ~np.isnan(rated) & (rated > 0)
    delivered_r = np.where(has_rated, busyclk / np.where(has_rated, rated, 1.0) + noclk, busy)
    thr = np.clip(busy - delivered_r, 0.0, None) * allocated
    t0 = h["t_first"].to_numpy(float)
    base = pd.DataFrame({"device": h["device"].to_numpy(), "t": t0,
                         "span_end": np.where(runs, h["t_last"].to_numpy(float), t0), "ai": ai,
                         "h": h["covered_s"].to_numpy(float) * allocated,
                         "h_del": delivered_r.sum(axis=0) * allocated, "h_thr": thr[OTHER],
                         "h_under": h["under_s"].to_numpy(float) * allocated,
                         "h_starved": h["starved_s"].to_numpy(float) * allocated,
                         "h_idle": h["idle_s"].to_numpy(float) * allocated,
                         "h_missing": h["missing_s"].to_numpy(float) * allocated, "rbucket": OTHER})
    extra = [pd.DataFrame({"device": base["device"], "t": t0, "span_end": t0, "ai": ai, "h_thr": thr[r],
                           "rbucket": r})[thr[r] > 0] for r in range(4)]
    return pd.concat([base, *extra], ignore_index=True)


def _raw(src, keys: pd.DataFrame, allocs: pd.DataFrame, devices: pd.DataFrame) -> pd.DataFrame:  # noqa: ANN001
    """The raw samples of these device-hours, bucketed by the full-resolution code (data.assign_runs, add_bucket_hours)."""
    s = src.hour_samples(keys.groupby("device")["hour"].agg(set).to_dict())
    s = assign_runs(sample_frame(s), allocs)
    s["rated"] = s["device"].map(devices["rated"])
    add_bucket_hours(s)
    return s


# --- findings from device-hours: screen, then the agents on the screened scopes' samples -----------------

def _run_hours(ds: Dataset, s: pd.DataFrame, runs: set) -> set:
    """(device, hour) of these runs' devices from their first to their last idle or starved hour, with the
    evidence timeline's reach each side, within the run: where the idle-held and starved agents look."""
    flagged = s[(s["h_idle"] > 0) | (s["h_starved"] > 0)]
    span = flagged.groupby(["cluster", "job_id", "run"], dropna=False)["t"].agg(["min", "max"])
    out = set()
    for r in ds.allocs.itertuples():
        key = (r.cluster, r.job_id, r.run)
        if key not in runs or key not in span.index:
            continue
        a = np.floor(span.at[key, "min"] / dh.HOUR) * dh.HOUR
        b = np.floor(span.at[key, "max"] / dh.HOUR) * dh.HOUR + dh.HOUR + ds.cadence
        side = _side(a, b) + dh.HOUR
        out |= _span_hours([r.device], max(r.start, a - side), min(r.end, b + side))
    return out


def _span_hours(devs, a: float, b: float) -> set:  # noqa: ANN001
    h0, h1 = int(a // dh.HOUR), int(np.ceil(b / dh.HOUR))
    return {(d, float(h * dh.HOUR)) for d in devs for h in range(h0, h1)}


def _side(a: float, b: float) -> float:
    """How far an evidence timeline looks before and after a window (agents.common.before_during_after)."""
    return min(max(b - a, dh.HOUR), DAY)


def detail_hours(ds: Dataset, hrs: pd.DataFrame) -> frozenset:
    """The device-hours whose raw samples the screened agents need, decided from the device-hour dataset: the
    hours of a run idle or starved past the agents' floors around its idle or starved time; every hour of a device with an XID event; a node's
    hours around its power-capped hours (the merge gap, a day of evidence each side); a node's hours around an
    unknown interval or a coverage gap (its evidence timeline)."""
    from .causes import IDLE_MIN_H, STARVED_MIN_H

    s = ds.samples[ds.samples["ai"] >= 0]
    per_run = s.groupby(["cluster", "job_id", "run"], dropna=False)[["h_idle", "h_starved"]].sum()
    runs = set(per_run.index[(per_run["h_idle"] >= IDLE_MIN_H) | (per_run["h_starved"] >= STARVED_MIN_H)])
    keys = _run_hours(ds, s, runs)
    node_devs = ds.devices.groupby("node").groups
    for dev, g in hrs.sort_values(["device", "hour"]).groupby("device"):
        prev = np.concatenate([[0.0], g["xid_last"].to_numpy(float)[:-1]])
        first = g["xid_first"].to_numpy(float)
        if (g["xid_events"] > 0).any() or ((first > 0) & (first != prev)).any():
            keys |= _span_hours([dev], ds.start, ds.end)
    capped = hrs[_cap_screen(hrs, ds.devices["node"])]
    nodes = capped["device"].map(ds.devices["node"])
    for node, g in capped.groupby(nodes):
        margin = DAY + 7 * dh.HOUR   # windows merge capped hours up to 6 h apart; _edges looks an hour further
        keys |= _span_hours(node_devs.get(node, []), g["hour"].min() - margin, g["hour"].max() + dh.HOUR + margin)
    spans = [(g["node"], g["start"], g["end"]) for g in ds.gaps if g["node"]]
    spans += [(r.node, r.start, r.end) for r in coverage_gaps(ds).itertuples()]
    for node, a, b in spans:
        keys |= _span_hours(node_devs.get(node, []), a - _side(a, b), b + _side(a, b))
    keys |= _hourly_rule_hours(ds, hrs)
    have = set(zip(hrs["device"], hrs["hour"]))
    return frozenset(keys & have)


def _cap_screen(hrs: pd.DataFrame, node_of: pd.Series) -> np.ndarray:
    """Device-hours where the power-cap rule may flag the device or its node: at least half of the loaded samples
    (3 or more) of the device-hour or its node-hour carry the power-cap reason — counted before the rule's
    further conditions (allocated, clock below rated), so a superset of its flags. A device-hour sealed before
    the counts existed (NULL) is screened in whenever it had power-capped busy time."""
    def flagged(keys: list) -> np.ndarray:
        g = hrs.groupby(keys, sort=False)
        n, loaded = g["pcap_n"].transform("sum"), g["pcap_loaded_n"].transform("sum")
        return ((n >= 0.5 * loaded) & (loaded >= 3)).to_numpy()

    node = hrs["device"].map(node_of).fillna(hrs["device"])
    unknown = (hrs["pcap_n"].isna() | hrs["pcap_loaded_n"].isna()).to_numpy() & (hrs["busy_r1"] > 0).to_numpy()
    return flagged([hrs["device"], hrs["hour"]]) | flagged([node, hrs["hour"]]) | unknown


def _hourly_rule_hours(ds: Dataset, hrs: pd.DataFrame) -> set:
    """The device-hours the rules decided on hourly statistics need raw samples for, to price and show what they
    found: a cooling window's rack or node, and a clock-drift or ECC finding's node, over the window with its
    evidence each side; a hw-slowdown device's and a sync-boost node's reason hours; every hour of a device with
    thermal throttling past hot-because-working's floor, alone or summed over its job's devices (the median residual
    of the throttled samples decides), and of a device with row-remap readings, a day each side."""
    from . import causes as attribution, drift

    keys: set = set()
    devs = ds.devices
    model = attribution.residual_model(ds)
    for level, name, a, b in attribution.cooling_windows(ds, model):
        # a device's evidence compares it with its siblings: the node's hours
        node = devs.at[name, "node"] if level == "device" else name
        scope = devs.index[devs["rack"] == name] if level == "rack" else devs.index[devs["node"] == node]
        keys |= _span_hours(scope, a - _side(a, b) - dh.HOUR, b + _side(a, b) + dh.HOUR)
    for dev, c in drift.clock_drift(ds).items():
        keys |= _span_hours(devs.index[devs["node"] == devs.at[dev, "node"]], c["start"] - _side(c["start"], c["end"])
                            - dh.HOUR, c["end"] + _side(c["start"], c["end"]) + dh.HOUR)
    for dev, e in drift.ecc_trend(ds).items():
        keys |= _span_hours(devs.index[devs["node"] == devs.at[dev, "node"]], e["start"] - _side(e["start"], ds.end)
                            - dh.HOUR, ds.end + dh.HOUR)
    s = ds.samples
    thermal = s[(s["rbucket"] == attribution.THERMAL) & (s["h_thr"] > 0)]
    per_dev = thermal.groupby("device")["h_thr"].sum()
    per_run = thermal[thermal["job_id"].notna()].groupby(list(attribution.RUN_KEY), dropna=False)
    job_devs = [d for _, g in per_run if g["h_thr"].sum() >= attribution.WORKING_MIN_H for d in g["device"].unique()]
    flagged = hrs[hrs["device"].isin([*per_dev.index[per_dev >= attribution.WORKING_MIN_H], *job_devs])
                  & (hrs["busy_r0"] > 0)]
    remapped = hrs[(hrs["remap_pending_max"] > 0) | (hrs["remap_failure_max"] > 0)]
    for idx, key in ((attribution.HW_SLOWDOWN, "device"), (attribution.SYNC_BOOST, "node")):
        rows = s[(s["rbucket"] == idx) & (s["h_thr"] > 0)]
        lost = rows.groupby(key)["h_thr"].sum()
        for name in lost.index[lost >= attribution.REASON_MIN_H]:
            g = rows[rows[key] == name]
            scope = [name] if key == "device" else devs.index[devs["node"] == name]
            keys |= _span_hours(scope, float(g["t"].min()) - dh.HOUR, float(g["t"].max()) + 2 * dh.HOUR)
    for dev, g in pd.concat([flagged, remapped]).groupby("device"):
        keys |= _span_hours([dev], g["hour"].min() - DAY - dh.HOUR, g["hour"].max() + DAY + 2 * dh.HOUR)
    return keys


def analyze(engine: Engine, through_seq: int | None = None, topology: dict | None = None):  # noqa: ANN201
    """Every agent over device-hours with the raw samples their findings need (:func:`detail_hours`): the
    :class:`~ledger.agents.Analysis` :func:`ledger.agents.analyze` gives from every sample, its figures from
    device-hours (tests/test_agents_hourly.py holds the two equal)."""
    from . import run_agents

    return run_agents(load_compact(engine, through_seq=through_seq, topology=topology, detail=True))


# --- partitions: the account per device partition, merged ----------------------------------------------------

DAILY_KEY = ("day", "cluster", "tenant", "partition", "qos")
DAILY_FIGURES = ("paid", "unknown", "delivered", "underutilized", "starved", "idle_held", "throttled")


def device_partition(ds: Dataset, devices) -> Dataset:  # noqa: ANN001
    """The dataset of these devices only (their rows and allocation rows): what one partition's worker holds."""
    from dataclasses import replace

    keep = set(devices)
    return replace(ds, samples=ds.samples[ds.samples["device"].isin(keep)],
                   allocs=ds.allocs[ds.allocs["device"].isin(keep)], devices=ds.devices[ds.devices.index.isin(keep)],
                   sample_count=None)   # the fleet's count is not the partition's (its account does not read it)


def merge_daily(parts: list[list[dict]]) -> list[dict]:
    """Daily account rows of several device partitions summed per (day, cluster, tenant, partition, QOS): every
    figure is a sum over devices, so the merge is an addition (rounded as accounting.daily rounds)."""
    acc: dict[tuple, dict] = {}
    for rows in parts:
        for r in rows:
            k = tuple(r[c] for c in DAILY_KEY)
            cur = acc.setdefault(k, {**{c: r[c] for c in DAILY_KEY}, **{f: 0.0 for f in DAILY_FIGURES}})
            for f in DAILY_FIGURES:
                cur[f] += r[f]
    return [{**v, **{f: round(v[f], 4) for f in DAILY_FIGURES}} for _, v in sorted(acc.items())]
