"""Source adapters: what DCGM, amd-smi and NVML say about devices and jobs, parsed into plain records.

Each module has pure parsers (``parse_*(text) -> records``) tested on real captured outputs, and thin readers
that run the tool through :mod:`ledger.base.commands` (or use the vendor's Python bindings when importable). The
hooks import none of them: they record the tools' answers raw, and :mod:`ledger.capture.sources.observed` reads them
at ship time (the few answers a hook must read to act are parsed in :mod:`ledger.capture.hooks.vendor`).
"""
