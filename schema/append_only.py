"""Making a derived table append-only the way 0001 makes `entries` so: triggers refuse UPDATE and DELETE (and
TRUNCATE on PostgreSQL, whose writer role gets SELECT and INSERT only). For migrations to call."""

from __future__ import annotations


def make_append_only(op, table: str) -> None:  # noqa: ANN001 - alembic's op module
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only: {action} refused'); END"
            )
    elif bind.dialect.name == "postgresql":
        # ipledger_refuse_change() is 0001's trigger function.
        op.execute(f"CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION ipledger_refuse_change()")
        op.execute(f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION ipledger_refuse_change()")
        op.execute(f"""
            DO $$
            BEGIN
              IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ipledger_writer') THEN
                REVOKE ALL ON {table} FROM ipledger_writer;
                GRANT SELECT, INSERT ON {table} TO ipledger_writer;
              END IF;
            EXCEPTION WHEN insufficient_privilege THEN
              RAISE NOTICE 'ipledger: no privilege to grant on {table}; see docs/ledger.md';
            END $$
            """)
