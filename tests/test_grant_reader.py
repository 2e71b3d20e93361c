"""`ipledger init --grant-reader ROLE`: on the real PostgreSQL the role reads the ledger (and `ipledger serve`'s
reads work through it) but cannot INSERT, UPDATE or DELETE; on SQLite it is a one-line error."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import text

from ledger.chain import db as db_mod


@pytest.mark.postgres
def test_reader_role_reads_and_cannot_write(postgres, runner, cli):
    url = postgres.create_db(f"ipledger_reader_{os.getpid()}")
    r = runner.invoke(cli, ["--db", url, "init", "--grant-reader", "ipledger_web"])
    assert r.exit_code == 0 and "ipledger_web reads it" in r.output, r.output
    again = runner.invoke(cli, ["--db", url, "init", "--grant-reader", "ipledger_web"])   # idempotent
    assert again.exit_code == 0, again.output
    reader_url = url.replace("postgres@", "ipledger_web@")
    log = runner.invoke(cli, ["--db", reader_url, "log", "--json"])
    assert log.exit_code == 0, log.output
    eng = db_mod.make_engine(reader_url)
    try:
        with eng.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM entries")).scalar_one() == 0
        for stmt in ("INSERT INTO entries (seq) VALUES (1)", "DELETE FROM entries", "UPDATE entries SET seq = 2"):
            with eng.connect() as conn, pytest.raises(Exception, match="permission denied"):
                conn.execute(text(stmt))
    finally:
        eng.dispose()


def test_grant_reader_on_sqlite_is_one_line(runner, cli, tmp_path):
    r = runner.invoke(cli, ["--db", f"sqlite:///{tmp_path / 'l.db'}", "init", "--grant-reader", "web"])
    assert r.exit_code == 1 and "PostgreSQL" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.postgres
def test_grant_reader_refuses_odd_names(postgres, runner, cli):
    url = postgres.create_db(f"ipledger_reader_bad_{os.getpid()}")
    r = runner.invoke(cli, ["--db", url, "init", "--grant-reader", 'x"; DROP TABLE entries; --'])
    assert r.exit_code == 1 and "not a plain role name" in r.output
