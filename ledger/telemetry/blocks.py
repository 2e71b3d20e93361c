"""Columnar sample blocks: one telemetry segment's rows as one compressed Arrow IPC file (pure, no database).

A block stores the same rows the segment entry's ``samples_sha256`` seals (docs/ledger.md, "Sample blocks"):
rows sorted by (device, t) — the digest's order — in record batches of whole devices (one per device once a
device has :data:`BATCH_ROWS` samples, so a reader decompresses only the devices it asks for), buffers
lz4-compressed, and columns that are NULL in every row left out (the decoder gives them back as NULL). Where
each device's rows are (batch, first row, rows) is in the schema metadata. A block holding one of the format 2
columns (FP pipes, op counts: ``model.EXTENSION_METRICS``) is labelled :data:`FORMAT_2`; one without them is
format 1, byte for byte as before (docs/ledger.md, "Format 2").

Arrow IPC with lz4 was chosen by measurement (docs/performance.md, "Receipt"): on the bench's samples it
reads the receipt's columns in ≈ 30 ns/row of CPU, against ≈ 65 for IPC with zstd and ≈ 70–80 for Parquet
(zstd or snappy), writes 3–5× faster than Parquet, and takes ≈ 33 B/row against ≈ 26 (IPC zstd) and 21–36
(Parquet, by encoding).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import operator
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .model import EXTENSION_METRICS, SAMPLE_COLUMNS

FORMAT = "arrow-ipc/1"   # an Arrow IPC file; the codec is recorded in the file (lz4 frame when written here)
# Format 2: the same file holding one or more of the extension columns (model.EXTENSION_METRICS: FP pipes, op
# counts). A block without them is written as format 1, byte for byte what it was; a reader that knows only
# format 1 refuses a format 2 block instead of reading it without the columns its segment's digest covers.
FORMAT_2 = "arrow-ipc/2"
FORMATS = (FORMAT, FORMAT_2)
_EXTENSION = frozenset(EXTENSION_METRICS)
CODEC = "lz4"
_LAYOUT_KEY = b"ipledger.layout"   # [[device, batch, first row in batch, rows], ...]
BATCH_ROWS = 8192
_BY_DEVICE_T = operator.itemgetter(0, 1)


class BlockError(ValueError):
    """A block that cannot be decoded (unknown format, damaged bytes)."""


@dataclass(frozen=True)
class Block:
    """An encoded block and what the `sample_blocks` row stores beside it."""

    format: str
    rows: int
    sha256: str
    data: bytes


@functools.lru_cache(maxsize=1)
def arrow_schema():  # noqa: ANN201 - pyarrow is imported lazily (verify and ship import this module's callers)
    """The block's full schema (an immutable pyarrow Schema, built once: every decode checks against it)."""
    import pyarrow as pa

    types = {"device": pa.string(), "clock_reasons": pa.int64()}
    return pa.schema([(c, types.get(c, pa.float64())) for c in SAMPLE_COLUMNS])


def encode(rows: Sequence[tuple]) -> Block:
    """Encode rows in normalised SAMPLE_COLUMNS form (``telemetry.sealed._norm``) as one block."""
    import pyarrow as pa

    ordered = sorted(rows, key=_BY_DEVICE_T)
    columns = list(zip(*ordered)) if ordered else [()] * len(SAMPLE_COLUMNS)
    arrays, fields = [], []
    for field, values in zip(arrow_schema(), columns):
        if field.name in ("device", "t", "dt") or any(v is not None for v in values):
            arrays.append(pa.array(values, type=field.type))
            fields.append(field)
    return _write(arrays, fields, [r[0] for r in ordered])


@dataclass(frozen=True)
class Packed:
    """Segments' rows as numpy columns, each segment's in (device, t) order, one after the other: what a
    shipper's worker process hands back (it pickles as a few buffers, not a million float objects)."""

    rows: tuple            # rows per segment
    devices: tuple         # the device column
    values: object         # float64 (len(SAMPLE_COLUMNS) - 1, rows): every other column, NaN = not measured
    reasons: object        # int64 clock_reasons (exact: a bitmask may pass 2^53), 0 where not measured
    reasons_missing: object


