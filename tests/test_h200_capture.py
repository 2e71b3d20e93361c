"""A real H200 under known load (tests/fixtures/real/h200_capture/, taken by tools/device_capture/run.sh).

The load's phases were measured by the load itself (TFLOP/s from CUDA events, GB/s from bytes moved), apart from
anything the method computes, so they are truth the method was not tuned on: the effective-compute lens read
from the profiling metrics must land on the measured TFLOP/s, the energy counter must agree with the power
integral, and nvidia-smi's own loops (CSV and XML) of the same minutes must import as one sample per tick.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ledger.importers import nvidia_smi
from ledger.method.attribution import SampleArrays, attribute_device
from ledger.method.energy import CounterReading, PowerSample, device_energy, power_integral
from ledger.method.lens import lens_device
from ledger.method.attribution import NANOHOURS_PER_SECOND
from ledger.method.skus import match_sku
from ledger.capture.sources.nvml import parse_clock_event_reasons

R = Path(__file__).parent / "fixtures" / "real"
H = R / "h200_capture"
UUID = "GPU-d9b2da47-5159-56e6-7c97-952df3a23a1d"
SW_POWER_CAP, GPU_IDLE = 0x4, 0x1


@pytest.fixture(scope="module")
def nvml():
    rows = list(csv.DictReader(open(H / "nvml_gpm_1s_h200_driver580.csv", newline="")))
    cols = {k: np.array([float(r[k]) if r[k] else math.nan for r in rows])
            for k in rows[0] if k not in ("uuid", "name", "clock_event_reasons")}
    cols["reasons"] = np.array([int(r["clock_event_reasons"], 16) for r in rows])
    assert {r["uuid"] for r in rows} == {UUID} and {r["name"] for r in rows} == {"NVIDIA H200"}
    return cols


@pytest.fixture(scope="module")
def phases():
    doc = json.loads((H / "phases_h200.json").read_text())
    return {p["phase"]: p for p in doc["phases"]}


def phase_samples(nvml, phase) -> SampleArrays:
    """The NVML seconds wholly inside a phase; GPM's value at a row covers the second before it."""
    t = nvml["t_unix"]
    m = (t - 1.0 >= phase["start"]) & (t <= phase["end"])
    pct = lambda k: nvml[k][m] / 100.0  # noqa: E731
    return SampleArrays.from_columns(
        t[m] - 1.0, np.ones(int(m.sum())), sm_active=pct("gpm_sm_util"), tensor_active=pct("gpm_any_tensor_util"),
        gpu_util=pct("gpu_util_pct"), sm_clock=nvml["sm_clock_mhz"][m], reasons=nvml["reasons"][m],
        procs=np.ones(int(m.sum())), fb_used=nvml["fb_used_mib"][m], sm_occupancy=pct("gpm_sm_occupancy"),
        dram_active=pct("gpm_dram_bw_util"), fp64_active=pct("gpm_fp64_util"), fp32_active=pct("gpm_fp32_util"),
        fp16_active=pct("gpm_fp16_util"))


def lens_of(s: SampleArrays):
    rated = match_sku("NVIDIA H200").rated_sm_clock_mhz
    return lens_device((float(s.t[0]), float(s.t[-1] + s.dt[-1])), s, rated_clock_mhz=rated)


def test_the_sku_table_rates_the_h200_the_capture_ran_on():
    r = match_sku("NVIDIA H200")
    assert (r.peak_bf16_dense_tflops, r.peak_fp32_tflops, r.rated_sm_clock_mhz, r.tdp_w) == (989.4, 67, 1980, 700)


