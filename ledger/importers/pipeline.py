"""Collected telemetry -> ledger: per-device timelines, sealed sample segments, unknown intervals, Path B runs.

Everything is validated while parsing; :func:`write` then builds one device at a time (so the samples of a
large export are never all in memory) and appends inside ONE transaction: a failure leaves nothing behind.
The output is a pure function of the collected data and the options: the same export imported from files
or live from Prometheus gives the same entries, in the same order, with the same segment digests.

Segments: one per device per ``segment_seconds`` window (aligned to the epoch, 6 h by default), so
segment identity does not depend on how an export was split into files or HTTP calls.

Path B runs (docs/telemetry.md): with ``synthetic_runs``, every (device, context) seen in labels becomes a
run: Slurm ``hpc_job`` -> job_id = the job, Kubernetes -> job_id = "namespace/pod", tenant/account =
namespace; data with no context labels at all gives one run per node (job_id "node:<node>"). All in
cluster ``pathb`` unless another is given; ``run`` = 0; payloads say ``"synthetic": true``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterator

from ..chain.db import write_tx
from ..chain.entries import Entry, Kind, make_entry
from ..chain.store import append_in
from ..telemetry.sealed import sample_row_values, segment_entry_rows, write_segment_rows_in
from ..telemetry.timeline import TOLERANCE_FACTOR, Timeline, build_timeline_arrays
from .common import Collected, Context, restart_holes

if TYPE_CHECKING:   # the engine is the caller's: an export analysed without a ledger never loads SQLAlchemy
    from sqlalchemy.engine import Engine

SEGMENT_SECONDS = 6 * 3600.0


@dataclass(frozen=True)
class ImportOptions:
    cluster: str = "pathb"
    cadence: float | None = None
    span: tuple[float | None, float | None] | None = None
    synthetic_runs: bool = True
    gap_cause: str = "scrape_missing"
    edge_cause: str = "export_truncated"
    tolerance_factor: float = TOLERANCE_FACTOR
    segment_seconds: float = SEGMENT_SECONDS
    # the site's mapping of an identity label value (a namespace, a Slurm account) to the tenant it bills
    tenants: tuple[tuple[str, str], ...] = ()


@dataclass
class ImportResult:
    source: str
    devices: int = 0
    samples: int = 0
    segments: int = 0
    unknown_intervals: int = 0
    unknown_seconds: float = 0.0
    counter_resets: int = 0
    runs: int = 0
    appended: int = 0
    duplicates: int = 0
    missing: dict = field(default_factory=dict)
    per_device: dict = field(default_factory=dict)
    clock_skew: dict = field(default_factory=dict)   # job id -> {node: seconds ahead of the run's first node}
    input_report: dict = field(default_factory=dict)  # Collected.report(): mapped/unmapped fields, skipped lines

    def to_json(self) -> dict:
        out = {"source": self.source, "devices": self.devices, "samples": self.samples, "segments": self.segments,
               "unknown_intervals": self.unknown_intervals, "unknown_seconds": round(self.unknown_seconds, 3),
               "counter_resets": self.counter_resets, "runs": self.runs, "appended": self.appended,
               "duplicates": self.duplicates, "missing": self.missing, "per_device": self.per_device}
        if self.clock_skew:
            out["clock_skew"] = self.clock_skew
        out.update(self.input_report)
        return out


def timeline_for(c: Collected, device: str, opts: ImportOptions) -> Timeline:
    missing: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (_t, name), reason in c.device_reasons(device).items():
        missing[name][reason] += 1
    tl = build_timeline_arrays(device, c.device_arrays(device), cadence=opts.cadence or c.cadence,
                               span=opts.span or c.span, tolerance_factor=opts.tolerance_factor,
                               gap_cause=opts.gap_cause, edge_cause=opts.edge_cause,
                               missing={k: dict(v) for k, v in missing.items()})
    return restarted(c, tl)


def restarted(c: Collected, tl: Timeline) -> Timeline:
    """The device's gaps that cover a hole between two capture segments of its node (a capture stopped and
    started again: a second anchor, or a later file) get the cause ``capture_restarted``."""
    if not c.capture_segments or not tl.gaps:
        return tl
    holes = restart_holes(c).get(c.devices[tl.device].node or "unknown-node", [])
    if not holes:
        return tl
    gaps = tuple(replace(g, cause="capture_restarted",
                         detail=f"the capture stopped and was started again; {g.detail}")
                 if any(g.start < b and a < g.end for a, b in holes) else g for g in tl.gaps)
    return replace(tl, gaps=gaps)


def unknown_entries(c: Collected, tl: Timeline, opts: ImportOptions) -> dict[int, list[Entry]]:
    """The device's unknown_interval entries (gaps, counter resets) by segment window, in the order they go in."""
    info = c.devices[tl.device]
    gaps_by_w: dict[int, list[Entry]] = defaultdict(list)
    for g in tl.gaps:
        w = int(math.floor(g.start / opts.segment_seconds))
        gaps_by_w[w].append(make_entry(
            Kind.UNKNOWN_INTERVAL, g.start, {"cause": g.cause, "scope": "device", "detail": g.detail,
                                             "source": c.source},
            ts_end=g.end, cluster=opts.cluster, node=info.node, device=tl.device, source=f"import:{c.source}",
            source_version=c.source_version))
    for r in tl.resets:
        w = int(math.floor(r.t_before / opts.segment_seconds))
        gaps_by_w[w].append(make_entry(
            Kind.UNKNOWN_INTERVAL, r.t_before, {"cause": "counter_reset", "scope": "field", "field": r.field,
                                                "before": r.before, "after": r.after, "source": c.source,
                                                "detail": f"{r.field} went backwards; the delta across it is unknown"},
            ts_end=r.t_after, cluster=opts.cluster, node=info.node, device=tl.device, source=f"import:{c.source}",
            source_version=c.source_version))
    return gaps_by_w


