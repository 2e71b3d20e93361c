"""The independent fault generator (bench/scenario.py) and the agents scored against it end to end.

The generator must owe nothing to the method or the agents (else its truth would be circular); its truth must follow
from the injected parameters; and the agents, run as ``ipledger analyze`` runs them, must find every fault with the
GPU-hours it cost and raise nothing confident on a healthy device. ``python -m bench.accuracy`` does the same over
ten seeds; here two seeds (one more under --soak).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench.scenario import generate, write_export
from bench.scenario_score import findings_of, score
from ledger.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent


def test_generator_imports_nothing_from_the_method_or_the_agents():
    code = ("import sys, bench.scenario; bad = sorted(m for m in sys.modules if m.startswith(('ledger.method', "
            "'ledger.agents', 'ledger.sim'))); print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_truth_follows_from_the_injected_parameters_and_placement_changes_per_seed():
    a, b = generate(1), generate(2)
    fa = {f.cause: f for f in a.faults}
    # idle held, XID silence and the outage are device-time: their truth is their duration times their devices
    assert fa["idle_held"].gpu_hours == pytest.approx((fa["idle_held"].end - fa["idle_held"].start) / 3600, abs=0.01)
    assert fa["xid"].gpu_hours == pytest.approx((fa["xid"].end - fa["xid"].start) / 3600 - a.cadence / 3600)
    i = a.uuids.index(fa["xid"].device)
    silent = ~a.present[i]
    assert silent.sum() * a.cadence / 3600 == pytest.approx(fa["xid"].gpu_hours)
    assert fa["collector_outage"].gpu_hours <= 8 * (fa["collector_outage"].end - fa["collector_outage"].start) / 3600
    # a power cap costs work only while the device was loaded above its limit: reason bit 0x4 there and only there
    k = a.uuids.index(fa["power_cap"].device)
    cap = (a.arrays["reasons"][k].astype(int) & 0x4) > 0
    inside = (a.t >= fa["power_cap"].start) & (a.t < fa["power_cap"].end)
    assert cap.any() and not (cap & ~inside).any()
    assert a.arrays["power"][k][cap].mean() < fa["power_cap"].params["limit_w"] + 20
    # placement is drawn per seed
    fb = {f.cause: f for f in b.faults}
    assert [(f.node, f.device) for f in fa.values()] != [(f.node, f.device) for f in fb.values()]
    assert not np.array_equal(a.job, b.job)


@pytest.mark.parametrize("seed", [3, 11])
def test_analyze_finds_every_independent_fault_with_its_gpu_hours(tmp_path, seed):
    sc = generate(seed)
    path = write_export(sc, tmp_path / "export.json")
    r = CliRunner().invoke(cli, ["analyze", str(path), "--json"])
    assert r.exit_code == 0, r.output
    found = findings_of(json.loads(r.output))
    scores, false = score(sc.truth(), found)
    assert [s.cause for s in scores if not s.found] == []
    for s in scores:
        if s.error is not None:
            assert s.error <= 0.10, (s.cause, s.found_h, s.truth_h)
    assert false == []


def test_device_scale_findings_name_the_device(tmp_path):
    sc = generate(5)
    path = write_export(sc, tmp_path / "export.json")
    r = CliRunner().invoke(cli, ["analyze", str(path), "--json"])
    found = findings_of(json.loads(r.output))
    truth = {f.cause: f for f in sc.faults}
    cap = [f for f in found if f["kind"] == "power_cap"]
    assert [f["scope"]["device_uuid"] for f in cap] == [truth["power_cap"].device]
    idle = [f for f in found if f["kind"] == "idle_held" and f["scope"]["job_id"] == truth["idle_held"].job]
    assert idle and idle[0]["scope"]["device_uuid"] == truth["idle_held"].device
    xid = [f for f in found if f["kind"] == "xid"]
    assert xid and xid[0]["gpu_hours"] == pytest.approx(truth["xid"].gpu_hours, rel=0.01)
    assert any(e["signal"] == "hours_silent_after_xid" and e["during"] > 1 for e in xid[0]["evidence"])
    ecc = [f for f in found if f["kind"] == "ecc_drift" and f["scope"]["device_uuid"] == truth["ecc"].device]
    assert ecc and "since it began" in ecc[0]["summary"]
