"""Hourly per-device aggregates of one telemetry segment, computed when the segment is sealed (docs/scale.md).

What the agents need from a device-hour, as sums that add across segments and hours (so a day, a rack or a
partition of the fleet is the sum of its hours): covered seconds, the method's activity buckets (working,
under-utilised, starved, idle, unmeasured), per clock-event reason the busy seconds and busy x clock
(MHz·s) from which delivered and throttled follow for any rated clock, loaded-clock sums, the sums of a
least-squares temperature-on-power fit, framebuffer and process residency, correctable-ECC extremes, XID
events, row-remap extremes and the power-cap rule's loaded and capped sample counts. A sample belongs wholly to the hour of its start, as the agents assign it.

The formulas are the method's (:mod:`ledger.method`): the activity signal is :class:`SampleArrays`' choice,
the reason index is :func:`reason_bucket`, the thresholds :data:`DEFAULT_THRESHOLDS`. The rated clock is not
known when a segment is sealed (it comes from the allocation's SKU), so the clock ratio is applied on read
(:func:`buckets`); ``clk_max`` says whether min(clock/rated, 1) clipped anything in the hour.

:func:`aggregate` (numpy) and :func:`aggregate_reference` (one sample at a time, plain Python) compute the same
rows; :func:`store_in` writes a segment's rows beside its block; :func:`merged` / :func:`merged_frame` add the
rows of all segments per device-hour; :mod:`ledger.telemetry.derived` keeps them in step with the samples
(backfill, and the verify check that recomputes them).
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, fields
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..method import THROTTLE_REASONS, SampleArrays, reason_bucket
from ..method.attribution import DEFAULT_THRESHOLDS

HOUR = 3600.0
TABLE = "device_hours"
LOADED_ACT = 0.3               # "under load", as the drift agent reads the clock
THERMAL, OTHER = THROTTLE_REASONS.index("thermal"), THROTTLE_REASONS.index("other")
NEEDED = ("device", "t", "dt", "clock_reasons", "sm_active", "tensor_active", "gpu_util", "sm_clock_mhz",
          "power_w", "gpu_temp_c", "ecc_sbe_aggregate", "xid", "fb_used_mib", "compute_procs", "row_remap_pending",
          "row_remap_failure", "ecc_sbe_volatile")
_R = range(len(THROTTLE_REASONS))


@dataclass(frozen=True, slots=True)
class DeviceHour:
    """One device's samples starting in one hour (of one segment, or merged over segments). Seconds unless
    named otherwise; NaN where no sample measured the field."""

    device: str
    hour: float                 # epoch seconds, a multiple of 3600
    n: int                      # samples
    t_first: float
    t_last: float               # the last sample's start
    t_end: float                # max(t + dt)
    gap_max: float              # the longest step between consecutive sample starts (NaN: one sample, or unknown)
    covered_s: float            # sum dt
    busy_s: float               # working: dt x activity
    under_s: float              # working: dt x (1 - activity)
    starved_s: float            # activity below the method's threshold, a process resident
    idle_s: float               # ... and none resident
    missing_s: float            # activity not measured
    act_s: float                # measured: dt x activity (all measured samples)
    present_s: float            # measured: dt
    resident_s: float
    running_s: float            # working or starved
    busy_r0: float              # busy_s split by reason (THROTTLE_REASONS order)
    busy_r1: float
    busy_r2: float
    busy_r3: float
    busy_r4: float
    busyclk_r0: float           # working, clock measured: dt x activity x MHz
    busyclk_r1: float
    busyclk_r2: float
    busyclk_r3: float
    busyclk_r4: float
    busynoclk_r0: float         # working, clock not measured (counts as full speed): dt x activity
    busynoclk_r1: float
    busynoclk_r2: float
    busynoclk_r3: float
    busynoclk_r4: float
    clk_max: float              # working samples' highest clock (is min(clock / rated, 1) clipped?)
    loaded_n: int               # running, activity >= 0.3, clock measured, no reason bit: the device itself
    loaded_clk: float           # sum of their clock (MHz)
    fit_n: int                  # running, power and temperature measured, no thermal reason: the fit's points
    fit_p: float
    fit_t: float
    fit_pp: float
    fit_pt: float
    fit_tt: float
    hot_n: int                  # running, power and temperature measured (thermal included)
    hot_p: float
    hot_t: float
    fb_n: int
    fb_sum: float
    fb_max: float
    procs_max: float
    ecc_min: float              # correctable ECC (aggregate counter)
    ecc_max: float
    xid_first: float            # the first sample's XID gauge (0 when none), for events across hour edges
    xid_last: float
    xid_events: int             # non-zero and different from the previous sample, the first sample excepted
    remap_pending_max: float    # row remaps pending a reset (the highest reading; NaN: never read)
    remap_failure_max: float    # row-remapping failure flag
    pcap_loaded_n: float        # running at activity >= 0.2 (the power-cap rule's loaded samples; a count)
    pcap_n: float               # ... of them with the power-cap reason
    eccv_min: float             # correctable ECC, volatile counter (DCGM field 310; what a source without the
    eccv_max: float             # aggregate counter has): the agents read it where ecc_min/ecc_max are NaN

    def throttle_split(self, rated_mhz: float | None) -> tuple[float, list[float]]:
        """(delivered seconds, throttled seconds per reason) at this rated clock: the method's
        busy x min(clock / rated, 1), exact while clk_max <= rated (:attr:`clipped` otherwise)."""
        busy = [getattr(self, f"busy_r{r}") for r in _R]
        if not rated_mhz:
            return sum(busy), [0.0] * len(busy)
        dl = [getattr(self, f"busyclk_r{r}") / rated_mhz + getattr(self, f"busynoclk_r{r}") for r in _R]
        return sum(dl), [max(b - d, 0.0) for b, d in zip(busy, dl)]

    def clipped(self, rated_mhz: float | None) -> bool:
        return bool(rated_mhz) and self.clk_max > rated_mhz


FIELDS = tuple(f.name for f in fields(DeviceHour))
SUMS = ("n", *(f for f in FIELDS[FIELDS.index("gap_max") + 1:] if not f.endswith(("_max", "_min", "_first", "_last"))))
REMAPS = ("remap_pending_max", "remap_failure_max")
# Columns added after device-hours were first sealed (migrations 0007, 0008): a row sealed before holds NULL there, which
# the agents read as "not known" (they read the hour's raw samples) and verify does not count as a mismatch.
LATER = (*REMAPS, "pcap_loaded_n", "pcap_n", "eccv_min", "eccv_max")   # 0007; 0008: the volatile ECC extremes
PCAP_ACT = 0.2                 # "loaded", as the power-cap rule reads it
POWER_CAP = THROTTLE_REASONS.index("power_cap")
INT_FIELDS = frozenset(f.name for f in fields(DeviceHour) if f.type == "int")
values = operator.attrgetter(*FIELDS)   # a DeviceHour's values in FIELDS order (dataclasses.astuple deep-copies)


def _group_reduce(x: np.ndarray, starts: np.ndarray, op: str) -> np.ndarray:
    if op == "sum":
        return np.add.reduceat(x, starts) if len(x) else np.zeros(0)
    if op == "max":
        v = np.fmax.reduceat(np.where(np.isnan(x), -np.inf, x), starts)
    else:
        v = np.fmin.reduceat(np.where(np.isnan(x), np.inf, x), starts)
    return np.where(np.isinf(v), np.nan, v)


def aggregate(cols: Mapping[str, Sequence], as_rows: bool = False) -> list[DeviceHour]:
    """The device-hours of one batch of samples: ``cols`` maps NEEDED column names to equal-length sequences
    (NaN or None = not measured). Pure; rows sorted by (device, hour). ``as_rows``: each as the database returns
    its stored row (its :func:`values` tuple, NaN as None), not made into a DeviceHour (what verify compares with
    the stored rows)."""
    # a value near the float limit (a damaged block verify reads back) sums to inf, as it would one by one
    with np.errstate(over="ignore", invalid="ignore"):
        return [h for _g, h in _aggregate(cols, None, as_rows)]


def aggregate_groups(cols: Mapping[str, Sequence], group: np.ndarray) -> list[tuple[int, DeviceHour]]:
    """:func:`aggregate` of many batches at once: ``group`` (non-negative ints, one per row) says which batch
    each row is of; the result is each batch's device-hours, tagged with its group, by (group, device, hour).
    Every value is the one :func:`aggregate` of that batch's rows alone gives (each is computed from its own
    group's rows only; tests/test_device_hours.py holds them equal): what a shipment of many small segments
    uses, one numpy pass instead of one per 60-sample segment."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _aggregate(cols, np.asarray(group, dtype=np.int64))


