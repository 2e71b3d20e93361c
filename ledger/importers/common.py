"""What every importer produces: devices, compact per-device per-field series, and the allocation contexts.

Values are stored in ``array('d')`` pairs (t, value; NaN = not measured) rather than Python objects, so a
24-hour, 64-GPU export stays small until the pipeline turns one device at a time into samples. The reason a
value is missing is kept only for the missing ones.
"""

from __future__ import annotations

import csv
import io
import re
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..base.textsafe import excerpt, printable
from ..telemetry.timeline import (DCGM_FP64_BLANKS, DCGM_INT32_BLANKS, FIELDS, FRACTIONS, INT64_BLANK_FLOAT,
                                  BadValue, check_range, clean)
from .amd_exporter_fields import OP_COUNTERS
from .dcgm_fields import ENERGY_WHOLE_J, GR_ENGINE_ACTIVE
from .op_counters import fp_ops

NAN = float("nan")
# Series that are no Sample field but stand in for one on a device that has no series of it: GR_ENGINE_ACTIVE
# for gpu_util (dcgm-exporter 4.x enables it by default, GPU_UTIL in 3.x); DCGM field 1611 (whole joules) for
# energy_j (field 156), so a scrape carrying both energy counters of one GPU is counted once, from 156.
STAND_INS = {GR_ENGINE_ACTIVE: "gpu_util", ENERGY_WHOLE_J: "energy_j"}
# Cumulative op counters (AMD TOTAL_16/32/64_OPS): no Sample field; their deltas are each sample's fp_ops
# (:mod:`ledger.importers.op_counters`), derived when a device's series are read.
SERIES_FIELDS = frozenset((*FIELDS, *STAND_INS, *OP_COUNTERS))
NOT_BLANK_CHECKED = frozenset(("energy_j", *OP_COUNTERS))   # counters: any count is a count
# AMD's op counters are 64-bit unsigned counts, past 2**63 after a few hours at an MI300X's rate: DCGM's blanks
# (the int64 one is 2**63 - 16 and up) are no blanks there, only counts (no DCGM field is an op counter)
COUNTS_PAST_INT64 = frozenset(OP_COUNTERS)
_REASON_CODES = (None, "nan", "infinite", "dcgm_blank", "negative", "out_of_range", "zero_unsupported")
MAX_EXAMPLES = 20
# Readings an exporter prints as 0 when the part has no such sensor (memory temperature without an HBM sensor,
# dcgm-exporter on GDDR parts): no powered GPU's memory is at 0 °C, so 0 there is "not supported", not a value.
ZERO_MEANS_UNSUPPORTED = frozenset({"mem_temp_c"})
_FP64_BLANKS = np.array(sorted(DCGM_FP64_BLANKS))
_INT32_BLANKS = np.array(sorted(DCGM_INT32_BLANKS), dtype=np.float64)


# Telemetry timestamps outside [EARLIEST_TS, this machine's clock + FUTURE_SLACK_S] are refused, naming the
# file and the point (docs/telemetry.md, "Bad input"): before 2000 is no GPU export but a unit mistake (ms read
# as s the other way round, a counter, 0), and more than a day ahead is a wrong clock on the exporting host.
EARLIEST_TS = 946684800.0          # 2000-01-01T00:00:00Z
FUTURE_SLACK_S = 86400.0


def time_problem(t: float, latest: float) -> str | None:
    """Why ``t`` cannot be a sample time (None when it can)."""
    if EARLIEST_TS <= t <= latest:
        return None
    if t != t or t in (float("inf"), float("-inf")):
        return f"timestamp is not a finite number: {t!r}"
    if t < EARLIEST_TS:
        return f"timestamp {t!r} is before 2000-01-01: not unix seconds (a counter, or a wrong unit?)"
    return (f"timestamp {t!r} is more than a day after this machine's clock: a wrong clock on the exporting "
            f"host, or milliseconds where seconds are expected?")


