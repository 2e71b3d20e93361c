"""Telemetry storage: each batch of samples sealed by a `telemetry_segment` entry and stored as one columnar block.

The segment entry's payload carries the sha256 of the batch's canonical rows (``samples_sha256``, the proof a
tenant's verifier re-derives) and a binary digest of the same values (``values_sha256``, what `ipledger verify`
checks; ``--deep`` both), so verify can prove the samples a receipt was computed from are the samples that were
recorded. The rows themselves are
stored as one compressed Arrow block per segment in `sample_blocks` (:mod:`ledger.telemetry.blocks`);
ledgers written before blocks keep theirs as rows of the `samples` table. :func:`iter_sample_pieces` is the
one reader of both, used by load_samples, receipts, the agents' dataset and verify.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence, TYPE_CHECKING

from ..chain.canonical import canonical_json
from ..chain.db import write_tx
from ..chain.entries import ChainedEntry, Entry, Kind, make_entry
from ..chain.lite import is_connection, text
from ..chain.store import AppendResult, append_in
from ..chain.verify import ChainProblem
from . import blocks
from .model import BASE_COLUMNS, EXTENSION_METRICS, SAMPLE_COLUMNS, Sample

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

INSERT_COLUMNS = ("segment_id", *BASE_COLUMNS)  # the legacy `samples` table's columns (it has no format 2 ones)


_WIDTH, _BASE_WIDTH = len(SAMPLE_COLUMNS), len(BASE_COLUMNS)
_NO_EXTENSION = (None,) * (len(SAMPLE_COLUMNS) - len(BASE_COLUMNS))


def _norm(row: Sequence) -> tuple:
    """One type per column whatever the backend returns: device str, clock_reasons int, the rest float. A row
    of the base columns only (a spool written before format 2) gets the extension columns as not measured (as
    does any shorter row: only intake's checks decide whether a row has its width)."""
    device, *rest = row
    if len(rest) < _WIDTH - 1:
        rest = [*rest, *(None,) * (_WIDTH - 1 - len(rest))]
    out = [str(device)]
    for name, v in zip(SAMPLE_COLUMNS[1:], rest):
        if v is None:
            out.append(None)
        elif name == "clock_reasons":
            out.append(int(v))
        else:
            out.append(float(v))
    return tuple(out)


_METRIC_GETTERS = tuple(operator.attrgetter(c) for c in SAMPLE_COLUMNS[4:])


_ALL_GETTER = operator.attrgetter(*SAMPLE_COLUMNS)
_FLOAT_OR_NONE = frozenset({float, type(None)})


def sample_row_values(s: Sample) -> tuple:
    """The same values as ``_norm`` over the sample's columns, without the per-column dispatch (hot path)."""
    vals = _ALL_GETTER(s)
    cr = vals[3]
    if type(vals[0]) is str and type(vals[1]) is float and type(vals[2]) is float \
            and (cr is None or type(cr) is int) and set(map(type, vals[4:])) <= _FLOAT_OR_NONE:
        return vals     # already exactly the normalised form
    return (str(s.device), float(s.t), float(s.dt), None if cr is None else int(cr),
            *[None if v is None else float(v) for v in (g(s) for g in _METRIC_GETTERS)])


def normalised(row: Sequence) -> tuple:
    """``_norm(row)``, taking the row as it is where every value already has its column's type (a spool's rows,
    written by the collector from ``sample_row_values``, always do): the hot path of shipping segments."""
    cr = row[3]
    if len(row) == _WIDTH and type(row[0]) is str and type(row[1]) is float and type(row[2]) is float \
            and (cr is None or type(cr) is int) and set(map(type, row[4:])) <= _FLOAT_OR_NONE:
        return tuple(row)
    return _norm(row)


def carried_columns(rows: Sequence[tuple]) -> tuple[str, ...]:
    """The columns a segment of these normalised rows carries (its entry's ``columns``): the base columns, then
    each extension column some row measured (sample block format 2; none: the base columns, format 1)."""
    if not _has_extension(rows):
        return BASE_COLUMNS
    extra = [c for j, c in enumerate(EXTENSION_METRICS, start=_BASE_WIDTH)
             if any(r[j] is not None for r in rows)]
    return (*BASE_COLUMNS, *extra)


_TAIL = operator.itemgetter(slice(_BASE_WIDTH, None))


def _has_extension(rows: Sequence[tuple]) -> bool:
    """Whether any row (full width) measured an extension column: C-level passes, no Python loop per row."""
    return any(map(_NO_EXTENSION.__ne__, map(_TAIL, rows)))


def samples_digest(rows: Iterable[tuple]) -> str:
    """sha256 over canonical JSON lines of the rows (SAMPLE_COLUMNS order), sorted by (device, t)."""
    return digest_normalised([_norm(r) for r in rows])


_NULL_TAIL = ",null" * len(_NO_EXTENSION) + "]"


def digest_normalised(rows: list[tuple]) -> str:
    """The digest of rows already in ``_norm`` form (segment_entry's rows come from ``sample_row_values``), over
    the columns the rows carry (:func:`carried_columns`): rows that measured no extension column hash as
    their base columns, exactly as before format 2 (``ledger.proofcheck.samples_digest`` of the projection)."""
    ordered = sorted(rows if set(map(len, rows)) <= {_WIDTH} else [_norm(r) for r in rows],
                     key=operator.itemgetter(0, 1))
    strip = not _has_extension(ordered)   # format 1: each row's unmeasured extension columns come off its end
    if not strip:
        keep = [SAMPLE_COLUMNS.index(c) for c in carried_columns(ordered)]
        if len(keep) < _WIDTH:
            ordered = [tuple(r[j] for j in keep) for r in ordered]
    if ordered and not any("]" in r[0] for r in {r[0]: r for r in ordered}.values()):
        # One C-level encode of all rows, then the row separators turned into newlines: the same bytes as
        # encoding row by row (a device id without "]" cannot contain the separator "],["; nor can it hold
        # a "]" of its own, so the end of each row's text is the row's last columns).
        text = canonical_json(ordered)[1:-1]
        if strip:
            text = text.replace(_NULL_TAIL, "]")
        text = text.replace("],[", "]\n[") + "\n"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    h = hashlib.sha256()
    for r in ordered:
        h.update(canonical_json(list(r[:_BASE_WIDTH] if strip else r)).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _devices_in_order(table) -> list | None:  # noqa: ANN001 - a pyarrow Table
    """The device of each row of a decoded table whose rows are in (device, t) order, no device or time NULL
    (a NaN time is not in order); None otherwise, and for no rows (the digests' callers then sort)."""
    import numpy as np

    n = table.num_rows
    device, t = table.column("device"), table.column("t")
    if not n or device.null_count or t.null_count:
        return None
    devices = device.to_pylist()
    if not all(map(operator.le, devices, itertools.islice(devices, 1, None))):
        return None
    times = blocks.float_values(t)
    same = np.fromiter(map(operator.eq, devices, itertools.islice(devices, 1, None)), dtype=bool, count=n - 1)
    if not np.all((times[1:] >= times[:-1]) | ~same):
        return None
    return devices


def table_digest(table) -> tuple[str, tuple[str, ...]] | None:  # noqa: ANN001 - a pyarrow Table
    """``(digest_normalised(rows), carried_columns(rows))`` of a decoded table of every SAMPLE_COLUMNS column
    (``rows = blocks.table_rows(table)``), computed from its columns: the canonical text of each distinct
    value is made once per column (a segment's 2.7 M values are ~10 % distinct) and the rows' lines are joined
    from those texts — the same bytes as encoding row by row, without a Python tuple per row. What verify
    reads for every segment (tests/test_table_digest.py holds it to the reference on any rows).

    None where the table is outside what this path spells the reference's way: no rows, a NULL device or time,
    a number JSON cannot write (NaN, infinity: the reference refuses it), or rows not in (device, t) order (the
    reference sorts them). The caller then takes the reference."""
    import numpy as np

    devices = _devices_in_order(table)
    if devices is None:
        return None
    n = table.num_rows
    carried = [c for c in SAMPLE_COLUMNS if c in BASE_COLUMNS or table.column(c).null_count < n]
    first = {d: "[" + canonical_json(d) for d in set(devices)}
    texts = [list(map(first.__getitem__, devices))]
    for c in carried[1:]:
        values, valid = blocks.raw_values(table.column(c))
        floats = values.dtype.kind == "f"
        if floats and not np.isfinite(values[valid]).all():
            return None
        keys = values.view(np.int64)[valid] if floats else values[valid]   # a float's bits: -0.0 is not 0.0
        distinct, index = np.unique(keys, return_inverse=True)
        spelled = list(map(float.__repr__, distinct.view(np.float64).tolist())) if floats \
            else list(map(int.__repr__, distinct.tolist()))
        # each distinct value's text, NULL's last; the row's last column closes the row
        closes = c == carried[-1]
        spelled = np.array([*(v + "]" for v in spelled), "null]"] if closes else [*spelled, "null"], dtype=object)
        at = np.full(n, len(spelled) - 1, dtype=np.intp)
        at[valid] = index
        texts.append(spelled[at].tolist())
    text = "\n".join(map(",".join, zip(*texts))) + "\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest(), tuple(carried)


# --- the values digest: the same rows, sealed in a form verify checks without spelling them -----------------
# ``samples_sha256`` is the proof (the canonical text the tenant's verifier re-derives); ``values_sha256``, sealed
# beside it by every writer since it exists, covers the same values in a binary form that a reader holding the
# decoded columns checks with a few array operations instead of spelling every value as text. It is over values,
# not the stored bytes, so an entry's id (the same fact sealed twice is one entry) does not depend on the
# encoder's build (docs/ledger.md, "Sample storage").

VALUES_DOMAIN = "ipledger-sample-values-v1"
_INT_COLUMNS = frozenset({"clock_reasons"})


def values_digest_reference(rows: Iterable[tuple]) -> str:
    """The values digest, as plainly as it can be said: the rows (normalised, stably sorted by (device, t), as
    for ``samples_sha256``) over the columns they carry (:func:`carried_columns`); sha256 of the canonical
    JSON line ``[VALUES_DOMAIN, carried columns, [[device, rows in a row], ...]]`` and a newline, then for each
    carried column after the device: one byte per row (1 measured, 0 NULL), then each row's value as 8 bytes
    little-endian (int64 for clock_reasons, float64 for the rest; 0 where NULL)."""
    import struct

    ordered = sorted((_norm(r) for r in rows), key=operator.itemgetter(0, 1))
    carried = carried_columns(ordered)
    runs: list[list] = []
    for r in ordered:
        if runs and runs[-1][0] == r[0]:
            runs[-1][1] += 1
        else:
            runs.append([r[0], 1])
    h = hashlib.sha256((canonical_json([VALUES_DOMAIN, list(carried), runs]) + "\n").encode("utf-8"))
    for c in carried[1:]:
        j = SAMPLE_COLUMNS.index(c)
        h.update(bytes(r[j] is not None for r in ordered))
        fmt = "<q" if c in _INT_COLUMNS else "<d"
        for r in ordered:
            h.update(struct.pack(fmt, 0 if r[j] is None else r[j]))
    return h.hexdigest()


def values_digest_arrays(devices: Sequence[str], columns: Mapping[str, tuple[Any, Any]]) -> str:
    """The values digest of rows already in (device, t) order, from their columns: ``devices`` the device of
    each row, ``columns`` each carried column after the device (in SAMPLE_COLUMNS order, none other) as
    (numpy values, numpy bool: measured); a NULL's value is ignored. :func:`values_digest_reference`'s
    bytes (tests/test_values_digest.py holds them equal)."""
    import numpy as np

    runs = [[d, sum(1 for _ in g)] for d, g in itertools.groupby(devices)]
    carried = ["device", *columns]
    h = hashlib.sha256((canonical_json([VALUES_DOMAIN, carried, runs]) + "\n").encode("utf-8"))
    for c, (values, valid) in columns.items():
        valid = np.ascontiguousarray(valid, dtype=bool)
        h.update(valid.view(np.uint8))
        dtype = np.dtype("<i8") if c in _INT_COLUMNS else np.dtype("<f8")
        if not valid.all():
            values = np.where(valid, values, 0)
        h.update(np.ascontiguousarray(values, dtype=dtype))   # (the buffer itself where nothing is NULL)
    return h.hexdigest()


def values_digest(rows: Sequence[tuple]) -> str:
    """:func:`values_digest_reference` of normalised rows, through numpy columns (what every writer seals)."""
    import numpy as np

    if isinstance(rows, blocks.Checked) and rows.in_order and rows:
        # a spool's checked rows (intake, one device in time order): their float columns are already built, NaN
        # where None (intake refuses a non-finite value); every column's bytes laid out in one buffer (a
        # collector's segment is short, and a numpy call per column cost more than the hashing)
        carried = carried_columns(rows)
        at = [SAMPLE_COLUMNS.index(c) - 1 for c in carried[1:]]
        measured = rows.values[at]
        valid = ~np.isnan(measured)
        values = np.where(valid, measured, 0.0)
        reasons = carried.index("clock_reasons") - 1
        if values[reasons].max() < 2 ** 53:   # clock_reasons exact as a float: its int64 from there
            n = len(rows)
            laid = np.empty((len(at), 9 * n), dtype=np.uint8)
            laid[:, :n] = valid
            laid[:, n:] = values.astype("<f8", copy=False).view(np.uint8)
            laid[reasons, n:] = values[reasons].astype("<i8").view(np.uint8)
            h = hashlib.sha256((canonical_json([VALUES_DOMAIN, list(carried), [[rows.devices[0], n]]])
                                + "\n").encode("utf-8"))
            h.update(laid)
            return h.hexdigest()
    ordered = sorted(rows, key=operator.itemgetter(0, 1))
    carried = carried_columns(ordered)
    columns = {}
    for c in carried[1:]:
        col = list(map(operator.itemgetter(SAMPLE_COLUMNS.index(c)), ordered))
        if c in _INT_COLUMNS:
            valid = np.fromiter(map(operator.is_not, col, itertools.repeat(None)), dtype=bool, count=len(col))
            columns[c] = (np.array([0 if v is None else v for v in col], dtype=np.int64), valid)
            continue
        values = np.array(col, dtype=np.float64)   # None -> NaN
        valid = ~np.isnan(values)
        if len(col) - int(np.count_nonzero(valid)) != col.count(None):   # a NaN value of its own: not NULL
            valid = np.fromiter(map(operator.is_not, col, itertools.repeat(None)), dtype=bool, count=len(col))
        columns[c] = (values, valid)
    return values_digest_arrays(list(map(operator.itemgetter(0), ordered)), columns)


def table_values_digest(table) -> tuple[str, tuple[str, ...]] | None:  # noqa: ANN001 - a pyarrow Table
    """``(values digest, carried columns)`` of a decoded table of every SAMPLE_COLUMNS column, from its Arrow
    buffers; None where the rows are not in (device, t) order or a device or time is NULL (the caller then
    takes the reference, which sorts)."""
    devices = _devices_in_order(table)
    if devices is None:
        return None
    n = table.num_rows
    carried = [c for c in SAMPLE_COLUMNS if c in BASE_COLUMNS or table.column(c).null_count < n]
    return (values_digest_arrays(devices, {c: blocks.raw_values(table.column(c)) for c in carried[1:]}),
            tuple(carried))


def segment_entry(samples: Sequence[Sample], *, node: str | None, source: str, source_version: str = "",
                  cluster: str | None = None, extra: dict | None = None) -> Entry:
    """The sealing entry for one batch (all samples of one device, or of one import, as the caller chooses)."""
    return segment_entry_rows([sample_row_values(s) for s in samples], node=node, source=source,
                              source_version=source_version, cluster=cluster, extra=extra)


def segment_entry_rows(rows: Sequence[tuple], *, node: str | None, source: str, source_version: str = "",
                       cluster: str | None = None, extra: dict | None = None) -> Entry:
    """:func:`segment_entry` for rows already in normalised SAMPLE_COLUMNS form (importers build them columnar)."""
    devices = sorted({r[0] for r in rows})
    start = min(r[1] for r in rows)
    end = max(r[1] + r[2] for r in rows)
    payload = {"devices": devices, "rows": len(rows), "samples_sha256": digest_normalised(list(rows)),
               "values_sha256": values_digest(rows), "columns": list(carried_columns(rows)), **(extra or {})}
    return make_entry(Kind.TELEMETRY_SEGMENT, start, payload, ts_end=end, node=node, cluster=cluster,
                      device=devices[0] if len(devices) == 1 else None, source=source,
                      source_version=source_version)


def write_segment_in(conn: Connection, samples: Sequence[Sample], entry: Entry,
                     other_entries: Sequence[Entry] = ()) -> AppendResult:
    """Append the segment entry (plus e.g. its unknown intervals) and, if it is new, its samples."""
    return write_segment_rows_in(conn, [sample_row_values(s) for s in samples], entry, other_entries)


def write_segment_rows_in(conn: Connection, rows: Sequence[tuple], entry: Entry,
                          other_entries: Sequence[Entry] = (),
                          columns: Mapping[str, Any] | None = None) -> AppendResult:
    """:func:`write_segment_in` for rows already in normalised SAMPLE_COLUMNS form: the rows are stored as
    one columnar block in `sample_blocks`, with its device-hours in `device_hours` (a segment already stored,
    as a block or as legacy rows, is not stored again — at-least-once shipping).

    ``columns``, when the caller has them, are the same rows as float64 columns in (device, t) order (NaN = None,
    ``clock_reasons`` already whole numbers, a field left out = not measured; "device" an array of its ids): the
    block and the device-hours are then computed from them without going through the row tuples — the same bytes
    (tests/test_import_columns.py holds the two paths equal)."""
    result = append_in(conn, [entry, *other_entries])
    sid = entry.entry_id
    if rows and not _segment_stored(conn, sid):
        block = blocks.encode(rows) if columns is None else blocks.encode_columns(columns)
        conn.execute(text(_INSERT_BLOCK), {"s": sid, "f": block.format, "n": block.rows, "h": block.sha256,
                                     "d": block.data})
        from . import hours   # numpy and the method: only where samples are sealed

        hours.store_in(conn, sid, rows, columns)   # the agents' device-hours, derived from the same rows
    return result


_INSERT_BLOCK = ("INSERT INTO sample_blocks (segment_id, format, rows, sha256, data) VALUES (:s, :f, :n, :h, :d)")


@dataclass(frozen=True)
class Sealed:
    """What many segments store (:func:`seal_segments`): per segment id its block and its device-hours."""

    ids: list
    blocks: list
    hours: list            # (segment id, DeviceHour)


def seal_segments(entries: Sequence[Entry], packs: Sequence[blocks.Packed]) -> Sealed:
    """The blocks and device-hours of many segments (their rows in ``packs``, one span per entry in order;
    an entry listed twice is sealed once), with no database: a shipment computes them before it takes the
    chain's lock. Each is what :func:`write_segment_rows_in` stores for the segment alone
    (tests/test_ship_segments.py holds the rows equal)."""
    from . import hours   # numpy and the method: only where samples are sealed

    seen: set[str] = set()
    keep = []
    for entry in entries:
        keep.append(entry.entry_id not in seen)
        seen.add(entry.entry_id)
    ids = [e.entry_id for e, k in zip(entries, keep) if k]
    if not ids:
        return Sealed([], [], [])
    cols = blocks.columns_from(packs, keep)
    return Sealed(ids, blocks.encode_spans(cols), hours.segments_hours(ids, cols))


def store_sealed_in(conn: Connection, sealed: Sealed) -> int:
    """Insert sealed segments whose entries are already appended, skipping those already stored (as a block
    or as legacy rows: at-least-once shipping). Returns the segments stored."""
    from . import hours

    stored = _segments_stored(conn, sealed.ids)
    new = [(sid, b) for sid, b in zip(sealed.ids, sealed.blocks) if sid not in stored]
    if not new:
        return 0
    conn.execute(text(_INSERT_BLOCK), [{"s": sid, "f": b.format, "n": b.rows, "h": b.sha256, "d": b.data}
                                 for sid, b in new])
    hours.insert_in(conn, [(sid, h) for sid, h in sealed.hours if sid not in stored])
    return len(new)


def _segments_stored(conn: Connection, segment_ids: Sequence[str]) -> set[str]:
    """Which of these segments already have their samples stored (as a block or as legacy rows)."""
    ids = list(dict.fromkeys(segment_ids))
    found: set[str] = set()
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i:i + _IN_CHUNK]
        marks = ",".join(f":s{j}" for j in range(len(chunk)))
        p = {f"s{j}": s for j, s in enumerate(chunk)}
        for table in ("sample_blocks", "samples"):
            found.update(r[0] for r in conn.execute(text(f"SELECT DISTINCT segment_id FROM {table} "
                                                         f"WHERE segment_id IN ({marks})"), p))
    return found


def _segment_stored(conn: Connection, segment_id: str) -> bool:
    return segment_id in _segments_stored(conn, [segment_id])


def write_segment(engine: Engine, samples: Sequence[Sample], entry: Entry,
                  other_entries: Sequence[Entry] = ()) -> AppendResult:
    with write_tx(engine) as conn:
        return write_segment_in(conn, samples, entry, other_entries)


# --- reading ----------------------------------------------------------------------------------------------------

_IN_CHUNK = 500


def iter_sample_pieces(conn: Connection, *, segment_ids: Sequence[str] | None = None,
                       devices: Sequence[str] | None = None, start: float | None = None, end: float | None = None,
                       columns: Sequence[str] = SAMPLE_COLUMNS, check_blocks: bool = False,
                       decoded: DecodedSegments | None = None) -> Iterator[tuple[str, object]]:
    """The one sample reader: (device, pyarrow.Table of ``columns``) pieces, each one device of one segment
    (legacy row segments: one device of a chunk of segments) in (device, t) order, for the samples of these
    segments (all when None) and devices overlapping [start, end).

    Blocks come first, decompressing only the wanted devices and columns; segments without a block are
    read from the legacy `samples` rows. ``check_blocks`` also proves each block against its stored sha256
    (raises :class:`~ledger.telemetry.blocks.BlockError`), which verify wants and receipts leave to verify.

    ``decoded`` (one ``verify``'s :class:`DecodedSegments`): a checked read of whole segments (every column and
    device) keeps each block's decoded pieces there, and a later unchecked read whose segments it all holds
    takes its pieces from there instead of the database, in the order and with the values the plain read gives.
    """
    if segment_ids is not None and not segment_ids:
        return
    cols = list(columns)
    if decoded is not None and not check_blocks and segment_ids is not None and decoded.holds(segment_ids):
        yield from decoded.pieces(segment_ids, devices, start, end, cols)
        return
    keep = (decoded is not None and check_blocks and devices is None and start is None and end is None
            and tuple(cols) == SAMPLE_COLUMNS)
    found: set[str] = set()
    for sid, format_, sha, data in _block_rows(conn, segment_ids):
        found.add(sid)
        if check_blocks and hashlib.sha256(data).hexdigest() != sha:
            raise blocks.BlockError(f"sample block of segment {sid} does not match its sha256")
        pieces = block_pieces(blocks.open_block(format_, data), cols, devices, start, end,
                              checked_as=sid if check_blocks else None)
        if not keep:
            yield from pieces
            continue
        whole = list(pieces)   # every column and device, its labels checked: kept once all of it read
        yield from whole
        decoded.keep(sid, whole)
    legacy = None if segment_ids is None else [s for s in dict.fromkeys(segment_ids) if s not in found]
    yield from _legacy_pieces(conn, legacy, devices, start, end, cols)


def block_pieces(block: blocks.OpenBlock, columns: Sequence[str], devices: Sequence[str] | None = None,
                 start: float | None = None, end: float | None = None, checked_as: str | None = None
                 ) -> Iterator[tuple[str, object]]:
    """The pieces of one opened block that :func:`iter_sample_pieces` yields, in the same order (its ``devices``,
    ``start``, ``end`` and ``columns``); ``checked_as``: the segment id under which each range's device label is
    checked (``check_blocks``)."""
    cols = list(columns)
    need = cols + [c for c in ("t", "dt") if c not in cols and (start is not None or end is not None)]
    for device, table in blocks.decode_open(block, need, devices):
        if checked_as is not None:
            _check_label(checked_as, device, table)
        piece = _in_window(table, start, end)
        if piece.num_rows:
            yield device, piece.select(cols)


def block_rows(conn: Connection, segment_ids: Sequence[str]) -> list[tuple]:
    """(segment id, format, sha256, data) of these segments' blocks, in the order :func:`iter_sample_pieces`
    reads them (a segment stored as legacy rows has none)."""
    return [tuple(r) for r in _block_rows(conn, segment_ids)] if segment_ids else []


class DecodedSegments:
    """One ``verify``'s decoded sample blocks, so that each is decompressed once: its segment check reads every
    segment whole (every column, checked against its sha256 and labels) and keeps the pieces here; the receipt
    replays after it read their segments' samples from here (:func:`iter_sample_pieces`' ``decoded``).

    Only blocks that decoded and passed their checks are kept (a damaged one is read again, and fails again,
    the plain way), and only up to ``max_rows`` samples in all: a bigger ledger reads the rest from the
    database, or, with ``evict_oldest`` (a verify worker, whose chunks of receipts read neighbouring segments),
    the blocks kept first make room. A read is served from here only when every segment it asks for is held; the pieces come in
    the order the database read gives (segments by id, in chunks of ``_IN_CHUNK``; entry ids are lowercase
    hex, ordered alike by every collation), each device's rows windowed and its columns picked as there.
    """

    def __init__(self, max_rows: int = 2_000_000, evict_oldest: bool = False) -> None:
        self.max_rows = max_rows
        self.evict_oldest = evict_oldest
        self.rows = 0
        self._pieces: dict[str, list[tuple[str, Any]]] = {}
        self._refused: set[str] = set()
        # segment id -> (piece, column) -> (float values, where NULL), each made once (read-only) for float_pieces
        self._floats: dict[str, dict[tuple[int, str], tuple[Any, Any]]] = {}
        # The replays' segment entries, read once (ledger.receipts.gather.segments_overlapping), and each one's
        # listed devices, parsed once (gather.listed_devices): they are read-only to the replays.
        self.segment_entries: list[ChainedEntry] | None = None
        self.listed_devices: dict[str, Any] = {}

    def keep(self, segment_id: str, pieces: list[tuple[str, Any]]) -> None:
        """A block's decoded (device, table of every column) pieces, unless over budget or seen twice."""
        if segment_id in self._pieces or segment_id in self._refused:
            self._drop(segment_id)    # two reads of one id: keep neither, read it plainly
            self._refused.add(segment_id)
            return
        n = sum(t.num_rows for _, t in pieces)
        while self.evict_oldest and self._pieces and self.rows + n > self.max_rows:
            self._drop(next(iter(self._pieces)))
        if self.rows + n > self.max_rows:
            self._refused.add(segment_id)
            return
        self._pieces[segment_id] = pieces
        self.rows += n

    def _drop(self, segment_id: str) -> None:
        dropped = self._pieces.pop(segment_id, None)
        if dropped is not None:
            self.rows -= sum(t.num_rows for _, t in dropped)
        self._floats.pop(segment_id, None)

    def holds(self, segment_ids: Sequence[str]) -> bool:
        return all(s in self._pieces for s in segment_ids)

    def fill(self, conn: Connection, segment_ids: Sequence[str]) -> None:
        """Read and keep each of these segments not yet held or refused, the way the segment check reads it
        (its block whole, checked against its sha256 and labels): a verify worker that replays receipts without
        the segment check's blocks decodes each block once for all its receipts, not once per receipt. A segment
        that fails its checks, has no block (legacy rows) or is over budget is refused, and its readers read the
        database plainly, as without this cache (so a damaged block fails, or replays, exactly as it would)."""
        for sid in dict.fromkeys(segment_ids):
            if sid in self._pieces or sid in self._refused:
                continue
            try:
                for _ in iter_sample_pieces(conn, segment_ids=[sid], check_blocks=True, decoded=self):
                    pass
            except Exception:  # noqa: BLE001 - a block that does not decode or check: read plainly, as before
                self._drop(sid)
            if sid not in self._pieces:
                self._refused.add(sid)

    def pieces(self, segment_ids: Sequence[str], devices: Sequence[str] | None, start: float | None,
               end: float | None, cols: list[str]) -> Iterator[tuple[str, object]]:
        """What :func:`iter_sample_pieces` yields for these (all held) segments."""
        wanted = None if devices is None else set(devices)
        ids = list(dict.fromkeys(segment_ids))
        for i in range(0, len(ids), _IN_CHUNK):
            for sid in sorted(ids[i:i + _IN_CHUNK]):
                for device, table in self._pieces[sid]:
                    if wanted is not None and device not in wanted:
                        continue
                    piece = _in_window(table, start, end)
                    if piece.num_rows:
                        yield device, piece.select(cols)


    def float_pieces(self, segment_ids: Sequence[str], devices: Sequence[str] | None, start: float | None,
                     end: float | None, cols: Sequence[str], count_nulls: Sequence[str] = ()
                     ) -> Iterator[tuple[str, list, dict[str, int]]]:
        """What :meth:`pieces` yields for these (all held) segments, as (device, each column's
        :func:`~ledger.telemetry.blocks.float_values`, the NULL count of each ``count_nulls`` column): the same
        rows of the same pieces, from each kept piece's columns converted once (verify replays hundreds of
        receipts over the same pieces; tests/test_verify_decoded.py holds this to :meth:`pieces`). The arrays are
        read-only: they are shared by every read."""
        import numpy as np

        wanted = None if devices is None else set(devices)
        ids = list(dict.fromkeys(segment_ids))
        for i in range(0, len(ids), _IN_CHUNK):
            for sid in sorted(ids[i:i + _IN_CHUNK]):
                for k, (device, table) in enumerate(self._pieces[sid]):
                    if wanted is not None and device not in wanted:
                        continue
                    rows: Any = slice(None)   # _in_window's rows, as an index
                    if start is not None or end is not None:
                        t = self._column(sid, k, table, "t")[0]
                        keep = np.ones(len(t), dtype=bool)
                        if start is not None:
                            keep &= t + self._column(sid, k, table, "dt")[0] > start
                        if end is not None:
                            keep &= t < end
                        hits = np.flatnonzero(keep)
                        if not len(hits):
                            continue
                        if len(hits) < len(t):
                            rows = slice(int(hits[0]), int(hits[0]) + len(hits)) \
                                if hits[-1] - hits[0] + 1 == len(hits) else keep
                    elif not table.num_rows:
                        continue
                    columns = [self._column(sid, k, table, c) for c in cols]
                    nulls = {c: int(np.count_nonzero(null[rows])) for c, (_v, null) in zip(cols, columns)
                             if c in count_nulls}
                    yield device, [v[rows] for v, _null in columns], nulls

    def _column(self, sid: str, k: int, table, name: str) -> tuple[Any, Any]:  # noqa: ANN001
        held = self._floats.setdefault(sid, {})
        got = held.get((k, name))
        if got is None:
            import numpy as np

            column = table.column(name)
            values = blocks.float_values(column)
            null = ~blocks.raw_values(column)[1] if column.null_count else np.zeros(len(values), dtype=bool)
            for a in (values, null):
                a.flags.writeable = False
            got = held[(k, name)] = (values, null)
        return got


def _check_label(segment_id: str, device: str, table) -> None:  # noqa: ANN001
    """A block's layout names the device of each range, and readers pick ranges by that label: it must be
    the device every row of the range holds, or a reader would take one device's samples for another's
    (the segment digest alone covers the rows, not the labels)."""
    if "device" not in table.column_names:
        return
    if every_row_is(table.column("device"), device):
        return   # the common case, read from the column's buffers (pyarrow's unique() costs its compute module)
    found = table.column("device").unique().to_pylist()
    if any(v != device for v in found):
        raise blocks.BlockError(f"sample block of segment {segment_id}: its layout labels rows of "
                                f"{sorted(map(str, found))[:3]} as device {device!r}")


def pieces_in_order(pieces: Sequence[tuple[str, Any]]) -> bool:
    """Whether these (device, table) pieces, concatenated, are already in the order a stable sort by (device, t)
    gives them, so that :func:`read_samples` need not sort (pyarrow's sort costs its compute module): every row
    of a piece holds its device, no time is NULL or NaN, and (device, t) never decreases. False says only "sort
    them" (tests/test_verify_decoded.py holds the unsorted tables equal to the sorted ones)."""
    import numpy as np

    last: tuple[str, float] | None = None
    for device, table in pieces:
        names = table.column_names
        if "device" not in names or "t" not in names or table.column("t").null_count \
                or not every_row_is(table.column("device"), device):
            return False
        t = blocks.float_values(table.column("t"))
        if not len(t):
            continue
        if bool(np.isnan(t).any()) or not bool(np.all(t[1:] >= t[:-1])):
            return False
        if last is not None and (device < last[0] or (device == last[0] and float(t[0]) < last[1])):
            return False
        last = (device, float(t[-1]))
    return True


def every_row_is(column, value: str) -> bool:  # noqa: ANN001 - a pyarrow (Chunked)Array
    """Whether every row of a string column holds ``value`` (no NULL), read from its Arrow buffers: each row's
    length is the value's and the rows' bytes are the value's repeated. False also where the column is of another
    type (the caller then asks pyarrow itself; tests/test_verify_decoded.py holds the two to the same answer)."""
    import numpy as np

    want = value.encode("utf-8")
    for arr in getattr(column, "chunks", [column]):
        n = len(arr)
        if str(arr.type) != "string" or arr.null_count:
            return False
        if not n:
            continue
        _validity, offsets, data = arr.buffers()
        ends = np.frombuffer(offsets, dtype=np.int32, count=n + 1, offset=arr.offset * 4)
        if not bool(np.all(np.diff(ends) == len(want))):
            return False
        if want and memoryview(data)[int(ends[0]):int(ends[-1])].tobytes() != want * n:
            return False
    return True


def _block_rows(conn: Connection, segment_ids: Sequence[str] | None) -> Iterator[tuple]:
    sql = "SELECT segment_id, format, sha256, data FROM sample_blocks"
    if segment_ids is None:
        yield from conn.execute(text(sql + " ORDER BY segment_id"))
        return
    ids = list(dict.fromkeys(segment_ids))
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i:i + _IN_CHUNK]
        marks = ",".join(f":s{j}" for j in range(len(chunk)))
        yield from conn.execute(text(f"{sql} WHERE segment_id IN ({marks}) ORDER BY segment_id"),
                                {f"s{j}": s for j, s in enumerate(chunk)})