def _aggregate(cols: Mapping[str, Sequence], group: np.ndarray | None,
               as_rows: bool = False) -> list[tuple[int, DeviceHour]]:
    dev = np.asarray(cols["device"], dtype=object)
    if not len(dev):
        return []

    def f(name: str) -> np.ndarray:
        return np.asarray(cols[name], dtype=np.float64)   # None (not measured) becomes NaN

    t, dt = f("t"), f("dt")
    names, code = _device_codes(dev)
    hour = np.floor(t / HOUR) * HOUR
    order = np.lexsort((t, hour, code) if group is None else (t, hour, code, group))
    code, hour, t, dt = code[order], hour[order], t[order], dt[order]
    grp = np.zeros(len(t), dtype=np.int64) if group is None else group[order]
    sa = SampleArrays.from_columns(t, dt, f("sm_active")[order], f("tensor_active")[order], f("gpu_util")[order],
                                   f("sm_clock_mhz")[order], f("clock_reasons")[order], f("compute_procs")[order],
                                   f("fb_used_mib")[order])
    th = DEFAULT_THRESHOLDS
    act = sa.activity
    present = ~np.isnan(act)
    a = np.clip(np.nan_to_num(act), 0.0, 1.0)
    resident = (sa.procs > 0) | (sa.fb_used > th.resident_fb_mib)
    low = present & (a < th.active_min)
    working = present & ~low
    running = working | (low & resident)
    clk = sa.sm_clock
    known = ~np.isnan(clk)
    rb = reason_bucket(sa.reasons)
    power, temp = f("power_w")[order], f("gpu_temp_c")[order]
    tp = running & ~np.isnan(power) & ~np.isnan(temp)
    fit = tp & (rb != THERMAL)
    loaded = running & (np.nan_to_num(act) >= LOADED_ACT) & known & (rb == OTHER)
    pcap_loaded = running & (np.nan_to_num(act) >= PCAP_ACT)
    busy = np.where(working, dt * a, 0.0)
    busyclk = np.where(known, busy * np.nan_to_num(clk), 0.0)
    busynoclk = np.where(known, 0.0, busy)
    fb = sa.fb_used
    xid = np.nan_to_num(f("xid")[order])
    brk = np.ones(len(t), dtype=bool)
    brk[1:] = (code[1:] != code[:-1]) | (hour[1:] != hour[:-1]) | (grp[1:] != grp[:-1])
    starts = np.flatnonzero(brk)
    ends = np.append(starts[1:], len(t)) - 1
    prev = np.concatenate([[0.0], xid[:-1]])
    event = (xid > 0) & (xid != prev) & ~brk

    def s(x: np.ndarray) -> np.ndarray:
        return _group_reduce(x.astype(np.float64), starts, "sum")

    def masked(mask: np.ndarray, x: np.ndarray) -> np.ndarray:
        return s(np.where(mask, x, 0.0))

    tpn, fitn = np.nan_to_num(power), np.nan_to_num(temp)
    out = {
        "n": s(np.ones(len(t))), "t_first": t[starts], "t_last": t[ends], "t_end": _group_reduce(t + dt, starts, "max"),
        "gap_max": _group_reduce(np.where(brk, np.nan, t - np.concatenate([[np.nan], t[:-1]])), starts, "max"),
        "covered_s": s(dt), "busy_s": s(busy), "under_s": masked(working, dt * (1.0 - a)),
        "starved_s": masked(low & resident, dt), "idle_s": masked(low & ~resident, dt),
        "missing_s": masked(~present, dt), "act_s": masked(present, dt * a), "present_s": masked(present, dt),
        "resident_s": masked(resident, dt), "running_s": masked(running, dt),
        **{f"busy_r{r}": masked(rb == r, busy) for r in _R},
        **{f"busyclk_r{r}": masked(rb == r, busyclk) for r in _R},
        **{f"busynoclk_r{r}": masked(rb == r, busynoclk) for r in _R},
        "clk_max": _group_reduce(np.where(working & known, clk, np.nan), starts, "max"),
        "loaded_n": s(loaded), "loaded_clk": masked(loaded, clk),
        "fit_n": s(fit), "fit_p": masked(fit, tpn), "fit_t": masked(fit, fitn), "fit_pp": masked(fit, tpn * tpn),
        "fit_pt": masked(fit, tpn * fitn), "fit_tt": masked(fit, fitn * fitn),
        "hot_n": s(tp), "hot_p": masked(tp, tpn), "hot_t": masked(tp, fitn),
        "fb_n": s(~np.isnan(fb)), "fb_sum": masked(~np.isnan(fb), fb),
        "fb_max": _group_reduce(fb, starts, "max"), "procs_max": _group_reduce(sa.procs, starts, "max"),
        "ecc_min": _group_reduce(f("ecc_sbe_aggregate")[order], starts, "min"),
        "ecc_max": _group_reduce(f("ecc_sbe_aggregate")[order], starts, "max"),
        "xid_first": xid[starts], "xid_last": xid[ends], "xid_events": s(event),
        "remap_pending_max": _group_reduce(f("row_remap_pending")[order], starts, "max"),
        "remap_failure_max": _group_reduce(f("row_remap_failure")[order], starts, "max"),
        "pcap_loaded_n": s(pcap_loaded), "pcap_n": s(pcap_loaded & (rb == POWER_CAP)),
        "eccv_min": _group_reduce(f("ecc_sbe_volatile")[order], starts, "min"),
        "eccv_max": _group_reduce(f("ecc_sbe_volatile")[order], starts, "max"),
    }
    cols_out = [names[code[starts]].tolist(), hour[starts].tolist()]
    for name in FIELDS[2:]:
        v = out[name]
        if name in INT_FIELDS:
            cols_out.append([int(x) for x in v])
        elif as_rows and np.isnan(v).any():   # NULL where not measured, as the stored row holds it
            o = v.astype(object)
            o[np.isnan(v)] = None
            cols_out.append(o.tolist())
        else:
            cols_out.append(v.tolist())
    rows = zip(*cols_out)
    return list(zip(grp[starts].tolist(), rows if as_rows else (DeviceHour(*r) for r in rows)))