def small_index(text: str) -> int | None:
    """A GPU/entity index as printed (``0`` .. ``999999999``); None for anything else, ``²`` and ``٣``-runs of
    thousands of digits included (``str.isdigit`` accepts ``²``, which ``int`` refuses)."""
    return int(text) if text.isdecimal() and len(text) <= 9 else None


class InputError(ValueError):
    """Malformed input: one line naming the file, the place in it, and what is wrong."""

    def __init__(self, path: str, place: str, message: str) -> None:
        self.path, self.place, self.message = path, place, message
        # one line whatever the input quoted in it holds (newlines, terminal escapes)
        super().__init__(printable(f"{path}: {place}: {message}" if place else f"{path}: {message}"))

    def __reduce__(self):  # noqa: ANN204 - raised in a worker process, re-raised here with the same fields
        return type(self), (self.path, self.place, self.message)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    device: str                    # the Sample.device key: GPU UUID, "UUID/giN" for a MIG instance, else an alias
    node: str | None = None
    index: int | None = None
    uuid: str | None = None
    sku: str | None = None
    vendor: str = "nvidia"
    pci_bus_id: str | None = None
    mig_profile: str | None = None
    mig_instance: str | None = None
    driver: str | None = None
    partitioned: bool = False      # a GPU in MIG mode: its instances are the devices, it is never billed itself


@dataclass(frozen=True, slots=True)
class Context:
    """Who held a device, as the labels say: a Slurm job (hpc_job) or a Kubernetes pod (tenant = namespace)."""

    kind: str                      # "slurm" | "k8s" | "node" (whole export of one node, no labels)
    job_id: str
    tenant: str | None = None
    detail: tuple[tuple[str, str], ...] = ()


