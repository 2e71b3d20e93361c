"""The `ipledger` command line: a thin click layer over the library (each command parses, calls, renders;
:mod:`ledger.api` holds the entry points a Python caller shares with it).

:func:`main` is the console script. ``ipledger mark`` goes straight to :mod:`ledger.capture.marks` without importing
click or the database layer (a job may mark at every checkpoint; bench/mark.py measures it); ``--help`` and
every other command go through click (:mod:`ledger.cli.main`).

May import: every package (it wires them): `ledger.proofcheck`, `ledger.base`, `ledger.chain`, `ledger.method`,
`ledger.telemetry`, `ledger.importers`, `ledger.capture`, `ledger.ingest`, `ledger.receipts`, `reports`,
`ledger.api`, `ledger.agents`, `ledger.sim`, `ledger.web`.
"""


def main() -> None:
    import sys

    args = sys.argv[1:]
    if args[:1] == ["mark"] and "--help" not in args and "-h" not in args:
        from ..capture.marks import main as mark_main

        sys.exit(mark_main(args[1:]))
    from .main import main as click_main

    click_main()