def test_lens_on_the_bf16_burn_lands_on_the_measured_tflops(nvml, phases):
    """Σ tensor_active × clock ratio × 989.4 TFLOP/s over the burn's seconds against 676.8 measured."""
    p = phases["bf16_matmul_burn"]
    s = phase_samples(nvml, p)
    lens = lens_of(s)
    estimated = lens.tensor_s / lens.measured_s * match_sku("NVIDIA H200").peak_bf16_dense_tflops
    assert p["tflops"] == 676.8 and lens.unmeasured_s == 0
    assert abs(estimated / p["tflops"] - 1) < 0.05, estimated            # 700.2: 3.5 % over
    assert lens.bound_s["compute"] == pytest.approx(lens.delivered_s)      # tensor-bound, all of it
    # the card sat on its 700 W limit: SW power cap all the burn, the clock down from 1,980 to ~1,507 MHz
    assert set(s.reasons.tolist()) == {SW_POWER_CAP} and np.mean(s.sm_clock) < 1600


def test_lens_on_the_fp32_product_reads_the_fp32_pipe_not_the_tensor_cores(nvml, phases):
    p = phases["fp32_matmul_no_tf32"]
    lens = lens_of(phase_samples(nvml, p))
    estimated = lens.pipes_s["fp32"] / lens.measured_s * match_sku("NVIDIA H200").peak_fp32_tflops
    assert lens.tensor_s == 0 and p["tflops"] == 51.1
    assert abs(estimated / p["tflops"] - 1) < 0.05, estimated            # 51.1 against 51.1


def test_lens_calls_the_copy_memory_bound_and_idle_seconds_no_work(nvml, phases):
    copy = lens_of(phase_samples(nvml, phases["d2d_copy_memory_bound"]))
    assert copy.tensor_s == 0 and copy.bound_s["memory"] >= 0.95 * copy.delivered_s > 0
    for idle in ("idle_start", "idle_end", "host_starved"):
        lens = lens_of(phase_samples(nvml, phases[idle]))
        assert lens.delivered_s < 0.01 and lens.tensor_s < 0.01, idle


def test_the_time_identity_calls_the_burn_throttled_by_power_cap(nvml, phases):
    p = phases["bf16_matmul_burn"]
    s = phase_samples(nvml, p)
    rated = match_sku("NVIDIA H200").rated_sm_clock_mhz
    att = attribute_device((float(s.t[0]), float(s.t[-1] + 1)), s, rated_clock_mhz=rated)
    got = {k: v / NANOHOURS_PER_SECOND for k, v in att.as_dict().items() if v}
    assert sum(got.values()) == pytest.approx(len(s)) and att.fidelity == "samples"
    assert got.get("throttled.power_cap", 0) > 0.15 * len(s), got   # 13.5 of 59 s: the clock the cap took


def test_the_energy_counter_agrees_with_the_power_integral(nvml):
    t, mj, mw = nvml["t_unix"], nvml["total_energy_mj"], nvml["power_mw"]
    readings = [CounterReading(float(a), float(b), 1e-3) for a, b in zip(t, mj)]
    power = [PowerSample(float(a), float(b) / 1000) for a, b in zip(t, mw)]
    e = device_energy(UUID, readings, float(t[0]), float(t[-1]), power)
    assert e.source == "counter" and e.joules == pytest.approx((mj[-1] - mj[0]) / 1000, abs=1e-6)
    pj, covered = power_integral(power, float(t[0]), float(t[-1]))
    assert covered == pytest.approx(t[-1] - t[0]) and abs(pj / e.joules - 1) < 0.002   # 82,188 J vs 82,161 J
    assert 80_000 < e.joules < 85_000


def test_the_violation_counter_matches_nvidia_smis_own_report(nvml):
    """NVML's power-violation time over the capture and nvidia-smi -q's SW Power Capping counter after it."""
    after = (H / "nvidia_smi_q_performance_after_h200.txt").read_text()
    line = next(ln for ln in after.splitlines() if "SW Power Capping" in ln)
    us = int(line.split(":")[1].split()[0])
    assert us == 62_599_965 and nvml["viol_power_ns"][-1] == pytest.approx(us * 1000, rel=1e-6)
    gpu = parse_clock_event_reasons(after)[0]
    assert gpu["pci_bus_id"] == "00000000:00:06.0" and not any(gpu["reasons"].values())   # all Not Active after


