"""The month's long table as CSV, streamed: the receipt lines read into Arrow, every level and the run rows
computed and formatted by DuckDB, the run rows written batch by batch; no pandas frame or Python object per run.

:func:`write_month_csv` writes the same bytes as :func:`reports.export.build_statement` followed by
:func:`reports.export.write_csv` (the reference, which stays the definition; tests/test_long_csv.py holds
the two equal byte for byte on generated ledgers, with hypothesis). It answers only months it can write
exactly that way and returns None for the others, which the caller then writes by the reference.

Which rows come from where is the reference's own plan (:func:`reports.issued_lines.plan`): a run issued once
and billed whole in the month, of the ordinary shape, from its lines (read in Arrow, computed in DuckDB);
every issue of a run issued more than once, and every receipt split over months, open or of an odd shape,
from its JSON through the dict path (:func:`reports.issued_columns.dict_path`: a few rows as a rule, built in
pandas and handed to DuckDB), the corrections with them. It declines a month when

* a run row's window is not spelled ``YYYY-MM-DDTHH:MM:SSZ`` (an end may be missing), or an interval timed by
  its span has another spelling;
* a text cell is one :func:`ledger.base.textsafe.csv_cell` would change (a formula prefix, a control character);
* a figure reaches 10^8 in magnitude (GPU-hours or money);
* the month has no row from the lines, or the lines cannot answer at all (as ``plan``);
* there is a ``--tenant`` or aliasing, or the ledger is not a SQLite file the ADBC driver reads.

How it matches the reference: the run rows' figures are flat_rows' formulas
(:func:`reports.issued_columns.flat_rows`) written in SQL over the same stored doubles; the aggregates come from
the very scan the reference runs (:func:`reports.monthly.scan`, here over the same rows in the same order)
and the same roll-ups, and the total/tenant/class/hour rows are the reference's own (:func:`long_table` of a
statement without run rows, formatted by :mod:`reports.csvwrite`); a figure is rounded as pandas' ``round``
does (``rint(x * 10**d) / 10**d``: DuckDB's ``round_even`` of the scaled value) and printed as ``%.6f`` prints
it (:func:`_number_cell`), the text cells quoted as the csv module quotes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import csvwrite, issued_lines
from .issued import ledger_head
from .energy_columns import energy_sql_of_lines
from .lens_columns import LENS_METHOD_VERSIONS, lens_sql_of_lines
from .monthly import MONEY_COLUMNS, SUM_COLUMNS, month_bounds

BATCH_ROWS = 100_000
LARGE = 1e8  # a run whose figure reaches this is left to the reference (see _eligible_sql)
_Z = "%Y-%m-%dT%H:%M:%SZ"
# the figures a run row sums, as flat_rows reads them (the lines' names)
_FIGURES = ("paid", "delivered", "th_thermal", "th_power_cap", "th_hw_slowdown", "th_sync_boost", "th_other",
            "underutilized", "starved", "idle_held", "unknown", "suspended", "cost_paid", "cost_delivered",
            "cost_lost", "before", "cost_adj", "after", "gbh", "flc", "pol_charge", "pol_credit", "pol_estimate",
            "pol_hold")
_TEXT = ("cluster", "job_id", "tenant", "partition", "qos", "user", "nodes", "sku", "receipt_hash",
         "replaces_hash", "currency")
_PART = {c: c for c in ("seq", *_TEXT, "run", "n_devices", "window_start", "window_end", "by_policy", "plain",
                        "n_parts", "open", "method_version", *_FIGURES)}
_IV = {"seq": "seq", "line_no": "pos", "iv_device": "device", "iv_start": "start", "iv_end": "end",
       "iv_resolution": "resolution", "iv_gpu_hours": "gpu_hours"}


@dataclass(frozen=True)
class Written:
    """What the CLI reports of a statement it wrote (the fields of :class:`reports.export.Statement` it reads)."""

    totals: dict
    through_seq: int
    head_hash: str
    empty: bool = False
    notes: list[str] = field(default_factory=list)


def _resolved(seqs: np.ndarray, n_dev: np.ndarray, ivs) -> np.ndarray | None:  # noqa: ANN001 - an Arrow table
    """Each run's resolved unknown GPU-hours from its interval lines, summed in line order as flat_rows does;
    None where an interval timed by its span has a spelling only :func:`reports.monthly.epoch` reads."""
    import pyarrow.compute as pc

    from .issued_columns import epochs_of

    out = np.zeros(len(seqs))
    if not ivs.num_rows:
        return out
    iseq = ivs.column("seq").to_numpy()
    row = np.searchsorted(seqs, iseq)
    if (row >= len(seqs)).any() or (seqs[np.minimum(row, len(seqs) - 1)] != iseq).any():
        return None
    timed = ivs.column("gpu_hours").is_null().to_numpy(zero_copy_only=False)
    s, s_odd = epochs_of(ivs.column("start"))
    e, e_odd = epochs_of(ivs.column("end"))
    if (timed & (s_odd | e_odd)).any():
        return None
    device = ivs.column("device")
    truthy = pc.fill_null(pc.not_equal(device, ""), False).to_numpy(zero_copy_only=False)
    per = np.where(truthy, 1, np.maximum(n_dev[row], 1))
    with np.errstate(invalid="ignore"):
        spanned = np.where(e > s, (e - s) / 3600.0 * per, 0.0)
    hours = np.nan_to_num(ivs.column("gpu_hours").to_numpy(zero_copy_only=False).astype("float64"), nan=0.0,
                          posinf=np.inf, neginf=-np.inf)
    h = np.where(timed, spanned, hours)
    has_res = ivs.column("resolution").is_valid().to_numpy(zero_copy_only=False)
    pos = ivs.column("pos").to_numpy()
    for k in range(int(pos.max()) + 1):  # in line order, like flatten's +=
        at = (pos == k) & has_res
        np.add.at(out, row[at], h[at])
    return out


def _flat_sql() -> str:
    """The statement's flat rows (the columns :func:`reports.monthly.scan` and the run rows read) from the
    lines in ``lines``: flat_rows' formulas, for receipts without adjustment lines."""
    num = {c: f"coalesce({c}, 0.0)" for c in _FIGURES}
    unk, ph = num["unknown"], num["pol_hold"]
    riv = f"CASE WHEN {unk} < resolved_iv THEN {unk} ELSE resolved_iv END"  # Python's min(resolved, unknown)
    by_pol = f"CASE WHEN 0.0 > {unk} - {ph} THEN 0.0 ELSE {unk} - {ph} END"  # max(unknown - hold, 0.0)
    before = f"CASE WHEN before IS NOT NULL THEN before ELSE {num['cost_paid']} END"
    return f"""
    SELECT seq, 'usage' AS row_kind, {", ".join(f'"{c}"' for c in _TEXT)}, coalesce(run, 0) AS run,
      window_start AS ws, window_end AS we,
      epoch(strptime(window_start, '{_Z}')) AS window_start, epoch(strptime(window_end, '{_Z}')) AS window_end,
      {num["paid"]} AS paid, {num["delivered"]} AS delivered,
      {", ".join(f'{num["th_" + c]} AS throttled_{c}' for c in ("thermal", "power_cap", "hw_slowdown",
                                                                  "sync_boost", "other"))},
      {num["underutilized"]} AS underutilized, {num["starved"]} AS starved, {num["idle_held"]} AS idle_held,
      {unk} AS unknown,
      CASE WHEN bp THEN {by_pol} ELSE {riv} END AS unknown_resolved,
      {unk} - CASE WHEN bp THEN {by_pol} ELSE {riv} END AS unknown_pending,
      {", ".join(f"CASE WHEN bp THEN {num['pol_' + p]} ELSE 0.0 END AS unknown_{p}"
                 for p in ("charge", "credit", "estimate"))},
      CASE WHEN bp THEN {ph} ELSE {unk} - {riv} END AS unknown_hold,
      {num["suspended"]} AS suspended, CASE WHEN gbh IS NOT NULL THEN gbh ELSE {num["paid"]} END AS billed_gpu_hours,
      0.0 AS adjustment_gpu_hours, {num["flc"]} AS failure_loss_credited,
      {num["cost_paid"]} AS cost_paid, {num["cost_delivered"]} AS cost_delivered, {num["cost_lost"]} AS cost_lost,
      {before} AS billed_before_adjustments, {num["cost_adj"]} AS adjustment_cost,
      CASE WHEN after IS NOT NULL THEN after ELSE {before} + {num["cost_adj"]} END AS billed,
      {lens_sql_of_lines(num["paid"])}, {energy_sql_of_lines(num["paid"])}
    FROM (SELECT *, coalesce(by_policy = 1, false) AS bp FROM lines)
    """


