"""CSV of a DataFrame written column-wise in Arrow, byte-identical to ``DataFrame.to_csv(index=False,
float_format="%.6f")``.

pandas formats every float cell through a Python callable (a million-receipt statement is ~30 million
calls); here each column becomes one Arrow string array built by C kernels, the columns are joined per row
and the rows' bytes written in chunks. The output is the same bytes as pandas' writer:

* floats: ``"%.6f"``, NaN empty. A value ``v`` with ``|v| < 1e9`` and ``rint(v * 1e6) / 1e6 == v`` is the
  double nearest a whole number of millionths whose spacing is far below half a millionth, so ``"%.6f"``
  prints exactly that number (sign from the sign bit, as ``"%.6f" % -0.0`` is ``-0.000000``); any other
  value is formatted by Python's ``%`` itself.
* integers (numpy or pandas' nullable ``Int64``): decimal, missing empty.
* text: as :mod:`csv` writes it under pandas' dialect (``QUOTE_MINIMAL``, ``"`` doubled, ``\\n`` line end);
  which characters force quotes is asked of the csv module itself, so it follows the running Python.
  A non-text object in a text column is written as ``str()`` of it, as the csv module does.
* any other dtype (bool, datetime, categorical, ...): the whole frame goes through ``DataFrame.to_csv``.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

FLOAT_FORMAT = "%.6f"
_DECIMALS = 6
_SCALE = 10 ** _DECIMALS
_EXACT_BELOW = 1e9
CHUNK_ROWS = 100_000


def quoting_chars() -> str:
    """The characters that make :mod:`csv` quote a field under pandas' dialect (asked, not assumed)."""
    out = ""
    for ch in ',"\r\n\t ':
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL, quotechar='"').writerow(["a" + ch + "b", "x"])
        if buf.getvalue().startswith('"'):
            out += ch
    return out


_QUOTE_PATTERN = None


def _quote_pattern() -> str:
    global _QUOTE_PATTERN
    if _QUOTE_PATTERN is None:
        chars = quoting_chars()
        _QUOTE_PATTERN = "[" + "".join("\\" + c if c in '\\]^-"' else c for c in chars) + "]" if chars else "(?!)"
    return _QUOTE_PATTERN


def _float_cells(values: np.ndarray):  # noqa: ANN202 - a pyarrow array
    import pyarrow as pa
    import pyarrow.compute as pc

    v = values.astype("float64", copy=False)
    nan = np.isnan(v)
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(v * _SCALE)
        exact = ~nan & (np.abs(v) < _EXACT_BELOW) & (k / _SCALE == v)
    ki = np.where(exact, np.abs(k), 0.0).astype("int64")
    whole = pc.cast(pa.array(ki // _SCALE), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(ki % _SCALE), pa.string()), _DECIMALS, "0")
    sign = pc.if_else(pa.array(np.signbit(v)), "-", "")
    cells = pc.binary_join_element_wise(sign, whole, ".", frac, "")
    other = ~exact & ~nan
    if other.any():
        fallback = np.full(len(v), "", dtype=object)
        fallback[other] = [FLOAT_FORMAT % x for x in v[other]]
        cells = pc.if_else(pa.array(exact), cells, pa.array(fallback, type=pa.string()))
    return pc.if_else(pa.array(nan), "", cells)


def _text_cells(col: pd.Series):  # noqa: ANN202
    import pyarrow as pa
    import pyarrow.compute as pc

    values = col.to_numpy(dtype=object)
    try:
        arr = pa.array(values, type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all text: the csv module writes str() of the others
        arr = pa.array([None if _missing(x) else (x if isinstance(x, str) else str(x)) for x in values],
                       type=pa.string())
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(arr, '"', '""'), '"', "")
    return pc.fill_null(pc.if_else(pc.match_substring_regex(arr, _quote_pattern()), quoted, arr), "")


def _missing(x: object) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and x != x)


def _int_cells(col: pd.Series):  # noqa: ANN202
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.fill_null(pc.cast(pa.array(col, from_pandas=True), pa.string()), "")


def _formatter(dtype):  # noqa: ANN001, ANN202
    """The cell builder for a column of ``dtype``; None when this writer does not format it."""
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return lambda col: _float_cells(col.to_numpy())
    if pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype):
        return _int_cells
    if dtype == object or isinstance(dtype, pd.StringDtype):
        return _text_cells
    return None


def _row_bytes(columns: list) -> memoryview:  # noqa: ANN001
    """The rows (cells joined by commas, each line ending in a newline) as one contiguous byte range."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lines = pc.binary_join_element_wise(*columns, ",")
    lines = pc.binary_join_element_wise(lines, "", "\n").cast(pa.large_string())
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    data = lines.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")


def _header(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL, quotechar='"').writerow(
        [str(c) for c in df.columns])
    return buf.getvalue()


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """``df.to_csv(path, index=False, float_format="%.6f")``, the same bytes, column-wise."""
    p = Path(path)
    formatters = [_formatter(t) for t in df.dtypes]
    if not len(df.columns) or not df.columns.is_unique or any(f is None for f in formatters):
        df.to_csv(p, index=False, float_format=FLOAT_FORMAT)
        return
    with open(p, "wb") as f:
        f.write(_header(df).encode("utf-8"))
        for lo in range(0, len(df), CHUNK_ROWS):
            part = df.iloc[lo:lo + CHUNK_ROWS]
            f.write(_row_bytes([fmt(part.iloc[:, i]) for i, fmt in enumerate(formatters)]))
