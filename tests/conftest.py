"""Shared fixtures: a fresh ledger on each backend (SQLite file; the real PostgreSQL), spools, the CLI runner."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.chain import db as db_mod
from tests import services

FIXTURES = Path(__file__).parent / "fixtures"
_counter = itertools.count()


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", default=False,
                     help="run the adversarial tests at their soak size (docs/reliability.md); also IPLEDGER_SOAK=1")


@pytest.fixture(scope="session")
def soak(request) -> bool:
    """True for the long variants: `make soak`, `pytest --soak`, or IPLEDGER_SOAK=1."""
    return bool(request.config.getoption("--soak")) or os.environ.get("IPLEDGER_SOAK", "") in ("1", "true", "yes")


@pytest.fixture(scope="session")
def trials(soak):
    """How many trials an adversarial test runs: its `make test` size, or its soak size under --soak."""
    return lambda quick, full: full if soak else quick


@pytest.fixture(scope="session")
def postgres():
    pg = services.start_postgres()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path) -> str:
    """A freshly initialised, empty ledger on each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        pg = request.getfixturevalue("postgres")
        url = pg.create_db(f"ipledger_test_{os.getpid()}_{next(_counter)}")
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def engine(ledger_url):
    eng = db_mod.make_engine(ledger_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    return url


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """`ipledger demo --small --seed 3` once per session: (its output directory, its JSON summary). Tests that
    write to it work on a copy."""
    import json

    from ledger.cli.main import cli

    out = tmp_path_factory.mktemp("demo")
    r = CliRunner().invoke(cli, ["demo", "--out", str(out), "--seed", "3", "--small", "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.output)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def cli():
    from ledger.cli.main import cli as group

    return group
