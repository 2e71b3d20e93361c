"""Charts for the PDF documents, drawn with reportlab.graphics (vector, no plotting library, no screenshots).

Every chart states its unit on the value axis and has a legend when it has more than one series.
Empty input gives a small drawing that says "no data" instead of an empty frame.
"""

from __future__ import annotations

from typing import Sequence

from reportlab.graphics.charts.barcharts import HorizontalBarChart, VerticalBarChart
from reportlab.graphics.charts.legends import Legend
from reportlab.graphics.charts.lineplots import LinePlot
from reportlab.graphics.shapes import Drawing, Group, Line, Rect, String
from reportlab.lib import colors
from reportlab.pdfbase.pdfmetrics import stringWidth

PALETTE = (colors.HexColor("#1f77b4"), colors.HexColor("#ff7f0e"), colors.HexColor("#2ca02c"),
           colors.HexColor("#d62728"), colors.HexColor("#9467bd"), colors.HexColor("#8c564b"),
           colors.HexColor("#e377c2"), colors.HexColor("#7f7f7f"), colors.HexColor("#bcbd22"),
           colors.HexColor("#17becf"))
FONT = "Helvetica"


def _empty(width: float, height: float, title: str) -> Drawing:
    d = Drawing(width, height)
    d.add(String(0, height - 12, title, fontName=FONT + "-Bold", fontSize=10))
    d.add(String(width / 2, height / 2, "no data", fontName=FONT, fontSize=9, textAnchor="middle",
                 fillColor=colors.grey))
    return d


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    import math

    mag = 10 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if v <= step * mag:
            return step * mag
    return 10 * mag


def _vlabel(x: float, y: float, text: str) -> Group:
    """A value-axis unit label, rotated to run along the axis."""
    g = Group(String(0, 0, text, fontName=FONT, fontSize=7, textAnchor="middle"))
    g.translate(x, y)
    g.rotate(90)
    return g


