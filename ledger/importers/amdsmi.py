"""``amd-smi metric`` and ``amd-smi monitor`` output in its three forms: plain text, ``--json`` and ``--csv``.

Plain ``metric`` is YAML-like (``GPU: N`` blocks, ``SECTION:`` then ``KEY: value unit`` nested by indent) and
wraps long lists and even a value's unit onto continuation lines; plain ``monitor`` is a table whose cells
carry units (``0 %``, ``10 W``, ``45 °C``). Everything is flattened to ``section.key`` paths and mapped by
:data:`METRIC_MAP` / :data:`MONITOR_MAP`; ``metric --csv`` columns by :data:`METRIC_CSV_MAP` (docs/telemetry.md).
Per-XCD GFX clocks (``gfx_0_clk`` .. ``gfx_7_clk``) are averaged; ``metric --ecc-block`` counts are summed per
device. Per-engine lists (VCN, JPEG, per-XCP busy) are not Sample fields. Every key read but not mapped (a list,
a voltage, a key a newer amd-smi adds) is reported unmapped in the import report, never silently dropped.
``--json`` is read as the bare list of GPU records (ROCm 6.x) or in the ``{"gpu_data": [...]}`` envelope newer
amd-smi prints (its ``cpu_data``/``core_data`` records, when not empty, are reported unmapped). Energy
(``energy.total_energy_consumption``, a value/unit object in JSON, ``N J`` in text) is scaled by its unit.
A version banner, the watch banner (``'CTRL' + 'C' to stop watching output:``), prompts and the ``monitor -q``
process table are skipped and counted; CRLF line ends and the CSV header repeated at each watch iteration are
read. Violation/throttle columns map to the NVML clock-event bits (:class:`_Violations`): PPT (power) -> 0x4 SW
power cap, socket thermal (and ``tviol_active``) -> 0x20 SW thermal, PROCHOT -> 0x8 HW slowdown, VR/HBM
thermal -> 0x40 HW thermal, from ``*_violation_status`` ACTIVE / NOT ACTIVE (metric) or PVIOL, TVIOL, ... > 0
(monitor); ``throttle_status`` THROTTLED, which names no reason, is 0x8 unless the row names one.

The output has no timestamps unless a record carries one: ``start``/``interval`` (or the wall-clock anchor
``# ipledger-start TIME node=... interval_ms=...``, or the older ``# ipledger: start=...`` line) place the
ticks; a tick ends when a GPU repeats. Every anchor starts a new capture segment (:class:`dmon.Segments`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from ..base.textsafe import excerpt
from .common import Collected, CsvReader, DeviceInfo, InputError, decode_text, noise_reason, small_index
from .dmon import Segments, epoch_seconds, anchor_meta

PCT = 0.01
METRIC_MAP = {
    "usage.gfx_activity": ("gpu_util", PCT), "usage.umc_activity": ("mem_copy_util", PCT),
    "power.socket_power": ("power_w", 1.0), "power.current_socket_power": ("power_w", 1.0),
    "power.average_socket_power": ("power_w", 1.0),
    "power.current_power": ("power_w", 1.0),   # amd-smi of ROCm 6.0 (`metric -p`: POWER: CURRENT_POWER: 33 W)
    "temperature.hotspot": ("gpu_temp_c", 1.0), "temperature.mem": ("mem_temp_c", 1.0),
    "temperature.memory": ("mem_temp_c", 1.0),
    "clock.gfx.clk": ("sm_clock_mhz", 1.0),
    "clock.mem_0.clk": ("mem_clock_mhz", 1.0), "clock.mem.clk": ("mem_clock_mhz", 1.0),
    "energy.total_energy_consumption": ("energy_j", None),
    "ecc.total_correctable_count": ("ecc_sbe_aggregate", 1.0), "ecc.total_uncorrectable_count": ("ecc_dbe_aggregate", 1.0),
    "ecc.total_correctable": ("ecc_sbe_aggregate", 1.0), "ecc.total_uncorrectable": ("ecc_dbe_aggregate", 1.0),
    "mem_usage.used_vram": ("fb_used_mib", 1.0),
}
MONITOR_MAP = {
    "power": ("power_w", 1.0), "power_usage": ("power_w", 1.0), "gpu_t": ("gpu_temp_c", 1.0),
    "gpu_temp": ("gpu_temp_c", 1.0), "hotspot_temperature": ("gpu_temp_c", 1.0), "mem_t": ("mem_temp_c", 1.0),
    "mem_temp": ("mem_temp_c", 1.0), "memory_temperature": ("mem_temp_c", 1.0), "gfx_clk": ("sm_clock_mhz", 1.0),
    "gfx_clock": ("sm_clock_mhz", 1.0), "gfx%": ("gpu_util", PCT), "gfx_util": ("gpu_util", PCT),
    "mem%": ("mem_copy_util", PCT), "mem_util": ("mem_copy_util", PCT), "mem_clock": ("mem_clock_mhz", 1.0),
    "mem_clk": ("mem_clock_mhz", 1.0), "vram_used": ("fb_used_mib", 1.0), "single_ecc": ("ecc_sbe_aggregate", 1.0),
    "double_ecc": ("ecc_dbe_aggregate", 1.0),
    # amd-smi's own CSV/JSON keys for the monitor columns (amdsmi_cli: gfx, mem, *_bit_ecc)
    "gfx": ("gpu_util", PCT), "mem": ("mem_copy_util", PCT), "single_bit_ecc": ("ecc_sbe_aggregate", 1.0),
    "double_bit_ecc": ("ecc_dbe_aggregate", 1.0), "socket_power": ("power_w", 1.0),
}
VIOLATION_BITS = {"pviol": 0x4, "tviol": 0x20, "phot_tviol": 0x8, "vr_tviol": 0x40, "hbm_tviol": 0x40,
                  "ppt": 0x4, "socket_thermal": 0x20, "prochot": 0x8, "vr_thermal": 0x40, "hbm_thermal": 0x40}
# Violation columns that carry no reason bit (counters, percentages over a window, per-XCP host limits):
# known, so never reported unmapped, but not read.
VIOL_OTHER = re.compile(r"^(accumulation_counter|\w+_violation_(accumulated|activity)|\w+_accumulated|"
                         r"gfx_clk_?\w*viol\w*|gfxclk_\w+|low_util\w*|\w*_below_host_limit\w*)$")
STATUS_ACTIVE, STATUS_INACTIVE = frozenset({"ACTIVE", "TRUE"}), frozenset({"NOT ACTIVE", "FALSE", "INACTIVE"})
THROTTLED = {"THROTTLED": True, "UNTHROTTLED": False}
# throttle_status (MI100/MI200 `metric --power`) says only that the clock is held: HW slowdown, unless a
# violation column of the same row names the reason.
GENERIC_THROTTLE_BIT = 0x8


def is_violation_column(col: str) -> bool:
    k = col.lower().rsplit(".", 1)[-1]
    return (k in VIOLATION_BITS or k in ("tviol_active", "throttle_status") or VIOL_OTHER.match(k) is not None
            or (k.endswith("_violation_status") and k[:-len("_violation_status")] in VIOLATION_BITS))


class _Violations:
    """A row's violation / throttle columns -> one NVML clock-event mask (unknown when none is readable)."""

    def __init__(self, c: Collected, place: str) -> None:
        self.c, self.place = c, place
        self.mask, self.known, self.generic = 0, False, None

    def add(self, col: str, raw: object) -> bool:
        """Fold one column in; False when it is no violation column."""
        k = col.lower().rsplit(".", 1)[-1]
        value, _unit = split_value(raw)
        text = str(value).strip().upper()
        if text in ("N/A", "") or text.startswith("["):
            return is_violation_column(k)
        if k in VIOLATION_BITS:                         # monitor: percent of the time in violation
            try:
                self._set(VIOLATION_BITS[k], float(value) > 0)
            except ValueError:   # unreadable: this bit is unknown, and the report says so
                self.c.warn(f"{self.c.path}: {self.place} column {col}: not a number: {raw!r}: violation status unknown")
            return True
        bit = 0x20 if k == "tviol_active" else None
        if k.endswith("_violation_status") and k[:-len("_violation_status")] in VIOLATION_BITS:
            bit = VIOLATION_BITS[k[:-len("_violation_status")]]
        if bit is not None:
            if text in STATUS_ACTIVE or text in STATUS_INACTIVE:
                self._set(bit, text in STATUS_ACTIVE)
            else:
                self.c.warn(f"{self.c.path}: {self.place} column {col}: {str(raw)[:40]!r}: violation status unknown")
            return True
        if k == "throttle_status":
            if text in THROTTLED:
                self.generic = GENERIC_THROTTLE_BIT if THROTTLED[text] else 0
            return True
        return VIOL_OTHER.match(k) is not None

    def _set(self, bit: int, active: bool) -> None:
        self.known = True
        if active:
            self.mask |= bit

    def store(self, dev: str, t: float) -> None:
        mask = self.mask if self.known else self.generic
        if mask is not None:
            self.c.add(dev, "clock_reasons", t, float(mask), place=self.place)