def sample_windows(tl: Timeline, opts: ImportOptions) -> dict[int, list]:
    """The device's normalised sample rows by segment window."""
    windows: dict[int, list] = defaultdict(list)
    for r in tl.rows or tuple(sample_row_values(s) for s in tl.samples):
        windows[int(math.floor(r[1] / opts.segment_seconds))].append(r)
    return windows


def window_columns(tl: Timeline, opts: ImportOptions) -> dict[int, dict] | None:
    """The device's samples by segment window as the float64 columns ``write_segment_rows_in`` takes (the rows
    of :func:`sample_windows`, without the tuples); None when the timeline has no columns (its reference path).
    ``clock_reasons`` is truncated as the rows' ``int()`` truncates it."""
    if tl.columns is None or not len(tl.columns["t"]):
        return None
    import numpy as np

    cols = dict(tl.columns)
    if "clock_reasons" in cols:
        cols["clock_reasons"] = np.trunc(cols["clock_reasons"])
    w = np.floor(cols["t"] / opts.segment_seconds)
    cuts = np.flatnonzero(w[1:] != w[:-1]) + 1   # t ascends: each window is one run of rows
    out = {}
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(w)]):
        piece = {k: v[lo:hi] for k, v in cols.items()}
        piece["device"] = np.full(hi - lo, tl.device, dtype=object)
        out[int(w[lo])] = piece
    return out


def device_entries(c: Collected, tl: Timeline, opts: ImportOptions) -> list[tuple[list, Entry, list[Entry]]]:
    """The (normalised sample rows, segment entry, its unknown intervals) batches of one device."""
    info = c.devices[tl.device]
    reasons = c.device_reasons(tl.device)
    windows = sample_windows(tl, opts)
    gaps_by_w = unknown_entries(c, tl, opts)
    fields = sorted(c.device_series_names(tl.device))   # what the export has for this device
    out = []
    for w in sorted(set(windows) | set(gaps_by_w)):
        seg_rows = windows.get(w, [])
        if not seg_rows:
            # A window with only a gap: its unknown intervals ride with no segment (nothing to seal).
            out.append(([], None, gaps_by_w[w]))
            continue
        lo, hi = seg_rows[0][1], seg_rows[-1][1]
        miss: dict[str, dict[str, int]] = {}
        for (t, name), why in reasons.items():
            if lo <= t <= hi:
                miss.setdefault(name, {}).setdefault(why, 0)
                miss[name][why] += 1
        extra = {"source_format": c.source, "cadence_s": tl.cadence, "cadence_source": tl.cadence_source,
                 "tolerance_s": tl.tolerance_s, "missing": miss, "sku": info.sku, "vendor": info.vendor,
                 "fields": fields}
        entry = segment_entry_rows(seg_rows, node=info.node, source=f"import:{c.source}", cluster=opts.cluster,
                                   source_version=c.source_version, extra=extra)
        out.append((seg_rows, entry, gaps_by_w.get(w, [])))
    return out


