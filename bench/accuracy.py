"""Accuracy of the agents on the demo hall: per injected cause, recall, precision and GPU-hours error, over
several seeds and two fleet sizes (``python -m bench.accuracy``). Writes ``## Accuracy`` in docs/performance.md.

Scoring rules are in :mod:`ledger.sim.score`. Healthy-device false alarms (confidence >= 0.7) are counted too.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERF_DOC = ROOT / "docs" / "performance.md"


def run(seeds: list[int], sizes: list[str]) -> tuple[list[dict], dict]:
    from ledger.demo import build_hall
    from ledger.sim import FleetSpec
    from ledger.sim.score import false_alarms_on_healthy, score

    rows, totals = [], {}
    for size in sizes:
        spec = FleetSpec.small() if size == "small" else FleetSpec()
        for seed in seeds:
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="ipledger-acc-") as tmp:
                hall = build_hall(Path(tmp), seed, spec)
                found = [f.to_json() for f in hall.analysis.findings]
                truth = hall.sim.truth
                hall.engine.dispose()
            sc = score(truth, found)
            fa = false_alarms_on_healthy(truth, found)
            rows.append({"size": size, "seed": seed, "devices": len(hall.sim.devices), "false_alarms": len(fa),
                         "seconds": round(time.monotonic() - t0, 1)})
            for cause, s in sc.items():
                t = totals.setdefault(cause, {"faults": 0, "found": 0, "findings": 0, "true": 0, "errs": []})
                t["faults"] += s.faults
                t["found"] += s.found
                t["findings"] += s.findings
                t["true"] += s.true_findings
                t["errs"].append(s.hours_error)
            print(f"  {size:7s} seed {seed}: {len(hall.sim.devices)} GPUs, "
                  f"recall {sum(s.found for s in sc.values())}/{sum(s.faults for s in sc.values())}, "
                  f"false alarms on healthy devices {len(fa)}, {rows[-1]['seconds']} s", file=sys.stderr)
    return rows, totals


def table(rows: list[dict], totals: dict) -> str:
    lines = ["| cause | faults | recall | precision | GPU-h error (mean) | GPU-h error (max) |",
             "|---|---:|---:|---:|---:|---:|"]
    for cause, t in sorted(totals.items()):
        rec = t["found"] / t["faults"] if t["faults"] else 1.0
        prec = t["true"] / t["findings"] if t["findings"] else 1.0
        errs = t["errs"]
        lines.append(f"| {cause} | {t['faults']} | {rec:.3f} | {prec:.3f} | {100 * sum(errs) / len(errs):.2f} % | "
                     f"{100 * max(errs):.2f} % |")
    fa = sum(r["false_alarms"] for r in rows)
    runs = ", ".join(sorted({f"{r['size']} ({r['devices']} GPUs)" for r in rows}))
    seeds = sorted({r["seed"] for r in rows})
    return "\n".join(lines) + (f"\n\nHalls: {runs}; seeds {seeds}; {len(rows)} runs. High-confidence (>= 0.7) "
                               f"findings on healthy devices: {fa}.")


def write_doc(text: str, path: Path = PERF_DOC) -> None:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"## Accuracy\n\nMeasured by `python -m bench.accuracy` on {stamp}: the agents' findings on the demo "
               f"hall scored against its ground truth (rules: `ledger/sim/score.py`, docs/agents.md, docs/demo.md)."
               f"\n\n{text}\n\nRead these figures for what they are: the simulator computes its truth with the same "
               f"per-sample bucket formulas as the method, so the GPU-hours error measures whether the agents put the "
               f"right samples under the right cause, scope (device / node / rack / job) and window - not whether the "
               f"method's physics is right. The hall includes decoys the agents must not flag (4x-noisier healthy "
               f"devices, workload heat, 0.2 % missed scrapes) and a node-scope cooling fault beside the rack one.\n")
    old = path.read_text() if path.exists() else "# Performance\n"
    if re.search(r"^## Accuracy\n", old, flags=re.M):
        new = re.sub(r"^## Accuracy\n.*?(?=^## |\Z)", section + "\n", old, flags=re.M | re.S)
    else:
        new = old.rstrip("\n") + "\n\n" + section
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (0..N-1), at least 5 for the doc")
    ap.add_argument("--sizes", default="small,default", help="comma list of small,default")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not update docs/performance.md")
    a = ap.parse_args(argv)
    rows, totals = run(list(range(a.seeds)), a.sizes.split(","))
    text = table(rows, totals)
    print(text)
    if not a.no_doc:
        write_doc(text)
        print(f"wrote ## Accuracy in {PERF_DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