ENERGY_UNITS = {"j": 1.0, "mj": 1e-3, "uj": 1e-6, "µj": 1e-6, "kj": 1e3}
_CELL = re.compile(r"N/A(?:\s?Mb/s)?|True|False|-?\d+(?:\.\d+)?(?:\s?(?:%|W|°C|C|MHz|GHz|MB|GB|J|mJ|uJ|mV|Mb/s))?|[A-Z][A-Z_]+")
# `amd-smi metric --csv` flattens the metric sections into bare column names (ROCm 6.2-6.4 and 7.x): usage,
# power, per-XCD clocks, temperatures by sensor. "mem" is the memory temperature there, but memory utilisation
# in `amd-smi monitor --csv`, so the metric CSV has its own map (chosen by its columns).
METRIC_CSV_MAP = {
    "gfx_activity": ("gpu_util", PCT), "umc_activity": ("mem_copy_util", PCT), "socket_power": ("power_w", 1.0),
    "current_socket_power": ("power_w", 1.0), "average_socket_power": ("power_w", 1.0),
    "mem_0_clk": ("mem_clock_mhz", 1.0), "hotspot": ("gpu_temp_c", 1.0), "mem": ("mem_temp_c", 1.0),
    "used_vram": ("fb_used_mib", 1.0), "total_correctable_count": ("ecc_sbe_aggregate", 1.0),
    "total_uncorrectable_count": ("ecc_dbe_aggregate", 1.0),
    # `amd-smi metric -E --csv`: the energy accumulator already converted by amd-smi to joules (no unit in the cell)
    "total_energy_consumption": ("energy_j", 1.0),
}
GFX_CLK = re.compile(r"^(?:clock\.)?gfx_(\d+)[._]clk$")
_NUM_UNIT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(\S+)?\s*$")


