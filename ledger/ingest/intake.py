"""Spool records as untrusted input: every field checked before it is chained, or the record refused with a reason.

The spool is written by the Slurm hooks (root), the node collector (its own user) and whatever else can write
to that directory; the shipper (often root) must not take any of it on trust (docs/security.md). A record
becomes an :class:`~ledger.chain.entries.Entry` only if

* its kind is an *observation* (:data:`SPOOL_KINDS`): adjustments, contract versions, resolutions, issued
  receipts and finding verdicts come only through the CLI's own write path, never from a spool;
* its ``source`` is not one the CLI reserves for itself (``ipledger.*``, ``agent.*``, ``operator``, ``cli``) or for the accounting
  database's view (``sacct``);
* every key field has its type (text or null; ``run`` a small non-negative integer; ``job_id`` text or a
  non-negative integer), every text is valid Unicode that encodes as UTF-8, without NUL, and fits its
  column (:data:`MAX_TEXT`);
* every time parses, is timezone-aware and lies in a sane range (:data:`EARLIEST`..:data:`LATEST`), and an
  interval does not end before it starts;
* the payload is a JSON object, bounded in size, every number finite, and the fields receipts read
  have their types (:data:`_PAYLOAD_TYPES`);
* a segment's embedded sample rows have the samples table's shape and types, and hash to the digest its
  payload records (so a bad segment cannot make ``verify`` fail on an honest ledger later).

:func:`check_record` is pure: a record in, an Entry (and its checked sample rows) out, or :class:`Refused`.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ..chain.canonical import canonical_ts_match, datetime_from_iso, canonical_json, format_ts, ts_to_epoch
from ..chain.entries import ALL_KINDS, Entry, entry_id_of_fields
from ..chain.kinds import Kind

# What a spool may hold: observations. Everything else in the vocabulary is an operator's (or the ledger's own)
# decision, recorded by the CLI straight into the ledger.
SPOOL_KINDS = frozenset({
    Kind.ALLOCATION_STARTED, Kind.ALLOCATION_ENDED, Kind.ALLOCATION_SUSPENDED, Kind.ALLOCATION_RESUMED,
    Kind.ALLOCATION_REQUEUED, Kind.DEVICE_BOUND, Kind.TELEMETRY_SUMMARY, Kind.TELEMETRY_SEGMENT,
    Kind.UNKNOWN_INTERVAL, Kind.PROGRESS, Kind.HOOK_ERROR, Kind.TOOL_OUTPUT,
})
RESERVED_SOURCE_PREFIXES = ("ipledger.", "agent.")   # and RESERVED_SOURCES
# The CLI's own sources, and "sacct": the accounting database's view (the final state a receipt trusts most) is
# recorded by ship/reconcile straight into the ledger, never taken from a spool a node may write.
RESERVED_SOURCES = ("operator", "cli", "sacct")

EARLIEST = 946_684_800.0      # 2000-01-01T00:00:00Z: no GPU job this ledger accounts ran before it
LATEST = 4_102_444_800.0      # 2100-01-01T00:00:00Z: a bound that needs no clock (the pure checks)
MAX_AHEAD_S = 86_400.0        # how far past the shipper's clock a time may lie (node clock skew)
# Characters a key field may hold: the widths of the entries table's columns (schema/versions/0001), which
# PostgreSQL enforces; a longer value would fail its whole batch's insert on every ship.
MAX_TEXT = {"cluster": 128, "job_id": 128, "node": 256, "device": 128, "source": 128, "source_version": 64}
MAX_DEVICE_LABEL = 1024       # a sample row's device (stored inside the block, not in a column)
MAX_PAYLOAD = 1 << 20         # bytes of canonical payload JSON
MAX_INT = 1 << 63
MAX_RUN = 1 << 31
_TEXT_FIELDS = ("cluster", "node", "device", "source", "source_version")
_TIME_FIELDS = ("ts", "ts_end", "recorded_at")

# Payload fields receipts and views read, and the types they take (None is always allowed).
_PAYLOAD_TYPES: dict[str, dict[str, tuple]] = {
    Kind.ALLOCATION_STARTED: {"account": (str,), "partition": (str,), "qos": (str,), "user": (str,)},
    Kind.DEVICE_BOUND: {"uuid": (str,), "node": (str,), "index": (int,), "sku": (str,), "vendor": (str,)},
    Kind.UNKNOWN_INTERVAL: {"cause": (str,), "scope": (str,)},
    Kind.TELEMETRY_SEGMENT: {"devices": (list,), "rows": (int,), "samples_sha256": (str,)},
    Kind.TOOL_OUTPUT: {"step": (str,), "calls": (list,), "context": (dict,)},
}
# Payload fields that must be present (not null): a receipt groups unknown time by its cause, and an interval
# without one would not sort beside the others (a null cause once made that run's receipt fail).
_PAYLOAD_REQUIRED: dict[str, tuple[str, ...]] = {Kind.UNKNOWN_INTERVAL: ("cause",)}


class Refused(ValueError):
    """A record the shipper will not chain; the message is the one-line reason (field named)."""


def _text(name: str, v: Any) -> None:
    if v is None:
        return
    if type(v) is not str:
        raise Refused(f"{name}: expected text or null, got {type(v).__name__}")
    limit = MAX_TEXT.get(name, MAX_DEVICE_LABEL)
    if len(v) > limit:
        raise Refused(f"{name}: longer than {limit} characters")
    if "\x00" in v:  # PostgreSQL text cannot hold NUL: the whole batch would fail to insert, every time
        raise Refused(f"{name}: contains a NUL character")
    _utf8(name, v)


def _utf8(name: str, v: str) -> None:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \udXXX escape: not text any database stores as such
        raise Refused(f"{name}: not valid Unicode (lone surrogate)") from None


def canonical_epoch(v: str) -> float | None:
    """Epoch seconds of a time in the writers' canonical spelling (one parse), None for any other text;
    ValueError for canonical-looking text that is no date. The plain reference of :func:`_canonical_epoch_memo`."""
    if canonical_ts_match(v) is None:
        return None
    return datetime_from_iso(v[:-1] + "+00:00").timestamp()


# Canonical times already parsed by this process. One epilog's records repeat a few instants (the run's start
# and end, recorded_at), so most time fields are a dict lookup instead of a parse; bounded, and only what
# canonical_epoch returned is kept (tests/test_bench_fastpaths.py holds the two to each other).
_EPOCHS: dict[str, float] = {}
_EPOCHS_MAX = 4096


def _canonical_epoch_memo(v: str) -> float | None:
    t = _EPOCHS.get(v)
    if t is None:
        t = canonical_epoch(v)
        if t is not None:
            if len(_EPOCHS) >= _EPOCHS_MAX:
                _EPOCHS.clear()
            _EPOCHS[v] = t
    return t


def _time(name: str, v: Any, latest: float = LATEST) -> tuple[str, float] | None:
    """(canonical text, epoch seconds) of a time field, or None when absent; :class:`Refused` otherwise."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise Refused(f"{name}: expected an RFC 3339 time, got {type(v).__name__}")
    try:
        t = _canonical_epoch_memo(v) if type(v) is str else None
        if t is not None:  # the writers' spelling
            text = v
        else:
            t = ts_to_epoch(v) if isinstance(v, str) else float(v)
            if not math.isfinite(t):
                raise ValueError("not finite")
            text = format_ts(v)
    except (ValueError, OverflowError, OSError, TypeError) as exc:
        raise Refused(f"{name}: not a time ({str(exc)[:80]})") from None
    if not EARLIEST <= t < latest:
        raise Refused(f"{name}: {str(v)[:40]} is before 2000 or more than a day ahead of the shipper's clock")
    return text, t


