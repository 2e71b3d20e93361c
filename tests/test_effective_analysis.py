"""The effective-compute lens in a Path B analysis (ledger/agents/effective.py; docs/agents.md, "Effective compute
in an analysis"): the same number as the statement's lens for the same export, the fast sums held to a plain loop,
and unknown (never zero) where the capture names no rated model or measured no tensor activity."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tests.test_issue_cli as issue_cli
from ledger.agents import compute
from ledger.agents.effective import per_device, per_device_reference
from ledger.agents.memory import dataset_from_collected
from ledger.importers import prometheus
from ledger.importers.captures import read_set
from ledger.importers.pipeline import ImportOptions
from ledger.sim import FleetSpec, simulate
from ledger.sim.captures import write_amdsmi_set, write_dmon_set

TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"


@pytest.fixture()
def export_with_tensor(tmp_path, monkeypatch):
    monkeypatch.setattr(issue_cli, "METRICS", issue_cli.METRICS + (TENSOR,))
    return issue_cli.write_export(tmp_path / "export")


def _json(runner, cli, *args):
    res = runner.invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_analysis_lens_is_the_statements_lens_of_the_same_export(export_with_tensor, tmp_path, runner, cli,
                                                                      monkeypatch):
    """`analyze EXPORT` (Path B) and the monthly statement of the same export imported and billed under method
    1.2 give the same tensor GPU-hours, achieved and rated PFLOP-hours and unmeasured hours (the analysis to its 4
    decimals); --device-hours gives the same block as --samples."""
    ec = _json(runner, cli, "analyze", str(export_with_tensor), "--json", "--samples")["effective_compute"]
    assert ec == _json(runner, cli, "analyze", str(export_with_tensor), "--json",
                       "--device-hours")["effective_compute"]
    assert ec["tensor_gpu_hours"] > 0 and ec["rated_share"] is not None and ec["source"] == "tensor_active"
    monkeypatch.setenv("IPLEDGER_AUTO_RECEIPTS", "0")
    cfg = tmp_path / "site.toml"
    cfg.write_text('method_version = "1.2.0"\ncompute_precision = "bf16"\n')
    os.chmod(cfg, 0o600)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    for args in (["init"], ["import", "prometheus", str(export_with_tensor), "--quiet", "--cluster", "lab"],
                 ["issue", "--all", "--quiet"]):
        res = runner.invoke(cli, ["--db", url, "--config", str(cfg), *args])
        assert res.exit_code == 0, res.output
    tot = _json(runner, cli, "--db", url, "export", "monthly", "--month", "2026-11", "--format", "json",
                "--out", "-")["totals"]
    assert ec["paid_gpu_hours"] == pytest.approx(tot["paid"], abs=1e-4)
    for mine, theirs in (("tensor_gpu_hours", "tensor_gpu_hours"), ("achieved_pflop_hours", "achieved_pflop_hours"),
                         ("rated_pflop_hours", "rated_pflop_hours"),
                         ("unmeasured_gpu_hours", "lens_unmeasured_gpu_hours")):
        assert ec[mine] == pytest.approx(tot[theirs], abs=1e-4), mine


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = a.sort_index(), b.sort_index()
    assert list(a.index) == list(b.index) and len(a)
    for col in a.columns:
        assert np.allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=1e-12, atol=1e-12), col


def test_the_sums_equal_the_plain_loop_on_every_path(export_with_tensor):
    """Per device, the bincount sums (per-sample frame) and the device-hour sums the compute findings keep both
    equal the plain loop's exact sums."""
    ds, _res = dataset_from_collected(prometheus.read(str(export_with_tensor)), ImportOptions(cluster="lab"))
    want = per_device_reference(ds.samples)
    _frames_equal(per_device(ds), want)
    ds.lens_hours = compute.stats_from_samples(ds.samples)
    _frames_equal(per_device(ds), want)


def test_a_capture_without_a_model_or_without_tensor_is_unknown_not_zero(tmp_path, runner, cli):
    """A dmon set names no GPU model: tensor GPU-hours, no PFLOP-hours and no share (the PDF says why). An amd-smi
    set without MFMA activity: every paid hour unmeasured, nothing read as zero math."""
    sim = simulate(FleetSpec.small(), 7)
    nodes = sorted({d.node for d in sim.devices if d.rack == "R2"})
    write_dmon_set(sim, tmp_path / "dmon", nodes, 0, 96)
    ds, _res = dataset_from_collected(read_set([str(tmp_path / "dmon")]), ImportOptions())
    _frames_equal(per_device(ds), per_device_reference(ds.samples))
    pdf = tmp_path / "a.pdf"
    ec = _json(runner, cli, "analyze", str(tmp_path / "dmon"), "--json", "--pdf", str(pdf))["effective_compute"]
    assert ec["tensor_gpu_hours"] > 0 and ec["achieved_pflop_hours"] is None and ec["rated_share"] is None
    from tests.test_analysis_pdf import pdf_text

    assert "names no GPU model with a rating" in " ".join(pdf_text(pdf).split())
    amd = simulate(replace(FleetSpec.small(), amd_nodes=1), 3)
    write_amdsmi_set(amd, tmp_path / "amd", sorted({d.node for d in amd.devices if d.vendor == "AMD"}), 0, 96)
    ec = _json(runner, cli, "analyze", str(tmp_path / "amd"), "--json")["effective_compute"]
    assert ec["tensor_gpu_hours"] == 0.0 and ec["unmeasured_gpu_hours"] == ec["paid_gpu_hours"] > 0
    assert ec["achieved_pflop_hours"] is None and ec["source"] is None
    # over device-hours the lens's sums skip what measured no tensor at all: its hours are still unmeasured
    assert _json(runner, cli, "analyze", str(tmp_path / "amd"), "--json", "--device-hours")["effective_compute"] == ec
