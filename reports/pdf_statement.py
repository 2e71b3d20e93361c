"""The monthly statement as a PDF (reportlab). Page 1 is what a budget owner reads first: where the month's
paid GPU-hours went (a bar split by bucket, delivered first), cost by tenant, and the top losses with their
causes. Then one page per tenant (its split, its figures, its top losses), then the month's figures,
paid vs delivered per tenant, losses by cause, job classes, hour-of-day profile, top runs by loss, unknown
intervals and their resolution, adjustments and corrections, the ledger hash needed to verify it, and the
signed tree head a tenant checks a receipt against offline.

Numbers are right-aligned, every figure names its unit (GPU-hours, the contract's currency). The layout is
shared with the export analysis through :func:`table` and :func:`styles`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle, getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import (KeepTogether, PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table,
                                TableStyle)

from . import charts
from .monthly import LOSS_BUCKETS, cents, top_runs_by_loss

MAX_DETAIL_ROWS = 200  # longer lists are summarised; the JSON/CSV exports carry every row
BUCKET_LABELS = {"throttled_thermal": "throttled: thermal", "throttled_power_cap": "throttled: power cap",
                 "throttled_hw_slowdown": "throttled: HW slowdown", "throttled_sync_boost": "throttled: sync boost",
                 "throttled_other": "throttled: other", "underutilized": "underutilized", "starved": "starved",
                 "idle_held": "idle held", "unknown": "unknown"}



def fmt_hours(x: float) -> str:
    """GPU-hours as printed in the PDFs: two decimals, thousands separated."""
    return f"{float(x):,.2f}"


def fmt_money(x: float) -> str:
    return f"{cents(float(x)):,.2f}"



def listed_unknown_hours(unknowns) -> float:  # noqa: ANN001 - the statement's unknown intervals (a DataFrame)
    """The GPU-hours of the unknown intervals the statement lists (an interval without hours counts 0)."""
    if not len(unknowns) or "gpu_hours" not in unknowns:
        return 0.0
    return float(unknowns["gpu_hours"].fillna(0.0).sum())


def unknown_sentence(n: int, listed: float, t: dict) -> str:
    """The unknown section's sentence, written from the figures it heads: the listed intervals' hours, the
    unknown time no interval entry covers (allocated time without telemetry) as its own named part, so the two
    add up to the month's unknown; then that unknown split into resolved and pending."""
    total = float(t.get("unknown_resolved", 0.0)) + float(t.get("unknown_pending", 0.0))
    rest = total - listed
    return (f"{n:,} interval(s) listed below: {fmt_hours(listed)} GPU-hours; allocated time without telemetry "
            f"and without an interval entry: {fmt_hours(rest)} GPU-hours; unknown in all {fmt_hours(total)} "
            f"GPU-hours, of which {fmt_hours(t['unknown_resolved'])} resolved and "
            f"{fmt_hours(t['unknown_pending'])} pending resolution under the contract.")

def fmt_pct(x: float) -> str:
    return f"{100.0 * float(x):.1f} %"


