"""The node collector (`ipledger collect`): samples DCGM fields (dcgmi dmon), NVML or amd-smi at a cadence into
the spool, each batch sealed as a ``telemetry_segment`` record carrying its sample rows.

* One batch = ``count`` samples at ``interval`` seconds (``dcgmi dmon -e ... -d MS -c N`` in one call; NVML and
  amd-smi are polled ``count`` times). Per device, the batch becomes a timeline (ledger.telemetry.timeline):
  one segment record with the rows in a ``samples`` field beside the entry (``ship`` inserts them into the
  ``samples`` table, sealed by the entry's digest), plus ``unknown_interval`` records for holes.
* Ownership: the device's current job run comes from the hooks' ``device_bound`` / ``allocation_ended``
  records in the spool (pending and shipped); it goes into the segment payload as ``owner`` and onto the
  unknown intervals as cluster/job_id/run. Devices the spool names by index + UUID get their UUID.
* Failure never kills the loop: a source that errors, hangs or is missing yields an ``unknown_interval``
  (cause ``collector_down`` when the tool is absent or the host engine is down, ``source_error`` otherwise,
  scope ``node``) covering the batch, and the next batch tries again.
Read-only: every program runs through :mod:`ledger.base.commands`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..base import commands as commands_mod
from . import spool
from ..chain.entries import Kind, make_entry
from ..importers import amdsmi as amdsmi_mod
from ..importers import dmon as dmon_mod
from ..importers.common import Collected, DeviceInfo, InputError
from ..importers.dcgm_fields import COLLECT_FIELD_IDS
from ..importers.pipeline import ImportOptions, timeline_for
from ..telemetry.sealed import sample_row_values, segment_entry

SOURCE = "collector"


@dataclass(frozen=True)
class CollectorConfig:
    spool: str
    node: str
    source: str = "auto"               # auto | dcgmi | nvml | amd-smi
    interval: float = 1.0              # seconds between samples
    count: int = 60                    # samples per batch
    cluster: str | None = None
    commands: Mapping[str, str] = field(default_factory=dict)


@dataclass
class BatchReport:
    source: str
    start: float
    end: float
    devices: int = 0
    samples: int = 0
    gaps: int = 0
    error: str | None = None
    spool_file: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def owners(spool_dir: str, node: str | None = None, max_files: int = 5000) -> dict[str, dict[str, Any]]:
    """Current device -> {cluster, job_id, run, uuid, index} from the hooks' spool records (latest wins)."""
    base = Path(spool_dir)
    files = [p for d in (base, base / spool.SHIPPED_DIR) if d.is_dir() for p in d.glob("*.jsonl")]
    files = sorted(files, key=lambda p: p.name)[-max_files:]
    bound: dict[str, dict] = {}
    ended: set[tuple] = set()
    for p in files:
        try:
            recs = spool.read(p).records
        except (FileNotFoundError, spool.UnsafeFile):  # moved by a shipper meanwhile, or not a writer's file
            continue
        for rec in recs:
            kind = rec.get("kind")
            key = tuple(v if isinstance(v, (str, int, type(None))) else repr(v)
                        for v in (rec.get("cluster"), rec.get("job_id"), rec.get("run")))
            if kind == Kind.DEVICE_BOUND and rec.get("device") and isinstance(rec.get("device"), str):
                if node and rec.get("node") not in (None, node):
                    continue
                payload = rec.get("payload")
                try:
                    data = json.loads(payload) if isinstance(payload, str) else (payload or {})
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                bound[rec["device"]] = {"cluster": key[0], "job_id": key[1], "run": key[2],
                                        "uuid": data.get("uuid") or rec["device"], "index": data.get("index"),
                                        "sku": data.get("sku")}
            elif kind == Kind.ALLOCATION_ENDED:
                ended.add(key)
    return {d: o for d, o in bound.items() if (o["cluster"], o["job_id"], o["run"]) not in ended}


def _nvml_available() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return False
    return True


def pick_source(cfg: CollectorConfig) -> str:
    if cfg.source != "auto":
        return cfg.source
    if commands_mod.resolve("dcgmi", cfg.commands):
        return "dcgmi"
    if _nvml_available():
        return "nvml"
    if commands_mod.resolve("amd-smi", cfg.commands):
        return "amd-smi"
    return "dcgmi"   # nothing found: the batch records collector_down, which is the truth


