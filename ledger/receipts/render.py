"""Receipts for people: a terminal layout and a one-page-per-run PDF (reportlab).

Both print the same figures as the JSON: GPU-hours with 6 decimals (the JSON has the exact 9), money with 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..method.attribution import TIMELINE_CODES
from .compute import Receipt

LINE_ORDER = (
    ("delivered", "Delivered"),
    ("throttled.thermal", "Throttled: thermal"),
    ("throttled.power_cap", "Throttled: power cap"),
    ("throttled.hw_slowdown", "Throttled: HW slowdown"),
    ("throttled.sync_boost", "Throttled: sync boost"),
    ("throttled.other", "Throttled: other"),
    ("underutilized", "Underutilized"),
    ("starved", "Starved"),
    ("idle_held", "Idle (held)"),
    ("unknown", "Unknown"),
)
COLOURS = {  # timeline strip colours per TIMELINE_CODES entry
    "delivered": "#2e7d32", "throttled.thermal": "#d32f2f", "throttled.power_cap": "#f57c00",
    "throttled.hw_slowdown": "#8e24aa", "throttled.sync_boost": "#5e35b1", "throttled.other": "#795548",
    "underutilized": "#9ccc65", "starved": "#fbc02d", "idle_held": "#90a4ae", "unknown": "#212121",
    "suspended": "#e0e0e0",
}


def hours_str(h: float) -> str:
    return f"{h:.6f}"


def money_str(x: float) -> str:
    return f"{x:.2f}"


def line_hours(body: dict, key: str) -> float:
    gh = body["gpu_hours"]
    if key.startswith("throttled."):
        return gh["throttled"][key.split(".", 1)[1]]
    return gh[key]


def progress_lines(body: dict) -> list[str]:
    """The application's progress beside the identity: marks, end state, work lost since the last checkpoint."""
    p = body.get("progress")
    if not p:
        return []
    m = p["marks"]
    out = [f"Progress  end state {p['end_state'] or 'running'}; {m['count']} marks: {m['checkpoint']} checkpoints, "
           f"{m['output']} accepted outputs, {m['step']} steps" + (f"; last step {p['last_step']}"
                                                                    if p["last_step"] is not None else "")]
    if p["last_checkpoint"]:
        out.append(f"  checkpoints {p['first_checkpoint']} .. {p['last_checkpoint']}")
    for o in p["accepted_outputs"][-3:]:
        out.append(f"  output {o['ts']}" + (f" step {o['step']}" if o["step"] is not None else "")
                   + (f" {o['note']}" if o["note"] else ""))
    lost = p["lost_since_checkpoint"]
    if lost:
        why = f", the provider's failure ({lost['provider_failure']})" if lost["provider_failure"] else ""
        out.append(f"  lost since last checkpoint {hours_str(lost['gpu_hours'])} h  {lost['from']} .. {lost['to']}"
                   f"  (from {lost['from_basis']}{why}): "
                   + {"credit": "credited", "charge": "charged"}.get(lost["billed_as"], lost["billed_as"]))
        if lost.get("evidence"):
            out.append("  evidence: " + "; ".join(evidence_text(e) for e in lost["evidence"]))
    return out


def evidence_text(e: dict) -> str:
    """One piece of a provider-failure answer's evidence, with who controls it and whether it is the
    provider's side."""
    side = "provider-side" if e.get("provider_side") else "not provider-side"
    if e.get("what") == "xid":
        return f"XID {e.get('value')} ({e.get('class')}, {e.get('controlled_by')}, {side}) on {e.get('device')}"
    if e.get("what") == "dcgm_critical_xid_errors":
        return f"DCGM critical XID errors {e.get('value')} ({e.get('controlled_by')}, names no XID, {side})"
    return f"end state {e.get('value')} ({e.get('controlled_by')}, {side})"


def rounding_cents(body: dict) -> float:
    """What the cost column's lines (each rounded to the cent once) miss of Paid (rounded once from the exact
    total): shown as its own line so the column adds up to the Paid it heads."""
    cost = body["cost"]
    lines = sum(round(cost["by_bucket"][key], 2) for key, _ in LINE_ORDER)
    return round(cost["paid"] - lines, 2)


