"""A capture set: the per-node files a prospect sends (dcgmi dmon, amd-smi, nvidia-smi, Prometheus; mixed is
fine), read into one collection so every node is in one analysis (rack and sibling comparisons need them all).

Given files and directories (a directory's regular files in name order; symbolic links are not followed), each
file's format is the one given, or else :func:`sniff`'s reading of its first lines. The node of a dmon /
amd-smi / nvidia-smi file is ``--node`` (one capture only), else the ``node=`` of its wall-clock anchor line,
else the name :data:`DEFAULT_NODE_FROM` (or ``--node-from REGEX``) takes from its file name; a set of several
captures in which a file names no node is refused, as are two files of one node that overlap in time (one
node's name given twice). Prometheus files carry their node in their labels and are read together by
:func:`ledger.importers.prometheus.read`.

An archive (``.tar``, ``.tar.gz``/``.tgz``, ``.zip``; recognised by its magic bytes, never read as text) is a
capture set too, mixed as a directory may be: its members are read in memory one at a time, in name order,
never extracted (:func:`ledger.importers.bounded.archive_entries`: member count, per-member and total inflated
bytes and the compression ratio capped; links, devices and directories skipped; a traversal name refused),
each member's format sniffed, its node taken from the member's own file name as for a file. A member that
fails (a cap, a traversal name, not UTF-8, unreadable as its format) is quarantined: named with its reason in
``Collected.quarantined`` (the analysis' ``import.quarantined``) and left out, and the rest is still analysed;
an archive with no readable member, or past a cap of the whole archive, is refused in one line. Docs:
docs/telemetry.md, "Capture sets".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

from ..base.textsafe import excerpt
from .bounded import DEFAULT_LIMITS, ArchiveLimits, archive_entries, archive_kind, directory_files
from .common import Collected, InputError, decode_text

CAPTURE_FORMATS = ("dmon", "amd-smi", "nvidia-smi")
# dmon-gpu-07.txt, amdsmi-mi300-01.csv, nvsmi-gpu07-20261102T000000Z.csv -> gpu-07, mi300-01, gpu07
DEFAULT_NODE_FROM = (r"^(?:dmon|dcgmi|amdsmi|amd-smi|amd_smi|nvsmi|nvidia-smi|nvidia_smi|smi)[-_]"
                     r"(?P<node>[A-Za-z0-9][A-Za-z0-9._-]*?)(?:[-_]\d{8}T\d{6}Z)?(?:\.[A-Za-z0-9]+)?$")
_WATCH_BANNER = "'CTRL' + 'C' to stop watching output"
_NVSMI_COLUMNS = ("utilization.", "power.draw", "clocks.", "temperature.gpu", "memory.used", "pci.bus_id")
SNIFF_BYTES = 16384


def sniff(head: str) -> str | None:
    """The capture format of a file's first lines ('dmon', 'amd-smi', 'nvidia-smi'); None for anything else
    (a Prometheus export, or not telemetry: the Prometheus reader then says what it is)."""
    from .common import noise_reason

    seen = 0
    for raw in head.splitlines():
        s = raw.strip()
        if not s or s.startswith("# ipledger"):
            continue
        if s.startswith(("# HELP", "# TYPE", "# EOF", "# UNIT")):
            return None
        if s.startswith(("#Entity", "# Entity")):
            return "dmon"
        if s.startswith(_WATCH_BANNER) or s.startswith("GPU:"):
            return "amd-smi"
        if s.startswith(("<?xml", "<nvidia_smi_log", "<!DOCTYPE nvsmi")):
            return "nvidia-smi"
        if noise_reason(s) is not None:   # a pasted shell prompt ("[root@host dir]# dcgmi dmon ...") is not JSON
            continue
        if s.startswith(("[", "{")):
            if '"resultType"' in head or '"__name__"' in head:
                return None
            return "amd-smi" if re.search(r'"gpu"\s*:', head) else None
        toks = s.split()
        if toks[0] == "GPU" and len(toks) > 1 and not toks[1].isdecimal():
            return "amd-smi"                       # a monitor table header: GPU  POWER  GPU_T ...
        if "," in s:
            cells = [c.strip().lower() for c in s.split(",")]
            if any(c.startswith(_NVSMI_COLUMNS) for c in cells):
                return "nvidia-smi"
            if "gpu" in cells and "__name__" not in cells and "metric" not in cells:
                return "amd-smi"
        seen += 1
        if seen >= 3:
            return None
    return None


def node_from_name(name: str, pattern: str = DEFAULT_NODE_FROM) -> str | None:
    """The node a file name names: the pattern's ``node`` group (or its first group, or the whole match)."""
    m = re.search(pattern, name)
    if m is None:
        return None
    if "node" in m.re.groupindex:
        return m.group("node") or None
    return (m.group(1) if m.re.groups else m.group(0)) or None