@dataclass
class Collected:
    source: str                                   # "prometheus", "dcgmi_dmon", "amd_smi", "nvidia_smi", ...
    path: str = "<input>"
    source_version: str = ""
    cadence: float | None = None                  # known cadence (step, -d, --interval); else inferred
    span: tuple[float | None, float | None] | None = None
    devices: dict[str, DeviceInfo] = field(default_factory=dict)
    series: dict[str, dict[str, tuple[array, array]]] = field(default_factory=dict)
    reasons: dict[str, dict[tuple[float, str], str]] = field(default_factory=dict)
    contexts: dict[tuple[str, Context], list[float]] = field(default_factory=dict)
    points: int = 0
    latest: float = field(default_factory=lambda: time.time() + FUTURE_SLACK_S)   # the last acceptable time
    # What the input policy did (docs/telemetry.md, "Real input"): lines skipped by reason, source fields
    # mapped (name -> Sample field) and not mapped (name -> count), and one-line warnings.
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_examples: list[str] = field(default_factory=list)
    mapped: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Capture segments (node, start, end): each wall-clock anchor of a dmon / amd-smi capture starts one
    # (docs/telemetry.md, "Capture sets"); the time between two segments of one node is capture_restarted.
    capture_segments: list[tuple[str, float, float]] = field(default_factory=list)
    # Archive members not analysed ("archive:member: why"): refused by a cap, a traversal name, or unreadable;
    # the rest of the archive is still read (docs/telemetry.md, "Capture sets").
    quarantined: list[str] = field(default_factory=list)

    def device(self, info: DeviceInfo) -> str:
        old = self.devices.get(info.device)
        if old is None or (old.sku is None and info.sku) or (old.node is None and info.node):
            self.devices[info.device] = info if old is None else _merge_info(old, info)
        return info.device

    def skip(self, place: str, reason: str, text: str = "") -> None:
        """Count a line the policy skips (terminal noise, a banner, an unreadable line); keep a few examples."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if len(self.skipped_examples) < MAX_EXAMPLES:
            self.skipped_examples.append(printable(f"{place}: {reason}: '{excerpt(text, 60)}'" if text else f"{place}: {reason}"))

    def note_mapped(self, name: str, target: str) -> None:
        self.mapped.setdefault(name, target)

    def note_unmapped(self, name: str) -> None:
        self.unmapped[name] = self.unmapped.get(name, 0) + 1

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_EXAMPLES:
            self.warnings.append(printable(message))
        elif len(self.warnings) == MAX_EXAMPLES:
            self.warnings.append("(further warnings not shown)")

    def report(self) -> dict:
        """The import report's input half: mapped and unmapped fields, skipped lines, warnings."""
        return {"mapped_fields": dict(sorted(self.mapped.items())), "unmapped_fields": dict(sorted(self.unmapped.items())),
                "skipped_lines": dict(sorted(self.skipped.items())), "skipped_examples": list(self.skipped_examples),
                "warnings": self.all_warnings(), "quarantined": list(self.quarantined)}

    def add(self, device: str, name: str, t: float, value: float | None, reason: str | None = None, *,
            place: str = "") -> None:
        if name not in SERIES_FIELDS:
            raise ValueError(f"unknown field {name!r}")
        if not EARLIEST_TS <= t <= self.latest:
            raise InputError(self.path, place, time_problem(t, self.latest) or "")
        ts, vs = self.series.setdefault(device, {}).setdefault(name, (array("d"), array("d")))
        ts.append(t)
        vs.append(NAN if value is None else value)
        if value is None:
            self.reasons.setdefault(device, {})[(t, name)] = reason or "not_available"
        self.points += 1

    def add_raw(self, device: str, name: str, t: float, raw: object, scale: float = 1.0, *, place: str = "") -> None:
        """Clean a raw reading (sentinels, N/A, NaN, negatives), convert units, range-check, store."""
        try:
            v, reason = clean(raw, name)
        except BadValue as exc:
            # An unreadable value is missing with its cause, never zero, and never the end of the import.
            self.warn(f"{self.path}: {place}: {name}: {exc}: stored as missing (unreadable)")
            v, reason = None, "unreadable"
        if v == 0.0 and name in ZERO_MEANS_UNSUPPORTED:
            v, reason = None, "zero_unsupported"
        if v is not None:
            if scale != 1.0:   # divide by 100 / 1000 rather than multiply by 0.01: 95 % -> 0.95 exactly
                inv = 1.0 / scale
                v = v / round(inv) if abs(inv - round(inv)) < 1e-9 else v * scale
            v, reason = check_range(name, v)
        self.add(device, name, t, v, reason, place=place)

    def add_raw_many(self, device: str, name: str, ts: Sequence[float], raws: list,
                     scale: float = 1.0, *, place: str = "") -> np.ndarray | None:
        """Vectorised :meth:`add_raw` for a whole series; the same outcomes value by value (tested).

        Returns the timestamps as an array, or None (and stores nothing) when a value needs the per-value path: text markers such as
        ``N/A``, or anything numpy does not read as a number; that path then explains or rejects it.
        """
        # float columns are numbers by construction; lists are checked value by value
        if not (isinstance(raws, np.ndarray) and raws.dtype == np.float64) and not set(map(type, raws)) <= {str, float, int}:
            return None
        try:
            v = np.array(raws, dtype=np.float64)
            t = np.array(ts, dtype=np.float64)
        except (ValueError, OverflowError, TypeError):
            return None
        if v.shape != (len(raws),) or t.shape != v.shape:
            return None
        with np.errstate(invalid="ignore"):
            bad_time = ~((t >= EARLIEST_TS) & (t <= self.latest))
        if bad_time.any():
            i = int(np.flatnonzero(bad_time)[0])
            raise InputError(self.path, f"{place} point {i}".strip(), time_problem(float(t[i]), self.latest) or "")
        reason = np.zeros(len(v), dtype=np.int8)          # index into _REASON_CODES
        with np.errstate(invalid="ignore"):
            nan = np.isnan(v)
            inf = np.isinf(v)
            blank = ~nan & ~inf & ((v >= INT64_BLANK_FLOAT) | _among(v, _FP64_BLANKS))
            if name in COUNTS_PAST_INT64:
                blank[:] = False
            if name not in NOT_BLANK_CHECKED:
                blank |= _among(v, _INT32_BLANKS)
            neg = ~nan & ~inf & ~blank & (v < 0)
            reason[neg] = 4
            reason[blank] = 3
            reason[inf] = 2
            reason[nan] = 1
            ok = reason == 0
            if scale != 1.0:
                inv = 1.0 / scale
                if abs(inv - round(inv)) < 1e-9:
                    v = np.where(ok, v / round(inv), v)
                else:
                    v = np.where(ok, v * scale, v)
            if name in FRACTIONS:
                reason[ok & (v > 1.0 + 1e-6)] = 5
            if name in ZERO_MEANS_UNSUPPORTED:
                reason[ok & (v == 0.0)] = 6
        bad = reason != 0
        v[bad] = np.nan
        store = self.series.setdefault(device, {}).setdefault(name, (array("d"), array("d")))
        store[0].frombytes(t.tobytes())
        store[1].frombytes(v.tobytes())
        if bad.any():
            rs = self.reasons.setdefault(device, {})
            for i in np.flatnonzero(bad):
                rs[(float(t[i]), name)] = _REASON_CODES[reason[i]]
        self.points += len(v)
        return t

    def note_context(self, device: str, ctx: Context, t: float) -> None:
        span = self.contexts.get((device, ctx))
        if span is None:
            self.contexts[(device, ctx)] = [t, t]
        else:
            span[0] = min(span[0], t)
            span[1] = max(span[1], t)

    def _standing(self, device: str) -> dict[str, str]:
        """series name -> the Sample field it is read as (a stand-in whose field the device lacks; else itself);
        op counters are left out (they are read as ``fp_ops``, :meth:`_ops`)."""
        raw = self.series.get(device, {})
        return {name: STAND_INS.get(name, name) for name in raw
                if name not in OP_COUNTERS and (name not in STAND_INS or STAND_INS[name] not in raw)}

    def _ops(self, device: str) -> tuple[np.ndarray, np.ndarray, str | None] | None:
        """The device's ``fp_ops`` column from its op counters (None: it has none)."""
        raw = self.series.get(device, {})
        counters = {n: (np.frombuffer(raw[n][0], dtype=np.float64), np.frombuffer(raw[n][1], dtype=np.float64))
                    for n in OP_COUNTERS if n in raw}
        if not counters or "fp_ops" in raw:
            return None
        return fp_ops(counters)

    def device_series(self, device: str) -> dict[str, Iterator[tuple[float, float | None]]]:
        """The series of one device as the timeline wants them; a stand-in (:data:`STAND_INS`) is read as its
        field when the device has no series of that field, and left out when it has one."""
        return {name: [(float(t), None if v != v else float(v)) for t, v in zip(*cols)]   # NaN -> None
                for name, cols in self.device_arrays(device).items()}

    def device_arrays(self, device: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Like :meth:`device_series` but as float arrays (NaN = not measured), without copying."""
        raw = self.series.get(device, {})
        out = {target: (np.frombuffer(raw[name][0], dtype=np.float64), np.frombuffer(raw[name][1], dtype=np.float64))
               for name, target in self._standing(device).items()}
        ops = self._ops(device)
        if ops is not None and ops[2] is None:
            out["fp_ops"] = (ops[0], ops[1])
        return out

    def device_series_names(self, device: str) -> set[str]:
        """The Sample fields this device has series for (a stand-in reported as its field)."""
        names = set(self._standing(device).values())
        ops = self._ops(device)
        if ops is not None and ops[2] is None:
            names.add("fp_ops")
        return names

    def device_reasons(self, device: str) -> dict[tuple[float, str], str]:
        r = self.reasons.get(device, {})
        if any(name in STAND_INS or name in OP_COUNTERS for name in self.series.get(device, {})):
            standing = self._standing(device)
            r = {(t, standing[n]): why for (t, n), why in r.items() if n in standing}
        return r

    def ops_notes(self) -> list[str]:
        """One line per device whose op counters give no ``fp_ops`` (and why)."""
        out = []
        for dev in sorted(self.series):
            ops = self._ops(dev)
            if ops is not None and ops[2] is not None:
                out.append(f"{self.path}: {dev}: op counters not read as fp_ops: {ops[2]}")
        return out

    def energy_notes(self) -> list[str]:
        """One line per device whose field-1611 energy counter is not read because its field 156 is: the same
        counter in two units, counted once (from 156, the finer mJ)."""
        return [f"{self.path}: {dev}: energy from DCGM field 156 (mJ); field 1611 (whole J) of the same GPU not "
                f"read (one counter, counted once)"
                for dev, raw in sorted(self.series.items()) if ENERGY_WHOLE_J in raw and "energy_j" in raw]

    def all_warnings(self) -> list[str]:
        return [*self.warnings, *self.energy_notes(), *self.ops_notes()]

    def merge(self, other: "Collected", *, take: bool = False) -> None:
        """Fold another file of the same export into this one (directories, archives, JSON Lines). ``take``:
        ``other`` is not used again, so a series this one lacks is taken over, not copied."""
        for info in other.devices.values():
            self.device(info)
        for dev, fields in other.series.items():
            mine = self.series.setdefault(dev, {})
            for name, (ts, vs) in fields.items():
                if name in mine:
                    mine[name][0].extend(ts)
                    mine[name][1].extend(vs)
                else:
                    mine[name] = (ts, vs) if take else (array("d", ts), array("d", vs))
        for dev, rs in other.reasons.items():
            self.reasons.setdefault(dev, {}).update(rs)
        for key, (a, b) in other.contexts.items():
            span = self.contexts.get(key)
            self.contexts[key] = [a, b] if span is None else [min(span[0], a), max(span[1], b)]
        self.points += other.points
        for k, n in other.skipped.items():
            self.skipped[k] = self.skipped.get(k, 0) + n
        self.skipped_examples.extend(other.skipped_examples[:max(0, MAX_EXAMPLES - len(self.skipped_examples))])
        for k, v in other.mapped.items():
            self.mapped.setdefault(k, v)
        for k, n in other.unmapped.items():
            self.unmapped[k] = self.unmapped.get(k, 0) + n
        for w in other.warnings:
            self.warn(w)
        if other.span:
            a, b = other.span
            if self.span is None:
                self.span = (a, b)
            else:
                sa, sb = self.span
                self.span = (a if sa is None else (sa if a is None else min(sa, a)),
                             b if sb is None else (sb if b is None else max(sb, b)))
        if self.cadence is None:
            self.cadence = other.cadence
        self.capture_segments.extend(other.capture_segments)
        self.quarantined.extend(other.quarantined)


def _among(v: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.isin(v, values)`` for sorted ``values``: only the values inside their range are looked up (a
    reading is seldom near a DCGM blank; isin's set-up on every series was most of the check)."""
    near = (v >= values[0]) & (v <= values[-1])
    if near.any():
        near[near] = np.isin(v[near], values)
    return near


def restart_holes(c: Collected) -> dict[str, list[tuple[float, float]]]:
    """node -> the holes between its capture segments, in time order: where a capture stopped and the next
    (a second anchor in one file, or a later file of the node) started. Overlapping segments leave no hole."""
    by_node: dict[str, list[tuple[float, float]]] = {}
    for node, a, b in c.capture_segments:
        by_node.setdefault(node, []).append((a, b))
    out: dict[str, list[tuple[float, float]]] = {}
    for node, segs in by_node.items():
        segs.sort()
        end = segs[0][1]
        for a, b in segs[1:]:
            if a > end:
                out.setdefault(node, []).append((end, a))
            end = max(end, b)
    return out


def _merge_info(old: DeviceInfo, new: DeviceInfo) -> DeviceInfo:
    from dataclasses import fields as dc_fields, replace

    changes = {f.name: getattr(new, f.name) for f in dc_fields(old)
               if getattr(old, f.name) is None and getattr(new, f.name) is not None}
    return replace(old, **changes)


class CsvReader:
    """``csv.reader`` whose malformed rows (a NUL, a stray quote or carriage return) are InputErrors naming the line."""

    def __init__(self, source: str | Iterable[str], path: str, **fmt) -> None:
        self.path = path
        self._reader = csv.reader(io.StringIO(source) if isinstance(source, str) else source, **fmt)

    @property
    def line_num(self) -> int:
        return self._reader.line_num

    def __iter__(self) -> "CsvReader":
        return self

    def __next__(self) -> list[str]:
        try:
            return next(self._reader)
        except csv.Error as exc:
            raise InputError(self.path, f"line {self._reader.line_num}", f"malformed CSV ({exc})") from None


def read_lines(path: object, opener: Callable[[], BinaryIO] | None = None) -> Iterator[str]:
    """A text export's lines (without line ends), decoded one at a time: the file is never held whole.

    The same refusals as :func:`decode_text` (empty, NUL bytes in the first 4 KiB, not UTF-8), the last one
    naming the line. Lines are split on ``\\n`` (a ``\\r`` before it is dropped). ``opener``: how the file
    is opened (a directory's file, never through a symbolic link); else ``path`` is opened as named.
    """
    name = str(path)
    with (open(path, "rb") if opener is None else opener()) as f:
        head = f.read(4096)
        if b"\x00" in head:
            raise InputError(name, "byte " + str(head.index(b"\x00")), "binary data, not a text export")
        f.seek(0)
        blank = True
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(name, f"line {n} byte {exc.start + 1}", "not UTF-8 text") from None
            blank = blank and not line.strip()
            yield line.rstrip("\r\n")
        if blank:
            raise InputError(name, "", "empty file")


def decode_text(data: bytes, path: str) -> str:
    """Bytes -> text, refusing binary files with a one-line error."""
    if not data.strip():
        raise InputError(path, "", "empty file")
    if b"\x00" in data[:4096]:
        raise InputError(path, "byte " + str(data.index(b"\x00")), "binary data, not a text export")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"byte {exc.start}", "not UTF-8 text") from None


