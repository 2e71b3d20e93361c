"""The schema-revision check every command runs, without alembic.

``ledger.chain.db.require_schema`` reads alembic's table with one SELECT and compares it to ``schema/head.py``;
these tests ask alembic itself for the migration history (so adding a migration without updating the
constant fails here), and exercise the check on a real SQLite file and the real PostgreSQL: no schema, the
current one, an older one, a newer ipledger's, an unreadable database; and that `ipledger receipt` starts
without importing alembic, pandas or reportlab.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

import ipledger_schema as schema
import ipledger_schema.head
from ledger.chain import db as db_mod

ROOT = Path(__file__).resolve().parent.parent
_DB_NUMBERS = itertools.count()


def test_head_constant_is_alembics_head_and_history() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", os.path.dirname(schema.__file__))
    script = ScriptDirectory.from_config(cfg)
    assert script.get_heads() == [schema.head.HEAD_REVISION], "a migration was added: update schema/head.py"
    history = [rev.revision for rev in script.walk_revisions("base", "heads")][::-1]
    assert tuple(history) == schema.head.REVISIONS


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def bare_url(request, tmp_path) -> str:  # noqa: ANN001
    """A database nobody has run `ipledger init` on."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres").create_db(f"ipledger_head_{os.getpid()}_{next(_DB_NUMBERS)}")


def _set_revision(engine, rev: str) -> None:  # noqa: ANN001
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": rev})


def test_schema_check_from_none_to_head_older_and_newer(bare_url: str) -> None:
    engine = db_mod.make_engine(bare_url)
    try:
        where = engine.url.render_as_string(hide_password=True)
        assert db_mod.current_revision(engine) is None
        with pytest.raises(db_mod.LedgerError) as none:
            db_mod.require_schema(engine)
        assert str(none.value) == f"{where}: no ledger schema here; run `ipledger init` first"

        assert db_mod.upgrade(engine) == schema.head.HEAD_REVISION
        assert db_mod.current_revision(engine) == schema.head.HEAD_REVISION
        db_mod.require_schema(engine)  # the current schema passes

        _set_revision(engine, schema.head.REVISIONS[0])
        with pytest.raises(db_mod.LedgerError) as older:
            db_mod.require_schema(engine)
        assert str(older.value) == (f"{where}: ledger schema is at revision {schema.head.REVISIONS[0]}, this "
                                    f"ipledger needs {schema.head.HEAD_REVISION}; run `ipledger init` to upgrade it")

        _set_revision(engine, "9999")  # a newer ipledger's migration: still readable by this one
        db_mod.require_schema(engine)
    finally:
        engine.dispose()


def _refusal(url: str) -> str:
    """require_schema's one-line refusal of this database."""
    engine = db_mod.make_engine(url)
    try:
        with pytest.raises(db_mod.LedgerError) as err:
            db_mod.require_schema(engine)
    finally:
        engine.dispose()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_unreadable_database_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not an SQLite database, just bytes " * 200)
    assert _refusal(f"sqlite:///{path}").startswith(f"cannot open ledger database sqlite:///{path}: ")


@pytest.mark.postgres
def test_unreachable_postgresql_is_one_line_naming_it(postgres) -> None:  # noqa: ANN001
    from tests.services import free_port

    assert _refusal(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none").startswith(
        "cannot open ledger database postgresql+psycopg://nobody@127.0.0.1:")


PROBE = """
import runpy, sys
sys.argv = ["ipledger", *sys.argv[1:]]
try:
    runpy.run_module("ledger.cli.main", run_name="__main__")
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("alembic", "pandas", "reportlab", "duckdb", "sqlalchemy.orm") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def test_receipt_command_checks_the_schema_without_alembic_pandas_or_reportlab(sqlite_url: str) -> None:
    """The cheap start-up of `ipledger receipt`: the schema check passes (the job is then not found), and
    none of the heavy libraries the receipt does not need were imported on the way."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "--db", sqlite_url, "receipt", "4242", "--format", "json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert "job 4242: no entries in the ledger" in proc.stderr
    heavy = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], proc.stderr