def text_lines(r: Receipt) -> list[str]:
    b = r.body
    j, c, cost = b["job"], b["contract"], b["cost"]
    cur = cost["currency"]
    out = [
        f"GPU receipt  job {j['job_id']} run {j['run']}  cluster {j['cluster']}",
        f"account {j['account']}  partition {j['partition']}  qos {j['qos']}",
        f"window  {b['window']['start']} .. {b['window']['end']}" + ("  (open: no allocation_ended)"
                                                                     if b.get("open") else ""),
        f"devices {len(j['devices'])}: " + ", ".join(f"{d['node']}/{d['index']} {d['sku']}" for d in j["devices"][:8])
        + (f" (+{len(j['devices']) - 8} more)" if len(j["devices"]) > 8 else ""),
        f"contract {c['id']} v{c['version']}  ({cur}, unknown policy {c['unknown_policy']})",
        f"method  {b['method']['name']} {b['method']['version']}  fidelity {b['method']['fidelity']}",
        "",
        f"{'Measured lines':<28}{'GPU-hours':>16}{'Cost ' + cur:>16}",
        "-" * 60,
    ]
    for key, label in LINE_ORDER:
        out.append(f"{label:<28}{hours_str(line_hours(b, key)):>16}{money_str(cost['by_bucket'][key]):>16}")
    if rounding_cents(b):
        out.append(f"{'Rounding (cents)':<28}{'':>16}{money_str(rounding_cents(b)):>16}")
    out += [
        "-" * 60,
        f"{'Paid':<28}{hours_str(b['gpu_hours']['paid']):>16}{money_str(cost['paid']):>16}",
        f"{'Suspended (beside)':<28}{hours_str(b['gpu_hours']['suspended']):>16}",
        f"{'Delivered value':<28}{'':>16}{money_str(cost['delivered']):>16}",
        f"{'Lost (paid - delivered)':<28}{'':>16}{money_str(cost['lost']):>16}",
        "",
    ]
    if b.get("progress"):
        out += [*progress_lines(b), ""]
    if b["unknown_intervals"]:
        out.append("Unknown intervals")
        for u in b["unknown_intervals"]:
            res = u["resolution"]
            how = f"resolved {res['as']} by {res['by']}: {res['reason']}" if res else f"policy {u['policy']}"
            who = f"  evidence: {u['controlled_by']}" if u.get("controlled_by") else ""
            if u.get("replaced_by"):
                who += f", replaced by {u['replaced_by']}"
            out.append(f"  {u['id'][:14]}  {u['start']} .. {u['end']}  {u['cause']}  "
                       f"{hours_str(u['gpu_hours'])} h  {how}{who}")
        out.append("")
    out += energy_text(b)
    pol = b["billing"]["unknown_gpu_hours_by_policy"]
    out.append("Billing of unknown time: " + ", ".join(f"{k} {hours_str(v)} h" for k, v in pol.items()))
    out.append(f"{'Billed before adjustments':<28}{hours_str(b['totals']['before_adjustments']['gpu_hours']):>16}"
               f"{money_str(b['totals']['before_adjustments']['amount']):>16}")
    if b["adjustments"]:
        out.append("Adjustments")
        for a in b["adjustments"]:
            sign = "-" if a["direction"] == "credit" else "+"
            qty = f"{a['gpu_hours']} h" if a["gpu_hours"] is not None else ""
            out.append(f"  {a['direction']:<7} {qty:>10} {sign}{money_str(a['amount'])} {cur}  by {a['by']}: {a['reason']}")
    out.append(f"{'Billed after adjustments':<28}{hours_str(b['totals']['after_adjustments']['gpu_hours']):>16}"
               f"{money_str(b['totals']['after_adjustments']['amount']):>16}")
    out += effective_compute_lines(b)
    out += ["", f"receipt {b['receipt_hash']}",
            f"ledger through seq {b['ledger']['through_seq']}  head {b['ledger']['head_hash']}"]
    from ..base.textsafe import printable  # account/user/job names as the fleet sent them: no control characters shown

    return [printable(line) for line in out]


