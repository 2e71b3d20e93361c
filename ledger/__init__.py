"""ipledger: an append-only ledger of GPU allocations and telemetry, and the receipts computed from it.

The package is laid out as the data flows (docs/architecture.md): ``capture`` (the Slurm hooks, the node
collector and the local spool they write) -> ``ingest`` (ship: check, derive, append) -> ``chain`` (the
hash-chained ledger) -> views that are pure functions of its entries (``receipts``, ``reports``, ``agents``,
``web``), wired by ``cli``; below them ``base``, ``method`` and ``telemetry``; beside them ``proofcheck``, the
tenant's one-file verifier.
"""

__version__ = "0.1.0"
