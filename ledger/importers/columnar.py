"""THE speed trick of the capture importers: ``dcgmi dmon`` and ``amd-smi --csv`` captures parsed column-wise.

The plain parsers (:func:`ledger.importers.dmon.parse`, :func:`ledger.importers.amdsmi.parse`) clean and store
every reading on its own (``Collected.add_raw``: ~10 µs a value, most of an ``analyze`` of a 24-hour set). The
readers here walk the same lines with the same state (capture segments, ticks, headers, noise) but keep each
row's cells as text and hand a block of rows to pyarrow as one buffer (dmon: its runs of spaces collapsed by
numpy first), so the cells are split and converted in C: strict numbers cast to float64 (the cast and Python's
``float`` both round correctly), the text markers (``N/A``, ``N/W`` ...) found by exact spelling and given
:func:`timeline.clean`'s reasons, amd-smi's violation statuses mapped through their few distinct values, its
per-XCD GFX clocks averaged in column order; sentinels, units and ranges are applied by
:meth:`Collected.add_raw_many`. The result is the plain parser's collection, field for field
(tests/test_columnar.py holds them equal with hypothesis on generated captures: banners, CRLF, repeated and
changing headers, blanks, ``N/A``, sentinels, unreadable cells, restarts). What they do not read so is read by
slower code that gives the same: a dmon capture with a row of the wrong width, a cell that is neither a number
nor a marker spelling, a tab or any error is parsed by the plain :func:`dmon.parse` itself (as is a file
over :data:`ARROW_MAX_BYTES`, streamed); an amd-smi column pyarrow does not take is read from its cells as
Python strings (:func:`column_values`), and a CSV segment with quotes, two columns of one field or a cell that
would warn goes to the plain :func:`amdsmi.parse_csv`. Rows are held as text for at most :data:`FLUSH_ROWS`
rows of a dmon block before they are stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from ..telemetry.timeline import TEXT_REASONS
from ..base.textsafe import excerpt
from .common import EARLIEST_TS, Collected, DeviceInfo, InputError, noise_reason, read_lines, small_index, time_problem

FLUSH_ROWS = 32768              # rows held as text before a block is parsed and stored
_PRINTABLE_ASCII = bytes(range(32, 127)) + b"\n"
_NAN = float("nan")


# The text markers as tools print them (N/A, N/W, [Not Supported] ...): each spelling whose cleaned form is one
# of timeline.clean's markers. Found by exact comparison, a column at a time; any other spelling goes the slow way.
_MARKER_SPELLINGS = tuple(sorted({v for k in TEXT_REASONS if k for v in (k, k.upper(), k.title(), k.capitalize())}))


def column_values(cells: list[str] | tuple[str, ...]) -> tuple[np.ndarray, dict[int, str]] | None:
    """A column of cells as floats (``float`` on each, as :func:`timeline.clean`), the text markers as NaN with
    their reasons by position; None when a cell is neither (the plain path then explains it)."""
    try:
        return np.array(cells, dtype=np.float64), {}
    except (ValueError, TypeError):
        pass
    distinct = set(cells)
    present = [m for m in _MARKER_SPELLINGS if m in distinct]
    text: dict[int, str] = {}
    if present:
        obj = np.array(cells, dtype=object)
        for m in present:
            at = np.flatnonzero(obj == m)
            obj[at] = "nan"
            reason = TEXT_REASONS[m.strip().lower()]
            text.update(dict.fromkeys(at.tolist(), reason))
        try:
            return obj.astype(np.float64), text
        except (ValueError, TypeError):
            text = {}
    v = np.empty(len(cells), dtype=np.float64)
    for i, x in enumerate(cells):
        r = TEXT_REASONS.get(x.strip().lower())
        if r is not None:
            v[i] = _NAN
            text[i] = r
            continue
        try:
            v[i] = float(x)
        except ValueError:
            return None
    return v, text


def _text_reasons(c: Collected, dev: str, name: str, ts: np.ndarray, rows: list[int], text: dict[int, str]) -> None:
    """The reasons of the text markers among one device's rows (``rows``: their positions in the column)."""
    got = [(float(ts[j]), r) for j, i in enumerate(rows) if (r := text.get(i)) is not None]
    if got:
        rs = c.reasons.setdefault(dev, {})
        for t, r in got:
            rs[(t, name)] = r


