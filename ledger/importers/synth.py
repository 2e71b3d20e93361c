"""Deterministic dcgm-exporter-shaped telemetry for tests, the demo hall and benchmarks.

Same arguments (including ``seed``) -> byte-identical output. Functions:

``series(n_gpus=16, hours=24, cadence=60, start=1767225600, seed=0, holes=(), jobs="none", node_gpus=8,
metrics=DEFAULT_METRICS)``
    yields ``(labels: dict, points: list[(t, value_str)])`` per series. ``holes`` is a sequence of
    ``(gpu_index, offset_s, duration_s)``: that GPU has no samples in [start+offset, start+offset+duration).
    ``jobs``: "none" (no context labels), "slurm" (``hpc_job`` = 1000 + gpu // 4) or "k8s" (namespace
    ``team-<gpu // 8>``, pod ``train-<gpu // 4>``). GPUs are spread over nodes of ``node_gpus`` each
    (``Hostname`` = "node-00", "node-01", ...). Workloads are busy/idle phases per GPU; the energy counter
    (mJ) is monotonic.
``write_query_range(dir, **kw) -> list[Path]``: one ``/api/v1/query_range`` JSON response per metric.
``write_openmetrics(path, **kw) -> Path``: the same series as OpenMetrics text with timestamps (seconds),
    ending in ``# EOF``, as ``promtool tsdb create-blocks-from openmetrics`` wants it.
``write_csv(path, **kw) -> Path``: the long CSV shape (timestamp,metric,labels...,value).

Example::

    from ledger.importers import synth
    synth.write_query_range("out/", n_gpus=64, hours=24, cadence=15, holes=[(3, 3600, 1200)])
"""

from __future__ import annotations

import csv
import json
import random
import uuid as uuid_mod
from pathlib import Path
from typing import Iterator, Sequence

DEFAULT_START = 1767225600.0   # 2026-01-01T00:00:00Z
DEFAULT_METRICS = (
    "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS",
)
SKU = "NVIDIA H100 80GB HBM3"
DRIVER = "550.54.15"


def gpu_uuid(seed: int, gpu: int) -> str:
    return "GPU-" + str(uuid_mod.UUID(int=random.Random(f"{seed}:{gpu}").getrandbits(128)))


