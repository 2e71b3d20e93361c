"""Synthetic receipts in the docs/receipts.md shape, for tests, the benchmark (a million receipts) and demos.

Each receipt obeys the accounting identity (paid = delivered + throttled + underutilized + starved +
idle_held + unknown) and prices hours at a per-tenant rate, so reconciliations can be checked exactly.
Deterministic for a given seed.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Iterator

TENANTS = ("astro", "bio", "climate", "vision")
PARTITIONS = (("gpu", "normal"), ("gpu", "high"), ("debug", "normal"))
SKUS = ("H100-SXM5-80GB", "MI300X")
RATE = {"astro": 2.10, "bio": 2.45, "climate": 1.95, "vision": 2.80}
CAUSES = ("dcgm_host_engine_restart", "collector_down", "epilog_missing")


def _ts(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def receipt(job_id: int, *, tenant: str, start: float, hours: float, n_devices: int = 2, run: int = 0,
            partition: str = "gpu", qos: str = "normal", sku: str = "H100-SXM5-80GB", rate: float = 2.0,
            shares: dict | None = None, unknown_resolved: bool | None = None, adjustments: list | None = None,
            cluster: str = "hpc1", user: str = "alice", node: str | None = None, currency: str = "EUR") -> dict:
    """One receipt; ``shares`` split paid hours into buckets (the rest is delivered)."""
    paid = hours * n_devices
    shares = shares or {}
    th = {c: round(paid * shares.get(c, 0.0), 6) for c in ("thermal", "power_cap", "hw_slowdown", "sync_boost",
                                                            "other")}
    b = {k: round(paid * shares.get(k, 0.0), 6) for k in ("underutilized", "starved", "idle_held", "unknown")}
    delivered = round(paid - sum(th.values()) - sum(b.values()), 6)
    node = node or f"gpu-{job_id % 7:02d}"
    devices = [{"uuid": f"GPU-{job_id}-{i}", "node": node, "index": i, "sku": sku} for i in range(n_devices)]
    end = start + hours * 3600.0
    ivs = []
    if b["unknown"] > 0:
        gap = b["unknown"] / n_devices * 3600.0
        ivs.append({"id": f"gap-{job_id}-{run}", "device": None, "start": _ts(end - gap), "end": _ts(end),
                    "cause": CAUSES[job_id % len(CAUSES)],
                    "resolution": None if not unknown_resolved else {"resolution": "credit", "policy": "credit"}})
    cost_paid = round(paid * rate, 2)
    cost_delivered = round(delivered * rate, 2)
    return {"receipt_version": "synthetic", "receipt_hash": f"sha256:{job_id:08d}{run:02d}{hash((paid, rate, len(adjustments or []), unknown_resolved)) & 0xffffffff:08x}",
            "job": {"cluster": cluster, "job_id": str(job_id), "run": run, "account": tenant, "user": user,
                    "partition": partition, "qos": qos, "devices": devices},
            "window": {"start": _ts(start), "end": _ts(end)},
            "contract": {"id": "c-demo", "version": "1"}, "method": {"name": "ipledger-method", "version": "1"},
            "gpu_hours": {"paid": paid, "delivered": delivered, **b, "suspended": 0.0, "throttled": th},
            "cost": {"currency": currency, "paid": cost_paid, "delivered": cost_delivered,
                     "lost": round(cost_paid - cost_delivered, 2)},
            "unknown_intervals": ivs, "adjustments": list(adjustments or []),
            "ledger": {"through_seq": job_id, "head_hash": "0" * 64}}


def receipts(n: int, month: str = "2026-11", seed: int = 0) -> Iterator[dict]:
    """``n`` receipts whose windows end inside ``month`` (UTC)."""
    rng = random.Random(seed)
    y, m = (int(x) for x in month.split("-"))
    base = dt.datetime(y, m, 1, tzinfo=dt.timezone.utc).timestamp()
    for j in range(n):
        tenant = TENANTS[j % len(TENANTS)]
        part, qos = PARTITIONS[j % len(PARTITIONS)]
        hours = rng.choice((0.5, 1.0, 2.0, 6.0, 24.0))
        start = base + rng.uniform(0, 26 * 86400)
        sh = {"thermal": rng.choice((0.0, 0.02, 0.1)), "underutilized": rng.uniform(0, 0.2),
              "starved": rng.uniform(0, 0.05), "idle_held": rng.choice((0.0, 0.1)),
              "unknown": rng.choice((0.0, 0.0, 0.05))}
        yield receipt(100000 + j, tenant=tenant, start=start, hours=hours, n_devices=rng.choice((1, 2, 4, 8)),
                      partition=part, qos=qos, sku=SKUS[j % 2], rate=RATE[tenant], shares=sh,
                      unknown_resolved=bool(j % 2), user=f"user{j % 13}")


def analysis(n_devices: int = 4, start: str = "2026-11-10T00:00:00Z", seed: int = 0) -> dict:
    """A export analysis (Findings JSON plus context) for a 24-hour export: one thermal finding with its
    timelines, an idle-held finding with before/during/after contrasts, a gap, a recommendation."""
    rng = random.Random(seed)
    t0 = dt.datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp()
    devices = [{"uuid": f"GPU-{i:04x}-prospect", "node": f"node{i // 2}", "index": i % 2, "sku": "H100-SXM5-80GB",
                "vendor": "nvidia", "samples": 1440, "coverage": 1.0 if i else 0.95} for i in range(n_devices)]
    f0, f1 = t0 + 10 * 3600, t0 + 13 * 3600
    clock = [[t0 + m * 60, 1980 if not (f0 <= t0 + m * 60 < f1) else 1410 + rng.uniform(-30, 30)]
             for m in range(8 * 60, 16 * 60)]
    temp = [[t0 + m * 60, 62 + rng.uniform(-2, 2) if not (f0 <= t0 + m * 60 < f1) else 87 + rng.uniform(-1, 1)]
            for m in range(8 * 60, 16 * 60)]
    by_cause = {"thermal": 1.1, "idle_held": 6.0, "underutilized": 9.5, "starved": 0.8, "unknown": 1.2,
                "power_cap": 0.0}
    paid = 24.0 * n_devices
    return {
        "title": "Where your GPU-hours went: 24 hours on 4 GPUs",
        "prospect": "Example Lab",
        "generated_at": _ts(t0 + 86400 + 3600),
        "sources": [{"kind": "prometheus", "name": "dcgm-export.json", "sha256": "ab" * 32, "samples": 1440 * n_devices,
                     "start": _ts(t0), "end": _ts(t0 + 86400),
                     "metrics": ["DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP"]}],
        "devices": devices,
        "coverage": {"start": _ts(t0), "end": _ts(t0 + 86400), "fraction": 0.9875,
                     "gaps": [{"device": devices[0]["uuid"], "start": _ts(t0 + 2 * 3600), "end": _ts(t0 + 3.2 * 3600),
                               "cause": "scrape_missing"}]},
        "findings": [
            {"id": "f-thermal-1", "agent": "attribution", "kind": "thermal_throttle",
             "scope": {"node": "node0", "device_uuid": devices[1]["uuid"], "rack": None},
             "start": _ts(f0), "end": _ts(f1), "gpu_hours": 1.1, "cost": 2.31, "confidence": 0.86,
             "summary": "GPU 1 on node0 ran 29% below its rated clock for 3 hours while at 87 C: cooling, not load.",
             "evidence": [{"signal": "sm_clock", "unit": "MHz", "points": clock},
                          {"signal": "gpu_temp", "unit": "C", "points": temp}],
             "recommendation": {"action": "Check airflow on node0 (rack inlet temperature, fan curve)",
                                "command": "ipmitool -H node0-bmc sdr type Fan   # read-only check",
                                "gpu_hours": 1.1, "cost": 2.31, "reversible": True}},
            {"id": "f-idle-1", "agent": "attribution", "kind": "idle_held",
             "scope": {"node": "node1", "device_uuid": devices[2]["uuid"]},
             "start": _ts(t0 + 18 * 3600), "end": _ts(t0 + 24 * 3600), "gpu_hours": 6.0, "cost": 12.6,
             "confidence": 0.95, "summary": "GPU 2 was held for 6 hours with no process on it.",
             "evidence": [{"signal": "sm_active", "unit": "%", "before": 71.0, "during": 0.0, "after": None},
                          "no compute process on the device during the whole span"]},
        ],
        "account": {"paid": paid, "delivered": round(paid - sum(by_cause.values()), 6), "by_cause": by_cause,
                    "currency": "EUR", "cost": {"paid": round(paid * 2.1, 2),
                                                "delivered": round((paid - sum(by_cause.values())) * 2.1, 2),
                                                "lost": round(sum(by_cause.values()) * 2.1, 2)}},
        "recommendations": [{"title": "Release idle allocations after 30 minutes without a process",
                             "gpu_hours": 6.0, "cost": 12.6, "reversible": True,
                             "command": "scontrol update JobId=<id> TimeLimit=...   # operator decides",
                             "finding_ids": ["f-idle-1"]}],
        "method": {"name": "ipledger-method", "version": "1"},
    }
