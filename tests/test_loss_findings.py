"""A finding for every loss bucket (issue 28): HW slowdown (power brake) and sync-boost losses, measured in the
account's ``throttled.*`` buckets, are named by findings; the sync-boost finding names the slowest member holding
the group back; thermal throttling at high power with normal cooling is found at job scope when each device's
loss is under the device floor. Captures shaped like the issue's misses: one node's ``dcgmi dmon`` file, and a
dcgm-exporter range export with ``hpc_job`` labels."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.sim.captures import DMON_COLUMNS, DMON_UNITS

BRAKED, SLOWEST = 5, 2
HOURS = 6


def _dmon_capture(path: Path, brake: bool = True, sync: bool = True) -> Path:
    """8 GPUs at full load for HOURS at 60 s. GPU BRAKED carries the HW power-brake bit (0x80) at a low clock from
    hour 1 on; from hour 3 to hour 5 the other GPUs carry the sync-boost bit (0x10), held to GPU SLOWEST's clock."""
    lines = ["# ipledger-start 2026-11-02T00:00:00Z node=gpu-07 interval_ms=60000"]
    for k in range(HOURS * 60):
        if k % 14 == 0:
            lines += ["#Entity   " + "  ".join(c for c, _, _ in DMON_COLUMNS), "ID        " + "  ".join(DMON_UNITS)]
        for g in range(8):
            clk, reason, power = 1980, 0, 690 - (k + g) % 5
            if sync and 180 <= k < 300 and g != BRAKED:
                clk, reason = 1500, (0 if g == SLOWEST else 0x10)
                power = 520 if g == SLOWEST else 560
            if brake and g == BRAKED and k >= 60:
                clk, reason, power = 1200, 0x80, 450
            lines.append(f"GPU {g}     0.900  0.700  98  {clk}  {power}.00  70  {reason}  0  60000  0")
    path.write_text("\n".join(lines) + "\n")
    return path


