"""Privacy and permissions (issue 9, point 7; docs/ledger.md, "Permissions").

- What ipledger creates holding names (the SQLite ledger and its -wal/-shm, the spool and its shipped/ and
  torn/ directories and files, automatic receipt files) gets its restrictive mode whatever the umask: the
  tests run under umask 0o000, where only explicit modes keep a file from being world-readable.
- The PostgreSQL writer role `ipledger_writer` cannot UPDATE, DELETE or TRUNCATE the ledger's tables: a login
  that is a member of it gets *permission* errors (before any trigger), and can still ship (SELECT, INSERT,
  the advisory lock, the automatic receipts) and verify.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.entries import Kind
from ledger.base.fsmodes import LEDGER_DIR, LEDGER_FILE, RECEIPTS_DIR, RECEIPTS_FILE, SPOOL_DIR, SPOOL_FILE
from ledger.capture.hooks.core import save_state
from ledger.receipts.example import example_entries


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_modes_under_a_permissive_umask(tmp_path, runner, cli):
    assert (LEDGER_FILE, LEDGER_DIR, SPOOL_FILE, SPOOL_DIR, RECEIPTS_FILE, RECEIPTS_DIR) == \
        (0o600, 0o700, 0o640, 0o750, 0o640, 0o750)  # the documented choice
    entries, _, _ = example_entries()
    sp = tmp_path / "var" / "spool" / "ipledger"
    db_path = tmp_path / "lib" / "ipledger" / "ledger.db"
    receipts = tmp_path / "receipts"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'receipts_dir = "{receipts}"\n')
    env = {"IPLEDGER_CONFIG": str(cfg), "IPLEDGER_SPOOL": str(sp)}
    with umask(0o000):
        written = Path(spool.write(sp, [e.to_record() for e in entries]))
        assert mode(written) == SPOOL_FILE
        for d in (sp, sp.parent, sp.parent.parent):
            assert mode(d) == SPOOL_DIR, d
        # the prolog's state for its epilog (default: SPOOL/hook-state/)
        state = sp / "hook-state" / "c1-4242-0.json"
        save_state(str(state.parent), state.name, {"devices": ["GPU-aaa"]})
        assert mode(state) == SPOOL_FILE and mode(state.parent) == SPOOL_DIR
        # a crashed writer's torn tail: shipping sets it aside in torn/
        torn = Path(spool.write(sp, [entries[0].to_record()]))
        with torn.open("a", encoding="utf-8") as f:
            f.write('{"kind": "progr')
        r = runner.invoke(cli, ["--db", str(db_path), "init"], env=env)
        assert r.exit_code == 0, r.output
        assert mode(db_path) == LEDGER_FILE and mode(db_path.parent) == LEDGER_DIR
        assert mode(db_path.parent.parent) == LEDGER_DIR
        r = runner.invoke(cli, ["--db", str(db_path), "ship"], env=env)
        assert r.exit_code == 0, r.output
        for d in (sp / "shipped", sp / "torn"):
            assert mode(d) == SPOOL_DIR, d
            files = list(d.iterdir())
            assert files and all(mode(f) == SPOOL_FILE for f in files), [(f, oct(mode(f))) for f in files]
        issued = list(receipts.rglob("*.json"))
        assert issued, "an automatic receipt was written"
        assert all(mode(f) == RECEIPTS_FILE for f in issued)
        assert mode(receipts) == RECEIPTS_DIR and all(mode(f.parent) == RECEIPTS_DIR for f in issued)
        # SQLite gives its WAL and shared-memory files the database file's mode
        eng = db_mod.make_engine(f"sqlite:///{db_path}")
        with eng.connect() as conn:
            conn.execute(text("SELECT COUNT(*) FROM entries")).scalar()
            for suffix in ("-wal", "-shm"):
                side = Path(f"{db_path}{suffix}")
                assert side.exists() and mode(side) == LEDGER_FILE, (suffix, oct(mode(side)))
        eng.dispose()
    assert not any(mode(p) & 0o007 for p in tmp_path.rglob("*") if p != cfg), "nothing open to every user"


def test_existing_files_and_directories_keep_the_site_s_modes(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    db_path = shared / "ledger.db"
    db_path.touch()
    db_path.chmod(0o660)
    eng = db_mod.make_engine(f"sqlite:///{db_path}")
    db_mod.upgrade(eng)
    eng.dispose()
    assert mode(shared) == 0o2770 and mode(db_path) == 0o660
    with umask(0o000):
        spool.write(shared, [{"kind": "progress", "ts": "2026-11-01T00:00:00Z"}])
    assert mode(shared) == 0o2770


# --- PostgreSQL: the writer role -------------------------------------------------------------------------------

LEDGER_TABLES = ("entries", "samples", "sample_blocks")


@pytest.fixture
def writer_ledger(postgres):
    """A private ledger database, an owner's engine on it and a login that is a member of ipledger_writer."""
    import psycopg

    name = f"ipledger_writer_{os.getpid()}"
    url = postgres.create_db(name)
    owner = db_mod.make_engine(url)
    db_mod.upgrade(owner)
    login = f"shipper_{os.getpid()}"
    with psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname={name}",
                         autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{login}"')
        conn.execute(f'CREATE ROLE "{login}" LOGIN IN ROLE ipledger_writer')
    writer_url = f"postgresql+psycopg://{login}@127.0.0.1:{postgres.port}/{name}"
    yield owner, writer_url
    owner.dispose()


def test_writer_role_cannot_update_delete_or_truncate(writer_ledger, tmp_path, runner, cli):
    import psycopg

    owner, writer_url = writer_ledger
    entries, _, _ = example_entries()
    sp = tmp_path / "spool"
    spool.write(sp, [e.to_record() for e in entries])
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    env = {"IPLEDGER_SPOOL": str(sp), "IPLEDGER_CONFIG": str(cfg)}
    # the normal append path, as the writer: ship (advisory lock, COPY, automatic receipts), then verify
    r = runner.invoke(cli, ["--db", writer_url, "ship", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert store.count(owner) >= len(entries)
    assert list(store.iter_entries(owner, kinds=[Kind.RECEIPT_ISSUED])), "the writer issued the receipt"
    r = runner.invoke(cli, ["--db", writer_url, "verify"], env=env)
    assert r.exit_code == 0, r.output
    tables = [t for t in LEDGER_TABLES if t in inspect(owner).get_table_names()]
    assert "entries" in tables and "samples" in tables
    before = store.count(owner)
    conninfo = writer_url.replace("postgresql+psycopg://", "postgresql://")
    for table in tables:
        for statement in (f"UPDATE {table} SET segment_id = segment_id" if table != "entries"
                          else "UPDATE entries SET kind = kind",
                          f"DELETE FROM {table}", f"TRUNCATE {table}"):
            with psycopg.connect(conninfo) as conn:
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                    conn.execute(statement)
        with psycopg.connect(conninfo) as conn:  # reading is allowed
            conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    assert store.count(owner) == before
