"""The `device_hours` table: hourly per-device aggregates of each telemetry segment, written when it is sealed.

One row per (segment, device, hour), computed by ledger/telemetry/hours.py from the same rows the segment's
block stores, in the same transaction; what the agents read instead of every sample (docs/scale.md). The
columns are sums that add across segments and hours (plus a few extremes and the XID gauge at the edges),
so a device-hour is the sum of its segments' pieces and a day the sum of its hours: the `device_days` view.
Derived, not evidence: `ipledger verify` recomputes every row from the segment's samples. Append-only like
`sample_blocks` (0003): the same triggers and grants. A ledger that already holds segments gets theirs from
`ipledger init` after this migration (ledger.telemetry.derived.backfill: a migration may not import the
telemetry component).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

from ipledger_schema.append_only import make_append_only

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLE = "device_hours"
# Frozen here as created (ledger.telemetry.hours.FIELDS names the same columns; writes name their columns).
INTS = ("n", "loaded_n", "fit_n", "hot_n", "fb_n", "xid_events")
FLOATS = ("t_first", "t_last", "t_end", "gap_max", "covered_s", "busy_s", "under_s", "starved_s", "idle_s", "missing_s",
          "act_s", "present_s", "resident_s", "running_s", *(f"busy_r{r}" for r in range(5)),
          *(f"busyclk_r{r}" for r in range(5)), *(f"busynoclk_r{r}" for r in range(5)), "clk_max", "loaded_clk",
          "fit_p", "fit_t", "fit_pp", "fit_pt", "fit_tt", "hot_p", "hot_t", "fb_sum", "fb_max", "procs_max",
          "ecc_min", "ecc_max", "xid_first", "xid_last")
DAY_SUMS = ("n", "covered_s", "busy_s", "under_s", "starved_s", "idle_s", "missing_s", "act_s", "present_s",
            "resident_s", "running_s", *(f"busy_r{r}" for r in range(5)), *(f"busyclk_r{r}" for r in range(5)),
            *(f"busynoclk_r{r}" for r in range(5)), "xid_events")


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("segment_id", sa.String(64), primary_key=True),
        sa.Column("device", sa.String(255), primary_key=True),
        sa.Column("hour", sa.Float(precision=53), primary_key=True),
        *[sa.Column(c, sa.BigInteger, nullable=False) for c in INTS],
        *[sa.Column(c, sa.Float(precision=53)) for c in FLOATS],
    )
    op.create_index("ix_device_hours_hour_device", TABLE, ["hour", "device"])
    # hour is a whole number of seconds: CAST is exact on both backends (PostgreSQL rounds, SQLite truncates)
    day = "hour - CAST(hour AS BIGINT) % 86400"
    op.execute(f"CREATE VIEW device_days AS SELECT device, {day} AS day, "
               + ", ".join(f"SUM({c}) AS {c}" for c in DAY_SUMS)
               + f", MIN(ecc_min) AS ecc_min, MAX(ecc_max) AS ecc_max, MAX(clk_max) AS clk_max FROM {TABLE} "
               f"GROUP BY device, {day}")
    make_append_only(op, TABLE)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("""
            DO $$
            BEGIN
              IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ipledger_writer') THEN
                GRANT SELECT ON device_days TO ipledger_writer;
              END IF;
            EXCEPTION WHEN insufficient_privilege THEN
              RAISE NOTICE 'ipledger: no privilege to grant on device_days; see docs/ledger.md';
            END $$
            """)


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