# --- dcgmi dmon --------------------------------------------------------------------------------------------------

def parse_dmon(text: str | Iterable[str], path: str = "<input>", *, start: float | None = None,
               interval: float | None = None, node: str | None = None, node_hint: str | None = None) -> Collected:
    """:func:`ledger.importers.dmon.parse`, column-wise (the same arguments, collection and errors): a text (or
    a list of its lines) is read by :func:`_dmon_arrow`, its row blocks parsed by pyarrow; what that does not
    read as the plain parser would (a row of the wrong width, a cell that is neither a number nor a marker, a
    tab, any error), and a stream of lines, is read by the plain parser itself."""
    from .dmon import parse

    kw = {"start": start, "interval": interval, "node": node, "node_hint": node_hint}
    if isinstance(text, (str, list)):
        lines = text.splitlines() if isinstance(text, str) else text
        try:
            return _dmon_arrow(lines, path, **kw)
        except _Irregular:
            text = lines
    return parse(text, path, **kw)


class _Irregular(Exception):
    """A capture the arrow reading does not take: read it again row by row."""


ARROW_MAX_BYTES = 256 << 20    # a larger file is streamed line by line by the plain parser (never held whole)


def read_dmon(path: str | Path, **kw) -> Collected:
    p = Path(path)
    lines = read_lines(p)
    if p.stat().st_size <= ARROW_MAX_BYTES:
        lines = list(lines)      # read_lines' own refusals (binary, not UTF-8, empty) as they come
    return parse_dmon(lines, str(p), **kw)


_ARROW_MARKERS: list = []


def _markers():  # noqa: ANN202
    """:data:`_MARKER_SPELLINGS` as a pyarrow array (made once), built from its buffers: ``pa.array`` of a
    Python sequence imports pandas (pyarrow looks for pandas objects), a quarter of a second in each parsing
    worker that never needs it."""
    if not _ARROW_MARKERS:
        import pyarrow as pa

        words = [m.encode() for m in _MARKER_SPELLINGS]
        offsets = np.cumsum([0] + [len(w) for w in words], dtype=np.int32)
        _ARROW_MARKERS.append(pa.StringArray.from_buffers(len(words), pa.py_buffer(offsets.tobytes()),
                                                          pa.py_buffer(b"".join(words))))
    return _ARROW_MARKERS[0]


