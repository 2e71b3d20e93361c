"""Accuracy of the agents: per injected cause, recall and GPU-hours error, over many seeds, on three sets
(``python -m bench.accuracy``); writes ``## Accuracy`` in docs/performance.md and ``## Calibration`` in
docs/agents.md.

- ``independent`` (**tune on**): the physically modelled faults of :mod:`bench.scenario` (which imports nothing from
  the method or the agents), each seed a 64-GPU, 24-hour dcgm-exporter export analysed as a prospect would
  (``ipledger analyze``); scoring in :mod:`bench.scenario_score`. The agents' thresholds were set against it.
- ``captures`` (**report on**): :mod:`bench.capture_fleet`, a second generator written apart from the first (a
  mixed A100 / H100 / MI300X fleet sent as per-node dmon and amd-smi capture files, its own fault physics, capture
  restarts); scoring and the per-finding verdicts in :mod:`bench.capture_fleet_score`. No threshold was ever set
  on it: it is where the calibration table (how often a finding at a given confidence is right) is measured.
- ``demo``: the demo hall over two fleet sizes; scoring in :mod:`ledger.sim.score` (its truth shares the method's
  bucket formulas, so it checks scope and window, not physics).

High-confidence (>= 0.7) findings that are wrong (on healthy devices; on the report-on set, any finding that
states no injected fault) are counted for every set.
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
AGENTS_DOC = ROOT / "docs" / "agents.md"
CAPTURE_TITLE = "Report-on generator (capture set, held apart)"


def run_independent(seeds: list[int]) -> tuple[list[dict], dict]:
    """Each seed: generate, write the export, analyze it through the same call as ``ipledger analyze``, score."""
    from bench.scenario import generate, write_export
    from bench.scenario_score import FALSE_MIN_CONF, findings_of, score, wrong_confident
    from ledger.agents.export_analysis import analyze_collected, read_source

    rows, totals = [], {}
    for seed in seeds:
        t0 = time.monotonic()
        sc = generate(seed)
        with tempfile.TemporaryDirectory(prefix="ipledger-acc-") as tmp:
            path = write_export(sc, Path(tmp) / "export.json")
            found = findings_of(analyze_collected(read_source("prometheus", [str(path)])).to_json())
        scores, false = score(sc.truth(), found)
        wrong = wrong_confident(sc.truth(), found)
        for s in scores:
            t = totals.setdefault(s.cause, {"faults": 0, "found": 0, "errs": [], "truth_h": 0.0, "abs": 0.0})
            t["abs"] = max(t["abs"], abs(s.found_h - s.truth_h))
            t["faults"] += 1
            t["found"] += s.found
            t["truth_h"] += s.truth_h
            if s.error is not None:
                t["errs"].append(s.error)
        rows.append({"seed": seed, "devices": len(sc.truth()["devices"]), "false": len(false),
                     "false_kinds": sorted({f["kind"] for f in false}), "seconds": round(time.monotonic() - t0, 1),
                     "confident": sum(f["confidence"] >= FALSE_MIN_CONF for f in found), "wrong": len(wrong),
                     "wrong_kinds": sorted({f["kind"] for f in wrong})})
        missed = [s.cause for s in scores if not s.found]
        worst = max(scores, key=lambda s: s.error or 0)
        print(f"  independent seed {seed}: recall {sum(s.found for s in scores)}/{len(scores)}"
              f"{' missed ' + ','.join(missed) if missed else ''}; worst GPU-h error {worst.cause} "
              f"{100 * (worst.error or 0):.1f} % ({worst.found_h:.2f} vs {worst.truth_h:.2f}); false findings on "
              f"healthy devices {len(false)} {rows[-1]['false_kinds']}; confident findings stating no fault "
              f"{len(wrong)}/{rows[-1]['confident']} {rows[-1]['wrong_kinds']}; {rows[-1]['seconds']} s",
              file=sys.stderr)
    return rows, totals


def fault_rows(heading: str, totals: dict, digits: int) -> list[str]:
    """The per-fault table: recall, mean truth, GPU-hours error (mean, max) and the largest miss."""
    lines = [f"| {heading} | faults | recall | true GPU-h (mean) | GPU-h error (mean) | "
             "GPU-h error (max) | largest miss (GPU-h) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cause, t in sorted(totals.items()):
        errs = t["errs"]
        err = (f"{100 * sum(errs) / len(errs):.{digits - 1}f} % | {100 * max(errs):.{digits - 1}f} %" if errs
               else "n/a (no GPU-hours) | n/a")
        lines.append(f"| {cause} | {t['faults']} | {t['found'] / t['faults']:.{digits}f} | "
                     f"{t['truth_h'] / t['faults']:.2f} | {err} | {t['abs']:.{digits}f} |")
    return lines


def independent_table(rows: list[dict], totals: dict) -> str:
    from bench.scenario_score import ERR_FLOOR_H

    lines = fault_rows("fault (physically modelled)", totals, digits=3)
    found = sum(t["found"] for t in totals.values())
    faults = sum(t["faults"] for t in totals.values())
    conf = sum(r["confident"] for r in rows)
    right = conf - sum(r["wrong"] for r in rows)
    kinds = sorted({k for r in rows for k in r["wrong_kinds"]})
    return "\n".join(lines) + (f"\n\nSeeds {[r['seed'] for r in rows]} ({len(rows)} exports of "
                               f"{rows[0]['devices'] if rows else 0} GPUs x 24 h at 30 s): recall {found}/{faults} = "
                               f"{found / max(faults, 1):.1%}; findings with confidence >= 0.7 on healthy devices: "
                               f"{sum(r['false'] for r in rows)}; findings at >= 0.7 that state an injected fault: "
                               f"{right} of {conf} = {right / max(conf, 1):.0%} (wrong: {', '.join(kinds) or 'none'}); "
                               f"{sum(r['seconds'] for r in rows):.0f} s in all. The error is "
                               f"relative to the truth (to {ERR_FLOOR_H} GPU-h where the truth is smaller).")


def run_captures(seeds: list[int], hours: float = 24.0) -> tuple[list[dict], dict, list]:
    """The report-on set: each seed a capture set (dmon and amd-smi files, restarts included), analysed through
    the same calls as ``ipledger analyze DIR``; per fault its score, per finding its verdict."""
    from bench.capture_fleet import generate, write_captures
    from bench.capture_fleet_score import false_alarms, findings_of, score
    from ledger.agents.export_analysis import analyze_collected
    from ledger.importers.exports import read_source

    rows, totals, verdicts = [], {}, []
    for seed in seeds:
        t0 = time.monotonic()
        fl = generate(seed, hours=hours)
        with tempfile.TemporaryDirectory(prefix="ipledger-acc-cap-") as tmp:
            write_captures(fl, Path(tmp) / "captures")
            found = findings_of(analyze_collected(read_source(None, [str(Path(tmp) / "captures")]),
                                                  consume=True).to_json())
        scores, v = score(fl.truth(), found, fl.unallocated_between)
        verdicts += v
        for s in scores:
            t = totals.setdefault(s.cause, {"faults": 0, "found": 0, "errs": [], "truth_h": 0.0, "abs": 0.0})
            t["faults"] += 1
            t["found"] += s.found
            if s.truth_h is not None:
                t["truth_h"] += s.truth_h
                t["abs"] = max(t["abs"], abs(s.found_h - s.truth_h))
            if s.error is not None:
                t["errs"].append(s.error)
        fa = false_alarms(v)
        rows.append({"seed": seed, "devices": len(fl.truth()["devices"]), "false": len(fa),
                     "false_kinds": sorted({x.kind for x in fa}), "seconds": round(time.monotonic() - t0, 1)})
        missed = [s.cause for s in scores if not s.found]
        print(f"  report-on seed {seed}: recall {sum(s.found for s in scores)}/{len(scores)}"
              f"{' missed ' + ','.join(missed) if missed else ''}; false alarms >= 0.7: {len(fa)} "
              f"{rows[-1]['false_kinds']}; {rows[-1]['seconds']} s", file=sys.stderr)
    return rows, totals, verdicts


def capture_table(rows: list[dict], totals: dict, hours: float = 24.0) -> str:
    from bench.capture_fleet_score import ERR_FLOOR_H

    lines = fault_rows("fault (report-on generator)", totals, digits=2)
    found = sum(t["found"] for t in totals.values())
    faults = sum(t["faults"] for t in totals.values())
    kinds = sorted({k for r in rows for k in r["false_kinds"]})
    return "\n".join(lines) + (
        f"\n\nSeeds {[r['seed'] for r in rows]} ({len(rows)} capture sets of {rows[0]['devices'] if rows else 0} GPUs "
        f"x {hours:g} h at 30 s): recall {found}/{faults} = {found / max(faults, 1):.1%}; wrong findings with "
        f"confidence >= 0.7 (false alarms): {sum(r['false'] for r in rows)} ({', '.join(kinds) or 'none'}); "
        f"{sum(r['seconds'] for r in rows):.0f} s in all. The error is relative to the truth (to {ERR_FLOOR_H} "
        f"GPU-h where the truth is smaller).")


KIND_RULES = {   # per finding kind: its rule and its evidence in a few words (docs/agents.md has them in full)
    "hot_because_cooling": ("hotter than its own normal at the same power and than its siblings / the other nodes "
                            "that hour; node: >= 60 % of a rack's nodes (rack), the node alone with >= half its GPUs hot "
                            "(node), one GPU at its siblings' power (device)", "temperature residual at the same power, power under "
                            "load against the reference, thermal-bit share"),
    "hot_because_working": ("thermal throttling at temperatures normal for the power (own line), >= 0.25 GPU-h on "
                            "a device or over a run's devices", "power and activity under load, residual near 0"),
    "power_cap": ("SW power-cap bit on >= 50 % of loaded samples per hour (node, or one device >= 0.25 GPU-h)",
                  "cap-bit share, power p95, clock against rated"),
    "hw_slowdown": ("HW slowdown / brake bits: >= 0.05 GPU-h over >= half a node's GPUs (node), else >= 0.25 "
                    "GPU-h on one device", "bit share, clock and power under load"),
    "sync_boost": ("sync-boost bit >= 0.25 GPU-h over a node; the slowest member named", "slowest member's clock "
                   "against the others'"),
    "starved": ("resident process, activity < 0.05, >= 0.5 GPU-h after start-up (memory filling)",
                "activity, power, framebuffer, progress marks"),
    "idle_held": ("no process >= 1 GPU-h and >= 10 % of the run (or >= 2 GPU-h)", "processes, activity, power"),
    "unallocated": ("no process, no job label", "processes, activity, power"),
    "sibling_divergence": ("loaded clock >= max(3 %, 5 sigma) under the node's for >= 2 bins", "clock deficit"),
    "ecc_drift": ("correctable ECC accelerating against siblings (volatile or aggregate counter)",
                  "errors per day / hour against siblings"),
    "xid": ("an XID event; the stall and the silence after it", "XID code, hours silent after it"),
    "unknown_gap": ("an unknown interval (capture restarted, collector down) or an allocated span without samples",
                    "the gap's span and devices"),
    "busy_not_computing": ("SM active >= 0.5 with tensor and every measured FP pipe < 5 % and DRAM < 0.3 for >= half "
                           "of each device-hour, >= 2 h, >= 1 GPU-h delivered (the tenant's loss, no loss line)",
                           "SM, tensor, FP pipes, DRAM before / during / after; tensor GPU-hours"),
    "flops_behind_siblings": ("counted FLOPs per tensor-active hour at rated clock >= 6 % under the median of >= 2 "
                              "siblings on the same run, each hour, >= 2 h", "per-device TFLOP/s, deficit, clock "
                              "ratio against the siblings'"),
}


def calibration_table(verdicts: list, totals: dict | None = None) -> str:
    """How often a finding is right, per confidence bin, on the report-on generator; and per kind at >= 0.7 with
    its rule, its evidence and the recall of the faults it is expected for (``totals``: run_captures')."""
    from bench.capture_fleet_score import EXPECTED, calibration

    lines = ["| confidence | findings | right | right share |", "|---|---:|---:|---:|"]
    for label, n, right in calibration(verdicts):
        lines.append(f"| {label} | {n} | {right} | {right / n:.0%} |" if n else f"| {label} | 0 | 0 | — |")
    high = [v for v in verdicts if v.confidence >= 0.7]
    right = sum(v.right for v in high)
    share = right / len(high) if high else 1.0
    verdict = "met" if share >= 0.9 else "NOT met"
    lines.append("")
    lines.append(f"At confidence ≥ 0.7: {right} of {len(high)} findings right = {share:.0%} (target ≥ 90 %: {verdict}).")
    lines += ["", "| kind | rule | evidence | findings at ≥ 0.7 | right at ≥ 0.7 | all findings: right | "
                  "recall (faults it is expected for) |", "|---|---|---|---:|---:|---:|---|"]
    for kind in sorted({v.kind for v in verdicts} | {k for ks in EXPECTED.values() for k in ks}):
        vs = [v for v in high if v.kind == kind]
        rule, ev = KIND_RULES.get(kind, ("", ""))
        causes = [c for c, ks in EXPECTED.items() if kind in ks and c in (totals or {})]
        rec = ", ".join(f"{c} {totals[c]['found']}/{totals[c]['faults']}" for c in causes) or "—"
        share = f"{sum(v.right for v in vs)} = {sum(v.right for v in vs) / len(vs):.0%}" if vs else "—"
        every = [v for v in verdicts if v.kind == kind]
        alls = f"{sum(v.right for v in every)} of {len(every)}" if every else "—"
        lines.append(f"| `{kind}` | {rule} | {ev} | {len(vs)} | {share} | {alls} | {rec} |")
    return "\n".join(lines)


def run(seeds: list[int], sizes: list[str]) -> tuple[list[dict], dict]:
    from ledger.sim.hall import build_hall
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
    "an XID 79 followed by hours of silence, and a collector outage; and (issue 28) a chassis with less airflow by design (its thermal resistance 1.75-1.95x "
    "all day) running a heavy 4-GPU job (hot because working, the inlet normal), a failing fan on one GPU of a "
    "node nothing else heats (hot at its siblings' power), and a sagging PSU's HW power-brake bursts on every GPU of "
    "a node (a few GPU-minutes each); and (issue 29) every job's pipes with one memory-bound inference job, a "
    "spin-waiting job (3-6 h of SM activity with every pipe idle), and two MI300X nodes scraped by ROCm's "
    "device-metrics-exporter (op counters) with one GPU of a job completing 80-90 % of its siblings' operations "
    "(a slow part); clocks, power and temperature follow from a "
    "power and thermal model, and the truth from the injected parameters (`bench/scenario.py`, which imports "
    "nothing from the method or the agents). Healthy devices beside them carry noise (three 4x noisier), a trickle "
    "of correctable ECC errors on a quarter of them, and diurnal inlet drift. Scoring: `bench/scenario_score.py`.")
