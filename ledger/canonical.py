"""Canonical encodings: the one byte form of JSON and of timestamps that every hash in ipledger is taken over.

Standard library only: the Slurm hooks import this on their fast path.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (strings here): typing stays off the hook's import path
    from typing import Any

_UTC = _dt.timezone.utc

# One encoder built once: json.dumps() with non-default options builds a new JSONEncoder per call, which
# costs more than encoding a ledger entry (the ship and verify hot paths call this millions of times).
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
# Text already in the one canonical spelling (year >= 1000, 1-6 fraction digits without a trailing zero, Z):
# format_ts would return it unchanged once fromisoformat accepts it, so it skips the strftime round trip.
# Compiled on first use: ``re`` costs the Slurm hooks ≈ 5 ms to import and they only format numbers.
_CANONICAL_TS_PATTERN = r"[1-9]\d{3}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{0,5}[1-9])?Z"
_canonical_ts_fullmatch = None


def _canonical_ts_match(value: str):
    global _canonical_ts_fullmatch
    if _canonical_ts_fullmatch is None:
        import re

        _canonical_ts_fullmatch = re.compile(_CANONICAL_TS_PATTERN).fullmatch
    return _canonical_ts_fullmatch(value)
_fromisoformat = _dt.datetime.fromisoformat


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace, UTF-8 kept as is, NaN/Infinity refused.

    Floats use Python's shortest round-trip repr, which is the same in every process and platform.
    """
    return _ENCODE(obj)


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def format_ts(value: "_dt.datetime | float | int | str | None") -> str | None:
    """RFC 3339 in UTC, ``Z`` suffix, microseconds only when non-zero: one spelling per instant."""
    if value is None:
        return None
    if isinstance(value, str):
        if _canonical_ts_match(value) is not None:
            _fromisoformat(value[:-1] + "+00:00")  # same validation as the slow path (raises ValueError)
            return value
        value = parse_ts(value)
    if isinstance(value, (int, float)):
        value = _dt.datetime.fromtimestamp(value, tz=_UTC)
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: ipledger only records timezone-aware instants")
    value = value.astimezone(_UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_ts(text: str) -> _dt.datetime:
    """Parse RFC 3339 (``Z`` or an offset); naive text is rejected rather than guessed."""
    stripped = text.strip()
    if stripped.endswith(("Z", "z")):
        stripped = stripped[:-1] + "+00:00"
    value = _dt.datetime.fromisoformat(stripped)
    if value.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return value.astimezone(_UTC)


def ts_to_epoch(text: str) -> float:
    return parse_ts(text).timestamp()


def now_ts() -> str:
    return format_ts(_dt.datetime.now(tz=_UTC))  # type: ignore[return-value]
