"""The one query layer: (scope, period, basis) -> paid, delivered, the loss partition and the money.

Every figure a reading command prints about where GPU-hours went (`account` and its alias `daily`, `explain`,
`ask`, `report analysis`) is read through this module, so one question has one number wherever it is asked:

* **device-hours** (basis ``device_hours``): paid is the allocations' overlap with the period, delivered and the
  buckets the samples' (sealed device-hours), the loss split by :func:`ledger.agents.accounting.loss_partition`,
  and the money priced the receipts' way (each run's part at its devices' rate, rounded once per run to the
  cent; :func:`ledger.agents.accounting.run_money`). Over whole runs of an issued month these are the
  statement's figures to the nanohour and the cent.
* **receipts** (basis ``receipts``): where the period is a calendar month with issued receipts and the scope is
  one receipts name (the fleet, a tenant, a job), the month's statement rows (:func:`billed_rows`) are the
  billed figure, and what the device-hours hold beyond them is printed as its own named line
  (:data:`OPEN_LINE`: runs with no receipt issued yet; :data:`SPLIT_LINE`: the rest, the receipts' month split
  against the telemetry's own hours), so ``billed + lines == device-hours`` exactly.

Tables are rounded once per shown figure; totals are the sums of their shown rows, with a ``rounding`` row where
they miss the rounded total (:func:`ledger.agents.accounting.shown_lines`); headlines are written from the
shown figures.
"""

from __future__ import annotations

import pandas as pd

from ..chain.canonical import format_ts
from ..base.periods import calendar_month
from . import accounting
from .accounting import DISPLAY_DP, cents, run_money, scope_masks
from .data import Dataset
from .model import Finding

DEVICE_HOURS, RECEIPTS = "device_hours", "receipts"
OPEN_LINE = "open runs (no receipt issued yet)"
SPLIT_LINE = "receipt month split vs telemetry"
ROUNDING_ROW = "(rounding)"


def billed_statement(engine, start: float, end: float):  # noqa: ANN001, ANN201 - a reports.export.Statement
    """The statement of the month [start, end) is, or None when the period is not a calendar month or the ledger
    issued no receipt for it."""
    month = calendar_month(start, end)
    if month is None:
        return None
    from reports.export import build_statement

    st = build_statement(engine, month)
    return None if st.empty else st


def billed_rows(engine, start: float, end: float) -> pd.DataFrame | None:  # noqa: ANN001
    """The statement rows (usage and corrections) of the month [start, end) is, or None (:func:`billed_statement`)."""
    st = billed_statement(engine, start, end)
    return None if st is None else st.rows


STATEMENT_DP = 6   # the statement's hours are shown to 6 decimals (reports.export.HOURS_DECIMALS; a test holds it)
LENS_SHOWN = ("tensor_gpu_hours", "achieved_pflop_hours", "rated_pflop_hours", "lens_unmeasured_gpu_hours")


def math_ranking(by_tenant: pd.DataFrame) -> list[dict]:
    """The statement's tenants ranked by the math their paid GPU-hours did (the effective-compute lens of their
    receipts): ``achieved_pflop_hours`` per paid GPU-hour, highest first, each figure the statement's own (its
    tenant row, rounded as the statement shows it) and the ratio computed from those shown figures. A tenant whose
    receipts measured none of the lens (every paid hour in ``lens_unmeasured_gpu_hours``) is listed last with no
    ratio: unknown, never zero math."""
    def shown(v) -> float:  # noqa: ANN001
        return round(float(v), STATEMENT_DP)

    rows = []
    for rec in by_tenant.to_dict(orient="records"):
        paid, achieved, rated = shown(rec["paid"]), shown(rec["achieved_pflop_hours"]), shown(rec["rated_pflop_hours"])
        unmeasured = shown(rec["lens_unmeasured_gpu_hours"])
        measured = paid > 0 and unmeasured < paid
        rows.append({"tenant": rec["tenant"], "currency": rec.get("currency"), "paid": paid,
                     "achieved_pflop_hours": achieved, "rated_pflop_hours": rated,
                     "lens_unmeasured_gpu_hours": unmeasured,
                     "pflop_hours_per_paid_gpu_hour": round(achieved / paid, STATEMENT_DP) if measured else None,
                     "rated_share": round(achieved / rated, STATEMENT_DP) if measured and rated > 0 else None})
    return sorted(rows, key=lambda r: (r["pflop_hours_per_paid_gpu_hour"] is None,
                                       -(r["pflop_hours_per_paid_gpu_hour"] or 0.0), str(r["tenant"])))


