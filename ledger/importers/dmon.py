"""``dcgmi dmon`` captures: header pairs that repeat every 14 ticks, ``N/A``/``N/W``, and no timestamps.

A capture carries no time, so its start and sampling interval come from the caller (``--start``,
``--interval``) or from the wall-clock anchor ``# ipledger-start <RFC3339> node=<host> interval_ms=<ms>`` that
the commands ``ipledger pathb-command`` prints write at each (re)start (the older ``# ipledger: start=...
interval_ms=... node=...`` line is read the same way). Every anchor starts a new capture segment whose ticks
count from its own time, so a restarted capture appended to one file is not shifted onto the first start
(:class:`Segments`; the hole between segments is ``capture_restarted``). Without a start the parser stops
with a one-line error. One tick = one row per entity; a tick ends when an entity repeats. Terminal noise (shell
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

from ..base.textsafe import excerpt
from .common import Collected, DeviceInfo, InputError, noise_reason, read_lines, small_index
from .dcgm_fields import BY_DMON

ENTITY_TYPES = ("GPU", "GPU-I", "GPU-CI", "Switch", "CPU", "Core", "Link", "NvSwitch", "CX")
_META = re.compile(r"#\s*ipledger:\s*(.*)")
# The wall-clock anchor `ipledger pathb-command` writes at each (re)start of a capture:
#   # ipledger-start 2026-11-02T00:00:00Z node=gpu-07 interval_ms=15000
DMON_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_ANCHOR = re.compile(r"#\s*ipledger-start\s+(\S+)(.*)")


def epoch_seconds(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def anchor_meta(line: str) -> dict[str, str] | None:
    """The key=value pairs of an ipledger line (``# ipledger: k=v ...`` or the anchor ``# ipledger-start TIME
    k=v ...``, whose TIME becomes ``start``); None for any other line."""
    m = _ANCHOR.match(line)
    if m:
        meta = dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv)
        meta["start"] = m.group(1)
        return meta
    m = _META.match(line)
    if m:
        return dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
    return None


_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


def host_name(name: str, path: str, place: str) -> str:
    """A node name read from a capture (its anchor line, its file name): a host name, or an InputError (a name
    that is none cannot be shown or written into a command as it is)."""
    if _HOST.fullmatch(name) is None:
        raise InputError(path, place, f"node name is not a host name (letters, digits, '.', '_', ':', '-'): "
                                      f"{name[:60]!r}")
    return name


class Segments:
    """The capture segments of one file: every anchor with a start time begins a new one, its ticks counted
    from that start (docs/telemetry.md, "Capture sets"). ``start``/``interval``/``node`` given by the caller
    stand for the first segment's (an explicit ``--start`` replaces the first anchor's time); ``node_hint`` (the
    node the file name names) is used where no anchor and no caller names one."""

    def __init__(self, path: str, start: float | None, interval: float | None, node: str | None,
                 node_hint: str | None = None) -> None:
        self.path, self.given_start, self.given_interval, self.given_node = path, start, interval, node
        self.start, self.interval = start, interval
        self.node = node or (host_name(node_hint, path, "file name") if node_hint else "unknown-node")
        self.anchors = 0
        self.done: list[tuple[str, float, float]] = []
        self.ticks = 0           # ticks of the open segment
        self.tick, self.seen = -1, set()

    def anchor(self, meta: dict[str, str], place: str) -> None:
        try:
            start = epoch_seconds(meta["start"]) if "start" in meta else None
            interval = float(meta["interval_ms"]) / 1000.0 if "interval_ms" in meta else None
        except ValueError:
            raise InputError(self.path, place, "start/interval_ms not understood") from None
        if self.given_node is None and meta.get("node"):
            self.node = host_name(meta["node"], self.path, place)
        if self.given_interval is None and interval is not None:
            self.interval = interval
        if start is None:
            return
        self.close()
        self.anchors += 1
        if not (self.anchors == 1 and self.given_start is not None):
            self.start = start
        self.tick, self.seen, self.ticks = -1, set(), 0

    def ipledger_line(self, line: str, place: str, c: Collected) -> None:
        """A ``# ipledger...`` line of a dmon capture: an anchor (or the older meta line) is applied, the
        collection's cadence taken from it when none was given; any other such line is ignored."""
        meta = anchor_meta(line)
        if meta is not None:
            self.anchor(meta, place)
            if c.cadence is None:
                c.cadence = self.interval

    def time_for(self, entity: str) -> float:
        """The time of this entity's row: a tick ends when an entity repeats."""
        if entity in self.seen or self.tick < 0:
            self.tick, self.seen = self.tick + 1, set()
            self.ticks = self.tick + 1
        self.seen.add(entity)
        return self.start + self.tick * self.interval

    def close(self) -> None:
        if self.ticks and self.start is not None and self.interval is not None:
            self.done.append((self.node, self.start, self.start + self.ticks * self.interval))
        self.ticks = 0

    def finish(self, c: Collected) -> None:
        """Record the segments on the collection; its span runs from the first start to the last end."""
        self.close()
        for (n0, _a0, b0), (n1, a1, _b1) in zip(self.done, self.done[1:]):
            if n0 == n1 and a1 < b0:
                c.warn(f"{self.path}: node {n1}: a capture segment starts at {a1:.0f}, {b0 - a1:.0f} s before the "
                       f"previous one's ticks end: its ticks ran slower than interval_ms (or the clock moved back); "
                       f"the overlapping ticks are kept where their start line puts them")
        c.capture_segments.extend(self.done)
        if self.done:
            c.span = (min(a for _, a, _ in self.done), max(b for _, _, b in self.done))


