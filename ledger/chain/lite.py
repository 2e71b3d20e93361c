"""A read-only SQLite ledger read through the standard library's ``sqlite3``, for the commands that only read
(``receipt``, ``verify``, ``log``): the part of SQLAlchemy's Engine / Connection / Result that the read path
uses, so such a command never imports SQLAlchemy (≈ 0.2 s of CPU in a fresh interpreter, half a one-GPU
receipt's wait).

The read path's modules build their statements with :func:`text`, which is SQLAlchemy's ``text`` wherever
SQLAlchemy is loaded (an engine of it can only exist then) and otherwise a :class:`Statement` only a
:class:`LiteEngine` runs. Named parameters (``:name``) are sqlite3's own; rows are tuples that also answer by
column name, as SQLAlchemy's rows do. Each connection reads in one deferred transaction, as the SQLAlchemy
engine of :func:`ledger.chain.db.make_engine` does, so a command sees one snapshot of the ledger.

The SQLAlchemy engine stays the path for writing and for PostgreSQL; tests/test_lite_reader.py holds the two
to the same receipts and the same verify results on the same ledgers (tampered ones too).
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote


@dataclass(frozen=True)
class Statement:
    """SQL text for a :class:`LiteConnection` (what :func:`text` gives where SQLAlchemy is not loaded)."""

    text: str

    def execution_options(self, **_options: Any) -> "Statement":
        return self   # streaming hints: sqlite3's cursor streams already


def text(sql: str):  # noqa: ANN201 - a Statement or SQLAlchemy's TextClause
    """``sqlalchemy.text(sql)`` where SQLAlchemy is loaded, else a :class:`Statement` (no SQLAlchemy engine can
    exist in a process that never imported SQLAlchemy). A :class:`LiteConnection` runs either."""
    sa = sys.modules.get("sqlalchemy")
    return Statement(sql) if sa is None else sa.text(sql)


def is_connection(engine_or_conn: Any) -> bool:
    """Whether this is a connection (of either kind) rather than an engine."""
    if isinstance(engine_or_conn, LiteConnection):
        return True
    engine_mod = sys.modules.get("sqlalchemy.engine")
    return engine_mod is not None and isinstance(engine_or_conn, engine_mod.Connection)


def table_exists(conn: Any, name: str) -> bool:
    """Whether the database holds this table (SQLAlchemy's ``inspect(conn).has_table`` on its connections)."""
    if isinstance(conn, LiteConnection):
        return conn.execute(Statement("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :n"),
                            {"n": name}).first() is not None
    import sqlalchemy as sa

    return sa.inspect(conn).has_table(name)


@dataclass(frozen=True)
class Dialect:
    name: str = "sqlite"
    paramstyle: str = "named"


@dataclass(frozen=True)
class URL:
    """What SQLAlchemy's URL answers that the read path asks: the ledger's plain URL (no password to hide)."""

    path: Path

    @property
    def database(self) -> str:
        return str(self.path)

    def get_backend_name(self) -> str:
        return "sqlite"

    def get_driver_name(self) -> str:
        return "pysqlite"

    def render_as_string(self, hide_password: bool = True) -> str:
        return f"sqlite:///{self.path}"

    def __str__(self) -> str:
        return self.render_as_string()


class Result:
    """A cursor's rows, with the SQLAlchemy Result methods the read path calls."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def __iter__(self) -> Iterator:
        return iter(self._cursor)

    def fetchall(self) -> list:
        return self._cursor.fetchall()

    def first(self):  # noqa: ANN201
        row = self._cursor.fetchone()
        self._cursor.close()
        return row

    def scalar(self):  # noqa: ANN201
        row = self.first()
        return None if row is None else row[0]

    def scalar_one(self):  # noqa: ANN201
        rows = self._cursor.fetchall()
        if len(rows) != 1:
            raise LiteError(f"expected one row, got {len(rows)}")
        return rows[0][0]

    def one(self):  # noqa: ANN201
        rows = self._cursor.fetchall()
        if len(rows) != 1:
            raise LiteError(f"expected one row, got {len(rows)}")
        return rows[0]

    def scalars(self) -> "Scalars":
        return Scalars(self._cursor)


def tuple_rows(result):  # noqa: ANN001, ANN201 - a Result of either kind
    """A result's rows as plain tuples where it is this module's (no named row built per row, for a read of many
    rows whose columns the caller knows by position); SQLAlchemy's rows are tuples already, left as they are."""
    if isinstance(result, Result):
        result._cursor.row_factory = None
    return result


class Scalars:
    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def all(self) -> list:
        return [r[0] for r in self._cursor.fetchall()]

    def __iter__(self) -> Iterator:
        return (r[0] for r in self._cursor)


class LiteError(sqlite3.DatabaseError):
    """A result that is not the shape asked for (SQLAlchemy: NoResultFound / MultipleResultsFound)."""


_ROW_TYPES: dict[tuple, type] = {}
_POOL_SIZE = 5   # idle connections an engine keeps (SQLAlchemy's default pool keeps as many)


_LAST: tuple = (None, None)   # (a statement's description, its row type): the rows of one statement share it


def _row(cursor: sqlite3.Cursor, values: tuple):  # noqa: ANN202 - a tuple that answers by column name too
    global _LAST
    description = cursor.description
    last_description, kind = _LAST
    if description is not last_description:
        names = tuple(d[0] for d in description)
        kind = _ROW_TYPES.get(names)
        if kind is None:
            kind = _ROW_TYPES[names] = namedtuple("Row", names, rename=True)
        _LAST = (description, kind)
    return kind._make(values)


class LiteConnection:
    """One read-only sqlite3 connection; its first statement begins the (deferred) read transaction, closing
    it ends the transaction and hands the connection back to its engine's pool."""

    dialect = Dialect()

    def __init__(self, raw: sqlite3.Connection, release: Callable[[sqlite3.Connection], None]) -> None:
        self._raw = raw
        self._release = release
        self._in_tx = False

    def _begin(self) -> None:
        if not self._in_tx:
            self._raw.execute("BEGIN")
            self._in_tx = True

    def execute(self, statement: Any, parameters: Any = None) -> Result:
        """A statement from :func:`text` (or SQLAlchemy's ``text``) with named parameters."""
        if not hasattr(statement, "text"):
            raise TypeError(f"not a statement: {statement!r} (build it with ledger.chain.lite.text)")
        self._begin()
        return Result(self._raw.execute(statement.text, parameters if parameters is not None else {}))

    def exec_driver_sql(self, sql: str, parameters: Any = None) -> Result:
        self._begin()
        return Result(self._raw.execute(sql, parameters if parameters is not None else ()))

    def rollback(self) -> None:
        if self._in_tx:
            self._raw.execute("ROLLBACK")
            self._in_tx = False

    def close(self) -> None:
        if self._raw is None:
            return
        try:
            self.rollback()
        except sqlite3.Error:
            self._raw.close()
        else:
            self._release(self._raw)
        self._raw = None

    def __enter__(self) -> "LiteConnection":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class RawConnection:
    driver_connection: sqlite3.Connection

    def close(self) -> None:
        self.driver_connection.close()


class LiteEngine:
    """An SQLite ledger file opened read-only (``mode=ro``). Connections are pooled, as SQLAlchemy's engine pools
    them: a fresh sqlite3 connection reads the schema again at its first statement, which verify's hundreds of
    receipt replays would pay each time."""

    dialect = Dialect()

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()
        self.url = URL(self.path)
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _open(self) -> sqlite3.Connection:
        raw = sqlite3.connect(f"file:{quote(str(self.path))}?mode=ro", uri=True, timeout=60,
                              isolation_level=None, check_same_thread=False)
        raw.execute("PRAGMA foreign_keys=ON")
        return raw

    def connect(self) -> LiteConnection:
        with self._lock:
            raw = self._idle.pop() if self._idle else None
        if raw is None:
            raw = self._open()
            raw.row_factory = _row
        return LiteConnection(raw, self._put_back)

    def _put_back(self, raw: sqlite3.Connection) -> None:
        with self._lock:
            if len(self._idle) < _POOL_SIZE:
                self._idle.append(raw)
                return
        raw.close()

    def raw_connection(self) -> "RawConnection":
        """The driver's own connection (plain tuples), as SQLAlchemy's ``engine.raw_connection()`` gives it."""
        return RawConnection(self._open())

    def dispose(self) -> None:
        """Close the pooled connections (those in use are closed when their blocks end)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for raw in idle:
            raw.close()
