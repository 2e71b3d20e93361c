"""The monthly tenant accounting export: receipts flattened into one table, then summed per tenant, per job
class (partition, QOS) and per hour of day.

The core is pure: :func:`flatten` turns receipt dicts (docs/receipts.md, "JSON") into a flat table, one
row per receipt; :func:`monthly_rows` keeps the month's rows; :func:`summarise` aggregates them
(vectorised, in DuckDB over the flat table, so a million receipts take seconds). Nothing is recomputed
from telemetry: every number is a sum of issued receipts, so the export reconciles to them to the cent.

Rules (docs/reports.md has the full text):

* Periods are half-open ``[start, end)`` in UTC. Under the default period rule (``split``) a receipt is
  allocated to every month its window overlaps, in proportion to its seconds there, exact to the nanohour
  (:mod:`ledger.base.periods`); under ``end`` it belongs to the month of its last paid instant.
* The hour-of-day profile (UTC) spreads each run's paid and delivered GPU-hours over the hours of the day
  in proportion to the run's window overlap with each hour (receipts carry no hourly split), so it is a
  profile of *when* hours were held, not a measurement per hour.
* ``unknown`` is split by the policy it is billed under (``unknown_charge``/``credit``/``estimate``/``hold``,
  from the receipt's ``billing.unknown_gpu_hours_by_policy``): ``unknown_pending`` is the part on hold
  (awaiting resolution), ``unknown_resolved`` the rest. Receipts without that block fall back to their
  intervals: an interval with a ``resolution`` is resolved; a run-scope interval without ``gpu_hours``
  counts once per device of the run.
* ``billed_before_adjustments`` is the receipt's ``cost.billed_before_adjustments`` (the billed hours
  after the unknown policy, priced), ``adjustment_cost`` its signed adjustments (credits negative) and
  ``billed`` its ``cost.billed_after_adjustments``; receipts without them bill ``cost.paid`` plus adjustments.
* Correction rows (``row_kind == "correction"``) carry the *difference* between a re-issued receipt and the
  one already billed (see :mod:`reports.issued`); they sum with the usage rows like any other row.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from ledger.base import periods
from .energy_columns import ENERGY_COLUMNS, energy_values
from .lens_columns import LENS_COLUMNS, lens_values
from ledger.base.periods import month_of  # noqa: F401 - re-exported for callers

THROTTLE_CAUSES = ("thermal", "power_cap", "hw_slowdown", "sync_boost", "other")
LOSS_BUCKETS = tuple(f"throttled_{c}" for c in THROTTLE_CAUSES) + ("underutilized", "starved", "idle_held",
                                                                     "unknown")
UNKNOWN_POLICIES = ("charge", "credit", "estimate", "hold")
HOUR_COLUMNS = ("paid", "delivered") + LOSS_BUCKETS + ("unknown_resolved", "unknown_pending") + tuple(
    f"unknown_{p}" for p in UNKNOWN_POLICIES) + ("suspended", "billed_gpu_hours", "adjustment_gpu_hours",
                                                "failure_loss_credited")
MONEY_COLUMNS = ("cost_paid", "cost_delivered", "cost_lost", "billed_before_adjustments", "adjustment_cost",
                 "billed")
COUNT_COLUMNS = ("n_devices", "n_unknown_intervals", "n_adjustments")
NUMERIC_COLUMNS = HOUR_COLUMNS + MONEY_COLUMNS + COUNT_COLUMNS + LENS_COLUMNS + ENERGY_COLUMNS
TEXT_COLUMNS = ("row_kind", "cluster", "job_id", "tenant", "partition", "qos", "user", "nodes", "sku",
                "contract_id", "contract_version", "method", "receipt_hash", "replaces_hash", "currency",
                "allocation")
ROW_COLUMNS = TEXT_COLUMNS + ("run", "through_seq", "window_start", "window_end") + NUMERIC_COLUMNS
SUM_COLUMNS = HOUR_COLUMNS + MONEY_COLUMNS + LENS_COLUMNS + ENERGY_COLUMNS
_UTC = dt.timezone.utc


class ExportError(ValueError):
    """Bad input to an export (a malformed month, a receipt without a required field): one line."""


def month_bounds(month: str) -> tuple[dt.datetime, dt.datetime]:
    """[first instant, first instant of the next month) in UTC for ``YYYY-MM`` (see :mod:`ledger.base.periods`)."""
    try:
        return periods.month_bounds(month)
    except periods.PeriodError as exc:
        raise ExportError(str(exc)) from None


def epoch(ts: Any) -> float:
    if ts is None or ts == "":
        return float("nan")
    if isinstance(ts, (int, float)):
        return float(ts)
    try:  # the common spelling, RFC 3339 with "Z" (Python 3.11 parses it directly)
        return dt.datetime.fromisoformat(ts).timestamp() if ts[-1] == "Z" else _epoch_slow(ts)
    except (ValueError, TypeError, IndexError):
        return _epoch_slow(ts)


def _epoch_slow(ts: Any) -> float:
    s = str(ts)
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        v = dt.datetime.fromisoformat(s)
    except ValueError:
        raise ExportError(f"receipt timestamp {ts!r}: not RFC 3339") from None
    if v.tzinfo is None:
        v = v.replace(tzinfo=_UTC)
    return v.timestamp()


def _num(v: Any) -> float:
    if v.__class__ is float:
        return v
    try:
        return 0.0 if v is None else float(v)
    except (TypeError, ValueError):
        return 0.0


def _adj_sign(a: Mapping[str, Any]) -> float:
    """Receipts state adjustment amounts unsigned with a ``direction``; credits count negative."""
    d = a.get("direction")
    return -1.0 if d == "credit" else 1.0


def _adj_amount(a: Mapping[str, Any]) -> float:
    for k in ("amount", "cost", "money"):
        if a.get(k) is not None:
            v = a[k]
            v = _num(v.get("amount") if isinstance(v, Mapping) else v)
            return _adj_sign(a) * abs(v) if a.get("direction") else v
    return 0.0


def _adj_hours(a: Mapping[str, Any]) -> float:
    for k in ("gpu_hours", "hours"):
        if a.get(k) is not None:
            v = _num(a[k])
            return _adj_sign(a) * abs(v) if a.get("direction") else v
    return 0.0


def _interval_hours(iv: Mapping[str, Any], n_devices: int) -> float:
    if iv.get("gpu_hours") is not None:
        return _num(iv["gpu_hours"])
    s, e = epoch(iv.get("start")), epoch(iv.get("end"))
    if not (e > s):
        return 0.0
    per = 1 if iv.get("device") else max(n_devices, 1)
    return (e - s) / 3600.0 * per


@dataclass(frozen=True)
class Flat:
    """Receipts as tables: ``rows`` (one per receipt), ``unknowns`` (one per unknown interval) and
    ``adjustments`` (one per adjustment line), the last two keyed by (cluster, job_id, run)."""

    rows: pd.DataFrame
    unknowns: pd.DataFrame
    adjustments: pd.DataFrame


UNKNOWN_COLUMNS = ("cluster", "job_id", "run", "tenant", "id", "device", "node", "start", "end", "cause",
                   "gpu_hours", "policy", "resolution", "row_kind")
ADJUSTMENT_COLUMNS = ("cluster", "job_id", "run", "tenant", "id", "kind", "gpu_hours", "amount", "currency",
                      "reason", "by", "references", "row_kind")


def resolution_text(r: Any) -> str | None:
    if r is None:
        return None
    if isinstance(r, Mapping):
        parts = [str(r.get(k)) for k in ("as", "resolution", "kind", "policy", "outcome") if r.get(k)]
        return parts[0] if parts else json.dumps(r, sort_keys=True)
    return str(r)


def flatten(receipts: Iterable[Mapping[str, Any]], row_kind: str = "usage") -> Flat:
    """One row per receipt (the columns of ``ROW_COLUMNS``); the only per-receipt Python loop in reports."""
    out: list[tuple] = []
    unk: list[tuple] = []
    adj: list[tuple] = []
    num = _num
    for r in receipts:
        job = r.get("job") or {}
        gh = r.get("gpu_hours") or {}
        th = gh.get("throttled") or {}
        cost = r.get("cost") or {}
        win = r.get("window") or {}
        devices = job.get("devices") or []
        n_dev = len(devices)
        key = (job.get("cluster"), None if job.get("job_id") is None else str(job.get("job_id")),
               int(job.get("run") or 0))
        tenant = job.get("account") or job.get("namespace") or job.get("tenant")
        currency = cost.get("currency")
        nodes = sorted({d.get("node") for d in devices if d.get("node")})
        skus = sorted({d.get("sku") for d in devices if d.get("sku")})
        contract = r.get("contract") or {}
        method = r.get("method") or {}
        unknown = num(gh.get("unknown"))
        resolved = 0.0
        ivs = r.get("unknown_intervals") or []
        for iv in ivs:
            h = _interval_hours(iv, n_dev)
            res = resolution_text(iv.get("resolution"))
            if res is not None:
                resolved += h
            unk.append((*key, tenant, iv.get("id"), iv.get("device"), iv.get("node"), iv.get("start"),
                        iv.get("end"), iv.get("cause"), h, iv.get("policy"), res, row_kind))
        billing = r.get("billing") or {}
        by_policy = billing.get("unknown_gpu_hours_by_policy")
        if isinstance(by_policy, dict):
            pol = {p: num(by_policy.get(p)) for p in UNKNOWN_POLICIES}
            resolved = max(unknown - pol["hold"], 0.0)
        else:
            resolved = min(resolved, unknown)
            pol = {"charge": 0.0, "credit": 0.0, "estimate": 0.0, "hold": unknown - resolved}
        adjs = r.get("adjustments") or []
        adj_cost = adj_h = 0.0
        for x in adjs:
            amt, hrs = _adj_amount(x), _adj_hours(x)
            adj_cost += amt
            adj_h += hrs
            refs = x.get("references") or x.get("refs")
            adj.append((*key, tenant, x.get("id"), x.get("kind") or x.get("type") or x.get("direction"), hrs, amt,
                        x.get("currency") or currency, x.get("reason"), x.get("by"),
                        json.dumps(refs, sort_keys=True) if refs is not None else None, row_kind))
        cost_paid = _num(cost.get("paid"))
        before = _num(cost["billed_before_adjustments"]) if cost.get("billed_before_adjustments") is not None \
            else cost_paid
        if cost.get("adjustments") is not None and not isinstance(cost.get("adjustments"), (list, dict)):
            adj_cost = _num(cost["adjustments"])
        billed = _num(cost["billed_after_adjustments"]) if cost.get("billed_after_adjustments") is not None \
            else before + adj_cost
        ledger = r.get("ledger") or {}
        paid = num(gh.get("paid"))
        cv = contract.get("version")
        gbh = billing.get("gpu_hours_billed")
        out.append((
            # TEXT_COLUMNS
            row_kind, key[0], key[1], tenant, job.get("partition"), job.get("qos"), job.get("user"),
            ",".join(nodes) if nodes else None, skus[0] if len(skus) == 1 else ("mixed" if skus else None),
            contract.get("id"), None if cv is None else str(cv),
            f"{method.get('name')}/{method.get('version')}" if method else None,
            r.get("receipt_hash"), r.get("_replaces_hash"), currency, allocation_of(r),
            # run, through_seq, window
            key[2], int(ledger.get("through_seq") or 0), epoch(win.get("start")), epoch(win.get("end")),
            # HOUR_COLUMNS
            paid, num(gh.get("delivered")), num(th.get("thermal")), num(th.get("power_cap")),
            num(th.get("hw_slowdown")), num(th.get("sync_boost")), num(th.get("other")),
            num(gh.get("underutilized")), num(gh.get("starved")), num(gh.get("idle_held")), unknown,
            resolved, unknown - resolved, pol["charge"], pol["credit"], pol["estimate"], pol["hold"],
            num(gh.get("suspended")), paid if gbh is None else num(gbh), adj_h,
            num(billing.get("lost_since_checkpoint_credited")),  # receipt progress: provider-failure loss credited
            # MONEY_COLUMNS
            cost_paid, num(cost.get("delivered")), num(cost.get("lost")), before, adj_cost, billed,
            # COUNT_COLUMNS
            n_dev, len(ivs), len(adjs),
            # LENS_COLUMNS (reports/lens_columns.py)
            *lens_values(r, paid, num(gh.get("delivered"))),
            # ENERGY_COLUMNS (reports/energy_columns.py)
            *energy_values(r, paid)))
    rows = pd.DataFrame.from_records(out, columns=list(ROW_COLUMNS), nrows=len(out)) if out else \
        pd.DataFrame({c: pd.Series(dtype=column_dtype(c)) for c in ROW_COLUMNS})
    rows = rows.astype({c: column_dtype(c) for c in ROW_COLUMNS})
    return Flat(rows=rows, unknowns=pd.DataFrame(unk, columns=list(UNKNOWN_COLUMNS)),
                adjustments=pd.DataFrame(adj, columns=list(ADJUSTMENT_COLUMNS)))


def allocation_of(receipt: Mapping[str, Any]) -> str | None:
    """The split-cost allocation of a receipt whose devices other runs shared (docs/kubernetes.md): canonical
    JSON ``[{"device", "rule", "ratio", "paid_gpu_hours"}]``, one per shared device; None when none was shared."""
    out = []
    for d in receipt.get("devices") or []:
        sh = d.get("share") if isinstance(d, Mapping) else None
        if isinstance(sh, Mapping) and sh.get("ratio") is not None:
            gh = d.get("gpu_hours") if isinstance(d.get("gpu_hours"), Mapping) else {}
            out.append({"device": d.get("uuid"), "rule": sh.get("rule"), "ratio": str(sh.get("ratio")),
                        "paid_gpu_hours": gh.get("paid")})
    return json.dumps(out, sort_keys=True, separators=(",", ":")) if out else None


def column_dtype(col: str) -> str:
    if col in ("run", "through_seq") or col in COUNT_COLUMNS:
        return "int64"
    if col in TEXT_COLUMNS:
        return "object"
    return "float64"


def in_month(rows: pd.DataFrame, month: str) -> pd.Series:
    """Rows whose window's last paid instant is in ``month`` (half-open; windows without an end: their start)."""
    start, end = month_bounds(month)
    s, e = rows["window_start"], rows["window_end"]
    # periods.placement, column-wise: the last paid microsecond, or the start of an empty/end-less window
    t = (e - 1e-6).clip(lower=s).where(e > s, s.where(s.notna(), e))
    return (t >= start.timestamp()) & (t < end.timestamp())