def parse(text: str | Iterable[str], path: str = "<input>", *, start: float | None = None,
          interval: float | None = None, node: str | None = None, node_hint: str | None = None) -> Collected:
    """``interval`` in seconds; ``text`` the capture or its lines (streamed: only the samples are kept).
    ``node_hint``: the node the file name names, used when neither ``node`` nor an anchor line names one.

    Returns the collection; raises InputError on anything it cannot place.
    """
    lines = iter(text.splitlines() if isinstance(text, str) else text)
    head = list(itertools.islice(lines, 20))
    seg = Segments(path, start, interval, node, node_hint)
    c = Collected("dcgmi_dmon", path=path, cadence=interval)
    columns: list[str] | None = None
    rows = 0
    first_bad: tuple[int, str] | None = None
    for n, raw in enumerate(itertools.chain(head, lines), start=1):
        s = raw.strip()
        if not s:
            continue
        if s.startswith("# ipledger"):
            seg.ipledger_line(s, f"line {n}", c)
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
        if toks[0].upper() == "ID" and not any(DMON_NUMBER.fullmatch(x) for x in toks[1:]):
            continue   # the units line under the header ("ID", older "Id", with units: "ID  %  MHZ  W  C")
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
        if seg.start is None or seg.interval is None:
            raise InputError(path, "", "dmon output has no timestamps: give --start and --interval "
                                       "(or a '# ipledger-start TIME interval_ms=...' line)")
        entity = f"{toks[0]} {toks[1]}"
        t = seg.time_for(entity)
        node_ = seg.node
        key = f"{node_}/gpu{toks[1]}" if toks[0] == "GPU" else f"{node_}/{toks[0].lower()}{toks[1]}"
        index = small_index(toks[1]) if toks[0] == "GPU" else None
        dev = c.device(DeviceInfo(device=key, node=node_, index=index,
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
    mark_mig_parent(c)
    seg.finish(c)
    return c


def mark_mig_parent(c: Collected) -> None:
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
    """The reference reading of a capture file (what is read for analysis is :func:`columnar.read_dmon`, held
    equal to :func:`parse`)."""
    return parse(read_lines(path), str(path), **kw)
