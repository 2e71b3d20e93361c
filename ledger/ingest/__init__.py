"""Ingest: the spool into the ledger.

``ship`` reads the spool, checks each record (``intake``), derives what the hooks' raw tool output means
(through ``ledger.capture.sources``), appends to the chain and runs the caller's after-ship steps; ``sacct``
adds the accounting records of ended runs; ``site`` is the value holding the site's settings, read and
checked once from the config.
May import: ``ledger.base``, ``ledger.chain``, ``ledger.method``, ``ledger.telemetry``, ``ledger.importers``,
``ledger.capture``, ``ledger.proofcheck``.
"""