class Checked(list):
    """A segment's rows (normalised tuples) with the columns the shipper's check built from them: ``devices``,
    ``values`` (every column but the device, one float64 row each, None as NaN, in the rows' order) and
    whether the rows are already in (device, t) order (one device, times not decreasing): :func:`pack` then
    takes the columns as they are instead of building them again."""

    __slots__ = ("devices", "values", "in_order")

    def __init__(self, rows: list, devices: tuple, values: object, in_order: bool) -> None:
        super().__init__(rows)
        self.devices, self.values, self.in_order = devices, values, in_order


_EXACT_INT = 2 ** 53   # float64 holds every integer below it exactly (clock_reasons is a 63-bit mask)


def pack(segments: Sequence[Sequence[tuple]]) -> Packed:
    """Rows of non-empty segments in normalised form (finite numbers or None, as a spool's checked rows are)."""
    import numpy as np

    devices, values = [], []
    for rows in segments:
        if isinstance(rows, Checked) and rows.in_order:
            devices.append(rows.devices)
            values.append(rows.values)
        else:
            cols = list(zip(*sorted(rows, key=_BY_DEVICE_T)))
            devices.append(cols[0])
            values.append(np.array(cols[1:], dtype=np.float64))   # None -> NaN
    matrix = np.concatenate(values, axis=1) if len(values) > 1 else values[0]
    missing = np.isnan(matrix[2])
    if np.where(missing, 0.0, matrix[2]).max() < _EXACT_INT:
        reasons = np.where(missing, 0.0, matrix[2]).astype(np.int64)
    else:   # a mask past 2^53: its exact integers, from the rows
        reasons = np.fromiter((0 if r[3] is None else r[3] for rows in segments
                               for r in sorted(rows, key=_BY_DEVICE_T)), dtype=np.int64, count=len(missing))
    return Packed(tuple(len(rows) for rows in segments), tuple(itertools.chain(*devices)), matrix, reasons,
                  missing)


def pack_reference(segments: Sequence[Sequence[tuple]]) -> Packed:
    """:func:`pack` from the rows alone, value by value (the reference tests/test_ship_segments.py holds it to)."""
    import numpy as np

    ordered = [r for rows in segments for r in sorted(rows, key=_BY_DEVICE_T)]
    cols = list(zip(*ordered))
    n = len(ordered)
    missing = np.fromiter((v is None for v in cols[3]), dtype=bool, count=n)
    reasons = np.fromiter((0 if v is None else v for v in cols[3]), dtype=np.int64, count=n)
    return Packed(tuple(len(rows) for rows in segments), cols[0], np.array(cols[1:], dtype=np.float64), reasons,
                  missing)


@dataclass(frozen=True)
class Columns:
    """Many segments' rows as Arrow columns: each segment's rows in (device, t) order, one after the other,
    after a first row that no segment takes (see :func:`columns_of`)."""

    spans: list            # (first row, rows) of each segment
    devices: tuple         # the device column (the first row's included)
    arrays: list           # a pyarrow array per SAMPLE_COLUMNS entry; None for the device column
    all_null: object = None   # bool (segments, columns): the segment measured nothing in that column


def columns_of(segments: Sequence[Sequence[tuple]]) -> Columns:
    """The rows of many non-empty segments (normalised form) as one set of columns: what :func:`encode_many`
    writes the blocks from and the device-hours are computed from."""
    return columns_from([pack(segments)])