def _device_codes(dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(dev.astype(str), return_inverse=True)`` by a dict: a shipment's million device labels are
    a few hundred distinct ones, and sorting the million strings cost more than the whole aggregation."""
    starts = np.flatnonzero(np.concatenate([[True], dev[1:] != dev[:-1]])) if len(dev) else np.zeros(0, np.intp)
    if len(starts) * 8 <= len(dev):
        # a segment's rows come by device: its few runs of one label each, without a hash of every row (nor
        # pandas, ~0.25 s to import in a fresh verify); the same codes as below
        names, rank = _ranked(dev[starts].tolist())
        return names, np.repeat(rank, np.diff(np.append(starts, len(dev))))
    import pandas as pd   # its hash table (pyarrow, which sealed the rows, has imported it already)

    first, seen = pd.factorize(dev)
    names, rank = _ranked(seen.tolist())
    return names, rank[first]


def _ranked(distinct: list) -> tuple[np.ndarray, np.ndarray]:
    """The sorted names of these labels (as text) and each label's place among them."""
    labels = [u if type(u) is str else str(u) for u in distinct]
    names = sorted(set(labels))
    pos = {n: i for i, n in enumerate(names)}
    return np.array(names, dtype=object), np.array([pos[label] for label in labels], dtype=np.int64)


def aggregate_rows(rows: Sequence[tuple]) -> list[DeviceHour]:
    """:func:`aggregate` of rows in normalised SAMPLE_COLUMNS form (what a segment seals)."""
    from .model import SAMPLE_COLUMNS

    if not rows:
        return []
    idx = [SAMPLE_COLUMNS.index(c) for c in NEEDED]
    cols = list(zip(*rows))
    return aggregate({c: cols[i] for c, i in zip(NEEDED, idx)})


def aggregate_columns(cols: Mapping[str, Sequence]) -> list[DeviceHour]:
    """:func:`aggregate` of sample columns in which a field left out is not measured (a segment's columns)."""
    n = len(cols["t"])
    return aggregate({c: cols[c] if c in cols else np.full(n, np.nan) for c in NEEDED})


def aggregate_table(table, as_rows: bool = False) -> list[DeviceHour]:  # noqa: ANN001 - a pyarrow Table
    """:func:`aggregate` of a pyarrow table with the NEEDED columns, as the sample reader returns it (no row tuples
    in between); ``as_rows`` as there."""
    from .blocks import float_values

    if not table.num_rows:
        return []
    cols = {c: float_values(table.column(c)) for c in NEEDED if c != "device"}
    cols["device"] = np.asarray(table.column("device").to_pylist(), dtype=object)
    return aggregate(cols, as_rows)


def aggregate_reference(samples: Iterable) -> list[DeviceHour]:  # noqa: ANN001 - ledger Sample objects
    """:func:`aggregate`, one sample at a time in plain Python, as docs/scale.md states it (the test's oracle)."""
    th = DEFAULT_THRESHOLDS
    nan = float("nan")

    def num(v: float | None) -> float:
        return nan if v is None else float(v)

    groups: dict[tuple[str, float], list] = {}
    for x in sorted(samples, key=lambda x: (x.device, math.floor(x.t / HOUR), x.t)):
        groups.setdefault((x.device, math.floor(x.t / HOUR) * HOUR), []).append(x)
    out = []
    for (device, hour), ss in sorted(groups.items()):
        acc = {k: 0.0 for k in SUMS}
        clk_max = fb_max = procs_max = ecc_min = ecc_max = eccv_min = eccv_max = pending = failure = nan
        prev = None
        for x in ss:
            act = num(x.sm_active)
            if math.isnan(act):
                act = num(x.tensor_active)
            if math.isnan(act):
                act = num(x.gpu_util)
            present = not math.isnan(act)
            a = min(max(act, 0.0), 1.0) if present else 0.0
            procs, fb, clk = num(x.compute_procs), num(x.fb_used_mib), num(x.sm_clock_mhz)
            resident = procs > 0 or fb > th.resident_fb_mib
            low = present and a < th.active_min
            working = present and not low
            running = working or (low and resident)
            r = int(reason_bucket(np.array([-1 if x.clock_reasons is None else x.clock_reasons]))[0])
            dt = x.dt
            acc["n"] += 1
            acc["covered_s"] += dt
            if working:
                busy = dt * a
                acc["busy_s"] += busy
                acc["under_s"] += dt * (1 - a)
                acc[f"busy_r{r}"] += busy
                if math.isnan(clk):
                    acc[f"busynoclk_r{r}"] += busy
                else:
                    acc[f"busyclk_r{r}"] += busy * clk
                    clk_max = clk if math.isnan(clk_max) else max(clk_max, clk)
            acc["starved_s"] += dt if low and resident else 0.0
            acc["idle_s"] += dt if low and not resident else 0.0
            acc["missing_s"] += 0.0 if present else dt
            acc["act_s"] += dt * a if present else 0.0
            acc["present_s"] += dt if present else 0.0
            acc["resident_s"] += dt if resident else 0.0
            acc["running_s"] += dt if running else 0.0
            if running and act >= PCAP_ACT:
                acc["pcap_loaded_n"] += 1
                acc["pcap_n"] += r == POWER_CAP
            if running and act >= LOADED_ACT and not math.isnan(clk) and r == OTHER:
                acc["loaded_n"] += 1
                acc["loaded_clk"] += clk
            p, tc = num(x.power_w), num(x.gpu_temp_c)
            if running and not math.isnan(p) and not math.isnan(tc):
                acc["hot_n"] += 1
                acc["hot_p"] += p
                acc["hot_t"] += tc
                if r != THERMAL:
                    for k, v in (("fit_n", 1), ("fit_p", p), ("fit_t", tc), ("fit_pp", p * p), ("fit_pt", p * tc),
                                 ("fit_tt", tc * tc)):
                        acc[k] += v
            if not math.isnan(fb):
                acc["fb_n"] += 1
                acc["fb_sum"] += fb
                fb_max = fb if math.isnan(fb_max) else max(fb_max, fb)
            if not math.isnan(procs):
                procs_max = procs if math.isnan(procs_max) else max(procs_max, procs)
            e = num(x.ecc_sbe_aggregate)
            if not math.isnan(e):
                ecc_min = e if math.isnan(ecc_min) else min(ecc_min, e)
                ecc_max = e if math.isnan(ecc_max) else max(ecc_max, e)
            ev = num(x.ecc_sbe_volatile)
            if not math.isnan(ev):
                eccv_min = ev if math.isnan(eccv_min) else min(eccv_min, ev)
                eccv_max = ev if math.isnan(eccv_max) else max(eccv_max, ev)
            pending = _nanext(max, [pending, num(x.row_remap_pending)])
            failure = _nanext(max, [failure, num(x.row_remap_failure)])
            xv = 0.0 if x.xid is None else float(x.xid)
            if prev is not None and xv > 0 and xv != prev:
                acc["xid_events"] += 1
            prev = xv
        first_x = 0.0 if ss[0].xid is None else float(ss[0].xid)
        steps = [b.t - a.t for a, b in zip(ss, ss[1:])]
        vals = dict(acc, gap_max=max(steps) if steps else nan, t_first=ss[0].t, t_last=ss[-1].t,
                    t_end=max(x.t + x.dt for x in ss), clk_max=clk_max, fb_max=fb_max,
                    procs_max=procs_max, ecc_min=ecc_min, ecc_max=ecc_max, xid_first=first_x, xid_last=prev,
                    remap_pending_max=pending, remap_failure_max=failure, eccv_min=eccv_min, eccv_max=eccv_max)
        out.append(DeviceHour(device, float(hour), *[int(vals[k]) if k in INT_FIELDS else vals[k]
                                                     for k in FIELDS[2:]]))
    return out


def merge(parts: Sequence[DeviceHour]) -> DeviceHour:
    """One device-hour from its pieces in several segments (same device and hour): sums add, extremes take
    the extreme, firsts and lasts come from the earliest and latest piece, and an XID that changes between
    two pieces counts as an event, as it would in one."""
    if len(parts) == 1:
        return parts[0]
    ps = sorted(parts, key=lambda p: p.t_first)
    v = {k: sum(getattr(p, k) for p in ps) for k in SUMS}
    for k in ("clk_max", "fb_max", "procs_max", "ecc_max", "eccv_max", *REMAPS):
        v[k] = _nanext(max, [getattr(p, k) for p in ps])
    v["ecc_min"] = _nanext(min, [p.ecc_min for p in ps])
    v["eccv_min"] = _nanext(min, [p.eccv_min for p in ps])
    v["xid_events"] += sum(1 for a, b in zip(ps, ps[1:]) if b.xid_first > 0 and b.xid_first != a.xid_last)
    # pieces that interleave in time leave the longest step unknown (NaN): a reader needing it reads the samples
    apart = all(b.t_first >= a.t_last for a, b in zip(ps, ps[1:]))
    gap = _nanext(max, [p.gap_max for p in ps] + [b.t_first - a.t_last for a, b in zip(ps, ps[1:])])
    v.update(t_first=ps[0].t_first, t_last=max(p.t_last for p in ps), t_end=max(p.t_end for p in ps),
             gap_max=gap if apart else float("nan"), xid_first=ps[0].xid_first,
             xid_last=max(ps, key=lambda p: p.t_end).xid_last)
    return DeviceHour(ps[0].device, ps[0].hour, *[v[k] for k in FIELDS[2:]])


def _nanext(fn, xs: list[float]) -> float:  # noqa: ANN001
    vals = [x for x in xs if x == x]
    return fn(vals) if vals else float("nan")


# --- storage ----------------------------------------------------------------------------------------------------

_INSERT = None


def device_hours_insert_sql():  # noqa: ANN202
    from sqlalchemy import text

    global _INSERT
    if _INSERT is None:
        names = ("segment_id", *FIELDS)
        _INSERT = text(f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})")
    return _INSERT


