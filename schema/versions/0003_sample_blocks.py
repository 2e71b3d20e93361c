"""The `sample_blocks` table: each telemetry segment's rows as one compressed columnar block.

One row per segment (`segment_id` = the `telemetry_segment` entry's id), written in the same transaction as
the entry: `format` names the encoding (`arrow-ipc/1`, ledger/telemetry/blocks.py), `rows` the row
count, `sha256` the block's own digest (a damaged block is named before it is decoded), `data` the bytes.
The segment entry's `samples_sha256` over the canonical rows stays the proof; the block is storage of the
same rows. Append-only like `entries` and `samples` (0001): the same triggers, and the writer role may only
read and append. Legacy segments stay in `samples` and are read as before.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

from ipledger_schema.append_only import make_append_only

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLE = "sample_blocks"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("segment_id", sa.String(64), primary_key=True),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # The block is already compressed (lz4): store it out of line without TOAST's pglz attempt.
        op.execute(f"ALTER TABLE {TABLE} ALTER COLUMN data SET STORAGE EXTERNAL")
    make_append_only(op, TABLE)


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