def columns_from(packs: Sequence[Packed], keep: Sequence[bool] | None = None) -> Columns:
    """:class:`Columns` of the segments of these packs (only those ``keep`` marks, in order), built from
    the numpy columns: NULL over a 0 slot where a value is not measured, as pa.array stores None."""
    import numpy as np
    import pyarrow as pa

    lengths = [n for p in packs for n in p.rows]
    keep = [True] * len(lengths) if keep is None else list(keep)
    starts = np.cumsum([0, *lengths])
    take = np.concatenate([np.arange(starts[i], starts[i] + n) for i, n in enumerate(lengths) if keep[i]]
                          or [np.zeros(0, dtype=np.int64)])
    # A first row that no block takes: every block's slice starts past 0. Arrow's IPC writer truncates a
    # slice's buffers to its rows only when the slice has an offset; at offset 0 it wrote the whole column.
    if all(keep):
        devices = tuple(itertools.chain(("",), *(p.devices for p in packs)))
    else:
        all_devices = [d for p in packs for d in p.devices]
        devices = ("", *(all_devices[i] for i in take.tolist()))
    values = np.concatenate([np.zeros((len(SAMPLE_COLUMNS) - 1, 1)), *(p.values for p in packs)], axis=1)
    reasons = np.concatenate([[0], *(p.reasons for p in packs)])
    reasons_missing = np.concatenate([[False], *(p.reasons_missing for p in packs)])
    if not all(keep):
        rows = np.concatenate([[0], take + 1])
        values, reasons, reasons_missing = values[:, rows], reasons[rows], reasons_missing[rows]
    spans, lo = [], 1
    for n, k in zip(lengths, keep):
        if k:
            spans.append((lo, n))
            lo += n
    firsts = np.array([lo for lo, _n in spans], dtype=np.int64)
    sizes = np.array([n for _lo, n in spans], dtype=np.int64)
    arrays: list = [None]
    all_null = np.zeros((len(spans), len(SAMPLE_COLUMNS)), dtype=bool)
    for j, field in enumerate(list(arrow_schema())[1:]):
        if field.name == "clock_reasons":
            v, missing = reasons, reasons_missing
        else:
            v = values[j]
            missing = np.isnan(v)
            v = np.where(missing, 0.0, v)
        arrays.append(pa.array(v, type=field.type, mask=missing if missing.any() else None))
        if len(spans):
            all_null[:, j + 1] = np.add.reduceat(missing.astype(np.int64), firsts) == sizes
    return Columns(spans, devices, arrays, all_null)


def encode_many(segments: Sequence[Sequence[tuple]]) -> list[Block]:
    """:func:`encode` of each segment's rows: the same blocks, byte for byte (tests/test_ship_segments.py),
    from columns built once for them all (:func:`encode_spans`)."""
    if any(not rows for rows in segments):
        return [encode(rows) for rows in segments]
    return encode_spans(columns_of(segments))


def encode_spans(cols: Columns) -> list[Block]:
    """One block per segment of ``cols``, written from its slice of the columns — a shipment of collector
    segments is thousands of 60-row blocks, and building 25 arrays per block cost more than writing it."""
    import pyarrow as pa

    schema = list(arrow_schema())
    always = [f.name in ("device", "t", "dt") for f in schema]
    out = []
    for (lo, n), empty in zip(cols.spans, cols.all_null.tolist()):
        devices = cols.devices[lo:lo + n]
        # the text column is built per block: a slice of a long one is written with its data buffer padded
        kept = [j for j in range(1, len(schema)) if always[j] or not empty[j]]
        out.append(_write([pa.array(devices, type=pa.string()), *(cols.arrays[j].slice(lo, n) for j in kept)],
                          [schema[0], *(schema[j] for j in kept)], devices))
    return out