def device_hours_db_value(v: float | int | str):  # noqa: ANN202
    return None if isinstance(v, float) and v != v else v


def store_in(conn, segment_id: str, rows: Sequence[tuple],  # noqa: ANN001 - a Connection
             columns: Mapping[str, Sequence] | None = None) -> int:
    """Write the device-hours of a segment's rows (normalised SAMPLE_COLUMNS form) beside its block; the caller
    stores each segment once (``telemetry.sealed.write_segment_rows_in``). Returns the rows written.
    ``columns``: the same rows as columns (``write_segment_rows_in`` says how), aggregated without the tuples."""
    hours = aggregate_rows(rows) if columns is None else aggregate_columns(columns)
    return insert_in(conn, [(segment_id, h) for h in hours])


def segments_hours(segment_ids: Sequence[str], cols) -> list[tuple[str, DeviceHour]]:  # noqa: ANN001
    """The device-hours of many segments in one aggregation, each tagged with its segment: ``cols`` holds
    their rows (:func:`ledger.telemetry.blocks.columns_from`, one span per segment id). The same rows, in the
    same order, as :func:`aggregate_rows` of each segment's rows (tests/test_ship_segments.py). Pure."""
    from .blocks import float_values
    from .model import SAMPLE_COLUMNS

    if not segment_ids:
        return []
    data = {"device": np.asarray(cols.devices[1:], dtype=object)}   # the first row is no segment's
    for c in NEEDED[1:]:
        data[c] = float_values(cols.arrays[SAMPLE_COLUMNS.index(c)].slice(1))
    group = np.repeat(np.arange(len(cols.spans)), [n for _lo, n in cols.spans])
    return [(segment_ids[g], h) for g, h in aggregate_groups(data, group)]