def split_value(v) -> tuple[object, str | None]:  # noqa: ANN001
    """'10 W' -> ('10', 'W'); {'value': 10, 'unit': 'W'} -> (10, 'W'); 'N/A' -> ('N/A', None)."""
    if isinstance(v, dict) and "value" in v:
        return v["value"], v.get("unit")
    if isinstance(v, (int, float)):
        return v, None
    s = str(v).strip()
    m = _NUM_UNIT.match(s)
    if m:
        return m.group(1), m.group(2)
    return s, None


class Ticker:
    """The sample times of one capture segment's rows: a tick ends when a GPU repeats (``tick``, the GPUs
    ``seen`` in it), each tick ``interval`` after ``start`` unless a row carries its own time."""

    def __init__(self, c: Collected, start: float | None, interval: float | None, node: str) -> None:
        self.c, self.start, self.interval, self.node = c, start, interval, node
        self.tick, self.seen = -1, set()

    def time_for(self, gpu: str, place: str, explicit: float | None = None) -> float:
        if gpu in self.seen or self.tick < 0:
            self.tick, self.seen = self.tick + 1, set()
        self.seen.add(gpu)
        if explicit is not None:
            return explicit
        if self.start is None or self.interval is None:
            raise InputError(self.c.path, "", "amd-smi output has no timestamps: give --start and --interval "
                                              "(or a '# ipledger-start TIME interval_ms=...' line)")
        return self.start + self.tick * self.interval

    def device(self, gpu: str) -> str:
        idx = small_index(str(gpu))
        return self.c.device(DeviceInfo(device=f"{self.node}/gpu{gpu}", node=self.node, index=idx, vendor="amd"))


