"""Alembic environment for the ledger: runs migrations on the connection ledger.db hands over (or $IPLEDGER_DB)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=None)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("IPLEDGER_DB")
    if not url:
        raise SystemExit("schema/env.py: set IPLEDGER_DB or sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=None)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("schema/env.py: offline (SQL script) mode is not supported; run against a database")
run_migrations_online()