def encode_columns(cols: Mapping[str, object]) -> Block:
    """:func:`encode` of columns already in (device, t) order (numpy arrays, NaN = not measured; a column left
    out is not measured): the same block, with no row tuples in between — a bulk loader's form."""
    import numpy as np
    import pyarrow as pa

    arrays, fields = [], []
    for field in arrow_schema():
        values = cols.get(field.name)
        if values is None:
            continue
        if field.name == "device":
            arr = pa.array(values, type=pa.string())
        else:
            v = np.asarray(values, dtype=np.float64)
            missing = np.isnan(v)
            # NaN -> NULL over a 0 slot, as encode() stores None: the same bytes
            arr = pa.array(np.where(missing, 0.0, v), type=pa.float64(), mask=missing if missing.any() else None)
            arr = arr.cast(field.type) if field.type != pa.float64() else arr
        if field.name in ("device", "t", "dt") or arr.null_count < len(arr):
            arrays.append(arr)
            fields.append(field)
    return _write(arrays, fields, cols["device"])


def _write(arrays: list, fields: list, devices: Sequence[str]) -> Block:
    """The IPC file of these columns (rows in (device, t) order) with each device's rows in the layout.

    :func:`_write_reference`'s bytes, with less per-block overhead (a shipment writes thousands of 60-row
    blocks): the compression on one thread (on pyarrow's pool it cost ≈ 10× the work for such a block), a
    block of one device found without a pass over its rows, one record batch written as it is."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    dev = devices if isinstance(devices, (list, tuple)) else list(devices)
    if dev and dev[0] == dev[-1]:   # (device, t) order: the first and last rows' device is every row's
        ranges = [[dev[0], 0, len(dev)]]
    else:
        starts = [i for i in range(len(dev)) if i == 0 or dev[i] != dev[i - 1]]
        ranges = [[dev[first], first, (starts[i + 1] if i + 1 < len(starts) else len(dev)) - first]
                  for i, first in enumerate(starts)]
    layout, bounds = [], []
    for device, first, n in ranges:   # the batching rule of _write_reference
        if not bounds or bounds[-1][1] - bounds[-1][0] >= BATCH_ROWS:
            bounds.append([first, first])
        layout.append([device, len(bounds) - 1, first - bounds[-1][0], n])
        bounds[-1][1] = first + n
    schema = pa.schema(fields, metadata={_LAYOUT_KEY: json.dumps(layout)})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema, options=_write_options()) as writer:
        if bounds == [[0, len(dev)]]:
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        else:
            table = pa.Table.from_arrays(arrays, schema=schema)
            for lo, hi in bounds:
                writer.write_table(table.slice(lo, hi - lo), max_chunksize=hi - lo)
    data = sink.getvalue().to_pybytes()
    return Block(_format_of(fields), len(dev), hashlib.sha256(data).hexdigest(), data)


def _format_of(fields: list) -> str:
    """Format 2 where the block holds an extension column, else format 1."""
    return FORMAT_2 if any(f.name in _EXTENSION for f in fields) else FORMAT


@functools.cache
def _write_options():  # noqa: ANN202 - built once: pyarrow is imported only where blocks are written
    import pyarrow.ipc as ipc

    return ipc.IpcWriteOptions(compression=CODEC, use_threads=False)


def _write_reference(arrays: list, fields: list, devices: Sequence[str]) -> Block:
    """:func:`_write` as plainly as it can be said (the reference tests/test_ship_segments.py holds it to)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    ranges = []  # [device, first row, rows] in (device, t) order
    dev = list(devices)
    starts = [i for i in range(len(dev)) if i == 0 or dev[i] != dev[i - 1]]
    for i, first in enumerate(starts):
        ranges.append([dev[first], first, (starts[i + 1] if i + 1 < len(starts) else len(dev)) - first])
    # Record batches of whole devices, a new one once the current holds BATCH_ROWS: a long segment gets one
    # batch per device (a device slice decompresses only its own), a node's short batch gets one in all
    # (per-batch headers would otherwise outweigh its few hundred samples).
    layout, bounds = [], []
    for device, first, n in ranges:
        if not bounds or bounds[-1][1] - bounds[-1][0] >= BATCH_ROWS:
            bounds.append([first, first])
        layout.append([device, len(bounds) - 1, first - bounds[-1][0], n])
        bounds[-1][1] = first + n
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata={_LAYOUT_KEY: json.dumps(layout)}))
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression=CODEC)) as writer:
        for lo, hi in bounds:
            writer.write_table(table.slice(lo, hi - lo), max_chunksize=hi - lo)
    data = sink.getvalue().to_pybytes()
    return Block(_format_of(fields), len(dev), hashlib.sha256(data).hexdigest(), data)