def numbers(col, dtype: type) -> np.ndarray:  # noqa: ANN001 - a pyarrow Array or ChunkedArray
    """A pyarrow numeric column without nulls (of ``dtype``'s width) as a numpy array, read from its buffers:
    pyarrow's own ``to_numpy`` imports pandas, a quarter of a second in each parsing worker that never needs
    it. tests/test_columnar.py holds it to ``to_numpy``."""
    if col.null_count:
        raise ValueError("a column with nulls")
    width = np.dtype(dtype).itemsize
    parts = [np.frombuffer(ch.buffers()[1], dtype=dtype, count=len(ch), offset=ch.offset * width)
             for ch in (col.chunks if hasattr(col, "chunks") else [col])]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _arrow_values(col, n: int):  # noqa: ANN001, ANN202
    """A pyarrow string column as floats and the markers' reasons by position, as :func:`column_values`
    would give them; None when a cell is neither a number pyarrow reads nor a marker spelling."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = pc.index_in(col, value_set=_markers())
    text: dict[int, str] = {}
    if at.null_count < n:
        hit = numbers(pc.fill_null(at, -1), np.int32)
        where = np.flatnonzero(hit >= 0)
        for i, k in zip(where.tolist(), hit[where].astype(np.int64).tolist()):
            text[i] = TEXT_REASONS[_MARKER_SPELLINGS[k].strip().lower()]
        col = pc.if_else(pc.is_null(at), col, pa.scalar("nan"))
    try:
        v = pc.cast(col, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if v.null_count:
        return None
    return numbers(v, np.float64), text


def _dmon_arrow(lines: list[str], path: str, *, start: float | None, interval: float | None, node: str | None,
                node_hint: str | None) -> Collected:
    """The common capture (rows the header's width, numbers and markers), its row blocks parsed by pyarrow;
    :class:`_Irregular` for anything else."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from .dcgm_fields import BY_DMON
    from .dmon import ENTITY_TYPES, DMON_NUMBER, Segments, mark_mig_parent

    try:
        seg = Segments(path, start, interval, node, node_hint)
    except InputError:
        raise _Irregular() from None
    c = Collected("dcgmi_dmon", path=path, cadence=interval)
    columns: list[str] | None = None
    specs: list = []
    devs: list[str] = []
    times: list[float] = []
    rests: list[str] = []
    devices: dict[tuple[str, str, str], str] = {}
    entity_types = frozenset(ENTITY_TYPES)
    latest = c.latest
    rows = 0

    def flush() -> None:
        if not rests:
            return
        width = len(columns)
        body = "\n".join(rests).encode()
        # one space between cells: the runs of spaces collapsed in C; any other white space, or a control
        # character, and the rows are read by str.split instead
        if body.translate(None, _PRINTABLE_ASCII) or b"(" in body:   # "nan(1)": float() refuses, strtod not
            raise _Irregular()
        b = np.frombuffer(body, dtype=np.uint8)
        sp = b == 32
        keep = ~(sp & np.concatenate(([False], sp[:-1])))
        body = b[keep].tobytes()
        try:
            table = pacsv.read_csv(io.BytesIO(body), read_options=pacsv.ReadOptions(
                column_names=[f"c{k}" for k in range(width)], use_threads=False),
                parse_options=pacsv.ParseOptions(delimiter=" ", quote_char=False, double_quote=False,
                                                 escape_char=False, ignore_empty_lines=False),
                convert_options=pacsv.ConvertOptions(column_types={f"c{k}": pa.string() for k in range(width)},
                                                     strings_can_be_null=False, null_values=[]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise _Irregular() from None
        n = len(rests)
        if table.num_rows != n:
            raise _Irregular()
        conv = {}
        for k, spec in enumerate(specs):
            if spec is not None:
                got = _arrow_values(table.column(k), n)
                if got is None:
                    raise _Irregular()
                conv[k] = got
        ts_all = np.array(times, dtype=np.float64)
        order = list(dict.fromkeys(devs))
        single = len(order) == 1
        if not single:
            code = {d: k for k, d in enumerate(order)}
            codes = np.fromiter(map(code.__getitem__, devs), dtype=np.int64, count=n)
        for j, dev in enumerate(order):
            idx = None if single else np.flatnonzero(codes == j)
            idx_list = range(n) if single else idx.tolist()
            ts = ts_all if single else ts_all[idx]
            for k, spec in enumerate(specs):
                if spec is None:
                    continue
                v, text = conv[k]
                c.add_raw_many(dev, spec.target, ts, v if single else v[idx], spec.scale)
                if text:
                    _text_reasons(c, dev, spec.target, ts, idx_list, text)
        devs.clear()
        times.clear()
        rests.clear()

    try:
        for n, raw in enumerate(lines, start=1):
            s = raw.strip()
            if not s:
                continue
            if s[0] == "#" and s.startswith("# ipledger"):
                seg.ipledger_line(s, f"line {n}", c)
                continue
            parts = s.split(None, 2)
            t0 = parts[0]
            if t0 in entity_types and len(parts) == 3 and columns is not None:
                if seg.start is None or seg.interval is None:
                    raise _Irregular()
                ident = parts[1]
                entity = f"{t0} {ident}"
                if entity in seg.seen or seg.tick < 0:
                    seg.tick, seg.seen = seg.tick + 1, set()
                    seg.ticks = seg.tick + 1
                seg.seen.add(entity)
                t = seg.start + seg.tick * seg.interval
                if not EARLIEST_TS <= t <= latest:
                    raise _Irregular()
                dkey = (seg.node, t0, ident)
                dev = devices.get(dkey)
                if dev is None:
                    key = f"{seg.node}/gpu{ident}" if t0 == "GPU" else f"{seg.node}/{t0.lower()}{ident}"
                    index = small_index(ident) if t0 == "GPU" else None
                    dev = devices[dkey] = c.device(DeviceInfo(device=key, node=seg.node, index=index,
                                                              mig_instance=ident if t0 == "GPU-I" else None))
                devs.append(dev)
                times.append(t)
                rests.append(parts[2])
                rows += 1
                if len(rests) >= FLUSH_ROWS:
                    flush()
                continue
            toks = s.split()
            if toks[0] == "#Entity" or toks[:2] == ["#", "Entity"]:
                new = toks[1:] if toks[0] == "#Entity" else toks[2:]
                if columns is None:
                    for col in new:
                        spec = BY_DMON.get(col)
                        if spec is None:
                            c.note_unmapped(col)
                        else:
                            c.note_mapped(col, spec.target)
                if new != columns:
                    flush()
                    columns, specs = new, [BY_DMON.get(col) for col in new]
                if not columns:
                    raise _Irregular()
                continue
            if toks[0].upper() == "ID" and not any(DMON_NUMBER.fullmatch(x) for x in toks[1:]):
                continue
            if toks[0] in entity_types and columns is None:
                if len(toks) >= 2:
                    c.skip(f"line {n}", "row_before_header", s)
                    continue
            if toks[0] in entity_types and len(toks) >= 2 and (columns is None or len(toks) - 2 == len(columns)):
                raise _Irregular()     # a row this reading did not take above
            noise = noise_reason(s)
            if noise is not None or s.startswith("Error") or "dcgmi dmon" in s:
                c.skip(f"line {n}", noise or "tool_message", s)
                continue
            raise _Irregular()         # not a row and not known noise: the exact reading names it
        flush()
    except InputError:
        raise _Irregular() from None
    if columns is None or rows == 0:
        raise _Irregular()
    mark_mig_parent(c)
    seg.finish(c)
    return c


# --- amd-smi --csv -------------------------------------------------------------------------------------------------

_PLAIN_NUMBER_RISK = ("e", "E", "_")   # cells float() reads otherwise than amd-smi's 'value unit' split ("1e5")


def _split_same(cells: list[str] | tuple[str, ...]) -> bool:
    """Whether amd-smi's value/unit split (:func:`amdsmi.split_value`) leaves every float-readable cell whole."""
    from .amdsmi import split_value

    joined = "\x00".join(cells)
    if not any(ch in joined for ch in _PLAIN_NUMBER_RISK):
        return True
    for x in cells:
        if ("e" in x or "E" in x or "_" in x) and TEXT_REASONS.get(x.strip().lower()) is None and \
                split_value(x)[0] != x.strip():
            return False
    return True


def _violation_outcome(col: str, cell: str) -> tuple[str, object]:
    """What :meth:`amdsmi._Violations.add` does with one cell: ('skip'|'set'|'generic'|'none'|'warn', value)."""
    from .amdsmi import (STATUS_ACTIVE, STATUS_INACTIVE, THROTTLED, GENERIC_THROTTLE_BIT, VIOLATION_BITS,
                         split_value)

    k = col.lower().rsplit(".", 1)[-1]
    value, _unit = split_value(cell)
    text = str(value).strip().upper()
    if text in ("N/A", "") or text.startswith("["):
        return "skip", None
    if k in VIOLATION_BITS:
        try:
            return "set", float(value) > 0
        except ValueError:
            return "warn", None
    bit = 0x20 if k == "tviol_active" else None
    if k.endswith("_violation_status") and k[:-len("_violation_status")] in VIOLATION_BITS:
        bit = VIOLATION_BITS[k[:-len("_violation_status")]]
    if bit is not None:
        if text in STATUS_ACTIVE or text in STATUS_INACTIVE:
            return "set", text in STATUS_ACTIVE
        return "warn", None
    if k == "throttle_status":
        if text in THROTTLED:
            return "generic", GENERIC_THROTTLE_BIT if THROTTLED[text] else 0
        return "skip", None
    return "none", None


def _violation_kind(col: str) -> int | None:
    """The NVML bit a violation column sets, -1 for throttle_status, None for a column that sets nothing."""
    from .amdsmi import VIOLATION_BITS

    k = col.lower().rsplit(".", 1)[-1]
    if k in VIOLATION_BITS:
        return VIOLATION_BITS[k]
    if k == "tviol_active":
        return 0x20
    if k.endswith("_violation_status") and k[:-len("_violation_status")] in VIOLATION_BITS:
        return VIOLATION_BITS[k[:-len("_violation_status")]]
    if k == "throttle_status":
        return -1
    return None


class _Cells:
    """The kept rows of an amd-smi CSV segment, by column: pyarrow string arrays where pyarrow parses the rows
    (in C, no Python string per cell), Python lists (the rows split at their commas) where asked for."""

    def __init__(self, rows: list[str], header: list[str]) -> None:
        import io

        import pyarrow as pa
        import pyarrow.csv as pacsv

        self.header, self.width, self.n = header, len(header), len(rows)
        self._rows = rows
        self._flat: list[str] | None = None
        self.table = None
        if rows:
            try:
                t = pacsv.read_csv(io.BytesIO("\n".join(rows).encode()), read_options=pacsv.ReadOptions(
                    column_names=[f"c{k}" for k in range(self.width)], use_threads=False),
                    parse_options=pacsv.ParseOptions(delimiter=",", quote_char=False, double_quote=False,
                                                     escape_char=False, ignore_empty_lines=False),
                    convert_options=pacsv.ConvertOptions(
                        column_types={f"c{k}": pa.string() for k in range(self.width)},
                        strings_can_be_null=False, null_values=[]))
                self.table = t if t.num_rows == self.n else None
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                self.table = None

    def arrow(self, k: int):  # noqa: ANN201
        return None if self.table is None else self.table.column(k).combine_chunks()

    def list(self, k: int) -> list[str]:
        """Column ``k`` as the row split gives it (gpu and timestamp stripped, as the plain reader has them)."""
        if self.table is not None:      # pyarrow's cells are the split's (no quote, the header's width)
            col = self.table.column(k).to_pylist()
        else:
            if self._flat is None:
                self._flat = ",".join(self._rows).split(",") if self._rows else []
            col = self._flat[k::self.width]
        if self.header[k] in ("gpu", "timestamp") and any(ch.isspace() for ch in set("".join(col))):
            col = [x.strip() for x in col]   # the others are read as the plain code reads them, stripped or not
        return col

    def codes(self, k: int) -> tuple[list[str], np.ndarray]:
        """Column ``k``'s distinct cells and each row's position among them."""
        arr = self.arrow(k)
        if arr is not None:
            import pyarrow.compute as pc

            uniq = pc.unique(arr)
            return uniq.to_pylist(), numbers(pc.index_in(arr, value_set=uniq), np.int32).astype(np.int64)
        col = self.list(k)
        uniq_l = list(dict.fromkeys(col))
        at = {x: i for i, x in enumerate(uniq_l)}
        return uniq_l, np.fromiter(map(at.__getitem__, col), dtype=np.int64, count=len(col))


# a cell whose number amd-smi's 'value unit' split and float() read alike (no exponent, no unit, no sign but -)
_STRICT_NUMBER = r"^-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)$"


def _arrow_strict(arr, n: int, readable: bool = False):  # noqa: ANN001, ANN202
    """:func:`_arrow_values` of a column holding only strict numbers and marker spellings, else None.
    ``readable``: the markers must also be ones ``float`` refuses (a GFX clock's unreadable cells)."""
    import pyarrow.compute as pc

    strict = pc.match_substring_regex(arr, _STRICT_NUMBER)
    if not pc.all(strict).as_py():
        marker = pc.is_in(arr, value_set=_markers())
        if not pc.all(pc.or_(strict, marker)).as_py():
            return None
        if readable:
            present = pc.unique(pc.filter(arr, marker)).to_pylist()
            for m in present:
                try:
                    float(m)
                    return None           # 'nan', 'inf': readable clocks in the plain reading
                except ValueError:
                    pass
    return _arrow_values(arr, n)


def _amd_csv(text: str, path: str, ticker) -> None:  # noqa: ANN001
    """:func:`amdsmi.parse_csv`, column-wise; the plain function itself for what it does not read so."""
    from .amdsmi import GFX_CLK, METRIC_CSV_MAP, MONITOR_MAP, is_violation_column, parse_csv
    from .common import CsvReader
    from .dmon import epoch_seconds

    header = [h.strip().lower() for h in next(CsvReader(text, path))]
    if "gpu" not in header:
        raise InputError(path, "line 1", f"wrong columns: no 'gpu' column in {excerpt(','.join(header), 80)}")
    metric = bool({"gfx_activity", "hotspot", "edge", "socket_power", "total_energy_consumption"} & set(header)) or \
        any(GFX_CLK.match(h) for h in header)
    names = METRIC_CSV_MAP if metric else MONITOR_MAP
    cols = [h for h in header if h not in ("gpu", "timestamp")]
    clocks = [h for h in cols if GFX_CLK.match(h)]
    mapped = [h for h in cols if h in names]
    targets = [names[h][0] for h in mapped] + (["sm_clock_mhz"] if clocks else [])
    if len(set(header)) != len(header) or len(set(targets)) != len(targets):
        return parse_csv(text, path, ticker)       # dict(zip()) / two columns of one field: row order matters
    if '"' in text or "\x00" in text:
        return parse_csv(text, path, ticker)       # quoting: csv's own reading, row by row
    # no quote: a row is its line split at the commas (csv.reader's reading), one line per row
    lines = text.split("\n")
    first_line, width, h0 = lines[0], len(header), header[0]
    digit_row = not h0[:1].isdigit()     # a row starting with a digit cannot be the header again
    keep: list[str] = []
    nums: list[int] = []
    stop: InputError | None = None
    for num, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        commas = line.count(",")
        if commas == width - 1 and not (digit_row and line[0].isdigit()) and (
                line == first_line or (line.split(",", 1)[0].strip().lower() == h0 and
                                                           [x.strip().lower() for x in line.split(",")] == header)):
            continue                             # the header again (each watch iteration)
        if commas != width - 1:
            stop = InputError(path, f"line {num}", f"{commas + 1} columns, header has {width}")
            break
        keep.append(line)
        nums.append(num)
    n = len(keep)
    cells = _Cells(keep, header)
    del keep
    index = {h: i for i, h in enumerate(header)}
    columns = {k: cells.list(index[k]) for k in ("gpu", "timestamp") if k in index}
    # every column read column-wise, or the plain function for the whole chunk (its warnings, its order)
    conv: dict[str, tuple[np.ndarray, dict[int, str]]] = {}
    for h in mapped:
        arr = cells.arrow(index[h])
        got = _arrow_strict(arr, n) if arr is not None else None
        if got is None:
            lst = cells.list(index[h])
            got = column_values(lst)
            if got is None or not _split_same(lst):
                return parse_csv(text, path, ticker)
        conv[h] = got
    clock_vals: list[tuple[np.ndarray, np.ndarray]] = []
    for h in clocks:
        arr = cells.arrow(index[h])
        got = _arrow_strict(arr, n, readable=True) if arr is not None else None
        if got is not None:
            v, text_ = got
            ok = np.ones(n, dtype=bool)
            ok[list(text_)] = False
            clock_vals.append((np.where(ok, v, 0.0), ok))
            continue
        lst = cells.list(index[h])
        if not _split_same(lst):
            return parse_csv(text, path, ticker)
        v = np.empty(n, dtype=np.float64)
        ok = np.ones(n, dtype=bool)
        try:
            v[:] = np.array(lst, dtype=np.float64)
        except (ValueError, TypeError):
            from .amdsmi import split_value
            for i, x in enumerate(lst):
                try:
                    v[i] = float(x)
                except ValueError:
                    try:
                        float(split_value(x)[0])
                    except (TypeError, ValueError):
                        ok[i] = False
                        v[i] = 0.0
                        continue
                    return parse_csv(text, path, ticker)   # '2100 MHz': read through the plain split
        clock_vals.append((v, ok))
    viol: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for h in cols:
        if h in names or h in clocks:
            continue
        kind = _violation_kind(h)
        if kind is None:
            continue
        uniq, pos = cells.codes(index[h])
        memo = [_violation_outcome(h, x) for x in uniq]
        if any(o[0] == "warn" for o in memo):
            return parse_csv(text, path, ticker)
        got_u = np.array([o[0] == "set" for o in memo], dtype=bool)
        on_u = np.array([o[0] == "set" and bool(o[1]) for o in memo], dtype=bool)
        gen_u = np.array([o[1] if o[0] == "generic" else _NAN for o in memo], dtype=np.float64)
        viol.append((kind, got_u[pos], on_u[pos], gen_u[pos]))
    c = ticker.c
    for h in header:
        if h in names:
            c.note_mapped(h, names[h][0])
        elif h not in ("gpu", "timestamp") and not GFX_CLK.match(h) and not is_violation_column(h):
            c.note_unmapped(h)
    # the clock-event mask of each row (None: nothing known)
    masks = np.full(n, _NAN)
    if viol:
        mask = np.zeros(n, dtype=np.int64)
        known = np.zeros(n, dtype=bool)
        generic = np.full(n, _NAN)
        for kind, got, on, g in viol:
            if kind == -1:      # throttle_status: the row's generic reason, the last such column's
                generic = np.where(np.isnan(g), generic, g)
                continue
            known |= got
            mask |= np.where(on, kind, 0)
        masks = np.where(known, mask.astype(np.float64), generic)
    has_mask = ~np.isnan(masks)
    # clocks: the mean of the readable XCD clocks, summed in column order as the plain code does
    if clocks:
        acc = np.zeros(n, dtype=np.float64)
        cnt = np.zeros(n, dtype=np.int64)
        for v, ok in clock_vals:
            acc = np.where(ok, acc + v, acc)
            cnt += ok
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = acc / np.maximum(cnt, 1)
        for h, (_v, ok) in zip(clocks, clock_vals):
            if ok.any():
                c.note_mapped(h, "sm_clock_mhz")
    # times, devices and ticks, row by row (the ticker's rules); the first time out of range stops where
    # add_raw / add would
    ti = index.get("timestamp")
    latest = c.latest
    first_mapped = next((h for h in cols if h in names), None)
    gpus = columns["gpu"]
    # explicit times (the timestamp column), the first unreadable one
    has_ex = np.zeros(n, dtype=bool)
    ex = np.zeros(n, dtype=np.float64)
    ts_bad = n
    if ti is not None:
        stamps = columns["timestamp"]
        has_ex = np.fromiter(map(bool, stamps), dtype=bool, count=n)
        try:
            ex = np.array([x or "0" for x in stamps], dtype=np.float64)
        except ValueError:
            for i, x in enumerate(stamps):
                if x:
                    try:
                        ex[i] = epoch_seconds(x)
                    except ValueError:
                        ts_bad = i
                        break
    # ticks: a tick ends when a GPU repeats (the ticker's rule, its state carried on)
    tick, seen = ticker.tick, ticker.seen
    ticks: list[int] = []
    for g in gpus:
        if g in seen or tick < 0:
            tick, seen = tick + 1, set()
        seen.add(g)
        ticks.append(tick)
    ticker.tick, ticker.seen = tick, seen
    timed = ticker.start is not None and ticker.interval is not None
    if timed:
        times = np.where(has_ex, ex, ticker.start + np.array(ticks, dtype=np.float64) * ticker.interval)
    else:
        times = np.where(has_ex, ex, _NAN)
    # the first row the plain parser stops at: an unreadable timestamp, no time at all, a time out of range
    # where the row stores something
    stops = [(ts_bad, 0)] if ts_bad < n else []
    if not timed and not has_ex.all():
        stops.append((int(np.flatnonzero(~has_ex)[0]), 1))
    with np.errstate(invalid="ignore"):
        out = ~((times >= EARLIEST_TS) & (times <= latest))
    if not (clocks or first_mapped):
        out &= has_mask
    if out.any():
        stops.append((int(np.flatnonzero(out)[0]), 2))
    if stops:
        i, why = min(stops)
        place = f"line {nums[i]}"
        if why == 0:
            raise InputError(path, f"{place} column timestamp", f"not a time: '{excerpt(columns['timestamp'][i])}'")
        if why == 1:
            raise InputError(c.path, "", "amd-smi output has no timestamps: give --start and --interval "
                                         "(or a '# ipledger-start TIME interval_ms=...' line)")
        where = (f"{place} gfx clocks" if cnt[i] else place) if clocks else \
            (f"{place} column {first_mapped}" if first_mapped else place)
        raise InputError(c.path, where, time_problem(float(times[i]), latest) or "")
    if stop is not None:
        raise stop
    order = list(dict.fromkeys(gpus))
    code = {g: k for k, g in enumerate(order)}
    codes = np.fromiter(map(code.__getitem__, gpus), dtype=np.int64, count=n)
    by_dev: dict[str, list[int]] = {}
    for k, g in enumerate(order):
        by_dev[ticker.device(g)] = np.flatnonzero(codes == k).tolist() if len(order) > 1 else list(range(n))
    for dev, idx_list in by_dev.items():
        idx = np.array(idx_list, dtype=np.int64)
        ts = times[idx]
        if clocks:
            vals = mean[idx]
            none = cnt[idx] == 0
            vals = np.where(none, _NAN, vals)
            c.add_raw_many(dev, "sm_clock_mhz", ts, vals, 1.0)
            if none.any():
                rs = c.reasons.setdefault(dev, {})
                for j in np.flatnonzero(none):
                    rs[(float(ts[j]), "sm_clock_mhz")] = "not_available"
        for h in mapped:
            v, text_ = conv[h]
            target, scale = names[h]
            c.add_raw_many(dev, target, ts, v[idx], scale)
            if text_:
                _text_reasons(c, dev, target, ts, idx_list, text_)
        if viol:
            keep = has_mask[idx]
            if keep.any():
                c.add_raw_many(dev, "clock_reasons", ts[keep], masks[idx][keep], 1.0)


def parse_amdsmi(text: str, path: str = "<input>", *, start: float | None = None, interval: float | None = None,
                 node: str | None = None, node_hint: str | None = None) -> Collected:
    """:func:`ledger.importers.amdsmi.parse` with its CSV segments read column-wise (:func:`_amd_csv`); the
    other forms (plain text, JSON, the monitor table) as the plain parser reads them."""
    from .amdsmi import parse

    return parse(text, path, start=start, interval=interval, node=node, node_hint=node_hint, csv=_amd_csv)


def read_amdsmi(path: str | Path, **kw) -> Collected:
    from .common import decode_text

    p = Path(path)
    return parse_amdsmi(decode_text(p.read_bytes(), str(p)), str(p), **kw)