def _legend(d: Drawing, names: Sequence[str], width: float, y: float) -> None:
    """A legend right-aligned under the title: at most four entries a row (names cut to 22 characters), so it
    never reaches left of the drawing however many series there are."""
    import math

    per_row = max(1, min(len(names), 4, int(width // 115)))
    lg = Legend()
    lg.x, lg.y = width - 115 * per_row, y
    lg.fontName, lg.fontSize = FONT, 8
    lg.alignment = "right"
    lg.columnMaximum = math.ceil(len(names) / per_row)
    lg.deltax = 115
    lg.dxTextSpace = 4
    lg.colorNamePairs = [(PALETTE[i % len(PALETTE)], str(n)[:22]) for i, n in enumerate(names)]
    d.add(lg)


def bar_chart(categories: Sequence[str], series: dict[str, Sequence[float]], *, title: str, unit: str,
              width: float = 460, height: float = 200) -> Drawing:
    """Grouped vertical bars: one group per category, one bar per series."""
    if not categories or not series:
        return _empty(width, height, title)
    d = Drawing(width, height)
    d.add(String(0, height - 12, title, fontName=FONT + "-Bold", fontSize=10))
    ch = VerticalBarChart()
    ch.x, ch.y, ch.width, ch.height = 50, 40, width - 70, height - 80
    ch.data = [list(map(float, v)) for v in series.values()]
    ch.categoryAxis.categoryNames = [str(c)[:14] for c in categories]
    ch.categoryAxis.labels.fontName = FONT
    ch.categoryAxis.labels.fontSize = 7
    ch.categoryAxis.labels.angle = 30 if len(categories) > 6 else 0
    ch.categoryAxis.labels.boxAnchor = "ne" if len(categories) > 6 else "n"
    ch.valueAxis.valueMin = 0
    ch.valueAxis.valueMax = _nice_max(max((max(v) for v in ch.data if len(v)), default=0) * 1.05)
    ch.valueAxis.labels.fontName = FONT
    ch.valueAxis.labels.fontSize = 7
    ch.barSpacing = 1
    ch.groupSpacing = 6
    for i in range(len(ch.data)):
        ch.bars[i].fillColor = PALETTE[i % len(PALETTE)]
        ch.bars[i].strokeColor = None
    d.add(ch)
    d.add(_vlabel(10, 40 + ch.height / 2, unit))
    if len(series) > 1:
        _legend(d, list(series), width, height - 8)
    return d


def hbar_chart(labels: Sequence[str], values: Sequence[float], *, title: str, unit: str, width: float = 460,
               height: float | None = None) -> Drawing:
    """Horizontal bars, one per label (e.g. loss by cause)."""
    height = height or max(90, 24 + 16 * len(labels) + 40)
    if not labels:
        return _empty(width, height, title)
    d = Drawing(width, height)
    d.add(String(0, height - 12, title, fontName=FONT + "-Bold", fontSize=10))
    ch = HorizontalBarChart()
    ch.x, ch.y, ch.width, ch.height = 130, 28, width - 150, height - 52
    ch.data = [list(map(float, values))]
    ch.categoryAxis.categoryNames = [str(x)[:24] for x in labels]
    ch.categoryAxis.labels.fontName = FONT
    ch.categoryAxis.labels.fontSize = 7
    ch.valueAxis.valueMin = 0
    ch.valueAxis.valueMax = _nice_max(max(values) * 1.05 if len(values) else 0)
    ch.valueAxis.labels.fontName = FONT
    ch.valueAxis.labels.fontSize = 7
    ch.bars[0].fillColor = PALETTE[3]
    ch.bars[0].strokeColor = None
    d.add(ch)
    d.add(String(ch.x + ch.width / 2, 4, unit, fontName=FONT, fontSize=7, textAnchor="middle"))
    return d


def line_chart(series: dict[str, Sequence[tuple[float, float]]], *, title: str, x_unit: str, y_unit: str,
               width: float = 460, height: float = 180, x_range: tuple[float, float] | None = None,
               shade: tuple[float, float] | None = None) -> Drawing:
    """Lines over a numeric x axis; ``shade`` marks an x interval (a finding's span) in light red. A ``None`` in a
    series breaks its line there (a stretch without data is left empty, never bridged)."""
    pts = [p for v in series.values() for p in v if p is not None]
    if not pts:
        return _empty(width, height, title)
    d = Drawing(width, height)
    d.add(String(0, height - 12, title, fontName=FONT + "-Bold", fontSize=10))
    lp = LinePlot()
    rows = -(-len(series) // max(1, min(4, int(width // 115)))) if len(series) > 1 else 0   # legend rows
    lp.x, lp.y, lp.width, lp.height = 50, 36, width - 70, height - 76 - 10 * rows
    segs: list[tuple[int, list]] = []   # (series number, one unbroken run of its points)
    for k, v in enumerate(series.values()):
        run: list = []
        for p in list(v) + [None]:
            if p is None:
                if run:
                    segs.append((k, run))
                run = []
            else:
                run.append(p)
    lp.data = [run for _, run in segs]
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    x0, x1 = x_range or (min(xs), max(xs))
    if x1 <= x0:
        x1 = x0 + 1
    lp.xValueAxis.valueMin, lp.xValueAxis.valueMax = x0, x1
    lo = min(0.0, min(ys))
    lp.yValueAxis.valueMin = lo
    lp.yValueAxis.valueMax = _nice_max(max(ys) * 1.05) if max(ys) > 0 else 1.0
    for ax in (lp.xValueAxis, lp.yValueAxis):
        ax.labels.fontName = FONT
        ax.labels.fontSize = 7
    for i, (k, _) in enumerate(segs):
        lp.lines[i].strokeColor = PALETTE[k % len(PALETTE)]
        lp.lines[i].strokeWidth = 1.2
    if shade is not None:
        sx0 = lp.x + (max(shade[0], x0) - x0) / (x1 - x0) * lp.width
        sx1 = lp.x + (min(shade[1], x1) - x0) / (x1 - x0) * lp.width
        if sx1 > sx0:
            d.add(Rect(sx0, lp.y, sx1 - sx0, lp.height, fillColor=colors.Color(1, 0.85, 0.85),
                       strokeColor=None))
    d.add(lp)
    d.add(Line(lp.x, lp.y, lp.x + lp.width, lp.y, strokeColor=colors.black, strokeWidth=0.5))
    d.add(String(lp.x + lp.width / 2, 6, x_unit, fontName=FONT, fontSize=7, textAnchor="middle"))
    d.add(_vlabel(10, lp.y + lp.height / 2, y_unit))
    if len(series) > 1:
        _legend(d, list(series), width, height - 22)
    return d


def split_bar(parts: Sequence[tuple[str, float]], *, title: str, unit: str, width: float = 460,
              height: float = 130) -> Drawing:
    """Where the paid hours went: one bar as long as the paid total, cut into its buckets in order
    (delivered first), with a legend naming each bucket, its value and its share."""
    total = sum(max(float(v), 0.0) for _, v in parts)
    if total <= 0:
        return _empty(width, height, title)
    d = Drawing(width, height)
    d.add(String(0, height - 12, f"{title} ({total:,.2f} {unit} = 100 %)", fontName=FONT + "-Bold", fontSize=10))
    bar_y, bar_h = height - 44, 22
    x = 0.0
    shown = [(lab, max(float(v), 0.0), PALETTE[i % len(PALETTE)]) for i, (lab, v) in enumerate(parts)]
    for lab, v, col in shown:
        w = width * v / total
        if w > 0:
            d.add(Rect(x, bar_y, w, bar_h, fillColor=col, strokeColor=colors.white, strokeWidth=0.3))
            if w > 34:
                d.add(String(x + w / 2, bar_y + 8, f"{100 * v / total:.0f} %", fontName=FONT, fontSize=7,
                             textAnchor="middle", fillColor=colors.white))
        x += w
    # legend: two columns under the bar, every bucket with its hours and share (zero ones too: none hidden)
    col_w, row_h = width / 2, 10
    for i, (lab, v, col) in enumerate(shown):
        cx, cy = (i % 2) * col_w, bar_y - 14 - (i // 2) * row_h
        d.add(Rect(cx, cy, 7, 7, fillColor=col, strokeColor=None))
        d.add(String(cx + 10, cy, f"{lab}: {v:,.2f} {unit} ({100 * v / total:.1f} %)", fontName=FONT,
                     fontSize=7))
    return d


def waterfall(paid: float, delivered: float, losses: Sequence[tuple[str, float]], *, title: str, unit: str,
              fmt=lambda v: f"{v:,.2f}", width: float = 460) -> Drawing:
    """Paid -> delivered -> each loss: one row per step, the paid bar full length, the delivered bar from zero, and
    each loss a floating bar that starts where the previous one ended, so the losses stack from delivered up to
    paid. Every row is labelled with its value in ``unit`` and its share of paid."""
    rows = [("Paid", 0.0, max(float(paid), 0.0)), ("Delivered (real work)", 0.0, max(float(delivered), 0.0))]
    x = max(float(delivered), 0.0)
    for lab, v in losses:
        v = max(float(v), 0.0)
        rows.append((str(lab), x, v))
        x += v
    total = max(float(paid), x, 0.0)
    row_h, top = 15, 22
    height = top + row_h * len(rows) + 14
    if total <= 0:
        return _empty(width, 60, title)
    d = Drawing(width, height)
    d.add(String(0, height - 12, title, fontName=FONT + "-Bold", fontSize=10))
    label_w, value_w = 185, 115
    bar_w = width - label_w - value_w
    for i, (lab, start, v) in enumerate(rows):
        y = height - top - (i + 1) * row_h + 3
        col = PALETTE[0] if i == 0 else PALETTE[2] if i == 1 else PALETTE[3]
        font = FONT + ("-Bold" if i < 2 else "")
        while len(lab) > 1 and stringWidth(lab, font, 7.5) > label_w - 6:   # cut to its column, never past it
            lab = lab[:-4] + "..."
        d.add(String(label_w - 4, y + 2, lab, fontName=font, fontSize=7.5, textAnchor="end"))
        w = bar_w * v / total
        if w > 0:
            d.add(Rect(label_w + bar_w * start / total, y, max(w, 0.5), row_h - 5, fillColor=col, strokeColor=None))
        d.add(String(label_w + bar_w + 4, y + 2, f"{fmt(v)} {unit} ({100 * v / total:.1f} %)"
                     if i else f"{fmt(v)} {unit}", fontName=FONT, fontSize=7.5))
    d.add(Line(label_w, 10, label_w + bar_w, 10, strokeColor=colors.grey, strokeWidth=0.4))
    d.add(String(label_w, 2, "0", fontName=FONT, fontSize=6.5))
    d.add(String(label_w + bar_w, 2, f"{fmt(total)} {unit}"[:28], fontName=FONT, fontSize=6.5, textAnchor="end"))
    return d