def test_nvidia_smi_csv_loop_one_power_sample_per_tick_from_power_draw(nvml):
    """power.draw, power.draw.instant and power.draw.average are one field: one sample a tick, power.draw's."""
    path = R / "nvidia_smi_csv" / "h200_query_loop_1s_driver580_burn_copy.csv"
    c = nvidia_smi.read(path)
    series = c.series[UUID]
    ts, power = series["power_w"]
    assert len(ts) == len(set(ts)) == len(series["gpu_util"][0]) == 228
    rows = [ln.split(", ") for ln in path.read_text().splitlines()[1:]]
    assert list(power[:3]) == [float(r[7].split()[0]) for r in rows[:3]]       # column 8 is power.draw
    reasons = series["clock_reasons"][1]
    assert set(reasons) == {0.0, 1.0, 4.0}                                    # idle, none, sw_power_cap
    assert max(power) < 740 and min(power) > 70
    assert c.devices[UUID].sku == "NVIDIA H200" and c.devices[UUID].pci_bus_id == "00000000:00:06.0"
    assert vals_finite(series["mem_temp_c"][1]) and max(series["gpu_temp_c"][1]) == 60.0


def vals_finite(vs) -> bool:
    return all(not math.isnan(v) for v in vs)


def test_nvidia_smi_xml_loop_is_a_series_of_46_documents():
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "h200_q_x_loop_5s_driver580_burn_copy.xml")
    ts, power = c.series[UUID]["power_w"]
    assert len(ts) == 46 and all(4 <= b - a <= 6 for a, b in zip(ts, ts[1:]))
    assert max(power) == 711.83 and min(power) > 70
    assert set(c.series[UUID]["clock_reasons"][1]) <= {0.0, 1.0, 4.0}
    assert c.series[UUID]["row_remap_failure"][1][0] == 0.0 and c.warnings == []


# --- the same capture stored, then receipted: the FP32 product's FLOPs from the stored FP32 pipe --------------

