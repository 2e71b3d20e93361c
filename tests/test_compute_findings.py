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


def _amd_exporter(path: Path, slow: dict[int, float], hours: int = 8, gpus: int = 4, tensor: float = 0.7,
                  with_ops: bool = True) -> Path:
    """One MI300X node's ROCm device-metrics-exporter series (federate text, one scrape a minute) for ``hours``,
    one 4-GPU job (``job_id`` 5150) at SM active 0.9 and MFMA (tensor) active ``tensor`` on every GPU; the total
    16-bit op counters grow at tensor x 1,307 TFLOPS x 0.2 (kept under 2**63 over the hours), except a GPU in ``slow`` (gpu -> (factor, from
    hour)) whose counter grows at that factor of it from that hour (the same tensor activity, the same clock)."""
    labels = 'card_model="AMD Instinct MI300X",gpu_id="{g}",hostname="mi300x-09",job_id="5150",job_user="ann"'
    lines, ops = [], [0.0] * gpus
    for k in range(hours * 60):
        ts = (T0 + 60 * k) * 1000
        for g in range(gpus):
            lab = labels.format(g=g)
            factor, since = slow.get(g, (1.0, hours))
            lines += [f"amd_gpu_prof_sm_active{{{lab}}} 90 {ts}",
                      f"amd_gpu_prof_tensor_active_percent{{{lab}}} {100 * tensor:.1f} {ts}",
                      f"amd_gpu_gfx_activity{{{lab}}} 95 {ts}", f"amd_gpu_package_power{{{lab}}} 640 {ts}",
                      f"amd_gpu_junction_temperature{{{lab}}} 70 {ts}"]
            if with_ops:
                lines.append(f"amd_gpu_prof_total_16_ops{{{lab}}} {ops[g]:.0f} {ts}")
            ops[g] += 60 * tensor * 1307e12 * 0.2 * (factor if k >= since * 60 else 1.0)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_gpu_doing_fewer_counted_flops_per_tensor_hour_than_its_siblings_is_found(runner, cli, tmp_path):
    """GPU 2 of a 4-GPU job counts 15 % fewer ops from hour 2 at the same tensor activity and clock: one
    device finding on it, from hour 2, its deficit about 15 %, the per-device figures in the finding, and no
    finding on its siblings."""
    out = _analyze(runner, cli, _amd_exporter(tmp_path / "exporter.prom", {2: (0.85, 2)}))
    found = _kind(out, "flops_behind_siblings")
    assert len(found) == 1, [(f["kind"], f["scope"]) for f in out["findings"]]
    f = found[0]
    assert f["scope"]["job_id"] == "5150" and f["scope"]["device_uuid"].endswith("2") and f["level"] == "device"
    assert f["start"] == "2026-11-02T02:00:00Z" and f["end"] == "2026-11-02T08:00:00Z"
    ev = {e["signal"]: e for e in f["evidence"]}
    assert ev["deficit_against_siblings"]["during"] == pytest.approx(0.15, abs=0.01)
    per = f["per_device_tflops"]
    assert len(per) == 4 and min(per, key=per.get) == f["scope"]["device_uuid"]
    assert per[f["scope"]["device_uuid"]] == pytest.approx(0.85 * 1307 * 0.2, rel=0.01)
    # the tensor-hours short: 15 % of its tensor time at rated clock over the 6 hours (no clock: ratio 1)
    assert f["gpu_hours"] == pytest.approx(0.15 * 0.7 * 6, rel=0.02)
    assert f["confidence"] >= 0.7 and f["cause"] == "slow_part"
    assert not [k for k in out["account"]["by_cause"] if k == "slow_part"]


@pytest.mark.parametrize("slow, ops", [({}, True), ({2: (0.97, 2)}, True), ({2: (0.85, 2)}, False)])
def test_quiet_on_equal_siblings_a_small_spread_and_without_op_counters(runner, cli, tmp_path, slow, ops):
    """Siblings alike, 3 % apart (noise-sized), or the slow part with no op counter (FLOPs inferred from tensor
    activity are the clock ratio by definition): no finding."""
    out = _analyze(runner, cli, _amd_exporter(tmp_path / "exporter.prom", slow, with_ops=ops))
    assert not _kind(out, "flops_behind_siblings")


H100 = "NVIDIA H100 80GB HBM3"


