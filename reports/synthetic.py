"""Synthetic receipts in the DESIGN.md §6 shape, for tests, the benchmark (a million receipts) and demos.

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
