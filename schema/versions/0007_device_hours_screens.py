"""Four more `device_hours` columns, so the agents screen row remaps and power caps from device-hours.

The highest `row_remap_pending` and `row_remap_failure` reading of a device's samples in the hour (NULL where
none was read), and the power-cap rule's counts: running samples at activity >= 0.2 and those of them with the
power-cap reason. Computed by ledger/telemetry/hours.py with the others and checked by `ipledger verify` like
them. Rows sealed before this migration hold NULL there: the agents read such an hour as not known (they read
its raw samples instead) and verify does not count the NULL as a mismatch (ledger.telemetry.hours.LATER).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLE = "device_hours"


def upgrade() -> None:
    for c in ("remap_pending_max", "remap_failure_max", "pcap_loaded_n", "pcap_n"):
        op.add_column(TABLE, sa.Column(c, sa.Float(precision=53)))


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
