"""A month's billed receipts read from their flat lines (``receipt_lines``, written when each was issued):
the statement's rows built as columns from the lines, with the receipt JSON read only where the lines do not
settle a row.

The lines of a plain receipt billed whole in one month (:mod:`ledger.chain.receipt_lines`: the ordinary shape,
one period part, not open) are the receipt's own values, so its flat row and unknown-interval lines are built
from them by :func:`reports.issued_columns.flat_rows`, the column reader's own code. A run issued more than
once, and every other receipt that may bill the month (not plain, split over months, open, a window the lines
could not place), is read from its JSON and planned by :func:`reports.issued.select_month` (the dict path),
which stays the definition; tests/test_export_columns.py holds the whole to the dict path byte for byte.

``--as-of SEQ`` reads the lines of issues with seq <= SEQ: lines are keyed by their issue's seq and never
change, so a closed month reads the same rows later. :func:`read_month` returns None where the lines cannot
answer (a ledger whose lines lag its issues, an issue naming its receipt by hash alone, a run key that cannot
be formed); the caller then reads the JSON (:mod:`reports.issued_columns`).

SQLite answers the planning queries (the runs issued more than once, the tenants, the issues read from JSON)
from the table's indexes; the month's plain lines are streamed out in batches into Arrow.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
from sqlalchemy import text

from ledger.chain import receipt_lines

from .issued import ledger_head
from .lens_columns import LINES_WITHOUT_LENS
from .issued_columns import MonthRead, flat_rows, assemble
from .monthly import resolution_text, month_bounds

BATCH = 50_000
# The lines' columns under the names the column reader's row builder reads.
_PART = {"seq": "seq", "cluster": "cluster", "job_id": "job_id", "run": "run", "account": "account",
         "namespace": "namespace", "tenant_": "tenant_", "partition": "partition", "qos": "qos", "user": "user",
         "nodes": "nodes", "sku": "sku", "n_devices": "n_devices", "contract_id": "contract_id",
         "contract_version": "contract_version", "method_name": "method_name", "method_version": "method_version",
         "method_keys": "method_keys", "receipt_hash": "receipt_hash", "replaces_hash": "replaces_hash",
         "currency": "currency", "window_start": "start", "window_end": "end", "through_seq": "through_seq",
         "by_policy": "by_policy", **{c: c for c, _ in receipt_lines.FIGURES}}
_IV = {"seq": "seq", "line_no": "pos", "iv_id": "id", "iv_device": "device", "iv_node": "node",
       "iv_start": "start", "iv_end": "end", "iv_cause": "cause", "iv_policy": "policy",
       "iv_resolution": "resolution", "iv_gpu_hours": "gpu_hours"}
FAST = f"plain = 1 AND n_parts = 1 AND open = 0 AND {LINES_WITHOUT_LENS}"
_PER_ROW = {"job_id", "receipt_hash", "start", "end", "id"}  # text that differs from row to row


def sqlite_file(engine) -> str | None:  # noqa: ANN001
    """The file of a SQLite ledger (None: another database, or SQLite in memory)."""
    url = engine.url
    return url.database if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:") \
        else None


def arrow_sqlite(path: str, sql: str, params: dict, names: dict[str, str], sentinel: str,  # noqa: PLR0913
                  order: int):  # noqa: ANN202
    """The query's rows as an Arrow table read by the ADBC SQLite driver (C, straight into Arrow; no Python
    object per cell), or None when the driver is not installed or fails. The driver types each column from
    its first values, so a typed ``sentinel`` row (seq -1) leads and is dropped."""
    try:
        import adbc_driver_sqlite.dbapi as adbc
    except ImportError:
        return None
    import pyarrow.compute as pc

    bound = re.sub(r":([a-z]\w*)", lambda m: "?", sql)
    args = [params[m] for m in re.findall(r":([a-z]\w*)", sql)]
    try:
        with adbc.connect(f"file:{path}?mode=ro") as con, con.cursor() as cur:
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH)})
            cur.execute(f"{sentinel} UNION ALL SELECT * FROM ({bound})", args)
            t = cur.fetch_arrow_table()
    except Exception:  # noqa: BLE001 - any trouble in the fast reader: the portable one below reads the same rows
        return None
    t = t.rename_columns(list(names.values()))
    # the sentinel leads the compound (a slice, no copy); were it elsewhere, a filter drops it
    t = t.slice(1) if t.num_rows and t.column(0)[0].as_py() == -1 and pc.sum(pc.equal(t.column(0), -1)).as_py() == 1 \
        else t.filter(pc.greater_equal(t.column(0), 0))
    # in the order the query asks (its ORDER BY columns lead): SQLite keeps a compound's order only in practice,
    # so it is checked, and the rows put in order here where it does not hold
    keys = [t.column(k).to_numpy(zero_copy_only=False) for k in range(order)]
    at = np.lexsort(keys[::-1]) if t.num_rows else np.arange(0)
    if (at != np.arange(len(at))).any():
        t = t.take(at)
    return t


def _frame(engine, conn, sql: str, params: dict, names: dict[str, str],  # noqa: ANN001, PLR0913
           sentinel: str, order: int) -> pd.DataFrame:
    """The query's rows as a frame with ``names``' new column names: through ADBC on a SQLite file, else
    through the connection in batches of BATCH rows."""
    import pyarrow as pa

    path = sqlite_file(engine)
    t = None if path is None else arrow_sqlite(path, sql, params, names, sentinel, order)
    if t is None:
        cur = conn.execute(text(sql), params)
        batches = []
        while rows := cur.fetchmany(BATCH):
            cols = list(zip(*rows))
            batches.append(pa.table({new: pa.array(cols[k], from_pandas=True)
                                     for k, new in enumerate(names.values())}))
        if not batches:
            return pd.DataFrame({new: pd.Series(dtype=object) for new in names.values()})
        t = pa.concat_tables(batches, promote_options="permissive")
    return pd.DataFrame({name: _numpy(t.column(name), name in _PER_ROW) for name in t.column_names})


def _numpy(col, per_row: bool = False) -> np.ndarray:  # noqa: ANN001
    """An Arrow column as numpy: text as objects, one Python string per distinct value shared by every row
    that holds it (a million rows of a handful of tenants cost pointers, not strings) unless the values are
    ``per_row`` (ids, hashes, times: nothing to share); numbers as they are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if per_row or not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return col.to_numpy(zero_copy_only=False)
    enc = pc.dictionary_encode(col).combine_chunks()
    idx = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    out = np.full(len(idx), None, dtype=object)
    present = idx >= 0
    out[present] = enc.dictionary.to_numpy(zero_copy_only=False)[idx[present]]
    return out