def _add_flat(c: Collected, dev: str, t: float, flat: dict[str, object], place: str) -> None:
    viol = _Violations(c, place)
    clocks = [(k, v) for k, v in flat.items() if GFX_CLK.match(k.lower())]
    if clocks:
        _add_gfx_clocks(c, dev, t, clocks, place)
    ecc = _ecc_blocks(flat)
    if ecc:
        for name, total in ecc.items():
            c.add(dev, name, t, total, place=f"{place} ecc blocks")
    have_hotspot = any(k.lower() == "temperature.hotspot" for k in flat)
    for key, raw in flat.items():
        k = key.lower()
        if k == "temperature.edge" and not have_hotspot:
            k = "temperature.hotspot"
        spec = METRIC_MAP.get(k)
        if spec is not None:
            value, unit = split_value(raw)
            scale = spec[1]
            if scale is None:   # energy: the unit decides
                scale = ENERGY_UNITS.get((unit or "j").lower())
                if scale is None:
                    c.note_unmapped(f"{key} [{unit}]")
                    c.warn(f"{c.path}: {place} {key}: unit {unit!r} is no energy unit (J, mJ, uJ, kJ): not read")
                    continue
            c.add_raw(dev, spec[0], t, value, scale, place=f"{place} {key}")
            c.note_mapped(key, spec[0])
            continue
        if k.startswith(("throttle.", "power.throttle_status", "violation.")) and viol.add(k, raw):
            continue
        if GFX_CLK.match(k) or _ECC_BLOCK.match(k):
            continue
        c.note_unmapped(key)   # known to amd-smi but not a Sample field, or new: reported, never silently dropped
    viol.store(dev, t)


_ECC_BLOCK = re.compile(r"^ecc_blocks?\.[^.]+\.(correctable|uncorrectable)(?:_count)?$")


def _ecc_blocks(flat: dict[str, object]) -> dict[str, float]:
    """``amd-smi metric --ecc-block``: per-block (UMC, SDMA, GFX, ...) counts, summed into the device totals the
    drift agent reads, unless the output also carries the totals (``ecc.total_*``)."""
    if any(k.lower().startswith("ecc.total_") for k in flat):
        return {}
    sums: dict[str, float] = {}
    for key, raw in flat.items():
        m = _ECC_BLOCK.match(key.lower())
        if m is None:
            continue
        value, _unit = split_value(raw)
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        name = "ecc_sbe_aggregate" if m.group(1) == "correctable" else "ecc_dbe_aggregate"
        sums[name] = sums.get(name, 0.0) + v
    return sums


def _flatten(obj, prefix: str = "") -> dict[str, object]:  # noqa: ANN001
    out: dict[str, object] = {}
    if isinstance(obj, dict) and not ("value" in obj and "unit" in obj):
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = obj
    return out