def effective_compute_lines(b: dict) -> list[str]:
    """Method 1.1/1.2's "Effective compute" block (nothing under 1.0.0, whose lines stay as they were; 1.2.0 adds
    where the achieved FLOPs came from)."""
    ec = b.get("effective_compute")
    if not ec:
        return []

    def h(v: float | None) -> str:
        return "not measured" if v is None else f"{hours_str(v)} h"

    def pf(v: float | None) -> str:
        return "no peak rating" if v is None else f"{v:.6f} PFLOP-h"

    share = ec["rated_share"]
    bound = ", ".join(f"{k} {'-' if v is None else f'{100 * v:.1f} %'}" for k, v in ec["bound_split"].items())
    return ["", f"Effective compute (hardware-counter estimate, precision {ec['precision']}, from {ec['source']})",
            f"  {'tensor GPU-hours':<26}{h(ec['tensor_gpu_hours']):>20}",
            *(f"  {p + ' GPU-hours':<26}{h(ec[p + '_gpu_hours']):>20}" for p in ("fp64", "fp32", "fp16")),
            f"  {'achieved':<26}{pf(ec['achieved_pflop_hours']):>20}",
            *([f"  {'achieved FLOPs from':<26}{ec['flops_source']:>20}"] if "flops_source" in ec else []),
            f"  {'rated':<26}{pf(ec['rated_pflop_hours']):>20}",
            f"  {'rated share':<26}{'-' if share is None else f'{100 * share:.2f} %':>20}",
            f"  bound (of delivered time): {bound}",
            f"  {'unmeasured GPU-hours':<26}{h(ec['unmeasured_gpu_hours']):>20}"]

def energy_text(b: dict) -> list[str]:
    """Receipt 1.4's energy lines (measured kWh, the energy cost billed and TDP pricing beside it), else none."""
    if "energy" not in b:
        return []
    from .energy import energy_lines

    return [*energy_lines(b["energy"], b.get("carbon")), ""]


def render_text(r: Receipt) -> str:
    return "\n".join(text_lines(r)) + "\n"