def labels_for(gpu: int, seed: int = 0, jobs: str = "none", node_gpus: int = 8) -> dict[str, str]:
    local = gpu % node_gpus
    lab = {"gpu": str(local), "UUID": gpu_uuid(seed, gpu), "pci_bus_id": f"00000000:{0x18 + 16 * local:02X}:00.0",
           "device": f"nvidia{local}", "modelName": SKU, "Hostname": f"node-{gpu // node_gpus:02d}",
           "DCGM_FI_DRIVER_VERSION": DRIVER}
    if jobs == "slurm":
        lab["hpc_job"] = str(1000 + gpu // 4)
    elif jobs == "k8s":
        lab.update({"container": "trainer", "namespace": f"team-{gpu // 8}", "pod": f"train-{gpu // 4}"})
    return lab


def _workload(gpu: int, n: int, seed: int) -> list[float]:
    """Per-step SM activity: phases of busy (0.55-0.95), starved (~0.02) and idle (0) of 10-120 steps."""
    rng = random.Random(f"w:{seed}:{gpu}")
    out: list[float] = []
    while len(out) < n:
        kind = rng.choices(("busy", "starved", "idle"), (0.7, 0.15, 0.15))[0]
        length = rng.randint(10, 120)
        base = {"busy": rng.uniform(0.55, 0.95), "starved": 0.02, "idle": 0.0}[kind]
        for _ in range(length):
            jitter = rng.uniform(-0.03, 0.03) if kind == "busy" else 0.0
            out.append(min(1.0, max(0.0, base + jitter)))
    return out[:n]


def series(n_gpus: int = 16, hours: float = 24, cadence: float = 60, start: float = DEFAULT_START, seed: int = 0,
           holes: Sequence[tuple[int, float, float]] = (), jobs: str = "none", node_gpus: int = 8,
           metrics: Sequence[str] = DEFAULT_METRICS) -> Iterator[tuple[dict, list[tuple[float, str]]]]:
    n = int(round(hours * 3600 / cadence))
    for gpu in range(n_gpus):
        act = _workload(gpu, n, seed)
        my_holes = [(start + off, start + off + dur) for g, off, dur in holes if g == gpu]
        kept = {k for k in range(n) if not any(a <= start + k * cadence < b for a, b in my_holes)}
        rows: dict[str, list[tuple[float, str]]] = {m: [] for m in metrics}
        energy_mj = 1_000_000_000 + 7_919 * gpu * 1000
        for k in range(n):
            a = act[k]
            power = round(70.0 + 600.0 * a, 3)
            energy_mj += int(power * cadence * 1000)
            if k not in kept:
                continue
            t = start + k * cadence
            vals = {
                "DCGM_FI_PROF_SM_ACTIVE": f"{a:.6f}",
                "DCGM_FI_PROF_SM_OCCUPANCY": f"{a * 0.6:.6f}",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": f"{a * 0.4:.6f}",
                "DCGM_FI_PROF_DRAM_ACTIVE": f"{a * 0.3:.6f}",
                "DCGM_FI_DEV_GPU_UTIL": str(int(round(min(100.0, a * 110))) if a > 0 else 0),
                "DCGM_FI_DEV_SM_CLOCK": str(1980 if a > 0.05 else 345),
                "DCGM_FI_DEV_MEM_CLOCK": "2619",
                "DCGM_FI_DEV_POWER_USAGE": f"{power:.3f}",
                "DCGM_FI_DEV_GPU_TEMP": str(int(32 + 45 * a)),
                "DCGM_FI_DEV_MEMORY_TEMP": str(int(36 + 40 * a)),
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(energy_mj),
                "DCGM_FI_DEV_FB_USED": str(int(1024 + 70000 * (a > 0.01))),
                "DCGM_FI_DEV_XID_ERRORS": "0",
            }
            for m in metrics:
                rows[m].append((t, vals[m]))
        base = labels_for(gpu, seed, jobs, node_gpus)
        for m in metrics:
            yield {"__name__": m, **base}, rows[m]


def write_query_range(out_dir: str | Path, **kw) -> list[Path]:
    """One query_range JSON response per metric (series of all GPUs), as a Path B export script saves them.

    Written series by series into the open files (byte for byte ``json.dumps`` of the whole response), so a
    1,000-GPU day is never held in memory to write it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, object] = {}
    try:
        for labels, pts in series(**kw):
            m = labels["__name__"]
            f = files.get(m)
            if f is None:
                f = files[m] = (out / f"{m}.json").open("w", encoding="utf-8")
                f.write('{"status": "success", "data": {"resultType": "matrix", "result": [')
            else:
                f.write(", ")
            f.write(json.dumps({"metric": labels, "values": [[t, v] for t, v in pts]}))
    finally:
        for f in files.values():
            f.write("]}}")
            f.close()
    return [out / f"{m}.json" for m in files]


def _fmt_labels(labels: dict) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
    return "{" + inner + "}"


def write_openmetrics(path: str | Path, **kw) -> Path:
    """OpenMetrics text with timestamps in seconds, grouped by metric family, ending in ``# EOF``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    by_metric: dict[str, list] = {}
    for labels, pts in series(**kw):
        by_metric.setdefault(labels["__name__"], []).append((labels, pts))
    with p.open("w", encoding="utf-8") as f:
        for m, items in by_metric.items():
            f.write(f"# TYPE {m} gauge\n")
            for labels, pts in items:
                lab = _fmt_labels(labels)
                f.writelines(f"{m}{lab} {v} {t:.0f}\n" if t == int(t) else f"{m}{lab} {v} {t:.3f}\n"
                             for t, v in pts)
        f.write("# EOF\n")
    return p


def write_csv(path: str | Path, **kw) -> Path:
    """The long CSV: timestamp,metric,<labels>,value (one row per sample)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    label_names = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
    if kw.get("jobs") == "slurm":
        label_names.append("hpc_job")
    elif kw.get("jobs") == "k8s":
        label_names += ["container", "namespace", "pod"]
    with p.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "metric", *label_names, "value"])
        for labels, pts in series(**kw):
            for t, v in pts:
                w.writerow([f"{t:.3f}", labels["__name__"], *[labels.get(n, "") for n in label_names], v])
    return p