def _aside(name: str) -> bool:
    """A file kept beside the captures that is none of them (a provenance note, a README)."""
    return name.endswith((".source.txt", ".md"))


def expand(sources: list[str]) -> list[Path]:
    """The files of the sources: files as given, a directory's regular files (recursively, name order, hidden
    names and notes skipped); symbolic links inside a directory are never followed."""
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if not p.exists():
            raise InputError(str(p), "", "no such file or directory")
        if not p.is_dir():
            out.append(p)
            continue
        files, _links = directory_files(p)   # symbolic links and other non-files: never followed
        found = [Path(str(f)) for f in files if not any(part.startswith(".") for part in f.parts)
                 and not _aside(f.name)]
        if not found:
            raise InputError(str(p), "", "no files in this directory")
        out.extend(sorted(found))
    return out


def _head(p: Path) -> bytes:
    with p.open("rb") as f:
        return f.read(SNIFF_BYTES)


def classify(p: Path, fmt: str | None) -> str:
    """'archive', 'prometheus' or a capture format for this file."""
    head = _head(p)
    if archive_kind(head) is not None:
        return "archive"
    if fmt is not None:
        return fmt
    return sniff(head.decode("utf-8", "replace")) or "prometheus"


class _Reader:
    """The captures of one set as they are read, one file or archive member at a time: each one's node named
    and checked against the others' time spans (one node's name given twice)."""

    def __init__(self, pattern: str, start: float | None, interval: float | None, node: str | None,
                 at: float | None, several: bool) -> None:
        self.pattern, self.start, self.interval, self.node, self.at = pattern, start, interval, node, at
        self.several = several
        self.spans: dict[str, list[tuple[float, float, str]]] = {}

    def parse(self, kind: str, label: str, file_name: str, text: str | None = None, p: Path | None = None
              ) -> Collected:
        """A capture file (``p``) or an archive member's text, parsed as ``kind`` (a capture format); no check
        against the other captures (:meth:`checked`), so it may run in a worker process."""
        from . import columnar, dmon, nvidia_smi

        hint = node_from_name(file_name, self.pattern)
        if hint is not None:
            hint = dmon.host_name(hint, label, "file name")
        if kind == "nvidia-smi":
            kw = {"start": self.start, "interval": self.interval, "node": self.node or hint}
            return nvidia_smi.read(p, **kw) if p is not None else nvidia_smi.parse(text, label, **kw)
        kw = {"start": self.start, "interval": self.interval, "node": self.node, "node_hint": hint}
        if p is not None:
            return (columnar.read_dmon if kind == "dmon" else columnar.read_amdsmi)(p, **kw)
        return (columnar.parse_dmon if kind == "dmon" else columnar.parse_amdsmi)(text, label, **kw)

    def capture(self, kind: str, label: str, file_name: str, text: str | None = None, p: Path | None = None
                ) -> Collected:
        return self.checked(self.parse(kind, label, file_name, text, p), label)

    def checked(self, c: Collected, label: str) -> Collected:
        """A parsed capture, its node named and its segments clear of the other captures' of that node."""
        nodes = {i.node for i in c.devices.values()}
        if self.several and (None in nodes or "unknown-node" in nodes):
            raise InputError(label, "", f"no node name: the file name does not match the node pattern "
                                        f"{self.pattern!r} and no '# ipledger-start ... node=NAME' line names one "
                                        f"(rename the file or give --node-from REGEX)")
        for n, a, b in c.capture_segments:
            for a0, b0, other in self.spans.get(n, []):
                if other != label and a < b0 and a0 < b:
                    raise InputError(label, "", f"node {n}: overlaps {other} in time: the same node named "
                                                f"twice? (name each file's node: --node-from REGEX)")
        for n, a, b in c.capture_segments:
            self.spans.setdefault(n, []).append((a, b, label))
        return c

    def archive(self, p: Path, fmt: str | None, limits: ArchiveLimits) -> list[Collected]:
        """The collections of an archive's members (one each; Prometheus members parsed as exports); the
        members that fail are quarantined on the first collection."""
        from . import prometheus

        parts: list[Collected] = []
        quarantined: list[str] = []
        links = 0
        for m in archive_entries(p, limits):
            base = m.name.replace("\\", "/").rsplit("/", 1)[-1]
            if m.link:
                links += 1
                continue
            if m.problem is None and (base.startswith(".") or _aside(base)):
                continue
            try:
                if m.problem is not None:
                    raise InputError(str(p), f"member {excerpt(m.name, 120)}", m.problem)
                text = decode_text(m.data, m.label)
                kind = fmt or sniff(text[:SNIFF_BYTES]) or "prometheus"
                if kind == "prometheus":
                    parts.append(prometheus.parse(text, m.label, self.at))
                else:
                    parts.append(self.capture(kind, m.label, base, text=text))
            except InputError as exc:
                quarantined.append(str(exc))
        if not parts:
            why = quarantined[0] if quarantined else f"{p}: no file member"
            raise InputError(str(p), "", f"no readable member (first: {why})")
        parts[0].quarantined.extend(quarantined)
        if links:
            parts[0].warn(f"{p}: {links} link/device member(s) skipped: not followed, not read")
        return parts


