"""Spool records and JSON for the hooks, built without :mod:`ledger.entries`, :mod:`json`, :mod:`hashlib` or
:mod:`datetime` (dataclasses, inspect, re, OpenSSL: most of the hook's former start-up cost).

:func:`entry_record` returns exactly ``make_entry(...).to_record()`` — same canonical timestamps, payload text
and entry id; :func:`spool_line` exactly ``json.dumps(r, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)``; :func:`loads` what ``json.loads`` returns. tests/test_hook_fastpath.py proves each with
hypothesis. They are the same C accelerators the json module itself uses (``_json``), called directly, and the
builtin SHA-256; the shipper rebuilds every spool record with :func:`ledger.entries.entry_from_record`, which
recomputes the id, so a drift here could not pass unseen.
"""

from __future__ import annotations

import time

from ..kinds import Kind

try:  # the digest is the same from either implementation; _sha256 avoids loading OpenSSL (≈ 3 ms)
    from _sha256 import sha256
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import sha256
try:
    from _json import encode_basestring as _c_str, encode_basestring_ascii as _c_str_ascii
    from _json import make_encoder as _c_make_encoder, make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - a Python without the json accelerator: use json itself
    _c_make_encoder = None

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hook's import path
    from typing import Any, Callable, Mapping

ID_DOMAIN = "ipledger-entry-id-v1"  # = ledger.entries.ID_DOMAIN (a test keeps them equal)
# The kinds the hooks write (a test checks each is in ledger.entries.ALL_KINDS).
HOOK_KINDS = frozenset({Kind.ALLOCATION_STARTED, Kind.ALLOCATION_ENDED, Kind.ALLOCATION_SUSPENDED,
                        Kind.ALLOCATION_RESUMED, Kind.ALLOCATION_REQUEUED, Kind.DEVICE_BOUND,
                        Kind.TELEMETRY_SUMMARY, Kind.UNKNOWN_INTERVAL, Kind.HOOK_ERROR, Kind.PROGRESS})


def _not_serializable(o: object) -> None:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")  # = JSONEncoder.default


def _encoder(*, ensure_ascii: bool, allow_nan: bool, item_sep: str, key_sep: str) -> Callable[[Any], str]:
    """``json.JSONEncoder(sort_keys=True, ...).encode``: what that method does, on the same C encoder."""
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


canonical_json = _encoder(ensure_ascii=False, allow_nan=False, item_sep=",", key_sep=":")  # = ledger.canonical's
spool_line = _encoder(ensure_ascii=False, allow_nan=True, item_sep=",", key_sep=":")  # = ledger.spool.write's
state_json = _encoder(ensure_ascii=True, allow_nan=True, item_sep=", ", key_sep=": ")  # = json.dumps(sort_keys=True)


class _ScanContext:
    """What json.JSONDecoder hands the C scanner (strict, no hooks, int/float, NaN/Infinity constants)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
    memo: dict = {}


_scan = _c_make_scanner(_ScanContext()) if _c_make_encoder is not None else None
_WS = " \t\n\r"


def loads(text: str) -> Any:
    """``json.loads(text)`` for text (ValueError on bad input, as json.JSONDecodeError is one)."""
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
    while end < n and text[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"Extra data at char {end}")
    return obj


# 9999-12-31T23:59:58Z: below it, the arithmetic below is exact and no rounding can leave the year range.
_MAX_FAST_EPOCH = 253402300798


def format_ts(value: Any) -> str | None:
    """``ledger.canonical.format_ts``: epoch numbers here (as datetime.fromtimestamp rounds: half to even
    microseconds), anything else (text, datetimes, out-of-range) by ledger.canonical itself."""
    t = type(value)
    if (t is float or t is int) and 0 <= value <= _MAX_FAST_EPOCH:
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
    from ..canonical import format_ts as slow

    return slow(value)


def entry_record(kind: str, ts: Any, payload: Mapping[str, Any] | None = None, *, ts_end: Any = None,
                 recorded_at: Any = None, cluster: str | None = None, job_id: str | int | None = None,
                 run: int | None = None, node: str | None = None, device: str | None = None,
                 source: str = "ipledger", source_version: str = "") -> dict[str, Any]:
    """``make_entry(...).to_record()`` for a hook kind, field for field."""
    if kind not in HOOK_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    ts = format_ts(ts)
    payload_text = canonical_json(dict(payload or {}))
    ts_end = format_ts(ts_end)
    recorded = format_ts(recorded_at)
    job_id = None if job_id is None else str(job_id)
    run = None if run is None else int(run)
    ident = [ID_DOMAIN, kind, ts, ts_end, cluster, job_id, run, node, device, payload_text, source]
    return {"kind": kind, "ts": ts, "payload": payload_text, "ts_end": ts_end, "recorded_at": recorded,
            "cluster": cluster, "job_id": job_id, "run": run, "node": node, "device": device, "source": source,
            "source_version": source_version,
            "entry_id": "e" + sha256(canonical_json(ident).encode("utf-8")).hexdigest()[:39]}