def _receipt_scope(rows: pd.DataFrame, kind: str, name: str | None) -> pd.DataFrame | None:
    if kind == "fleet":
        return rows
    if kind == "tenant":
        return rows[rows["tenant"] == name]
    if kind == "job":
        return rows[rows["job_id"].astype(str) == str(name)]
    return None   # a receipt names its nodes, not a share per node or rack: device-hours only


def _keys(frame: pd.DataFrame) -> pd.Series:
    run = pd.to_numeric(frame["run"], errors="coerce").fillna(-1).astype("int64").astype(str)
    return frame["cluster"].fillna("-").astype(str) + "\x1f" + frame["job_id"].astype(str) + "\x1f" + run


def reconcile(ds: Dataset, ex: dict, rows: pd.DataFrame, kind: str, name: str | None, start: float,
              end: float) -> dict:
    """``ex`` with the billed figures of its scope and the named lines between them and the device-hours:
    ``billed.paid + Σ lines.paid == account.paid`` (GPU-hours, to 1e-4) and the same for delivered and the
    money (to the cent)."""
    sc = _receipt_scope(rows, kind, name)
    if sc is None:
        return dict(ex, basis=DEVICE_HOURS, basis_note=f"receipts do not split by {kind}: read from device-hours")
    r4 = lambda x: round(float(x), 4)  # noqa: E731
    billed = {"paid": r4(sc["paid"].sum()), "delivered": r4(sc["delivered"].sum()),
              "cost": {"paid": cents(sc["cost_paid"].sum()), "delivered": cents(sc["cost_delivered"].sum()),
                       "lost": cents(sc["cost_lost"].sum())}}
    if "achieved_pflop_hours" in sc.columns:   # the receipts' effective-compute lens, as the statement sums it
        billed["effective_compute"] = {k: round(float(sc[k].sum()), STATEMENT_DP) for k in LENS_SHOWN}
    _, amask = scope_masks(ds, kind, name or "")
    amask = amask & (ds.allocs["end"] > start) & (ds.allocs["start"] < end)
    issued = set(_keys(sc[sc["row_kind"] == "usage"])) if len(sc) else set()
    open_mask = amask & ~_keys(ds.allocs).isin(issued)
    s = ds.samples[(ds.samples["ai"] >= 0) & (ds.samples["t"] >= start) & (ds.samples["t"] < end)]
    s_open = s[_keys(s).isin(set(_keys(ds.allocs[open_mask])))] if open_mask.any() else s.iloc[:0]
    o_paid = accounting.paid_hours(ds, open_mask, start, end)
    o_cost = run_money(ds, s_open, open_mask, start, end)
    acct = ex["account"]
    lines = [{"line": OPEN_LINE, "paid": r4(o_paid), "delivered": r4(s_open["h_del"].sum()),
              "cost": {"paid": o_cost[0], "delivered": o_cost[1], "lost": cents(o_cost[0] - o_cost[1])}}]
    rest = {"paid": r4(acct["paid"] - billed["paid"] - lines[0]["paid"]),
            "delivered": r4(acct["delivered"] - billed["delivered"] - lines[0]["delivered"]),
            "cost": {k: cents(acct["cost"][k] - billed["cost"][k] - lines[0]["cost"][k])
                     for k in ("paid", "delivered", "lost")}}
    lines.append({"line": SPLIT_LINE, **rest})
    lines = [ln for ln in lines if ln["paid"] or ln["delivered"] or any(ln["cost"].values())]
    return dict(ex, basis=RECEIPTS, billed=billed, differences=lines)


def scope(ds: Dataset, found: list[Finding], kind: str, name: str | None, start: float, end: float,
          billed: pd.DataFrame | None = None) -> dict:
    """Where a scope's GPU-hours went in a period (`explain`, `ask`): the account, the loss lines, the findings in
    scope and the headline (:func:`ledger.agents.accounting.explain`), with its basis and, on a billed month,
    the billed figures and the difference lines (:func:`reconcile`)."""
    ex = accounting.explain(ds, found, kind, name, start, end)
    if billed is None:
        return dict(ex, basis=DEVICE_HOURS)
    return reconcile(ds, ex, billed, kind, name, start, end)


