"""The report-on generator (bench/capture_fleet.py) and its scorer: independent of the method, the agents and the
first generator; its truth follows from the injected parameters; its files are what the capture commands write
(the dmon field list `pathb-command` prints, amd-smi's banner, CRLF and repeated headers); and its capture restarts
(a reboot appended to one file, an operator's restart into a second file, an amd-smi loop restarted in its file)
come out of one `ipledger analyze DIR` as `capture_restarted` gaps exactly where no capture ran."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.capture_fleet import (AMD_BANNER, AMD_COLUMNS, BIT_POWER, BIT_SYNC, DMON_FIELD_IDS, DMON_FIELDS,
                                 HEADER_EVERY, generate, write_captures)
from bench.capture_fleet_score import calibration, false_alarms, findings_of, score

ROOT = Path(__file__).resolve().parent.parent
CADENCE = 120.0      # dcgmi dmon -d 120000: 720 ticks a day, so the end-to-end test runs in seconds


def test_generator_and_scorer_import_nothing_from_ledger_or_the_first_generator():
    code = ("import sys, bench.capture_fleet, bench.capture_fleet_score; bad = sorted(m for m in sys.modules "
            "if m == 'ledger' or m.startswith(('ledger.', 'bench.scenario'))); print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def fleet():
    return generate(4, cadence=CADENCE)


@pytest.fixture(scope="module")
def captures(fleet, tmp_path_factory):
    out = tmp_path_factory.mktemp("captures")
    return out, write_captures(fleet, out)


def _fault(fl, cause, how=None):
    return next(f for f in fl.faults if f.cause == cause and (how is None or how in f.params.get("how", "")))


def test_truth_follows_from_the_injected_parameters(fleet):
    fl = fleet
    dt_h = fl.cadence / 3600
    # a capture hole costs every GPU of its node over the hole; the XID silence is its N/A rows
    for f in (f for f in fl.faults if f.cause == "capture_restarted"):
        assert f.gpu_hours == pytest.approx(8 * (f.end - f.start) / 3600)
    x = _fault(fl, "xid")
    i = fl.keys.index(x.devices[0])
    assert (~fl.answers[i]).sum() * dt_h == pytest.approx(x.gpu_hours)
    # sync boost: bit 0x10 on the held members only, inside the window, each held to the slowest member's clock
    sb = _fault(fl, "sync_boost")
    slow = fl.keys.index(sb.params["slowest"])
    inside = (fl.t >= sb.start) & (fl.t < sb.end)
    for k in (fl.keys.index(d) for d in sb.devices):
        bit = (fl.arrays["reasons"][k].astype(int) & BIT_SYNC) > 0
        assert not (bit & ~inside).any()
        assert bit.any() == (k != slow)
    # the PPT cap: power capped only inside its window, and held under the cap there (1.2 % meter noise)
    pc = _fault(fl, "ppt_cap")
    k = fl.keys.index(pc.devices[0])
    cap = (fl.arrays["reasons"][k].astype(int) & BIT_POWER) > 0
    inside = (fl.t >= pc.start) & (fl.t < pc.end)
    assert cap.any() and not (cap & ~inside).any()
    assert fl.arrays["power"][k][cap].max() < pc.params["cap_w"] * 1.05
    # issue 29: the spinning ranks' tensor pipe is 0 and their SMs busy inside the window only; the slow part's
    # counter grows at its stated share of its siblings' per MFMA-busy second after the onset
    sp = _fault(fl, "spin_wait")
    rows = [fl.keys.index(d) for d in sp.devices]
    inside = (fl.t >= sp.start) & (fl.t < sp.end)
    spun = (fl.arrays["tensor"][rows] == 0) & (fl.arrays["act"][rows] >= 0.85)
    assert spun[:, inside].mean() > 0.9 and spun[:, ~inside].mean() < 0.05
    assert sp.gpu_hours > 0
    sl = _fault(fl, "slow_part")
    ex = fl.exporter
    g = ex.keys.index(sl.devices[0])
    ops, mfma = ex.series["amd_gpu_prof_total_16_ops"], ex.series["amd_gpu_prof_tensor_active_percent"]
    after = (fl.t[:-1] >= sl.start) & (ex.job[g, :-1] >= 0) & (np.diff(ops[g]) > 0)
    per_busy = np.diff(ops, axis=1) / np.maximum(mfma[:, :-1], 1e-9)
    sibs = [k for k in range(8) if k != g]
    ratio = np.median(per_busy[g, after] / np.median(per_busy[sibs][:, after], axis=0))
    assert ratio == pytest.approx(sl.params["device_rate"], abs=0.03)
    # placement and schedule are drawn per seed
    other = generate(5, cadence=CADENCE)
    assert [(f.cause, f.devices) for f in fl.faults] != [(f.cause, f.devices) for f in other.faults]
    assert not np.array_equal(fl.unallocated, other.unallocated)


def test_files_are_what_the_capture_commands_write(fleet, captures, runner, cli):
    out, paths = captures
    r = runner.invoke(cli, ["pathb-command", "--format", "dmon", "--nodes", "2"])
    asked = tuple(int(x) for x in re.search(r"dcgmi dmon -e ([\d,]+)", r.output).group(1).split(","))
    assert asked == DMON_FIELD_IDS                               # the field list the prospect is handed
    dmon = sorted(p for p in paths if p.name.startswith("dmon-"))
    amd = sorted(p for p in paths if p.name.startswith("amdsmi-"))
    assert len(amd) == 4 and len(dmon) == 9                      # 8 NVIDIA nodes, one restarted into a second file
    assert [p.name for p in paths if p.suffix == ".prom"] == [f"exporter-{fleet.exporter.node}.prom"]
    text = dmon[0].read_text()
    lines = text.splitlines()
    assert re.fullmatch(r"# ipledger-start \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ node=\S+ interval_ms=120000", lines[0])
    assert lines[1].split()[1:] == [name for _, name, _, _, _ in DMON_FIELDS] and lines[1].startswith("#Entity")
    assert lines[2].startswith("ID")
    assert lines[3].startswith("GPU 0 ") and len(lines[3].split()) == 2 + len(DMON_FIELDS)
    headers = [n for n, s in enumerate(lines) if s.startswith("#Entity")]
    assert headers[1] - headers[0] == 2 + 8 * HEADER_EVERY       # the header pair again every 14 ticks
    raw = amd[0].read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n")                # CRLF throughout
    alines = raw.decode().split("\r\n")
    assert alines[0].startswith("# ipledger-start ") and alines[1] == AMD_BANNER
    assert alines[2] == ",".join(AMD_COLUMNS) and alines[2 + 9] == ",".join(AMD_COLUMNS)   # every iteration
    ppt = AMD_COLUMNS.index("ppt_violation_status")
    assert {a.split(",")[ppt] for a in alines[3:11]} <= {"ACTIVE", "NOT ACTIVE"}


def test_one_analyze_of_the_mixed_set_finds_every_restart_as_capture_restarted(fleet, captures, runner, cli):
    """The whole directory (dmon and amd-smi files, one node in two files) in one command: every GPU in one
    analysis, and each of the three capture holes an unknown_gap caused by capture_restarted over exactly the
    hole, with every GPU of the node's hours in it; no capture_restarted gap anywhere else."""
    out, _ = captures
    r = runner.invoke(cli, ["analyze", str(out), "--json"])
    assert r.exit_code == 0, r.output
    a = json.loads(r.output)
    # 96 GPUs in capture files, 8 more in the device-metrics-exporter text (issue 29's slow part)
    assert a["meta"]["devices"] == len(fleet.truth()["devices"]) == len(fleet.keys) + 8 == 104
    assert {d["node"] for d in a["devices"]} == {*fleet.nodes, fleet.exporter.node}
    found = findings_of(a)
    gaps = [f for f in found if f["kind"] == "unknown_gap" and f.get("cause") == "capture_restarted"]
    truth = fleet.truth()
    holes = [f for f in truth["faults"] if f["cause"] == "capture_restarted"]
    assert len(holes) == 3
    from bench.capture_fleet_score import epoch

    assert sorted((g["scope"]["node"], epoch(g["start"]), epoch(g["end"])) for g in gaps) == \
        sorted((h["node"], h["start"], h["end"]) for h in holes)
    scores, verdicts = score(truth, found, fleet.unallocated_between)
    for s in (s for s in scores if s.cause == "capture_restarted"):
        assert s.found and s.error < 0.01, s
    assert len(verdicts) == len(found)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_the_mixed_set_as_an_archive_is_the_same_one_analysis(fleet, captures, runner, cli, tmp_path, kind):
    """The same dmon + amd-smi files sent as one archive (``captures.tar.gz`` / ``captures.zip``, under a folder
    as a prospect packs it): read in memory, each member's node from its own file name, and the analysis is the
    directory's, findings, account and restarts included."""
    import tarfile
    import zipfile

    out, paths = captures
    arc = tmp_path / f"captures.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(arc, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in paths:
                zf.write(p, f"ipledger-capture/{p.name}")
    else:
        with tarfile.open(arc, "w:gz") as tf:
            for p in paths:
                tf.add(p, f"ipledger-capture/{p.name}")
    direct = json.loads(runner.invoke(cli, ["analyze", str(out), "--json"]).output)
    r = runner.invoke(cli, ["analyze", str(arc), "--json"])
    assert r.exit_code == 0, r.output
    a = json.loads(r.output)
    assert a["meta"]["devices"] == 104 and {d["node"] for d in a["devices"]} == {*fleet.nodes, fleet.exporter.node}
    assert a["import"]["quarantined"] == []
    for key in ("findings", "account", "devices", "meta"):
        assert json.dumps(a[key], sort_keys=True) == json.dumps(direct[key], sort_keys=True), key
    assert not list(tmp_path.glob("ipledger-capture*"))          # nothing extracted beside the archive


