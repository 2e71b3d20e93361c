"""The `merkle_nodes` table: the ledger's RFC 9162 Merkle tree, one row per complete subtree (ledger/chain/merkle.py).

Row (level, idx), level >= 4, is the SHA-256 (32 bytes) of leaves [idx * 2^level, (idx + 1) * 2^level); leaf i
is entry seq i + 1. Smaller subtrees are hashed from the entries when needed (ledger.chain.merkle.STORED_LEVEL), so
the table holds about one row per 8 entries. On SQLite it is WITHOUT ROWID (one B-tree keyed by (level, idx)).
Rows are only ever added, in the transaction that appends the entries they cover, so the table is
append-only like `entries` (0001's triggers and grants). A ledger that already holds entries gets its tree
built here, once, from them; from then on the append path extends it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

from ipledger_schema.append_only import make_append_only

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLE = "merkle_nodes"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("level", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("idx", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sqlite_with_rowid=False,
    )
    bind = op.get_bind()
    make_append_only(op, TABLE)
    from ledger.chain import merkle
    from ledger.chain.store import head

    merkle.sync(bind, head(bind)[0])


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
