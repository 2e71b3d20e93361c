"""`ipledger analyze SOURCE --json` (an export analysed in one shot) on the Prometheus export the demo hall writes, and on the
same data fetched live from a real Prometheus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.sim import FleetSpec, simulate
from ledger.sim.write import write_prometheus_export

SECTION6_KEYS = {"id", "agent", "kind", "scope", "start", "end", "gpu_hours", "cost", "confidence", "evidence",
                 "summary"}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """One day of racks R2 and R3 of the small hall, including the rack-R3 cooling incident."""
    sim = simulate(FleetSpec.small(), 7)
    cool = next(f for f in sim.truth["faults"] if f["cause"] == "cooling")
    start = int((cool["start"] - sim.t[0]) // sim.spec.cadence_s) - 36
    nodes = sorted({d.node for d in sim.devices if d.rack in ("R2", "R3")})
    path = tmp_path_factory.mktemp("prom") / "export.json"
    info = write_prometheus_export(sim, path, nodes, start, 288)
    return path, info, sim, cool


def _check(out: dict, cool: dict) -> None:
    assert set(out) >= {"findings", "account"}
    assert out["account"]["paid"] > out["account"]["delivered"] > 0
    for f in out["findings"]:
        assert SECTION6_KEYS <= set(f)
        assert 0 <= f["confidence"] <= 1
    hot = [f for f in out["findings"] if f["kind"] == "hot_because_cooling"]
    assert hot, [f["kind"] for f in out["findings"]]
    # an export has no rack topology: the hot nodes are named, and they are rack R3's (C1..C3)
    assert {f["scope"]["node"] for f in hot} <= {"C1", "C2", "C3"}
    assert any(f["kind"] == "xid" for f in out["findings"])  # B3's XIDs fall in this day for seed 7


def test_analyze_demo_export_json(runner, cli, export, tmp_path):
    path, info, _, cool = export
    r = runner.invoke(cli, ["analyze", str(path), "--json", "--keep-ledger", str(tmp_path / "scratch.db")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    _check(out, cool)
    assert out["meta"]["devices"] == 6 * 8
    assert (tmp_path / "scratch.db").exists()


def test_analyze_bad_input_is_one_line(runner, cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = runner.invoke(cli, ["analyze", str(bad), "--json"])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(cli, ["analyze"])
    assert r.exit_code == 1 and "SOURCE" in r.output


def test_analyze_a_dmon_capture_with_not_available_fields(runner, cli):
    """A real `dcgmi dmon` capture whose first rows are N/A (importers' fixture): analysed, nothing invented."""
    from tests.conftest import FIXTURES

    src = FIXTURES / "pathb" / "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"
    r = runner.invoke(cli, ["analyze", "--format", "dmon", str(src), "--start", "2026-11-02T00:00:00Z",
                            "--step", "1s", "--node", "gpu07", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    acct = out["account"]
    assert out["meta"]["devices"] == 8
    assert acct["buckets"]["unknown"] > 0          # the N/A rows stay unknown
    assert abs(acct["paid"] - acct["delivered"] - acct["lost"]) < 1e-3  # each figure is rounded to 4 places


def _openmetrics(doc: dict, path: Path) -> Path:
    lines = []
    by_name: dict[str, list] = {}
    for s in doc["data"]["result"]:
        by_name.setdefault(s["metric"]["__name__"], []).append(s)
    for name, series in by_name.items():
        lines.append(f"# TYPE {name} gauge")
        for s in series:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items()) if k != "__name__")
            lines.extend(f"{name}{{{labels}}} {v} {t:.0f}" for t, v in s["values"])
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.prometheus
def test_analyze_live_prometheus(runner, cli, export, tmp_path):
    from tests.prom_service import start_prometheus

    path, info, _, cool = export
    om = _openmetrics(json.loads(path.read_text()), tmp_path / "dcgm.om")
    prom = start_prometheus(om)
    try:
        r = runner.invoke(cli, ["analyze", "--url", prom.url, "--start", str(int(info["start"])),
                                "--end", str(int(info["end"] - 300)), "--step", "300s", "--json"])
    finally:
        prom.stop()
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    _check(out, cool)


def _both_ways(collected, tmp_path: Path) -> tuple[dict, dict]:
    from ledger.agents.export_analysis import analyze_collected

    direct = analyze_collected(collected, sources=[]).to_json()
    via_ledger = analyze_collected(collected, keep=tmp_path / "kept.db", sources=[]).to_json()
    return direct, via_ledger


def test_analysis_without_a_ledger_equals_the_ledger_round_trip(export, tmp_path):
    """The agents on the parsed export give exactly what they give on the same export imported and read back:
    findings (ids, evidence, GPU-hours), account, daily figures, meta (sequence number included), import context."""
    from ledger.importers import prometheus

    path, *_ = export
    doc = json.loads(path.read_text())
    series = doc["data"]["result"]
    first, second = sorted({s["metric"].get("UUID") for s in series})[:2]
    for s in series:  # a scrape outage on one device, and an energy counter reset on another
        if s["metric"].get("UUID") == first:
            del s["values"][100:130]
        if s["metric"].get("UUID") == second and "ENERGY" in s["metric"]["__name__"]:
            s["values"][150:] = [[t, str(float(v) - 1e6)] for t, v in s["values"][150:]]
    holed = tmp_path / "holed.json"
    holed.write_text(json.dumps(doc))
    direct, via_ledger = _both_ways(prometheus.read([holed]), tmp_path)
    assert direct["findings"] and direct["meta"]["through_seq"] > 0
    assert direct["import"]["unknown_intervals"] > 0
    assert json.dumps(direct, sort_keys=True) == json.dumps(via_ledger, sort_keys=True)


@pytest.mark.parametrize("fmt,name,kw", [
    ("dmon", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt", {"start": 1793577600.0, "interval": 1.0,
                                                                     "node": "gpu07"}),
    ("prometheus", "metrics_scrape_t4_prof_pod_labels_dcgm_issue191.prom", {"at": 1793577600.0}),
])
def test_fixture_captures_analyse_the_same_without_a_ledger(fmt, name, kw, tmp_path):
    from ledger.agents.export_analysis import read_source
    from tests.conftest import FIXTURES

    collected = read_source(fmt, [str(FIXTURES / "pathb" / name)], **kw)
    direct, via_ledger = _both_ways(collected, tmp_path)
    assert direct["meta"]["samples"] > 0
    assert json.dumps(direct, sort_keys=True) == json.dumps(via_ledger, sort_keys=True)


