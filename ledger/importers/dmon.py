"""``dcgmi dmon`` captures: header pairs that repeat every 14 ticks, ``N/A``/``N/W``, and no timestamps.

A capture carries no time, so its start and sampling interval come from the caller (``--start``,
``--interval``) or from a metadata line ``# ipledger: start=<epoch|RFC3339> interval_ms=<ms> node=<host>``
that ``ipledger pathb-command --exporter dcgmi`` writes at the top. Without them the parser stops with a
one-line error. One tick = one row per entity; a tick ends when an entity repeats. Terminal noise (shell
prompts, the echoed command, ``^C``, dcgmi's "dmon was stopped ..." message, kubectl lines) and any other line
that is not a row are skipped and counted (``Collected.skipped``); the capture is refused only when it has no
row at all. Columns are the dmon short names
(``ledger/importers/dcgm_fields.py``); unmapped columns are reported (``Collected.unmapped``). ``GPU-I`` rows are
MIG instances: in a capture of one GPU that GPU is their partitioned parent.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Iterable

from ..textsafe import excerpt
from .common import Collected, DeviceInfo, InputError, noise_reason, read_lines, small_index
from .dcgm_fields import BY_DMON

ENTITY_TYPES = ("GPU", "GPU-I", "GPU-CI", "Switch", "CPU", "Core", "Link", "NvSwitch", "CX")
_META = re.compile(r"#\s*ipledger:\s*(.*)")


def _epoch(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def parse(text: str | Iterable[str], path: str = "<input>", *, start: float | None = None,
          interval: float | None = None, node: str | None = None) -> Collected:
    """``interval`` in seconds; ``text`` the capture or its lines (streamed: only the samples are kept).

    Returns the collection; raises InputError on anything it cannot place.
    """
    lines = iter(text.splitlines() if isinstance(text, str) else text)
    head = list(itertools.islice(lines, 20))   # the metadata line is at the top
    meta: dict[str, str] = {}
    for line in head:
        m = _META.match(line.strip())
        if m:
            meta.update(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    try:
        if start is None and "start" in meta:
            start = _epoch(meta["start"])
        if interval is None and "interval_ms" in meta:
            interval = float(meta["interval_ms"]) / 1000.0
    except ValueError:
        raise InputError(path, "metadata line", "start/interval_ms not understood") from None
    node = node or meta.get("node") or "unknown-node"
    c = Collected("dcgmi_dmon", path=path, cadence=interval)
    columns: list[str] | None = None
    tick, seen = -1, set()
    rows = 0
    first_bad: tuple[int, str] | None = None
    for n, raw in enumerate(itertools.chain(head, lines), start=1):
        s = raw.strip()
        if not s or s.startswith("# ipledger"):
            continue
        toks = s.split()
        if toks[0] == "#Entity" or toks[:2] == ["#", "Entity"]:   # DCGM 3.x+ / older "# Entity"
            first_header = columns is None
            columns = toks[1:] if toks[0] == "#Entity" else toks[2:]
            for col in columns if first_header else ():   # the header repeats every 14 ticks: report it once
                spec = BY_DMON.get(col)
                if spec is None:
                    c.note_unmapped(col)
                else:
                    c.note_mapped(col, spec.target)
            continue
        if toks[0].upper() == "ID" and len(toks) == 1:   # the units line under the header ("ID", older "Id")
            continue
        if toks[0] not in ENTITY_TYPES or len(toks) < 2 or (columns is not None and len(toks) - 2 != len(columns)):
            noise = noise_reason(s)   # only for lines that are not rows: the common path stays a dict lookup
            if noise is not None or s.startswith("Error") or "dcgmi dmon" in s:
                c.skip(f"line {n}", noise or "tool_message", s)
                continue
            # a line that is neither noise we know nor a row: skipped and counted; the file is refused only
            # when nothing in it is readable (below), naming the first such line
            c.skip(f"line {n}", "not_a_dmon_row", s)
            first_bad = first_bad or (n, s)
            continue
        if columns is None:   # a capture cut mid-stream: its rows have no column names until the header repeats
            c.skip(f"line {n}", "row_before_header", s)
            continue
        values = toks[2:]
        if start is None or interval is None:
            raise InputError(path, "", "dmon output has no timestamps: give --start and --interval "
                                       "(or a '# ipledger: start=... interval_ms=...' line)")
        entity = f"{toks[0]} {toks[1]}"
        if entity in seen or tick < 0:
            tick += 1
            seen = set()
        seen.add(entity)
        t = start + tick * interval
        key = f"{node}/gpu{toks[1]}" if toks[0] == "GPU" else f"{node}/{toks[0].lower()}{toks[1]}"
        index = small_index(toks[1]) if toks[0] == "GPU" else None
        dev = c.device(DeviceInfo(device=key, node=node, index=index,
                                  mig_instance=toks[1] if toks[0] == "GPU-I" else None))
        for col, v in zip(columns, values):
            spec = BY_DMON.get(col)
            if spec is not None:
                c.add_raw(dev, spec.target, t, v, spec.scale, place=f"line {n} column {col}")
        rows += 1
    if rows == 0 and first_bad is not None:
        raise InputError(path, f"line {first_bad[0]}", f"expected a dmon row ('GPU <id> <values>' under an "
                                                       f"#Entity header), got '{excerpt(first_bad[1])}'")
    if columns is None:
        raise InputError(path, "", "no '#Entity' header: not dcgmi dmon output")
    _mark_mig_parent(c)
    if start is not None and interval is not None:
        c.span = (start, start + (tick + 1) * interval)
    return c


def _mark_mig_parent(c: Collected) -> None:
    """GPU instances (``GPU-I n``, DCGM's own numbering) in a capture of one GPU make that GPU their partitioned
    parent, never billed itself. dmon names no profile, so the instances' shares are unknown: said in a warning."""
    instances = [d for d, i in c.devices.items() if i.mig_instance is not None]
    if not instances:
        return
    gpus = [d for d, i in c.devices.items() if i.mig_instance is None and "/gpu" in d and "/gpu-" not in d]
    if len(gpus) == 1:
        c.devices[gpus[0]] = replace(c.devices[gpus[0]], partitioned=True)
    else:
        c.warn(f"{c.path}: {len(instances)} GPU instances in a capture of {len(gpus)} GPUs: which GPU is their parent "
               f"is not in dmon output, so every GPU is accounted as a whole GPU")
    c.warn(f"{c.path}: dmon does not name MIG profiles: the {len(instances)} GPU instances are billed as whole GPUs "
           f"(receipts say priced_as whole GPU); import dcgm-exporter or nvidia-smi -q -x for the profiles")


def read(path: str | Path, **kw) -> Collected:
    return parse(read_lines(path), str(path), **kw)
