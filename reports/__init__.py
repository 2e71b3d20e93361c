"""Reports: the monthly tenant accounting export (CSV, Parquet, FinOps FOCUS, JSON, PDF) and the written
analysis of a telemetry export (PDF).

Everything here reads receipts and findings; nothing writes to the ledger. The core is pure functions over
receipt dicts (docs/receipts.md, "JSON"): :mod:`reports.monthly` flattens and aggregates them,
:mod:`reports.focus` maps them onto FinOps FOCUS columns, :mod:`reports.pdf_statement` and
:mod:`reports.analysis_pdf` render documents, :mod:`reports.issued` reads the issued receipts out of a ledger.
See docs/reports.md.

May import: `ledger.base`, `ledger.chain`, `ledger.receipts`.
"""
