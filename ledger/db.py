"""Opening the ledger database (SQLite by default, PostgreSQL by URL) and creating or upgrading its schema."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

import ipledger_schema as _schema_pkg
import ipledger_schema.head as _schema_head

from .config import normalise_db_url
from .fsmodes import LEDGER_DIR, LEDGER_FILE, create_file, make_dirs


WRITE_OPTION = "ipledger_write"


class LedgerError(RuntimeError):
    """A ledger problem reported to the user as one line."""


def make_engine(url: str) -> Engine:
    url = normalise_db_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:" and not path.startswith("file:"):
            _create_private(Path(path.split("?", 1)[0]))
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record):  # noqa: ANN001
            # Transactions are begun by the "begin" listener below, not by the driver.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):  # noqa: ANN001
            # Writers take the write lock up front so two shippers serialise instead of both reading the
            # same chain head; readers stay deferred so they never wait on a long shipment (WAL).
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "BEGIN")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_pre_ping=True)


def _create_private(path: Path) -> None:
    """A new SQLite ledger file (and any directory made for it) readable by its owner only, before SQLite
    creates it with the umask's mode; SQLite gives its -wal and -shm files the database file's mode."""
    if path.exists():
        return  # the site's choice of mode stands
    make_dirs(path.parent, LEDGER_DIR)
    try:
        os.close(create_file(path, LEDGER_FILE))
    except FileExistsError:
        pass


def _alembic_config(connection):  # noqa: ANN001
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", os.path.dirname(_schema_pkg.__file__))
    cfg.attributes["connection"] = connection
    return cfg


# Every command checks the schema revision first (require_schema), so the writer role needs to read alembic's
# own table, which alembic creates outside the migrations; granted on each `ipledger init`, so an existing
# ledger gets it too. Like the migrations, an owner without the privilege leaves it to the DBA (docs/ledger.md).
_WRITER_READS_REVISION = """
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ipledger_writer') THEN
    GRANT SELECT ON alembic_version TO ipledger_writer;
  END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE NOTICE 'ipledger: no privilege to grant SELECT on alembic_version; see docs/ledger.md';
END $$
"""


def upgrade(engine: Engine) -> str:
    """``alembic upgrade head`` on this database; returns the revision it is now at."""
    from alembic import command

    from . import receipt_lines

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "head")
        # issues appended by a writer older than the receipt lines (0005) get theirs now
        receipt_lines.sync(conn)
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(_WRITER_READS_REVISION)
    return current_revision(engine) or ""


def current_revision(engine: Engine) -> str | None:
    """The schema revision alembic recorded in this database; None where it recorded none (no schema).

    One SELECT on alembic's own table instead of alembic's MigrationContext, so that no command but `init`
    imports alembic. Connection failures propagate; only a missing table means "no schema"."""
    with engine.connect() as conn:
        try:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        except DBAPIError:
            conn.rollback()  # PostgreSQL: the failed statement aborted the transaction
            if not inspect(conn).has_table("alembic_version"):
                return None
            raise
    if len(rows) > 1:
        raise LedgerError(f"{engine.url.render_as_string(hide_password=True)}: alembic_version holds several "
                          f"revisions ({', '.join(sorted(rows))}); ipledger's schema has one line of migrations")
    return rows[0] if rows else None


def require_schema(engine: Engine) -> None:
    """Refuse to work on a database that `ipledger init` has not prepared (or not upgraded to this version's
    schema), with a one-line reason."""
    where = engine.url.render_as_string(hide_password=True)
    try:
        rev = current_revision(engine)
    except LedgerError:
        raise
    except Exception as exc:  # noqa: BLE001 - any connection failure becomes one line
        raise LedgerError(f"cannot open ledger database {where}: {str(exc).splitlines()[0]}") from None
    if rev is None:
        raise LedgerError(f"{where}: no ledger schema here; run `ipledger init` first")
    # An older schema than this ipledger's is refused; a revision it does not know is a newer ipledger's
    # (migrations only add), which this one can still read and extend.
    if rev in _schema_head.REVISIONS and rev != _schema_head.HEAD_REVISION:
        raise LedgerError(f"{where}: ledger schema is at revision {rev}, this ipledger needs "
                          f"{_schema_head.HEAD_REVISION}; run `ipledger init` to upgrade it")


def dialect(engine: Engine) -> str:
    return engine.dialect.name


def write_tx(engine: Engine):  # noqa: ANN201
    """A transaction that may extend the chain (takes SQLite's write lock at BEGIN)."""
    return engine.execution_options(**{WRITE_OPTION: True}).begin()