def clock_skew(c: Collected, devices: list[str], spans: dict[str, tuple[float, float, float]],
               opts: ImportOptions) -> dict[str, float]:
    """Nodes of one run whose telemetry is shifted against the earliest node's by the same amount at both ends.

    A node that joined late or left early moves one end only; a wrong clock moves both. Offsets beyond the
    tolerance (3 cadences) are returned as {node: seconds}; the receipt still balances (the allocation spans
    all nodes and a device's uncovered part is unknown time), the skew is flagged on the run for a reader.
    """
    ends: dict[str, list[float]] = {}
    tolerance = 0.0
    for d in devices:
        a, b, cadence = spans[d]
        node = c.devices[d].node or "unknown-node"
        lo_hi = ends.setdefault(node, [a, b])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], a), max(lo_hi[1], b)
        tolerance = max(tolerance, opts.tolerance_factor * cadence)
    if len(ends) < 2:
        return {}
    first = min(ends, key=lambda n: (ends[n][0], n))
    out = {}
    for node, (a, b) in sorted(ends.items()):
        ahead_start, ahead_end = a - ends[first][0], b - ends[first][1]
        if ahead_start > tolerance and abs(ahead_start - ahead_end) <= tolerance:
            out[node] = round((ahead_start + ahead_end) / 2, 3)
    return out


def billable_devices(c: Collected) -> set[str]:
    """Devices a run may hold: a GPU partitioned into MIG instances is not one (its instances are), so its
    own series (power, temperature) stay evidence but are never bound to a run and never billed."""
    parents = {i.uuid for i in c.devices.values() if i.mig_instance is not None and i.uuid}
    return {d for d, i in c.devices.items()
            if not i.partitioned and not (i.mig_instance is None and i.uuid in parents)}


def held_through_holes(contexts: dict, spans: dict[str, tuple[float, float, float]],
                       holes: dict[str, list[tuple[float, float]]]) -> None:
    """A run whose labels stop at a hole in its device's telemetry (``holes``: the timeline's unknown intervals,
    the collector down) ended somewhere inside the hole, and one whose labels start where a hole ends began inside
    it; the labels cannot say where. Each is held to the hole's midpoint (the expected end or start when nothing
    says where it fell), so the hole's allocated time stays unknown time of the runs around it instead of
    vanishing; a hole inside another run's labels is that run's already. A hole on some of a run's devices while
    the others report on (a GPU fallen off the bus) is not where the labels cannot say: the others' labels say
    when it ended, so its spans stay. In place on ``contexts``' spans."""
    by_dev: dict[str, list[list[float]]] = defaultdict(list)
    mates: dict[int, list[str]] = {}
    for devs in contexts.values():
        for dev, span in devs.items():
            by_dev[dev].append(span)
            mates[id(span)] = list(devs)

    def others_report(span: list[float], dev: str, a: float, b: float) -> bool:
        return any(not any(x < b and y > a for x, y in holes.get(d) or []) for d in mates[id(span)] if d != dev)

    for dev, runs in by_dev.items():
        gaps = holes.get(dev) or []
        if not gaps:
            continue
        cadence = spans[dev][2]
        before = [tuple(r) for r in runs]                  # the labels' own spans, before any is moved
        for a, b in gaps:
            mid = (a + b) / 2.0
            for i, span in enumerate(runs):
                x, y = before[i]
                if _held(before, i, a, b) or others_report(span, dev, a, b):
                    continue
                if a - cadence <= y <= a + cadence:        # its labels end where the hole begins
                    span[1] = max(span[1], mid)
                if b - cadence <= x <= b + cadence:        # its labels begin where the hole ends
                    span[0] = min(span[0], mid)