def _in_window(table, start: float | None, end: float | None):  # noqa: ANN001, ANN202
    """The rows overlapping [start, end); numpy, not pyarrow.compute (whose scalar handling imports pandas)."""
    if start is None and end is None:
        return table
    import numpy as np

    t = blocks.float_values(table.column("t"))
    keep = np.ones(len(t), dtype=bool)
    if start is not None:
        keep &= t + blocks.float_values(table.column("dt")) > start
    if end is not None:
        keep &= t < end
    hits = np.flatnonzero(keep)
    if len(hits) == len(t):
        return table  # a whole-run read keeps every row: no copy
    if not len(hits) or hits[-1] - hits[0] + 1 == len(hits):
        return table.slice(int(hits[0]) if len(hits) else 0, len(hits))  # rows sorted by t: one run
    import pyarrow as pa

    return table.filter(pa.array(keep))


def _legacy_pieces(conn: Connection, segment_ids: Sequence[str] | None, devices: Sequence[str] | None,
                   start: float | None, end: float | None, cols: list[str]) -> Iterator[tuple[str, object]]:
    """Pieces from segments stored as rows of the `samples` table (ledgers written before sample blocks)."""
    import pyarrow as pa

    if segment_ids is not None and not segment_ids:
        return
    where, params = ["segment_id NOT IN (SELECT segment_id FROM sample_blocks)"], {}
    if devices:
        where.append("device IN (" + ",".join(f":d{i}" for i in range(len(devices))) + ")")
        params.update({f"d{i}": d for i, d in enumerate(devices)})
    if start is not None:
        where.append("t + dt > :start")
        params["start"] = start
    if end is not None:
        where.append("t < :end")
        params["end"] = end
    chunks = [None] if segment_ids is None else [segment_ids[i:i + _IN_CHUNK] for i in range(0, len(segment_ids), _IN_CHUNK)]
    schema = blocks.arrow_schema()
    for chunk in chunks:
        cond, p = list(where), dict(params)
        if chunk is not None:
            cond.append("segment_id IN (" + ",".join(f":s{i}" for i in range(len(chunk))) + ")")
            p.update({f"s{i}": s for i, s in enumerate(chunk)})
        sql = text(f"SELECT {', '.join(BASE_COLUMNS)} FROM samples WHERE {' AND '.join(cond)} ORDER BY device, t")
        rows = [_norm(r) for r in conn.execute(sql, p)]
        if not rows:
            continue
        table = pa.Table.from_arrays([pa.array(v, type=f.type) for f, v in zip(schema, zip(*rows))], schema=schema)
        lo = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i][0] != rows[lo][0]:
                yield rows[lo][0], table.slice(lo, i - lo).select(cols)
                lo = i


