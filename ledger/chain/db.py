"""Opening the ledger database (SQLite by default, PostgreSQL by URL) and creating or upgrading its schema."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import ipledger_schema as _schema_pkg
import ipledger_schema.head as _schema_head

from ..base.config import normalise_db_url
from ..base.fsmodes import LEDGER_DIR, LEDGER_FILE, create_file, make_dirs
from ..base.textsafe import printable
from .lite import LiteEngine, table_exists, text

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


WRITE_OPTION = "ipledger_write"


class LedgerError(RuntimeError):
    """A ledger problem reported to the user as one line."""


# What to install for a database the URL names but this Python cannot reach (the extras of pyproject.toml).
POSTGRES_EXTRA = "pip install 'ipledger[postgres]'"


def sqlite_path(url: str) -> Path | None:
    """The file an SQLite URL names; None for another database, an in-memory one or a ``file:`` URI."""
    url = normalise_db_url(url)
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[1] if "///" in url else ""
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return Path(path.split("?", 1)[0])


def make_engine(url: str, *, create: bool = True, read_only: bool = False) -> Engine:
    """An engine for the ledger at ``url`` (a bare path is an SQLite file).

    ``create``: a missing SQLite file (and its directory) is made, owner-only; otherwise a missing file is the
    one-line LedgerError "no ledger at PATH" and nothing is created. ``read_only``: SQLite opens the file with
    ``mode=ro`` and PostgreSQL's transactions are ``READ ONLY`` (a command that only reads cannot write, whatever
    it runs). An unknown scheme or a missing
    driver is a one-line LedgerError naming what to install."""
    from sqlalchemy import event

    url = normalise_db_url(url)
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is not None:
            if create and not read_only:
                _create_private(path)
            elif not path.exists():
                raise LedgerError(f"no ledger at {printable(str(path))}")
        if read_only and path is not None:
            # mode=ro is given to the driver, not written into the URL: engine.url stays the ledger's plain URL,
            # which the receipt workers reopen (SQLAlchemy renders a `file:` database as `file%3A...`, a
            # relative path a worker would have created as a new, empty ledger)
            uri = f"file:{quote(str(path.resolve()))}?mode=ro"
            engine = _create(url, creator=lambda: sqlite3.connect(uri, uri=True, timeout=60,
                                                                  check_same_thread=False))
        else:
            engine = _create(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record):  # noqa: ANN001
            # Transactions are begun by the "begin" listener below, not by the driver.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            if not read_only:  # a read-only connection reads the WAL ledger as it is; it cannot change its mode
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
    if read_only and url.startswith("postgresql+psycopg"):  # every transaction of a reading command is READ ONLY
        return _create(url, pool_pre_ping=True, connect_args={"options": "-c default_transaction_read_only=on"})
    return _create(url, pool_pre_ping=True)


def make_reader(url: str) -> LiteEngine | None:
    """A reader of the SQLite ledger file at ``url`` through the standard library (:mod:`ledger.chain.lite`),
    for a command that only reads; None for any other database (the caller opens :func:`make_engine`'s). A
    missing file is the one-line LedgerError "no ledger at PATH"."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.exists():
        raise LedgerError(f"no ledger at {printable(str(path))}")
    return LiteEngine(path)


def _create(url: str, **kw) -> Engine:  # noqa: ANN003
    """create_engine, with an unknown scheme or a driver that is not installed as one line."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        scheme = make_url(url).drivername
    except ArgumentError:
        raise LedgerError(f"{_shown(url)}: not a database URL (want sqlite:///PATH, a file path, or "
                          "postgresql+psycopg://USER@HOST/DB)") from None
    if scheme.split("+")[0] not in ("sqlite", "postgresql"):
        raise LedgerError(f"{_shown(url)}: ipledger keeps its ledger in SQLite (sqlite:///PATH) or "
                          f"PostgreSQL (postgresql+psycopg://USER@HOST/DB, after {POSTGRES_EXTRA}), not {scheme}")
    try:
        return create_engine(url, **kw)
    except (NoSuchModuleError, ImportError) as exc:
        raise LedgerError(f"{_shown(url)}: no driver for {scheme} ({exc}); ipledger reaches PostgreSQL "
                          f"through psycopg: {POSTGRES_EXTRA} and use postgresql+psycopg://") from None


def _shown(url: str) -> str:
    """A URL as it may be printed: without its password, terminal-safe."""
    from sqlalchemy.engine import make_url

    try:
        return printable(make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - not even a URL: shown as given, escaped
        return printable(url.split("@")[-1] if "@" in url else url)


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
    if isinstance(engine, LiteEngine):
        failed: tuple[type[Exception], ...] = (sqlite3.Error,)
    else:
        from sqlalchemy.exc import DBAPIError

        failed = (DBAPIError,)
    with engine.connect() as conn:
        try:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        except failed:
            conn.rollback()  # PostgreSQL: the failed statement aborted the transaction
            if not table_exists(conn, "alembic_version"):
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


def seq_standing_at(engine: Engine, epoch: float) -> int:
    """The last sequence number of the ledger as it stood at ``epoch``: the chain up to (not including) its
    first entry timestamped after ``epoch`` (``recorded_at``, else ``ts``). An entry is not written before it
    was recorded, and entries are appended in sequence order, so nothing after that one can have been there;
    0 when the first entry is already later."""
    from .canonical import format_ts, parse_ts

    stamp = format_ts(epoch) or ""
    # canonical timestamps compare as text to the second ("…:SSZ" / "…:SS.ffffffZ"); within the second, parsed
    query = text("SELECT seq, COALESCE(recorded_at, ts) FROM entries WHERE substr(COALESCE(recorded_at, ts), 1, 19) "
                 ">= :sec ORDER BY seq")
    with engine.connect() as conn:
        last = conn.execute(text("SELECT COALESCE(MAX(seq), 0) FROM entries")).scalar_one()
        for seq, ts in conn.execute(query.execution_options(yield_per=1000), {"sec": stamp[:19]}):
            if parse_ts(ts).timestamp() > epoch:
                return int(seq) - 1
    return int(last)


READER_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def grant_reader(engine: Engine, role: str) -> None:
    """PostgreSQL: make ``role`` (a LOGIN role, created when missing) able to read the ledger and nothing else:
    CONNECT on the database, USAGE on its schema, SELECT on every table now and later; never INSERT, UPDATE or
    DELETE (`ipledger serve` connects as it; docs/web.md). :class:`LedgerError` on SQLite or a bad name."""
    if engine.dialect.name != "postgresql":
        raise LedgerError(f"--grant-reader: a read-only role is PostgreSQL's; an SQLite ledger is opened "
                          f"read-only by the reading commands themselves ({engine.dialect.name})")
    if not READER_ROLE.fullmatch(role):
        raise LedgerError(f"--grant-reader: {role!r} is not a plain role name (lower-case letters, digits, _)")
    with engine.begin() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
        if not exists:
            conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        dbname = conn.execute(text("SELECT current_database()")).scalar_one()
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        conn.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{dbname}" TO "{role}"')
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.exec_driver_sql(f'REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA "{schema}" FROM "{role}"')
        conn.exec_driver_sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        conn.exec_driver_sql(f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{schema}" GRANT SELECT ON TABLES TO "{role}"')