def _held(runs: list[tuple[float, float]], me: int, a: float, b: float) -> bool:
    """Does another run of the device span the hole [a, b) (the hole is inside that run)?"""
    return any(k != me and x < a and y > b for k, (x, y) in enumerate(runs))


def run_entries(c: Collected, spans: dict[str, tuple[float, float, float]], opts: ImportOptions,
                holes: dict[str, list[tuple[float, float]]] | None = None) -> list[Entry]:
    """Synthetic Path B allocations from labels (or one per node when there are none); a run ending or starting
    at one of ``holes`` (device -> its telemetry's unknown intervals) is held to its midpoint."""
    billable = billable_devices(c)
    contexts: dict[Context, dict[str, list[float]]] = defaultdict(dict)
    for (dev, ctx), (a, b) in c.contexts.items():
        if dev in spans and dev in billable:
            contexts[ctx][dev] = [a, min(b + spans[dev][2], spans[dev][1])]
    if contexts and holes:
        held_through_holes(contexts, spans, holes)
    if not contexts:
        for dev, sp in spans.items():
            if dev not in billable:
                continue
            node = c.devices[dev].node or "unknown-node"
            ctx = Context("node", f"node:{node}", None)
            contexts[ctx][dev] = [sp[0], sp[1]]
    entries: list[Entry] = []
    tenant_of = dict(opts.tenants)
    shared = shared_devices(c, spans)   # held by several workloads at once: each pays an equal share
    for ctx in sorted(contexts, key=lambda x: (x.kind, x.job_id, x.tenant or "")):
        devs = contexts[ctx]
        tenant = tenant_of.get(ctx.tenant, ctx.tenant) if ctx.tenant is not None else None
        start = min(v[0] for v in devs.values())
        end = max(v[1] for v in devs.values())
        nodes = sorted({c.devices[d].node or "unknown-node" for d in devs})
        key = dict(cluster=opts.cluster, job_id=ctx.job_id, run=0, source=f"import:{c.source}")
        payload = {"account": tenant, "user": None, "partition": None, "qos": None, "nodes": nodes,
                   "gpus": len(devs), "tres": f"gres/gpu={len(devs)}", "synthetic": True, "basis": ctx.kind,
                   "tenant": tenant, "labels": dict(ctx.detail)}
        skew = clock_skew(c, sorted(devs), spans, opts)
        if skew:   # only then: the entries of unskewed runs stay what they were
            payload["clock_skew_s"] = skew
        entries.append(make_entry(Kind.ALLOCATION_STARTED, start, payload,
                                  node=nodes[0] if len(nodes) == 1 else None, **key))
        for d in sorted(devs):
            info = c.devices[d]
            entries.append(make_entry(Kind.DEVICE_BOUND, start, {
                # uuid = the Sample.device key (a MIG instance's "UUID/giN"), so receipts find its samples
                "index": info.index, "uuid": d, "gpu_uuid": info.uuid, "sku": info.sku, "vendor": info.vendor,
                "node": info.node, "mig_profile": info.mig_profile, "mig_instance": info.mig_instance,
                "pci_bus_id": info.pci_bus_id, "synthetic": True,
                # only on a shared device, so the entries of devices one workload holds stay what they were
                **({"sharers": len(shared[d]), "share_rule": "equal"} if d in shared else {})},
                node=info.node, device=d, **key))
        entries.append(make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": None, "state": "OBSERVED_END",
                                                                "synthetic": True}, **key))
    return entries


def tally(res: ImportResult, c: Collected, tl: Timeline) -> None:
    """Count one device's timeline into the import result (devices, samples, gaps, missing fields)."""
    res.devices += 1
    res.samples += len(tl.samples)
    res.unknown_intervals += len(tl.gaps)
    res.unknown_seconds += tl.unknown_s
    res.counter_resets += len(tl.resets)
    for name, reasons in tl.missing.items():
        for why, n in reasons.items():
            res.missing.setdefault(name, {}).setdefault(why, 0)
            res.missing[name][why] += n
    res.per_device[tl.device] = {"node": c.devices[tl.device].node, "samples": len(tl.samples),
                                 "cadence_s": tl.cadence, "covered_s": round(tl.covered_s, 3),
                                 "unknown_s": round(tl.unknown_s, 3),
                                 "gaps": [{"start": g.start, "end": g.end, "cause": g.cause} for g in tl.gaps]}


