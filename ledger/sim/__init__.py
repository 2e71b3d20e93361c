"""The demo hall and what it is made of: a simulated fleet, its captures and synthetic receipts.

The fleet simulator (``fleet``, ``write``, ``captures``, ``score``) feeds the demo hall (``hall``, ``ipledger demo``,
docs/demo.md) and the accuracy benchmark; ``synthetic_receipts`` makes receipts in the docs/receipts.md shape for
tests and benchmarks. Nothing outside the CLI's ``demo``, the benchmarks and the tests imports this package.

May import: `ledger.base`, `ledger.chain`, `ledger.method`, `ledger.telemetry`, `ledger.capture`, `ledger.ingest`,
`ledger.receipts`, `reports`, `ledger.agents`.
"""

from .fleet import FleetSpec, Simulation, simulate

__all__ = ["FleetSpec", "Simulation", "simulate"]