def _spin_ledger(url: str, job: str = "9300", hours: int = 6, devices: int = 4) -> None:
    """A job on 4 H100s at 60 s for ``hours``: the first 2 hours training on the tensor cores (SM 0.9, tensor
    0.6, DRAM 0.35, FP32 0.15) at 1,800 MHz; then spinning (SM 0.92, tensor 0.01, FP32 0.01, DRAM 0.03) at
    1,700 MHz (clock ratios under 1, so the seam holds the ratio too)."""
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    key = dict(cluster="c1", job_id=job, run=0)
    es = [make_entry(Kind.ALLOCATION_STARTED, T0, {"account": "chem", "partition": "gpu", "qos": "normal"},
                     node="n1", **key)]
    es += [make_entry(Kind.DEVICE_BOUND, T0, {"index": i, "sku": H100}, device=f"GPU-spin-{i}", node="n1", **key)
           for i in range(devices)]
    store.append(eng, es)
    for i in range(devices):
        rows = []
        for k in range(hours * 60):
            train = k < 120
            rows.append(Sample(device=f"GPU-spin-{i}", t=T0 + 60.0 * k, dt=60.0, sm_active=0.9 if train else 0.92,
                               tensor_active=0.6 if train else 0.01, dram_active=0.35 if train else 0.03,
                               fp32_active=0.15 if train else 0.01, fp64_active=0.0, fp16_active=0.0,
                               sm_clock_mhz=1800.0 if train else 1700.0, compute_procs=1.0, fb_used_mib=60000.0,
                               power_w=600.0, gpu_temp_c=60.0, clock_reasons=0))
        write_segment(eng, rows, segment_entry(rows, node="n1", source="test"))
    store.append(eng, [make_entry(Kind.ALLOCATION_ENDED, T0 + hours * 3600.0, {"exit_code": 0}, node="n1", **key)])
    eng.dispose()