def _sample_dcgmi(cfg: CollectorConfig, start: float) -> Collected:
    args = ["dmon", "-e", ",".join(str(i) for i in COLLECT_FIELD_IDS), "-d", str(int(cfg.interval * 1000)),
            "-c", str(cfg.count)]
    res = commands_mod.run("dcgmi", args, commands=cfg.commands, timeout=cfg.interval * cfg.count + 15)
    if not res.ok:
        raise SourceFailed("collector_down" if res.returncode in (127, 255) else "source_error",
                           (res.stderr or res.stdout).strip()[:300] or f"exit {res.returncode}")
    return dmon_mod.parse(res.stdout, "dcgmi dmon", start=start, interval=cfg.interval, node=cfg.node)


def _sample_amdsmi(cfg: CollectorConfig, start: float, sleep: Callable[[float], None]) -> Collected:
    out = Collected("amd_smi", path="amd-smi metric", cadence=cfg.interval)
    for k in range(cfg.count):
        res = commands_mod.run("amd-smi", ["metric", "--json"], commands=cfg.commands, timeout=max(5.0, cfg.interval))
        if not res.ok:
            raise SourceFailed("collector_down" if res.returncode == 127 else "source_error",
                               (res.stderr or res.stdout).strip()[:300] or f"exit {res.returncode}")
        out.merge(amdsmi_mod.parse(res.stdout, "amd-smi metric --json", start=start + k * cfg.interval,
                                   interval=cfg.interval, node=cfg.node))
        if k + 1 < cfg.count:
            sleep(cfg.interval)
    out.span = (start, start + cfg.count * cfg.interval)
    return out


def _sample_nvml(cfg: CollectorConfig, start: float, sleep: Callable[[float], None]) -> Collected:
    try:
        import pynvml as N
    except ImportError:
        raise SourceFailed("collector_down", "nvidia-ml-py (pynvml) is not installed") from None
    out = Collected("nvml", path="nvml", cadence=cfg.interval, span=(start, start + cfg.count * cfg.interval))
    try:
        N.nvmlInit()
        handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
        for k in range(cfg.count):
            t = start + k * cfg.interval
            for i, h in enumerate(handles):
                uuid = N.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                name = N.nvmlDeviceGetName(h)
                dev = out.device(DeviceInfo(device=uuid, node=cfg.node, index=i, uuid=uuid,
                                            sku=name.decode() if isinstance(name, bytes) else name))
                for field_name, fn, scale in (
                        ("gpu_util", lambda: N.nvmlDeviceGetUtilizationRates(h).gpu, 0.01),
                        ("mem_copy_util", lambda: N.nvmlDeviceGetUtilizationRates(h).memory, 0.01),
                        ("power_w", lambda: N.nvmlDeviceGetPowerUsage(h), 0.001),
                        ("gpu_temp_c", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU), 1.0),
                        ("sm_clock_mhz", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM), 1.0),
                        ("mem_clock_mhz", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM), 1.0),
                        ("energy_j", lambda: N.nvmlDeviceGetTotalEnergyConsumption(h), 0.001),
                        ("clock_reasons", lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h), 1.0),
                        ("fb_used_mib", lambda: N.nvmlDeviceGetMemoryInfo(h).used / 1048576, 1.0),
                        ("compute_procs", lambda: len(N.nvmlDeviceGetComputeRunningProcesses(h)), 1.0)):
                    try:
                        out.add_raw(dev, field_name, t, fn(), scale)
                    except N.NVMLError as exc:
                        out.add(dev, field_name, t, None, "not_supported" if "Not Supported" in str(exc)
                                else "nvml_error")
            if k + 1 < cfg.count:
                sleep(cfg.interval)
    except N.NVMLError as exc:
        raise SourceFailed("source_error", f"NVML: {exc}") from None
    return out


class SourceFailed(RuntimeError):
    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause, self.detail = cause, detail


