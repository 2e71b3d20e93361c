"""Canonical encodings: the one byte form of JSON, of timestamps and of entry ids that every hash in ipledger
is taken over.

Standard library only, and light to import: the Slurm hooks write their entries with this module, so it loads
neither :mod:`json` (whose decoder imports ``re``), :mod:`hashlib` (OpenSSL) nor :mod:`datetime` until a
function needs them. The JSON encoder is the json module's own C encoder (``_json``), called as
``json.JSONEncoder.encode`` calls it; tests/test_hook_fastpath.py holds every function here to the json
module and to datetime with hypothesis.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (strings here): typing stays off the hook's import path
    import datetime as _dt
    from typing import Any, Callable

ID_DOMAIN = "ipledger-entry-id-v1"

try:  # the digest is the same from any implementation; these avoid loading OpenSSL (≈ 3 ms) in the hooks
    # by version, not by trying: a failed import searches every directory on sys.path first (≈ 0.1 ms)
    if sys.version_info >= (3, 12):
        from _sha2 import sha256
    else:
        from _sha256 import sha256
except ImportError:  # pragma: no cover - a Python built without them
    from hashlib import sha256
try:
    from _json import encode_basestring as _c_str, encode_basestring_ascii as _c_str_ascii
    from _json import make_encoder as _c_make_encoder, make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - a Python without the json accelerator: json itself, below
    _c_make_encoder = _c_make_scanner = None


def _not_serializable(o: object) -> None:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")  # = JSONEncoder.default


def json_encoder(*, ensure_ascii: bool, allow_nan: bool, item_sep: str, key_sep: str) -> Callable[[Any], str]:
    """``json.JSONEncoder(sort_keys=True, ...).encode``, on the C encoder that method uses."""
    if _c_make_encoder is None:  # pragma: no cover
        import json

        return json.JSONEncoder(sort_keys=True, ensure_ascii=ensure_ascii, allow_nan=allow_nan,
                                separators=(item_sep, key_sep)).encode
    enc_str = _c_str_ascii if ensure_ascii else _c_str

    def encode(o: Any) -> str:
        if isinstance(o, str):
            return enc_str(o)
        # A fresh markers dict per call (check_circular), as JSONEncoder.iterencode makes one.
        return "".join(_c_make_encoder({}, _not_serializable, enc_str, None, key_sep, item_sep, True, False,
                                       allow_nan)(o, 0))

    return encode


# JSON with sorted keys, no whitespace, UTF-8 kept as is, NaN/Infinity refused (ValueError). Floats use
# Python's shortest round-trip repr, which is the same in every process and platform.
canonical_json = json_encoder(ensure_ascii=False, allow_nan=False, item_sep=",", key_sep=":")


class _ScanContext:
    """What json.JSONDecoder hands the C scanner (strict, no hooks, int/float, NaN/Infinity constants)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo: dict = {}


_scan = _c_make_scanner(_ScanContext()) if _c_make_scanner is not None else None
_WS = " \t\n\r"


def loads(text: str) -> Any:
    """``json.loads(text)`` for text (ValueError on bad input, as json.JSONDecodeError is one), without
    importing json: what the hooks read back (their own state, a job's progress marks)."""
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(text)
    n = len(text)
    i = 0
    while i < n and text[i] in _WS:
        i += 1
    try:
        obj, end = _scan(text, i)
    except StopIteration:
        raise ValueError(f"Expecting value at char {i}") from None
    except SystemError:
        # CPython 3.11's scanner reports an error inside a string (a raw control character) by looking up
        # json.decoder.JSONDecodeError in sys.modules; without json imported it returns NULL with no
        # exception set. The plain json module then gives the error it should have (a ValueError).
        import json

        return json.loads(text)
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"Extra data at char {end}")
    return obj


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return sha256(data).hexdigest()


# The identity encoding's fields, in order: everything that says *what* was observed, nothing about *when it
# was written*. Defined once; ledger.chain.entries reads stored rows and entries through this list too.
ID_COLUMNS = ("kind", "ts", "ts_end", "cluster", "job_id", "run", "node", "device", "payload", "source")


def identity_encoding(values: Any) -> str:
    """The canonical text an entry id hashes, from the values of :data:`ID_COLUMNS` in that order."""
    return canonical_json([ID_DOMAIN, *values])


