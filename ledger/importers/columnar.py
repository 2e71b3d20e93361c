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

A file is read from its bytes first (:func:`read_dmon`, :func:`read_amdsmi`; what ``analyze`` and ``import``
read): where they are printable ASCII with LF or CRLF line ends (:func:`ascii_lines`), the rows (lines that
begin ``GPU `` / a digit) are found by numpy and never made Python strings; only the other lines (anchors,
headers, banners, noise) are read one by one, by the same rules. Columns written with digits, '.' and '-' only
are cast without the per-cell check (:func:`decimal_column`), and the ticks of a capture whose every tick lists
the same devices in the same order are counted in one step (:func:`tick_codes`). Anything else the byte
reading leaves (:class:`_Irregular`, any InputError) is read again by the line readings above, so the same
collection and the same error either way (tests/test_columnar.py: hypothesis, the shipped fixtures, odd files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

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
        # each spelling's cells found before any is replaced: "nan" written over "N/A" is no "nan" cell
        hits = [(m, np.flatnonzero(obj == m)) for m in present]
        for m, at in hits:
            obj[at] = "nan"
            text.update(dict.fromkeys(at.tolist(), TEXT_REASONS[m.strip().lower()]))
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
    if p.stat().st_size <= ARROW_MAX_BYTES:
        try:
            return _dmon_bytes(p.read_bytes(), str(p), **kw)
        except _Irregular:
            pass
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


def _space_table(body: bytes, width: int):  # noqa: ANN202 - a pyarrow Table
    """Rows of cells separated by one space each (no other white space), read by pyarrow as ``width``
    string columns; :class:`_Irregular` for a row of another width."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(io.BytesIO(body), read_options=pacsv.ReadOptions(
            column_names=[f"c{k}" for k in range(width)], use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=" ", quote_char=False, double_quote=False,
                                             escape_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types={f"c{k}": pa.string() for k in range(width)},
                                                 strings_can_be_null=False, null_values=[]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise _Irregular() from None


def _dmon_store(c: Collected, specs: list, table, first: int, n: int, order: list[str],  # noqa: ANN001
                codes: np.ndarray | None, ts_all: np.ndarray) -> None:
    """One block of dmon rows stored: ``table``'s columns from ``first`` on are the header's (``specs``), the
    rows' devices ``order`` (first seen first) and each row's position in it (``codes``; None: one device)."""
    if table.num_rows != n:
        raise _Irregular()
    conv = {}
    for k, spec in enumerate(specs):
        if spec is not None:
            col = table.column(first + k)
            plain = decimal_column(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))
            got = (plain, {}) if plain is not None else _arrow_values(col, n)
            if got is None:
                raise _Irregular()
            conv[k] = got
    single = len(order) == 1
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


def _dmon_line(c: Collected, s: str, n: int, columns: list[str] | None) -> list[str] | None:
    """A stripped dmon line that is no data row the column-wise readings take and no ``# ipledger`` line: a
    header's columns are returned; the units line is passed over, known noise skipped and counted;
    :class:`_Irregular` for anything else (the plain parser then reads the capture)."""
    from .dmon import DMON_NUMBER, ENTITY_TYPES

    toks = s.split()
    if toks[0] == "#Entity" or toks[:2] == ["#", "Entity"]:
        new = toks[1:] if toks[0] == "#Entity" else toks[2:]
        if not new:
            raise _Irregular()
        return new
    if toks[0].upper() == "ID" and not any(DMON_NUMBER.fullmatch(x) for x in toks[1:]):
        return None
    if toks[0] in ENTITY_TYPES and columns is None:
        if len(toks) >= 2:
            c.skip(f"line {n}", "row_before_header", s)
            return None
    if toks[0] in ENTITY_TYPES and len(toks) >= 2 and (columns is None or len(toks) - 2 == len(columns)):
        raise _Irregular()     # a row the reading did not take as one
    noise = noise_reason(s)
    if noise is not None or s.startswith("Error") or "dcgmi dmon" in s:
        c.skip(f"line {n}", noise or "tool_message", s)
        return None
    raise _Irregular()         # not a row and not known noise: the exact reading names it


def _dmon_other(c: Collected, s: str, n: int, columns: list[str] | None, specs: list,
                flush: Callable[[], None]) -> tuple[list[str] | None, list]:
    """:func:`_dmon_line` of line ``n``, and the header (its columns and their fields) it leaves: a header
    that differs stores the rows read under the one before (``flush``) first."""
    from .dcgm_fields import BY_DMON

    new = _dmon_line(c, s, n, columns)
    if new is None or new == columns:
        return columns, specs
    if columns is None:
        _note_columns(c, new)
    flush()
    return new, [BY_DMON.get(col) for col in new]


def _dmon_start(path: str, start: float | None, interval: float | None, node: str | None,
                node_hint: str | None):  # noqa: ANN202 - (dmon.Segments, Collected)
    """A dmon capture's segments and its empty collection; :class:`_Irregular` where the plain parser refuses
    the arguments (it names why)."""
    from .dmon import Segments

    try:
        seg = Segments(path, start, interval, node, node_hint)
    except InputError:
        raise _Irregular() from None
    return seg, Collected("dcgmi_dmon", path=path, cadence=interval)


def _dmon_done(c: Collected, seg, columns: list[str] | None, rows: int) -> Collected:  # noqa: ANN001
    """The collection of a capture read to its end: its MIG parent marked, its segments recorded;
    :class:`_Irregular` for one with no header or no row (the plain parser says why)."""
    from .dmon import mark_mig_parent

    if columns is None or rows == 0:
        raise _Irregular()
    mark_mig_parent(c)
    seg.finish(c)
    return c


def _note_columns(c: Collected, columns: list[str]) -> None:
    """The first header's columns reported mapped / unmapped (the header repeats: reported once)."""
    from .dcgm_fields import BY_DMON

    for col in columns:
        spec = BY_DMON.get(col)
        if spec is None:
            c.note_unmapped(col)
        else:
            c.note_mapped(col, spec.target)


def _dmon_arrow(lines: list[str], path: str, *, start: float | None, interval: float | None, node: str | None,
                node_hint: str | None) -> Collected:
    """The common capture (rows the header's width, numbers and markers), its row blocks parsed by pyarrow;
    :class:`_Irregular` for anything else."""
    from .dmon import ENTITY_TYPES

    seg, c = _dmon_start(path, start, interval, node, node_hint)
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
        n = len(rests)
        order = list(dict.fromkeys(devs))
        codes = None
        if len(order) > 1:
            code = {d: k for k, d in enumerate(order)}
            codes = np.fromiter(map(code.__getitem__, devs), dtype=np.int64, count=n)
        _dmon_store(c, specs, _space_table(b[keep].tobytes(), width), 0, n, order, codes,
                    np.array(times, dtype=np.float64))
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
            columns, specs = _dmon_other(c, s, n, columns, specs, flush)
        flush()
    except InputError:
        raise _Irregular() from None
    return _dmon_done(c, seg, columns, rows)


def _dmon_bytes(data: bytes, path: str = "<input>", *, start: float | None = None, interval: float | None = None,
                node: str | None = None, node_hint: str | None = None) -> Collected:
    """:func:`_dmon_arrow` of a capture's bytes: the lines that begin ``GPU `` (the rows) are never made Python
    strings; each block of them (between two headers that differ, two ``# ipledger`` lines, at most
    :data:`FLUSH_ROWS` rows) has its runs of spaces collapsed by numpy and goes to pyarrow whole, the GPU id a
    column of it, the ticks counted over the block's id codes (:func:`tick_codes`). The other lines are read
    one by one as :func:`_dmon_arrow` reads them. :class:`_Irregular` where that reading would stop, and for
    bytes :func:`ascii_lines` does not split (the caller then reads the lines)."""
    from .dmon import ENTITY_TYPES

    got = ascii_lines(data)
    if got is None or b"(" in data:       # "nan(1)": float() refuses, strtod not
        raise _Irregular()
    body, starts, ends = got
    cr_present = b"\r" in body
    b = np.frombuffer(body, dtype=np.uint8)
    at = np.minimum(starts, max(len(b) - 4, 0))
    is_row = ((ends - starts) >= 4) & (b[at] == 71) & (b[at + 1] == 80) & (b[at + 2] == 85) & (b[at + 3] == 32)
    nxt = np.concatenate((starts[1:], [len(body)]))     # each line's end, its line end included
    view = memoryview(body)
    seg, c = _dmon_start(path, start, interval, node, node_hint)
    columns: list[str] | None = None
    specs: list = []
    pending: list[tuple[int, int]] = []       # runs of row lines [a, e) not yet stored
    held = 0
    devices: dict[tuple[str, str], str] = {}
    rows = 0

    def flush() -> None:
        nonlocal held
        if not pending:
            return
        if seg.start is None or seg.interval is None:
            raise _Irregular()
        n = held
        raw = np.frombuffer(b"".join(view[starts[a]:nxt[e - 1]] for a, e in pending), dtype=np.uint8)
        pending.clear()
        held = 0
        # one space between cells, none at a row's end, no CR: the row split (str.split) in C
        # a space is dropped before another space, a line end or the end (the only bytes <= 32 here)
        keep = np.ones(len(raw), dtype=bool)
        keep[:-1] = ~((raw[:-1] == 32) & (raw[1:] <= 32))
        keep[-1] = raw[-1] != 32
        if cr_present:
            keep &= raw != 13
        table = _space_table(raw[keep].tobytes(), len(columns) + 2)
        ids, codes = _codes(table.column(1))
        entities = [f"GPU {x}" for x in ids]
        ticks = tick_codes(seg, entities, codes)
        ts_all = seg.start + ticks.astype(np.float64) * seg.interval
        with np.errstate(invalid="ignore"):
            if not ((ts_all >= EARLIEST_TS) & (ts_all <= c.latest)).all():
                raise _Irregular()
        order = []
        for ident in ids:
            dkey = (seg.node, ident)
            dev = devices.get(dkey)
            if dev is None:
                dev = devices[dkey] = c.device(DeviceInfo(device=f"{seg.node}/gpu{ident}", node=seg.node,
                                                          index=small_index(ident)))
            order.append(dev)
        _dmon_store(c, specs, table, 2, n, order, codes if len(order) > 1 else None, ts_all)

    def take(a: int, e: int) -> None:
        """Row lines [a, e) under the current header, stored a block of FLUSH_ROWS at a time."""
        nonlocal held, rows
        while a < e:
            k = min(e - a, FLUSH_ROWS - held)
            pending.append((a, a + k))
            held += k
            rows += k
            a += k
            if held >= FLUSH_ROWS:
                flush()

    try:
        prev = 0
        others = np.flatnonzero(~is_row).tolist()
        for i in others + [len(starts)]:
            if i > prev:
                if columns is None:
                    for j in range(prev, i):     # rows before any header: each line as it is read
                        _dmon_line(c, body[starts[j]:ends[j]].decode().strip(), j + 1, columns)
                else:
                    take(prev, i)
            prev = i + 1
            if i == len(starts):
                break
            s = body[starts[i]:ends[i]].strip().decode()
            if not s:
                continue
            if s[0] == "#" and s.startswith("# ipledger"):
                flush()                       # the rows above keep the segment they were read in
                seg.ipledger_line(s, f"line {i + 1}", c)
                continue
            parts = s.split(None, 2)
            if len(parts) == 3 and columns is not None and parts[0] in ENTITY_TYPES:
                raise _Irregular()            # a row of another entity (GPU-I ...) or spacing: the line reading
            columns, specs = _dmon_other(c, s, i + 1, columns, specs, flush)
        flush()
    except InputError:
        raise _Irregular() from None
    return _dmon_done(c, seg, columns, rows)


def _codes(col) -> tuple[list[str], np.ndarray]:  # noqa: ANN001 - a pyarrow (Chunked)Array of strings
    """A string column's distinct cells in the order they first appear, and each row's position among them."""
    import pyarrow.compute as pc

    uniq = pc.unique(col)
    return uniq.to_pylist(), numbers(pc.index_in(col, value_set=uniq), np.int32).astype(np.int64)


def tick_codes(state, names: list[str], codes: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """Each row's tick by the capture's rule (a tick ends when an entity repeats; ``state``'s ``tick`` and
    ``seen`` carried on and left as the rows leave them, ``ticks`` too where it has one): ``names`` the
    entities, ``codes`` each row's position among them. The common capture, every tick the same entities in
    the same order, in one step; any other row by row (:class:`dmon.Segments`' ``time_for``, the amd-smi
    ticker's). tests/test_columnar.py holds the two equal."""
    k, n = len(names), len(codes)
    tick, seen = state.tick, state.seen
    if n and n % k == 0 and (tick < 0 or names[codes[0]] in seen) and np.array_equal(codes[:k], np.arange(k)) \
            and (codes.reshape(-1, k) == codes[:k]).all():
        ticks = (tick + 1) + np.arange(n, dtype=np.int64) // k
        tick, seen = tick + n // k, set(names)
    else:
        out: list[int] = []
        for g in map(names.__getitem__, codes.tolist()):
            if g in seen or tick < 0:
                tick, seen = tick + 1, set()
            seen.add(g)
            out.append(tick)
        ticks = np.array(out, dtype=np.int64)
    if tick != state.tick and hasattr(state, "ticks"):
        state.ticks = tick + 1
    state.tick, state.seen = tick, seen
    return ticks


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
    (in C, no Python string per cell), Python lists (the rows split at their commas) where asked for. The rows
    come as a list of lines, or as their bytes joined with LF (``body``: the byte reading, no string a row)."""

    def __init__(self, rows: list[str] | None, header: list[str], body: bytes | None = None,
                 count: int | None = None) -> None:
        import io

        import pyarrow as pa
        import pyarrow.csv as pacsv

        self.header, self.width = header, len(header)
        self.n = len(rows) if rows is not None else count
        self._rows = rows
        self._body = body
        self._flat: list[str] | None = None
        self.table = None
        if self.n:
            data = body if body is not None else "\n".join(rows).encode()
            try:
                t = pacsv.read_csv(io.BytesIO(data), read_options=pacsv.ReadOptions(
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
            if self._rows is None:
                self._rows = self._body.decode().splitlines() if self.n else []
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


_DECIMAL_BYTES = b"0123456789.-"


def value_bytes(arr) -> bytes:  # noqa: ANN001 - a pyarrow StringArray
    """The characters of a pyarrow string array's cells, end to end (its data buffer's used part)."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    data = arr.buffers()[2]
    return b"" if data is None else data.to_pybytes()[int(offsets[0]):int(offsets[-1])]


def decimal_column(arr) -> np.ndarray | None:  # noqa: ANN001 - a pyarrow StringArray
    """A column whose cells are all written with digits, '.' and '-' only, as floats where every cell is a
    strict number (:data:`_STRICT_NUMBER`: pyarrow's cast takes exactly those among such cells, and reads them
    as ``float`` does; tests/test_columnar.py holds this); None otherwise (the caller checks cell by cell)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if value_bytes(arr).translate(None, _DECIMAL_BYTES):
        return None
    try:
        v = pc.cast(arr, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return None if v.null_count else numbers(v, np.float64)


def _arrow_strict(arr, n: int, readable: bool = False):  # noqa: ANN001, ANN202
    """:func:`_arrow_values` of a column holding only strict numbers and marker spellings, else None.
    ``readable``: the markers must also be ones ``float`` refuses (a GFX clock's unreadable cells)."""
    import pyarrow.compute as pc

    plain = decimal_column(arr)
    if plain is not None:                 # digits only: no marker, no regex a cell
        return plain, {}
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


def plain_only(header: list[str]) -> bool:
    """Whether an amd-smi CSV header needs :func:`amdsmi.parse_csv`'s row-by-row reading: a column named twice
    (``dict(zip())`` keeps the last) or two columns of one field (the row order decides)."""
    from .amdsmi import GFX_CLK, METRIC_CSV_MAP, MONITOR_MAP

    names = METRIC_CSV_MAP if _is_metric(header) else MONITOR_MAP
    cols = [h for h in header if h not in ("gpu", "timestamp")]
    targets = [names[h][0] for h in cols if h in names] + (["sm_clock_mhz"] if any(GFX_CLK.match(h) for h in cols)
                                                            else [])
    return len(set(header)) != len(header) or len(set(targets)) != len(targets)


def _is_metric(header: list[str]) -> bool:
    from .amdsmi import GFX_CLK

    return bool({"gfx_activity", "hotspot", "edge", "socket_power", "total_energy_consumption"} & set(header)) or \
        any(GFX_CLK.match(h) for h in header)


def _amd_csv(text: str, path: str, ticker) -> None:  # noqa: ANN001
    """:func:`amdsmi.parse_csv`, column-wise; the plain function itself for what it does not read so."""
    from .amdsmi import parse_csv
    from .common import CsvReader

    first_line = text.split("\n", 1)[0]
    header = [h.strip().lower() for h in next(CsvReader(first_line if '"' not in first_line else text, path))]
    if "gpu" not in header:
        raise InputError(path, "line 1", f"wrong columns: no 'gpu' column in {excerpt(','.join(header), 80)}")
    if plain_only(header):
        return parse_csv(text, path, ticker)       # dict(zip()) / two columns of one field: row order matters
    if '"' in text or "\x00" in text:
        return parse_csv(text, path, ticker)       # quoting: csv's own reading, row by row
    # no quote: a row is its line split at the commas (csv.reader's reading), one line per row
    lines = text.split("\n")
    width, h0 = len(header), header[0]
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
    cells = _Cells(keep, header)
    del keep
    if not _amd_store(header, cells, nums, stop, path, ticker):
        parse_csv(text, path, ticker)


def _amd_store(header: list[str], cells: "_Cells", nums, stop: InputError | None, path: str,  # noqa: ANN001
               ticker) -> bool:  # noqa: ANN001
    """The rows of one amd-smi CSV segment (``cells``; ``nums`` their line numbers; ``stop`` the error of the
    row after the last one kept) stored on ``ticker``'s collection as :func:`amdsmi.parse_csv` stores them;
    False, with nothing stored, where a column needs its row-by-row reading."""
    from .amdsmi import GFX_CLK, METRIC_CSV_MAP, MONITOR_MAP, is_violation_column
    from .dmon import epoch_seconds

    names = METRIC_CSV_MAP if _is_metric(header) else MONITOR_MAP
    cols = [h for h in header if h not in ("gpu", "timestamp")]
    clocks = [h for h in cols if GFX_CLK.match(h)]
    mapped = [h for h in cols if h in names]
    n = cells.n
    index = {h: i for i, h in enumerate(header)}
    # every column read column-wise, or the plain function for the whole chunk (its warnings, its order)
    conv: dict[str, tuple[np.ndarray, dict[int, str]]] = {}
    for h in mapped:
        arr = cells.arrow(index[h])
        got = _arrow_strict(arr, n) if arr is not None else None
        if got is None:
            lst = cells.list(index[h])
            got = column_values(lst)
            if got is None or not _split_same(lst):
                return False
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
            return False
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
                    return False    # '2100 MHz': read through the plain split
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
            return False
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
    order, codes = _gpu_codes(cells, index["gpu"])
    # explicit times (the timestamp column), the first unreadable one
    has_ex = np.zeros(n, dtype=bool)
    ex = np.zeros(n, dtype=np.float64)
    ts_bad = n
    if ti is not None:
        arr = cells.arrow(ti)
        whole = decimal_column(arr) if arr is not None else None
        if whole is not None and b"." not in value_bytes(arr):   # whole seconds: float() of each, in C
            has_ex, ex = np.ones(n, dtype=bool), whole
        else:
            stamps = cells.list(ti)
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
    ticks = tick_codes(ticker, order, codes)
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
            raise InputError(path, f"{place} column timestamp", f"not a time: '{excerpt(cells.list(ti)[i])}'")
        if why == 1:
            raise InputError(c.path, "", "amd-smi output has no timestamps: give --start and --interval "
                                         "(or a '# ipledger-start TIME interval_ms=...' line)")
        where = (f"{place} gfx clocks" if cnt[i] else place) if clocks else \
            (f"{place} column {first_mapped}" if first_mapped else place)
        raise InputError(c.path, where, time_problem(float(times[i]), latest) or "")
    if stop is not None:
        raise stop
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
    return True


def _gpu_codes(cells: "_Cells", k: int) -> tuple[list[str], np.ndarray]:
    """The gpu column's distinct cells (stripped, as the plain reading has them) in the order they first
    appear, and each row's position among them."""
    order, codes = cells.codes(k)
    if any(ch.isspace() for g in order for ch in g):
        gpus = cells.list(k)     # stripped
        order = list(dict.fromkeys(gpus))
        at = {g: i for i, g in enumerate(order)}
        codes = np.fromiter(map(at.__getitem__, gpus), dtype=np.int64, count=len(gpus))
    return order, codes


def parse_amdsmi(text: str, path: str = "<input>", *, start: float | None = None, interval: float | None = None,
                 node: str | None = None, node_hint: str | None = None) -> Collected:
    """:func:`ledger.importers.amdsmi.parse` with its CSV segments read column-wise (:func:`_amd_csv`); the
    other forms (plain text, JSON, the monitor table) as the plain parser reads them."""
    from .amdsmi import parse

    return parse(text, path, start=start, interval=interval, node=node, node_hint=node_hint, csv=_amd_csv)


def parse_amdsmi_bytes(data: bytes, path: str = "<input>", **kw) -> Collected:
    """:func:`parse_amdsmi` of the file's bytes: the common CSV capture read by :func:`_amd_bytes` (no string
    a line), anything else decoded and read by :func:`parse_amdsmi` (the same collection and errors)."""
    from .common import decode_text

    try:
        return _amd_bytes(data, path, **kw)
    except (_Irregular, InputError):
        return parse_amdsmi(decode_text(data, path), path, **kw)


def read_amdsmi(path: str | Path, **kw) -> Collected:
    p = Path(path)
    return parse_amdsmi_bytes(p.read_bytes(), str(p), **kw)


def ascii_lines(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """A capture's bytes split into lines as the text readers split them (``str.splitlines`` of the decoded
    text, :func:`common.read_lines`), for bytes that are printable ASCII with LF or CRLF line ends and not blank:
    the bytes, each line's start and end offset in them (the end before its CR LF or LF); None for any other
    bytes (a lone CR, a tab, a control character: the text readers split or strip those otherwise)."""
    if not data.isascii() or not data.strip() or data.translate(None, _PRINTABLE_ASCII + b"\r"):
        return None
    b = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(b == 10)
    ends = nl
    if b"\r" in data:
        before = b[np.maximum(nl - 1, 0)] == 13
        if data.count(b"\r") != int(np.count_nonzero(before)):
            return None                  # a CR that ends no line
        ends = nl - before
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((ends, [len(data)]))
    if starts[-1] == len(data):      # the text ends with a line end: no line after it
        starts, ends = starts[:-1], ends[:-1]
    return data, starts, ends


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The [start, end) index ranges of the runs of True in a boolean array."""
    d = np.diff(np.concatenate(([0], mask.view(np.int8), [0])))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _amd_bytes(data: bytes, path: str = "<input>", *, start: float | None = None, interval: float | None = None,
               node: str | None = None, node_hint: str | None = None) -> Collected:
    """:func:`amdsmi.parse` of an amd-smi CSV capture, read from its bytes: the lines that start with a digit
    (the rows) are never made Python strings; each segment's rows go to pyarrow as one buffer
    (:class:`_Cells`) and are stored by :func:`_amd_store`. The other lines (anchors, the watch banner, noise,
    the header before each iteration) are read one by one as :func:`amdsmi.parse` reads them. :class:`_Irregular`
    for a capture that is not the common one (not printable ASCII, a quote, an '@', a row with spaces around it,
    a header spelled otherwise, no header, a row of another width, a cell only the plain reading takes) and
    InputError where the plain parser may stop: the caller reads those with :func:`parse_amdsmi`."""
    from .amdsmi import Ticker, anchor_or_skip
    from .dmon import Segments

    got = ascii_lines(data)
    if got is None or b'"' in data or b"@" in data:
        raise _Irregular()
    body, starts, ends = got
    b = np.frombuffer(body, dtype=np.uint8)
    first = b[starts]                          # no line is empty at its start offset past the end: not blank
    first = np.where(ends > starts, first, 0)
    is_row = (first >= 48) & (first <= 57)
    if (is_row & (b[np.maximum(ends - 1, 0)] == 32)).any():
        raise _Irregular()                     # a row with trailing spaces (the plain reading strips them)
    seg = Segments(path, start, interval, node, node_hint)
    c = Collected("amd_smi", path=path, cadence=interval)
    parsed = 0
    view = memoryview(body)
    chunk: list = []                           # [header line number, header text, first line, end line]

    def flush() -> None:
        nonlocal parsed
        if not chunk:
            return
        _n0, first_line, lo, hi = chunk
        chunk.clear()
        first_s = first_line.strip()
        if first_s.startswith(("[", "{", "GPU:")) or "," not in first_s or \
                "gpu" not in [h.strip().lower() for h in first_s.split(",")]:
            raise _Irregular()
        header = [h.strip().lower() for h in first_line.split(",")]
        if plain_only(header) or header[0][:1].isdigit():
            raise _Irregular()
        rs, re_ = _runs(is_row[lo:hi])
        if not len(rs):
            raise _Irregular()
        nums = np.flatnonzero(is_row[lo:hi]) + lo + 1
        nxt = np.concatenate((starts[1:], [len(body)]))    # each line's end, its line end included
        rows = b"".join(view[starts[lo + i]:nxt[lo + j - 1]] for i, j in zip(rs.tolist(), re_.tolist()))
        cells = _Cells(None, header, body=rows, count=len(nums))
        if cells.table is None:
            raise _Irregular()
        ticker = Ticker(c, seg.start, seg.interval, seg.node)
        if not _amd_store(header, cells, nums, None, path, ticker):
            raise _Irregular()
        seg.ticks = ticker.tick + 1
        parsed += 1

    memo: dict[str, str | None] = {}
    seg_lo = 0                                 # the first line after the last start anchor

    def segment_ends(hi: int) -> None:
        """The segment of lines [seg_lo, hi) is over: its rows all follow its header (else the plain reading)."""
        lo = chunk[2] if chunk else hi
        if is_row[seg_lo:lo].any():
            raise _Irregular()                 # rows before any header: the plain reading says what they are
        if chunk:
            chunk[3] = hi
        flush()

    def new_segment(i: int) -> None:
        """A start anchor at line index ``i``: the segment before it is over."""
        nonlocal seg_lo
        segment_ends(i)
        seg_lo = i + 1

    for i in np.flatnonzero(~is_row).tolist():
        raw = body[starts[i]:ends[i]]
        s = raw.strip().decode()
        if not s:
            continue
        if s[0].isdigit():
            raise _Irregular()                 # a row after spaces
        if anchor_or_skip(seg, c, s, f"line {i + 1}", memo, lambda i=i: new_segment(i)):
            continue
        line = raw.rstrip().decode()
        if not chunk:
            chunk.extend([i + 1, line, i, len(starts)])
        elif line != chunk[1]:
            raise _Irregular()                 # another header (or text) inside a segment: the plain reading
    segment_ends(len(starts))
    if not parsed:
        raise _Irregular()
    seg.finish(c)
    return c
