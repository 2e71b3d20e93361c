"""The read-only web view (`ipledger serve`): server-rendered pages over the agents' query layer, the receipts
and the statements, who-sees-what from a trusted proxy's user header, and the OpenMetrics endpoint /metrics
(docs/web.md). Nothing in the project imports this package but the CLI's `serve` command.

May import: `ledger.proofcheck`, `ledger.base`, `ledger.chain`, `ledger.method`, `ledger.telemetry`,
`ledger.importers`, `ledger.capture`, `ledger.ingest`, `ledger.receipts`, `reports`, `ledger.agents`.
"""