READ_WORKERS = 2     # two parsers keep a 2-CPU machine busy while this process imports the agents and merges


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0   # the parse says what is wrong with it


def _parse_file(reader: _Reader, kind: str, p: Path) -> Collected:
    return reader.parse(kind, str(p), p.name, p=p)


def parsed_in_workers(reader: _Reader, caps: list[tuple[Path, str]], workers: int | None,
                      while_reading: Callable[[], None] | None = None) -> Iterator[tuple[Path, Collected]]:
    """Each capture file's collection, in the files' order: parsed here one after another (``workers`` 0, the
    reference), or by forked worker processes when there are several files and a second CPU, while this process
    runs ``while_reading`` (analyze imports the agents then). The same collections and the same first error
    either way (tests/test_capture_sets.py): the checks between captures run here, in order."""
    import multiprocessing
    import os
    import threading

    if workers is None:
        workers = min(os.cpu_count() or 1, READ_WORKERS)
    if (workers < 2 or len(caps) < 2 or threading.active_count() != 1
            or "fork" not in multiprocessing.get_all_start_methods()):
        if while_reading is not None:
            while_reading()
        for p, k in caps:
            yield p, _parse_file(reader, k, p)
        return
    from concurrent.futures import ProcessPoolExecutor

    from ..base.heap import keep_large_blocks_in_heap

    # a worker is a short-lived parser: its column arrays come from the heap, not one mapping each (the
    # command may have asked for that for itself: heap.free_large_blocks_at_once), fewer page faults
    pool = ProcessPoolExecutor(min(workers, len(caps)), mp_context=multiprocessing.get_context("fork"),
                               initializer=keep_large_blocks_in_heap)
    try:
        # the largest files first, so that no worker is left with a large one at the end while the other idles;
        # the collections are still taken in the files' order
        order = sorted(range(len(caps)), key=lambda i: -_size(caps[i][0]))
        submitted = {i: pool.submit(_parse_file, reader, caps[i][1], caps[i][0]) for i in order}
        if while_reading is not None:
            while_reading()
        for i, (p, _k) in enumerate(caps):
            yield p, submitted[i].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_set(sources: list[str], fmt: str | None = None, *, start: float | None = None,
             interval: float | None = None, node: str | None = None, node_from: str | None = None,
             at: float | None = None, while_reading: Callable[[], None] | None = None,
             limits: ArchiveLimits = DEFAULT_LIMITS, workers: int | None = None) -> Collected:
    """Every file of the sources in one collection (see the module doc); InputError on what it cannot read.
    ``workers``: processes parsing the capture files (:func:`parsed_in_workers`; 0: all here, the reference)."""
    from . import prometheus

    pattern = node_from or DEFAULT_NODE_FROM
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InputError("--node-from", "", f"not a regular expression: {exc}") from None
    files = expand(sources)
    kinds = [(p, classify(p, fmt)) for p in files]
    proms = [p for p, k in kinds if k == "prometheus"]
    caps = [(p, k) for p, k in kinds if k not in ("prometheus", "archive")]
    archives = [p for p, k in kinds if k == "archive"]
    if node is not None and (len(caps) > 1 or archives):
        raise InputError("--node", "", f"one node for {len(caps) + len(archives)} capture files/archives: name "
                                       f"each file's node in its name (--node-from REGEX) or its "
                                       f"'# ipledger-start ... node=NAME' line")
    parts: list[Collected] = []
    reader = _Reader(pattern, start, interval, node, at, several=len(caps) > 1 or bool(archives))
    if proms:
        parts.append(prometheus.read(proms, default_ts=at, while_reading=while_reading))
        while_reading = None
    for p, c in parsed_in_workers(reader, caps, workers, while_reading):
        parts.append(reader.checked(c, str(p)))
    for p in archives:
        parts.extend(reader.archive(p, fmt, limits))
    if not parts:
        raise InputError(", ".join(sources), "", "no export files found")
    out = parts[0]
    sources_seen = {c.source for c in parts}
    cadences = {c.cadence for c in parts}
    no_span = any(c.span is None for c in parts)
    for c in parts[1:]:
        out.merge(c, take=True)   # each part was parsed for this set alone
    if len(sources_seen) > 1:
        out.source = "capture_set"
    if len(cadences) > 1:
        out.cadence = None      # each device's own cadence is inferred from its samples
    if no_span and len(parts) > 1:
        out.span = None         # a part without a span (Prometheus): no common window cuts its samples
    if len(parts) > 1:
        out.path = ", ".join(sources)
    return out
