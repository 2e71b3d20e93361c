"""The node collector: dmon batches into the spool with embedded rows, ownership from the hooks' spool,
gaps (in-batch holes and a failing source) recorded instead of dying, and ship -> samples table -> verify."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from ledger.capture import collector, spool
from ledger.base import commands
from ledger.chain import db as db_mod
from ledger.chain.entries import Kind, make_entry
from ledger.ingest.ship import ship
from ledger.chain.store import iter_entries
from ledger.telemetry.sealed import load_samples

T0 = 1767225600.0  # sample times are refused before 2000 (ledger/importers/common.py EARLIEST_TS)

# A dcgmi stand-in: prints `dcgmi dmon` output in the real layout (header pair, N/A on the first tick,
# header repeated), COUNT ticks for 2 GPUs; GPU 1 is missing on ticks listed in $DMON_SKIP.
DCGMI = r'''#!{python}
import os, sys
args = sys.argv[1:]
if os.environ.get("DMON_DOWN"):
    print("Error: unable to establish a connection to the specified host: localhost", file=sys.stderr)
    sys.exit(255)
assert args[0] == "dmon", args
count = int(args[args.index("-c") + 1])
skip = {{int(x) for x in os.environ.get("DMON_SKIP", "").split(",") if x}}
fields = args[args.index("-e") + 1].split(",")
head = "#Entity    " + " ".join(f"{{'F' + f:<12}}" for f in fields)
names = {{"1002": "SMACT", "203": "GPUTL", "155": "POWER", "156": "TOTEC"}}
head = "#Entity    " + "".join(f"{{names.get(f, 'X' + f[-4:]):<13}}" for f in fields)
for k in range(count):
    if k % 14 == 0:
        print(head)
        print("ID")
    for g in (0, 1):
        if g == 1 and k in skip:
            continue
        vals = []
        for f in fields:
            if k == 0 and f == "1002":
                vals.append("N/A")
            elif f == "1002":
                vals.append(f"{{0.5 + g / 10:.3f}}")
            elif f == "203":
                vals.append(str(50 + g))
            elif f == "155":
                vals.append("300.000")
            elif f == "156":
                vals.append(str(1000000 + 300000 * k))
            else:
                vals.append("N/A")
        print(f"GPU {{g}}      " + "".join(f"{{v:<13}}" for v in vals))
'''


def _standin(tmp_path: Path) -> str:
    p = tmp_path / "dcgmi"
    p.write_text(DCGMI.format(python=sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def _hooks_spool(sp: Path) -> None:
    key = dict(cluster="hpc1", job_id="77", run=0, node="n01")
    spool.write(sp, [make_entry(Kind.ALLOCATION_STARTED, 1000, {"account": "a"}, **key).to_record(),
                     make_entry(Kind.DEVICE_BOUND, 1000, {"index": 1, "uuid": "GPU-one", "sku": "H100", "node": "n01"},
                                device="GPU-one", **key).to_record()], prefix="hook")


def test_collect_once_ship_verify(tmp_path, monkeypatch, ledger_url):
    sp = tmp_path / "spool"
    _hooks_spool(sp)
    monkeypatch.setenv("DMON_SKIP", "5,6,7,8,9,10")     # GPU 1 silent for 6 ticks > 3 x cadence
    cfg = collector.CollectorConfig(spool=str(sp), node="n01", source="dcgmi", interval=1.0, count=20,
                                    cluster="hpc1", commands={"dcgmi": _standin(tmp_path)})
    rep = collector.collect_batch(cfg, now=lambda: T0)
    assert rep.error is None and rep.devices == 2 and rep.gaps == 1
    assert rep.samples == 20 + 14
    recs = spool.read(Path(rep.spool_file)).records
    segs = [r for r in recs if r["kind"] == Kind.TELEMETRY_SEGMENT]
    gaps = [r for r in recs if r["kind"] == Kind.UNKNOWN_INTERVAL]
    assert {r["device"] for r in segs} == {"n01/gpu0", "GPU-one"}        # index 1 -> the hooks' UUID
    owned = next(r for r in segs if r["device"] == "GPU-one")
    assert json.loads(owned["payload"])["owner"] == {"cluster": "hpc1", "job_id": "77", "run": 0}
    (gap,) = gaps
    assert (gap["device"], gap["job_id"], json.loads(gap["payload"])["cause"]) == ("GPU-one", "77", "collector_down")
    eng = db_mod.make_engine(ledger_url)
    try:
        report = ship(eng, sp)
        assert not report.errors
        got = load_samples(eng, ["GPU-one"])
        assert len(got) == 14 and got[0].sm_active is None and got[1].sm_active == 0.6
        assert got[1].gpu_util == 0.51 and got[1].energy_j == 1300.0
        from ledger.chain.verify import verify

        assert verify(eng).ok
        kinds = [ce.entry.kind for ce in iter_entries(eng)]
        assert kinds.count(Kind.TELEMETRY_SEGMENT) == 2
    finally:
        eng.dispose()


def test_failing_source_records_a_gap_and_keeps_going(tmp_path, monkeypatch):
    sp = tmp_path / "spool"
    monkeypatch.setenv("DMON_DOWN", "1")
    cfg = collector.CollectorConfig(spool=str(sp), node="n02", source="dcgmi", interval=1.0, count=5,
                                    commands={"dcgmi": _standin(tmp_path)})
    reports = []
    monkeypatch.setattr(collector.time, "sleep", lambda s: None)
    assert collector.run(cfg, batches=2, on_batch=reports.append) == 2
    assert all(r.error and r.error.startswith("collector_down") for r in reports)
    recs = [r for p in spool.pending_files(sp) for r in spool.read(p).records]
    assert len(recs) == 2 and all(json.loads(r["payload"])["scope"] == "node" for r in recs)
    # a missing tool is a gap too, not a crash
    cfg2 = collector.CollectorConfig(spool=str(sp), node="n02", source="dcgmi", count=1,
                                     commands={"dcgmi": str(tmp_path / "absent")})
    rep = collector.collect_batch(cfg2)
    assert rep.error.startswith("collector_down") and rep.gaps == 1


def test_collector_runs_only_allowlisted_commands(tmp_path, monkeypatch):
    seen = []
    real = commands._SPAWN

    def spy(argvs, **kw):
        seen.extend(argvs)
        return real(argvs, **kw)

    monkeypatch.setattr(commands, "_SPAWN", spy)
    cfg = collector.CollectorConfig(spool=str(tmp_path / "s"), node="n", source="dcgmi", count=2,
                                    commands={"dcgmi": _standin(tmp_path)})
    collector.collect_batch(cfg)
    assert len(seen) == 1 and seen[0][1] == "dmon"
    for argv in seen:
        commands.check_allowed("dcgmi", argv[1:])


def test_collect_cli_once(runner, cli, tmp_path):
    sp = tmp_path / "spool"
    conf = tmp_path / "c.toml"
    conf.write_text(f'spool = "{sp}"\n[commands]\ndcgmi = "{_standin(tmp_path)}"\n')
    r = runner.invoke(cli, ["--config", str(conf), "collect", "--source", "dcgmi", "--once", "--count", "3",
                            "--interval", "1s", "--node", "n9", "--json"], env={"IPLEDGER_SPOOL": ""})
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["devices"] == 2 and out["samples"] == 6 and out["error"] is None
    assert len(spool.pending_files(sp)) == 1
    unit = (Path(__file__).parent.parent / "slurm" / "ipledger-collector.service").read_text()
    assert "collect" in unit and "[Install]" in unit and os.path.isabs(unit.split("ExecStart=")[1].split()[0])


AMDSMI = r'''#!{python}
import json, sys
assert sys.argv[1:] == ["metric", "--json"], sys.argv
print(json.dumps([{{"gpu": g, "usage": {{"gfx_activity": {{"value": 40 + g, "unit": "%"}}, "umc_activity": "N/A"}},
                   "power": {{"socket_power": {{"value": 300, "unit": "W"}}}},
                   "energy": {{"total_energy_consumption": {{"value": 1234.5, "unit": "J"}}}}}} for g in (0, 1)]))
'''


def test_amd_smi_source(tmp_path):
    p = tmp_path / "amd-smi"
    p.write_text(AMDSMI.format(python=sys.executable))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    cfg = collector.CollectorConfig(spool=str(tmp_path / "s"), node="mi", source="amd-smi", interval=2.0, count=3,
                                    commands={"amd-smi": str(p)})
    rep = collector.collect_batch(cfg, now=lambda: T0 + 100, sleep=lambda s: None)
    assert rep.error is None and rep.devices == 2 and rep.samples == 6 and rep.gaps == 0
    segs = spool.read(Path(rep.spool_file)).records
    rows = {r["device"]: r["samples"] for r in segs}
    cols = json.loads(segs[0]["payload"])["columns"]
    g1 = [dict(zip(cols, row)) for row in rows["mi/gpu1"]]
    assert [r["t"] for r in g1] == [T0 + 100, T0 + 102, T0 + 104] and {r["dt"] for r in g1} == {2.0}
    assert {r["gpu_util"] for r in g1} == {0.41} and {r["mem_copy_util"] for r in g1} == {None}
    assert {r["energy_j"] for r in g1} == {1234.5}


class _FakeNVML:
    """Just enough of pynvml for the collector: two GPUs, one NVMLError on an unsupported field."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-nv{h}".encode()

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("U", (), {"gpu": 90, "memory": 30})()

    def nvmlDeviceGetPowerUsage(self, h):
        return 612_345       # mW

    def nvmlDeviceGetTemperature(self, h, kind):
        return 55

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 5_000_000     # mJ

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x4

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("M", (), {"used": 2 * 1048576})()

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if h == 1:
            raise self.NVMLError("Not Supported")
        return [object()]


def test_nvml_source_with_a_fake_binding(tmp_path, monkeypatch):
    fake = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    cfg = collector.CollectorConfig(spool=str(tmp_path / "s"), node="h", source="nvml", interval=1.0, count=2)
    rep = collector.collect_batch(cfg, now=lambda: T0 + 10, sleep=lambda s: None)
    assert rep.error is None and rep.devices == 2 and rep.samples == 4
    segs = spool.read(Path(rep.spool_file)).records
    cols = json.loads(segs[0]["payload"])["columns"]
    by_dev = {r["device"]: [dict(zip(cols, row)) for row in r["samples"]] for r in segs}
    g0, g1 = by_dev["GPU-nv0"][0], by_dev["GPU-nv1"][0]
    assert (g0["gpu_util"], g0["power_w"], g0["energy_j"], g0["clock_reasons"]) == (0.9, 612.345, 5000.0, 4)
    assert (g0["fb_used_mib"], g0["compute_procs"], g1["compute_procs"]) == (2.0, 1.0, None)
    assert json.loads(segs[1]["payload"])["missing"] == {"compute_procs": {"not_supported": 2}}