def styles() -> dict[str, ParagraphStyle]:
    ss = getSampleStyleSheet()
    return {
        "title": ParagraphStyle("t", parent=ss["Title"], fontSize=18, spaceAfter=6),
        "h1": ParagraphStyle("h1", parent=ss["Heading1"], fontSize=14, spaceBefore=8, spaceAfter=4),
        "h2": ParagraphStyle("h2", parent=ss["Heading2"], fontSize=11, spaceBefore=6, spaceAfter=3),
        "body": ParagraphStyle("b", parent=ss["BodyText"], fontSize=9, leading=12),
        "small": ParagraphStyle("s", parent=ss["BodyText"], fontSize=7.5, leading=9.5, textColor=colors.grey),
        "mono": ParagraphStyle("m", parent=ss["Code"], fontSize=7.5, leading=9.5),
        "cell": ParagraphStyle("c", parent=ss["BodyText"], fontSize=7.5, leading=9),
    }


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (),
          widths: Sequence[float] | None = None, total_row: bool = False) -> Table:
    """A readable table: bold header repeated on each page, zebra rows, numeric columns right-aligned."""
    data = [list(header)] + [["" if v is None else str(v) for v in r] for r in rows]
    t = Table(data, colWidths=widths, repeatRows=1, hAlign="LEFT")
    st = [("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 7.5), ("FONT", (0, 1), (-1, -1), "Helvetica", 7.5),
          ("LINEBELOW", (0, 0), (-1, 0), 0.6, colors.black), ("VALIGN", (0, 0), (-1, -1), "TOP"),
          ("TOPPADDING", (0, 0), (-1, -1), 1.5), ("BOTTOMPADDING", (0, 0), (-1, -1), 1.5)]
    for c in numeric:
        st.append(("ALIGN", (c, 0), (c, -1), "RIGHT"))
    for i in range(1, len(data)):
        if i % 2 == 0:
            st.append(("BACKGROUND", (0, i), (-1, i), colors.Color(0.95, 0.95, 0.95)))
    if total_row and len(data) > 1:
        st += [("FONT", (0, -1), (-1, -1), "Helvetica-Bold", 7.5), ("LINEABOVE", (0, -1), (-1, -1), 0.6,
                                                                     colors.black)]
    t.setStyle(TableStyle(st))
    return t


def footer(text: str):  # noqa: ANN202
    def draw(canvas, doc) -> None:  # noqa: ANN001
        canvas.saveState()
        canvas.setFont("Helvetica", 7)
        canvas.setFillColor(colors.grey)
        canvas.drawString(18 * mm, 10 * mm, text)
        canvas.drawRightString(A4[0] - 18 * mm, 10 * mm, f"page {doc.page}")
        canvas.restoreState()
    return draw


def _txt(v: Any, default: str = "") -> str:
    """Text for a table cell: pandas' missing values (None, NaN) become ``default``."""
    if v is None or (isinstance(v, float) and v != v):
        return default
    return str(v)


def _ts(epoch: float) -> str:
    if epoch is None or pd.isna(epoch):
        return "open"
    return dt.datetime.fromtimestamp(float(epoch), tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


TOP_LOSSES = 8


def _figures(t: Any, cur: str) -> list[tuple[str, str, str]]:
    """The month's (or a tenant's) figures: hours, unknown by policy, cost, billed."""
    lost = t["paid"] - t["delivered"]
    runs = f"{int(t['runs']):,}"
    return [
        ("Runs billed", runs, "runs"),
        ("Corrections to earlier months", f"{int(t['corrections']):,}", "rows"),
        ("Paid", fmt_hours(t["paid"]), "GPU-hours"),
        ("Delivered", fmt_hours(t["delivered"]), "GPU-hours"),
        ("Lost (paid - delivered)", fmt_hours(lost), "GPU-hours"),
        ("Unknown, resolved", fmt_hours(t["unknown_resolved"]), "GPU-hours"),
        ("  of which charged", fmt_hours(t["unknown_charge"]), "GPU-hours"),
        ("  of which credited", fmt_hours(t["unknown_credit"]), "GPU-hours"),
        ("  of which estimated", fmt_hours(t["unknown_estimate"]), "GPU-hours"),
        ("Unknown, pending (on hold)", fmt_hours(t["unknown_pending"]), "GPU-hours"),
        ("Billed hours (after the unknown policy)", fmt_hours(t["billed_gpu_hours"]), "GPU-hours"),
        ("  credited: work lost to provider failures", fmt_hours(t.get("failure_loss_credited", 0.0)), "GPU-hours"),
        ("Suspended (beside the identity)", fmt_hours(t["suspended"]), "GPU-hours"),
        ("Cost of paid hours", fmt_money(t["cost_paid"]), cur),
        ("Cost of delivered hours", fmt_money(t["cost_delivered"]), cur),
        ("Cost of lost hours", fmt_money(t["cost_lost"]), cur),
        ("Billed before adjustments", fmt_money(t["billed_before_adjustments"]), cur),
        ("Adjustments (credits negative)", fmt_money(t["adjustment_cost"]), cur),
        ("Billed (after adjustments)", fmt_money(t["billed"]), cur),
    ]


def _split(t: Any) -> list[tuple[str, float]]:
    """Paid hours as delivered plus every loss bucket (the accounting identity), for the split chart."""
    return [("delivered", float(t["delivered"]))] + [(BUCKET_LABELS[b], float(t[b])) for b in LOSS_BUCKETS]


def _tenant_rows(bt: pd.DataFrame, t: Any, cur: str) -> list[tuple]:
    rows = [(_txt(r.tenant, "-"), f"{int(r.runs):,}", fmt_hours(r.paid), fmt_hours(r.delivered),
             fmt_pct(r.delivered / r.paid if r.paid else 0), fmt_money(r.cost_lost), fmt_money(r.billed))
            for r in bt.sort_values("billed", ascending=False, kind="stable").itertuples()]
    rows.append(("all tenants", f"{t['runs']:,}", fmt_hours(t["paid"]), fmt_hours(t["delivered"]),
                 fmt_pct(t["delivered"] / t["paid"] if t["paid"] else 0), fmt_money(t["cost_lost"]),
                 fmt_money(t["billed"])))
    return rows


def _per_tenant(bt: pd.DataFrame) -> list[tuple[Any, dict]]:
    """(tenant, its figures) per tenant and currency, as the by-tenant summary holds them."""
    return [(None if r["tenant"] is None or r["tenant"] != r["tenant"] else r["tenant"], r)
            for r in bt.to_dict(orient="records")]


def _losses_table(rows: pd.DataFrame, cur: str, n: int):  # noqa: ANN202
    """The runs that lost most GPU-hours, each with its largest cause and that cause's hours."""
    r = rows[rows["row_kind"] == "usage"]
    if r.empty:
        return Paragraph("No runs billed.", styles()["body"])
    lost = r["paid"] - r["delivered"]
    top = r.assign(lost=lost).sort_values(["lost", "job_id"], ascending=[False, True], kind="stable").head(n)
    causes = top[list(LOSS_BUCKETS)].astype(float)
    main = causes.idxmax(axis=1)
    out = []
    for (_, x), cause in zip(top.iterrows(), main):
        out.append((_txt(x["tenant"], "-"), f"{x['job_id']}/{x['run']}", fmt_hours(x["paid"]), fmt_hours(x["lost"]),
                    BUCKET_LABELS[cause] if x["lost"] > 0 else "-", fmt_hours(x[cause]) if x["lost"] > 0 else "-",
                    fmt_money(x["cost_lost"])))
    return table(["tenant", "job/run", "paid GPU-h", "lost GPU-h", "main cause", "cause GPU-h", f"lost ({cur})"],
                 out, numeric=[2, 3, 5, 6])


def render(st: Any, out_path: str | Path) -> Path:  # st: reports.export.Statement
    """Write the statement PDF to ``out_path``."""

    s = styles()
    t = st.summary.totals
    cur = ",".join(t["currencies"]) or "currency n/a"
    story: list = []
    who = f" — tenant {st.tenant}" if st.tenant else ""
    story.append(Paragraph(f"GPU accounting statement {st.month}{who}", s["title"]))
    story.append(Paragraph(f"Billing period {st.period_start} to {st.period_end} (UTC, end exclusive). "
                           "Summed from issued receipts: every figure reconciles to the receipts to the cent.",
                           s["body"]))
    story.append(Spacer(1, 4))
    story.append(Paragraph(f"Ledger through seq <b>{st.through_seq}</b>, head hash:", s["body"]))
    story.append(Paragraph(st.head_hash, s["mono"]))
    if st.aliased:
        story.append(Paragraph("Hostnames and users are pseudonymised (keyed HMAC-SHA256 aliases).", s["small"]))
    for n in st.notes:
        story.append(Paragraph(f"<b>{n}</b>", s["body"]))
    cover = _figures(t, cur)
    if st.empty:
        story.append(Spacer(1, 6))
        story.append(table(["figure", "value", "unit"], cover, numeric=[1], widths=[70 * mm, 40 * mm, 30 * mm]))
        story.append(Spacer(1, 8))
        story.append(Paragraph("This statement is empty: no issued receipt bills a run in this month.", s["h2"]))
        _build(st, story, out_path)
        return Path(out_path)

    # --- page 1: where the money went
    story.append(Paragraph("Where the paid GPU-hours went", s["h1"]))
    story.append(charts.split_bar(_split(t), title="Paid GPU-hours by bucket", unit="GPU-hours"))
    story.append(Paragraph("Cost by tenant", s["h1"]))
    bt = st.summary.by_tenant
    story.append(table(["tenant", "runs", "paid GPU-h", "delivered GPU-h", "delivered %", f"lost ({cur})",
                        f"billed ({cur})"], _tenant_rows(bt, t, cur), numeric=range(1, 7), total_row=True))
    story.append(Paragraph("Top losses and their causes", s["h1"]))
    story.append(_losses_table(st.rows, cur, n=TOP_LOSSES))
    for tenant, tt in _per_tenant(bt):
        story.append(PageBreak())
        story.append(Paragraph(f"Tenant {_txt(tenant, 'without a tenant')}", s["h1"]))
        story.append(charts.split_bar(_split(tt), title=f"{_txt(tenant, 'no tenant')}: paid GPU-hours by bucket",
                                      unit="GPU-hours"))
        story.append(table(["figure", "value", "unit"], _figures(tt, _txt(tt.get("currency"), cur)), numeric=[1],
                           widths=[70 * mm, 40 * mm, 30 * mm]))
        story.append(Paragraph("Top losses and their causes", s["h2"]))
        mine = st.rows[(st.rows["tenant"] == tenant) if tenant is not None else st.rows["tenant"].isna()]
        story.append(_losses_table(mine, cur, n=TOP_LOSSES))
    story.append(PageBreak())
    story.append(Paragraph("Figures for the month", s["h1"]))
    story.append(table(["figure", "value", "unit"], cover, numeric=[1], widths=[70 * mm, 40 * mm, 30 * mm]))

    # --- per tenant
    story.append(Paragraph("Paid vs delivered per tenant", s["h1"]))
    rows = [(r.tenant, r.currency, f"{int(r.runs):,}", fmt_hours(r.paid), fmt_hours(r.delivered),
             fmt_pct(r.delivered / r.paid if r.paid else 0), fmt_hours(r.unknown), fmt_money(r.adjustment_cost),
             fmt_money(r.billed)) for r in bt.itertuples()]
    rows.append(("all tenants", cur, f"{t['runs']:,}", fmt_hours(t["paid"]), fmt_hours(t["delivered"]),
                 fmt_pct(t["delivered"] / t["paid"] if t["paid"] else 0), fmt_hours(t["unknown"]),
                 fmt_money(t["adjustment_cost"]), fmt_money(t["billed"])))
    story.append(table(["tenant", "currency", "runs", "paid GPU-h", "delivered GPU-h", "delivered %",
                        "unknown GPU-h", f"adjustments ({cur})", f"billed ({cur})"], rows,
                       numeric=range(2, 9), total_row=True))
    story.append(Spacer(1, 6))
    story.append(charts.bar_chart(list(bt["tenant"].fillna("-")),
                                  {"paid": list(bt["paid"]), "delivered": list(bt["delivered"])},
                                  title="Paid vs delivered GPU-hours per tenant", unit="GPU-hours"))

    # --- losses by cause
    story.append(Paragraph("Where the rest went: losses by cause", s["h1"]))
    loss = [(BUCKET_LABELS[b], t[b]) for b in LOSS_BUCKETS]
    lrows = [(lab, fmt_hours(v), fmt_pct(v / t["paid"] if t["paid"] else 0)) for lab, v in loss]
    lrows.append(("total lost", fmt_hours(sum(v for _, v in loss)),
                  fmt_pct(sum(v for _, v in loss) / t["paid"] if t["paid"] else 0)))
    story.append(table(["cause", "GPU-hours", "share of paid"], lrows, numeric=[1, 2],
                       widths=[60 * mm, 35 * mm, 30 * mm], total_row=True))
    story.append(Spacer(1, 4))
    story.append(charts.hbar_chart([lab for lab, _ in loss], [v for _, v in loss],
                                   title="Lost GPU-hours by cause", unit="GPU-hours"))

    # --- job classes
    story.append(Paragraph("Per job class (partition, QOS)", s["h1"]))
    bc = st.summary.by_class
    crow = [(_txt(r.tenant), _txt(r.partition), _txt(r.qos), f"{int(r.runs):,}", fmt_hours(r.paid), fmt_hours(r.delivered),
             fmt_hours(r.paid - r.delivered), fmt_money(r.billed)) for r in bc.itertuples()]
    story.append(table(["tenant", "partition", "QOS", "runs", "paid GPU-h", "delivered GPU-h", "lost GPU-h",
                        f"billed ({cur})"], crow, numeric=range(3, 8)))

    # --- hour of day
    story.append(Paragraph("Hour-of-day profile (UTC)", s["h1"]))
    story.append(Paragraph("Each run's GPU-hours are spread over the hours of the day in proportion to the "
                           "time its window spent in each hour; this shows when hours were held, not a "
                           "per-hour measurement.", s["small"]))
    bh = st.summary.by_hour.groupby("hour")[["paid", "delivered"]].sum().reindex(range(24), fill_value=0.0)
    story.append(charts.line_chart({"paid": [(h, float(v)) for h, v in bh["paid"].items()],
                                    "delivered": [(h, float(v)) for h, v in bh["delivered"].items()]},
                                   title="GPU-hours by hour of day, all tenants", x_unit="hour of day (UTC)",
                                   y_unit="GPU-hours", x_range=(0, 23)))

    # --- top runs by loss
    story.append(Paragraph("Top runs by lost GPU-hours", s["h1"]))
    tr = top_runs_by_loss(st.rows)
    trow = [(r.tenant, f"{r.job_id}/{r.run}", _txt(r.partition), _txt(r.sku), int(r.n_devices), fmt_hours(r.paid),
             fmt_hours(r.delivered), fmt_hours(r.lost), fmt_hours(r.unknown), fmt_money(r.cost_lost))
            for r in tr.itertuples()]
    story.append(table(["tenant", "job/run", "partition", "SKU", "GPUs", "paid GPU-h", "delivered GPU-h",
                        "lost GPU-h", "unknown GPU-h", f"lost ({cur})"], trow, numeric=range(4, 10)))

    # --- unknown intervals
    story.append(Paragraph("Unknown intervals and their resolution", s["h1"]))
    un = st.flat.unknowns
    story.append(Paragraph(unknown_sentence(len(un), listed_unknown_hours(un), t), s["body"]))
    if len(un):
        urow = [(r.tenant, f"{r.job_id}/{r.run}", _txt(r.device, "whole run")[:20], _txt(r.start)[:16],
                 _txt(r.end)[:16], _txt(r.cause), fmt_hours(r.gpu_hours),
                 _txt(r.resolution) or (f"policy: {_txt(r.policy)}" if _txt(r.policy) else "pending"))
                for r in un.head(MAX_DETAIL_ROWS).itertuples()]
        story.append(table(["tenant", "job/run", "device", "start (UTC)", "end (UTC)", "cause", "GPU-h",
                            "resolution"], urow, numeric=[6]))
        if len(un) > MAX_DETAIL_ROWS:
            story.append(Paragraph(f"... and {len(un) - MAX_DETAIL_ROWS:,} more (every interval is in the "
                                   "JSON export).", s["small"]))

    # --- adjustments and corrections
    story.append(Paragraph("Adjustments", s["h1"]))
    ad = st.flat.adjustments
    if len(ad):
        arow = [(r.tenant, f"{r.job_id}/{r.run}", _txt(r.kind), _txt(r.reason)[:40], _txt(r.by),
                 fmt_hours(r.gpu_hours), fmt_money(r.amount), _txt(r.currency)) for r in ad.head(MAX_DETAIL_ROWS).itertuples()]
        story.append(table(["tenant", "job/run", "kind", "reason", "by", "GPU-h", "amount", "currency"], arow,
                           numeric=[5, 6]))
    else:
        story.append(Paragraph("No adjustments this month.", s["body"]))
    corr = st.rows[st.rows["row_kind"] == "correction"]
    story.append(Paragraph("Corrections to runs of earlier months", s["h2"]))
    if len(corr):
        crow2 = [(r.tenant, f"{r.job_id}/{r.run}", _txt(r.replaces_hash)[7:19], _txt(r.receipt_hash)[7:19],
                  fmt_hours(r.paid), fmt_hours(r.delivered), fmt_money(r.billed))
                 for r in corr.head(MAX_DETAIL_ROWS).itertuples()]
        story.append(table(["tenant", "job/run", "replaces receipt", "by receipt", "chg paid GPU-h",
                            "chg delivered GPU-h", f"chg billed ({cur})"], crow2, numeric=[4, 5, 6]))
    else:
        story.append(Paragraph("None: no receipt of an earlier month was re-issued.", s["body"]))

    # --- verification
    story.append(KeepTogether([
        Paragraph("How to verify this statement", s["h1"]),
        Paragraph("Every row is an issued receipt; each receipt is a pure function of the ledger through its "
                  "sequence number. To check: run <font face='Courier'>ipledger verify</font> (hash chain and "
                  "replay of every issued receipt), then <font face='Courier'>ipledger export monthly --month "
                  f"{st.month} --as-of {st.through_seq} --format json</font>, which must reproduce these totals "
                  "and this head hash:", s["body"]),
        Paragraph(st.head_hash, s["mono"]),
    ]))
    story.append(KeepTogether(_tree_head(st, s)))
    _build(st, story, out_path)
    return Path(out_path)


def _tree_head(st: Any, s: dict[str, ParagraphStyle]) -> list:
    """The signed tree head a tenant checks this month's receipts against, and how (docs/proofs.md)."""
    out = [Paragraph("Signed tree head", s["h2"])]
    h = st.tree_head
    if h is None:
        out.append(Paragraph(f"None is signed: no signed tree head is recorded in the ledger through seq "
                             f"{st.through_seq}, so a receipt cannot yet be checked without the ledger. Ask the "
                             "operator to sign one (<font face='Courier'>ipledger checkpoint</font>).", s["body"]))
        return out
    through = st.rows["through_seq"].to_numpy()
    covered = int((through <= int(h["tree_size"])).sum())
    cover = (f"It covers all {len(through):,} receipt(s) of this statement." if covered == len(through) else
             f"It covers {covered:,} of this statement's {len(through):,} receipt(s); the others were issued "
             "after it, so ask the operator for a newer head (ipledger checkpoint) to check them.")
    out += [Paragraph(f"The newest signed head in the ledger through seq {st.through_seq}: tree size "
                      f"<b>{int(h['tree_size']):,}</b>, signed {h.get('timestamp', '?')}, log id "
                      f"{h.get('log_id', '?')}. {cover} Its root hash:", s["body"]),
            Paragraph(str(h["root_hash"]), s["mono"]),
            Paragraph("To check a receipt without our database: <font face='Courier'>ipledger receipt JOB --proof "
                      "--head head.json --out b.json</font> with this head, then <font face='Courier'>"
                      "ipledger-verify b.json --pubkey KEY.pub</font> with the site's published public key; it "
                      "prints the receipt hash or names what failed (docs/proofs.md).", s["body"])]
    return out


def _build(st: Any, story: list, out_path: str | Path) -> None:
    doc = SimpleDocTemplate(str(out_path), pagesize=A4, leftMargin=18 * mm, rightMargin=18 * mm,
                            topMargin=16 * mm, bottomMargin=18 * mm,
                            title=f"GPU accounting statement {st.month}", author="ipledger",
                            subject=f"ledger seq {st.through_seq} head {st.head_hash}")
    foot = footer(f"ipledger statement {st.month} · ledger seq {st.through_seq} · head {st.head_hash[:16]}…")
    doc.build(story, onFirstPage=foot, onLaterPages=foot)