def _text_cell(col: str) -> str:
    """A text column as the csv module writes it (QUOTE_MINIMAL, ``"`` doubled), missing as empty."""
    quote = " OR ".join(f"contains({col}, chr({ord(c)}))" for c in csvwrite.quoting_chars()) or "false"
    return (f"CASE WHEN {col} IS NULL THEN '' WHEN {quote} "
            f"THEN '\"' || replace({col}, '\"', '\"\"') || '\"' ELSE {col} END")


def _rounded(expr: str, decimals: int) -> str:
    """pandas' ``round(decimals)`` of a double: ``rint(x * 10**d) / 10**d``."""
    f = f"{10.0 ** decimals:.1f}"
    return f"round_even(({expr}) * {f}, 0) / {f}"


def _number_cell(col: str) -> str:
    """A rounded double as ``"%.6f" % value`` writes it: below 1e9 the value is the double nearest a whole
    number of millionths, which DECIMAL(18,6) prints exactly (≈ 2× faster than ``printf``), with the sign of a
    negative zero kept as ``%`` keeps it; larger values by ``printf``, which formats as C does."""
    return (f"CASE WHEN abs({col}) < 1e9 THEN CASE WHEN {col} = 0 AND signbit({col}) THEN '-0.000000' "
            f"ELSE CAST(CAST({col} AS DECIMAL(18,6)) AS VARCHAR) END ELSE printf('%.6f', {col}) END")