@dataclass(frozen=True)
class OpenBlock:
    """A block's file opened once (its stored schema and layout read): which devices' rows it holds, without
    decompressing any of them. :func:`decode_open` decodes it; a reader that decodes a block only once one of
    its devices is asked for (``ledger.receipts.gather``) opens it first."""

    format: str
    data: bytes
    stored: Any                      # the pyarrow.Schema in the file
    layout: tuple                    # ((device, batch, first row in batch, rows), ...)
    devices: frozenset               # the devices the layout names


def open_block(format_: str, data: bytes) -> OpenBlock:
    """The block's schema and layout (raises :class:`BlockError` where they cannot be read)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if format_ not in FORMATS:
        raise BlockError(f"unknown sample block format {format_!r}")
    try:
        stored = ipc.open_file(pa.py_buffer(data)).schema
        layout = tuple(tuple(entry) for entry in json.loads((stored.metadata or {})[_LAYOUT_KEY]))
        if any(len(entry) != 4 for entry in layout):
            raise ValueError("a layout entry is not (device, batch, first row, rows)")
        devices = frozenset(entry[0] for entry in layout)
    except (pa.ArrowException, OSError, KeyError, ValueError, IndexError, TypeError) as exc:  # LZ4: OSError
        raise BlockError(f"sample block does not decode: {exc}") from None
    return OpenBlock(format_, data, stored, layout, devices)


def decode(format_: str, data: bytes, columns: Sequence[str] = SAMPLE_COLUMNS,
           devices: Sequence[str] | None = None) -> list[tuple[str, object]]:
    """(device, pyarrow.Table of ``columns``) for each device of the block (or only ``devices``), in the
    block's (device, t) order; only those devices' batches and those columns are decompressed."""
    return decode_open(open_block(format_, data), columns, devices)


def decode_open(block: OpenBlock, columns: Sequence[str] = SAMPLE_COLUMNS,
                devices: Sequence[str] | None = None) -> list[tuple[str, object]]:
    """:func:`decode` of a block :func:`open_block` opened."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        stored, layout = block.stored, block.layout
        present = [c for c in columns if stored.get_field_index(c) >= 0]
        if block.format == FORMAT and any(c in _EXTENSION for c in present):
            raise BlockError("sample block of format 1 holds a column of format 2")
        full = arrow_schema()
        for c in present:  # a damaged schema (a double read as a half float) is not a block this reads
            if stored.field(c).type != full.field(c).type:
                raise BlockError(f"sample block column {c!r} is {stored.field(c).type}, not {full.field(c).type}")
        # One thread: the buffers of one batch are small, and the receipt already reads devices in parallel
        # processes; pyarrow's decompression threads cost several times the work they do here.
        # The system allocator, not pyarrow's default mimalloc pool: a receipt decodes a batch, drops it and
        # decodes the next, and the pool handed those pages back to the kernel each time only to fault them in
        # again (10x the page faults; a third more CPU per sample, measured on bench.receipt's blocks).
        reader = ipc.open_file(pa.py_buffer(block.data), options=ipc.IpcReadOptions(
            included_fields=[stored.get_field_index(c) for c in present], use_threads=False),
            memory_pool=pa.system_memory_pool())
        wanted = None if devices is None else set(devices)
        # the type of each asked-for column the block does not hold, looked up once (not once per device)
        absent = {c: full.field(c).type for c in columns if c not in present}
        out, batch, batch_index = [], None, None
        for device, index, first, n in layout:
            if wanted is not None and device not in wanted:
                continue
            if index != batch_index:
                batch, batch_index = reader.get_batch(index), index
                # Arrow's IPC reader trusts the buffers it is given; a damaged block (its stored sha256 fixed
                # up) could otherwise make a reader index past them and crash the process. Buffer sizes are
                # checked always (cheap); offsets and UTF-8 of the text column, where it is read, in full.
                batch.validate(full="device" in present)
            if first < 0 or n < 0 or first + n > batch.num_rows:
                raise BlockError(f"sample block layout out of range for device {device!r}")
            part = batch.slice(first, n)
            arrays = [_nulls(n, absent[c]) if c in absent else part.column(c) for c in columns]
            out.append((device, pa.Table.from_arrays(arrays, names=list(columns))))
        return out
    except (pa.ArrowException, OSError, KeyError, ValueError, IndexError, TypeError) as exc:  # LZ4: OSError
        raise BlockError(f"sample block does not decode: {exc}") from None


