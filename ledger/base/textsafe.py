"""Names from the fleet made safe to show: control characters escaped, spreadsheet formulas neutralised.

Account, user and job names reach the ledger from Slurm and export labels as they are, and the ledger keeps
them byte for byte (they are part of the hashed payloads). Only where they are *shown* do they change:

* :func:`printable` for text on a terminal or in a text file: C0/C1 control characters, DEL, and the Unicode
  bidirectional overrides (which can make ``abc`` read as ``cba``, CVE-2021-42574) become ``\\xNN`` /
  ``\\uNNNN`` escapes, so a name cannot move the cursor, recolour the terminal or start a new line.
* :func:`excerpt` for input quoted in an error message: escaped as :func:`printable` does, and cut to a few
  couple of dozen characters, so an error never carries a file's contents (a line of ``/etc/shadow``) to the terminal.
* :func:`echo` is the one way a command prints a line to a terminal: every line through :func:`printable`
  (lone surrogates, which no terminal encoding takes, become ``\\udNNN`` escapes instead of an error).
* :func:`json_text` for JSON printed to a terminal: the same document, with those characters as ``\\uNNNN``.
* :func:`csv_cell` / :func:`neutralise_frame` for CSV: the same escapes, and a cell that starts with ``=``,
  ``+``, ``-``, ``@``, tab or carriage return gets a leading ``'`` (OWASP, "CSV Injection"), so a
  spreadsheet shows it as text instead of evaluating it. Numbers are not text cells and are never touched.

Standard library at import time; :func:`neutralise_frame` (called with a pandas frame) imports pyarrow for its
column scan.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "\ud800-\udfff]")
_JSON_UNSAFE = re.compile("[\x7f-\x9f" + _BIDI + "\ud800-\udfff]")   # json.dumps escapes C0 itself
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _escape(m: re.Match) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with control characters and bidi overrides escaped (unchanged when it has none)."""
    return _UNSAFE.sub(_escape, text)


EXCERPT_CHARS = 24


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of ``text`` (then ``...``), escaped: what an error may quote of its input."""
    t = printable(str(text))
    return t if len(t) <= limit else t[:limit] + "..."


def echo(message: object = "", *, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of ``message`` with every control character, bidi override and lone surrogate escaped
    (line breaks between lines are kept: each line is escaped on its own)."""
    import click

    if isinstance(message, (bytes, bytearray)):   # a binary document (a PDF to standard output): not text
        click.echo(message, err=err, nl=nl)
        return
    text = "" if message is None else str(message)
    click.echo("\n".join(printable(line) for line in text.split("\n")), err=err, nl=nl)


def json_text(text: str) -> str:
    """JSON text safe for a terminal, and the same JSON: what ``json.dumps`` leaves raw (DEL, C1 controls,
    bidi overrides, lone surrogates; C0 controls it escapes itself) written as ``\\uNNNN`` escapes."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def csv_cell(value: object) -> object:
    """A text cell safe for a spreadsheet; any other value unchanged."""
    if not isinstance(value, str):
        return value
    return "'" + printable(value) if value.startswith(FORMULA_PREFIXES) else printable(value)


def risky_cells(column):  # noqa: ANN001, ANN202 - a pandas Series in, a numpy bool array (or None) out
    """Where :func:`csv_cell` would change a text cell, found column-wise by Arrow's RE2 kernel; None for a
    column Arrow does not take as text (mixed types, lone surrogates, no text at all), left to pandas."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        arr = pa.array(column.to_numpy(dtype=object), type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeError):
        return None
    return pc.fill_null(pc.match_substring_regex(arr, RISKY_RE2), False).to_numpy(zero_copy_only=False)


# the same test as _UNSAFE.search(v) or v.startswith(FORMULA_PREFIXES), in RE2 syntax (\t and \r are controls)
RISKY_RE2 = "^[=+\\-@]|[\\x00-\\x1f\\x7f-\\x9f" + "".join(f"\\x{{{ord(c):04x}}}" for c in _BIDI) + "]"


def neutralise_frame(df):  # noqa: ANN001, ANN201 - a pandas DataFrame in, a new one out
    """:func:`csv_cell` on every text column of a DataFrame (column-wise scan; frames without unsafe text are
    returned as is)."""
    out = None
    for col in df.columns:
        s = df[col]
        if s.dtype != object and str(s.dtype) not in ("string", "str"):
            continue
        risky = risky_cells(s)
        if risky is None:
            try:
                risky = s.str.contains(_UNSAFE.pattern, regex=True, na=False) | s.str.startswith(FORMULA_PREFIXES,
                                                                                                   na=False)
            except AttributeError:  # an object column without any text
                continue
            risky = risky.fillna(False).astype(bool).to_numpy()
        if not risky.any():
            continue
        if out is None:
            out = df.copy()
        out[col] = s.astype(object)
        out.loc[risky, col] = [csv_cell(v) for v in s[risky]]
    return df if out is None else out
