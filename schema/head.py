"""The newest migration in schema/versions, known without importing alembic.

Every `ipledger` command checks the ledger's schema revision (ledger.chain.db.require_schema); reading it with one
SELECT and comparing to these constants keeps alembic (≈ 0.3 s of imports) off every command but `init`.
tests/test_schema_head.py asks alembic for the head and the history and fails when a migration is added
without updating this file.
"""

# Oldest first, as alembic applies them.
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008")
HEAD_REVISION = REVISIONS[-1]