def _refuse_constant(c: str) -> None:
    raise Refused(f"payload: {c} is not a finite number")


# json.loads with an option builds a JSONDecoder per call (≈ 1 µs, a tenth of a record's check): built once.
_PAYLOAD_DECODE = json.JSONDecoder(parse_constant=_refuse_constant).decode


def decode_payload(raw: str) -> Any:
    """``json.loads(raw, parse_constant=_refuse_constant)`` (its reference in tests/test_bench_fastpaths.py),
    through the decoder built once."""
    if raw.startswith("\ufeff"):  # what json.loads refuses before decoding
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
    return _PAYLOAD_DECODE(raw)


def _payload(kind: str, raw: Any) -> tuple[dict, str]:
    """The payload object and its canonical text (which refuses NaN and Infinity)."""
    if isinstance(raw, str):
        if len(raw) > MAX_PAYLOAD:
            raise Refused(f"payload: larger than {MAX_PAYLOAD} bytes")
        try:
            raw = decode_payload(raw)
        except Refused:
            raise
        except (ValueError, RecursionError) as exc:
            raise Refused(f"payload: not JSON ({str(exc)[:80]})") from None
    if raw is None:
        raw = {}
    if type(raw) is not dict:
        raise Refused(f"payload: expected an object, got {type(raw).__name__}")
    for key in _PAYLOAD_REQUIRED.get(kind, ()):
        if raw.get(key) is None:
            raise Refused(f"payload.{key}: missing")
    for key, types in _PAYLOAD_TYPES.get(kind, {}).items():
        v = raw.get(key)
        if v is not None and (type(v) not in types):
            raise Refused(f"payload.{key}: expected {types[0].__name__}, got {type(v).__name__}")
    if kind == Kind.DEVICE_BOUND and raw.get("index") is not None and not 0 <= raw["index"] < MAX_RUN:
        raise Refused("payload.index: out of range")
    try:
        text = canonical_json(raw)
    except ValueError as exc:  # allow_nan=False: a NaN or an infinity anywhere in it
        raise Refused(f"payload: {str(exc)[:80]}") from None
    except RecursionError:
        raise Refused("payload: nested too deeply") from None
    if len(text) > MAX_PAYLOAD:
        raise Refused(f"payload: larger than {MAX_PAYLOAD} bytes")
    return raw, text


