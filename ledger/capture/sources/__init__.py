"""Source adapters: what DCGM, amd-smi and NVML say about devices and jobs, parsed into plain records.

Each module has pure parsers (``parse_*(text) -> records``) tested on real captured outputs; none runs a tool.
The hooks run the tools (through :mod:`ledger.base.commands`) and import none of these modules: they record
the tools' answers raw, and :mod:`ledger.capture.sources.observed` reads them at ship time with these parsers.
The few answers a hook must read to act are parsed in :mod:`ledger.capture.hooks.vendor`, which the parsers
here re-export and build on (so the package imports the hook's vendor module, never the other way round);
``nvml`` reads NVML's MIG devices through a ``pynvml`` module its caller passes in, and ``hostengine`` asks
whether a DCGM host engine answers on its TCP port.
"""
