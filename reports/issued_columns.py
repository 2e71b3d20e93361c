"""A month's billed receipts read column-wise: the issue payloads are parsed by DuckDB's JSON reader in
batches and the statement's flat rows built as columns, without a Python dict per receipt.

The result is the same as :func:`reports.issued.load_issues` followed by :func:`reports.issued.select_month`
and :func:`reports.monthly.flatten` (tests/test_export_columns.py checks it on generated ledgers with
corrections, adjustments and odd shapes). The billing rule is planned with vectorised operations: a run
issued once is billed in the month its window ends and never corrected, so only runs issued more than once
go through :func:`reports.issued.select_month` (the dict path), and so does every receipt whose shape the
column reader does not take as plainly well formed (a number written as text, an adjustment line, a
resolution object, a receipt at the payload's top level, ...): for those the dict path *is* the definition.
A ledger holding an issue that names its receipt by hash alone is read by the dict path entirely
(:func:`read_month` returns None). Memory holds one batch of payload text, a small index of every issue
and the flat rows of the month's single-issue runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import bindparam, text

from ledger.base import periods
from .energy_columns import ENERGY_FIELDS, energy_columns_of
from .lens_columns import LENS_FIELDS, lens_columns_of
from .issued import Correction, Issue, is_receipt, flatten_issues, ledger_closes, ledger_head, select_month
from .monthly import (ROW_COLUMNS, TEXT_COLUMNS, UNKNOWN_COLUMNS, Flat, column_dtype, epoch, flatten, month_bounds)

BATCH = 20_000
_NUM = ("DOUBLE", "UBIGINT", "BIGINT")
_INT = ("UBIGINT", "BIGINT")
_OBJ = ("OBJECT",)
_TEXT = ("VARCHAR",)
_TEXTY = ("VARCHAR", "UBIGINT", "BIGINT")  # written with str(): JSON integers print the same digits

# (name, path under the receipt, JSON types accepted besides null/missing). Every field flatten reads.
_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("receipt_t", "", _OBJ), ("job", "job", _OBJ), ("gh", "gpu_hours", _OBJ), ("th", "gpu_hours.throttled", _OBJ), ("cost", "cost", _OBJ),
    ("win", "window", _OBJ), ("contract", "contract", _OBJ), ("method", "method", _OBJ),
    ("billing", "billing", _OBJ), ("ledger", "ledger", _OBJ), ("adjs", "adjustments", ("ARRAY",)),
    ("ivs", "unknown_intervals", ("ARRAY",)), ("devices", "job.devices", ("ARRAY",)),
    ("cluster", "job.cluster", _TEXT), ("job_id", "job.job_id", _TEXTY), ("account", "job.account", _TEXT),
    ("namespace", "job.namespace", _TEXT), ("tenant_", "job.tenant", _TEXT), ("partition", "job.partition", _TEXT),
    ("qos", "job.qos", _TEXT), ("user", "job.user", _TEXT), ("contract_id", "contract.id", _TEXT),
    ("contract_version", "contract.version", _TEXTY), ("method_name", "method.name", _TEXTY),
    ("method_version", "method.version", _TEXTY), ("receipt_hash", "receipt_hash", _TEXT),
    ("replaces_hash", "_replaces_hash", _TEXT), ("currency", "cost.currency", _TEXT),
    ("start", "window.start", _TEXT), ("end", "window.end", _TEXT), ("open_", "open", ("BOOLEAN",)),
    ("run", "job.run", _INT), ("through_seq", "ledger.through_seq", _INT),
    ("paid", "gpu_hours.paid", _NUM), ("delivered", "gpu_hours.delivered", _NUM),
    ("underutilized", "gpu_hours.underutilized", _NUM), ("starved", "gpu_hours.starved", _NUM),
    ("idle_held", "gpu_hours.idle_held", _NUM), ("unknown", "gpu_hours.unknown", _NUM),
    ("suspended", "gpu_hours.suspended", _NUM),
    *((f"th_{c}", f"gpu_hours.throttled.{c}", _NUM)
      for c in ("thermal", "power_cap", "hw_slowdown", "sync_boost", "other")),
    ("cost_paid", "cost.paid", _NUM), ("cost_delivered", "cost.delivered", _NUM), ("cost_lost", "cost.lost", _NUM),
    ("before", "cost.billed_before_adjustments", _NUM), ("cost_adj", "cost.adjustments", _NUM + ("ARRAY", "OBJECT")),
    ("after", "cost.billed_after_adjustments", _NUM), ("gbh", "billing.gpu_hours_billed", _NUM),
    ("flc", "billing.lost_since_checkpoint_credited", _NUM),
    ("by_policy", "billing.unknown_gpu_hours_by_policy", _OBJ + ("ARRAY", "VARCHAR", "DOUBLE", "UBIGINT", "BIGINT",
                                                                  "BOOLEAN")),
    *((f"pol_{p}", f"billing.unknown_gpu_hours_by_policy.{p}", _NUM) for p in ("charge", "credit", "estimate", "hold")),
    *LENS_FIELDS,
    *ENERGY_FIELDS,
)
_RESOLUTION_KEYS = ("as", "resolution", "kind", "policy", "outcome")
_IV_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("id", "id", _TEXT), ("device", "device", _TEXT), ("node", "node", _TEXT), ("start", "start", _TEXT),
    ("end", "end", _TEXT), ("cause", "cause", _TEXT), ("policy", "policy", _TEXT),
    ("resolution", "resolution", ("VARCHAR", "OBJECT")), ("gpu_hours", "gpu_hours", _NUM),
    # a resolution object is shown as its first truthy one of these keys (flatten's resolution_text)
    *((f"res_{k}", f"resolution.{k}", _TEXT) for k in _RESOLUTION_KEYS),
)
_READ_FURTHER = {"devices", "method", "adjs"}
_NUMERIC_ALSO = {"cost_adj"}  # a number when it is one (a list or object there is ignored, as flatten does)


def _field_sql(fields, source: str, prefix: str) -> tuple[str, str]:  # noqa: ANN001
    """(the SELECT list of each field's value, the condition that every field has an accepted JSON type)."""
    paths = ", ".join(f"'{prefix}{p}'" if p else f"'{prefix.rstrip('.')}'" for _, p, _ in fields)
    cols, ok = [], []
    for i, (name, _, types) in enumerate(fields, start=1):
        t = f"t[{i}]"
        accepted = ", ".join(f"'{x}'" for x in (*types, "NULL"))
        ok.append(f"({t} IS NULL OR {t} IN ({accepted}))")
        if types == _NUM or name in _NUMERIC_ALSO:
            # JSON integers become floats as Python's float(int) does (correctly rounded; "-0" is 0.0)
            cols.append(f"CASE WHEN {t} = 'DOUBLE' THEN CAST(v[{i}] AS DOUBLE) "
                        f"WHEN {t} IN ('UBIGINT', 'BIGINT') THEN CAST(v[{i}] AS DOUBLE) + 0.0 END AS {name}")
        elif types == _INT:
            cols.append(f"CASE WHEN {t} IN ('UBIGINT', 'BIGINT') THEN CAST(v[{i}] AS BIGINT) END AS {name}")
        elif name == "resolution":  # text, or an object shown by one of its keys (see _interval_sql)
            cols.append(f"CASE WHEN {t} = 'VARCHAR' THEN v[{i}] END AS resolution_text, {t} AS res_t")
        elif types in (_TEXT, _TEXTY, ("BOOLEAN",)):
            cols.append(f"CASE WHEN {t} <> 'NULL' THEN v[{i}] END AS {name}")
        else:  # a container: its JSON type, and its text for the few read further
            cols.append(f"{t} AS {name}" + (f", v[{i}] AS {name}_json" if name in _READ_FURTHER else ""))
    return (f"json_type({source}, [{paths}]) AS t, json_extract_string({source}, [{paths}]) AS v",
            ", ".join(cols), " AND ".join(ok))


def _receipt_sql() -> str:
    """One row per payload: whether the column reader takes it (``fast``) and every field flatten reads.
    The payload is parsed twice (types, values); the devices list again, on its own text only."""
    sel, cols, ok = _field_sql(_FIELDS, "payload", "$.receipt.")
    return f"""
    WITH p AS (SELECT i, {sel}, json_extract_string(payload, '$.receipt.devices[*].share') AS shares_v
               FROM batch),
    q AS (
      SELECT i, t AS tt, shares_v, {cols} FROM p
    ), r AS (
      SELECT *, json_type(devices_json, '$[*]') AS dev_t,
             json_type(devices_json, '$[*].node') AS node_t, json_type(devices_json, '$[*].sku') AS sku_t,
             json_extract_string(devices_json, '$[*].node') AS node_v,
             json_extract_string(devices_json, '$[*].sku') AS sku_v
      FROM q
    )
    SELECT * EXCLUDE (tt, shares_v, dev_t, node_t, sku_t, node_v, sku_v, devices_json, method_json, adjs_json),
           receipt_t = 'OBJECT' AND job IS NOT NULL AND gh IS NOT NULL AND {ok.replace("t[", "tt[")}
             AND len(list_filter(dev_t, lambda x: x <> 'OBJECT')) = 0
             AND len(list_filter(node_t, lambda x: x NOT IN ('VARCHAR', 'NULL'))) = 0
             AND len(list_filter(sku_t, lambda x: x NOT IN ('VARCHAR', 'NULL'))) = 0
             AND (adjs IS DISTINCT FROM 'ARRAY' OR adjs_json = '[]')
             -- a shared device's receipt (its split-cost allocation) is read by the dict path
             AND len(list_filter(coalesce(shares_v, []), lambda x: x IS NOT NULL)) = 0 AS fast,
           coalesce(len(dev_t), 0) AS n_devices,
           CASE WHEN method = 'OBJECT' AND method_json <> '{{}}' THEN 1 ELSE 0 END AS method_keys,
           nullif(array_to_string(list_sort(list_distinct(list_filter(node_v, lambda x: x <> ''))), ','), '')
             AS nodes,
           CASE len(list_distinct(list_filter(sku_v, lambda x: x <> ''))) WHEN 0 THEN NULL
                WHEN 1 THEN list_distinct(list_filter(sku_v, lambda x: x <> ''))[1] ELSE 'mixed' END AS sku
    FROM r
    """


def _interval_sql() -> str:
    sel, cols, ok = _field_sql(_IV_FIELDS, "iv", "$.")
    first_truthy = "CASE " + " ".join(f"WHEN res_{k} <> '' THEN res_{k}" for k in _RESOLUTION_KEYS) + " END"
    return f"""
    WITH u AS (
      SELECT i, unnest(ivs) AS iv, generate_subscripts(ivs, 1) AS pos
      FROM (SELECT i, json_extract(payload, '$.receipt.unknown_intervals[*]') AS ivs FROM batch WHERE keep)
    ), p AS (SELECT i, pos, json_type(iv) AS iv_t, {sel} FROM u)
    SELECT i, pos, fast AND (res_t IS DISTINCT FROM 'OBJECT' OR resolution IS NOT NULL) AS fast,
           * EXCLUDE (i, pos, fast, resolution, resolution_text),
           CASE WHEN res_t = 'OBJECT' THEN resolution ELSE resolution_text END AS resolution
    FROM (
      SELECT i, pos, iv_t = 'OBJECT' AND {ok} AS fast, {cols},
             CASE WHEN res_t = 'OBJECT' THEN {first_truthy} END AS resolution
      FROM p)
    ORDER BY i, pos
    """


ISO_Z = r"^([1-9]\d{3}|0[1-9]\d\d|00[1-9]\d|000[1-9])-\d\d-\d\dT([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ$"


def epochs_of(values) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001 - a pandas Series or Arrow array
    """Epoch seconds of RFC 3339 text (NaN where missing or empty) and where a value needs :func:`epoch`
    itself (any spelling but ``YYYY-MM-DDTHH:MM:SSZ``); those cells are left NaN for the caller."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else \
        pa.array(values.to_numpy(dtype=object), type=pa.string(), from_pandas=True)
    plain = pc.fill_null(pc.match_substring_regex(arr, ISO_Z), False)
    ts = pc.strptime(pc.if_else(plain, arr, pa.scalar(None, pa.string())), format="%Y-%m-%dT%H:%M:%SZ",
                     unit="s", error_is_null=True)
    secs = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False)
    out = np.where(pd.isna(secs), np.nan, secs).astype("float64")
    parsed = pc.fill_null(pc.is_valid(ts), False).to_numpy(zero_copy_only=False)
    missing = pc.fill_null(pc.equal(arr, ""), True).to_numpy(zero_copy_only=False)
    return out, ~parsed & ~missing


def _epochs_now(values: pd.Series, needed: np.ndarray | None = None) -> np.ndarray:
    """:func:`epochs_of` with the odd spellings parsed (or refused, with the dict path's error) by :func:`epoch`,
    where ``needed`` (default: everywhere), as the dict path reads them."""
    out, slow = epochs_of(values)
    for k in np.flatnonzero(slow if needed is None else slow & needed):
        out[k] = epoch(values.iat[k])
    return out


def _truthy_text(v: pd.Series) -> np.ndarray:
    return (v.notna() & (v.fillna("") != "")).to_numpy()


def _or(*cols: pd.Series) -> pd.Series:
    """Python's ``a or b or c`` over text columns (the last one when none is truthy)."""
    out = cols[-1]
    for c in reversed(cols[:-1]):
        out = c.where(_truthy_text(c), out)
    return out


def _f(v: pd.Series) -> np.ndarray:
    return v.to_numpy(dtype="float64", na_value=np.nan)


def _num(v: pd.Series) -> np.ndarray:
    """flatten's ``_num``: missing and null count 0.0."""
    return np.nan_to_num(_f(v), nan=0.0, posinf=np.inf, neginf=-np.inf)


def _text(v: pd.Series) -> np.ndarray:
    return v.astype(object).where(v.notna(), None).to_numpy(dtype=object)


def _pmax0(a: np.ndarray) -> np.ndarray:
    return np.where(0.0 > a, 0.0, a)  # Python's max(a, 0.0): a unless 0.0 is greater (keeps -0.0)


def _pmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(b < a, b, a)  # Python's min(a, b): a unless b is smaller


def _placement(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """:func:`ledger.base.periods.placement` over arrays: the last paid instant, or the start."""
    return np.where(end > start, np.maximum(start, end - 1e-6), np.where(np.isnan(start), end, start))


def _month_index(t: np.ndarray) -> np.ndarray:
    d = pd.to_datetime(pd.Series(t, dtype="float64"), unit="s", utc=True)
    return (d.dt.year * 12 + d.dt.month).to_numpy(dtype="float64", na_value=np.nan)


def _multi_part(f: pd.DataFrame) -> np.ndarray:
    """Which of the receipts in ``f`` are open or whose window spans more than one month."""
    start, odd_start = epochs_of(f["start"])
    end, odd_end = epochs_of(f["end"])
    place = _placement(start, end)
    a, b = _month_index(np.where(np.isnan(start), place, start)), _month_index(place)
    spans = (a != b) & ~(np.isnan(a) & np.isnan(b))
    # odd timestamp spellings are parsed by the dict path, which also places them
    return spans | odd_start | odd_end | (f["open_"] == "true").fillna(False).to_numpy(dtype=bool)


def flat_rows(d: pd.DataFrame, ivs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """flatten()'s rows and unknown-interval lines for the fast receipts in ``d`` (no adjustment lines)."""
    n = len(d)
    n_dev = d["n_devices"].fillna(0).to_numpy(dtype="int64")
    tenant = _or(d["account"], d["namespace"], d["tenant_"])
    unknown = _num(d["unknown"])
    # unknown intervals: hours per line, summed per receipt in line order as flatten's loop does
    resolved = np.zeros(n)
    n_ivs = np.zeros(n, dtype="int64")
    unk = pd.DataFrame(columns=list(UNKNOWN_COLUMNS))
    if len(ivs):
        row = pd.Series(np.arange(n), index=d["i"].to_numpy())[ivs["i"].to_numpy()].to_numpy()
        timed = ivs["gpu_hours"].isna().to_numpy()
        s, e = _epochs_now(ivs["start"], timed), _epochs_now(ivs["end"], timed)
        per = np.where(_truthy_text(ivs["device"]), 1, np.maximum(n_dev[row], 1))
        spanned = np.where(e > s, (e - s) / 3600.0 * per, 0.0)
        h = np.where(timed, spanned, _num(ivs["gpu_hours"]))
        has_res = ivs["resolution"].notna().to_numpy()
        pos = ivs["pos"].to_numpy()
        for k in range(int(pos.max()) + 1 if len(pos) else 0):  # in line order, like the loop's +=
            at = (pos == k) & has_res
            np.add.at(resolved, row[at], h[at])
        n_ivs = np.bincount(row, minlength=n)
        cluster, job_id, run = _text(d["cluster"]), _text(d["job_id"]), d["run"].fillna(0).to_numpy(dtype="int64")
        unk = pd.DataFrame({
            "cluster": cluster[row], "job_id": job_id[row], "run": run[row], "tenant": _text(tenant)[row],
            **{c: _text(ivs[c]) for c in ("id", "device", "node", "start", "end", "cause")},
            "gpu_hours": h, "policy": _text(ivs["policy"]), "resolution": _text(ivs["resolution"]),
            "row_kind": "usage"}, columns=list(UNKNOWN_COLUMNS))
    by_policy = (d["by_policy"] == "OBJECT").fillna(False).to_numpy()
    pol = {p: _num(d[f"pol_{p}"]) for p in ("charge", "credit", "estimate", "hold")}
    resolved_iv = _pmin(resolved, unknown)
    hold = np.where(by_policy, pol["hold"], unknown - resolved_iv)
    resolved = np.where(by_policy, _pmax0(unknown - pol["hold"]), resolved_iv)
    zero = np.zeros(n)
    charge, credit, estimate = (np.where(by_policy, pol[p], zero) for p in ("charge", "credit", "estimate"))
    cost_paid = _num(d["cost_paid"])
    before = np.where(d["before"].notna().to_numpy(), _num(d["before"]), cost_paid)
    adj_cost = np.where(d["cost_adj"].notna().to_numpy(), _num(d["cost_adj"]), 0.0)
    billed = np.where(d["after"].notna().to_numpy(), _num(d["after"]), before + adj_cost)
    paid = _num(d["paid"])
    method = (d["method_name"].astype(object).where(d["method_name"].notna(), "None") + "/"
              + d["method_version"].astype(object).where(d["method_version"].notna(), "None"))
    cols: dict[str, Any] = {
        "row_kind": np.full(n, "usage", dtype=object), "cluster": _text(d["cluster"]), "job_id": _text(d["job_id"]),
        "tenant": _text(tenant), "partition": _text(d["partition"]), "qos": _text(d["qos"]), "user": _text(d["user"]),
        "nodes": _text(d["nodes"]), "sku": _text(d["sku"]), "contract_id": _text(d["contract_id"]),
        "contract_version": _text(d["contract_version"]),
        "method": np.where(d["method_keys"].to_numpy() > 0, method.to_numpy(dtype=object), None),
        "receipt_hash": _text(d["receipt_hash"]), "replaces_hash": _text(d["replaces_hash"]),
        "currency": _text(d["currency"]), "allocation": np.full(n, None, dtype=object),
        "run": d["run"].fillna(0).to_numpy(dtype="int64"), "through_seq": d["through_seq"].fillna(0).to_numpy(dtype="int64"),
        "window_start": _epochs_now(d["start"]), "window_end": _epochs_now(d["end"]),
        "paid": paid, "delivered": _num(d["delivered"]),
        **{f"throttled_{c}": _num(d[f"th_{c}"]) for c in ("thermal", "power_cap", "hw_slowdown", "sync_boost", "other")},
        "underutilized": _num(d["underutilized"]), "starved": _num(d["starved"]), "idle_held": _num(d["idle_held"]),
        "unknown": unknown, "unknown_resolved": resolved, "unknown_pending": unknown - resolved,
        "unknown_charge": charge, "unknown_credit": credit, "unknown_estimate": estimate, "unknown_hold": hold,
        "suspended": _num(d["suspended"]),
        "billed_gpu_hours": np.where(d["gbh"].notna().to_numpy(), _num(d["gbh"]), paid),
        "adjustment_gpu_hours": zero, "failure_loss_credited": _num(d["flc"]), "cost_paid": cost_paid, "cost_delivered": _num(d["cost_delivered"]),
        "cost_lost": _num(d["cost_lost"]), "billed_before_adjustments": before, "adjustment_cost": adj_cost,
        "billed": billed, "n_devices": n_dev, "n_unknown_intervals": n_ivs, "n_adjustments": np.zeros(n, dtype="int64"),
        **lens_columns_of(d, paid, _num(d["delivered"])),
        **energy_columns_of(d, paid),
    }
    # each column built in its final dtype (text stays object: no inference to a string dtype and back)
    rows = pd.DataFrame({c: pd.Series(np.asarray(cols[c], dtype=object) if c in TEXT_COLUMNS else cols[c],
                                      dtype=column_dtype(c), copy=False) for c in ROW_COLUMNS})
    return rows, unk


@dataclass(frozen=True)
class MonthRead:
    """What a statement needs from the ledger: the month's usage (flat, in sequence order), its
    corrections, the ledger head and every tenant named by an issue."""

    usage: Flat
    usage_seqs: np.ndarray
    corrections: list[Correction]
    through_seq: int
    head_hash: str
    tenants: set[str]


def _rows_by_seq(engine, seqs: list[int]):  # noqa: ANN001, ANN202
    """(seq, payload, recorded_at, ts) of the given issue entries, in sequence order."""
    sql = text("SELECT seq, payload, recorded_at, ts FROM entries WHERE seq IN :s ORDER BY seq").bindparams(
        bindparam("s", expanding=True))
    with engine.connect() as conn:
        for lo in range(0, len(seqs), 5000):
            yield from conn.execute(sql, {"s": seqs[lo:lo + 5000]}).fetchall()


def _issue(entry_seq: int, p: Any, recorded_at: Any, ts: Any) -> Issue | None:
    """The Issue :func:`reports.issued.load_issues` makes of one payload (None: hash only)."""
    p = p if isinstance(p, dict) else {}
    issued_at = epoch(p.get("issued_at") or recorded_at or ts)
    r = p.get("receipt")
    if is_receipt(r):
        return Issue(int(entry_seq), issued_at, r, p.get("receipt_hash"))
    if is_receipt(p):
        return Issue(int(entry_seq), issued_at, p, p.get("receipt_hash"))
    return None


def read_month(engine, month: str, through_seq: int | None = None,  # noqa: ANN001, C901
               progress=None, grace_s: float = 0.0) -> MonthRead | None:  # noqa: ANN001
    """The month's billed usage and corrections (see the module doc); None when an issue carries a hash only."""
    import duckdb
    import pyarrow as pa

    from ledger.chain.entries import Kind

    from .issued import issue_rows

    lo_t, hi_t = (b.timestamp() for b in month_bounds(month))
    seq_head, head = ledger_head(engine, through_seq)
    total = 0
    if progress:
        with engine.connect() as conn:
            total = int(conn.execute(text("SELECT COUNT(*) FROM entries WHERE kind = :k AND seq <= :s"),
                                     {"k": Kind.RECEIPT_ISSUED, "s": seq_head}).scalar() or 0)
    con = duckdb.connect()
    receipt_sql, interval_sql = _receipt_sql(), _interval_sql()
    index: list[pd.DataFrame] = []
    flats: list[pd.DataFrame] = []
    unks: list[pd.DataFrame] = []
    done = 0
    try:
        for rows in issue_rows(engine, seq_head, BATCH):
            if not rows:
                break
            seqs = np.fromiter((int(r[0]) for r in rows), dtype="int64", count=len(rows))
            batch = pa.table({"i": np.arange(len(rows)), "payload": pa.array([r[1] for r in rows], pa.string()),
                              "keep": np.zeros(len(rows), dtype=bool)})
            con.register("batch", batch)
            try:
                d = con.execute(receipt_sql).df()
            except duckdb.Error:  # not JSON DuckDB reads (NaN, ...): every row of the batch by the dict path
                d = pd.DataFrame({"i": np.arange(len(rows)), "fast": False})
            d = d.sort_values("i", kind="stable").reset_index(drop=True)
            fast = d["fast"].fillna(False).to_numpy(dtype=bool).copy()
            if fast.any():
                # receipts billed in more than one month, or open runs' (accrued, or not yet billed): the dict path
                f = d[fast]
                fast[np.flatnonzero(fast)[_multi_part(f)]] = False
            idx = pd.DataFrame({"seq": seqs, "fast": fast, "cluster": None, "job_id": None, "run": 0,
                                "tenant": None, "wend": np.nan, "wlo": np.nan})
            if fast.any():
                f = d[fast]
                end, end_slow = epochs_of(f["end"])
                start, start_slow = epochs_of(f["start"])
                # the dict path's errors for odd timestamps come from epoch itself, on the values it reads
                for k in np.flatnonzero(end_slow):
                    end[k] = epoch(f["end"].iat[k])
                need_start = np.isnan(end) & start_slow
                for k in np.flatnonzero(need_start):
                    start[k] = epoch(f["start"].iat[k])
                wend = _placement(start, end)
                idx.loc[fast, "cluster"] = _text(f["cluster"])
                idx.loc[fast, "job_id"] = f["job_id"].astype(object).where(f["job_id"].notna(), "None").to_numpy()
                idx.loc[fast, "run"] = f["run"].fillna(0).to_numpy(dtype="int64")
                idx.loc[fast, "tenant"] = _text(_or(f["account"], f["namespace"], f["tenant_"]))
                idx.loc[fast, "wend"] = wend
                idx.loc[fast, "wlo"] = wend
                here = (wend >= lo_t) & (wend < hi_t)
                if here.any():
                    m = f[here]
                    keep = np.zeros(len(rows), dtype=bool)
                    keep[m["i"].to_numpy()] = True
                    batch = batch.set_column(2, "keep", pa.array(keep))
                    con.register("batch", batch)
                    ivs = con.execute(interval_sql).df()
                    slow_i = set(ivs.loc[~ivs["fast"].fillna(False).astype(bool), "i"])
                    if slow_i:  # lines the column reader does not take: these receipts by the dict path
                        idx.loc[np.isin(np.arange(len(rows)), list(slow_i)), "fast"] = False
                        m = m[~m["i"].isin(slow_i)]
                        ivs = ivs[~ivs["i"].isin(slow_i)]
                    flat, unk = flat_rows(m.reset_index(drop=True), ivs.reset_index(drop=True))
                    flat["_seq"] = seqs[m["i"].to_numpy()]
                    flats.append(flat)
                    if len(unk):
                        unk["_seq"] = seqs[ivs["i"].to_numpy()]  # one line per interval, in the same order
                        unks.append(unk)
            for k in np.flatnonzero(~fast):
                r = rows[k]
                issue = _issue(r[0], json.loads(r[1]), r[2], r[3])
                if issue is None:
                    return None  # a receipt named by hash alone: recomputed by the dict path
                key = issue.key
                lo = issue.window_start
                place = periods.placement(lo, issue.window_end)
                idx.loc[k, ["cluster", "job_id", "run", "tenant", "wend", "wlo"]] = [
                    key[0], key[1], key[2], issue.tenant, place, place if math.isnan(lo) else lo]
            index.append(idx)
            done += len(rows)
            if progress:
                progress(done, total)
            if len(rows) < BATCH:
                break
    finally:
        con.close()
    return _finish(engine, month, seq_head, head, index, flats, unks, lo_t, hi_t)


def _rows_in(frame: pd.DataFrame, seqs: np.ndarray) -> pd.DataFrame:
    """The rows of ``frame`` whose ``_seq`` is one of ``seqs`` (the frame itself when all are)."""
    keep = np.isin(frame["_seq"].to_numpy(), seqs)
    return frame if keep.all() else frame[keep]


def _finish(engine, month, seq_head, head, index, flats, unks, lo_t, hi_t) -> MonthRead:  # noqa: ANN001, PLR0913
    """Plan which issue each run bills: single-issue runs from the index, the rest by the dict path."""
    idx = pd.concat(index, ignore_index=True) if index else pd.DataFrame(
        {"seq": pd.Series(dtype="int64"), "fast": pd.Series(dtype=bool), "cluster": None, "job_id": None, "run": 0,
         "tenant": None, "wend": pd.Series(dtype="float64"), "wlo": pd.Series(dtype="float64")})
    tenants = {t for t in idx["tenant"] if t}
    repeated = idx.duplicated(["cluster", "job_id", "run"], keep=False).to_numpy(dtype=bool)
    wend = idx["wend"].to_numpy(dtype="float64")
    fast = idx["fast"].to_numpy(dtype=bool)
    in_month = (wend >= lo_t) & (wend < hi_t)
    overlaps = in_month | ((idx["wlo"].to_numpy(dtype="float64") < hi_t) & (wend >= lo_t))
    slow_seqs = idx["seq"].to_numpy()[repeated | (~fast & overlaps)]
    fast_seqs = idx["seq"].to_numpy()[fast & ~repeated & in_month]
    return assemble(engine, month, seq_head, head, slow_seqs, [_rows_in(f, fast_seqs) for f in flats],
                    [_rows_in(u, fast_seqs) for u in unks], tenants)


def dict_path(engine, month: str, seq_head: int,  # noqa: ANN001
              seqs: np.ndarray) -> tuple[Flat, pd.DataFrame, list[Correction]]:
    """The issues ``seqs`` read from their JSON and planned by :func:`reports.issued.select_month`: their
    flat usage rows for ``month``, those rows with the ``_seq`` of their issue, and the month's corrections."""
    issues = []
    for entry_seq, payload, recorded_at, ts in _rows_by_seq(engine, [int(s) for s in seqs]):
        issues.append(_issue(entry_seq, json.loads(payload), recorded_at, ts))
    usage_d, corrections = select_month(issues, month, ledger_closes(engine, seq_head))
    d_flat = flatten_issues(usage_d, "usage")
    return d_flat, d_flat.rows.assign(_seq=np.array([i.seq for i in usage_d], dtype="int64")), corrections


def assemble(engine, month: str, seq_head: int, head: str, slow_seqs: np.ndarray,  # noqa: ANN001, PLR0913
             parts: list[pd.DataFrame], u_parts: list[pd.DataFrame], tenants: set[str]) -> MonthRead:
    """The month's usage from the fast readers' rows (``parts``, ``u_parts``: flat rows and unknown-interval
    lines, each with the ``_seq`` of its issue) and the issues ``slow_seqs`` read by the dict path, which
    also plans their billing and corrections."""
    d_flat, d_rows, corrections = dict_path(engine, month, seq_head, slow_seqs)
    rows = pd.concat([*parts, d_rows], ignore_index=True) if parts else d_rows
    if not rows["_seq"].is_monotonic_increasing:  # batches come in sequence order; the dict path's rows not
        rows = rows.sort_values("_seq", kind="stable").reset_index(drop=True)
    unknowns = d_flat.unknowns
    if any(len(u) for u in u_parts):
        d_unk = d_flat.unknowns.assign(_seq=np.repeat(d_rows["_seq"].to_numpy(),
                                                      d_flat.rows["n_unknown_intervals"].to_numpy()))
        unknowns = pd.concat([*u_parts, d_unk], ignore_index=True).sort_values("_seq", kind="stable")
        unknowns = unknowns.drop(columns="_seq").reset_index(drop=True)
    seqs = rows.pop("_seq").to_numpy()
    wrong = {c: column_dtype(c) for c in ROW_COLUMNS if str(rows[c].dtype) != column_dtype(c)}
    if wrong:  # e.g. an empty part; copying a million rows only when a column needs it
        rows = rows.astype(wrong)
    return MonthRead(usage=Flat(rows=rows, unknowns=unknowns, adjustments=d_flat.adjustments), usage_seqs=seqs,
                     corrections=corrections, through_seq=seq_head, head_hash=head, tenants=tenants)
