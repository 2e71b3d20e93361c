"""The entries table (the hash-chained, append-only ledger) and the telemetry samples side table.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SAMPLE_METRICS = [
    "sm_active", "sm_occupancy", "tensor_active", "dram_active", "gpu_util", "mem_copy_util",
    "sm_clock_mhz", "mem_clock_mhz", "power_w", "gpu_temp_c", "mem_temp_c", "energy_j",
    "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    "row_remap_pending", "row_remap_failure", "xid", "fb_used_mib", "compute_procs",
]


def upgrade() -> None:
    op.create_table(
        "entries",
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("entry_id", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("ts", sa.String(40), nullable=False),
        sa.Column("ts_end", sa.String(40)),
        sa.Column("recorded_at", sa.String(40)),
        sa.Column("cluster", sa.String(128)),
        sa.Column("job_id", sa.String(128)),
        sa.Column("run", sa.Integer),
        sa.Column("node", sa.String(256)),
        sa.Column("device", sa.String(128)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("source", sa.String(128), nullable=False),
        sa.Column("source_version", sa.String(64), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_entries_job", "entries", ["cluster", "job_id", "run"])
    op.create_index("ix_entries_kind_ts", "entries", ["kind", "ts"])
    op.create_index("ix_entries_device_ts", "entries", ["device", "ts"])
    op.create_index("ix_entries_node_ts", "entries", ["node", "ts"])

    op.create_table(
        "samples",
        sa.Column("segment_id", sa.String(64), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("dt", sa.Float, nullable=False),
        sa.Column("clock_reasons", sa.BigInteger),
        *[sa.Column(name, sa.Float) for name in SAMPLE_METRICS],
    )
    op.create_index("ix_samples_device_t", "samples", ["device", "t"])
    op.create_index("ix_samples_segment", "samples", ["segment_id"])

    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for table in ("entries", "samples"):
            for action in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only: {action} refused'); END"
                )
    elif bind.dialect.name == "postgresql":
        op.execute(
            """
            CREATE OR REPLACE FUNCTION ipledger_refuse_change() RETURNS trigger AS $$
            BEGIN
              RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
            END $$ LANGUAGE plpgsql
            """
        )
        for table in ("entries", "samples"):
            op.execute(
                f"CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION ipledger_refuse_change()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION ipledger_refuse_change()"
            )
        # The writer role may only read and append (docs/ledger.md). Creating a role needs CREATEROLE; a
        # migration run by a less privileged owner skips it and the DBA applies docs/ledger.md's grants by hand.
        op.execute(
            """
            DO $$
            BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ipledger_writer') THEN
                CREATE ROLE ipledger_writer NOLOGIN;
              END IF;
              REVOKE ALL ON entries, samples FROM ipledger_writer;
              GRANT SELECT, INSERT ON entries, samples TO ipledger_writer;
            EXCEPTION WHEN insufficient_privilege THEN
              RAISE NOTICE 'ipledger: no privilege to create ipledger_writer; see docs/ledger.md';
            END $$
            """
        )


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