def check_record(rec: Any, now: float | None = None) -> tuple[Entry, list | None]:
    """The entry a spool record stands for, and its checked sample rows (segments only); :class:`Refused`
    when any field fails (the reason names it). ``now``: the shipper's clock (times more than
    :data:`MAX_AHEAD_S` past it are refused); None checks against :data:`LATEST` only.

    The entry is the one :func:`ledger.chain.entries.entry_from_record` builds from a sound record (same fields,
    same id), built here from the already checked values instead of parsing them twice."""
    latest = LATEST if now is None else min(LATEST, now + MAX_AHEAD_S)
    if type(rec) is not dict:
        raise Refused(f"record: expected an object, got {type(rec).__name__}")
    kind = rec.get("kind")
    if type(kind) is not str:
        raise Refused("kind: missing or not text")
    if kind not in SPOOL_KINDS:
        if kind in ALL_KINDS:
            raise Refused(f"kind: {kind!r} is not an observation; it is recorded only through the ipledger CLI")
        raise Refused(f"kind: {kind[:40]!r} is not an entry kind")
    get = rec.get
    for name in _TEXT_FIELDS:
        v = get(name)
        # plain ASCII within its width passes _text's checks (held to it in tests/test_bench_fastpaths.py);
        # anything else gets them all
        if v is not None and not (type(v) is str and len(v) <= MAX_TEXT[name] and v.isascii() and "\x00" not in v):
            _text(name, v)
    source = get("source") or ""
    if source in RESERVED_SOURCES or source.startswith(RESERVED_SOURCE_PREFIXES):
        raise Refused(f"source: {source[:40]!r} is reserved for the ipledger CLI")
    job_id = get("job_id")
    if type(job_id) is int:
        if not 0 <= job_id < MAX_INT:
            raise Refused("job_id: integer out of range")
        job_id = str(job_id)
    else:
        _text("job_id", job_id)
    run = get("run")
    if run is not None and (type(run) is not int or not 0 <= run < MAX_RUN):
        raise Refused(f"run: expected a non-negative integer below 2^31, got {str(run)[:40]}")
    ts = _time("ts", get("ts"), latest)
    if ts is None:
        raise Refused("ts: missing")
    ts_end = _time("ts_end", get("ts_end"), latest)
    recorded = _time("recorded_at", get("recorded_at"), latest)
    if ts_end is not None and ts_end[1] < ts[1]:
        raise Refused("ts_end: before ts")
    payload, payload_text = _payload(kind, get("payload"))
    fields = (kind, ts[0], payload_text, None if ts_end is None else ts_end[0],
              None if recorded is None else recorded[0], get("cluster"), job_id, run, get("node"), get("device"),
              source or "ipledger", get("source_version") or "")
    try:
        entry = Entry(*fields, entry_id_of_fields(fields))
    except UnicodeEncodeError:  # a lone surrogate inside the payload
        raise Refused("payload: not valid Unicode (lone surrogate)") from None
    rows = get("samples")
    if kind == Kind.TELEMETRY_SEGMENT or rows is not None:
        rows = _segment_rows(kind, payload, rows, latest)
    return entry, rows