def monthly_rows(receipts: Iterable[Mapping[str, Any]], month: str) -> pd.DataFrame:
    """The flat rows of the receipts whose last paid instant is in ``month``, whole (pure). The statement
    itself bills parts of receipts by the period rule (:func:`reports.issued.select_month`)."""
    rows = flatten(receipts).rows
    return rows[in_month(rows, month)].reset_index(drop=True)


# --- aggregation -------------------------------------------------------------------------------------------

def _group_sql(keys: list[str]) -> str:
    k = ", ".join(keys)
    sums = ", ".join(f"SUM({c}) AS {c}" for c in SUM_COLUMNS)
    return (f"SELECT {k}, COUNT(*) FILTER (WHERE row_kind = 'usage') AS runs, "
            f"COUNT(*) FILTER (WHERE row_kind = 'correction') AS corrections, {sums} "
            f"FROM flat GROUP BY {k} ORDER BY {k}")


GROUP_KEYS = ("tenant", "partition", "qos", "currency")


def _for_duckdb(rows: pd.DataFrame) -> pd.DataFrame:
    """Only the columns the GROUP BYs read (DuckDB scans a pandas frame in place)."""
    return rows[[*GROUP_KEYS, "row_kind", *SUM_COLUMNS]]


def aggregate(rows: pd.DataFrame, keys: list[str], con=None) -> pd.DataFrame:  # noqa: ANN001
    """SUM of every hour and money column GROUP BY ``keys``, in DuckDB (vectorised, no Python per row)."""
    import duckdb

    own = con is None
    if own:
        con = duckdb.connect()
        con.register("flat", _for_duckdb(rows))
    try:
        out = con.execute(_group_sql(keys)).df()
    finally:
        if own:
            con.close()
    for c in ("runs", "corrections"):
        out[c] = out[c].astype("int64")
    for k in keys:
        out[k] = out[k].astype("object").where(out[k].notna(), None)
    return out


