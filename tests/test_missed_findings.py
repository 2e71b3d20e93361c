"""Issue 28's misses and false alarms, each on a capture shaped like it, through `ipledger analyze`: one GPU hot at
the same power as its siblings (hot_because_cooling at device scope); an 8-GPU job's model loading at its start
(not `starved`); the hours silent after an XID 79 (on the XID finding); a job that ends inside a collector outage
(its share of the hole is unknown); ECC drift from the volatile counter alone; a power cap on one MI300X from
amd-smi's violation statuses (a power finding, not sibling_divergence)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ledger.sim.captures import DMON_COLUMNS, DMON_UNITS

HOT_NODE, HOT_GPU = "gpu-01", 5
HOT_FROM, HOT_TO = 2 * 60, 6 * 60          # minutes: the hot GPU's fan failure


def _dmon_line(g: int, sm: float, clk: float, power: float, temp: float, reasons: int = 0, xid: int = 0,
               fb: float = 60000, ecc: float = 0) -> str:
    return (f"GPU {g}     {sm:.3f}  {0.8 * sm:.3f}  {100 * sm:.0f}  {clk:.0f}  {power:.2f}  {temp:.0f}  {reasons}  "
            f"{xid}  {fb:.0f}  {ecc:.0f}")


def _header() -> list[str]:
    return ["#Entity   " + "  ".join(c for c, _, _ in DMON_COLUMNS), "ID        " + "  ".join(DMON_UNITS)]


def _cooling_set(out: Path, hot: bool = True, whole_node: bool = False) -> Path:
    """Two nodes' `dcgmi dmon` files, 8 GPUs each at full load for 8 hours at 60 s, power stepping between 560 and
    660 W, temperature 30 + 0.07 W on every GPU (the cooling is normal). With ``hot``: GPU HOT_GPU of HOT_NODE runs
    14 degC hotter at the same power from HOT_FROM to HOT_TO (its fan failed) and, above 85 degC, throttles for heat
    (reason 0x20, a lower clock, a few watts less). ``whole_node``: all of that node's GPUs do (a node problem)."""
    out.mkdir(parents=True, exist_ok=True)
    for node in (HOT_NODE, "gpu-02"):
        lines = [f"# ipledger-start 2026-11-02T00:00:00Z node={node} interval_ms=60000"]
        for k in range(8 * 60):
            if k % 30 == 0:
                lines += _header()
            for g in range(8):
                power = 560.0 + 100.0 * ((k // 20 + g) % 2) + (k + g) % 3
                temp, clk, reasons = 30 + 0.07 * power, 1980.0, 0
                if hot and node == HOT_NODE and (whole_node or g == HOT_GPU) and HOT_FROM <= k < HOT_TO:
                    temp += 14
                    if temp >= 85:
                        clk, reasons, power = 1500.0, 0x20, power - 5
                lines.append(_dmon_line(g, 0.95, clk, power, temp, reasons))
        (out / f"dmon-{node}.txt").write_text("\n".join(lines) + "\n")
    return out


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _analyze(runner, cli, *args: str) -> dict:  # noqa: ANN001
    r = runner.invoke(cli, ["analyze", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_one_gpu_hot_at_its_siblings_power_is_device_scope_cooling(runner, cli, tmp_path):
    """The issue's miss: one GPU hot at the same power as its siblings had no rule (cooling was judged per node or
    rack). It is hot_because_cooling at device scope, its window the fan failure's, its GPU-hours its thermal
    throttling, its evidence the residual against its siblings' at the same hours and its power against theirs;
    its node is not called hot, nor is the heat the workload's; the recommendation names the GPU."""
    src = _cooling_set(tmp_path / "captures")
    dev = f"{HOT_NODE}/gpu{HOT_GPU}"
    for extra in ([], ["--samples"]):
        out = _analyze(runner, cli, str(src), *extra)
        found = out["findings"]
        cool = [f for f in found if f["kind"] == "hot_because_cooling"]
        assert [(f["level"], f["scope"]["device_uuid"], f["scope"]["node"]) for f in cool] == \
            [("device", dev, HOT_NODE)], [(f["kind"], f["level"], f["scope"]) for f in found]
        c = cool[0]
        t0 = 1793577600
        a, b = _epoch(c["start"]), _epoch(c["end"])
        assert t0 + HOT_FROM * 60 - 3600 <= a and b <= t0 + HOT_TO * 60 + 3600 and b - a >= 2 * 3600
        assert abs(c["gpu_hours"] - out["account"]["buckets"]["throttled"]["thermal"]) < 0.01
        assert c["gpu_hours"] > 0.3 and c["confidence"] >= 0.7
        ev = {e["signal"]: e for e in c["evidence"]}
        resid = ev["gpu_temp_c_above_own_normal_at_same_power"]
        assert resid["during"] >= 10 and abs(resid["reference"]) <= 2 and "siblings" in resid["reference_label"]
        power = ev["power_w_under_load"]
        assert abs(power["during"] - power["reference"]) <= 0.1 * power["reference"]
        assert not [f for f in found if f["kind"] == "hot_because_working" and f["scope"].get("device_uuid") == dev]
        rec = [f for f in found if f["kind"] == "inspect_cooling"]
        assert len(rec) == 1 and dev in rec[0]["summary"] and rec[0]["scope"]["device_uuid"] == dev
        assert out["account"]["by_cause"]["cooling"] > 0.3


def test_a_whole_hot_node_stays_a_node_finding_and_a_healthy_set_has_none(runner, cli, tmp_path):
    found = _analyze(runner, cli, str(_cooling_set(tmp_path / "node", whole_node=True)))["findings"]
    cool = [(f["level"], f["scope"]["node"]) for f in found if f["kind"] == "hot_because_cooling"]
    assert cool == [("node", HOT_NODE)], cool
    found = _analyze(runner, cli, str(_cooling_set(tmp_path / "fine", hot=False)))["findings"]
    assert not [f for f in found if f["kind"] in ("hot_because_cooling", "hot_because_working")]


T0 = 1793577600


def _prom(series: list[tuple[dict, dict[str, list]]], path: Path, t_from: list[int]) -> Path:
    """A dcgm-exporter range export at 60 s: each (labels, {metric: values}) from minute t_from[i]."""
    result = []
    for (labels, metrics), k0 in zip(series, t_from):
        for name, vals in metrics.items():
            result.append({"metric": {"__name__": name, **labels},
                           "values": [[T0 + 60 * (k0 + k), f"{v:g}"] for k, v in enumerate(vals) if v is not None]})
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    return path


def _gpu_labels(node: str, g: int, job: str) -> dict:
    return {"gpu": str(g), "UUID": f"GPU-{node}{g}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": f"node-{node}",
            "hpc_job": job}


LOAD_MIN, STALL_AT, STALL_MIN = 5, 150, 12


def _startup_export(path: Path, stall: bool, load_min: int = LOAD_MIN) -> Path:
    """Node a's 8 GPUs run job `prep` for the first hour, then the 8-GPU job `train-8` for 5 hours: its first
    ``load_min`` minutes load the model (activity 0, the framebuffer filling from 2 to 70 GiB), then full load.
    With ``stall``: a data-loader stall of STALL_MIN minutes at minute STALL_AT (activity 0, memory resident).
    Node b runs one job throughout."""
    series, starts = [], []
    for g in range(8):
        series.append((_gpu_labels("a", g, "prep"), {"DCGM_FI_PROF_SM_ACTIVE": [0.9] * 60,
                                                     "DCGM_FI_DEV_FB_USED": [40000] * 60,
                                                     "DCGM_FI_DEV_POWER_USAGE": [600] * 60}))
        starts.append(0)
        act, fb = [], []
        for k in range(300):
            loading = k < load_min
            stalled = stall and STALL_AT <= k < STALL_AT + STALL_MIN
            act.append(0.0 if loading or stalled else 0.92)
            fb.append(2000 + (70000 - 2000) * k / load_min if loading else 70000)
        series.append((_gpu_labels("a", g, "train-8"), {"DCGM_FI_PROF_SM_ACTIVE": act, "DCGM_FI_DEV_FB_USED": fb,
                                                        "DCGM_FI_DEV_POWER_USAGE": [120 if x == 0 else 650
                                                                                    for x in act]}))
        starts.append(60)
        series.append((_gpu_labels("b", g, "serve-b"), {"DCGM_FI_PROF_SM_ACTIVE": [0.7] * 360,
                                                        "DCGM_FI_DEV_FB_USED": [30000] * 360,
                                                        "DCGM_FI_DEV_POWER_USAGE": [500] * 360}))
        starts.append(0)
    return _prom(series, path, starts)


def test_an_8_gpu_jobs_model_loading_is_not_starved(runner, cli, tmp_path):
    """The issue's false alarm: the minutes of model loading at an 8-GPU job's start (activity near 0, memory
    rising) were `starved` at 0.70. No starved finding; the receipt's starved bucket still holds those minutes
    (the method is unchanged) — they are just not a job waiting on data."""
    for extra in ([], ["--samples"]):
        out = _analyze(runner, cli, str(_startup_export(tmp_path / "load.json", stall=False)), *extra)
        assert not [f for f in out["findings"] if f["kind"] == "starved"], [f["kind"] for f in out["findings"]]
        assert abs(out["account"]["buckets"]["starved"] - 8 * LOAD_MIN / 60) < 0.05


def test_a_stall_later_in_the_job_is_still_starved_and_only_the_stall(runner, cli, tmp_path):
    """The same job with a 12-minute data-loader stall mid-run: one starved finding, its window the stall's and its
    GPU-hours the stall's 8 x 12 minutes (the loading minutes are not in it)."""
    out = _analyze(runner, cli, str(_startup_export(tmp_path / "stall.json", stall=True)))
    st = [f for f in out["findings"] if f["kind"] == "starved"]
    assert [f["scope"]["job_id"] for f in st] == ["train-8"]
    assert abs(st[0]["gpu_hours"] - 8 * STALL_MIN / 60) < 0.02
    assert _epoch(st[0]["start"]) == T0 + 60 * (60 + STALL_AT)


def test_a_start_that_never_gets_going_is_starved(runner, cli, tmp_path):
    """Forty minutes at activity 0 from the job's start is no start-up (it ends within STARTUP_MAX_S): starved."""
    out = _analyze(runner, cli, str(_startup_export(tmp_path / "slow.json", stall=False, load_min=40)))
    st = [f for f in out["findings"] if f["kind"] == "starved"]
    assert [f["scope"]["job_id"] for f in st] == ["train-8"] and st[0]["gpu_hours"] >= 8 * 39 / 60


XID_AT, XID_TAIL, XID_BACK = 120, 3, 300


def _xid_export(path: Path) -> Path:
    """Two nodes x 8 GPUs, one job per node for 8 hours. GPU 3 of node a raises XID 79 at minute XID_AT: the
    exporter reports it XID_TAIL more times (activity 0, no memory: the process died), then nothing until minute
    XID_BACK, when it comes back idle (the job still holds it)."""
    series = []
    for node in "ab":
        for g in range(8):
            act, xid, fb, pw = [], [], [], []
            for k in range(480):
                dead = node == "a" and g == 3 and k >= XID_AT
                if dead and XID_AT + XID_TAIL <= k < XID_BACK:
                    vals = (None, None, None, None)
                else:
                    vals = (0.0, 79 if k < XID_BACK else 0, 0, 70) if dead else (0.9, 0, 50000, 600)
                for col, v in zip((act, xid, fb, pw), vals):
                    col.append(v)
            series.append((_gpu_labels(node, g, f"job-{node}"), {
                "DCGM_FI_PROF_SM_ACTIVE": act, "DCGM_FI_DEV_XID_ERRORS": xid, "DCGM_FI_DEV_FB_USED": fb,
                "DCGM_FI_DEV_POWER_USAGE": pw}))
    return _prom(series, path, [0] * len(series))


def test_the_hours_silent_after_an_xid_79_are_on_the_xid_finding(runner, cli, tmp_path):
    """The issue's miss: the silence after an XID 79 was a separate unknown gap and `hours_silent_after_xid` stayed
    0 (the device answered a few more scrapes before it fell silent). The silence is on the XID finding (evidence
    `hours_silent_after_xid`, and in its GPU-hours), no unknown gap is reported for it, and the account's `xid`
    line holds the device's lost hours (none left unknown)."""
    src = _xid_export(tmp_path / "xid.json")
    silent_h = (XID_BACK - XID_AT - XID_TAIL) / 60
    for extra in ([], ["--samples"]):
        out = _analyze(runner, cli, str(src), *extra)
        found = [f for f in out["findings"] if f["agent"] != "recommendation"]
        xid = [f for f in found if f["kind"] == "xid"]
        assert [f["scope"]["device_uuid"] for f in xid] == ["GPU-a3"], [(f["kind"], f["scope"]) for f in found]
        ev = {e["signal"]: e for e in xid[0]["evidence"]}
        assert abs(ev["hours_silent_after_xid"]["during"] - silent_h) < 0.05
        assert xid[0]["gpu_hours"] >= silent_h
        assert not [f for f in found if f["kind"] == "unknown_gap"], [(f["kind"], f["scope"]) for f in found]
        lines = out["account"]["by_cause"]
        lost_on_gpu = (480 - XID_AT) / 60     # from the XID to the end: silent, then idle held
        assert abs(lines["xid"] - lost_on_gpu) < 0.05 and lines["unknown (no finding)"] < 0.01


OUT_FROM, OUT_TO, JOB_END = 240, 360, 270   # minutes: node a's collector outage; job-a1's true end inside it


def _outage_export(path: Path, next_job: bool) -> Path:
    """Node a: job-a1 on GPUs 0-3 ends at minute JOB_END, inside the collector outage [OUT_FROM, OUT_TO) (no
    sample from any of its GPUs); after it GPUs 0-3 report with no job label (idle) or, with ``next_job``, job-a3's
    label; job-a2 holds GPUs 4-7 throughout. Node b's job runs through, its collector up."""
    series, starts = [], []

    def add(node: str, g: int, job: str | None, k0: int, k1: int, act: float) -> None:
        labels = _gpu_labels(node, g, job or "")
        if job is None:
            labels.pop("hpc_job")
        vals = [None if node == "a" and OUT_FROM <= k < OUT_TO else act for k in range(k0, k1)]
        series.append((labels, {"DCGM_FI_PROF_SM_ACTIVE": vals,
                                "DCGM_FI_DEV_FB_USED": [None if v is None else (50000 if act else 0) for v in vals],
                                "DCGM_FI_DEV_POWER_USAGE": [None if v is None else 600 * act + 70 for v in vals]}))
        starts.append(k0)

    for g in range(8):
        if g < 4:
            add("a", g, "job-a1", 0, JOB_END, 0.9)
            add("a", g, "job-a3" if next_job else None, JOB_END, 480, 0.9 if next_job else 0.0)
        else:
            add("a", g, "job-a2", 0, 480, 0.9)
        add("b", g, "job-b", 0, 480, 0.9)
    return _prom(series, path, starts)


def test_a_job_that_ends_inside_a_collector_outage_keeps_its_share_of_the_hole(runner, cli, tmp_path):
    """The issue's miss: a job ending inside a collector outage lost its share of the hole (its labels stop where
    the outage starts, so it was taken to end there: unknown 3.00 vs 5.27). Its end is unknown inside the hole: it
    is held to the hole's midpoint, so the unknown time is job-a2's whole hole (4 GPUs x 2 h) and half of job-a1's
    (4 GPUs x 1 h); with a next job starting inside the hole, the other half is that job's: the whole hole of
    GPUs 0-3 is unknown, split between the two runs at its midpoint."""
    hole_h = (OUT_TO - OUT_FROM) / 60
    for next_job, want in ((False, 4 * hole_h + 4 * hole_h / 2), (True, 8 * hole_h)):
        out = _analyze(runner, cli, str(_outage_export(tmp_path / f"outage-{next_job}.json", next_job)))
        unknown = out["account"]["buckets"]["unknown"]
        assert abs(unknown - want) < 0.02, (next_job, unknown, want)
        gaps = [f for f in out["findings"] if f["kind"] == "unknown_gap"]
        assert [f["cause"] for f in gaps] == ["collector_down"] and gaps[0]["scope"]["node"] == "node-a"
        assert abs(gaps[0]["gpu_hours"] - want) < 0.02
        assert abs(out["account"]["by_cause"]["collector_down"] - want) < 0.02
        r = runner.invoke(cli, ["analyze", str(tmp_path / f"outage-{next_job}.json"), "--json", "--samples"])
        assert abs(json.loads(r.output)["account"]["buckets"]["unknown"] - want) < 0.02


ECC_GPU, ECC_FROM = 2, 2


def _ecc_export(path: Path, field: str) -> Path:
    """Two nodes x 8 GPUs at work for 8 hours, only one correctable-ECC counter exported (``field``). GPU ECC_GPU of
    node a: from hour ECC_FROM its errors double every hour (4, 8, 16, ... per hour); the others a trickle (one
    every 3 hours on some)."""
    series = []
    for node in "ab":
        for g in range(8):
            count, ecc = 0.0, []
            for k in range(480):
                h, m = divmod(k, 60)
                if node == "a" and g == ECC_GPU and h >= ECC_FROM and m % max(1, 60 // 2 ** (h - ECC_FROM + 2)) == 0:
                    count += 1
                elif (g + h) % 3 == 0 and m == 30:
                    count += 1
                ecc.append(count)
            series.append((_gpu_labels(node, g, f"job-{node}"), {
                "DCGM_FI_PROF_SM_ACTIVE": [0.9] * 480, "DCGM_FI_DEV_FB_USED": [50000] * 480,
                "DCGM_FI_DEV_POWER_USAGE": [600] * 480, field: ecc}))
    return _prom(series, path, [0] * len(series))


def test_ecc_drift_from_the_volatile_counter_alone(runner, cli, tmp_path, sqlite_url):
    """The issue's miss: ECC drift was missed when only the volatile SBE counter (field 310) is exported. It is
    found from field 310 as from the aggregate (312), on the device-hours and on every sample, and through a
    ledger (`import` + `findings`, which reads the sealed device-hours' volatile columns)."""
    dev = f"GPU-a{ECC_GPU}"
    for field in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"):
        src = _ecc_export(tmp_path / f"{field}.json", field)
        for extra in ([], ["--samples"]):
            found = _analyze(runner, cli, str(src), *extra)["findings"]
            ecc = [f for f in found if f["kind"] == "ecc_drift"]
            assert [f["scope"]["device_uuid"] for f in ecc] == [dev], (field, [(f["kind"], f["scope"]) for f in found])
            assert _epoch(ecc[0]["start"]) <= T0 + (ECC_FROM + 2) * 3600
    env = {"IPLEDGER_CONFIG": ""}
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(tmp_path / "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL.json"),
                            "--quiet"], env=env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "findings", "--json"], env=env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["source"] == "device_hours"
    assert [f["scope"]["device_uuid"] for f in out["findings"] if f["kind"] == "ecc_drift"] == [dev]
    assert runner.invoke(cli, ["--db", sqlite_url, "verify"], env=env).exit_code == 0


def test_a_ledger_sealed_before_the_volatile_ecc_columns_still_verifies(runner, cli, tmp_path, sqlite_url):
    """The volatile ECC extremes are new sealed columns (migration 0008): a ledger whose device-hours were sealed
    before holds NULL there and still verifies; a stored value that the samples do not give is a mismatch."""
    import sqlite3

    env = {"IPLEDGER_CONFIG": ""}
    src = _ecc_export(tmp_path / "vol.json", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    assert runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--quiet"], env=env).exit_code == 0
    db = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as con:   # as a ledger sealed before migration 0008 holds them (the triggers set aside)
        for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'device_hours'"
                               ).fetchall():
            con.execute(f"DROP TRIGGER {row[0]}")
        assert con.execute("SELECT count(*) FROM device_hours WHERE eccv_max IS NOT NULL").fetchone()[0] > 0
        con.execute("UPDATE device_hours SET eccv_min = NULL, eccv_max = NULL")
    assert runner.invoke(cli, ["--db", sqlite_url, "verify"], env=env).exit_code == 0
    with sqlite3.connect(db) as con:
        con.execute("UPDATE device_hours SET eccv_max = 12345 WHERE rowid = (SELECT min(rowid) FROM device_hours)")
    r = runner.invoke(cli, ["--db", sqlite_url, "verify"], env=env)
    assert r.exit_code != 0 and "eccv_max" in r.output, r.output


AMD_METRIC_COLS = ("timestamp,gpu,gfx_activity,umc_activity,socket_power,gfx_0_clk,mem_0_clk,hotspot,mem,"
                   "prochot_violation_status,ppt_violation_status,socket_thermal_violation_status,"
                   "vr_thermal_violation_status,hbm_thermal_violation_status,throttle_status")


def _amd_metric_capture(path: Path, capped: int) -> Path:
    """`amd-smi metric --csv -w 60` of 8 MI300X for 6 hours as amd-smi writes it (its watch banner, CRLF, the header
    again at each iteration), GPU ``capped`` held at a 420 W power cap from hour 1: `ppt_violation_status` ACTIVE and
    `throttle_status` THROTTLED on its rows, a lower clock than its siblings at full activity."""
    lines = ["'CTRL' + 'C' to stop watching output:"]
    for k in range(6 * 60):
        lines.append(AMD_METRIC_COLS)
        for g in range(8):
            cap = g == capped and k >= 60
            power, clk = (420, 1420) if cap else (700 - (k + g) % 7, 2100)
            status = "ACTIVE" if cap else "NOT ACTIVE"
            lines.append(f"{T0 + 60 * k},{g},97,40,{power},{clk},1300,{72 if cap else 84},70,NOT ACTIVE,{status},"
                         f"NOT ACTIVE,NOT ACTIVE,NOT ACTIVE,{'THROTTLED' if cap else 'UNTHROTTLED'}")
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return path


def test_a_power_cap_on_one_mi300x_from_amd_smi_metric_statuses_is_power_cap(runner, cli, tmp_path):
    """The issue's false alarm, on `amd-smi metric` CSV: a power cap held on one MI300X was `sibling_divergence`
    with a drain/RMA recommendation because `ppt_violation_status` / `throttle_status` were not mapped. Mapped
    (PPT -> the power-cap reason 0x4), it is a power_cap finding on that GPU, its hours the account's power-cap
    bucket, and no sibling_divergence or drain/RMA on it."""
    src = _amd_metric_capture(tmp_path / "amdsmi-mi300-01.csv", capped=5)
    for extra in ([], ["--samples"]):
        out = _analyze(runner, cli, str(src), *extra)
        on_gpu = [f for f in out["findings"] if f["scope"].get("device_uuid") == "mi300-01/gpu5"]
        kinds = {f["kind"] for f in on_gpu}
        assert "power_cap" in kinds and not kinds & {"sibling_divergence", "drain_and_check_device",
                                                    "reseat_or_rma_device"}, kinds
        cap = next(f for f in on_gpu if f["kind"] == "power_cap")
        assert abs(cap["gpu_hours"] - out["account"]["buckets"]["throttled"]["power_cap"]) < 0.01
        assert cap["gpu_hours"] > 1.0
        assert not [f for f in out["findings"] if f["kind"] == "sibling_divergence"]


def _unlabelled_startup_set(out: Path, stall: bool, load_min: int = LOAD_MIN) -> Path:
    """Two nodes' `dcgmi dmon` files with no job labels at 60 s (one run per node). gpu-01's 8 GPUs hold nothing
    for an hour (framebuffer 0), then a job arrives: ``load_min`` minutes loading (SM active 0, framebuffer filling
    2 to 70 GiB), then full load for 4 hours; with ``stall`` a STALL_MIN-minute stall at minute STALL_AT of it
    (activity 0, memory resident). gpu-02 runs one steady job throughout."""
    out.mkdir(parents=True, exist_ok=True)
    for node in ("gpu-01", "gpu-02"):
        lines = [f"# ipledger-start 2026-11-02T00:00:00Z node={node} interval_ms=60000"]
        for k in range(5 * 60 + load_min):
            if k % 30 == 0:
                lines += _header()
            j = k - 60                       # minutes since gpu-01's job arrived
            for g in range(8):
                if node == "gpu-02":
                    sm, fb = 0.8, 30000
                elif j < 0:
                    sm, fb = 0.0, 0
                elif j < load_min:
                    sm, fb = 0.0, 2000 + (70000 - 2000) * j / load_min
                else:
                    sm = 0.0 if stall and STALL_AT <= j - load_min < STALL_AT + STALL_MIN else 0.92
                    fb = 70000
                lines.append(_dmon_line(g, sm, 1980.0, 120.0 if sm == 0 else 620.0, 55.0, fb=fb))
        (out / f"dmon-{node}.txt").write_text("\n".join(lines) + "\n")
    return out


def test_model_loading_inside_a_label_less_capture_is_not_starved(runner, cli, tmp_path):
    """A capture with no job labels has one run per node over the whole capture, so a job's start is where a device
    that held nothing is held again: its loading minutes are start-up, not `starved` (the report-on generator's
    false alarms: start-ups in label-less node captures called starved at >= 0.7). The free hour before it is
    unallocated capacity, not idle-held."""
    src = _unlabelled_startup_set(tmp_path / "load", stall=False)
    for extra in ([], ["--samples"]):
        out = _analyze(runner, cli, str(src), *extra)
        kinds = [f["kind"] for f in out["findings"]]
        assert "starved" not in kinds, kinds
        assert abs(out["account"]["buckets"]["starved"] - 8 * LOAD_MIN / 60) < 0.05   # the method is unchanged
        free = [f for f in out["findings"] if f["kind"] == "unallocated"]
        assert [f["scope"].get("node") for f in free] == ["gpu-01"], kinds


def test_a_stall_inside_a_label_less_capture_is_still_starved(runner, cli, tmp_path):
    out = _analyze(runner, cli, str(_unlabelled_startup_set(tmp_path / "stall", stall=True)))
    st = [f for f in out["findings"] if f["kind"] == "starved"]
    assert len(st) == 1 and abs(st[0]["gpu_hours"] - 8 * STALL_MIN / 60) < 0.02, st
    assert _epoch(st[0]["start"]) == T0_DMON + 60 * (60 + LOAD_MIN + STALL_AT)


def test_a_label_less_start_that_never_gets_going_is_starved(runner, cli, tmp_path):
    out = _analyze(runner, cli, str(_unlabelled_startup_set(tmp_path / "slow", stall=False, load_min=40)))
    st = [f for f in out["findings"] if f["kind"] == "starved"]
    assert len(st) == 1 and st[0]["gpu_hours"] >= 8 * 39 / 60, st


T0_DMON = datetime.fromisoformat("2026-11-02T00:00:00+00:00").timestamp()
