"""A query_range JSON response read incrementally: series by series, never the whole file.

:func:`read_query_range` gives the collection :func:`ledger.importers.prometheus.parse_query_range` gives for the
file's text (the reference, tested against it on random chunk boundaries and on the real captures), holding
only a window of the text (:data:`READ_CHARS`, more only while one series is longer) and one decoded series at
a time, which goes into the collection's float columns at once.

The outer structure (the response object, ``data``, the ``result`` array) is tokenised here; every value inside
it, each series included, is decoded by the standard library's ``json`` (``raw_decode`` over the window), so
values read exactly as ``json.loads`` reads them. Errors are the reference's, in its order: invalid UTF-8
anywhere, then invalid JSON (the same line, column and message), then what the response says (no ``data``,
a Prometheus error, a result type other than matrix or vector), then the first bad series. A response whose
``data`` holds ``result`` before ``resultType`` (keys sorted, as ``jq -S`` or ``json.dumps(sort_keys=True)``
write them) is read twice: a first pass finds the type, decoding and dropping one series at a time, then the
series are read by it. One that repeats ``data``, ``result`` or ``resultType`` cannot be read in one pass
with ``json.loads``' meaning (the last one wins); it is read whole (:class:`WholeFile`), as is a sorted one
from a stream that cannot be read twice.
"""

from __future__ import annotations

import codecs
import gc
import json
from json.decoder import scanstring
from typing import BinaryIO, Callable

from ..base.textsafe import excerpt
from .common import Collected, InputError

READ_CHARS = 1 << 20           # the window read at a time (characters); a longer series widens it while it lasts
_WS = " \t\n\r"                # JSON whitespace (json.decoder.WHITESPACE)
_NEAR_END = 16                 # a decode error this close to the window's end may be the window's end itself
_DECODER = json.JSONDecoder()


class WholeFile(Exception):
    """The response cannot be read in one pass with ``json.loads``' meaning (see the module doc)."""


class _Syntax(Exception):
    def __init__(self, msg: str, pos: int) -> None:
        super().__init__(msg)
        self.msg, self.pos = msg, pos