def _segment_rows(kind: str, payload: Mapping, rows: Any, latest: float) -> list[tuple]:
    """Embedded rows checked cell by cell and against the digest the segment entry seals; returned in the
    normalised form the ledger stores (``telemetry.sealed._norm``)."""
    from ..telemetry.sealed import digest_normalised, normalised, values_digest

    if kind == Kind.TELEMETRY_SEGMENT and not rows:
        # a segment entry seals rows that ship with it; one without them would be a segment whose samples
        # are missing, which verify reports on the ledger for ever after
        raise Refused("samples: a telemetry_segment from a spool carries its sample rows")
    if kind != Kind.TELEMETRY_SEGMENT:
        raise Refused(f"samples: only a telemetry_segment carries sample rows, not {kind}")
    if type(rows) is not list:
        raise Refused("samples: expected rows of the samples table")
    rows = _widened(rows)
    sound, cols, values = _plain_check(rows, latest)
    if not sound:
        check_rows(rows, latest)   # names the first cell that fails (or finds none: the shortcut is stricter)
    # every column of its one type already (what a collector writes): each row as it is, else each normalised
    out = list(map(tuple, rows)) if sound == _EXACT else [normalised(r) for r in rows]
    if sound:   # the columns the check built, for the shipper's numpy hand-over (telemetry.blocks.pack)
        from ..telemetry.blocks import Checked

        t = values[0]
        out = Checked(out, cols[0], values, len(set(cols[0])) == 1 and bool((t[1:] >= t[:-1]).all()))
    if digest_normalised(out) != payload.get("samples_sha256"):
        raise Refused("samples: rows do not hash to the segment's samples_sha256")
    # optional (collectors before it leave it out); where given it must describe these rows, or verify would
    # name this honest segment later
    if "values_sha256" in payload and values_digest(out) != payload["values_sha256"]:
        raise Refused("samples: rows do not hash to the segment's values_sha256")
    if payload.get("rows") != len(rows):
        raise Refused("samples: row count differs from the segment's rows")
    return out


def _widened(rows: list) -> list:
    """A collector written before sample block format 2 ships rows of the base columns only: each such row
    gets the extension columns as not measured (the segment's digest is over the base columns either way)."""
    from ..telemetry.model import BASE_COLUMNS, EXTENSION_METRICS

    base = len(BASE_COLUMNS)
    if rows and type(rows[0]) is list and len(rows[0]) == base \
            and all(type(r) is list and len(r) == base for r in rows):
        pad = [None] * len(EXTENSION_METRICS)
        return [r + pad for r in rows]
    return rows


def check_rows(rows: list, latest: float) -> None:
    """Every row of a segment checked cell by cell: the plain reference; :class:`Refused` names the first
    cell that fails."""
    from ..telemetry.model import SAMPLE_COLUMNS

    width = len(SAMPLE_COLUMNS)
    for i, r in enumerate(rows):
        if type(r) is not list or len(r) != width:
            raise Refused(f"samples[{i}]: expected a row of {width} values")
        if type(r[0]) is not str:
            raise Refused(f"samples[{i}].device: expected text")
        _text(f"samples[{i}].device", r[0])
        for name, v in zip(SAMPLE_COLUMNS[1:], r[1:]):
            if v is None and name not in ("t", "dt"):
                continue
            # the bound before isfinite: an integer beyond a float's range (JSON allows one) is refused, not
            # an OverflowError out of the shipper
            if type(v) not in (int, float) or abs(v) >= MAX_INT or not math.isfinite(v):
                raise Refused(f"samples[{i}].{name}: expected a finite number, got {str(v)[:40]}")
            if name == "clock_reasons" and (type(v) is not int or v < 0):
                raise Refused(f"samples[{i}].clock_reasons: expected a non-negative integer")
        if not EARLIEST <= r[1] < latest:
            raise Refused(f"samples[{i}].t: before 2000 or more than a day ahead of the shipper's clock")
        if not 0 <= r[2] < 86_400 * 366:
            raise Refused(f"samples[{i}].dt: out of range")


