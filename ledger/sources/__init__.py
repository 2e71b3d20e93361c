"""Source adapters: what DCGM, amd-smi and NVML say about devices and jobs, parsed into plain records.

Each module has pure parsers (``parse_*(text) -> records``) tested on real captured outputs, and thin readers
that run the tool through :mod:`ledger.commands` (or use the vendor's Python bindings when importable).
Standard library only: the Slurm hooks import these on their fast path.
"""