@functools.lru_cache(maxsize=8)
def _nulls(n: int, type_):  # noqa: ANN001, ANN202 - a column the block does not hold: n NULLs of its type
    """Arrow arrays are immutable, so the NULL column of a length is built once and shared (a receipt of the
    lens asks for the same absent columns of every device's same-length slice)."""
    import pyarrow as pa

    return pa.nulls(n, type_)


def table_rows(table) -> list[tuple]:  # noqa: ANN001
    """The rows of a decoded table (all SAMPLE_COLUMNS) as tuples in normalised form."""
    return list(zip(*(table.column(c).to_pylist() for c in SAMPLE_COLUMNS)))


_NUMPY_DTYPES = {"double": "<f8", "int64": "<i8"}


def raw_values(column):  # noqa: ANN001, ANN201 - a pyarrow (Chunked)Array -> (numpy values, numpy validity)
    """A numeric column's values in their own type (float64 or int64: a 63-bit clock-reason mask stays exact)
    and where they are not NULL, read straight from the Arrow buffers (a NULL's value is whatever the buffer
    holds there)."""
    import numpy as np

    values, valid = [], []
    for arr in getattr(column, "chunks", [column]):
        n, off = len(arr), arr.offset
        dtype = _NUMPY_DTYPES[str(arr.type)]
        if arr.null_count == n:
            values.append(np.zeros(n, dtype=dtype))
            valid.append(np.zeros(n, dtype=bool))
            continue
        validity, data = arr.buffers()[:2]
        values.append(np.frombuffer(data, dtype=dtype, count=n, offset=off * 8))
        if arr.null_count:
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")[off:off + n]
            valid.append(bits.astype(bool))
        else:
            valid.append(np.ones(n, dtype=bool))
    if len(values) == 1:
        return values[0], valid[0]
    if not values:
        return np.empty(0), np.empty(0, dtype=bool)
    return np.concatenate(values), np.concatenate(valid)


def float_values(column):  # noqa: ANN001, ANN201 - a pyarrow (Chunked)Array -> numpy float64 array
    """A numeric column's values as float64, NULL as NaN, read straight from the Arrow buffers (zero-copy for
    a float column without NULLs). Not ``to_numpy()``: in pyarrow 26 that imports pandas (≈ 0.5 s of a
    receipt's fresh interpreter)."""
    import numpy as np

    parts = []
    for arr in getattr(column, "chunks", [column]):
        n, off = len(arr), arr.offset
        if arr.null_count == n:
            parts.append(np.full(n, np.nan))
            continue
        validity, data = arr.buffers()[:2]
        values = np.frombuffer(data, dtype=_NUMPY_DTYPES[str(arr.type)], count=n, offset=off * 8)
        values = values.astype(np.float64, copy=False)
        if arr.null_count:
            valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")[off:off + n]
            values = np.where(valid.astype(bool), values, np.nan)
        parts.append(values)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0)