def _shown_rows(rows: list[dict], key: str, exact: dict[str, float]) -> tuple[list[dict], dict]:
    """Rows as shown (each figure rounded once) and the total: the rounded exact total, with a rounding row
    where the shown rows miss it, so the table adds up to the figure beside it."""
    tot = {k: round(v, DISPLAY_DP) for k, v in exact.items()}
    tot["lost"] = round(tot["paid"] - tot["delivered"], DISPLAY_DP)
    diff = {k: round(tot[k] - sum(r[k] for r in rows), DISPLAY_DP) for k in ("paid", "delivered", "lost")}
    if any(diff.values()):
        rows = rows + [{key: ROUNDING_ROW, **diff}]
    return rows, tot


def period(ds: Dataset, found: list[Finding], start: float, end: float, label: str,
           billed: pd.DataFrame | None = None) -> dict:
    """The account of a period (`account`, alias `daily`): one row per tenant and one per (day, cluster, tenant,
    partition, QOS), the fleet's totals (the same figures as :func:`scope` of the fleet), its loss lines, money
    and a headline from its shown figures."""
    fleet = scope(ds, found, "fleet", None, start, end, billed)
    acct, table = fleet["account"], fleet["table"]
    ent = accounting.per_entity(ds, "tenant", start, end).sort_index()
    rows = [{"tenant": t, "paid": round(r.paid, DISPLAY_DP), "delivered": round(r.delivered, DISPLAY_DP),
             "lost": round(round(r.paid, DISPLAY_DP) - round(r.delivered, DISPLAY_DP), DISPLAY_DP)}
            for t, r in ent.iterrows()]
    rows, tot = _shown_rows(rows, "tenant", {"paid": acct["paid"], "delivered": acct["delivered"]})
    util = tot["delivered"] / tot["paid"] if tot["paid"] else 0.0
    top = [f"{ln['cause'].replace('_', ' ')} {ln['gpu_hours']:,.{DISPLAY_DP}f}" for ln in table["lines"]
           if ln["cause"] not in (accounting.WORKLOAD_LINE, accounting.OTHER_LINE, accounting.UNKNOWN_LINE,
                                  "rounding")][:3]
    text = (f"{label}: paid {tot['paid']:,.{DISPLAY_DP}f} GPU-hours, delivered {tot['delivered']:,.{DISPLAY_DP}f} "
            f"({util:.0%}), lost {tot['lost']:,.{DISPLAY_DP}f}" + (f"; largest causes {'; '.join(top)}." if top else "."))
    out = {"period": {"label": label, "start": format_ts(start), "end": format_ts(end)}, "tenants": rows,
           "total": tot, "table": table, "by_cause": fleet["by_cause"], "account": acct, "currency": ds.currency,
           "cost": acct["cost"], "daily": accounting.daily(ds, start, end), "basis": fleet["basis"],
           "answer": text}
    for k in ("billed", "differences", "basis_note"):
        if k in fleet:
            out[k] = fleet[k]
    return out


def ranking(ds: Dataset, by: str, key: str, start: float, end: float, n: int = 10) -> list[dict]:
    """The top ``n`` tenants / jobs / nodes / racks by lost (or delivered, or paid) GPU-hours, each figure rounded
    once (lost = shown paid - shown delivered): the same overlap and samples as :func:`scope`."""
    ent = accounting.per_entity(ds, by, start, end).sort_values(key, ascending=False).head(n)
    return [{by: str(k), "paid": round(r.paid, DISPLAY_DP), "delivered": round(r.delivered, DISPLAY_DP),
             "lost": round(round(r.paid, DISPLAY_DP) - round(r.delivered, DISPLAY_DP), DISPLAY_DP)}
            for k, r in ent.iterrows()]


def rate_text(amount: float, hours_shown: float, rate: float) -> str:
    """The rate printed beside ``hours_shown GPU-h x rate = amount``: the rate itself with the fewest decimals
    (2 to 4) at which the shown product rounds to the shown amount, else the amount per shown GPU-hour with
    the fewest decimals (2 to 8) that do; a reader multiplying the printed figures gets the printed amount."""
    for dp in range(2, 5):
        if cents(hours_shown * round(rate, dp)) == amount:
            return f"{round(rate, dp):,.{dp}f}"
    if hours_shown:
        per = amount / hours_shown
        for dp in range(2, 9):
            if cents(hours_shown * round(per, dp)) == amount:
                return f"{round(per, dp):,.{dp}f}"
    return f"{rate:,.2f}"


__all__ = ["DEVICE_HOURS", "RECEIPTS", "OPEN_LINE", "SPLIT_LINE", "ROUNDING_ROW", "billed_rows", "billed_statement",
           "math_ranking", "calendar_month",
           "period", "ranking", "rate_text", "reconcile", "scope"]