def read_samples(engine_or_conn, *, segment_ids: Sequence[str] | None = None,  # noqa: ANN001, ANN201
                 devices: Sequence[str] | None = None, start: float | None = None, end: float | None = None,
                 columns: Sequence[str] = SAMPLE_COLUMNS, check_blocks: bool = False,
                 decoded: DecodedSegments | None = None):
    """:func:`iter_sample_pieces` as one pyarrow Table ordered by (device, t) (a stable sort)."""
    import pyarrow as pa

    def _q(conn: Connection):  # noqa: ANN202
        labelled = list(iter_sample_pieces(conn, segment_ids=segment_ids, devices=devices, start=start, end=end,
                                           columns=columns, check_blocks=check_blocks, decoded=decoded))
        if not labelled:
            full = blocks.arrow_schema()
            return pa.Table.from_arrays([pa.array([], type=full.field(c).type) for c in columns], names=list(columns))
        table = pa.concat_tables([t for _, t in labelled])
        keys = [(c, "ascending") for c in ("device", "t") if c in columns]
        if len(labelled) < 2 or not keys or pieces_in_order(labelled):
            return table   # (the sort would leave every row where it is)
        return table.sort_by(keys)

    if is_connection(engine_or_conn):
        return _q(engine_or_conn)
    with engine_or_conn.connect() as conn:
        return _q(conn)