def insert_in(conn, hours: Sequence[tuple[str, DeviceHour]]) -> int:  # noqa: ANN001 - a Connection
    """Write (segment id, device-hour) rows: one segment's (:func:`store_in`) or a batch's at once."""
    if not hours:
        return 0
    # positional parameters straight to the driver: binding 60 named values per row through SQLAlchemy cost
    # more than computing the rows
    mark = {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(conn.dialect.paramstyle)
    if mark is None:
        conn.execute(device_hours_insert_sql(), [{"segment_id": sid, **dict(zip(FIELDS, map(device_hours_db_value, values(h))))}
                                     for sid, h in hours])
        return len(hours)
    names = ("segment_id", *FIELDS)
    conn.exec_driver_sql(f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))})",
                         [(sid, *map(device_hours_db_value, values(h))) for sid, h in hours])
    return len(hours)


_AS_STORED = tuple(int if k in INT_FIELDS else float for k in FIELDS[2:])


def from_db(row: Sequence) -> DeviceHour:
    """A stored row (device, hour, then the other FIELDS) as a device-hour: NULL is NaN."""
    nan = float("nan")   # NULL: NaN (an integer field's NULL raises, as int(nan) does)
    return DeviceHour(str(nan if row[0] is None else row[0]), float(nan if row[1] is None else row[1]),
                      *[as_type(nan if v is None else v) for as_type, v in zip(_AS_STORED, row[2:])])