def test_the_findings_hours_are_the_receipts_lens_for_the_same_run(runner, cli, tmp_path):
    """The seam: on a ledger, the finding over the spinning hours (every device-hour of them, from device-hours
    and from every sample) has as GPU-hours the receipt's delivered time outside the compute and memory bounds
    (delivered x (latency + other) of the receipt's lens, 1.1.0), and the agents' tensor GPU-hours of the run are
    the receipt's tensor_gpu_hours."""
    from ledger.agents import analyze, compute, hourly

    url = f"sqlite:///{tmp_path / 'l.db'}"
    _spin_ledger(url)
    cfg = tmp_path / "site.toml"
    cfg.write_text('method_version = "1.1.0"\ncompute_precision = "bf16"\n')
    os.chmod(cfg, 0o600)
    res = runner.invoke(cli, ["--db", url, "--config", str(cfg), "receipt", "9300", "--json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    ec = body["effective_compute"]
    delivered = body["gpu_hours"]["delivered"]
    not_math = delivered * (ec["bound_split"]["latency"] + ec["bound_split"]["other"])
    assert ec["bound_split"]["compute"] > 0 and not_math > 0
    eng = db_mod.make_engine(url)
    for how in (analyze, hourly.analyze):
        found = [f for f in how(eng).findings if f.kind == "busy_not_computing"]
        assert len(found) == 1 and found[0].scope_dict()["job_id"] == "9300"
        assert abs(found[0].gpu_hours - not_math) <= 1e-5 * delivered   # the split is rounded to 6 places
        assert found[0].start == T0 + 2 * 3600 and found[0].end == T0 + 6 * 3600
    ds = hourly.load_compact(eng)
    # (the receipt rounds each device's figure to a whole nanohour: half a nanohour each)
    assert abs(float(compute.lens_hours(ds)["tensor_del"].sum()) - ec["tensor_gpu_hours"]) <= 0.5e-9 * 4 + 1e-12


def test_an_op_counter_past_2_63_is_a_count_not_a_dcgm_blank(runner, cli, tmp_path):
    """An MI300X's 64-bit op counter passes 2**63 (DCGM's int64 blank) after a few hours at its rate: the
    counts above it are still read (before, every sample past it lost its fp_ops, and the FLOPs with it)."""
    path = tmp_path / "exporter.prom"
    lab = 'card_model="AMD Instinct MI300X",gpu_id="0",hostname="mi300x-09",job_id="5151"'
    lines = []
    for k in range(20):
        ts = (T0 + 60 * k) * 1000
        lines += [f"amd_gpu_prof_sm_active{{{lab}}} 90 {ts}", f"amd_gpu_prof_tensor_active_percent{{{lab}}} 70 {ts}",
                  f"amd_gpu_prof_total_16_ops{{{lab}}} {9.2e18 + k * 6e16!r} {ts}"]
    path.write_text("\n".join(lines) + "\n")
    from ledger.agents.memory import dataset_from_collected
    from ledger.importers import captures

    ds, _ = dataset_from_collected(captures.read_set([str(path)]))
    ops = ds.samples["ops"].to_numpy()
    assert (ops[:-1] == 6e16).all(), ops   # every interval's count, those above 2**63 included


def test_explain_names_the_hours_beside_the_loss_not_as_a_line(runner, cli, tmp_path):
    """`explain` and `ask` on the job: the finding is listed with its hours, the loss table has no line for it
    (its hours are delivered, not lost), and the headline says so beside the loss, with the listed figure."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _spin_ledger(url)
    for args in (["explain", "--job", "9300", "--period", "all", "--json"], ["ask", "what happened to job 9300",
                                                                              "--json"]):
        res = runner.invoke(cli, ["--db", url, *args])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        listed = [f for f in out["findings"] if f["kind"] == "busy_not_computing"]
        assert len(listed) == 1
        assert not [ln for ln in out["table"]["lines"] if ln["cause"] == "not_computing"]
        assert f"Beside the loss, busy but not computing: {listed[0]['gpu_hours_in_scope']:,.1f} delivered " \
               f"GPU-hours did no math" in out["answer"]


@pytest.mark.parametrize("shape", ["spin", "slow"])
def test_the_lens_sums_from_device_hours_equal_those_from_every_sample(tmp_path, shape):
    """The two datasets decide alike: the per (device, hour, run) sums read in one lean pass over the raw lens
    columns (what `findings` / `analyze` use) equal those of the per-sample frame (``--samples``)."""
    import numpy as np

    from ledger.agents import compute
    from ledger.agents.hourly import compact_dataset
    from ledger.agents.memory import dataset_from_collected, hourly_from_collected
    from ledger.importers import captures

    src = (_dmon(tmp_path / "dmon-gpu-35.txt", "gpu-35", _spin_hours_3_to_7) if shape == "spin" else
           _amd_exporter(tmp_path / "exporter.prom", {2: (0.85, 2)}))
    full, _ = dataset_from_collected(captures.read_set([str(src)]))
    scan, samples, _ = hourly_from_collected(captures.read_set([str(src)]))
    compact = compact_dataset(scan, samples)
    a, b = compute.lens_hours(full), compute.lens_hours(compact)
    assert len(a) and list(a["device"]) == list(b["device"]) and list(a["hour"]) == list(b["hour"])
    assert list(a["ai"]) == list(b["ai"])
    for c in compute.STAT_SUMS:
        assert np.allclose(a[c].to_numpy(float), b[c].to_numpy(float), rtol=1e-12, atol=1e-9), c


def test_the_pipe_fields_reach_the_agents_from_dmon_and_from_dcgm_exporter(tmp_path):
    """dmon's DRAMA / FP64A / FP32A / FP16A columns and dcgm-exporter's DCGM_FI_PROF_PIPE_* / DRAM_ACTIVE series are
    the agents' ``dram``, ``fp64``, ``fp32``, ``fp16`` per sample, as written."""
    from ledger.agents.memory import dataset_from_collected
    from ledger.importers import captures

    want = {"dram": 0.35, "fp64": 0.0, "fp32": 0.15, "fp16": 0.02}
    ds, _ = dataset_from_collected(captures.read_set([str(_dmon(tmp_path / "dmon-gpu-36.txt", "gpu-36",
                                                                 lambda k, g: TRAIN, hours=1))]))
    for k, v in want.items():
        assert (ds.samples[k] == v).all(), k
    lab = 'gpu="0",UUID="GPU-pipes-0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-37"'
    names = {"DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.6, "DCGM_FI_PROF_DRAM_ACTIVE": 0.35,
             "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0, "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.15,
             "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.02}
    text = "\n".join(f"{n}{{{lab}}} {v} {(T0 + 30 * k) * 1000}" for k in range(20) for n, v in names.items())
    (tmp_path / "scrape.prom").write_text(text + "\n")
    ds, _ = dataset_from_collected(captures.read_set([str(tmp_path / "scrape.prom")]))
    for k, v in {**want, "tensor": 0.6}.items():
        assert (ds.samples[k] == v).all(), k
