"""The export analysis and the ledger path decide cooling vs working alike: ``ipledger analyze`` on the demo's one-day export
(no rack topology, little own history) names rack R3's cooling failure ``hot_because_cooling`` on R3's nodes with
the GPU-hours the ledger path (a week, with racks) attributes to it over the same hours, and calls none of it
``hot_because_working``."""

from __future__ import annotations

import json

import pytest

from ledger.agents.data import load
from ledger.chain.canonical import ts_to_epoch
from ledger.sim.hall import build_hall, write_imported_export
from ledger.sim import FleetSpec


def _t(v) -> float:  # noqa: ANN001
    return float(v) if isinstance(v, (int, float)) else ts_to_epoch(v)


def _agree(tmp_path, runner, cli, spec: FleetSpec, seed: int) -> None:
    hall = build_hall(tmp_path / "hall", seed, spec)
    try:
        info = write_imported_export(hall.sim, tmp_path / "export.json")
        a, b = info["start"], info["end"]
        rack_nodes = {d.node for d in hall.sim.devices if d.rack == "R3"}
        ledger_hot = [f for f in hall.analysis.findings if f.kind == "hot_because_cooling" and f.level == "rack"
                      and f.scope_dict()["rack"] == "R3"]
        assert ledger_hot
        # the ledger finding's GPU-hours over the export's day: its thermal-throttled hours of R3 in those hours
        s = load(hall.engine).samples
        win = (s["rack"] == "R3") & (s["rbucket"] == 0)
        ledger_h = sum(float(s.loc[win & (s["t"] >= max(a, f.start)) & (s["t"] < min(b, f.end)), "h_thr"].sum())
                       for f in ledger_hot)
    finally:
        hall.engine.dispose()
    r = runner.invoke(cli, ["analyze", str(tmp_path / "export.json"), "--json"])
    assert r.exit_code == 0, r.output
    found = [f for f in json.loads(r.output)["findings"] if f["agent"] != "recommendation"]
    cool = [f for f in found if f["kind"] == "hot_because_cooling" and f["scope"]["node"] in rack_nodes]
    assert {f["scope"]["node"] for f in cool} == rack_nodes
    imported_h = sum(f["gpu_hours"] for f in cool)
    assert imported_h == pytest.approx(ledger_h, rel=0.10), (imported_h, ledger_h)
    working = [f for f in found if f["kind"] == "hot_because_working" and f["scope"]["node"] in rack_nodes
               and _t(f["start"]) < max(x.end for x in ledger_hot) and _t(f["end"]) > min(x.start for x in ledger_hot)]
    assert working == []


def test_analyze_on_the_demo_export_finds_r3_cooling_like_the_ledger(tmp_path, runner, cli):
    """The hall `make demo` builds (default size, seed 0) and the export it writes."""
    _agree(tmp_path, runner, cli, FleetSpec(), 0)