CAPTURE_NOTE = (
    "The report-on set: `bench/capture_fleet.py`, written apart from `bench/scenario.py` (it imports nothing from "
    "`ledger` nor from the first generator; a test checks it) and never used to set a threshold. Each seed is a "
    "96-GPU fleet (4 DGX A100 and 4 HGX H100 nodes as per-node `dcgmi dmon` files with the field list "
    "`ipledger pathb-command --format dmon` prints; 4 MI300X nodes as `amd-smi metric --csv -w` loops with the "
    "watch banner, CRLF and the header before every iteration) analysed in one `ipledger analyze DIR`. Its physics: "
    "a DVFS power curve, a first-order thermal RC and a thermal governor on a clock ceiling. Faults: a failing fan on "
    "one GPU, a CRAC failure on a node, HW power-brake bursts from a sagging PSU, a sync-boost group held to its "
    "slowest member, a randomly stalling data pipeline, volatile-only ECC growth, an XID 79 and the reboot that "
    "restarts dmon (appended), a dmon restarted by an operator into a second file, an amd-smi loop restarted in "
    "its file, a 4-GPU job hot because working, an MI300X under a lowered power cap, an MI300X whose clock slides; "
    "(issue 29) a job whose ranks spin on a barrier for 3-6 h (SM busy, every pipe idle) and, on a 13th node (8 "
    "MI300X sent as ROCm device-metrics-exporter text with the op counters), a GPU whose degraded XCDs retire "
    "fewer operations at the same MFMA activity (a slow part); a memory-bound inference job beside them; "
    "normal life beside them: job start-up (2-6 min of loading while the framebuffer fills), idle GPUs between "
    "jobs, noisy devices, ECC trickles. Scoring and verdicts: `bench/capture_fleet_score.py`; the calibration "
    "table is in docs/agents.md, \"Calibration\".")
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