def _run_lines_sql(month: str, through_seq: int, head_hash: str) -> str:
    """One CSV line per run row, the long table's columns in order (reports.export.LONG_COLUMNS)."""
    from .export import HOURS_DECIMALS, LONG_COLUMNS

    money = set(MONEY_COLUMNS)
    cells = {"level": "'run'", "month": f"'{month}'", "hour": "''", "row_kind": _text_cell("row_kind"),
             "window_start": _text_cell("ws"), "window_end": _text_cell("we"), "run": "CAST(run AS VARCHAR)",
             "runs": "CASE WHEN row_kind = 'usage' THEN '1' ELSE '0' END",
             "corrections": "CASE WHEN row_kind = 'correction' THEN '1' ELSE '0' END",
             "through_seq": f"'{int(through_seq)}'",
             "head_hash": f"'{head_hash}'"}
    for c in ("tenant", "partition", "qos", "currency", "cluster", "job_id", "user", "nodes", "sku",
              "receipt_hash", "replaces_hash"):
        cells[c] = _text_cell(f'"{c}"')
    rounded = {"lost": _rounded("paid - delivered", HOURS_DECIMALS),
               **{c: _rounded(f'"{c}"', 2 if c in money else HOURS_DECIMALS) for c in SUM_COLUMNS}}
    for c in rounded:
        cells[c] = _number_cell(f'"r_{c}"')
    if set(cells) != set(LONG_COLUMNS):
        raise AssertionError(f"run cells {sorted(set(cells) ^ set(LONG_COLUMNS))}")
    inner = ", ".join(f'{e} AS "r_{c}"' for c, e in rounded.items())
    # concat_ws: one string built per row (a chain of || builds one per cell); no cell is NULL
    return (f"SELECT concat_ws(',', {', '.join(cells[c] for c in LONG_COLUMNS)}) || chr(10) AS line "
            f"FROM (SELECT *, {inner} FROM flat)")