def _group_codes(rows: pd.DataFrame, keys: tuple[str, ...]) -> tuple[np.ndarray, list[tuple]]:
    """Dense group numbers for ``keys`` (missing values form their own group) and each group's key values."""
    combined = np.zeros(len(rows), dtype="int64")
    levels = []
    for k in keys:
        codes, uniq = pd.factorize(rows[k], use_na_sentinel=True)
        codes = codes.astype("int64") + 1  # 0 = missing
        levels.append(np.concatenate([np.array([None], dtype=object), np.asarray(uniq, dtype=object)]))
        combined = combined * (len(uniq) + 1) + codes
    uniq_combined, dense = np.unique(combined, return_inverse=True)
    labels = []
    for u in uniq_combined:
        parts = []
        for lv in reversed(levels):
            u, c = divmod(int(u), len(lv))
            parts.append(lv[c])
        labels.append(tuple(reversed(parts)))
    return dense.astype("int64"), labels


def hour_profile(rows: pd.DataFrame, keys: tuple[str, ...] = ("tenant", "currency")) -> pd.DataFrame:
    """Paid and delivered GPU-hours by (keys, hour of day UTC), each run spread over its window's hours.

    For a window [s, e), the seconds it spends in hour-of-day h are F_h(e) - F_h(s), where
    F_h(t) = 3600 * day(t) + clip(sec(t) - 3600 h, 0, 3600) counts the seconds of hour h between the epoch
    and t (day and sec: whole days and seconds since midnight). Each run's hours are weighted by that share
    of its window; a zero-length window puts its hours in the hour it starts.

    Vectorised in O(rows), not O(rows x 24): with c = weight / (e - s) and k, r the hour and the seconds into
    the hour of t, sum_i c_i * clip(sec_i - 3600 h, 0, 3600) = 3600 * sum_{k_i > h} c_i + sum_{k_i = h} c_i r_i,
    which is two bincounts per (group, hour) and a reverse cumulative sum over the hours.
    """
    out_cols = [*keys, "hour", "paid", "delivered"]
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in keys else "float64") for c in out_cols})
    g, labels = _group_codes(rows, keys)
    n = len(labels)
    s = rows["window_start"].to_numpy(dtype="float64")
    e = rows["window_end"].to_numpy(dtype="float64")
    e = np.where(np.isnan(e), s, e)
    ok = ~np.isnan(s)
    span = e - s
    timed = ok & (span > 0)
    point = ok & ~timed
    result = {}
    for col in ("paid", "delivered"):
        w = rows[col].to_numpy(dtype="float64")
        prof = np.zeros((n, 24))
        c = np.where(timed, w / np.where(timed, span, 1.0), 0.0)
        for t, sign in ((e, 1.0), (s, -1.0)):
            tt = np.where(timed, t, 0.0)
            day, sec = np.divmod(tt, 86400.0)
            k = np.minimum((sec // 3600).astype("int64"), 23)
            r = sec - 3600.0 * k
            idx = g * 24 + k
            b = np.bincount(idx, weights=c, minlength=n * 24).reshape(n, 24)
            rr = np.bincount(idx, weights=c * r, minlength=n * 24).reshape(n, 24)
            above = np.cumsum(b[:, ::-1], axis=1)[:, ::-1] - b  # sum over k > h
            daypart = np.bincount(g, weights=c * day, minlength=n) * 3600.0
            prof += sign * (daypart[:, None] + 3600.0 * above + rr)
        if point.any():
            k0 = np.minimum((np.mod(s[point], 86400.0) // 3600).astype("int64"), 23)
            prof += np.bincount(g[point] * 24 + k0, weights=w[point], minlength=n * 24).reshape(n, 24)
        result[col] = prof  # c is GPU-hours per second of window, F differences are seconds
    recs = [(*labels[i], h, float(result["paid"][i, h]), float(result["delivered"][i, h]))
            for i in range(n) for h in range(24)]
    return pd.DataFrame(recs, columns=out_cols)


@dataclass(frozen=True)
class Summary:
    """A month's aggregates: per tenant, per job class, per hour of day, and the grand totals."""

    by_tenant: pd.DataFrame
    by_class: pd.DataFrame
    by_hour: pd.DataFrame
    totals: dict = field(default_factory=dict)


_SCAN_SQL = """
WITH w AS (
  SELECT *, window_start AS s,
         CASE WHEN window_end IS NULL OR isnan(window_end) THEN window_start ELSE window_end END AS e
  FROM flat
), x AS (
  SELECT *,
    (s IS NOT NULL AND NOT isnan(s) AND e > s) AS timed,
    (s IS NOT NULL AND NOT isnan(s) AND NOT (e > s)) AS point,
    CASE WHEN e > s THEN 1.0 / (e - s) ELSE 0.0 END AS inv,
    floor(e / 86400) AS de, floor(s / 86400) AS ds,
    least(CAST(floor((e - floor(e / 86400) * 86400) / 3600) AS INTEGER), 23) AS ke,
    least(CAST(floor((s - floor(s / 86400) * 86400) / 3600) AS INTEGER), 23) AS ks
  FROM w
)
SELECT tenant, partition, qos, currency,
  CASE WHEN timed OR point THEN ke ELSE -1 END AS ke, CASE WHEN timed OR point THEN ks ELSE -1 END AS ks,
  COUNT(*) FILTER (WHERE row_kind = 'usage') AS runs,
  COUNT(*) FILTER (WHERE row_kind = 'correction') AS corrections,
  {sums},
  {hours}
FROM x GROUP BY ALL
"""


def scan(rows: pd.DataFrame | None, con) -> pd.DataFrame:  # noqa: ANN001
    """One DuckDB pass over the flat rows: sums per (job class, hour index of window end and start). ``rows``
    None: over the relation ``flat`` already known to ``con`` (the streamed CSV's, :mod:`reports.long_csv`).

    Everything the statement aggregates (per class, per tenant, totals, the hour-of-day profile) is derived
    from this small table, so a month costs one scan whatever its size. For the hour profile each cell also
    carries, per weight w (paid, delivered) and c = w / (e - s): sum c (``w_c``), sum c * seconds into the
    hour of e and of s (``w_re``, ``w_rs``), sum c * whole days between s and e (``w_day``) and, for
    zero-length windows, sum w (``w_pt``); :func:`_hours_from_scan` turns them into hours of the day.
    """
    sums = ", ".join(f"SUM({c}) AS {c}" for c in SUM_COLUMNS)
    hrs = []
    for w in ("paid", "delivered"):
        hrs += [f"SUM(CASE WHEN timed THEN {w} * inv ELSE 0 END) AS {w}_c",
                f"SUM(CASE WHEN timed THEN {w} * inv * (e - de * 86400 - ke * 3600) ELSE 0 END) AS {w}_re",
                f"SUM(CASE WHEN timed THEN {w} * inv * (s - ds * 86400 - ks * 3600) ELSE 0 END) AS {w}_rs",
                f"SUM(CASE WHEN timed THEN {w} * inv * (de - ds) ELSE 0 END) AS {w}_day",
                f"SUM(CASE WHEN point THEN {w} ELSE 0 END) AS {w}_pt"]
    if rows is not None:
        con.register("flat", rows[[*GROUP_KEYS, "row_kind", "window_start", "window_end", *SUM_COLUMNS]])
    out = con.execute(_SCAN_SQL.format(sums=sums, hours=", ".join(hrs))).df()
    for k in GROUP_KEYS:
        out[k] = out[k].astype("object").where(out[k].notna(), None)
    return out


def _hours_from_scan(scan: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Paid and delivered GPU-hours per (keys, hour of day) from :func:`scan`'s cells (exact, see
    :func:`hour_profile` for the formula: F_h(e) - F_h(s) per window, summed linearly per cell)."""
    out_cols = [*keys, "hour", "paid", "delivered"]
    if scan.empty:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in keys else "float64") for c in out_cols})
    h = np.arange(24)
    ke = scan["ke"].to_numpy()[:, None]
    ks = scan["ks"].to_numpy()[:, None]
    prof = {}
    for w in ("paid", "delivered"):
        c = scan[f"{w}_c"].to_numpy()[:, None]
        term_e = 3600.0 * c * (ke > h) + scan[f"{w}_re"].to_numpy()[:, None] * (ke == h)
        term_s = 3600.0 * c * (ks > h) + scan[f"{w}_rs"].to_numpy()[:, None] * (ks == h)
        prof[w] = (3600.0 * scan[f"{w}_day"].to_numpy()[:, None] + term_e - term_s
                   + scan[f"{w}_pt"].to_numpy()[:, None] * (ks == h))
    cells = pd.DataFrame({k: np.repeat(scan[k].to_numpy(dtype=object), 24) for k in keys})
    cells["hour"] = np.tile(h, len(scan))
    cells["paid"] = prof["paid"].ravel()
    cells["delivered"] = prof["delivered"].ravel()
    out = cells.groupby([*keys, "hour"], dropna=False, sort=True)[["paid", "delivered"]].sum().reset_index()
    for k in keys:
        out[k] = out[k].astype("object").where(out[k].notna(), None)
    return out[out_cols]


def _rollup(scan: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    cols = ["runs", "corrections", *SUM_COLUMNS]
    out = scan.groupby(keys, dropna=False, sort=True)[cols].sum().reset_index()
    for c in ("runs", "corrections"):
        out[c] = out[c].astype("int64")
    for k in keys:
        out[k] = out[k].astype("object").where(out[k].notna(), None)
    return out[[*keys, *cols]]


def summarise(rows: pd.DataFrame) -> Summary:
    """Aggregate flat rows per (tenant, currency), per (tenant, partition, qos, currency) and per hour of day:
    one DuckDB scan (:func:`scan`), then roll-ups of its small result."""
    import duckdb

    con = duckdb.connect()
    try:
        return summary_of_scan(scan(rows, con))
    finally:
        con.close()


def summary_of_scan(scan: pd.DataFrame) -> Summary:
    """The :class:`Summary` from :func:`scan`'s small table (its roll-ups, hour profile and totals)."""
    by_class = _rollup(scan, ["tenant", "partition", "qos", "currency"])
    by_tenant = _rollup(scan, ["tenant", "currency"])
    by_hour = _hours_from_scan(scan, ["tenant", "currency"])
    totals: dict[str, Any] = {"runs": int(scan["runs"].sum()), "corrections": int(scan["corrections"].sum())}
    for c in SUM_COLUMNS:
        totals[c] = float(scan[c].sum()) if len(scan) else 0.0
    totals["currencies"] = sorted({c for c in scan["currency"].dropna().unique()})
    return Summary(by_tenant=by_tenant, by_class=by_class, by_hour=by_hour, totals=totals)


def cents(x: float) -> float:
    """Money as shown: rounded half-even to the cent (floats summed first, rounded once)."""
    return float(round(x + 0.0, 2))


def top_runs_by_loss(rows: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` usage rows that lost the most GPU-hours (paid − delivered), ties by job id."""
    r = rows[rows["row_kind"] == "usage"].copy()
    r["lost"] = r["paid"] - r["delivered"]
    r = r.sort_values(["lost", "job_id"], ascending=[False, True]).head(n)
    return r[["tenant", "cluster", "job_id", "run", "partition", "sku", "n_devices", "paid", "delivered", "lost",
              "unknown", "cost_lost", "currency"]]
