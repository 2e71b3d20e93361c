"""Benchmarks: each figure of docs/performance.md measured as a ratio to a floor taken in the same run.

``python -m bench`` runs them all; ``python -m bench.<figure>`` runs one (``--scale F``, ``--full``,
``--repeat N``, ``--no-write``; or ``IPLEDGER_BENCH_SCALE``).
"""

FIGURES = ["hook", "mark", "ship_sqlite", "ship_segments", "ship_postgres", "analyze", "analyze_captures", "receipt", "export", "verify",
           "load_pg", "proofs", "agents", "import_export", "web",
           "k8s_tick", "latency"]