def _eligible_sql() -> str:
    """How many of the month's rows the stream does not answer (see the module doc): any declines the month."""
    from ledger.base.textsafe import RISKY_RE2

    from .issued_columns import ISO_Z

    risky = " OR ".join(f"regexp_matches(\"{c}\", '{RISKY_RE2}')" for c in _TEXT)
    # |figure| < 1e8: every value a run row derives stays below 1e9, where the rounding is pandas' to the bit
    large = " OR ".join(f"abs({c}) >= {LARGE:g}" for c in (*_FIGURES, "resolved_iv"))
    return (f"SELECT count(*) FILTER (WHERE NOT (regexp_full_match(window_start, '{ISO_Z}') "
            f"AND try_strptime(window_start, '{_Z}') IS NOT NULL AND (window_end IS NULL OR "
            f"(regexp_full_match(window_end, '{ISO_Z}') AND try_strptime(window_end, '{_Z}') IS NOT NULL)) "
            f"AND coalesce(year(try_strptime(window_start, '{_Z}')) >= 1000, false)) OR coalesce({risky}, false) "
            f"OR coalesce({large}, false)) FROM lines")


def _ledger_wide(conn, seq_head: int) -> np.ndarray | None:  # noqa: ANN001
    """The ledger-wide part of :func:`reports.issued_lines.plan`'s slow set (every issue of a run issued more
    than once, and the issues with a line without a month that is not plain), or None when the lines cannot
    answer; the month's own odd rows are found on the rows read. The same conditions as ``plan``, asked of
    the covering indexes (0.8–0.9 s at a million issues, where ``plan`` takes 3.2–3.9 s)."""
    from sqlalchemy import text

    from ledger.chain import receipt_lines
    from ledger.chain.kinds import Kind

    p = {"s": seq_head, "k": Kind.RECEIPT_ISSUED}
    if not receipt_lines.has_table(conn):
        return None
    issues = conn.execute(text("SELECT COUNT(*) FROM entries WHERE kind = :k AND seq <= :s"), p).scalar()
    by_run = "receipt_lines INDEXED BY ix_receipt_lines_run"
    keyed = conn.execute(text(f"SELECT COUNT(*) FROM {by_run} WHERE run_key IS NOT NULL AND seq <= :s"),
                         p).scalar()
    if int(issues or 0) != int(keyed or 0) or \
            conn.execute(text(f"SELECT 1 FROM {by_run} WHERE run_key = '' AND seq <= :s LIMIT 1"), p).first():
        return None
    slow = [int(r[0]) for q in (
        f"SELECT seq FROM {by_run} WHERE run_key IN (SELECT run_key FROM {by_run} WHERE run_key IS NOT NULL "
        f"AND seq <= :s GROUP BY run_key HAVING COUNT(*) > 1) AND seq <= :s",
        f"SELECT DISTINCT seq FROM receipt_lines WHERE part_month IS NULL AND line_kind = 'part' AND seq <= :s "
        f"AND NOT ({issued_lines.FAST})") for r in conn.execute(text(q), p)]
    return np.unique(np.array(slow, dtype="int64"))