def entry_id(kind: str, ts: str, ts_end: str | None, cluster: str | None, job_id: str | None, run: int | None,
             node: str | None, device: str | None, payload: str, source: str) -> str:
    """Identity of a fact from its canonical fields (:data:`ID_COLUMNS`; docs/ledger.md, "Canonical encoding")."""
    ident = identity_encoding((kind, ts, ts_end, cluster, job_id, run, node, device, payload, source))
    return "e" + sha256(ident.encode("utf-8")).hexdigest()[:39]


# An entry's fields in their stored order (ledger.chain.entries.Entry's, and a spool record's keys).
ENTRY_FIELDS = ("kind", "ts", "payload", "ts_end", "recorded_at", "cluster", "job_id", "run", "node", "device", "source",
                "source_version", "entry_id")


def entry_fields(kind: str, ts: Any, payload: Any = None, ts_end: Any = None, recorded_at: Any = None,
                 cluster: str | None = None, job_id: str | int | None = None, run: int | None = None,
                 node: str | None = None, device: str | None = None, source: str = "ipledger",
                 source_version: str = "") -> tuple:
    """An entry's fields in :data:`ENTRY_FIELDS` order, canonical (times, payload text, job id as text, run as
    an integer), its id last: what ``make_entry`` builds an Entry from and the hooks a spool record."""
    fields = (kind, format_ts(ts), canonical_json(dict(payload or {})), format_ts(ts_end), format_ts(recorded_at),
              cluster, None if job_id is None else str(job_id), None if run is None else int(run), node, device,
              source, source_version)
    return (*fields, entry_id(kind, fields[1], fields[3], cluster, fields[6], fields[7], node, device, fields[2],
                              source))


# Text already in the one canonical spelling (year >= 1000, 1-6 fraction digits without a trailing zero, Z):
# format_ts would return it unchanged once fromisoformat accepts it, so it skips the strftime round trip.
# Compiled on first use: ``re`` costs the Slurm hooks ≈ 5 ms to import and they only format numbers.
_CANONICAL_TS_PATTERN = r"[1-9]\d{3}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{0,5}[1-9])?Z"
_canonical_ts_fullmatch = None


def canonical_ts_match(value: str):  # noqa: ANN202
    global _canonical_ts_fullmatch
    if _canonical_ts_fullmatch is None:
        import re

        _canonical_ts_fullmatch = re.compile(_CANONICAL_TS_PATTERN).fullmatch
    return _canonical_ts_fullmatch(value)


def datetime_from_iso(text: str) -> _dt.datetime:
    import datetime

    return datetime.datetime.fromisoformat(text)


# 9999-12-31T23:59:58Z: below it, the arithmetic of the epoch path is exact and no rounding leaves the year range.
_MAX_FAST_EPOCH = 253402300798


def format_ts(value: "_dt.datetime | float | int | str | None") -> str | None:
    """RFC 3339 in UTC, ``Z`` suffix, microseconds only when non-zero: one spelling per instant.

    Epoch numbers are rounded as ``datetime.fromtimestamp`` rounds them (half to even microseconds)."""
    t = type(value)
    if (t is float or t is int) and 0 <= value <= _MAX_FAST_EPOCH:  # the hooks' and the importers' case
        if t is int:
            sec, us = value, 0
        else:
            whole = float(int(value))  # value >= 0: int() truncates like modf
            us = round((value - whole) * 1e6)
            if us >= 1_000_000:
                us -= 1_000_000
                whole += 1.0
            sec = int(whole)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        if us:
            text += f".{us:06d}".rstrip("0")
        return text + "Z"
    if value is None:
        return None
    import datetime

    if isinstance(value, str):
        if canonical_ts_match(value) is not None:
            datetime.datetime.fromisoformat(value[:-1] + "+00:00")  # same validation as the slow path (raises)
            return value
        value = parse_ts(value)
    if isinstance(value, (int, float)):
        value = datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: ipledger only records timezone-aware instants")
    value = value.astimezone(datetime.timezone.utc)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_ts(text: str) -> _dt.datetime:
    """Parse RFC 3339 (``Z`` or an offset); naive text is rejected rather than guessed."""
    import datetime

    stripped = text.strip()
    if stripped.endswith(("Z", "z")):
        stripped = stripped[:-1] + "+00:00"
    value = datetime.datetime.fromisoformat(stripped)
    if value.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return value.astimezone(datetime.timezone.utc)


def ts_to_epoch(text: str) -> float:
    return parse_ts(text).timestamp()


def now_ts() -> str:
    return format_ts(time.time())  # type: ignore[return-value]
