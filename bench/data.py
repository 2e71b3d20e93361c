"""Deterministic generated data for the benchmarks: spooled entries shaped like real epilog shipments.

One spool file per job run (what one epilog writes): allocation_started, one device_bound and one
telemetry_summary per GPU, now and then an unknown_interval, and allocation_ended. Same seed, same bytes.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Iterator

from ledger.chain.canonical import format_ts
from ledger.chain.entries import chain_hash, entry_from_record, GENESIS_HASH

BASE_TS = 1_780_000_000  # 2026-05-28, a fixed instant
GPUS_PER_JOB = 8


def job_records(rng: random.Random, job: int) -> list[dict]:
    """The records one epilog spools for one job run (dicts as spool.write writes them)."""
    start = BASE_TS + job * 37
    end = start + rng.randint(600, 86_400)
    node = f"gpu-node-{job % 512:04d}"
    common = {"cluster": "hpc1", "job_id": str(1_000_000 + job), "run": 0, "node": node,
              "source": "slurm-epilog", "source_version": "1", "recorded_at": format_ts(end + 2)}
    recs = [{**common, "kind": "allocation_started", "ts": format_ts(start), "ts_end": None, "device": None,
             "payload": json.dumps({"account": f"acct{job % 40}", "user": f"u{job % 300}", "partition": "gpu",
                                    "qos": "normal", "nodes": [node], "gpus": GPUS_PER_JOB,
                                    "tres": "cpu=64,mem=512G,gres/gpu=8"})}]
    for i in range(GPUS_PER_JOB):
        uuid = f"GPU-{job % 512:08x}-{i:04x}-4a1b-9c2d-{(job * 8 + i) % 4096:012x}"
        recs.append({**common, "kind": "device_bound", "ts": format_ts(start), "ts_end": None, "device": uuid,
                     "payload": json.dumps({"index": i, "uuid": uuid, "sku": "NVIDIA H100 80GB HBM3",
                                            "vendor": "nvidia", "node": node})})
        stats = {"source": "dcgm_job_stats", "energy_j": round(rng.uniform(1e6, 5e7), 1),
                 "sm_active_avg": round(rng.random(), 4), "sm_clock_avg_mhz": rng.randint(1100, 1980),
                 "mem_clock_avg_mhz": 2619, "power_avg_w": round(rng.uniform(90, 700), 2),
                 "temp_max_c": rng.randint(40, 90), "ecc_sbe": rng.randint(0, 3), "ecc_dbe": 0,
                 "xid_count": rng.choice([0, 0, 0, 1]), "throttle_thermal_us": rng.randint(0, 10**9),
                 "throttle_power_us": rng.randint(0, 10**9), "pcie_replays": 0, "max_gpu_memory_used": 81559,
                 "missing": {"sync_boost_us": "Not Supported"} if rng.random() < 0.2 else {}}
        recs.append({**common, "kind": "telemetry_summary", "ts": format_ts(start), "ts_end": format_ts(end),
                     "device": uuid, "payload": json.dumps(stats)})
        if rng.random() < 0.05:
            gs = start + rng.randint(0, end - start - 60)
            recs.append({**common, "kind": "unknown_interval", "ts": format_ts(gs), "ts_end": format_ts(gs + 45),
                         "device": uuid, "payload": json.dumps({"cause": "dcgm_host_engine_restart",
                                                                "scope": "device", "detail": "restart"})})
    recs.append({**common, "kind": "allocation_ended", "ts": format_ts(end), "ts_end": None, "device": None,
                 "payload": json.dumps({"exit_code": 0, "state": "COMPLETED"})})
    return recs


def iter_jobs(n_entries: int, seed: int = 8) -> Iterator[list[dict]]:
    """Job runs until ``n_entries`` records have been produced (the last job is cut to fit exactly)."""
    rng = random.Random(seed)
    made = 0
    job = 0
    while made < n_entries:
        recs = job_records(rng, job)[: n_entries - made]
        made += len(recs)
        job += 1
        yield recs


def write_spool(directory: Path, n_entries: int, seed: int = 8) -> int:
    """Write the spool files a fleet's epilogs would leave (plain writes: durability is not what is timed)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    files = 0
    for i, recs in enumerate(iter_jobs(n_entries, seed)):
        data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in recs)
        (directory / f"entries-{i:012d}-bench.jsonl").write_text(data, encoding="utf-8")
        files += 1
    return files


def chained_rows(n_entries: int, seed: int = 8) -> Iterator[tuple]:
    """The rows the ledger holds after shipping that spool into an empty ledger (seq, ids, hashes)."""
    seq, prev = 0, GENESIS_HASH
    seen: set[str] = set()
    for recs in iter_jobs(n_entries, seed):
        for rec in recs:
            e = entry_from_record(rec)
            if e.entry_id in seen:
                continue
            seen.add(e.entry_id)
            seq += 1
            h = chain_hash(seq, e, prev)
            yield (seq, e.entry_id, e.kind, e.ts, e.ts_end, e.recorded_at, e.cluster, e.job_id, e.run, e.node,
                   e.device, e.payload, e.source, e.source_version, prev, h)
            prev = h