class _Window:
    """The text of a binary stream decoded as UTF-8 a window at a time, with ``json``'s line and column."""

    def __init__(self, f: BinaryIO, path: str) -> None:
        self.f, self.path = f, path
        self.dec = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.lines, self.col0 = 0, 0          # newlines before buf[0]; characters after the last one
        self.bytes_in = 0

    def fill(self, chars: int | None = None) -> bool:
        """Append up to ``chars`` (default :data:`READ_CHARS`) more bytes' text; False at the end of the stream."""
        if self.eof:
            return False
        data = self.f.read(chars or READ_CHARS)
        if not data:
            self.eof = True
            self.buf += self._decode(b"", final=True)
            return False
        self.buf += self._decode(data, final=False)
        return True

    def _decode(self, data: bytes, final: bool) -> str:
        pending = len(self.dec.getstate()[0])
        try:
            out = self.dec.decode(data, final)
        except UnicodeDecodeError as exc:
            raise InputError(self.path, f"byte {self.bytes_in - pending + exc.start}", "not UTF-8 text") from None
        self.bytes_in += len(data)
        return out

    def drain(self) -> None:
        """Decode the rest of the stream (invalid UTF-8 anywhere is the first error, as a whole read finds it)."""
        self.buf, self.pos = "", 0
        while self.fill():
            self.buf = ""

    def compact(self) -> None:
        if self.pos < READ_CHARS:
            return
        done = self.buf[:self.pos]
        nl = done.rfind("\n")
        if nl < 0:
            self.col0 += len(done)
        else:
            self.lines += done.count("\n")
            self.col0 = len(done) - nl - 1
        self.buf, self.pos = self.buf[self.pos:], 0

    def where(self, pos: int) -> str:
        nl = self.buf.rfind("\n", 0, pos)
        line = self.lines + self.buf.count("\n", 0, pos) + 1
        col = pos - nl if nl >= 0 else self.col0 + pos + 1
        return f"line {line} column {col}"

    def peek(self) -> str:
        """The next character after whitespace ('' at the end)."""
        while True:
            buf, n, i = self.buf, len(self.buf), self.pos
            while i < n and buf[i] in _WS:
                i += 1
            self.pos = i
            if i < n or not self.fill():
                return self.buf[i:i + 1]

    def expect(self, ch: str, msg: str) -> None:
        if self.peek() != ch:
            raise _Syntax(msg, self.pos)
        self.pos += 1

    def value(self) -> object:
        """The JSON value at the current position, decoded by ``json`` (the window widened until it holds it)."""
        self.peek()
        self.compact()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                partial = exc.msg.startswith("Unterminated string") or exc.pos >= len(self.buf) - _NEAR_END
                if partial and self.fill(max(READ_CHARS, len(self.buf))):
                    continue
                raise _Syntax(exc.msg, exc.pos) from None
            except RecursionError:
                raise InputError(self.path, "line 1", "JSON nested too deeply for a Prometheus response") from None
            except ValueError as exc:  # int()'s digit limit on a 4,300-digit number (the reference's place)
                raise InputError(self.path, "line 1", f"invalid JSON ({exc})") from None
            if end == len(self.buf) and self.fill():   # a number or literal may go on in the next window
                continue
            self.pos = end
            return obj

    def key(self) -> str:
        if self.peek() != '"':
            raise _Syntax("Expecting property name enclosed in double quotes", self.pos)
        while True:
            try:
                k, end = scanstring(self.buf, self.pos + 1)
            except json.JSONDecodeError as exc:
                if self.fill(max(READ_CHARS, len(self.buf))):
                    continue
                raise _Syntax(exc.msg, exc.pos) from None
            self.pos = end
            self.expect(":", "Expecting ':' delimiter")
            return k

    def members(self):  # noqa: ANN201 - yields each key of the object opened at the position; its value follows
        return self._each("}", self.key)

    def elements(self):  # noqa: ANN201 - yields before each element of the array opened at the position
        return self._each("]", self.peek)

    def _each(self, close: str, before: Callable[[], object]):  # noqa: ANN202
        self.pos += 1   # the "{" or "["
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            yield before()
            nxt = self.peek()
            self.pos += 1
            if nxt == close:
                return
            if nxt != ",":
                raise _Syntax("Expecting ',' delimiter", self.pos - 1)


def read_query_range(f: BinaryIO, path: str,
                     add_series: Callable[[Collected, dict, list, str], None]) -> Collected:
    """The collection of one query_range response read from ``f`` (binary, positioned at its start).

    ``add_series`` is the importer's function for one series (labels, points, place). Raises
    :class:`~ledger.importers.common.InputError` as the reference does, or :class:`WholeFile`."""
    # A decoded series is thousands of small lists that live until it is added, so with the collector on they
    # survive its young generations and trigger full collections over every object the process holds (twice
    # the reading time inside `ipledger analyze` at 256 GPUs); they hold no cycles, so it is off meanwhile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = f.tell() if f.seekable() else None
        try:
            return _read_query_range(f, path, add_series, _UNSEEN)
        except _ResultFirst:
            if start is None:
                raise WholeFile() from None
        # `result` before `resultType` (keys sorted, as `jq -S` or json.dumps(sort_keys=True) write them): the
        # type the series are read by is found in a first pass that decodes and drops one series at a time,
        # then the response is read again knowing it; where that cannot be done, it is read whole
        f.seek(start)
        rtype = _result_type(f, path)
        if rtype is _UNSEEN:
            raise WholeFile()
        f.seek(start)
        return _read_query_range(f, path, add_series, rtype)
    finally:
        if collecting:
            gc.enable()


_UNSEEN = object()   # data's resultType, before it is known


class _ResultFirst(Exception):
    """``result`` comes before ``resultType``: read again once the type is known (:func:`read_query_range`)."""