def batch_records(c: Collected, cfg: CollectorConfig, own: Mapping[str, dict]) -> tuple[list[dict], int, int]:
    """Per device: the segment record (rows embedded) and its unknown intervals, as spool records."""
    by_index = {o.get("index"): (dev, o) for dev, o in own.items() if o.get("index") is not None}
    records, n_samples, n_gaps = [], 0, 0
    opts = ImportOptions(cluster=cfg.cluster or "", gap_cause="collector_down", edge_cause="collector_down")
    for dev in sorted(c.series):
        info = c.devices[dev]
        owner = own.get(dev) or (by_index.get(info.index, (None, None))[1] if info.index is not None else None)
        tl = timeline_for(c, dev, opts)
        if not tl.samples:
            continue
        uuid = owner.get("uuid") if owner else None
        if uuid and uuid != dev:   # dmon names GPUs by index; the hooks' device_bound gives the UUID
            from dataclasses import replace
            samples = [replace(s, device=uuid) for s in tl.samples]
        else:
            samples, uuid = list(tl.samples), dev
        keys = {"cluster": owner.get("cluster") if owner else cfg.cluster, "job_id": owner.get("job_id") if owner else None,
                "run": owner.get("run") if owner else None}
        extra = {"source_format": c.source, "cadence_s": tl.cadence, "collector": True,
                 "owner": {k: v for k, v in keys.items()} if owner else None,
                 "missing": {k: dict(v) for k, v in tl.missing.items()}}
        entry = segment_entry(samples, node=cfg.node, source=SOURCE, cluster=keys["cluster"], extra=extra)
        rec = entry.to_record()
        rec["samples"] = [list(sample_row_values(s)) for s in samples]
        records.append(rec)
        n_samples += len(samples)
        for g in tl.gaps:
            records.append(make_entry(Kind.UNKNOWN_INTERVAL, g.start, {"cause": g.cause, "scope": "device",
                                                                       "detail": g.detail, "source": c.source},
                                      ts_end=g.end, node=cfg.node, device=uuid, source=SOURCE, **keys).to_record())
            n_gaps += 1
    return records, n_samples, n_gaps


def collect_batch(cfg: CollectorConfig, *, now: Callable[[], float] = time.time,
                  sleep: Callable[[float], None] = time.sleep) -> BatchReport:
    """One batch: sample, build records, write them durably to the spool. Never raises on source failure."""
    source = pick_source(cfg)
    start = now()
    report = BatchReport(source=source, start=start, end=start + cfg.count * cfg.interval)
    try:
        if source == "dcgmi":
            c = _sample_dcgmi(cfg, start)
        elif source == "amd-smi":
            c = _sample_amdsmi(cfg, start, sleep)
        elif source == "nvml":
            c = _sample_nvml(cfg, start, sleep)
        else:
            raise SourceFailed("source_error", f"unknown source {source!r}")
        records, report.samples, report.gaps = batch_records(c, cfg, owners(cfg.spool, cfg.node))
        report.devices = len(c.series)
    except (SourceFailed, InputError, commands_mod.CommandRefused) as exc:
        cause = exc.cause if isinstance(exc, SourceFailed) else "source_error"
        report.error = f"{cause}: {exc}"
        end = max(now(), report.end)
        report.end = end
        records = [make_entry(Kind.UNKNOWN_INTERVAL, start, {"cause": cause, "scope": "node", "source": source,
                                                             "detail": str(exc)[:300]},
                              ts_end=end, node=cfg.node, cluster=cfg.cluster, source=SOURCE).to_record()]
        report.gaps = 1
    if records:
        report.spool_file = str(spool.write(cfg.spool, records, prefix="collector"))
    return report


def run(cfg: CollectorConfig, *, once: bool = False, batches: int | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        before_batch: Callable[[], None] | None = None) -> int:
    """The collector loop: batch after batch until stopped (SIGTERM ends it between batches via KeyboardInterrupt)."""
    done = 0
    try:
        while True:
            if before_batch:   # the kubelet's pods (ledger.capture.k8s), so the batch's owners include them
                before_batch()
            rep = collect_batch(cfg)
            done += 1
            if on_batch:
                on_batch(rep)
            if once or (batches is not None and done >= batches):
                return done
            if rep.error:      # the source failed at once: wait one batch length before retrying
                time.sleep(min(cfg.interval * cfg.count, 60.0))
    except KeyboardInterrupt:
        return done


def default_node() -> str:
    return os.uname().nodename.split(".")[0]