def stored(conn, segment_ids: Sequence[str] | None = None, devices: Sequence[str] | None = None,  # noqa: ANN001
           start: float | None = None, end: float | None = None) -> dict[str, list[DeviceHour]]:
    """Stored device-hours per segment id, optionally only these segments / devices / hours in [start, end)."""
    return {sid: [from_db(r) for r in rows]
            for sid, rows in stored_rows(conn, segment_ids, devices, start, end).items()}


def stored_rows(conn, segment_ids: Sequence[str] | None = None, devices: Sequence[str] | None = None,  # noqa: ANN001
                start: float | None = None, end: float | None = None) -> dict[str, list[tuple]]:
    """:func:`stored`'s rows as the database returns them (device, hour, then the other FIELDS; NULL as None),
    not yet made into device-hours (:func:`from_db`)."""
    from ..chain.lite import text, tuple_rows

    where, p = [], {}
    for col, vals in (("segment_id", segment_ids), ("device", devices)):
        if vals is not None:  # an empty list selects nothing
            names = [f"{col}{i}" for i in range(len(vals))]
            where.append(f"{col} IN ({', '.join(':' + n for n in names)})" if names else "0 = 1")
            p.update(zip(names, vals))
    if start is not None:
        where.append("hour >= :start")
        p["start"] = start
    if end is not None:
        where.append("hour < :end")
        p["end"] = end
    sql = f"SELECT segment_id, {', '.join(FIELDS)} FROM {TABLE}" + (" WHERE " + " AND ".join(where) if where else "")
    rows = tuple_rows(conn.execute(text(sql + " ORDER BY segment_id, device, hour"), p))
    return {sid: [tuple(r[1:]) for r in group] for sid, group in itertools.groupby(rows, operator.itemgetter(0))}


