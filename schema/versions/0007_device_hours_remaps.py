"""Row-remap extremes in `device_hours`: the drift agent's row-remap findings screened from device-hours.

Two columns, the highest `row_remap_pending` and `row_remap_failure` reading of a device's samples in the hour
(NULL where none was read), computed by ledger/telemetry/hours.py with the others and checked by `ipledger
verify` like them. Rows written before this migration hold NULL: what a segment without row-remap readings
gives; for a segment with them `ipledger verify` names the field that differs.

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
    for c in ("remap_pending_max", "remap_failure_max"):
        op.add_column(TABLE, sa.Column(c, sa.Float(precision=53)))


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
