"""The `receipt_lines` table: every issued receipt's flat lines, derived from its `receipt_issued` entry
(ledger/chain/receipt_lines.py).

One row per line of a receipt: its part in each billing period (figures split exactly over the months its
window overlaps), each unknown interval, or one line for an issue that names its receipt by hash alone. Rows
are only ever added, in the transaction that appends the issue they derive from, so the table is
append-only like `entries` (0001's triggers and grants); `ipledger verify` re-derives every line. A ledger
that already holds issued receipts gets their lines derived here, once.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLE = "receipt_lines"


def upgrade() -> None:
    from ledger.chain import receipt_lines
    from ipledger_schema.append_only import make_append_only

    bind = op.get_bind()
    receipt_lines.table(sa.MetaData()).create(bind)
    # The export reads a month's lines, and the runs issued more than once.
    op.create_index("ix_receipt_lines_month", TABLE, ["part_month", "seq"])
    op.create_index("ix_receipt_lines_run", TABLE, ["run_key", "seq"])
    make_append_only(op, TABLE)
    receipt_lines.sync(bind)


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