def merged(conn, devices: Sequence[str] | None = None, start: float | None = None,  # noqa: ANN001
           end: float | None = None) -> list[DeviceHour]:
    """The fleet's device-hours, each merged over the segments that hold a piece of it, by (device, hour)."""
    pieces: dict[tuple[str, float], list[DeviceHour]] = {}
    for rows in stored(conn, devices=devices, start=start, end=end).values():
        for h in rows:
            pieces.setdefault((h.device, h.hour), []).append(h)
    return [merge(pieces[k]) for k in sorted(pieces)]


def merged_frame(conn) -> "pd.DataFrame":  # noqa: ANN001, F821
    """:func:`merged` as one pandas frame (columns FIELDS, NaN for unmeasured), merged with vectorised group
    operations: what the agents read (a device-hour usually has a piece in several segments)."""
    import pandas as pd
    from sqlalchemy import text

    cur = conn.execute(text(f"SELECT {', '.join(FIELDS)} FROM {TABLE} ORDER BY device, hour, t_first"))
    # numpy columns a chunk of rows at a time: a row's 60-odd values as Python objects cost ≈ 4 KB, the frame's
    # ≈ 0.5 KB, and a fleet's week is 10^5-10^6 of them
    parts = []
    while chunk := cur.fetchmany(4096):
        cols = list(zip(*chunk))
        part = {"device": np.asarray(cols[0], dtype=object)}
        for c, v in zip(FIELDS[1:], cols[1:]):
            part[c] = np.array(v, dtype=np.float64)   # NULL (None) -> NaN
        parts.append(pd.DataFrame(part))
    f = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in FIELDS})
    return merge_frame(f)


def pieces_frame(hours: Sequence[DeviceHour]) -> "pd.DataFrame":  # noqa: F821
    """Device-hour pieces as the frame :func:`merge_frame` takes (what :func:`merged_frame` reads back)."""
    import pandas as pd

    cols = list(zip(*map(values, hours))) if hours else [[] for _ in FIELDS]
    part = {"device": np.asarray(cols[0], dtype=object)}
    for c, v in zip(FIELDS[1:], cols[1:]):
        part[c] = np.array(v, dtype=np.float64)
    return pd.DataFrame(part)


def merge_frame(f: "pd.DataFrame") -> "pd.DataFrame":  # noqa: F821
    """Pieces (columns FIELDS, ordered by device, hour, t_first) merged per device-hour, vectorised: the
    rows :func:`merge` gives, as one frame."""
    for c in FIELDS[1:]:
        f[c] = f[c].astype(float)
    if not len(f):
        return f
    keys = ["device", "hour"]
    g = f.groupby(keys, sort=False)
    if g.ngroups == len(f):
        out = f
    else:
        same = (f["device"].to_numpy() == f["device"].shift().to_numpy()) & (f["hour"] == f["hour"].shift()).to_numpy()
        prev_last = f["xid_last"].shift().to_numpy()
        first = f["xid_first"].to_numpy()
        edge_event = same & (first > 0) & (first != prev_last)
        step = np.where(same, f["t_first"].to_numpy() - f["t_last"].shift().to_numpy(), np.nan)
        f = f.assign(_edge=edge_event.astype(float), _step=step,
                     _overlap=(same & (step < 0)).astype(float))
        agg = {c: "sum" for c in SUMS}
        agg.update({c: "max" for c in ("clk_max", "fb_max", "procs_max", "ecc_max", "eccv_max", "t_last", "t_end",
                                       *REMAPS)})
        agg.update({"ecc_min": "min", "eccv_min": "min", "t_first": "min", "xid_first": "first", "gap_max": "max",
                    "_edge": "sum",
                    "_step": "max", "_overlap": "max"})
        g = f.groupby(keys, sort=False)
        out = g.agg(agg)
        # a piece sealed before a LATER column existed leaves the hour's sum unknown, as merge() does
        later = [c for c in LATER if c in SUMS]
        unknown = f[later].isna().groupby([f["device"], f["hour"]], sort=False).any()
        for c in later:
            out[c] = out[c].where(~unknown[c])
        out["xid_last"] = f.loc[g["t_end"].idxmax(), "xid_last"].to_numpy()
        out["xid_events"] = out["xid_events"] + out["_edge"]
        # pieces that interleave in time leave the longest step unknown (as merge() says)
        out["gap_max"] = np.where(out["_overlap"] > 0, np.nan, np.fmax(out["gap_max"], out["_step"]))
        out = out.reset_index()[list(FIELDS)]
    for c in INT_FIELDS:
        out[c] = out[c].astype(np.int64)
    return out.reset_index(drop=True)


def segments_of(conn, keys: set) -> list[str]:  # noqa: ANN001
    """The segments holding a piece of any of these (device, hour) keys."""
    from sqlalchemy import text

    devices = sorted({d for d, _ in keys})
    out = set()
    for i in range(0, len(devices), 500):
        chunk = devices[i:i + 500]
        marks = ",".join(f":d{j}" for j in range(len(chunk)))
        for sid, dev, hour in conn.execute(text(f"SELECT segment_id, device, hour FROM {TABLE} WHERE device IN "
                                                f"({marks})"), {f"d{j}": d for j, d in enumerate(chunk)}):
            if (dev, float(hour)) in keys:
                out.add(sid)
    return sorted(out)