def sentinel(names: dict[str, str]) -> str:
    """One row of the lines' own column types (seq -1): text '', numbers 0.0, integers 0."""
    types = dict(receipt_lines.COLUMNS)
    out = []
    for c in names:
        t = types[c]
        out.append("-1" if c == "seq" else "''" if t is receipt_lines.TEXT else "0.0" if t is receipt_lines.REAL
                   else "0")
    return "SELECT " + ", ".join(out)


def plan(conn, seq_head: int, month: str) -> tuple[np.ndarray, np.ndarray, set[str]] | None:  # noqa: ANN001
    """(the seqs of runs issued more than once, every seq the dict path reads for ``month``, every tenant named
    by an issue) through ``seq_head``; None when the lines cannot answer (see the module doc)."""
    p = {"s": seq_head, "m": month}
    if not receipt_lines.has_table(conn) or not receipt_lines.covered(conn, seq_head):
        return None
    if conn.execute(text("SELECT 1 FROM receipt_lines WHERE run_key = '' AND seq <= :s LIMIT 1"), p).first():
        return None
    # Runs issued more than once are planned by the dict path (corrections, closes), every issue of them.
    repeated = conn.execute(text(
        "SELECT seq FROM receipt_lines WHERE run_key IN (SELECT run_key FROM receipt_lines WHERE "
        "run_key IS NOT NULL AND seq <= :s GROUP BY run_key HAVING COUNT(*) > 1) AND seq <= :s"), p).fetchall()
    repeated_seqs = np.array(sorted(int(r[0]) for r in repeated), dtype="int64")
    # Other issues that may bill this month but are not read from their lines; a line without a month
    # (its window could not be placed, or it bills nowhere) is read from JSON for every month.
    odd = conn.execute(text(
        f"SELECT DISTINCT seq FROM receipt_lines WHERE line_kind = 'part' AND seq <= :s "
        f"AND (part_month = :m OR part_month IS NULL) AND NOT ({FAST})"), p).fetchall()
    slow = np.union1d(repeated_seqs, np.array([int(r[0]) for r in odd], dtype="int64"))
    tenants = {r[0] for r in conn.execute(text(
        "SELECT DISTINCT tenant FROM receipt_lines WHERE run_key IS NOT NULL AND seq <= :s"), p) if r[0]}
    return repeated_seqs, slow, tenants