def each_timeline(c: Collected, opts: ImportOptions, res: ImportResult, spans: dict[str, tuple],
                  progress: Callable[[int, int], None] | None = None) -> Iterator[Timeline]:
    """Each device's timeline in device order (devices without samples skipped), counted into ``res`` and its
    span noted in ``spans``; ``progress`` is told after the caller has handled the device."""
    devices = sorted(c.series)
    for i, dev in enumerate(devices):
        tl = timeline_for(c, dev, opts)
        if tl.start is None:
            continue
        spans[dev] = (tl.start, tl.end, tl.cadence)
        tally(res, c, tl)
        yield tl
        if progress:
            progress(i + 1, len(devices))


def counted_runs(res: ImportResult, c: Collected, spans: dict[str, tuple], opts: ImportOptions) -> list[Entry]:
    """The synthetic run entries (none unless ``opts.synthetic_runs``), counted into ``res`` (runs, clock skew)."""
    if not (opts.synthetic_runs and spans):
        return []
    holes = {d: [(g["start"], g["end"]) for g in info.get("gaps", [])] for d, info in res.per_device.items()}
    runs = run_entries(c, spans, opts, holes)
    res.runs = sum(1 for e in runs if e.kind == Kind.ALLOCATION_STARTED)
    res.clock_skew = {e.job_id: e.data["clock_skew_s"] for e in runs
                      if e.kind == Kind.ALLOCATION_STARTED and '"clock_skew_s"' in e.payload}
    for dev, jobs in shared_devices(c, spans).items():
        res.input_report.setdefault("warnings", []).append(
            f"{dev}: held by {len(jobs)} workloads at once ({', '.join(jobs)}; time-slicing or MPS); "
            f"each run pays an equal share (1/{len(jobs)}) of the GPU (ledger.method.shares)")
    return runs


def shared_devices(c: Collected, spans: dict[str, tuple]) -> dict[str, list[str]]:
    """Billable devices that two or more workloads hold over overlapping spans (dcgm-exporter writes one series per
    pod sharing a GPU, e.g. with its ``vgpu`` label): each of their runs is bound to the device with ``sharers``,
    so its receipt pays an equal share (:mod:`ledger.method.shares`)."""
    billable = billable_devices(c)
    held: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (dev, ctx), (a, b) in c.contexts.items():
        if dev in spans and dev in billable:
            held[dev].append((a, b, ctx.job_id))
    out = {}
    for dev, ivs in sorted(held.items()):
        ivs.sort()
        jobs: set[str] = set()
        for i, (a, _, job) in enumerate(ivs):
            for _, b0, job0 in ivs[:i]:   # sorted by start, so these overlap iff this one starts before they end
                if a <= b0 and job0 != job:
                    jobs |= {job, job0}
        if jobs:
            out[dev] = sorted(jobs)
    return out


def write(engine: Engine, c: Collected, opts: ImportOptions = ImportOptions(),
          progress: Callable[[int, int], None] | None = None) -> ImportResult:
    """Import a parsed collection in one transaction (idempotent: re-importing appends nothing new)."""
    res = ImportResult(source=c.source, input_report=c.report())
    spans: dict[str, tuple] = {}
    with write_tx(engine) as conn:
        for tl in each_timeline(c, opts, res, spans, progress):
            by_window = window_columns(tl, opts)
            for samples, entry, others in device_entries(c, tl, opts):
                if entry is None:
                    r = append_in(conn, others)
                else:
                    cols = by_window[int(math.floor(samples[0][1] / opts.segment_seconds))] if by_window else None
                    r = write_segment_rows_in(conn, samples, entry, others, columns=cols)
                    res.segments += 1
                res.appended += r.appended
                res.duplicates += r.duplicates
        runs = counted_runs(res, c, spans, opts)
        if runs:
            r = append_in(conn, runs)
            res.appended += r.appended
            res.duplicates += r.duplicates
    return res
