"""Receipts: a pure function of (entries through seq N, contract version, method version).

This first version accounts the window and paid GPU-hours from allocation and binding entries; the full
method (docs/method.md) fills the buckets.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..canonical import canonical_json, sha256_hex, ts_to_epoch
from ..entries import ChainedEntry, Kind

RECEIPT_VERSION = "0.1"


class ReceiptError(LookupError):
    pass


def runs_of(entries: Iterable[ChainedEntry], job_id: str) -> dict[tuple[str | None, int], list[ChainedEntry]]:
    runs: dict[tuple[str | None, int], list[ChainedEntry]] = defaultdict(list)
    for ce in entries:
        if ce.entry.job_id == job_id:
            runs[(ce.entry.cluster, ce.entry.run or 0)].append(ce)
    return runs


def build_receipt(entries: list[ChainedEntry], job_id: str, run: int | None = None) -> dict:
    runs = runs_of(entries, job_id)
    if not runs:
        raise ReceiptError(f"job {job_id}: no entries in the ledger")
    key = max(runs, key=lambda k: k[1]) if run is None else next((k for k in runs if k[1] == run), None)
    if key is None:
        raise ReceiptError(f"job {job_id}: no run {run} (runs: {sorted(k[1] for k in runs)})")
    mine = runs[key]
    start = next((c for c in mine if c.entry.kind == Kind.ALLOCATION_STARTED), None)
    end = next((c for c in mine if c.entry.kind == Kind.ALLOCATION_ENDED), None)
    devices = [dict(c.entry.data, uuid=c.entry.device, node=c.entry.node) for c in mine
               if c.entry.kind == Kind.DEVICE_BOUND]
    ctx = start.entry.data if start else {}
    window_start = start.entry.ts if start else None
    window_end = end.entry.ts if end else None
    hours = 0.0
    if window_start and window_end:
        hours = (ts_to_epoch(window_end) - ts_to_epoch(window_start)) / 3600.0 * max(len(devices), 1)
    through = max(c.seq for c in entries)
    head = next(c.hash for c in entries if c.seq == through)
    body = {
        "receipt_version": RECEIPT_VERSION,
        "job": {"cluster": key[0], "job_id": job_id, "run": key[1], "account": ctx.get("account"),
                "partition": ctx.get("partition"), "qos": ctx.get("qos"),
                "devices": [{"uuid": d.get("uuid"), "node": d.get("node"), "index": d.get("index"),
                             "sku": d.get("sku")} for d in devices]},
        "window": {"start": window_start, "end": window_end},
        "gpu_hours": {"paid": hours},
        "ledger": {"through_seq": through, "head_hash": head},
    }
    body["receipt_hash"] = "sha256:" + sha256_hex(canonical_json(body))
    return body
