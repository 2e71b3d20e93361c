"""One real PostgreSQL for the benchmarks of a run, started the way the tests start it (tests/services.py)."""

from __future__ import annotations

import atexit
import itertools

from bench.common import FeatureMissing

_PG = None
_counter = itertools.count()


def server(title: str):
    """The running server (started once per process, stopped at exit); FeatureMissing when it cannot start."""
    global _PG
    if _PG is None:
        from tests import services

        try:
            _PG = services.start_postgres()
        except BaseException as exc:  # noqa: BLE001 - services.unavailable raises pytest's Skipped/Failed
            raise FeatureMissing(title, f"PostgreSQL could not be started: {exc}") from None
        atexit.register(_PG.stop)
    return _PG


def fresh_ledger(title: str, name: str = "bench") -> str:
    """A new database with the ledger schema; returns its URL."""
    from ledger.chain import db as db_mod

    url = server(title).create_db(f"ipledger_{name}_{next(_counter)}")
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    return url


def conninfo(url: str) -> str:
    """psycopg's conninfo for a SQLAlchemy postgresql+psycopg URL."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"host={u.host} port={u.port} user={u.username} dbname={u.database}"
