"""Path B importers: pure parsers of the telemetry files a site already has, and the pipeline into the ledger.

Each format module has ``parse(text, ...) -> Collected`` (pure) and ``read(path, ...) -> Collected`` (thin);
:mod:`ledger.importers.pipeline` turns a :class:`~ledger.importers.common.Collected` into timelines, sealed
sample segments, unknown intervals and (for label-only data) synthetic allocations, in one transaction.

May import: `ledger.base`, `ledger.chain`, `ledger.telemetry`.
"""