def parse_json(text: str, path: str, ticker: Ticker) -> None:
    c = ticker.c
    dec, pos, docs = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            doc, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"line {exc.lineno} column {exc.colno}", f"invalid JSON ({exc.msg})") from None
        except (RecursionError, ValueError) as exc:  # too deep, or int()'s digit limit on a huge number
            why = "JSON nested too deeply" if isinstance(exc, RecursionError) else f"invalid JSON ({exc})"
            raise InputError(path, f"line {text.count(chr(10), 0, pos) + 1}", why) from None
        docs.append(doc)
    records = []
    for d in docs:
        records.extend(d if isinstance(d, list) else [d])
    for i, rec in enumerate(records):
        if isinstance(rec, list):  # watch mode may nest one list per iteration
            records.extend(rec)
            continue
        if isinstance(rec, dict) and "gpu" not in rec and isinstance(rec.get("gpu_data"), list):
            # newer amd-smi: {"cpu_data": [...], "core_data": [...], "gpu_data": [...]} (amdsmi_logger
            # combine_arrays_to_json); older: the bare list of GPU records. CPU/core records are no GPU telemetry.
            records.extend(rec["gpu_data"])
            for k, v in rec.items():
                if k != "gpu_data" and v not in ([], None, {}):
                    c.note_unmapped(k)
            continue
        if not isinstance(rec, dict) or "gpu" not in rec:
            raise InputError(path, f"record {i}", "expected an object with a \"gpu\" key")
        gpu = str(rec["gpu"])
        explicit = rec.get("timestamp")
        t = ticker.time_for(gpu, f"record {i}", float(explicit) if isinstance(explicit, (int, float)) else None)
        flat = _flatten({k: v for k, v in rec.items() if k not in ("gpu", "timestamp")})
        _add_flat(c, ticker.device(gpu), t, flat, f"record {i}")


def parse_plain_metric(lines: list[tuple[int, str]], path: str, ticker: Ticker) -> None:
    """YAML-like blocks; continuation lines (wrapped lists, a unit alone) are glued to the previous value."""
    c = ticker.c
    logical: list[tuple[int, int, str]] = []      # (line no, indent, text)
    for n, raw in lines:
        indent = len(raw) - len(raw.lstrip(" "))
        s = raw.strip()
        is_key = re.match(r"^[A-Za-z0-9_ %()/-]+:(\s|$)", s) is not None
        if logical and not is_key:
            ln, ind, prev = logical[-1]
            logical[-1] = (ln, ind, prev + " " + s)
        else:
            logical.append((n, indent, s))
    gpu, t, stack, flat, place = None, 0.0, [], {}, ""

    def flush() -> None:
        if gpu is not None:
            _add_flat(c, ticker.device(gpu), t, flat, place)

    for n, indent, s in logical:
        key, _, val = s.partition(":")
        key, val = key.strip(), val.strip()
        if key == "GPU" and indent == 0:
            flush()
            gpu, flat, stack, place = val, {}, [], f"line {n}"
            t = ticker.time_for(gpu, place)
            continue
        if gpu is None:
            raise InputError(path, f"line {n}", "value before any 'GPU: N' line")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if val == "":
            stack.append((indent, key))
            continue
        if val.startswith("["):
            c.note_unmapped(".".join([k for _, k in stack] + [key]))   # per-engine lists are not Sample fields
            continue
        flat[".".join([k for _, k in stack] + [key])] = val
    flush()


def parse_table(lines: list[tuple[int, str]], path: str, ticker: Ticker) -> None:
    """``amd-smi monitor`` tables. The process table ``monitor -q`` appends under ``PROCESS INFO:`` gives each GPU
    of the rows above it its count of processes (``compute_procs``, 0 for a GPU with no row); anything else that
    is not a row is skipped and counted."""
    c = ticker.c
    header: list[str] | None = None
    procs: dict[str, int] | None = None
    tick: dict[str, tuple[str, float]] = {}      # GPU -> (place, time) of its metric row since the last table
    rows = 0

    def flush() -> None:
        if procs is not None:
            for gpu, (place, t) in tick.items():
                c.add(ticker.device(gpu), "compute_procs", t, float(procs.get(gpu, 0)), place=place)
            tick.clear()

    for n, raw in lines:
        s = raw.strip()
        toks = s.split()
        if toks[0] == "GPU" and toks[1:2] != [":"]:
            cols = [h.lower() for h in toks[1:]]
            if "pid" in cols:         # monitor -q: the process table that follows the metrics
                procs = {}
                c.note_mapped("process table", "compute_procs")
            else:
                flush()
                header, procs = cols, None
                for col in header:
                    if col in MONITOR_MAP:
                        c.note_mapped(col, MONITOR_MAP[col][0])
                    elif not is_violation_column(col):
                        c.note_unmapped(col)
            continue
        if procs is not None and toks[0].isdecimal() and len(toks) > 2 and toks[2].isdecimal():
            procs[toks[0]] = procs.get(toks[0], 0) + 1      # GPU, NAME, PID, ...
            c.skip(f"line {n}", "process_table", s)
            continue
        first, _, rest = s.partition(" ")
        cells = _CELL.findall(rest)
        if header is None or not first.isdecimal() or len(cells) != len(header):
            c.skip(f"line {n}", "not_a_table_row", s)
            continue
        flush()
        procs = None
        tick[first] = (f"line {n}", _add_row(c, ticker, first, dict(zip(header, cells)), f"line {n}"))
        rows += 1
    flush()
    if rows == 0:
        raise InputError(path, f"line {lines[0][0]}", "expected an amd-smi monitor table (a 'GPU ...' header, then one "
                                                     "row per GPU)")


