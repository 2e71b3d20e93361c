"""Writing a simulation the way the real parts would: scheduler facts through the spool and `ship` (as the Slurm
hooks do), telemetry through sealed sample segments (as the collector does), and a Prometheus ``query_range``
export of part of it (what a prospective site would send).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..capture import spool
from ..chain import store
from ..chain.entries import Kind, make_entry
from ..ingest.ship import ship
from ..telemetry.model import Sample
from ..telemetry.sealed import segment_entry, write_segment
from .fleet import SKUS, Simulation

SOURCE = "demo.sim"
DAY_STEPS_S = 86400


def scheduler_records(sim: Simulation) -> list[dict]:
    """allocation_started / device_bound / allocation_ended / allocation_requeued / progress, as the hooks write."""
    t, dt, cl = sim.t, sim.spec.cadence_s, sim.spec.cluster
    recs = []
    for j in sim.jobs:
        key = dict(cluster=cl, job_id=j.job_id, run=j.run, node=j.node)
        start, end = float(t[j.start]), float(t[0] + j.end * dt)
        recs.append(make_entry(Kind.ALLOCATION_STARTED, start, {
            "account": j.tenant, "user": f"u-{j.tenant}", "partition": j.partition, "qos": j.qos,
            "nodes": [j.node], "gpus": len(j.devs), "tres": f"cpu=32,mem=256G,gres/gpu={len(j.devs)}"},
            source="hook.prolog", **key).to_record())
        for i in j.devs:
            d = sim.devices[i]
            recs.append(make_entry(Kind.DEVICE_BOUND, start, {"index": d.index, "uuid": d.uuid, "sku": d.sku,
                                                              "vendor": d.vendor, "node": d.node, "rack": d.rack},
                                   device=d.uuid, source="hook.prolog", **key).to_record())
        recs.append(make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": j.exit_code, "state": j.state},
                               source="hook.epilog", **key).to_record())
        for n, p in enumerate(j.progress):
            if j.start < p <= j.end:
                recs.append(make_entry(Kind.PROGRESS, float(t[0] + p * dt), {"checkpoint": n + 1, "kind": "checkpoint"},
                                       source="app", **key).to_record())
        if j.run > 0:
            recs.append(make_entry(Kind.ALLOCATION_REQUEUED, start, {"previous_run": j.run - 1, "reason": "NODE_FAIL"},
                                   source="hook.prolog", **key).to_record())
    return recs


def _samples(sim: Simulation, devs: list[int], a: int, b: int) -> list[Sample]:
    A, dt = sim.arrays, float(sim.spec.cadence_s)
    out = []
    for i in devs:
        d = sim.devices[i]
        amd = d.vendor == "AMD"
        m = np.flatnonzero(sim.present[i, a:b]) + a
        if not len(m):
            continue
        cols = {k: A[k][i, m].tolist() for k in A}
        n = len(m)
        none = [None] * n
        out.extend(Sample(*row) for row in zip(
            [d.uuid] * n, sim.t[m].tolist(), [dt] * n, [int(x) for x in cols["clock_reasons"]],
            cols["sm_active"], none, none if amd else cols["tensor_active"], none, cols["gpu_util"], none,
            cols["sm_clock_mhz"], none, cols["power_w"], cols["gpu_temp_c"], none, cols["energy_j"],
            none, none, cols["ecc_sbe_aggregate"], [0.0] * n, [0.0] * n, [0.0] * n,
            cols["xid"], cols["fb_used_mib"], cols["compute_procs"]))
    return out


def write_ledger(engine, sim: Simulation, spool_dir: Path, extra_entries=()) -> dict:  # noqa: ANN001
    """Fill a ledger with the simulation; returns counts."""
    nodes: dict[str, list[int]] = {}
    for i, d in enumerate(sim.devices):
        nodes.setdefault(d.node, []).append(i)
    steps_per_day = DAY_STEPS_S // sim.spec.cadence_s
    T = len(sim.t)
    segments = samples = 0
    for node, devs in nodes.items():
        gaps = [g for g in sim.gaps if g["node"] == node]
        for a in range(0, T, steps_per_day):
            b = min(T, a + steps_per_day)
            ss = _samples(sim, devs, a, b)
            if not ss:
                continue
            lo, hi = float(sim.t[a]), float(sim.t[0] + b * sim.spec.cadence_s)
            others = [make_entry(Kind.UNKNOWN_INTERVAL, g["start"], {"cause": g["cause"], "scope": "node",
                                                                      "detail": g["detail"]},
                                 ts_end=g["end"], cluster=sim.spec.cluster, node=node, source="collector")
                      for g in gaps if lo <= g["start"] < hi]
            seg = segment_entry(ss, node=node, source="collector", cluster=sim.spec.cluster,
                                extra={"cadence_s": sim.spec.cadence_s, "simulated": True})
            write_segment(engine, ss, seg, others)
            segments += 1
            samples += len(ss)
    # the hooks' records ship last, as epilogs do after the job's telemetry was collected (receipts are the
    # caller's to issue: no after-ship steps here)
    # extra entries (the demo's contract) are an operator's: recorded the way the CLI records them, since a
    # spool may hold observations only (docs/security.md)
    if extra_entries:
        store.append(engine, list(extra_entries))
    spool.write(spool_dir, scheduler_records(sim), prefix="demo-hooks")
    rep = ship(engine, spool_dir)
    if rep.errors or rep.refused or rep.quarantined:
        raise RuntimeError(f"demo spool did not ship: {(rep.errors + rep.refused + rep.quarantined)[0]}")
    return {"entries_shipped": rep.appended, "segments": segments, "samples": samples}


PROM_METRICS = (
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active", "{:.6f}"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", "{:.6f}"),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util", "{:.0f}"),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "{:.0f}"),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "{:.6f}"),
    ("DCGM_FI_DEV_GPU_TEMP", "gpu_temp_c", "{:.0f}"),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "clock_reasons", "{:.0f}"),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "{:.0f}"),
    ("DCGM_FI_DEV_XID_ERRORS", "xid", "{:.0f}"),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_aggregate", "{:.0f}"),
)


def write_prometheus_export(sim: Simulation, path: Path, nodes: list[str], start_step: int, steps: int) -> dict:
    """One /api/v1/query_range "matrix" response holding the dcgm-exporter series of these nodes (NVIDIA only).

    Labels as dcgm-exporter 3.x renders them (gpu, UUID, device, modelName, Hostname); values as strings;
    points the collector did not record are absent, as Prometheus returns them. GPU_UTIL is a percentage.
    """
    result = []
    sl = slice(start_step, start_step + steps)
    t = sim.t[sl]
    for i, d in enumerate(sim.devices):
        if d.node not in nodes or d.vendor != "NVIDIA":
            continue
        pres = sim.present[i, sl]
        labels = {"gpu": str(d.index), "UUID": d.uuid, "device": f"nvidia{d.index}",
                  "modelName": "NVIDIA H100 80GB HBM3", "Hostname": d.node, "job": "dcgm-exporter",
                  "instance": f"{d.node}:9400"}
        for name, key, fmt in PROM_METRICS:
            v = sim.arrays[key][i, sl]
            if key == "gpu_util":
                v = v * 100.0
            vals = [[float(tt), fmt.format(x)] for tt, x, p in zip(t.tolist(), v.tolist(), pres.tolist()) if p]
            result.append({"metric": {"__name__": name, **labels}, "values": vals})
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return {"path": str(path), "series": len(result), "start": float(t[0]),
            "end": float(t[-1] + sim.spec.cadence_s), "nodes": nodes}


__all__ = ["write_ledger", "write_prometheus_export", "scheduler_records", "SKUS"]