CALIBRATION_INTRO = (
    "How often a finding is right at the confidence it states, measured on the report-on generator "
    "(`bench/capture_fleet.py`, held apart: no threshold was set on it) by `python -m bench.accuracy`, which "
    "rewrites this section. A finding is right when it states an injected fault (its kind, a device and hours of "
    "that fault), or another true thing about the same devices and hours, or, for `unallocated`, when at least "
    "half its hours truly had no process; anything else is wrong (`bench/capture_fleet_score.py`). The target "
    "(issue 28): a finding at ≥ 0.7 is right at least 90 % of the time. Per-fault recall and GPU-hours error: "
    "docs/performance.md, \"Accuracy\".")


def write_calibration(table: str, path: Path = AGENTS_DOC) -> None:
    """``## Calibration`` in docs/agents.md: the intro and the table, replaced in place (or added at the end)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = f"## Calibration\n\n{CALIBRATION_INTRO}\n\nMeasured on {stamp}.\n\n{table.strip()}\n\n"
    old = path.read_text()
    pat = re.compile(r"^## Calibration\n.*?(?=^## |\Z)", flags=re.M | re.S)
    new = pat.sub(lambda _m: body, old) if pat.search(old) else old.rstrip("\n") + "\n\n" + body
    path.write_text(new.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="independent,captures,demo",
                    help="comma list of independent (tune on), captures (report on), demo")
    ap.add_argument("--seeds", type=int, default=10, help="independent generator seeds (0..N-1), at least 10 for the doc")
    ap.add_argument("--capture-seeds", type=int, default=6, help="report-on generator seeds (0..N-1)")
    ap.add_argument("--capture-hours", type=float, default=24.0, help="hours per report-on capture set")
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
    calib = None
    if "captures" in sets:
        rows, totals, verdicts = run_captures(list(range(a.capture_seeds)), a.capture_hours)
        calib = calibration_table(verdicts, totals)
        parts[CAPTURE_TITLE] = (capture_table(rows, totals, a.capture_hours) + "\n\n" + calib + "\n\n"
                                + CAPTURE_NOTE)
    if "demo" in sets:
        rows, totals = run(list(range(a.demo_seeds)), a.sizes.split(","))
        parts["Demo hall"] = table(rows, totals) + "\n\n" + DEMO_NOTE
    for title, body in parts.items():
        print(f"### {title}\n\n{body}\n")
    if not a.no_doc:
        write_doc(parts)
        print(f"wrote ## Accuracy in {PERF_DOC}", file=sys.stderr)
        if calib is not None:
            write_calibration(calib)
            print(f"wrote ## Calibration in {AGENTS_DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