def _add_row(c: Collected, ticker: Ticker, gpu: str, row: dict[str, str], place: str,
             explicit: float | None = None, names: dict = MONITOR_MAP) -> float:
    """One GPU's row; returns its sample time."""
    t = ticker.time_for(gpu, place, explicit)
    dev = ticker.device(gpu)
    viol = _Violations(c, place)
    clocks = [(col, cell) for col, cell in row.items() if GFX_CLK.match(col)]
    if clocks:
        _add_gfx_clocks(c, dev, t, clocks, place)
    for col, cell in row.items():
        spec = names.get(col)
        value, _unit = split_value(cell)
        if spec is not None:
            c.add_raw(dev, spec[0], t, value, spec[1], place=f"{place} column {col}")
        else:
            viol.add(col, cell)
    viol.store(dev, t)
    return t


def _add_gfx_clocks(c: Collected, dev: str, t: float, clocks: list[tuple[str, object]], place: str) -> None:
    """MI300-class parts report one GFX clock per XCD (gfx_0_clk .. gfx_7_clk): the SM-clock equivalent is
    their mean over the readable ones; none readable is missing."""
    got = []
    for col, cell in clocks:
        value, _unit = split_value(cell)
        try:
            got.append(float(value))
        except (TypeError, ValueError):
            continue
        c.note_mapped(col, "sm_clock_mhz")
    if got:
        c.add_raw(dev, "sm_clock_mhz", t, sum(got) / len(got), place=f"{place} gfx clocks")
    else:
        c.add(dev, "sm_clock_mhz", t, None, "not_available", place=place)


def parse_csv(text: str, path: str, ticker: Ticker) -> None:
    reader = CsvReader(text, path)
    header = [h.strip().lower() for h in next(reader)]
    if "gpu" not in header:
        raise InputError(path, "line 1", f"wrong columns: no 'gpu' column in {excerpt(','.join(header), 80)}")
    metric = bool({"gfx_activity", "hotspot", "edge", "socket_power", "total_energy_consumption"} & set(header)) or \
        any(GFX_CLK.match(h) for h in header)
    names = METRIC_CSV_MAP if metric else MONITOR_MAP
    for h in header:
        if h in names:
            ticker.c.note_mapped(h, names[h][0])
        elif h not in ("gpu", "timestamp") and not GFX_CLK.match(h) and not is_violation_column(h):
            ticker.c.note_unmapped(h)
    for row in reader:
        if not row:
            continue
        if [x.strip().lower() for x in row] == header:
            continue
        if len(row) != len(header):
            raise InputError(path, f"line {reader.line_num}", f"{len(row)} columns, header has {len(header)}")
        rec = dict(zip(header, (x.strip() for x in row)))
        gpu = rec.pop("gpu")
        ts = rec.pop("timestamp", None)
        explicit = None
        if ts:
            try:
                explicit = epoch_seconds(ts)
            except ValueError:
                raise InputError(path, f"line {reader.line_num} column timestamp", f"not a time: '{excerpt(ts)}'") from None
        _add_row(ticker.c, ticker, gpu, rec, f"line {reader.line_num}", explicit, names)