def _stored_receipt(nvml, phase, tmp_path, runner, cli, version):
    """The phase's NVML seconds stored as a telemetry segment of one run on the H200 (every field the capture
    has that a sample block carries, the FP pipes included), then ``receipt --json`` under a site of method
    ``version``."""
    import os

    from ledger.chain import db as db_mod
    from ledger.chain import store
    from ledger.chain.entries import Kind, make_entry
    from ledger.telemetry.model import Sample
    from ledger.telemetry.sealed import segment_entry, write_segment

    t = nvml["t_unix"]
    m = (t - 1.0 >= phase["start"]) & (t <= phase["end"])
    idx = np.flatnonzero(m)
    pct = lambda k, i: None if math.isnan(nvml[k][i]) else float(nvml[k][i]) / 100.0  # noqa: E731
    samples = [Sample(device=UUID, t=float(t[i]) - 1.0, dt=1.0, clock_reasons=int(nvml["reasons"][i]),
                      sm_active=pct("gpm_sm_util", i), sm_occupancy=pct("gpm_sm_occupancy", i),
                      tensor_active=pct("gpm_any_tensor_util", i), dram_active=pct("gpm_dram_bw_util", i),
                      gpu_util=pct("gpu_util_pct", i), sm_clock_mhz=float(nvml["sm_clock_mhz"][i]),
                      power_w=float(nvml["power_mw"][i]) / 1000.0, fb_used_mib=float(nvml["fb_used_mib"][i]),
                      compute_procs=1.0, fp64_active=pct("gpm_fp64_util", i), fp32_active=pct("gpm_fp32_util", i),
                      fp16_active=pct("gpm_fp16_util", i)) for i in idx.tolist()]
    start, end = samples[0].t, samples[-1].t + 1.0
    url = f"sqlite:///{tmp_path / 'h200.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    key = dict(cluster="c1", job_id="200", run=0)
    store.append(eng, [make_entry(Kind.ALLOCATION_STARTED, start, {"account": "lab", "partition": "gpu",
                                                                   "qos": "normal"}, node="h200", **key),
                       make_entry(Kind.DEVICE_BOUND, start, {"index": 0, "sku": "NVIDIA H200"}, device=UUID,
                                  node="h200", **key)])
    seg = segment_entry(samples, node="h200", source="nvml-gpm")
    write_segment(eng, samples, seg)
    store.append(eng, [make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": 0}, node="h200", **key)])
    eng.dispose()
    cfg = tmp_path / f"site-{version}.toml"
    cfg.write_text(f'method_version = "{version}"\ncompute_precision = "bf16"\n')
    os.chmod(cfg, 0o600)
    res = runner.invoke(cli, ["--db", url, "--config", str(cfg), "receipt", "200", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), seg, url, end - start


def test_a_receipt_from_the_stored_fp32_product_gives_its_measured_tflops(nvml, phases, tmp_path, runner, cli):
    """Stored, the FP32 product's seconds carry the FP32 pipe (sample block format 2), and the receipt's
    achieved FLOPs under method 1.2.0 — the FP32 pipe at the H200's FP32 non-tensor peak — land on the 51.1
    TFLOP/s the load measured; under 1.1.0 the same receipt prices tensor activity only (nothing here)."""
    p = phases["fp32_matmul_no_tf32"]
    body, seg, url, seconds = _stored_receipt(nvml, p, tmp_path, runner, cli, "1.2.0")
    assert seg.data["columns"][-3:] == ["fp64_active", "fp32_active", "fp16_active"]   # carried, not dropped
    ec = body["effective_compute"]
    assert ec["method"]["version"] == "1.2.0" and ec["flops_source"] == "activity"
    assert ec["tensor_gpu_hours"] == 0 and ec["fp32_gpu_hours"] > 0 and ec["unmeasured_gpu_hours"] == 0
    tflops = ec["achieved_pflop_hours"] * 1000.0 / (seconds / 3600.0)
    assert p["tflops"] == 51.1 and abs(tflops / p["tflops"] - 1) < 0.10, tflops          # 51.1 against 51.1
    assert ec["bound_split"]["compute"] == 1.0                                          # the FP32 pipe is high
    (tmp_path / "v11").mkdir()
    old = _stored_receipt(nvml, p, tmp_path / "v11", runner, cli, "1.1.0")[0]["effective_compute"]
    assert old["achieved_pflop_hours"] == 0 and "flops_source" not in old
    assert old["fp32_gpu_hours"] == ec["fp32_gpu_hours"]
    # the stored segment verifies, and its bundle rows carry the pipes (proofcheck checks them alone)
    res = runner.invoke(cli, ["--db", url, "verify", "--json"])
    assert res.exit_code == 0, res.output


def test_a_receipt_from_the_stored_bf16_burn_is_unchanged_by_the_pipes(nvml, phases, tmp_path, runner, cli):
    """The burn's FP pipes read 0: 1.2.0's achieved FLOPs are 1.1.0's, the tensor estimate (+3.5 %)."""
    p = phases["bf16_matmul_burn"]
    body, _seg, _url, seconds = _stored_receipt(nvml, p, tmp_path, runner, cli, "1.2.0")
    ec = body["effective_compute"]
    tflops = ec["achieved_pflop_hours"] * 1000.0 / (seconds / 3600.0)
    assert abs(tflops / p["tflops"] - 1) < 0.10, tflops             # 700.2 against 676.8
    (tmp_path / "v11").mkdir()
    old = _stored_receipt(nvml, p, tmp_path / "v11", runner, cli, "1.1.0")[0]["effective_compute"]
    assert old["achieved_pflop_hours"] == ec["achieved_pflop_hours"]
