"""Indexes for the queries receipts, exports, agents and `ipledger log` run on a big ledger.

- (job_id, seq): `receipt JOBID` and `log --job` filter on job_id alone and read in seq order; the existing
  (cluster, job_id, run) index cannot serve a job_id-only filter (its leading column is cluster), so both
  backends walked the whole table in seq order — seconds per receipt at 10 million entries.
- (kind, seq): iter_entries(kinds=...) (exports over receipt_issued, verify's segment check, agents) reads
  one kind in seq order; (kind, ts) found the rows but then sorted them.

Both backends; additive only (the ledger's rows are untouched).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entries_job_seq", "entries", ["job_id", "seq"])
    op.create_index("ix_entries_kind_seq", "entries", ["kind", "seq"])


def downgrade() -> None:
    raise NotImplementedError("the ledger is append-only: migrations are not reversed")