WATCH_BANNER = re.compile(r"^'CTRL' \+ 'C' to stop watching output:?$")


def skip_reason(s: str) -> str | None:
    """Why a (stripped) line that is no data row and no anchor is skipped: amd-smi's watch banner, or terminal
    noise (:func:`common.noise_reason`); None for a line that is output to parse."""
    return "tool_banner" if WATCH_BANNER.match(s) else noise_reason(s)


def anchor_or_skip(seg: Segments, c: Collected, s: str, place: str, memo: dict[str, str | None],
                   before_start: Callable[[], None]) -> bool:
    """A (stripped) line that is no data row: an anchor applied to the segments (``before_start`` called first
    where it starts a new one) or a banner or noise line skipped and counted (``memo``: each distinct line's
    reason, looked up once): True; False for a line that is output to parse."""
    meta = anchor_meta(s) if s.startswith("#") else None
    if meta is not None:
        if "start" in meta:
            before_start()
        seg.anchor(meta, place)
        if c.cadence is None:
            c.cadence = seg.interval
        return True
    why = memo[s] if s in memo else memo.setdefault(s, skip_reason(s))
    if why is not None:
        c.skip(place, why, s)
        return True
    return False


def parse(text: str, path: str = "<input>", *, start: float | None = None, interval: float | None = None,
          node: str | None = None, node_hint: str | None = None,
          csv: Callable[[str, str, "Ticker"], None] | None = None) -> Collected:
    """``node_hint``: the node the file name names, used when neither ``node`` nor an anchor line names one.
    Every wall-clock anchor (``# ipledger-start TIME ...``, or ``# ipledger: start=...``) starts a new capture
    segment: the lines after it are parsed as their own output, ticks counted from that time. ``csv``: the
    reader of a CSV segment (default :func:`parse_csv`; :func:`columnar.parse_amdsmi` passes its own)."""
    seg = Segments(path, start, interval, node, node_hint)
    c = Collected("amd_smi", path=path, cadence=interval)
    chunk: list[tuple[int, str]] = []
    parsed = 0
    noise: dict[str, str | None] = {}

    def flush() -> None:
        nonlocal parsed
        if chunk:
            seg.ticks = _parse_chunk(c, chunk, path, seg, csv or parse_csv)
            parsed += 1
            chunk.clear()

    for n, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s:
            continue
        if s[0].isdigit() and "@" not in s:   # a data row: no anchor, banner or noise pattern starts so
            chunk.append((n, raw.rstrip()))
            continue
        if anchor_or_skip(seg, c, s, f"line {n}", noise, flush):
            continue
        chunk.append((n, raw.rstrip()))
    flush()
    if not parsed:
        raise InputError(path, "", "no amd-smi output")
    seg.finish(c)
    return c


def _parse_chunk(c: Collected, lines: list[tuple[int, str]], path: str, seg: Segments,
                 csv: Callable[[str, str, "Ticker"], None]) -> int:
    """One capture segment's output (metric/monitor, plain, JSON or CSV); returns its number of ticks."""
    ticker = Ticker(c, seg.start, seg.interval, seg.node)
    first = lines[0][1].strip()
    if first.startswith(("[", "{")):
        parse_json("\n".join(s for _, s in lines), path, ticker)
    elif first.startswith("GPU:"):
        parse_plain_metric(lines, path, ticker)
    elif "," in first and "gpu" in [h.strip().lower() for h in first.split(",")]:
        csv("\n".join(s for _, s in lines), path, ticker)
    elif first.split()[0] == "GPU":
        parse_table(lines, path, ticker)
    else:
        raise InputError(path, f"line {lines[0][0]}", f"not amd-smi metric/monitor output: '{excerpt(first)}'")
    return ticker.tick + 1


def read(path: str | Path, **kw) -> Collected:
    """The reference reading of a capture file (what is read for import and analysis is
    :func:`columnar.read_amdsmi`, held equal to :func:`parse`)."""
    p = Path(path)
    return parse(decode_text(p.read_bytes(), str(p)), str(p), **kw)