def read_month(engine, month: str, through_seq: int | None = None,  # noqa: ANN001
               progress=None, grace_s: float = 0.0) -> MonthRead | None:  # noqa: ANN001, ARG001
    """The month's billed usage and corrections from the receipts' lines (see the module doc); None when the
    lines cannot answer."""
    month_bounds(month)
    seq_head, head = ledger_head(engine, through_seq)
    p = {"s": seq_head, "m": month}
    with engine.connect() as conn:
        planned = plan(conn, seq_head, month)
        if planned is None:
            return None
        repeated_seqs, slow, tenants = planned
        cols = ", ".join(f'"{c}"' for c in _PART)
        d = _frame(engine, conn, f"SELECT {cols} FROM receipt_lines WHERE part_month = :m AND seq <= :s "
                                 f"AND line_kind = 'part' AND {FAST} ORDER BY seq", p, _PART,
                   sentinel(_PART), 1)
        ivs = _frame(engine, conn, f"SELECT {', '.join(_IV)} FROM receipt_lines WHERE part_month = :m "
                                   f"AND seq <= :s AND line_kind = 'unknown' AND plain = 1 ORDER BY seq, line_no",
                     p, _IV, sentinel(_IV), 2)
    if len(repeated_seqs):
        d = d[~np.isin(d["seq"].to_numpy(dtype="int64"), repeated_seqs)].reset_index(drop=True)
    seqs = d["seq"].to_numpy(dtype="int64")
    ivs = ivs[np.isin(ivs["seq"].to_numpy(dtype="int64"), seqs)].reset_index(drop=True)
    d["i"] = np.arange(len(d))
    d["by_policy"] = np.where(d["by_policy"].to_numpy(dtype="float64") == 1, "OBJECT", None)
    ivs["i"] = np.searchsorted(seqs, ivs["seq"].to_numpy(dtype="int64"))
    if len(ivs):  # a resolution is stored as its JSON; the statement shows its text
        texts = {v: resolution_text(json.loads(v)) for v in ivs["resolution"].dropna().unique()}
        ivs["resolution"] = ivs["resolution"].map(texts).astype(object).where(ivs["resolution"].notna(), None)
    parts, u_parts = [], []
    if len(d):
        flat, unk = flat_rows(d, ivs)
        parts.append(flat.assign(_seq=seqs))
        if len(unk):
            u_parts.append(unk.assign(_seq=ivs["seq"].to_numpy(dtype="int64")))
    if progress:
        progress(len(d) + len(slow), len(d) + len(slow))
    return assemble(engine, month, seq_head, head, slow, parts, u_parts, tenants)