def _result_type(f: BinaryIO, path: str) -> object:
    """data's ``resultType`` from a pass over the response that holds one value at a time; :data:`_UNSEEN`
    where there is none, a member repeats, or the text is not well-formed (the whole read says what is wrong)."""
    w = _Window(f, path)
    found: object = _UNSEEN
    try:
        if w.peek() != "{":
            return _UNSEEN
        seen: set[str] = set()
        for key in w.members():
            if key in seen:
                return _UNSEEN
            seen.add(key)
            if key != "data" or w.peek() != "{":
                w.value()
                continue
            dseen: set[str] = set()
            for dkey in w.members():
                if dkey in dseen:
                    return _UNSEEN
                dseen.add(dkey)
                if dkey == "result" and w.peek() == "[":
                    for _ in w.elements():
                        w.value()
                    continue
                value = w.value()
                if dkey == "resultType":
                    found = value
        if w.peek() != "":
            return _UNSEEN
    except (_Syntax, InputError, WholeFile):
        return _UNSEEN
    return found


def _read_query_range(f: BinaryIO, path: str, add_series: Callable[[Collected, dict, list, str], None],
                      known_rtype: object) -> Collected:
    w = _Window(f, path)
    c = Collected("prometheus", path=path)
    doc: dict = {}          # the response's small members (status, error), and data's when it is no object
    data: dict = {}         # data's members other than result
    first_error: list[InputError] = []   # the first bad series: raised only if nothing the reference checks first is

    def on_series(k: int, series: object, rtype: object) -> None:
        if first_error:
            return
        try:
            add_result_series(c, k, series, rtype, "", add_series)
        except InputError as exc:
            first_error.append(exc)

    try:
        try:
            if w.peek() != "{":
                raise WholeFile()   # not what the sniffer routes here; the reference words it
            for key in w.members():
                if key != "data":
                    doc[key] = w.value()
                    continue
                if "data" in doc:
                    raise WholeFile()
                if w.peek() != "{":
                    doc["data"] = w.value()
                    continue
                doc["data"] = data
                for dkey in w.members():
                    if dkey in data:
                        raise WholeFile()
                    if dkey != "result":
                        data[dkey] = w.value()
                        continue
                    if "resultType" in data:
                        rtype = data["resultType"]
                    elif known_rtype is not _UNSEEN:
                        rtype = known_rtype   # from the first pass (it comes after result)
                    else:
                        raise _ResultFirst()
                    if w.peek() != "[" or rtype not in ("matrix", "vector"):
                        data["result"] = w.value()
                        continue
                    data["result"] = []
                    for k, _ in enumerate(w.elements()):
                        on_series(k, w.value(), rtype)
            if w.peek() != "":
                raise _Syntax("Extra data", w.pos)
        except _Syntax as exc:
            raise InputError(path, w.where(exc.pos), f"invalid JSON ({exc.msg})") from None
    except (InputError, WholeFile):
        w.drain()
        raise
    check_response(c, doc, "")
    if first_error:
        raise first_error[0]
    return c


def check_response(c: Collected, doc: object, place: str) -> tuple[object, object]:
    """The reference's checks of a response before its series: (result type, result), or an InputError."""
    if not isinstance(doc, dict) or "data" not in doc:
        raise InputError(c.path, place, "not a Prometheus API response (no \"data\")")
    if doc.get("status", "success") != "success":
        raise InputError(c.path, place, f"Prometheus error: {doc.get('error', doc.get('status'))}")
    data = doc["data"]
    rtype = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if rtype not in ("matrix", "vector") or not isinstance(result, list):
        raise InputError(c.path, place, f"expected resultType matrix or vector, got '{excerpt(rtype)}'")
    return rtype, result


def add_result_series(c: Collected, k: int, series: object, rtype: object, place: str,
                      add_series: Callable[[Collected, dict, list, str], None]) -> None:
    """One element of a response's result into the collection, as the reference takes it."""
    if not isinstance(series, dict) or not isinstance(series.get("metric"), dict):
        raise InputError(c.path, f"{place} result[{k}]", "series without a \"metric\" object")
    pts = series.get("values") if rtype == "matrix" else [series.get("value")]
    if not isinstance(pts, list):
        raise InputError(c.path, f"{place} result[{k}]", "series without \"values\"")
    add_series(c, series["metric"], pts, f"{place} result[{k}]".strip())