def _read(engine, month: str, seq_head: int):  # noqa: ANN001, ANN202
    """(the month's part lines read from their lines, the resolved hours of each, the seqs the dict path
    reads) as Arrow/numpy; None when the lines cannot answer. The lines are read by two threads, each a half
    of the month's seqs (the ADBC driver and Arrow's stream reader run SQLite without the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.compute as pc
    from sqlalchemy import text

    path = issued_lines.sqlite_file(engine)
    if path is None:
        return None
    p = {"s": seq_head, "m": month}
    with engine.connect() as conn:
        lo, hi = conn.execute(text("SELECT MIN(seq), MAX(seq) FROM receipt_lines WHERE part_month = :m "
                                   "AND seq <= :s"), p).first()
    if lo is None:
        return None
    mid = (int(lo) + int(hi)) // 2
    cols = ", ".join(f'"{c}"' for c in _PART)

    def part(a: int, b: int):  # noqa: ANN202
        return issued_lines.arrow_sqlite(
            path, f"SELECT {cols} FROM receipt_lines WHERE part_month = :m AND seq > :a AND seq <= :b "
                  f"AND line_kind = 'part' ORDER BY seq", {**p, "a": a, "b": b}, _PART,
            issued_lines.sentinel(_PART), 1)

    def intervals():  # noqa: ANN202
        return issued_lines.arrow_sqlite(
            path, f"SELECT {', '.join(_IV)} FROM receipt_lines WHERE part_month = :m AND seq <= :s "
                  f"AND line_kind = 'unknown' AND plain = 1 ORDER BY seq, line_no", p, _IV,
            issued_lines.sentinel(_IV), 2)

    def ledger_wide() -> np.ndarray | None:
        with engine.connect() as conn:
            return _ledger_wide(conn, seq_head)

    # The ledger-wide questions first, on SQLAlchemy's connection (Python's own SQLite library), not beside
    # the reads: the ADBC driver links its own copy of SQLite, and two copies in one process do not see each
    # other's POSIX locks (sqlite.org, "How To Corrupt An SQLite Database File", 2.2), so they are never
    # interleaved here.
    slow = ledger_wide()
    if slow is None:
        return None
    bounds = [(int(lo) - 1, mid), (mid, int(hi))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = [pool.submit(part, a, b) for a, b in bounds]
        ivs = intervals()
        halves = [h.result() for h in halves]
    # SQLite may answer a connection opened while others open "database is locked" (the driver sets no busy
    # timeout): what failed is read once more, alone
    halves = [part(a, b) if h is None else h for h, (a, b) in zip(halves, bounds)]
    ivs = intervals() if ivs is None else ivs
    if ivs is None or any(h is None for h in halves):
        return None
    lines = pa.concat_tables(halves)
    fast = pc.and_(pc.and_(pc.equal(lines.column("plain"), 1), pc.equal(lines.column("n_parts"), 1)),
                   pc.equal(lines.column("open"), 0)).fill_null(False)
    # a receipt with the effective-compute lens is read from its JSON (issued_lines.FAST: LINES_WITHOUT_LENS)
    fast = pc.and_(fast, pc.invert(pc.is_in(lines.column("method_version"),
                                            pa.array(LENS_METHOD_VERSIONS, pa.string()))).fill_null(True))
    seqs = lines.column("seq").to_numpy()
    slow = np.union1d(slow, seqs[~fast.to_numpy(zero_copy_only=False)])
    if len(slow):  # the month's other rows come from the dict path
        keep = ~np.isin(seqs, slow)
        lines, seqs = lines.filter(pa.array(keep)), seqs[keep]
        ivs = ivs.filter(pa.array(np.isin(ivs.column("seq").to_numpy(), seqs)))
    if not lines.num_rows:
        return None
    n_dev = lines.column("n_devices").fill_null(0).to_numpy()
    resolved = _resolved(seqs, n_dev, ivs)
    # what the rows no longer need is let go (≈ 100 MB at a million rows): the shape flags, and figures no
    # receipt of the month has (the view `lines` gives them back as NULL)
    keep = [c for c in lines.column_names if c not in ("plain", "n_parts", "open", "method_version")
            and not (c in _FIGURES and lines.column(c).null_count == lines.num_rows)]
    return None if resolved is None else (lines.select(keep), resolved, slow)


def _dict_rows(engine, month: str, seq_head: int, slow: np.ndarray):  # noqa: ANN001, ANN202
    """The rows the dict path bills in ``month`` for the issues ``slow`` (usage rows, then corrections), as an
    Arrow table of the flat view's columns with their place in the statement's order; and the number of
    corrections. None when a row is one the stream does not answer (a name the CSV neutralises, a figure
    of LARGE or more)."""
    import pandas as pd
    import pyarrow as pa

    from ledger.base.textsafe import risky_cells

    from .export import correction_flat, iso_text
    from .issued_columns import dict_path
    from .monthly import GROUP_KEYS

    _, usage, corrections = dict_path(engine, month, seq_head, slow)
    corr = correction_flat(corrections).rows
    rows = pd.concat([usage.assign(_ord=0), corr.assign(_ord=1, _seq=np.arange(len(corr), dtype="int64"))],
                     ignore_index=True)
    text_cols = ("row_kind", *(c for c in _TEXT if c not in GROUP_KEYS), *GROUP_KEYS)
    if any(risky_cells(rows[c]) is None or risky_cells(rows[c]).any() for c in text_cols if len(rows)) or \
            (np.abs(rows[list(SUM_COLUMNS)].to_numpy(dtype="float64")) >= LARGE).any():
        return None
    t = pa.table({**{c: pa.array(rows[c].to_numpy(dtype=object), pa.string(), from_pandas=True)
                     for c in text_cols},
                  "ws": pa.array(iso_text(rows["window_start"]).to_numpy(dtype=object), pa.string(), from_pandas=True),
                  "we": pa.array(iso_text(rows["window_end"]).to_numpy(dtype=object), pa.string(), from_pandas=True),
                  **{c: pa.array(rows[c].to_numpy(dtype="float64")) for c in ("window_start", "window_end",
                                                                               *SUM_COLUMNS)},
                  "run": pa.array(rows["run"].to_numpy(dtype="int64")),
                  "seq": pa.array(rows["_seq"].to_numpy(dtype="int64")),
                  "_ord": pa.array(rows["_ord"].to_numpy(dtype="int64")),
                  "_tb": pa.array(np.arange(len(rows), dtype="int64"))})
    return t, len(corrections)


def write_month_csv(engine, month: str, path: str | Path, as_of: int | None = None,  # noqa: ANN001
                    progress: Callable[[int, int], None] | None = None) -> Written | None:
    """Write the month's long-table CSV to ``path`` as the reference does (see the module doc); None, having
    written nothing, for a month it does not answer."""
    import duckdb
    import pyarrow as pa

    from ledger.base.textsafe import neutralise_frame

    from .export import Statement, long_table
    from .monthly import Flat, flatten, scan, summary_of_scan

    start, end = month_bounds(month)
    seq_head, head = ledger_head(engine, as_of)
    got = _read(engine, month, seq_head)
    if got is None:
        return None
    lines, resolved, slow = got
    extra, n_corrections = None, 0
    if len(slow):
        made = _dict_rows(engine, month, seq_head, slow)
        if made is None:
            return None
        extra, n_corrections = made
    con = duckdb.connect()
    try:
        con.register("line_rows", lines.append_column("resolved_iv", pa.array(resolved)))
        absent = [c for c in _FIGURES if c not in lines.column_names]
        con.execute("CREATE TEMP VIEW lines AS SELECT *" + "".join(f', NULL::DOUBLE AS "{c}"' for c in absent)
                    + " FROM line_rows")
        if con.execute(_eligible_sql()).fetchall()[0][0]:
            return None
        if extra is None or not extra.num_rows:
            con.execute(f"CREATE TEMP VIEW flat AS {_flat_sql()}")
        else:  # the statement's order: usage rows by seq (lines and dict path merged), then corrections
            con.register("extra", extra)
            con.execute(f"CREATE TEMP VIEW flat AS SELECT * EXCLUDE (_ord, _tb) FROM (SELECT *, 0 AS _ord, 0 AS _tb "
                        f"FROM ({_flat_sql()}) UNION ALL BY NAME SELECT * FROM extra) ORDER BY _ord, seq, _tb")
        summary = summary_of_scan(scan(None, con))
        empty = flatten([])
        st = Statement(month=month, period_start=start.strftime(_Z), period_end=end.strftime(_Z),
                       through_seq=seq_head, head_hash=head, tenant=None, aliased=False,
                       flat=Flat(rows=empty.rows, unknowns=empty.unknowns, adjustments=empty.adjustments),
                       summary=summary)
        csvwrite.write_csv(neutralise_frame(long_table(st)), path)  # header, total, tenant, class, hour rows
        reader = con.sql(_run_lines_sql(month, seq_head, head)).to_arrow_reader(BATCH_ROWS)
        with open(path, "ab") as f:
            for batch in reader:
                f.write(_text_bytes(batch.column(0)))
    finally:
        con.close()
    if progress:
        progress(lines.num_rows + len(slow), lines.num_rows + len(slow))
    notes = [f"{n_corrections} correction(s) to earlier months' runs are billed in {month}."] if n_corrections \
        else []
    return Written(totals=summary.totals, through_seq=seq_head, head_hash=head, notes=notes)


def _text_bytes(arr: Any) -> memoryview:
    """The concatenated values of an Arrow string array (no separator), without a Python string per value."""
    import pyarrow as pa

    if pa.types.is_string_view(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
        width = np.int64
    else:
        width = np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset:arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")