def load_samples(engine_or_conn, devices: Sequence[str] | None = None, start: float | None = None,  # noqa: ANN001
                 end: float | None = None, segment_ids: Sequence[str] | None = None) -> list[Sample]:
    """Samples overlapping [start, end) for these devices, ordered by (device, t)."""
    table = read_samples(engine_or_conn, segment_ids=segment_ids, devices=devices, start=start, end=end)
    return [Sample(*r) for r in blocks.table_rows(table)]


def segment_samples(conn: Connection, ce: ChainedEntry, decoded: DecodedSegments | None = None,
                    canonical: bool = False) -> tuple[Any, ChainProblem | None]:
    """A sealed segment's stored samples (an Arrow table, every column) read once for ``verify``, and the
    problem with them if they no longer hash to what its entry recorded (block or legacy rows alike); the table
    is None when they cannot be read at all. ``decoded``: keep its decoded block there for the replays.

    A segment whose entry seals ``values_sha256`` is checked against it (the same values, without spelling each
    as canonical text); one without it (written before it existed) against ``samples_sha256``. ``canonical``
    (``verify --deep``): ``samples_sha256`` re-derived for every segment, and ``values_sha256`` too where sealed."""
    sid = ce.entry.entry_id
    data = ce.entry.data
    sealed_values = data.get("values_sha256")
    try:
        table = read_samples(conn, segment_ids=[sid], check_blocks=True, decoded=decoded)
        digests = []   # (the digest re-derived, the one the entry seals), carried columns
        if sealed_values is None or canonical:
            digests.append((_stored_digest(table, table_digest, digest_normalised), data.get("samples_sha256")))
        if sealed_values is not None:
            digests.append((_stored_digest(table, table_values_digest, values_digest_reference), sealed_values))
    except blocks.BlockError as exc:
        return None, ChainProblem(ce.seq, sid, str(exc))
    except Exception as exc:  # noqa: BLE001 - any decode failure (LZ4, Arrow, driver) is a named problem
        # Stored bytes no honest writer produces (text that is not UTF-8, a NaN sample, a value of the wrong
        # type): the segment is named instead of verify stopping with a traceback.
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return None, ChainProblem(ce.seq, sid, f"stored samples cannot be read: {reason}")
    if table.num_rows and any(got != sealed for (got, _carried), sealed in digests):
        return table, ChainProblem(ce.seq, sid, "samples do not match the segment digest")
    carried = digests[0][0][1]
    listed = data.get("columns")
    if table.num_rows and [c for c in listed or () if c in EXTENSION_METRICS] != list(carried[_BASE_WIDTH:]):
        return table, ChainProblem(ce.seq, sid, "samples carry other columns than the segment lists")
    if not table.num_rows and data.get("rows"):
        return table, ChainProblem(ce.seq, sid, "samples of this segment are missing")
    return table, None


def _stored_digest(table, fast, reference) -> tuple[str | None, tuple[str, ...]]:  # noqa: ANN001
    """(digest, carried columns) of a decoded table: ``fast`` from its columns, else ``reference`` over its rows."""
    got = fast(table)
    if got is None:   # the reference: every row as a tuple
        rows = blocks.table_rows(table) if table.num_rows else []
        got = (reference(rows), carried_columns(rows)) if rows else (None, BASE_COLUMNS)
    return got
