"""The outcome of the last `ipledger verify --record FILE`: a small JSON file beside the ledger (never an entry in
it: verify stays read-only and the ledger append-only), read by `/metrics` as `ipledger_verify_ok`,
`ipledger_verify_age_seconds` and `ipledger_verify_head_seq`.

`status_of(report, finished_at)` is what verify records, `render` its bytes, `parse(text, name)` the checked
reading (one line naming the file and the field on anything else) and `read(path)` the bounded read."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

STATUS_VERSION = 1
MAX_STATUS_BYTES = 64 * 1024


class VerifyStatusError(ValueError):
    """A status file that is not what `ipledger verify --record` writes: one line naming the file and field."""


@dataclass(frozen=True)
class VerifyStatus:
    ok: bool
    finished_at: float     # epoch seconds, when the verify finished
    head_seq: int          # the seq it reached: the head it verified, or where a failed walk stopped
    head_hash: str
    entries: int
    problems: int


def status_of(report, finished_at: float) -> VerifyStatus:  # noqa: ANN001 - a verify.VerifyReport
    return VerifyStatus(bool(report.ok), float(finished_at), int(report.head_seq), str(report.head_hash),
                        int(report.entries), len(report.problems))


def render(status: VerifyStatus) -> str:
    return json.dumps({"version": STATUS_VERSION, "ok": status.ok, "finished_at": status.finished_at,
                       "head_seq": status.head_seq, "head_hash": status.head_hash, "entries": status.entries,
                       "problems": status.problems}, sort_keys=True) + "\n"


def parse(text: str, name: str) -> VerifyStatus:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise VerifyStatusError(f"{name}: not JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise VerifyStatusError(f"{name}: not a JSON object")

    def field(key: str, kinds: tuple, ok=lambda v: True):  # noqa: ANN001, ANN202
        v = doc.get(key)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds) or not ok(v):
            raise VerifyStatusError(f"{name}: field {key}: {v!r} is not what ipledger verify --record writes")
        return v

    if field("version", (int,)) != STATUS_VERSION:
        raise VerifyStatusError(f"{name}: field version: {doc['version']!r} (this ipledger reads {STATUS_VERSION})")
    return VerifyStatus(
        ok=field("ok", (bool,)),
        finished_at=float(field("finished_at", (int, float), lambda v: math.isfinite(v) and v >= 0)),
        head_seq=field("head_seq", (int,), lambda v: v >= 0),
        head_hash=field("head_hash", (str,), lambda v: len(v) <= 128 and v.isascii()),
        entries=field("entries", (int,), lambda v: v >= 0),
        problems=field("problems", (int,), lambda v: v >= 0))


def read(path: str | os.PathLike) -> VerifyStatus | None:
    """The recorded status, None when no verify recorded one yet; VerifyStatusError for anything unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATUS_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise VerifyStatusError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > MAX_STATUS_BYTES:
        raise VerifyStatusError(f"{path}: larger than {MAX_STATUS_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise VerifyStatusError(f"{path}: not UTF-8") from None
    return parse(text, str(path))
