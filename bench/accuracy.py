"""Accuracy of the agents: per injected cause, recall and GPU-hours error, over many seeds, on two sets
(``python -m bench.accuracy``); writes ``## Accuracy`` in docs/performance.md.

- ``independent``: the physically modelled faults of :mod:`bench.scenario` (which imports nothing from the method or
  the agents), each seed a 64-GPU, 24-hour dcgm-exporter export analysed as a prospect would (``ipledger analyze``);
  scoring in :mod:`bench.scenario_score`.
- ``demo``: the demo hall over two fleet sizes; scoring in :mod:`ledger.sim.score` (its truth shares the method's
  bucket formulas, so it checks scope and window, not physics).

High-confidence (>= 0.7) findings on healthy devices are counted for both.
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


def run_independent(seeds: list[int]) -> tuple[list[dict], dict]:
    """Each seed: generate, write the export, analyze it through the same call as ``ipledger analyze``, score."""
    from bench.scenario import generate, write_export
    from bench.scenario_score import findings_of, score
    from ledger.agents.export_analysis import analyze_collected, read_source

    rows, totals = [], {}
    for seed in seeds:
        t0 = time.monotonic()
        sc = generate(seed)
        with tempfile.TemporaryDirectory(prefix="ipledger-acc-") as tmp:
            path = write_export(sc, Path(tmp) / "export.json")
            found = findings_of(analyze_collected(read_source("prometheus", [str(path)])).to_json())
        scores, false = score(sc.truth(), found)
        for s in scores:
            t = totals.setdefault(s.cause, {"faults": 0, "found": 0, "errs": [], "truth_h": 0.0, "abs": 0.0})
            t["abs"] = max(t["abs"], abs(s.found_h - s.truth_h))
            t["faults"] += 1
            t["found"] += s.found
            t["truth_h"] += s.truth_h
            if s.error is not None:
                t["errs"].append(s.error)
        rows.append({"seed": seed, "devices": len(sc.uuids), "false": len(false),
                     "false_kinds": sorted({f["kind"] for f in false}), "seconds": round(time.monotonic() - t0, 1)})
        missed = [s.cause for s in scores if not s.found]
        worst = max(scores, key=lambda s: s.error or 0)
        print(f"  independent seed {seed}: recall {sum(s.found for s in scores)}/{len(scores)}"
              f"{' missed ' + ','.join(missed) if missed else ''}; worst GPU-h error {worst.cause} "
              f"{100 * (worst.error or 0):.1f} % ({worst.found_h:.2f} vs {worst.truth_h:.2f}); false findings on "
              f"healthy devices {len(false)} {rows[-1]['false_kinds']}; {rows[-1]['seconds']} s", file=sys.stderr)
    return rows, totals


def independent_table(rows: list[dict], totals: dict) -> str:
    from bench.scenario_score import ERR_FLOOR_H

    lines = ["| fault (physically modelled) | faults | recall | true GPU-h (mean) | GPU-h error (mean) | "
             "GPU-h error (max) | largest miss (GPU-h) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cause, t in sorted(totals.items()):
        errs = t["errs"]
        err = (f"{100 * sum(errs) / len(errs):.2f} % | {100 * max(errs):.2f} %" if errs else "n/a (no GPU-hours) | n/a")
        lines.append(f"| {cause} | {t['faults']} | {t['found'] / t['faults']:.3f} | {t['truth_h'] / t['faults']:.2f} | "
                     f"{err} | {t['abs']:.3f} |")
    found = sum(t["found"] for t in totals.values())
    faults = sum(t["faults"] for t in totals.values())
    return "\n".join(lines) + (f"\n\nSeeds {[r['seed'] for r in rows]} ({len(rows)} exports of "
                               f"{rows[0]['devices'] if rows else 0} GPUs x 24 h at 30 s): recall {found}/{faults} = "
                               f"{found / max(faults, 1):.1%}; findings with confidence >= 0.7 on healthy devices: "
                               f"{sum(r['false'] for r in rows)}; {sum(r['seconds'] for r in rows):.0f} s in all. The error is "
                               f"relative to the truth (to {ERR_FLOOR_H} GPU-h where the truth is smaller).")


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


INDEPENDENT_NOTE = (
    "Each seed draws a 64-GPU hall (8 nodes x 8 H100) with one of each fault placed at random: a node's inlet "
    "temperature and thermal resistance raised (cooling; in some seeds two or three nodes at once), one GPU of "
    "eight under a lowered power limit, one GPU of a 4-GPU job idle but held for hours, a data-loader job stalling every ~20 minutes and a job stalling at hourly "
    "checkpoints, a GPU whose sustainable clock slides 6-10 %, a GPU whose correctable-ECC rate doubles every 1-2 h, "
    "an XID 79 followed by hours of silence, and a collector outage; clocks, power and temperature follow from a "
    "power and thermal model, and the truth from the injected parameters (`bench/scenario.py`, which imports "
    "nothing from the method or the agents). Healthy devices beside them carry noise (three 4x noisier), a trickle "
    "of correctable ECC errors on a quarter of them, and diurnal inlet drift. Scoring: `bench/scenario_score.py`.")
DEMO_NOTE = (
    "Read these figures for what they are: the demo simulator computes its truth with the same per-sample bucket "
    "formulas as the method, so this GPU-hours error measures whether the agents put the right samples under the "
    "right cause, scope (device / node / rack / job) and window - not whether the method's physics is right. The "
    "hall includes decoys the agents must not flag (4x-noisier healthy devices, workload heat, 0.2 % missed "
    "scrapes) and a node-scope cooling fault beside the rack one.")


def _subsection(old: str, title: str, body: str) -> str:
    """``old`` with the ``### title`` subsection of ``## Accuracy`` replaced by (or given) ``body``."""
    sec = re.search(r"^## Accuracy\n.*?(?=^## |\Z)", old, flags=re.M | re.S)
    if sec is None:
        old = old.rstrip("\n") + "\n\n## Accuracy\n\nMeasured by `python -m bench.accuracy`.\n"
        sec = re.search(r"^## Accuracy\n.*?(?=^## |\Z)", old, flags=re.M | re.S)
    text = sec.group(0)
    block = f"### {title}\n\n{body.strip()}\n\n"
    pat = re.compile(rf"^### {re.escape(title)}\n.*?(?=^### |\Z)", flags=re.M | re.S)
    if pat.search(text):
        text = pat.sub(lambda _m: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    return old[:sec.start()] + text + old[sec.end():]


def write_doc(parts: dict[str, str], path: Path = PERF_DOC) -> None:
    """``parts``: subsection title -> body; the others already in the doc stay as they were."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    new = path.read_text() if path.exists() else "# Performance\n"
    for title, body in parts.items():
        new = _subsection(new, title, f"Measured on {stamp}.\n\n{body}")
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="independent,demo", help="comma list of independent,demo")
    ap.add_argument("--seeds", type=int, default=10, help="independent generator seeds (0..N-1), at least 10 for the doc")
    ap.add_argument("--demo-seeds", type=int, default=5, help="demo hall seeds (0..N-1)")
    ap.add_argument("--sizes", default="small,default", help="demo hall sizes: comma list of small,default")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not update docs/performance.md")
    a = ap.parse_args(argv)
    parts = {}
    sets = a.sets.split(",")
    if "independent" in sets:
        rows, totals = run_independent(list(range(a.seeds)))
        parts["Independent generator (physically modelled faults)"] = \
            independent_table(rows, totals) + "\n\n" + INDEPENDENT_NOTE
    if "demo" in sets:
        rows, totals = run(list(range(a.demo_seeds)), a.sizes.split(","))
        parts["Demo hall"] = table(rows, totals) + "\n\n" + DEMO_NOTE
    for title, body in parts.items():
        print(f"### {title}\n\n{body}\n")
    if not a.no_doc:
        write_doc(parts)
        print(f"wrote ## Accuracy in {PERF_DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
