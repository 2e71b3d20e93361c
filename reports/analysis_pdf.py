"""The written analysis of a telemetry export: the PDF a prospect receives for a 24-hour telemetry export.

``render(analysis, out_path)`` lays out, first, one page that answers "how many of the paid GPU-hours did real work,
and where did the rest go" (one chart: paid -> delivered -> each loss line, in GPU-hours, or in money only at a
stated ``rate``), then what was measured (sources, devices, coverage and gaps), the account (paid vs delivered by
cause), the findings with their evidence charts (signal timelines before, during and after each finding; one kind
on several nodes of a rack shown once at rack scope: :func:`group_racks`), the recommendations with the hours
they recover over the period their findings were seen (:func:`recommendations_seen`, never extrapolated), and the
method and its limits. Every table is fitted to the frame (:func:`column_widths`), so no text runs past a margin.

The ``analysis`` dict is the Findings JSON (docs/agents.md) plus optional context. Only ``findings`` and
``account`` are expected; every other key may be missing, and so may any key inside them::

    {
      "findings": [{"id", "agent", "kind", "scope": {"node", "device_uuid", "rack", "job_id", "tenant", ...},
                    "start": RFC3339, "end": RFC3339, "gpu_hours": float, "cost": float, "confidence": 0..1,
                    "summary": "one sentence",
                    "evidence": [                      # each item is one of:
                        {"signal": "sm_clock", "unit": "MHz", "points": [[t, v], ...]},   # a timeline
                        {"signal": "temp", "unit": "C", "before": 61, "during": 88, "after": 63},  # a contrast
                        "free text"],
                    "recommendation": {"action", "command", "gpu_hours", "cost", "reversible"}}],   # optional
      "account": {"paid": float, "delivered": float, "by_cause": {"thermal": h, "idle_held": h, ...},
                  "currency": "EUR", "cost": {"paid", "delivered", "lost"}},
      # optional context
      "title": str, "prospect": str, "generated_at": RFC3339,
      "sources": [{"kind": "prometheus|dmon|amd-smi|nvidia-smi|...", "name": str, "sha256": str,
                   "samples": int, "start": RFC3339, "end": RFC3339, "metrics": [str]}],
      "devices": [{"uuid", "node", "index", "sku", "vendor", "samples": int, "coverage": 0..1}],
      "coverage": {"start": RFC3339, "end": RFC3339, "fraction": 0..1,
                   "gaps": [{"device", "start", "end", "cause"}]},
      "series": {"<finding id or device uuid>": {"<signal>": [[t, v], ...]}},   # timelines for the charts
      "recommendations": [{"title", "gpu_hours", "cost", "command", "reversible": bool, "finding_ids": [..]}],
      "method": {"name", "version", "notes"}, "limits": [str],
      "rate": {"price": float, "currency": str},   # ipledger analyze --rate PRICE --currency CUR; else GPU-hours
      "meta": {"start", "end", "devices": int, "samples": int, "cadence_s", "runs", "through_seq", "currency"},
      "daily": [{"day": "YYYY-MM-DD", "paid": h, "delivered": h, ...}]   # rows are summed per day
    }

``account.buckets`` (``{"delivered", "throttled": {reason: h}, "underutilized", "starved", "idle_held",
"unknown"}``), when present, is shown as the accounting identity beside ``by_cause``.

Times ``t`` may be RFC 3339 text or epoch seconds. A finding's evidence timeline is taken from its own
``evidence`` points, else from ``series[finding id]``, else from ``series[device uuid]`` cut to the finding's
span widened by its own length on each side (before / during / after).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from reportlab.lib.pagesizes import A4
from reportlab.lib.units import mm
from reportlab.pdfbase.pdfmetrics import stringWidth
from reportlab.platypus import KeepTogether, PageBreak, Paragraph, SimpleDocTemplate, Spacer
from xml.sax.saxutils import escape

from . import charts
from .pdf_statement import footer, fmt_hours, fmt_money, fmt_pct, styles, table

MAX_FINDINGS_WITH_CHARTS = 12
MARGIN_LEFT = MARGIN_RIGHT = 18 * mm
MARGIN_TOP, MARGIN_BOTTOM = 16 * mm, 18 * mm
FRAME_WIDTH = A4[0] - MARGIN_LEFT - MARGIN_RIGHT - 12   # the frame's own padding (6 pt a side)
CELL_FONT, CELL_SIZE, CELL_PAD = "Helvetica", 7.5, 13.0   # pdf_statement.table's cell font; 6 pt padding a side
MIN_COLUMN = 30.0   # points: the narrowest a wrapped column gets
FIRST_PAGE_TIMELINES = 4   # the largest findings' first timeline, small, two to a row, on the first page
MAX_LOSS_ROWS = 9   # the first page's chart: the largest loss lines, the rest summed in one row
# the timelines (``series``) a finding's charts show first, by kind: two charts a finding keep it on one page
KIND_SIGNALS = {"hot_because_cooling": ("gpu_temp", "sm_clock"), "hot_because_working": ("gpu_temp", "power_w"),
                "thermal_throttle": ("gpu_temp", "sm_clock"), "power_cap": ("power_w", "sm_clock"),
                "hw_slowdown": ("sm_clock", "power_w"), "sync_boost": ("sm_clock", "sm_active"),
                "sibling_divergence": ("sm_clock", "sm_active"), "ecc_drift": ("sm_clock", "sm_active"),
                "xid": ("sm_active", "power_w"), "idle_held": ("sm_active", "power_w"),
                "starved": ("sm_active", "power_w"), "unknown_gap": ("sm_active", "power_w"),
                "busy_not_computing": ("sm_active", "power_w"), "flops_behind_siblings": ("sm_clock", "sm_active")}
DEFAULT_SIGNALS = ("sm_active", "power_w", "sm_clock", "gpu_temp")
SIGNAL_UNITS = {"sm": "fraction", "sm_active": "fraction", "clk": "MHz", "sm_clock": "MHz", "power": "W",
                "power_w": "W", "temp": "C", "gpu_temp": "C"}
MAX_SERIES_POINTS = 600  # charts are downsampled (every n-th point) beyond this
CAUSE_LABELS = {"thermal": "throttled: thermal", "power_cap": "throttled: power cap",
                "hw_slowdown": "throttled: HW slowdown", "sync_boost": "throttled: sync boost",
                "other": "throttled: other", "underutilized": "underutilized", "starved": "starved",
                "idle_held": "idle held", "unknown": "unknown (no trustworthy telemetry)",
                "cooling": "cooling (thermal throttling)", "checkpoint_starved": "starved at checkpoints",
                "xid": "XID errors", "drift": "slow device (drift)",
                "not_computing": "busy, not computing (the tenant's)", "slow_part": "slow part (FLOPs behind siblings)"}


# the loss partition's own lines (ledger.agents.accounting): not a finding's cause
PARTITION_LINES = ("underutilized (workload)", "other / unattributed", "unknown (no finding)", "rounding")


def cause_label(k: str) -> str:
    """A loss line's label: a finding's cause says so ("idle held (finding)"), so it never reads as the bucket of
    the same name (every idle-held hour) on the same page."""
    return k if k in PARTITION_LINES else f"{CAUSE_LABELS.get(k, k.replace('_', ' '))} (finding)"


def _epoch(t: Any) -> float | None:
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return float(t) / 1000.0 if t > 1e11 else float(t)  # milliseconds (Prometheus/JS) or seconds
    try:
        s = str(t).strip()
        s = s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s
        v = dt.datetime.fromisoformat(s)
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).timestamp()
    except ValueError:
        return None


def _when(t: Any) -> str:
    e = _epoch(t)
    return "-" if e is None else dt.datetime.fromtimestamp(e, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _num(v: Any, default: float = 0.0) -> float:
    try:
        f = float(v)
        return default if math.isnan(f) else f
    except (TypeError, ValueError):
        return default


def _txt(v: Any) -> str:
    """Plain text for a table cell."""
    return "" if v is None else str(v)


def _e(v: Any) -> str:
    """Text escaped for a Paragraph (which parses a little markup)."""
    return escape(_txt(v))


def _points(raw: Any) -> list[tuple[float, float]]:
    """[[t, v], ...] or [{"t"/"ts"/"time", "v"/"value"}, ...] -> [(epoch, value)], skipping bad points."""
    out = []
    for p in raw or []:
        if isinstance(p, Mapping):
            t, v = p.get("t", p.get("ts", p.get("time"))), p.get("v", p.get("value"))
        elif isinstance(p, (list, tuple)) and len(p) >= 2:
            t, v = p[0], p[1]
        else:
            continue
        e = _epoch(t)
        try:
            fv = float(v)
        except (TypeError, ValueError):
            continue  # "N/A", "Not Supported": not measured, never drawn as zero
        if e is not None and not math.isnan(fv):
            out.append((e, fv))
    out.sort()
    if len(out) > MAX_SERIES_POINTS:
        step = math.ceil(len(out) / MAX_SERIES_POINTS)
        out = out[::step]
    return out


def _finding_series(f: Mapping, series: Mapping) -> tuple[dict[str, list], dict[str, str], list[tuple]]:
    """(timelines by signal, units by signal, before/during/after contrasts) for one finding."""
    lines: dict[str, list] = {}
    units: dict[str, str] = {}
    contrasts: list[tuple] = []
    for ev in f.get("evidence") or []:
        if not isinstance(ev, Mapping):
            continue
        name = str(ev.get("signal") or ev.get("metric") or ev.get("name") or "signal")
        unit = ev.get("unit")
        raw = ev.get("points") or ev.get("series") or ev.get("samples")
        if raw:
            pts = _points(raw)
            if pts:
                lines[name] = pts
                units[name] = unit or ""
        if any(k in ev for k in ("before", "during", "after")):
            contrasts.append((name, ev.get("before"), ev.get("during"), ev.get("after"), unit or ""))
    if not lines:
        s0, s1 = _epoch(f.get("start")), _epoch(f.get("end"))
        src = series.get(str(f.get("id"))) if f.get("id") is not None else None
        if not src and f.get("series_id") is not None:   # a rack group: its largest member's timeline
            src = series.get(str(f["series_id"]))
        dev = (f.get("scope") or {}).get("device_uuid")
        if not src and dev:
            src = series.get(str(dev))
        order = KIND_SIGNALS.get(str(f.get("kind")), DEFAULT_SIGNALS)
        named = sorted((src or {}).items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order),
                                                           str(kv[0])))
        for name, raw in named[:2]:
            pts = _points(raw)
            if s0 is not None and s1 is not None and s1 > s0:
                pad = max(s1 - s0, 600.0)
                pts = [p for p in pts if s0 - pad <= p[0] <= s1 + pad]
            if pts:
                lines[str(name)] = pts
                units[str(name)] = SIGNAL_UNITS.get(str(name), "")
    return lines, units, contrasts


def _evidence_chart(f: Mapping, lines: dict[str, list], units: dict[str, str]) -> list:
    """One chart per unit (signals sharing a unit share an axis), x in hours relative to the finding start; two
    charts stand side by side (half the frame each), so a finding and its timelines fit in half a page."""
    s0, s1 = _epoch(f.get("start")), _epoch(f.get("end"))
    all_t = [p[0] for v in lines.values() for p in v]
    origin = s0 if s0 is not None else min(all_t)
    by_unit: dict[str, dict[str, list]] = {}
    for name, pts in lines.items():
        by_unit.setdefault(units.get(name, ""), {})[name] = broken_at_gaps([((t - origin) / 3600.0, v)
                                                                            for t, v in pts])
    drawn = []
    half = len(by_unit) > 1
    for unit, sers in list(by_unit.items())[:4]:
        sers = dict(list(sers.items())[:4])
        shade = ((0.0, (s1 - origin) / 3600.0) if s0 is not None and s1 is not None else None)
        width = FRAME_WIDTH / 2 - 14 if half else 460
        title = (f"{', '.join(sers)} ({unit or 'value'}): before, during, after" if half else
                 f"Evidence: {', '.join(sers)} before, during, after")
        drawn.append(charts.line_chart(sers, title=_cut(title, width), y_unit=unit or "value", shade=shade,
                                       x_unit="hours from the finding's start (shaded: during)", height=125,
                                       width=width))
    return _side_by_side(drawn)


def _first_page_timelines(findings: list[Mapping], series: Mapping) -> list:
    """For each of these findings that has one, its first timeline as a small chart (x = hours from its start, its
    span shaded), two to a row, titled with the finding's number and kind."""
    drawn = []
    for i, f in enumerate(findings):
        lines, units, _ = _finding_series(f, series)
        if not lines:
            continue
        name, pts = next(iter(lines.items()))
        s0, s1 = _epoch(f.get("start")), _epoch(f.get("end"))
        origin = s0 if s0 is not None else pts[0][0]
        unit = units.get(name) or "value"
        width = FRAME_WIDTH / 2 - 14
        drawn.append(charts.line_chart(
            {name: broken_at_gaps([((t - origin) / 3600.0, v) for t, v in pts])},
            title=_cut(f"{i + 1}. {_txt(f.get('kind'))}: {name} ({unit})", width), x_unit="hours from its start",
            y_unit=unit, shade=(0.0, (s1 - origin) / 3600.0) if s0 is not None and s1 is not None else None,
            height=110, width=width))
    return _side_by_side(drawn)


