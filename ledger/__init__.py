"""ipledger: an append-only ledger of GPU allocations and telemetry, and the receipts computed from it.

The package is laid out as the data flows: ``spool`` (local durable queue) -> ``ship`` -> ``store``
(the hash-chained ledger) -> views (``receipts``, ``agents``, ``reports``) that are pure functions of entries.
"""

__version__ = "0.1.0"
