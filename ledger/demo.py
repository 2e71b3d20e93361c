"""A small end-to-end example: simulated allocations spooled, shipped into an SQLite ledger, verified, receipted.

(The full demo hall, with a simulated fleet and injected faults, replaces this body.)
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from . import db as db_mod
from . import spool, store
from .entries import Kind, make_entry
from .receipts import build_receipt
from .ship import ship
from .verify import verify


def run_demo(out: Path, seed: int = 0) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    db_path = out / "ledger.db"
    if db_path.exists():
        db_path.unlink()
    engine = db_mod.make_engine(f"sqlite:///{db_path}")
    db_mod.upgrade(engine)
    base = dt.datetime(2026, 11, 2, 8, tzinfo=dt.timezone.utc) + dt.timedelta(hours=seed)
    records = []
    for job in range(3):
        start, end = base + dt.timedelta(hours=job), base + dt.timedelta(hours=job + 2)
        key = dict(cluster="demo", job_id=str(1000 + job), run=0, node="gpu-a01")
        records.append(make_entry(Kind.ALLOCATION_STARTED, start, {"account": f"tenant{job % 2}",
                                  "partition": "gpu", "qos": "normal"}, **key).to_record())
        for idx in range(2):
            records.append(make_entry(Kind.DEVICE_BOUND, start, {"index": idx, "sku": "H100-SXM5-80GB"},
                                      device=f"GPU-demo-{job}-{idx}", **key).to_record())
        records.append(make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": 0}, **key).to_record())
    spool.write(out / "spool", records)
    shipped = ship(engine, out / "spool")
    report = verify(engine)
    entries = list(store.iter_entries(engine))
    receipt = build_receipt(entries, "1000")
    (out / "receipt-1000.json").write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    engine.dispose()
    return {"out": str(out), "ledger": str(db_path), "entries": shipped.appended, "verified": report.ok,
            "receipt": str(out / "receipt-1000.json")}