def _cut(text: str, width: float, font: str = "Helvetica-Bold", size: float = 10) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` points: a chart's title never runs past its chart."""
    if stringWidth(text, font, size) <= width:
        return text
    while text and stringWidth(text + "...", font, size) > width:
        text = text[:-1]
    return text + "..."


def _side_by_side(drawn: list) -> list:
    """Drawings two to a row (a borderless table of half-frame cells); one alone as it is."""
    if len(drawn) < 2:
        return drawn
    from reportlab.platypus import Table, TableStyle

    rows = [drawn[i:i + 2] + [""] * (2 - len(drawn[i:i + 2])) for i in range(0, len(drawn), 2)]
    t = Table(rows, colWidths=[FRAME_WIDTH / 2] * 2, hAlign="LEFT")
    t.setStyle(TableStyle([("LEFTPADDING", (0, 0), (-1, -1), 0), ("RIGHTPADDING", (0, 0), (-1, -1), 0),
                           ("VALIGN", (0, 0), (-1, -1), "TOP")]))
    return [t]


def broken_at_gaps(pts: list[tuple[float, float]]) -> list:
    """``pts`` (sorted by x) with a ``None`` wherever two neighbours lie more than three times the usual (median)
    spacing apart: the chart leaves a stretch without samples empty instead of drawing a line across it."""
    if len(pts) < 3:
        return list(pts)
    steps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:]))
    usual = steps[len(steps) // 2]
    out: list = [pts[0]]
    for a, b in zip(pts, pts[1:]):
        if usual > 0 and b[0] - a[0] > 3 * usual:
            out.append(None)
        out.append(b)
    return out


def _recommendations(analysis: Mapping) -> list[dict]:
    """The recommendations, each once: the ``recommendations`` list, else the ones carried by findings (the agents
    put each in both places; listing both printed every step twice)."""
    recs = [dict(r) for r in analysis.get("recommendations") or [] if isinstance(r, Mapping)]
    if recs:
        recs.sort(key=lambda r: -_num(r.get("gpu_hours_per_week", r.get("gpu_hours"))))
        return recs
    for f in analysis.get("findings") or []:
        r = f.get("recommendation") if isinstance(f, Mapping) else None
        if isinstance(r, Mapping):
            recs.append({"title": r.get("action") or r.get("title") or f.get("summary"),
                         "gpu_hours": r.get("gpu_hours", f.get("gpu_hours")), "cost": r.get("cost", f.get("cost")),
                         "command": r.get("command"), "reversible": r.get("reversible"),
                         "finding_ids": [f.get("id")]})
        elif isinstance(f, Mapping) and f.get("agent") == "recommendation":
            recs.append({"title": f.get("summary"), "gpu_hours": f.get("gpu_hours"), "cost": f.get("cost"),
                         "command": (f.get("evidence") or [None])[0] if isinstance((f.get("evidence") or [None])[0],
                                                                                   str) else None,
                         "reversible": None, "finding_ids": [f.get("id")]})
    recs.sort(key=lambda r: -_num(r.get("gpu_hours")))
    return recs


def price_of(analysis: Mapping[str, Any]) -> tuple[float, str] | None:
    """(price per GPU-hour, currency) the analysis states (``rate``: ``ipledger analyze --rate PRICE --currency
    CUR``), or None: then the written analysis is in GPU-hours and says so."""
    rate = analysis.get("rate")
    if isinstance(rate, Mapping):
        p = _num(rate.get("price"), float("nan"))
        if p == p and p >= 0:
            return p, _txt(rate.get("currency"))
    return None


def loss_lines(acct: Mapping) -> list[tuple[str, float]]:
    """The first page's loss rows: the account's loss lines (``by_cause``, which sum to paid - delivered), else its
    buckets, largest first; zero lines dropped, beyond MAX_LOSS_ROWS the rest summed as one row."""
    by_cause = {str(k): _num(v) for k, v in (acct.get("by_cause") or {}).items()}
    lines = [(cause_label(k), v) for k, v in by_cause.items()]
    if not lines and isinstance(acct.get("buckets"), Mapping):
        for k, v in acct["buckets"].items():
            if k == "delivered":
                continue
            if isinstance(v, Mapping):
                lines += [(CAUSE_LABELS.get(r, f"throttled: {r}"), _num(h)) for r, h in v.items()]
            else:
                lines.append((CAUSE_LABELS.get(k, k), _num(v)))
    if not lines:
        lost = _num(acct.get("paid")) - _num(acct.get("delivered"))
        lines = [("lost (not broken down)", lost)] if lost > 0 else []
    lines = sorted([ln for ln in lines if ln[1] > 0], key=lambda kv: -kv[1])
    if len(lines) > MAX_LOSS_ROWS:
        rest = lines[MAX_LOSS_ROWS - 1:]
        lines = lines[:MAX_LOSS_ROWS - 1] + [(f"{len(rest)} smaller lines", sum(v for _, v in rest))]
    return lines


def render(analysis: Mapping[str, Any], out_path: str | Path) -> Path:
    """Write the written analysis PDF for ``analysis`` (see the module doc) to ``out_path``."""
    s = styles()
    analysis = analysis or {}
    findings = [f for f in analysis.get("findings") or [] if isinstance(f, Mapping)
                and f.get("agent") != "recommendation"]
    findings = group_racks(findings)
    findings.sort(key=lambda f: (-_num(f.get("gpu_hours")), str(f.get("id"))))
    acct = analysis.get("account") or {}
    price = price_of(analysis)
    path_b = analysis.get("path") == "B" or bool(analysis.get("sources"))
    # money only at a stated price: the rate given (--rate), or on the ledger path the contract's own prices
    # (the account's cost); an export priced at a default rate would state a price nobody gave
    cur = price[1] if price else "" if path_b else acct.get("currency") or \
        (analysis.get("contract") or {}).get("currency") or \
        ((analysis.get("meta") or {}).get("currency") if isinstance(analysis.get("meta"), Mapping) else "") or ""
    paid, delivered = _num(acct.get("paid")), _num(acct.get("delivered"))
    by_cause = {str(k): _num(v) for k, v in (acct.get("by_cause") or {}).items()}
    series = analysis.get("series") or {}
    story: list = []

    def money(hours: float, given: Any = None) -> str:
        if price:
            return fmt_money(hours * price[0])
        return fmt_money(_num(given)) if (cur and given is not None) else "-"

    # --- first page: how many of the paid GPU-hours did real work, and where the rest went
    story.append(Paragraph(_e(analysis.get("title") or "Where your GPU-hours went: a written analysis"), s["title"]))
    cov = dict(analysis.get("coverage") or {})
    meta = analysis.get("meta") if isinstance(analysis.get("meta"), Mapping) else {}
    cov.setdefault("start", meta.get("start"))
    cov.setdefault("end", meta.get("end"))
    raw_devices = analysis.get("devices")
    devices = [d for d in raw_devices or [] if isinstance(d, Mapping)] if isinstance(raw_devices, list) else []
    n_devices = len(devices) or int(_num(meta.get("devices")) or _num(raw_devices if not isinstance(
        raw_devices, (list, Mapping)) else 0))
    lead = []
    if analysis.get("prospect"):
        lead.append(f"Prepared for {_e(analysis['prospect'])}.")
    if cov.get("start") or cov.get("end"):
        lead.append(f"Period {_when(cov.get('start'))} to {_when(cov.get('end'))} UTC.")
    if n_devices:
        lead.append(f"{n_devices} GPU(s) measured.")
    if analysis.get("generated_at"):
        lead.append(f"Generated {_when(analysis['generated_at'])} UTC by ipledger.")
    if lead:
        story.append(Paragraph(" ".join(lead), s["body"]))
    story.append(Spacer(1, 4))
    lost = paid - delivered
    if paid > 0:
        story.append(Paragraph(
            f"<b>Of {fmt_hours(paid)} paid GPU-hours, {fmt_hours(delivered)} ({fmt_pct(delivered / paid)}) did real "
            f"work; {fmt_hours(lost)} ({fmt_pct(lost / paid)}) did not.</b> The chart follows the paid hours to the "
            "work delivered and then to each loss, largest first.", s["body"]))
    else:
        story.append(Paragraph("No paid GPU-hours in the analysed data.", s["body"]))
    losses = loss_lines(acct)
    if price:
        story.append(Paragraph(f"Priced at the stated rate of {fmt_money(price[0])} {_e(price[1])} per GPU-hour.",
                               s["small"]))
        story.append(charts.waterfall(paid * price[0], delivered * price[0],
                                      [(k, v * price[0]) for k, v in losses], fmt=fmt_money,
                                      title=f"Paid -> delivered -> each loss, in {price[1] or 'money'} "
                                            f"at {fmt_money(price[0])} per GPU-hour",
                                      unit=price[1]))
    else:
        cost = acct.get("cost") if isinstance(acct.get("cost"), Mapping) else {}
        if cur and all(cost.get(k) is not None for k in ("paid", "delivered", "lost")):
            # a ledger period: each run priced at its contract's rate, so only the totals have one price
            story.append(Paragraph(f"In GPU-hours. At the contract's rates the paid hours cost "
                                   f"{fmt_money(_num(cost['paid']))} {_e(cur)}, the delivered "
                                   f"{fmt_money(_num(cost['delivered']))} {_e(cur)} and the lost "
                                   f"{fmt_money(_num(cost['lost']))} {_e(cur)}.", s["small"]))
        else:
            story.append(Paragraph("In GPU-hours: no price per GPU-hour was given (ipledger analyze --rate PRICE "
                                   "--currency CUR prices this analysis).", s["small"]))
        story.append(charts.waterfall(paid, delivered, losses, fmt=fmt_hours,
                                      title="Paid -> delivered -> each loss, in GPU-hours", unit="GPU-h"))
    story.append(Spacer(1, 4))
    if findings:
        story.append(Paragraph("The largest findings", s["h2"]))
        story.append(_table(["#", "finding", "where", "GPU-h"] + ([f"cost {cur}"] if cur else []) + ["confidence"],
                            [(i + 1, _txt(f.get("kind")), _scope(f), fmt_hours(_num(f.get("gpu_hours"))))
                             + ((money(_num(f.get("gpu_hours")), f.get("cost")),) if cur else ())
                             + (fmt_pct(_num(f.get("confidence"))),) for i, f in enumerate(findings[:5])],
                            numeric=[0, 3, 4, 5] if cur else [0, 3, 4]))
        story.append(Paragraph(f"Largest: {_e(findings[0].get('summary') or findings[0].get('kind'))} Each finding "
                               "is shown with its evidence and timelines under Findings.", s["small"]))
        story.extend(_first_page_timelines(findings[:FIRST_PAGE_TIMELINES], series))
    else:
        story.append(Paragraph("No findings: nothing in the data explains a loss with enough confidence.",
                               s["body"]))
    story.append(PageBreak())

    story.append(Paragraph("The account in one table", s["h1"]))
    rows = [("Paid (allocated)", fmt_hours(paid), "GPU-hours"), ("Delivered", fmt_hours(delivered), "GPU-hours"),
            ("Lost (paid - delivered)", fmt_hours(lost), "GPU-hours"),
            ("Delivered share", fmt_pct(delivered / paid) if paid else "-", "of paid")]
    cost = acct.get("cost") or {}
    if price:
        rows += [(f"Cost of {k} hours", fmt_money(h * price[0]), price[1])
                 for k, h in (("paid", paid), ("delivered", delivered), ("lost", lost))]
    elif cur and isinstance(cost, Mapping):
        for k in ("paid", "delivered", "lost"):
            if cost.get(k) is not None:
                rows.append((f"Cost of {k} hours", fmt_money(_num(cost[k])), cur))
    story.append(_table(["figure", "value", "unit"], rows, numeric=[1]))

    # --- what was measured
    story.append(Paragraph("What was measured", s["h1"]))
    sources = [x for x in analysis.get("sources") or [] if isinstance(x, Mapping)]
    if sources:
        story.append(_table(["source", "name", "samples", "from (UTC)", "to (UTC)", "sha256"],
                            [(_txt(x.get("kind")), _txt(x.get("name") or x.get("path")),
                              _count(x.get("samples", x.get("rows")),
                                     meta.get("samples") if len(sources) == 1 else None),
                              _when(x.get("start") or cov.get("start")), _when(x.get("end") or cov.get("end")),
                              _txt(x.get("sha256"))[:16]) for x in sources], numeric=[2]))
    elif meta:
        facts = [(label, f"{_num(meta.get(k)):,.0f}" if k != "cadence_s" else f"{_num(meta.get(k)):,.0f} s")
                 for k, label in (("devices", "GPUs"), ("samples", "telemetry samples"), ("cadence_s", "cadence"),
                                  ("runs", "job runs"), ("through_seq", "ledger entries read")) if meta.get(k) is not None]
        facts += [("from (UTC)", _when(meta.get("start"))), ("to (UTC)", _when(meta.get("end")))]
        story.append(_table(["measured", "value"], facts, numeric=[1]))
    else:
        story.append(Paragraph("The sources were not described in the analysis.", s["small"]))
    if devices:
        story.append(Spacer(1, 4))
        story.append(_table(["device", "node", "index", "SKU", "samples", "coverage"],
                            [(_txt(d.get("uuid")), _txt(d.get("node")), _txt(d.get("index")), _txt(d.get("sku")),
                              f"{int(_num(d.get('samples'))):,}" if d.get("samples") is not None else "-",
                              fmt_pct(_num(d.get("coverage"))) if d.get("coverage") is not None else "-")
                             for d in devices[:64]], numeric=[2, 4, 5]))
        if len(devices) > 64:
            story.append(Paragraph(f"... and {len(devices) - 64} more devices.", s["small"]))
    gaps = [g for g in cov.get("gaps") or [] if isinstance(g, Mapping)]
    if cov.get("fraction") is not None:
        story.append(Paragraph(f"Coverage: {fmt_pct(_num(cov['fraction']))} of device-time has trustworthy "
                               "telemetry; the rest is accounted as <i>unknown</i>, never interpolated.", s["body"]))
    if gaps:
        story.append(Paragraph("Gaps in the data", s["h2"]))
        story.append(_table(["device", "from (UTC)", "to (UTC)", "hours", "cause"],
                            [(_txt(g.get("device") or "all"), _when(g.get("start")), _when(g.get("end")),
                              fmt_hours(((_epoch(g.get("end")) or 0) - (_epoch(g.get("start")) or 0)) / 3600.0),
                              _txt(g.get("cause"))) for g in gaps[:100]], numeric=[3]))

    # --- the account
    story.append(PageBreak())
    story.append(Paragraph("The account: paid vs delivered, by cause", s["h1"]))
    story.append(Paragraph("Every allocated GPU-second falls into exactly one bucket: delivered, throttled (by "
                           "reason), underutilized, starved, idle held or unknown.", s["body"]))
    causes = sorted(by_cause.items(), key=lambda kv: -kv[1])
    story.append(Paragraph("A cause's line holds the hours a finding explains; what no finding explains stays "
                           "under other / unattributed, so a line can be less than the bucket of the same name "
                           "below.", s["small"]))
    crow = [(cause_label(k), fmt_hours(v), fmt_pct(v / paid) if paid else "-") for k, v in causes]
    crow.append(("total lost", fmt_hours(sum(by_cause.values())),
                 fmt_pct(sum(by_cause.values()) / paid) if paid else "-"))
    story.append(_table(["cause", "GPU-hours", "share of paid"], crow, numeric=[1, 2], total_row=True))
    story.append(Spacer(1, 4))
    story.append(charts.hbar_chart([cause_label(k) for k, _ in causes], [v for _, v in causes],
                                   title="Lost GPU-hours by cause", unit="GPU-hours"))
    buckets = acct.get("buckets") if isinstance(acct.get("buckets"), Mapping) else None
    if buckets:
        brow = []
        for k, v in buckets.items():
            if isinstance(v, Mapping):
                brow += [(CAUSE_LABELS.get(r, f"throttled: {r}"), fmt_hours(_num(h)),
                          fmt_pct(_num(h) / paid) if paid else "-") for r, h in v.items()]
            else:
                brow.append((CAUSE_LABELS.get(k, k), fmt_hours(_num(v)), fmt_pct(_num(v) / paid) if paid else "-"))
        story.append(Paragraph("The accounting identity: paid = the sum of these buckets", s["h2"]))
        story.append(_table(["bucket", "GPU-hours", "share of paid"], brow, numeric=[1, 2]))
    story += _effective_compute(analysis.get("effective_compute"), s)
    daily: dict[str, list[float]] = {}
    for row in analysis.get("daily") or []:
        if isinstance(row, Mapping) and row.get("day"):
            d = daily.setdefault(str(row["day"])[:10], [0.0, 0.0])
            d[0] += _num(row.get("paid"))
            d[1] += _num(row.get("delivered"))
    if daily:
        days = sorted(daily)
        story.append(charts.bar_chart([d[5:] for d in days], {"paid": [daily[d][0] for d in days],
                                                              "delivered": [daily[d][1] for d in days]},
                                      title="Paid vs delivered per day (UTC)", unit="GPU-hours", height=170))

    # --- findings
    story.append(PageBreak())
    story.append(Paragraph(f"Findings ({len(findings)})", s["h1"]))
    story.append(Paragraph("Each finding carries its confidence and its evidence: the signals before, during "
                           "and after it. Findings are proposals; an operator confirms or dismisses them. Where "
                           "nodes of one rack share a finding, it is shown once, at rack scope.", s["small"]))
    if findings:
        story.append(_table(["#", "kind", "where", "from (UTC)", "to (UTC)", "GPU-h"] +
                            ([f"cost {cur}"] if cur else []) + ["confidence"],
                            [(i + 1, _txt(f.get("kind")), _scope(f), _when(f.get("start")), _when(f.get("end")),
                              fmt_hours(_num(f.get("gpu_hours"))))
                             + ((money(_num(f.get("gpu_hours")), f.get("cost")),) if cur else ())
                             + (fmt_pct(_num(f.get("confidence"))),) for i, f in enumerate(findings)],
                            numeric=[0, 5, 6, 7] if cur else [0, 5, 6]))
    for i, f in enumerate(findings[:MAX_FINDINGS_WITH_CHARTS]):
        block = [Paragraph(f"{i + 1}. {_e(f.get('kind'))}: {_e(f.get('summary'))}", s["h2"]),
                 Paragraph(f"{_e(_scope(f))} · {_when(f.get('start'))} to {_when(f.get('end'))} UTC · "
                           f"{fmt_hours(_num(f.get('gpu_hours')))} GPU-hours · confidence "
                           f"{fmt_pct(_num(f.get('confidence')))} · agent {_e(f.get('agent'))}", s["small"])]
        lines, units, contrasts = _finding_series(f, series)
        if contrasts:
            block.append(_table(["signal", "before", "during", "after", "unit"],
                                [(_txt(n), _fmt_val(b), _fmt_val(d), _fmt_val(a), _txt(u))
                                 for n, b, d, a, u in contrasts], numeric=[1, 2, 3]))
        if lines:
            block.extend(_evidence_chart(f, lines, units))
        elif contrasts:
            block.extend(_contrast_chart(f, contrasts))
        texts = [e for e in f.get("evidence") or [] if isinstance(e, str)]
        for t in texts[:5]:
            block.append(Paragraph(f"· {_e(t)}", s["small"]))
        if not (contrasts or lines or texts):
            block.append(Paragraph("No evidence series was attached to this finding.", s["small"]))
        story.append(KeepTogether(block))
    if len(findings) > MAX_FINDINGS_WITH_CHARTS:
        story.append(Paragraph(f"The other {len(findings) - MAX_FINDINGS_WITH_CHARTS} findings are listed in the "
                               "table above; their evidence is in the JSON output.", s["small"]))

    # --- recommendations
    recs = recommendations_seen(_recommendations(analysis), findings)
    story.append(Paragraph("Recommendations, priced in GPU-hours", s["h1"]))
    if recs:
        story.append(Paragraph("Recoverable hours are what the findings behind a step cost over the period they "
                               "were seen (stated beside each), not extrapolated beyond it: under the same "
                               "workload, the step would have recovered them in that period.", s["small"]))
        story.append(_table(["recommendation (and the period its findings were seen, UTC)",
                             "GPU-h recoverable\n(over that period)"] + ([f"cost {cur}"] if price else []) +
                            ["reversible"],
                            [(f"{_txt(r.get('title')) or '-'}\nseen {_seen(r)}",
                              fmt_hours(r["seen_hours"]) if r.get("seen_hours") is not None else "-")
                             + ((money(r["seen_hours"]) if r.get("seen_hours") is not None else "-",) if price else ())
                             + ({True: "yes", False: "no"}.get(r.get("reversible"), "-"),) for r in recs],
                            numeric=[1, 2] if price else [1]))
        cmds = [c for r in recs for c in r.get("commands") or []]
        if cmds:
            story.append(Paragraph("Commands an operator could run (ipledger never runs them):", s["body"]))
            for c in cmds:
                story.append(Paragraph(_e(c), s["mono"]))
    else:
        story.append(Paragraph("No recommendation: the findings do not point at a change with a measurable gain.",
                               s["body"]))

    # --- method and limits
    story.append(Paragraph("Method and its limits", s["h1"]))
    m = analysis.get("method") or {}
    story.append(Paragraph(
        f"Method {_e(m.get('name') or 'ipledger')} version {_e(m.get('version') or '-')}. Delivered time is "
        "device activity (SM/tensor active, or GFX activity on AMD; coarse utilisation only as a lower-confidence "
        "fallback) multiplied by the ratio of the actual to the rated SM clock. Throttled time is split by the "
        "clock-event reason bits. Seconds without trustworthy telemetry are reported as unknown with their cause, "
        "never filled in." + (f" {_e(m.get('notes'))}" if m.get("notes") else ""), s["body"]))
    limits = list(analysis.get("limits") or []) or ([
        "A 24-hour export is a sample: a finding seen once may be rare; one seen every hour is structural.",
        "Telemetry is evidence, not an invoice: the allocation (paid) comes from the export's device list and "
        "time span, not from the scheduler's accounting.",
        "Gaps in the export are shown as unknown; their real cause cannot be known from the export alone.",
        "Recommendations count the GPU-hours lost over the period each was seen, under the same workload; what "
        "they would recover later depends on whether the cause persists."] if path_b else [
        "Paid time is the scheduler's allocation recorded in the ledger (prolog / epilog), per device.",
        "Telemetry is evidence, not an invoice: delivered and lost time are measured from it; allocated time "
        "without trustworthy telemetry is unknown, held for resolution under the contract.",
        "Recommendations count the GPU-hours lost over the period each was seen, under the same workload."])
    for t in limits:
        story.append(Paragraph(f"· {_e(t)}", s["body"]))

    doc = SimpleDocTemplate(str(out_path), pagesize=A4, leftMargin=MARGIN_LEFT, rightMargin=MARGIN_RIGHT,
                            topMargin=MARGIN_TOP, bottomMargin=MARGIN_BOTTOM, title="ipledger written analysis",
                            author="ipledger")
    foot = footer(f"ipledger written analysis · paid {fmt_hours(paid)} GPU-h · delivered {fmt_hours(delivered)} GPU-h")
    doc.build(story, onFirstPage=foot, onLaterPages=foot)
    return Path(out_path)


def _effective_compute(ec: Any, s: Mapping) -> list:
    """The effective-compute lens of the analysed time (ledger.agents.effective): what the busy time did in math
    against the devices' rating, per SKU; unknown where the capture did not measure tensor activity."""
    if not isinstance(ec, Mapping):
        return []
    out = [Paragraph("Effective compute: the math the paid hours did", s["h2"])]
    paid, tensor, unmeasured = _num(ec.get("paid_gpu_hours")), _num(ec.get("tensor_gpu_hours")), \
        _num(ec.get("unmeasured_gpu_hours"))
    share = ec.get("rated_share")
    lead = (f"Of {fmt_hours(paid)} paid GPU-hours, the tensor cores worked the equivalent of {fmt_hours(tensor)} "
            f"GPU-hours at the rated clock (tensor activity x clock ratio).")
    if isinstance(share, (int, float)):
        lead += (f" That is {fmt_hours(_num(ec.get('achieved_pflop_hours')))} PFLOP-hours of "
                 f"{_e(ec.get('precision'))} math against {fmt_hours(_num(ec.get('rated_pflop_hours')))} the "
                 f"devices were rated for in the measured time: {fmt_pct(float(share))} of the rating (a "
                 f"hardware-counter estimate, not the application's own count).")
    elif ec.get("achieved_pflop_hours") is None:
        lead += " The data names no GPU model with a rating, so the math is given in tensor GPU-hours only."
    if unmeasured > 0:
        lead += f" {fmt_hours(unmeasured)} GPU-hours had no tensor activity measured: unknown, not zero."
    out.append(Paragraph(_e(lead), s["body"]))
    rows = [(r.get("sku"), _count(r.get("devices")), fmt_hours(_num(r.get("paid_gpu_hours"))),
             fmt_hours(_num(r.get("tensor_gpu_hours"))),
             "-" if r.get("achieved_pflop_hours") is None else fmt_hours(_num(r.get("achieved_pflop_hours"))),
             "-" if r.get("rated_share") is None else fmt_pct(_num(r.get("rated_share"))),
             fmt_hours(_num(r.get("unmeasured_gpu_hours"))))
            for r in ec.get("by_sku") or [] if isinstance(r, Mapping)]
    if rows:
        out.append(_table(["SKU", "devices", "paid GPU-h", "tensor GPU-h", "achieved PFLOP-h", "of rating",
                           "not measured GPU-h"], rows, numeric=[1, 2, 3, 4, 5, 6]))
    return out


def _seen(r: Mapping) -> str:
    a, b = r.get("seen_from"), r.get("seen_to")
    if a is None or b is None:
        return "-"
    a_, b_ = _when(a), _when(b)
    to = b_[11:] if b_[:10] == a_[:10] else b_[5:]   # on one line: the second date only when it differs
    return f"{a_} to {to} ({fmt_hours((_num(b) - _num(a)) / 3600.0)} h)"


def _contrast_chart(f: Mapping, contrasts: list[tuple]) -> list:
    """A finding with only before / during / after means: its timeline drawn as those levels over the three
    periods (x = hours from the finding's start; before and after as long as the finding, the finding shaded),
    one chart per unit, for the numeric contrasts."""
    s0, s1 = _epoch(f.get("start")), _epoch(f.get("end"))
    if s0 is None or s1 is None or s1 <= s0:
        return []
    span = (s1 - s0) / 3600.0
    by_unit: dict[str, dict[str, list]] = {}
    for name, b, d, a, unit in contrasts:
        pts: list[tuple[float, float]] = []
        for (x0, x1), v in (((-span, 0.0), b), ((0.0, span), d), ((span, 2 * span), a)):
            fv = _num(v, float("nan"))
            if fv == fv:
                pts += [(x0, fv), (x1, fv)]
        if len(pts) >= 2:
            by_unit.setdefault(unit or "", {})[str(name)[:28]] = pts
    out = []
    half = len(by_unit) > 1
    for unit, sers in list(by_unit.items())[:2]:
        sers = dict(list(sers.items())[:4])
        title = (_cut(f"Mean before, during, after ({unit or 'value'})", FRAME_WIDTH / 2 - 14) if half else
                 "Evidence: mean before, during and after (no per-sample timeline)")
        out.append(charts.line_chart(sers, title=title,
                                     x_unit="hours from the finding's start (shaded: during)",
                                     y_unit=unit or "value", shade=(0.0, span), x_range=(-span, 2 * span),
                                     height=130, width=FRAME_WIDTH / 2 - 14 if half else 460))
    return _side_by_side(out)


def _count(v: Any, fallback: Any = None) -> str:
    """A count for a table cell; "-" when the analysis does not say (never a made-up 0)."""
    for x in (v, fallback):
        if x is not None:
            try:
                return f"{int(float(x)):,}"
            except (TypeError, ValueError):
                continue
    return "-"


def _fmt_val(v: Any) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return _txt(v) if v is not None else "-"
    return "-" if math.isnan(f) else f"{f:,.2f}"


def _scope(f: Mapping) -> str:
    sc = f.get("scope") or {}
    parts = [f"{k} {sc[k]}" for k in ("cluster", "rack", "node", "device_uuid", "job_id", "tenant") if sc.get(k)]
    if isinstance(sc.get("nodes"), list) and sc["nodes"]:
        parts.append(f"{len(sc['nodes'])} nodes: {', '.join(map(str, sc['nodes'][:8]))}"
                     f"{', ...' if len(sc['nodes']) > 8 else ''}")
    return ", ".join(parts) or "fleet"


def _wrap_to(text: str, width: float, font: str = CELL_FONT, size: float = CELL_SIZE) -> str:
    """``text`` broken into lines no wider than ``width`` points in ``font``: at spaces where it can, inside a word
    (a UUID, a long signal name) where a word alone is wider than the line."""
    out: list[str] = []
    width += 0.01   # a cell exactly as wide as its text (column_widths) keeps it on one line
    for para in text.split("\n"):
        line = ""
        for word in para.split(" "):
            cand = f"{line} {word}" if line else word
            if stringWidth(cand, font, size) <= width:
                line = cand
                continue
            if line:
                out.append(line)
            line = ""
            while stringWidth(word, font, size) > width and len(word) > 1:
                k = len(word)
                while k > 1 and stringWidth(word[:k], font, size) > width:
                    k -= 1
                out.append(word[:k])
                word = word[k:]
            line = word
        out.append(line)
    return "\n".join(out)


def column_widths(header: list[str], rows: list[list[str]], numeric: Iterable[int] = (),
                  total: float = FRAME_WIDTH) -> list[float]:
    """Widths (points) for a table that fits ``total``: every column its natural width when they all fit; else the
    numeric columns (and any column narrower than its fair share) keep theirs and the rest share what is left in
    proportion to their natural widths (their text is then wrapped to it)."""
    n = len(header)
    nat = [max([stringWidth(str(c), CELL_FONT + "-Bold", CELL_SIZE) for c in str(header[i]).split("\n")] +
               [stringWidth(ln, CELL_FONT, CELL_SIZE) for r in rows for ln in str(r[i]).split("\n")]) + CELL_PAD
           for i in range(n)]
    if sum(nat) <= total:
        return nat
    fixed = set(numeric)
    while True:
        free = [i for i in range(n) if i not in fixed]
        room = total - sum(nat[i] for i in fixed)
        share = room / max(len(free), 1)
        small = [i for i in free if nat[i] <= share]
        if not small or len(small) == len(free):
            break
        fixed.update(small)
    free = [i for i in range(n) if i not in fixed]
    room = max(total - sum(nat[i] for i in fixed), MIN_COLUMN * len(free))
    out = {i: nat[i] for i in fixed}
    while free:   # in proportion to natural width; a column that would get under MIN_COLUMN gets MIN_COLUMN
        want = sum(nat[i] for i in free) or 1.0
        thin = [i for i in free if room * nat[i] / want < MIN_COLUMN]
        if not thin:
            out.update({i: room * nat[i] / want for i in free})
            break
        for i in thin:
            out[i] = MIN_COLUMN
            room -= MIN_COLUMN
            free.remove(i)
    return [out[i] for i in range(n)]


def _table(header: Iterable[Any], rows: Iterable[Iterable[Any]], numeric: Iterable[int] = (), total_row: bool = False,
           total: float = FRAME_WIDTH):
    """pdf_statement.table, fitted to the frame: column widths from :func:`column_widths`, every cell wrapped to its
    column, so no table runs past the margin whatever the device names, scopes or signal names."""
    head = [_txt(h) for h in header]
    body = [[_txt(c) for c in r] for r in rows]
    numeric = list(numeric)
    widths = column_widths(head, body, numeric, total)
    fit = [lambda c, w=w: _wrap_to(c, w - CELL_PAD) for w in widths]
    head = [_wrap_to(h, w - CELL_PAD, CELL_FONT + "-Bold") for h, w in zip(head, widths)]
    body = [[fit[i](c) for i, c in enumerate(r)] for r in body]
    return table(head, body, numeric=numeric, widths=widths, total_row=total_row)


def group_racks(findings: list[Mapping]) -> list[Mapping]:
    """Findings of one kind (and cause) on two or more nodes of one rack become one rack-scope item: its hours and
    cost summed, its span the members' union, its confidence the members' highest, its evidence the largest
    member's, its members listed. A rack finding the agents made stays as it is; so does every other finding."""
    groups: dict[tuple, list[Mapping]] = {}
    for f in findings:
        sc = f.get("scope") if isinstance(f.get("scope"), Mapping) else {}
        if sc.get("rack") and sc.get("node") and f.get("level") != "rack":
            groups.setdefault((f.get("kind"), f.get("cause"), sc["rack"]), []).append(f)
    merged: dict[int, Mapping] = {}
    absorbed: set[int] = set()
    for (kind, cause, rack), fs in groups.items():
        nodes = sorted({str(f["scope"]["node"]) for f in fs})
        if len(nodes) < 2:
            continue
        fs = sorted(fs, key=lambda f: (-_num(f.get("gpu_hours")), str(f.get("id"))))
        top = fs[0]
        starts = [e for e in (_epoch(f.get("start")) for f in fs) if e is not None]
        ends = [e for e in (_epoch(f.get("end")) for f in fs) if e is not None]
        hours = sum(_num(f.get("gpu_hours")) for f in fs)
        item = dict(top)
        item.update({
            "id": f"rack-{rack}-{kind}" + (f"-{cause}" if cause and cause != kind else ""), "level": "rack",
            "members": [f.get("id") for f in fs],
            "series_id": top.get("id"),
            "scope": {"cluster": (top.get("scope") or {}).get("cluster"), "rack": rack, "nodes": nodes},
            "start": min(starts) if starts else top.get("start"), "end": max(ends) if ends else top.get("end"),
            "gpu_hours": hours, "confidence": max(_num(f.get("confidence")) for f in fs),
            "summary": f"{kind} on {len(nodes)} nodes of rack {rack} ({', '.join(nodes[:6])}"
                       f"{', ...' if len(nodes) > 6 else ''}): {fmt_hours(hours)} GPU-hours together. "
                       f"Largest: {top.get('summary') or kind}"})
        if all(f.get("cost") is not None for f in fs):
            item["cost"] = sum(_num(f.get("cost")) for f in fs)
        merged[id(top)] = item
        absorbed.update(id(f) for f in fs[1:])
    return [merged.get(id(f), f) for f in findings if id(f) not in absorbed]


def recommendations_seen(recs: list[dict], findings: list[Mapping]) -> list[dict]:
    """Each recommendation's recoverable hours over the period it was seen: the hours its findings cost between
    the first one's start and the last one's end, never a rate carried past the data (an agents' figure per week
    is an extrapolation, so it is not shown). ``seen_hours`` is None where no finding it rests on is in the
    analysis and the recommendation gives only a weekly figure. Recommendations resting on findings of one rack
    group (:func:`group_racks`) become one."""
    by_id: dict[str, Mapping] = {}
    for f in findings:
        by_id[str(f.get("id"))] = f
        for m in f.get("members") or []:
            by_id[str(m)] = f
    out: list[dict] = []
    rack_recs: dict[str, dict] = {}
    for r in recs:
        based = [by_id[str(i)] for i in r.get("finding_ids") or [] if str(i) in by_id]
        r = dict(r)
        uniq = list({id(f): f for f in based}.values())
        if uniq:
            starts = [e for e in (_epoch(f.get("start")) for f in uniq) if e is not None]
            ends = [e for e in (_epoch(f.get("end")) for f in uniq) if e is not None]
            r["seen_from"], r["seen_to"] = (min(starts) if starts else None), (max(ends) if ends else None)
            r["seen_hours"] = sum(_num(f.get("gpu_hours")) for f in uniq)
        elif r.get("gpu_hours_per_week") is None and r.get("gpu_hours") is not None:
            r["seen_hours"], r["seen_from"], r["seen_to"] = _num(r.get("gpu_hours")), None, None
        else:
            r["seen_hours"], r["seen_from"], r["seen_to"] = None, None, None
        r["commands"] = [r["command"]] if r.get("command") else []
        rack = [f for f in uniq if f.get("level") == "rack" and f.get("members")]
        if len(uniq) == 1 and rack:
            if rack[0]["id"] in rack_recs:   # the rack's step is listed once; its commands name every node
                first = rack_recs[rack[0]["id"]]
                first["commands"] += [c for c in r["commands"] if c not in first["commands"]]
                continue
            sc = rack[0].get("scope") or {}
            r["title"] = f"Rack {sc.get('rack')} (nodes {', '.join(sc.get('nodes') or [])}): {_txt(r.get('title'))}"
            rack_recs[rack[0]["id"]] = r
        out.append(r)
    out.sort(key=lambda r: -_num(r.get("seen_hours")))
    return out
