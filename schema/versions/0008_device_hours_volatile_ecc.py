"""Two more `device_hours` columns, so ECC drift is found from whichever correctable counter a source has.

The lowest and highest `ecc_sbe_volatile` reading (DCGM field 310, the volatile correctable counter) of a device's
samples in the hour, NULL where none was read: a dcgm-exporter that exports field 310 but not the aggregate (312)
gave the drift agent nothing to read (issue 28). `ecc_min` / `ecc_max` keep their meaning (the aggregate counter),
so a ledger sealed before this migration recomputes to the same rows there; its rows hold NULL in the new columns,
which verify does not count as a mismatch and the agents read as not measured (ledger.telemetry.hours.LATER).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "device_hours"


def upgrade() -> None:
    for c in ("eccv_min", "eccv_max"):
        op.add_column(TABLE, sa.Column(c, sa.Float(precision=53)))


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