def test_scorer_verdicts_and_calibration_bins():
    truth = {"devices": {"n1/gpu0": "n1", "n1/gpu1": "n1", "n2/gpu0": "n2"},
             "faults": [{"cause": "ppt_cap", "node": "n1", "devices": ["n1/gpu1"], "start": 100.0, "end": 200.0,
                         "gpu_hours": 1.0, "params": {}},
                        {"cause": "capture_restarted", "node": "n2", "devices": ["n2/gpu0"], "start": 300.0,
                         "end": 400.0, "gpu_hours": 2.0, "params": {}}]}

    def finding(kind, conf, node, dev=None, start=150, end=160, hours=1.0, cause=None):
        return {"kind": kind, "confidence": conf, "scope": {"node": node, "device_uuid": dev}, "start": start,
                "end": end, "gpu_hours": hours, "cause": cause or kind}

    found = [finding("power_cap", 0.95, "n1", "n1/gpu1", hours=0.9),          # right: the capped GPU
             finding("power_cap", 0.92, "n1", "n1/gpu0"),                     # wrong GPU
             finding("unknown_gap", 0.95, "n2", start=300, end=400, hours=2.0, cause="capture_restarted"),
             finding("unknown_gap", 0.95, "n2", start=300, end=400, cause="scrape_missing"),   # also true
             finding("starved", 0.7, "n2", start=0, end=50)]                  # nothing was starved
    scores, verdicts = score(truth, found)
    assert [(s.cause, s.found, round(s.found_h, 2)) for s in scores] == [("ppt_cap", True, 0.9),
                                                                         ("capture_restarted", True, 2.0)]
    assert scores[0].error == pytest.approx(0.1)
    assert [v.right for v in verdicts] == [True, False, True, True, False]
    assert [v.kind for v in false_alarms(verdicts)] == ["power_cap", "starved"]
    bins = {label: (n, right) for label, n, right in calibration(verdicts)}
    assert bins["0.7–0.8"] == (1, 0) and bins["≥ 0.9"] == (4, 3)