# Terminal and shell noise around a saved capture (docs/telemetry.md, "Real input"): skipped and counted, never
# read as data. Each pattern is anchored on what the tool or shell prints, so a data row cannot match one.
_NOISE = (
    ("interrupt", re.compile(r"^\^[CZ\\]$")),
    ("shell_prompt", re.compile(r"^(\$|#|>|%)\s+\S|^\[[^\]\s]+@[^\]]+\][#$]|^[\w.-]+@[\w.-]+:[^\s]*[#$]")),
    ("kubectl_port_forward", re.compile(r"^(Handling connection for \d+|Forwarding from \S+ -> \d+)$")),
    ("kubectl_message", re.compile(r"^(E|W|I)\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+\.go:\d+\]|^error: |^Defaulted container ")),
    ("tool_banner", re.compile(r"^(AMDSMI Tool: |amd-smi |ROCm version|NVIDIA-SMI |dcgmi version|Version\s*:)")),
    ("tool_stopped", re.compile(r"^dmon was stopped due to receiving a signal|^Terminated$|^Killed$")),
    ("elision", re.compile(r"^(\.\.\.|…)$")),
)


def noise_reason(line: str) -> str | None:
    """Why ``line`` (stripped) is terminal noise rather than output of the tool; None when it may be data."""
    for reason, pattern in _NOISE:
        if pattern.search(line):
            return reason
    return None