def render_pdf(receipts: Sequence[Receipt], path: str | Path) -> Path:
    """One page per run: header, per-device timeline strips, the lines, unknown intervals, adjustments, hashes."""
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    path = Path(path)
    c = canvas.Canvas(str(path), pagesize=A4, invariant=1)  # invariant: same bytes for the same receipt
    width, height = A4
    for r in receipts:
        b = r.body
        j, cost = b["job"], b["cost"]
        y = height - 40
        c.setFont("Helvetica-Bold", 13)
        c.drawString(40, y, f"GPU receipt - job {j['job_id']} run {j['run']} ({j['cluster']})")
        c.setFont("Helvetica", 8.5)
        for line in text_lines(r)[1:6]:
            y -= 12
            c.drawString(40, y, line)
        # timeline strips
        y -= 18
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, "Per-device timeline (each time slice stacked by bucket)")
        y -= 6
        devs = j["devices"]
        shown = devs[:24]
        strip_h = 8 if len(shown) > 12 else 14
        x0, x1 = 140, width - 40
        c.setFont("Helvetica", 6.5)
        for d in shown:
            y -= strip_h + 2
            tl = r.timelines.get(d["uuid"])
            c.setFillColor(colors.black)
            c.drawString(40, y + 1, f"{d['node']}/{d['index']} {str(d['uuid'])[:14]}")
            if tl is not None and len(tl):
                w = (x1 - x0) / len(tl)
                for i, shares in enumerate(tl):  # each time bin: its buckets stacked by share
                    yy = y
                    for code, share in enumerate(shares):
                        if share <= 0.002:
                            continue
                        c.setFillColor(colors.HexColor(COLOURS[TIMELINE_CODES[code]]))
                        c.rect(x0 + i * w, yy, w + 0.2, strip_h * float(share), stroke=0, fill=1)
                        yy += strip_h * float(share)
        if len(devs) > len(shown):
            y -= 10
            c.setFillColor(colors.black)
            c.drawString(40, y, f"... {len(devs) - len(shown)} more devices (see the JSON receipt)")
        y -= 4
        for i, name in enumerate(TIMELINE_CODES):
            if i % 6 == 0:
                y -= 10
                lx = 40
            c.setFillColor(colors.HexColor(COLOURS[name]))
            c.rect(lx, y, 7, 7, stroke=0, fill=1)
            c.setFillColor(colors.black)
            c.drawString(lx + 9, y + 1, name.replace("throttled.", "throttled: ").replace("_", " "))
            lx += 85
        # the lines
        c.setFillColor(colors.black)
        y -= 20
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, "Measured lines")
        c.drawRightString(330, y, "GPU-hours")
        c.drawRightString(430, y, f"Cost {cost['currency']}")
        c.setFont("Helvetica", 8.5)
        rows = [(label, hours_str(line_hours(b, key)), money_str(cost["by_bucket"][key])) for key, label in LINE_ORDER]
        if rounding_cents(b):
            rows.append(("Rounding (cents)", "", money_str(rounding_cents(b))))
        rows += [("Paid", hours_str(b["gpu_hours"]["paid"]), money_str(cost["paid"])),
                 ("Suspended (beside)", hours_str(b["gpu_hours"]["suspended"]), ""),
                 ("Delivered value", "", money_str(cost["delivered"])),
                 ("Lost (paid - delivered)", "", money_str(cost["lost"])),
                 ("Billed before adjustments", hours_str(b["totals"]["before_adjustments"]["gpu_hours"]),
                  money_str(b["totals"]["before_adjustments"]["amount"]))]
        for label, h, m in rows:
            y -= 11
            c.drawString(40, y, label)
            c.drawRightString(330, y, h)
            c.drawRightString(430, y, m)
        # unknown intervals
        y -= 18
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, f"Unknown intervals ({len(b['unknown_intervals'])})")
        c.setFont("Helvetica", 7.5)
        for u in b["unknown_intervals"][:12]:
            y -= 10
            res = u["resolution"]
            how = f"resolved {res['as']} by {res['by']}: {res['reason']}" if res else f"policy {u['policy']}"
            c.drawString(40, y, f"{u['id'][:14]} {u['start']} .. {u['end']} {u['cause']} "
                                f"{hours_str(u['gpu_hours'])} h, {how}"[:150])
        if len(b["unknown_intervals"]) > 12:
            y -= 10
            c.drawString(40, y, f"... {len(b['unknown_intervals']) - 12} more (see the JSON receipt)")
        # application progress
        y -= 18
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, "Application progress")
        c.setFont("Helvetica", 7.5)
        for line in progress_lines(b):
            y -= 10
            c.drawString(40, y, line.strip()[:150])
        if "energy" in b:   # receipt 1.4: the same energy and carbon lines as the text receipt
            y -= 18
            c.setFont("Helvetica-Bold", 9)
            c.drawString(40, y, "Energy and carbon")
            c.setFont("Helvetica", 7.5)
            for line in energy_text(b)[:-1]:
                y -= 10
                c.drawString(40, y, line.strip()[:150])
        # adjustments and totals
        y -= 18
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, f"Adjustments ({len(b['adjustments'])})")
        c.setFont("Helvetica", 7.5)
        for a in b["adjustments"][:8]:
            y -= 10
            sign = "-" if a["direction"] == "credit" else "+"
            c.drawString(40, y, f"{a['direction']} {a['gpu_hours'] if a['gpu_hours'] is not None else ''} "
                                f"{sign}{money_str(a['amount'])} {cost['currency']} by {a['by']}: {a['reason']}"[:150])
        y -= 14
        c.setFont("Helvetica-Bold", 9)
        c.drawString(40, y, "Billed after adjustments")
        c.drawRightString(330, y, hours_str(b["totals"]["after_adjustments"]["gpu_hours"]))
        c.drawRightString(430, y, money_str(b["totals"]["after_adjustments"]["amount"]))
        c.setFont("Courier", 7)
        c.drawString(40, 50, f"receipt {b['receipt_hash']}")
        c.drawString(40, 40, f"ledger through seq {b['ledger']['through_seq']} head {b['ledger']['head_hash']}")
        c.drawString(40, 30, f"method {b['method']['name']} {b['method']['version']}; contract {b['contract']['id']} "
                             f"v{b['contract']['version']}")
        c.showPage()
    c.save()
    return path