def _same(a: float | int | str, b: float | int | str) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a != a or b != b:
            return a != a and b != b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


_KEY = operator.itemgetter(0, 1)   # (device, hour) of a device-hour's values in FIELDS order
_INTS = operator.itemgetter(*(i for i, f in enumerate(FIELDS) if f in INT_FIELDS))
_FLOATS = operator.itemgetter(*(i for i, f in enumerate(FIELDS) if i >= 2 and f not in INT_FIELDS))
_LATER_AT = np.array([f in LATER for i, f in enumerate(FIELDS) if i >= 2 and f not in INT_FIELDS])
_NONE = type(None)


def exactly_equal(want: Sequence[DeviceHour], have: Sequence[Sequence]) -> bool:
    """Whether ``have`` — device-hours, or stored rows as the database returns them (device, hour, then the
    other FIELDS; NULL as None) — holds exactly ``want``'s device-hours: the same keys once each, every field
    equal (NaN or NULL where NaN; a :data:`LATER` field may be NULL where stored), decided in a few numpy passes.
    Then :func:`first_mismatch_reference` finds nothing (exact equality is within its tolerance, and it skips
    the same NaNs). False says only "compare them field by field" (a difference, a repeated key, a value that
    is not a number of its field's kind)."""
    if len(want) != len(have):
        return False
    w = sorted((values(h) if isinstance(h, DeviceHour) else tuple(h) for h in want), key=_KEY)
    g = sorted((values(h) if isinstance(h, DeviceHour) else tuple(h) for h in have), key=_KEY)
    if list(map(_KEY, w)) != list(map(_KEY, g)):
        return False
    if not w:
        return True
    ints, floats = list(map(_INTS, g)), list(map(_FLOATS, g))
    if set(map(type, itertools.chain.from_iterable(ints))) - {int} \
            or set(map(type, itertools.chain.from_iterable(floats))) - {int, float, _NONE}:
        return False   # what the reference makes of it (int(), float() of text...) is the reference's to say
    try:
        if not np.array_equal(np.array(list(map(_INTS, w)), dtype=np.int64), np.array(ints, dtype=np.int64)):
            return False
        a, b = np.array(list(map(_FLOATS, w)), dtype=np.float64), np.array(floats, dtype=np.float64)  # None: NaN
    except (OverflowError, TypeError, ValueError):
        return False
    a_nan, b_nan = np.isnan(a), np.isnan(b)
    return bool(np.all((a == b) | (a_nan & b_nan) | (b_nan & _LATER_AT)))


def first_mismatch(want: Sequence[DeviceHour], have: Sequence[DeviceHour]) -> str | None:
    """What first differs between recomputed (``want``) and stored (``have``) device-hours, or None: where
    every field is exactly equal (:func:`exactly_equal`, verify's common case) without comparing them one by
    one, else as :func:`first_mismatch_reference` finds it."""
    return None if exactly_equal(want, have) else first_mismatch_reference(want, have)


def stored_mismatch(want: Sequence[DeviceHour | tuple], rows: Sequence[Sequence]) -> str | None:
    """:func:`first_mismatch` of ``want`` (device-hours, their :func:`values` tuples, or rows as the database
    returns them: :func:`aggregate`'s ``as_rows``) and a segment's stored rows (:func:`stored_rows`), each made
    into device-hours (:func:`stored`'s way) only where they are not exactly ``want``'s. Verify's common case,
    ``want`` as rows the same as the stored rows, value for value in the same order, is one list comparison (an
    int equals an int, a float a float, NULL NULL: every field equal, so no field differs)."""
    if want == rows or exactly_equal(want, rows):
        return None
    return first_mismatch_reference([h if isinstance(h, DeviceHour) else from_db(h) for h in want],
                                    [from_db(r) for r in rows])


def first_mismatch_reference(want: Sequence[DeviceHour], have: Sequence[DeviceHour]) -> str | None:
    """What first differs between recomputed (``want``) and stored (``have``) device-hours, or None: field by
    field, within a relative and absolute tolerance of 1e-9, NaN equal to NaN."""
    w = {(h.device, h.hour): h for h in want}
    g = {(h.device, h.hour): h for h in have}
    for key in sorted(set(w) | set(g)):
        if key not in g:
            return f"device-hour ({key[0]}, {key[1]:.0f}) is missing from {TABLE}"
        if key not in w:
            return f"{TABLE} holds device-hour ({key[0]}, {key[1]:.0f}) that the samples do not"
        for name, x, y in zip(FIELDS, values(w[key]), values(g[key])):
            if name in LATER and y != y:
                continue   # sealed before the column existed (see LATER)
            if not _same(x, y):
                return f"{TABLE} ({key[0]}, {key[1]:.0f}) field {name}: stored {y!r}, the samples give {x!r}"
    return None
