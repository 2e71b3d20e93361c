"""The hooks' spool records: ``make_entry(...).to_record()`` without :mod:`ledger.chain.entries` (dataclasses and
their imports: most of the hook's former start-up cost), in the ledger's one canonical encoding
(:mod:`ledger.chain.canonical`: the same timestamps, payload text and entry id). The shipper rebuilds every record
with :func:`ledger.chain.entries.entry_from_record`, which recomputes the id, so a drift here could not pass unseen.
:func:`escape_text` makes text a job's user wrote (a mark's note) printable and encodable before it joins one.
"""

from __future__ import annotations

from ...chain.canonical import ENTRY_FIELDS, entry_fields, json_encoder
from ...chain.kinds import Kind

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hook's import path
    from typing import Any, Mapping

# The kinds the hooks write (a test checks each is in ledger.chain.entries.ALL_KINDS). Observations only: what the
# hooks saw (the environment, the devices they were given, raw vendor tool output); what that output means
# (telemetry summaries, unknown intervals) is derived from it at ship time (ledger.capture.sources.observed).
HOOK_KINDS = frozenset({Kind.ALLOCATION_STARTED, Kind.ALLOCATION_ENDED, Kind.ALLOCATION_SUSPENDED,
                        Kind.ALLOCATION_RESUMED, Kind.ALLOCATION_REQUEUED, Kind.DEVICE_BOUND,
                        Kind.TOOL_OUTPUT, Kind.UNKNOWN_INTERVAL, Kind.HOOK_ERROR, Kind.PROGRESS})

# A spool line (= ledger.capture.spool.write's json.dumps(sort_keys=True, compact, ensure_ascii=False)); also the hook's
# state file and a progress mark's line.
spool_line = json_encoder(ensure_ascii=False, allow_nan=True, item_sep=",", key_sep=":")


def entry_record(kind: str, ts: Any, payload: Mapping[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    """``make_entry(...).to_record()`` for a hook kind, field for field (``keys``: ts_end, recorded_at, cluster,
    job_id, run, node, device, source, source_version)."""
    if kind not in HOOK_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    return dict(zip(ENTRY_FIELDS, entry_fields(kind, ts, payload, **keys)))


def escape_text(text: str, *, bytes_escaped: bool = True) -> str:
    """Text a job's user wrote, made printable and encodable, losslessly: ``\\`` becomes ``\\\\``; a control
    character, DEL, a bidi override or any other unprintable character becomes ``\\xNN`` / ``\\uNNNN`` /
    ``\\UNNNNNNNN``; a lone surrogate ``\\uD800``–``\\uDFFF`` becomes its ``\\uNNNN`` — except, when
    ``bytes_escaped`` (text decoded with ``surrogateescape``: argv, a drop line that was not UTF-8), U+DC80–U+DCFF,
    which stand for the undecodable bytes 0x80–0xFF, become ``\\xNN``. Every escape starts with a backslash
    and every literal backslash is doubled, so the original can always be read back; the result encodes as
    UTF-8 whatever came in."""
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for c in text:
        o = ord(c)
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():  # surrogates (category Cs) are not printable
            out.append(c)
        elif bytes_escaped and 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x100 and not (0x80 <= o and bytes_escaped):
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)
