"""A capture set: the per-node files a prospect sends (dcgmi dmon, amd-smi, nvidia-smi, Prometheus; mixed is
fine), read into one collection so every node is in one analysis (rack and sibling comparisons need them all).

Given files and directories (a directory's regular files in name order; symbolic links are not followed), each
file's format is the one given, or else :func:`sniff`'s reading of its first lines. The node of a dmon /
amd-smi / nvidia-smi file is ``--node`` (one capture only), else the ``node=`` of its wall-clock anchor line,
else the name :data:`DEFAULT_NODE_FROM` (or ``--node-from REGEX``) takes from its file name; a set of several
captures in which a file names no node is refused, as are two files of one node that overlap in time (one
node's name given twice). Prometheus files carry their node in their labels and are read together by
:func:`ledger.importers.prometheus.read`. A tar/zip of Prometheus exports is read as before; an archive of
captures is refused with a one-line error (unpack it and give the directory): archives are recognised by
their magic bytes, never read as text. Docs: docs/telemetry.md, "Capture sets".
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

from .bounded import archive_kind, directory_files
from .common import Collected, InputError

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
        if noise_reason(s) is None:
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


def _archive_member_kind(p: Path) -> str | None:
    """The capture format of an archive's first regular member (None: not a capture, or unreadable)."""
    try:
        if zipfile.is_zipfile(p):
            with zipfile.ZipFile(p) as zf:
                name = next((n for n in sorted(zf.namelist()) if not n.endswith("/")), None)
                if name is None:
                    return None
                with zf.open(name) as f:
                    data = f.read(SNIFF_BYTES)
        else:
            with tarfile.open(p, "r:*") as tf:
                m = next((m for m in tf if m.isfile()), None)
                f = tf.extractfile(m) if m is not None else None
                if f is None:
                    return None
                data = f.read(SNIFF_BYTES)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError):
        return None
    return sniff(data.decode("utf-8", "replace"))


def classify(p: Path, fmt: str | None) -> str:
    """'prometheus' or a capture format for this file; InputError for an archive of captures."""
    head = _head(p)
    kind = archive_kind(head)
    if kind is not None:
        if fmt not in (None, "prometheus") or _archive_member_kind(p) is not None:
            raise InputError(str(p), "", f"a {kind} archive of captures: unpack it and give the directory "
                                         f"(ipledger analyze DIR); only Prometheus exports are read from archives")
        return "prometheus"
    if fmt is not None:
        return fmt
    return sniff(head.decode("utf-8", "replace")) or "prometheus"


def read_set(sources: list[str], fmt: str | None = None, *, start: float | None = None,
             interval: float | None = None, node: str | None = None, node_from: str | None = None,
             at: float | None = None, while_reading: Callable[[], None] | None = None) -> Collected:
    """Every file of the sources in one collection (see the module doc); InputError on what it cannot read."""
    from . import amdsmi, dmon, nvidia_smi, prometheus

    pattern = node_from or DEFAULT_NODE_FROM
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InputError("--node-from", "", f"not a regular expression: {exc}") from None
    files = expand(sources)
    kinds = [(p, classify(p, fmt)) for p in files]
    proms = [p for p, k in kinds if k == "prometheus"]
    caps = [(p, k) for p, k in kinds if k != "prometheus"]
    if node is not None and len(caps) > 1:
        raise InputError("--node", "", f"one node for {len(caps)} capture files: name each file's node in its "
                                       f"name (--node-from REGEX) or its '# ipledger-start ... node=NAME' line")
    parts: list[Collected] = []
    if proms:
        parts.append(prometheus.read(proms, default_ts=at, while_reading=while_reading))
    elif while_reading is not None:
        while_reading()
    readers = {"dmon": dmon.read, "amd-smi": amdsmi.read}
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for p, k in caps:
        hint = node_from_name(p.name, pattern)
        if hint is not None:
            hint = dmon.host_name(hint, str(p), "file name")
        if k == "nvidia-smi":
            c = nvidia_smi.read(p, start=start, interval=interval, node=node or hint)
        else:
            c = readers[k](p, start=start, interval=interval, node=node, node_hint=hint)
        nodes = {i.node for i in c.devices.values()}
        if len(caps) > 1 and (None in nodes or "unknown-node" in nodes):
            raise InputError(str(p), "", f"no node name: the file name does not match the node pattern "
                                         f"{pattern!r} and no '# ipledger-start ... node=NAME' line names one "
                                         f"(rename the file or give --node-from REGEX)")
        for n, a, b in c.capture_segments:
            for a0, b0, other in spans.get(n, []):
                if other != str(p) and a < b0 and a0 < b:
                    raise InputError(str(p), "", f"node {n}: overlaps {other} in time: the same node named "
                                                 f"twice? (name each file's node: --node-from REGEX)")
        for n, a, b in c.capture_segments:
            spans.setdefault(n, []).append((a, b, str(p)))
        parts.append(c)
    if not parts:
        raise InputError(", ".join(sources), "", "no export files found")
    out = parts[0]
    sources_seen = {c.source for c in parts}
    cadences = {c.cadence for c in parts}
    no_span = any(c.span is None for c in parts)
    for c in parts[1:]:
        out.merge(c)
    if len(sources_seen) > 1:
        out.source = "capture_set"
    if len(cadences) > 1:
        out.cadence = None      # each device's own cadence is inferred from its samples
    if no_span and len(parts) > 1:
        out.span = None         # a part without a span (Prometheus): no common window cuts its samples
    if len(parts) > 1:
        out.path = ", ".join(sources)
    return out
