"""The agents' pass in two lanes (ledger/agents/lanes.py: a forked process runs the thermal and drift rules) gives
the analysis the one-process reference (:func:`ledger.agents.run_agents`) gives, byte for byte, on a capture set
of the report-on generator with a fault of every kind (XIDs, whose stall mask and silences cross the lanes,
included); and where the forked lane reports nothing, its part is run in this process: the same analysis."""

from __future__ import annotations

import json

import pytest

from bench.capture_fleet import generate, write_captures
from ledger.agents import lanes, run_agents
from ledger.agents.memory import dataset_from_collected
from ledger.importers.captures import read_set
from ledger.importers.pipeline import ImportOptions



@pytest.fixture(autouse=True)
def forkable(monkeypatch):
    """The lanes' equivalence does not depend on the machine: a second CPU only decides whether forking pays
    (``can_fork``), so it is taken as there; a platform without fork fails in CI (tests/services.py)."""
    import os

    from tests.services import unavailable

    if not hasattr(os, "fork"):
        unavailable("the agents' second lane needs os.fork")
    monkeypatch.setattr(lanes, "can_fork", lambda: True)


def _dataset(directory):
    ds, _res = dataset_from_collected(read_set([str(directory)], workers=0), ImportOptions(cluster="pathb"))
    return ds


@pytest.fixture(scope="module")
def capture_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("captures")
    write_captures(generate(4, hours=24.0, cadence=300.0), out)
    return out


def _text(analysis) -> str:
    return json.dumps(analysis.to_json(), sort_keys=True)


def test_two_lanes_give_the_reference_analysis(capture_set, monkeypatch):
    forks = []
    real = lanes._fork
    monkeypatch.setattr(lanes, "_fork", lambda ds: forks.append(1) or real(ds))
    reference = run_agents(_dataset(capture_set))
    ds = _dataset(capture_set)
    two = lanes.run_agents_in_lanes(ds, 2)
    assert forks == [1]                                     # the second lane did run
    assert ds.hourly is None    # the device-hour statistics were the forked lane's alone: none computed here
    kinds = {f["kind"] for f in reference.to_json()["findings"]}
    assert {"xid", "unknown_gap", "hot_because_cooling", "ecc_drift"} <= kinds   # both lanes found some
    assert _text(two) == _text(reference)


def test_a_lane_that_reports_nothing_is_run_here(capture_set, monkeypatch):
    real = lanes._join
    monkeypatch.setattr(lanes, "_join", lambda lane: real(lane) and None)   # the forked lane's result lost
    assert _text(lanes.run_agents_in_lanes(_dataset(capture_set), 2)) == _text(run_agents(_dataset(capture_set)))


def test_one_lane_is_the_reference(capture_set, monkeypatch):
    monkeypatch.setattr(lanes, "_fork", lambda ds: pytest.fail("one lane forks nothing"))
    assert _text(lanes.run_agents_in_lanes(_dataset(capture_set), 1)) == _text(run_agents(_dataset(capture_set)))
