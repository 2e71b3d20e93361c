"""The agents read the ledger through SQLAlchemy only: the same hall gives the same findings on SQLite and on a
real PostgreSQL (samples bulk-loaded with COPY there)."""

from __future__ import annotations

import pytest

from ledger.chain import db as db_mod
from ledger.sim import FleetSpec, simulate
from ledger.sim.write import write_ledger

SPEC = FleetSpec(nvidia_racks=3, nodes_per_rack=3, days=3)
_results: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def sim():
    return simulate(SPEC, 11)


def test_same_findings_on_every_backend(ledger_url, sim, tmp_path):
    from ledger import agents

    eng = db_mod.make_engine(ledger_url)
    try:
        write_ledger(eng, sim, tmp_path / "spool")
        a = agents.analyze(eng)
    finally:
        eng.dispose()
    got = (sorted((f.id, round(f.gpu_hours, 6)) for f in a.findings), a.account["paid"], a.account["delivered"])
    assert any(f.kind == "hot_because_cooling" for f in a.findings)
    _results[eng.dialect.name] = got
    if len(_results) == 2:
        assert _results["sqlite"] == _results["postgresql"]