def _finding_key(f: dict) -> tuple:
    return (f["agent"], f["kind"], tuple(sorted((k, v) for k, v in f["scope"].items() if v is not None)),
            f["start"], f["end"])


@pytest.fixture(scope="module")
def scenario_export(tmp_path_factory):
    """The independent generator's export (bench/scenario.py): 64 GPUs x 24 h, one of each fault."""
    from bench.scenario import generate, write_export

    return write_export(generate(3), tmp_path_factory.mktemp("scenario") / "export.json")


@pytest.mark.parametrize("which", ["demo", "scenario"])
def test_analysis_over_device_hours_equals_every_sample(which, export, scenario_export):
    """`ipledger analyze`'s default (every agent over the export's device-hours, the raw samples read only for
    the findings' scopes and windows) against `--samples` (every agent over every sample): the same findings
    (kinds, scopes, windows), GPU-hours within 1 %, the same evidence, the same account and sample count."""
    from ledger.agents.export_analysis import analyze_collected
    from ledger.importers import prometheus

    path = export[0] if which == "demo" else scenario_export
    hours = analyze_collected(prometheus.read([path]), consume=True, samples=False).to_json()
    full = analyze_collected(prometheus.read([path]), consume=True, samples=True).to_json()
    want = {_finding_key(f): f for f in full["findings"]}
    got = {_finding_key(f): f for f in hours["findings"]}
    assert got.keys() == want.keys() and want
    kinds = {k[1] for k in want}
    assert {"hot_because_cooling", "xid"} <= kinds
    if which == "scenario":
        assert {"power_cap", "idle_held", "starved", "unknown_gap", "ecc_drift"} <= kinds
    for k, f in want.items():
        g = got[k]
        assert abs(g["gpu_hours"] - f["gpu_hours"]) <= 0.01 * max(f["gpu_hours"], 1e-9), k
        assert g["evidence"] == f["evidence"], k
    for col in ("paid", "delivered", "lost"):
        assert abs(hours["account"][col] - full["account"][col]) <= 1e-3, col
    assert hours["meta"]["samples"] == full["meta"]["samples"] == full["import"]["samples"]
    assert hours["import"] == full["import"] and hours["devices"] == full["devices"]


def test_analyze_samples_option_is_the_full_resolution(runner, cli, export):
    """`--samples` through the CLI: the per-sample reference gives the same findings as `--device-hours`, and
    the default (this export's frame is under the budget) is the per-sample analysis itself."""
    path = str(export[0])
    default = json.loads(runner.invoke(cli, ["analyze", path, "--json"]).output)
    hours = runner.invoke(cli, ["analyze", path, "--json", "--device-hours"])
    full = runner.invoke(cli, ["analyze", path, "--json", "--samples"])
    assert full.exit_code == 0 and hours.exit_code == 0, full.output + hours.output
    full, hours = json.loads(full.output), json.loads(hours.output)
    assert {_finding_key(f) for f in hours["findings"]} == {_finding_key(f) for f in full["findings"]}
    assert hours["meta"]["samples"] == full["meta"]["samples"] > 0
    assert default == full


def test_the_default_reads_every_sample_only_under_the_frame_budget(export, monkeypatch):
    """The default's choice: every sample while the frame fits the budget, the device-hours above it (the
    per-sample bound is each device's longest series; the analysis is the one its mode gives)."""
    from ledger.agents import export_analysis as ea
    from ledger.importers import prometheus

    c = prometheus.read([export[0]])
    bound = ea.sample_count_bound(c)
    longest = {d: max(len(ts) for ts, _ in fs.values()) for d, fs in c.series.items()}
    assert bound == sum(longest.values()) > 0
    assert ea.reads_every_sample(c)
    monkeypatch.setattr(ea, "SAMPLE_FRAME_BUDGET", bound * ea.SAMPLE_FRAME_BYTES - 1)
    assert not ea.reads_every_sample(c)
    chosen = ea.analyze_collected(prometheus.read([export[0]]), consume=True).to_json()
    hours = ea.analyze_collected(prometheus.read([export[0]]), consume=True, samples=False).to_json()
    assert chosen == hours


def test_the_analysis_names_each_source_by_its_sha256(runner, cli, export):
    """The digests are taken in a thread while the agents run: still each file's own, in the sources' order."""
    import hashlib

    path, _, _, _ = export
    r = runner.invoke(cli, ["analyze", str(path), "--json"])
    assert r.exit_code == 0, r.output
    sources = json.loads(r.output)["sources"]
    assert sources == [{"kind": "prometheus", "name": path.name,
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}]