def _analyze(runner, cli, src: Path) -> dict:  # noqa: ANN001
    r = runner.invoke(cli, ["analyze", str(src), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_hw_slowdown_and_sync_boost_losses_are_findings(runner, cli, tmp_path):
    out = _analyze(runner, cli, _dmon_capture(tmp_path / "dmon-gpu-07.txt"))
    found = out["findings"]
    thr = out["account"]["buckets"]["throttled"]
    hw = [f for f in found if f["kind"] == "hw_slowdown"]
    assert [f["scope"]["device_uuid"] for f in hw] == [f"gpu-07/gpu{BRAKED}"], [(f["kind"], f["scope"]) for f in found]
    sb = [f for f in found if f["kind"] == "sync_boost"]
    assert len(sb) == 1 and sb[0]["slowest_device"] == f"gpu-07/gpu{SLOWEST}"
    assert sb[0]["scope"]["node"] == "gpu-07" and f"gpu-07/gpu{SLOWEST}" not in sb[0]["held_devices"]
    # each finding's hours are its bucket's (one device braked, one node held): the account and the findings agree
    assert abs(hw[0]["gpu_hours"] - thr["hw_slowdown"]) < 0.01
    assert abs(sb[0]["gpu_hours"] - thr["sync_boost"]) < 0.01
    assert hw[0]["gpu_hours"] > 1.0 and sb[0]["gpu_hours"] > 1.0


def test_no_reason_bits_no_reason_findings(runner, cli, tmp_path):
    """The same capture without the brake and the sync boost: neither finding (the rule is the bits, not the clock)."""
    found = _analyze(runner, cli, _dmon_capture(tmp_path / "dmon-gpu-07.txt", brake=False, sync=False))["findings"]
    assert not [f for f in found if f["kind"] in ("hw_slowdown", "sync_boost")]


def _prom_export(path: Path) -> Path:
    """A dcgm-exporter range export (the shape bench/scenario.py writes): 2 nodes x 8 GPUs for HOURS at 60 s,
    temperature following power the same way on every GPU (30 + 0.07 W: the cooling is normal). Job `train-1` on
    node a's GPUs 0-3 runs at full power and tensor load; each of those GPUs throttles for heat 40 times (about
    0.2 GPU-h each: under the per-device floor, about 0.8 over the job)."""
    result = []
    n = HOURS * 60
    t0 = 1793577600
    for node in ("a", "b"):
        for g in range(8):
            job = "train-1" if node == "a" and g < 4 else f"other-{node}"
            base = {"gpu": str(g), "UUID": f"GPU-{node}{g}", "modelName": "NVIDIA H100 80GB HBM3",
                    "Hostname": f"node-{node}", "hpc_job": job}
            power = [690.0 if job == "train-1" else 420.0 + 200.0 * ((k // 30 + g) % 2) for k in range(n)]
            hot = [job == "train-1" and 120 + 7 * g <= k < 120 + 7 * g + 40 for k in range(n)]
            series = {"DCGM_FI_PROF_SM_ACTIVE": [0.95] * n, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": [0.8] * n,
                      "DCGM_FI_DEV_POWER_USAGE": power, "DCGM_FI_DEV_GPU_TEMP": [round(30 + 0.07 * p) for p in power],
                      "DCGM_FI_DEV_SM_CLOCK": [1400.0 if h else 1980.0 for h in hot],
                      "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": [0x40 if h else 0 for h in hot],
                      "DCGM_FI_DEV_FB_USED": [60000.0] * n}
            for name, vals in series.items():
                result.append({"metric": {"__name__": name, **base},
                               "values": [[t0 + 60 * k, f"{v:g}"] for k, v in enumerate(vals)]})
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    return path


def test_hot_because_working_is_found_at_job_scope_under_the_device_floor(runner, cli, tmp_path):
    """The issue's miss: a job at full load whose 4 GPUs throttle for heat at high power with normal cooling, each
    under the 0.25 GPU-h device floor: one hot_because_working finding on the job, its hours the job's thermal
    bucket, its evidence power and activity high and the temperature normal for the power; no cooling finding."""
    out = _analyze(runner, cli, _prom_export(tmp_path / "export.json"))
    found = out["findings"]
    working = [f for f in found if f["kind"] == "hot_because_working"]
    assert [f["scope"].get("job_id") for f in working] == ["train-1"], [(f["kind"], f["scope"]) for f in found]
    w = working[0]
    assert w["level"] == "job" and w["devices"] == [f"GPU-a{g}" for g in range(4)]
    assert abs(w["gpu_hours"] - out["account"]["buckets"]["throttled"]["thermal"]) < 0.01
    assert w["gpu_hours"] >= 0.25
    ev = {e["signal"]: e for e in w["evidence"]}
    assert ev["power_w_under_load"]["during"] >= 680 and ev["activity_under_load"]["during"] >= 0.9
    assert abs(ev["gpu_temp_c_above_own_normal_at_same_power"]["during"]) <= 3.0
    assert not [f for f in found if f["kind"] == "hot_because_cooling"]


def test_new_findings_agree_between_device_hours_and_every_sample(runner, cli, tmp_path):
    """`analyze` decides from device-hours by default and from every sample with --samples: the new findings are
    the same (kind, scope, window, GPU-hours, evidence) either way."""
    for src in (_dmon_capture(tmp_path / "dmon-gpu-07.txt"), _prom_export(tmp_path / "export.json")):
        runs = []
        for extra in ([], ["--samples"]):
            r = runner.invoke(cli, ["analyze", str(src), "--json", *extra])
            assert r.exit_code == 0, r.output
            runs.append(sorted((f["kind"], json.dumps(f["scope"], sort_keys=True), f["start"], f["end"],
                                round(f["gpu_hours"], 3), json.dumps(f["evidence"], sort_keys=True))
                               for f in json.loads(r.output)["findings"]
                               if f["kind"] in ("hw_slowdown", "sync_boost", "hot_because_working")))
        assert runs[0] and runs[0] == runs[1]


def test_a_node_with_no_job_labels_and_no_process_is_unallocated_not_idle_held(runner, cli, tmp_path):
    """The issue's false alarm: an export with no job labels (one run per node), one node idle with no process,
    was `idle_held` at high confidence. It is `unallocated` capacity on that node, its hours the account's
    `unallocated` line, and no idle_held finding or tell-the-tenant recommendation; the busy node has neither."""
    src = _prom_export(tmp_path / "export.json")
    d = json.loads(src.read_text())
    for s in d["data"]["result"]:
        s["metric"].pop("hpc_job")
        if s["metric"]["Hostname"] == "node-b":
            name = s["metric"]["__name__"]
            zero = name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_FB_USED")
            s["values"] = [[t, "0" if zero else ("70" if name == "DCGM_FI_DEV_POWER_USAGE" else v)]
                           for t, v in s["values"]]
    src.write_text(json.dumps(d))
    for extra in ([], ["--samples"]):
        r = runner.invoke(cli, ["analyze", str(src), "--json", *extra])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        found = out["findings"]
        assert not [f for f in found if f["kind"] in ("idle_held", "tell_tenant_idle")], [f["kind"] for f in found]
        un = [f for f in found if f["kind"] == "unallocated"]
        assert [f["scope"]["node"] for f in un] == ["node-b"] and un[0]["gpu_hours"] >= 0.9 * 8 * HOURS
        assert abs(out["account"]["by_cause"]["unallocated"] - un[0]["gpu_hours"]) < 0.1