_EXACT = 2                    # _plain_check: sound, and every value already of its column's one type
_EXACT_TYPES = (frozenset({float}), frozenset({int, type(None)}), frozenset({float, type(None)}))
_NUMBER = frozenset({int, float})
_NUMBER_OR_NONE = frozenset({int, float, type(None)})
_INT_OR_NONE = frozenset({int, type(None)})


def _plain_check(rows: list, latest: float) -> tuple[int, list | None, Any]:
    """Non-zero only where :func:`check_rows` passes every row: the same checks a column at a time, in C-level
    passes (a collector's hour is 10^6 rows); :data:`_EXACT` where, besides, every value already has its
    column's one type (``telemetry.sealed._norm`` would change nothing). 0 does not refuse: the caller runs
    the reference for the reason. tests/test_ship_segments.py holds it to that. Also returns the columns and
    the values (every column but the device, one float64 row each, None as NaN) when it passes."""
    from ..telemetry.model import SAMPLE_COLUMNS

    width = len(SAMPLE_COLUMNS)
    if not all(type(r) is list and len(r) == width for r in rows):
        return 0, None, None
    cols = list(zip(*rows))
    if set(map(type, cols[0])) != {str}:
        return 0, None, None
    try:
        for d in set(cols[0]):
            _text("samples[0].device", d)
    except Refused:
        return 0, None, None
    exact, nones = True, []
    for j, (name, col) in enumerate(zip(SAMPLE_COLUMNS[1:], cols[1:]), start=1):
        kinds = set(map(type, col))
        if not kinds <= (_NUMBER if j <= 2 else _INT_OR_NONE if name == "clock_reasons" else _NUMBER_OR_NONE):
            return 0, None, None
        exact = exact and kinds <= _EXACT_TYPES[0 if j <= 2 else 1 if name == "clock_reasons" else 2]
        nones.append(col.count(None) if type(None) in kinds else 0)
    # the values, all numbers or None now, as one float array (None -> NaN): an int past a float's range
    # overflows, one near 2^63 may round up to it (then refused here, and the reference decides)
    import numpy as np

    try:
        a = np.array(cols[1:], dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        return 0, None, None
    nan = np.isnan(a)
    if (nan.sum(axis=1) != nones).any() or np.isinf(a).any():   # a NaN that was no None, an infinity
        return 0, None, None
    z = np.where(nan, 0.0, a)
    t, dt = z[0], z[1]
    if not (np.abs(z).max() < MAX_INT and (z[2] >= 0).all() and EARLIEST <= t.min() and t.max() < latest
            and 0 <= dt.min() and dt.max() < 86_400 * 366):
        return 0, None, None
    return (_EXACT if exact else 1), cols, a


def sound_time(v: Any, now: float | None = None) -> str | None:
    """``v`` as a canonical time if it passes the checks, else None (for keying a refusal, never raises)."""
    try:
        t = _time("t", v, LATEST if now is None else min(LATEST, now + MAX_AHEAD_S))
        return None if t is None else t[0]
    except Refused:
        return None


def sound_key(rec: Mapping) -> dict:
    """The key fields of a refused record, so its refusal can be shown on the run it names: node and device
    each where sound, and the run key (cluster, job_id, run) only when all three are (a partial key would
    name a run that does not exist)."""
    out: dict = {}
    for name in ("node", "device"):
        if rec.get(name) is None or _ok_text(name, rec.get(name)):
            out[name] = rec.get(name)
    job_id, run, cluster = rec.get("job_id"), rec.get("run"), rec.get("cluster")
    job_ok = (type(job_id) is int and 0 <= job_id < MAX_INT) or (type(job_id) is str
                                                                  and _ok_text("job_id", job_id))
    run_ok = run is None or (type(run) is int and 0 <= run < MAX_RUN)
    if job_ok and run_ok and (cluster is None or _ok_text("cluster", cluster)):
        out.update(cluster=cluster, job_id=str(job_id), run=run or 0)
    return out


def _ok_text(name: str, v: Any) -> bool:
    try:
        _text(name, v)
        return True
    except Refused:
        return False
