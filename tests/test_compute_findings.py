"""The effective-compute lens's findings (issue 29, ledger/agents/compute.py) on captures shaped like each fault:
``busy_not_computing`` (SM busy, every pipe idle, for hours: the tenant's loss, in no loss line) and
``flops_behind_siblings`` (a GPU doing fewer counted FLOPs per tensor-active hour than its siblings on the same
run); quiet on healthy training, on memory-bound inference, and where the pipe fields were not measured; and the
finding's hours are the receipt's lens figures for the same run (the seam)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.telemetry.model import Sample
from ledger.telemetry.sealed import segment_entry, write_segment

T0 = 1793577600           # 2026-11-02 00:00 UTC
FIELDS = ("SMACT", "TENSO", "DRAMA", "FP64A", "FP32A", "FP16A", "SMCLK", "POWER", "TMPTR", "DVCCTR", "FBUSD")
NO_PIPES = ("SMACT", "SMCLK", "POWER", "TMPTR", "DVCCTR", "FBUSD")
TRAIN = dict(sm=0.9, tensor=0.6, dram=0.35, fp64=0.0, fp32=0.15, fp16=0.02)
SPIN = dict(sm=0.92, tensor=0.0, dram=0.03, fp64=0.0, fp32=0.01, fp16=0.0)
INFER = dict(sm=0.8, tensor=0.03, dram=0.62, fp64=0.0, fp32=0.02, fp16=0.01)


def _dmon(path: Path, node: str, phase, hours: int = 8, fields: tuple[str, ...] = FIELDS) -> Path:  # noqa: ANN001
    """One node's `dcgmi dmon` file, 8 GPUs at 60 s for ``hours``; ``phase(minute, gpu)`` gives the row's
    activities (sm, tensor, dram, fp64, fp32, fp16), the clock at 1980 MHz, a process resident all along."""
    lines = [f"# ipledger-start 2026-11-02T00:00:00Z node={node} interval_ms=60000"]
    for k in range(hours * 60):
        if k % 30 == 0:
            lines += ["#Entity   " + "  ".join(fields), "ID        " + "  ".join("" for _ in fields)]
        for g in range(8):
            a = phase(k, g)
            v = {"SMACT": f"{a['sm']:.3f}", "TENSO": f"{a['tensor']:.3f}", "DRAMA": f"{a['dram']:.3f}",
                 "FP64A": f"{a['fp64']:.3f}", "FP32A": f"{a['fp32']:.3f}", "FP16A": f"{a['fp16']:.3f}",
                 "SMCLK": "1980", "POWER": f"{200 + 400 * a['sm']:.2f}", "TMPTR": "60", "DVCCTR": "0",
                 "FBUSD": "60000"}
            lines.append(f"GPU {g}     " + "  ".join(v[f] for f in fields))
    path.write_text("\n".join(lines) + "\n")
    return path


def _analyze(runner, cli, src: Path, *extra: str) -> dict:  # noqa: ANN001
    r = runner.invoke(cli, ["analyze", str(src), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _kind(out: dict, kind: str) -> list[dict]:
    return [f for f in out["findings"] if f["kind"] == kind]


def _spin_hours_3_to_7(k: int, g: int) -> dict:
    return SPIN if 180 <= k < 420 else TRAIN


@pytest.mark.parametrize("samples", [False, True])
def test_spin_waiting_for_hours_is_busy_not_computing_told_to_the_tenant_not_a_provider_loss(runner, cli, tmp_path,
                                                                                           samples):
    """Every GPU of a node spins from hour 3 to 7 (SM active 0.92, tensor 0, FP pipes <= 0.01, DRAM 0.03): one
    finding on the node's run, 3:00-7:00, its GPU-hours the delivered time of those samples (8 x 4 h x 0.92 at the
    full clock), addressed to the tenant and in no loss line; the same from every sample (``--samples``)."""
    src = _dmon(tmp_path / "dmon-gpu-31.txt", "gpu-31", _spin_hours_3_to_7)
    out = _analyze(runner, cli, src, *(["--samples"] if samples else []))
    found = _kind(out, "busy_not_computing")
    assert len(found) == 1, [(f["kind"], f["scope"]) for f in out["findings"]]
    f = found[0]
    assert f["scope"]["job_id"] == "node:gpu-31" and f["level"] == "job"
    assert (f["start"], f["end"]) == ("2026-11-02T03:00:00Z", "2026-11-02T07:00:00Z")
    assert abs(f["gpu_hours"] - 8 * 4 * 0.92) < 1e-6
    assert f["addressed_to"] == "tenant" and f["provider_loss"] is False and f["cause"] == "not_computing"
    assert f["confidence"] >= 0.7
    assert sorted(f["devices"]) == [f"gpu-31/gpu{g}" for g in range(8)]
    ev = {e["signal"]: e for e in f["evidence"]}
    assert ev["tensor_active"]["during"] == 0.0 and ev["tensor_active"]["before"] == pytest.approx(0.6)
    assert ev["sm_active"]["during"] == pytest.approx(0.92)
    # the tenant's loss: inside delivered, so in no provider loss line and no operator step
    assert not [k for k in out["account"]["by_cause"] if "comput" in k]
    recs = [r for r in out["findings"] if r["agent"] == "recommendation" and f["id"] in r.get("based_on", [])]
    assert [r["kind"] for r in recs] == ["tell_tenant_not_computing"] and recs[0]["level"] == "tenant"
    assert "scontrol" not in recs[0]["command"]


@pytest.mark.parametrize("name, phase", [
    ("training", lambda k, g: TRAIN),
    ("inference", lambda k, g: INFER),                       # memory-bound: DRAM high, pipes low
    ("short spin", lambda k, g: SPIN if 180 <= k < 240 else TRAIN),   # one hour: not "for hours"
])
def test_quiet_on_healthy_training_memory_bound_inference_and_a_short_spin(runner, cli, tmp_path, name, phase):
    out = _analyze(runner, cli, _dmon(tmp_path / "dmon-gpu-32.txt", "gpu-32", phase))
    assert not _kind(out, "busy_not_computing"), name


def test_never_raised_where_the_pipe_fields_were_not_measured(runner, cli, tmp_path):
    """The same spin with no TENSO / DRAMA / FP pipe columns: SM busy, the pipes unknown, not idle: no finding."""
    out = _analyze(runner, cli, _dmon(tmp_path / "dmon-gpu-33.txt", "gpu-33", _spin_hours_3_to_7, fields=NO_PIPES))
    assert not _kind(out, "busy_not_computing")


def test_the_rule_fails_without_its_dram_guard(runner, cli, tmp_path, monkeypatch):
    """The inference capture is quiet because DRAM is high, not by luck: with the memory-bound guard off, the same
    capture (SM busy, pipes under 5 %) is found, so the quiet test above can fail."""
    from ledger.agents import compute

    monkeypatch.setattr(compute, "DRAM_HIGH", 2.0)
    out = _analyze(runner, cli, _dmon(tmp_path / "dmon-gpu-34.txt", "gpu-34", lambda k, g: INFER))
    assert _kind(out, "busy_not_computing")