def test_calibration_section_is_written_once_and_says_whether_the_target_holds(tmp_path):
    from bench.accuracy import calibration_table, write_calibration
    from bench.capture_fleet_score import Verdict

    verdicts = [Verdict("power_cap", 0.95, True, "ppt_cap")] * 9 + [Verdict("starved", 0.7, False, "no such fault")]
    table = calibration_table(verdicts, {"starved": {"found": 2, "faults": 3}})
    assert "At confidence ≥ 0.7: 9 of 10 findings right = 90% (target ≥ 90 %: met)" in table
    rows = {ln.split(" | ")[0]: ln for ln in table.splitlines() if ln.startswith("| `")}
    assert rows["| `starved`"].endswith("| 1 | 0 = 0% | 0 of 1 | starved 2/3 |")
    assert rows["| `power_cap`"].endswith("| 9 | 9 = 100% | 9 of 9 | — |")
    doc = tmp_path / "agents.md"
    doc.write_text("# Agents\n\n## Calibration\n\nstale figures\n\n## Entries\n\nkept\n")
    write_calibration(table, doc)
    write_calibration(calibration_table(verdicts[1:]), doc)
    text = doc.read_text()
    assert text.count("## Calibration") == 1 and "stale figures" not in text and "## Entries\n\nkept" in text
    assert "8 of 9 findings right = 89% (target ≥ 90 %: NOT met)" in text
