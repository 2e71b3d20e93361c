"""The written analysis of a telemetry export renders (pdftoppm: non-empty pages), pdftotext finds the account's totals, and
render() survives an analysis that has only the Findings JSON core, or less."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from reports import analysis_pdf
from ledger.sim import synthetic_receipts as synthetic
from tests.services import unavailable
from reports.pdf_statement import fmt_hours


def pdf_text(path: Path) -> str:
    if not shutil.which("pdftotext"):
        unavailable("poppler-utils not installed (tests/setup-system.sh installs it)")
    return subprocess.run(["pdftotext", "-layout", str(path), "-"], check=True, capture_output=True,
                          text=True).stdout


def png_pages(path: Path, out: Path) -> list[Path]:
    if not shutil.which("pdftoppm"):
        unavailable("poppler-utils not installed (tests/setup-system.sh installs it)")
    subprocess.run(["pdftoppm", "-png", "-r", "40", str(path), str(out / "page")], check=True)
    return sorted(out.glob("page*.png"))


def non_blank(png: Path) -> bool:
    """A page with something drawn on it: more than one distinct byte pattern in its pixels."""
    import zlib

    data = png.read_bytes()
    # IDAT chunks hold the (compressed) pixels; a blank white page compresses to almost nothing
    idat = b"".join(data[i + 8:i + 8 + int.from_bytes(data[i:i + 4], "big")]
                    for i in range(8, len(data) - 8) if data[i + 4:i + 8] == b"IDAT")
    raw = zlib.decompress(idat)
    return len(set(raw)) > 2


def test_analysis_pdf_renders_and_states_the_account(tmp_path):
    a = synthetic.analysis()
    out = analysis_pdf.render(a, tmp_path / "analysis.pdf")
    pages = png_pages(out, tmp_path)
    assert len(pages) >= 3 and all(non_blank(p) for p in pages)
    text = pdf_text(out)
    acct = a["account"]
    for v in (acct["paid"], acct["delivered"], acct["paid"] - acct["delivered"]):
        assert fmt_hours(v) in text
    for f in a["findings"]:
        assert fmt_hours(f["gpu_hours"]) in text
    for needle in ("What was measured", "scrape_missing", "Recommendations", "Method and its limits",
                   "thermal_throttle", "ipledger never runs them", "before, during, after"):
        assert needle in text, needle


@pytest.mark.parametrize("analysis", [
    {"findings": [], "account": {}},
    {},
    {"findings": [{"id": "x", "kind": "xid", "summary": "Xid 79 <fell off the bus> & more", "gpu_hours": "n/a",
                   "evidence": [{"signal": "power", "points": [["2026-11-10T00:00:00Z", "N/A"], [1.7e12, 300]]}],
                   "scope": None}],
     "account": {"paid": 10, "delivered": 4, "by_cause": {"mystery": 6}},
     "series": {"x": {"temp": [[0, 1]]}}, "devices": [{"uuid": None}], "coverage": {"gaps": [{}]}},
])
def test_render_is_robust_to_missing_or_odd_parts(tmp_path, analysis):
    out = analysis_pdf.render(analysis, tmp_path / "a.pdf")
    assert out.stat().st_size > 1000
    assert "written analysis" in pdf_text(out).lower() or "GPU-hours" in pdf_text(out)


def test_series_fallback_cuts_the_device_timeline_to_the_finding(tmp_path):
    a = synthetic.analysis()
    f = a["findings"][0]
    pts = f["evidence"][0]["points"]
    f["evidence"] = []
    a["series"] = {f["scope"]["device_uuid"]: {"sm_clock": [[t - 86400 * 3, v] for t, v in pts] + pts}}
    lines, _, _ = analysis_pdf._finding_series(f, a["series"])
    s0, s1 = analysis_pdf._epoch(f["start"]), analysis_pdf._epoch(f["end"])
    assert lines["sm_clock"] and all(s0 - (s1 - s0) <= t <= s1 + (s1 - s0) for t, _ in lines["sm_clock"])


def test_agents_shaped_context_meta_daily_and_buckets(tmp_path):
    a = synthetic.analysis()
    for k in ("sources", "devices", "coverage"):
        a.pop(k)
    a["meta"] = {"start": "2026-11-10T00:00:00Z", "end": "2026-11-11T00:00:00Z", "devices": 4, "samples": 5760,
                 "cadence_s": 60, "currency": "EUR"}
    a["daily"] = [{"day": "2026-11-10", "tenant": t, "paid": 48.0, "delivered": 40.0} for t in ("a", "b")]
    a["account"]["buckets"] = {"delivered": 77.4, "throttled": {"thermal": 1.1, "power_cap": 0.0},
                               "underutilized": 9.5, "starved": 0.8, "idle_held": 6.0, "unknown": 1.2}
    out = analysis_pdf.render(a, tmp_path / "b.pdf")
    text = pdf_text(out)
    assert "4 GPU(s) measured" in text and "5,760" in text
    assert "accounting identity" in text and fmt_hours(77.4) in text
    assert "Paid vs delivered per day" in text


def test_written_analysis_of_a_real_export_lists_each_step_once_in_full(tmp_path):
    """analyze --pdf on an export: each recommendation once and whole, its hours over the period seen, the
    method's version, the devices' SKU, the account's lines adding up to the lost total, the export analysis's own limits."""
    import json
    import re

    from click.testing import CliRunner

    from bench.scenario import generate, write_export
    from ledger.cli.main import cli

    path = write_export(generate(2, nodes=8, hours=24.0, cadence=60.0), tmp_path / "export.json")
    r = CliRunner().invoke(cli, ["analyze", str(path), "--json", "--pdf", str(tmp_path / "a.pdf")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[:r.output.rindex("}") + 1])
    text = pdf_text(tmp_path / "a.pdf")
    flat = " ".join(text.split())
    recs = out["recommendations"]
    assert recs
    section = flat[flat.index("Recommendations, priced in GPU-hours"):flat.index("Method and its limits")]
    for rec in recs:
        words = rec["title"].split()
        # once (its opening), and whole (its closing words; the layout interleaves the other columns)
        assert section.count(" ".join(words[:3])) == 1, rec["title"]
        assert " ".join(words[-3:]) in section, rec["title"]
    assert "GPU-h recoverable" in text and "(over that period)" in text   # never a weekly extrapolation
    assert "/ week" not in text and "GPU-h / day" not in text
    assert re.search(r"version \d+\.\d+", flat) and "version -." not in flat
    assert "H100" in text
    acct = out["account"]
    assert sum(acct["by_cause"].values()) == pytest.approx(acct["paid"] - acct["delivered"], abs=1e-3)
    assert fmt_hours(sum(acct["by_cause"].values())) in text
    assert "export's device list" in flat


def test_report_analysis_of_a_ledger_period(tmp_path):
    """`ipledger report analysis --period` writes the analysis of a ledger period, in the ledger's own words."""
    import json

    from click.testing import CliRunner

    from ledger.cli.main import cli
    from tests.test_agents import small_hall

    hall, _ = small_hall()
    out = tmp_path / "w45.pdf"
    r = CliRunner().invoke(cli, ["--db", f"sqlite:///{hall.db_path}", "report", "analysis", "--period", "2026-11-04",
                                 "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["meta"]["start"] == "2026-11-04T00:00:00Z" and doc["meta"]["end"] == "2026-11-05T00:00:00Z"
    assert all(f["start"] < "2026-11-05" and f["end"] > "2026-11-04" for f in doc["findings"])
    acct = doc["account"]
    assert sum(acct["by_cause"].values()) == pytest.approx(acct["paid"] - acct["delivered"], abs=1e-3)
    flat = " ".join(pdf_text(out).split())
    assert "2026-11-04" in flat and "scheduler's allocation recorded in the ledger" in flat
    assert "export's device list" not in flat
    assert fmt_hours(sum(acct["by_cause"].values())) in flat
    # read from device-hours by default; --samples (every sample) gives the same findings, samples and account
    r = CliRunner().invoke(cli, ["--db", f"sqlite:///{hall.db_path}", "report", "analysis", "--period", "2026-11-04",
                                 "--out", str(tmp_path / "full.pdf"), "--json", "--samples"])
    assert r.exit_code == 0, r.output
    full = json.loads(r.output)
    assert [f["id"] for f in doc["findings"]] == [f["id"] for f in full["findings"]]
    assert doc["meta"]["samples"] == full["meta"]["samples"] > 0
    for col in ("paid", "delivered", "lost"):
        assert doc["account"][col] == pytest.approx(full["account"][col], abs=1e-3)


# --- the first page, the margins, rack scope and the recommendations' period -------------------------------------

def words_outside_margins(path: Path, left: float, right: float, top: float, bottom: float) -> list[str]:
    """Every word pdftotext -bbox-layout finds outside the page's margins (points from each edge), as
    'page N: word (x0..x1, y0..y1)'."""
    import xml.etree.ElementTree as ET

    if not shutil.which("pdftotext"):
        unavailable("poppler-utils not installed (tests/setup-system.sh installs it)")
    xml = subprocess.run(["pdftotext", "-bbox-layout", str(path), "-"], check=True, capture_output=True,
                         text=True).stdout
    root = ET.fromstring(xml)
    out = []
    for n, page in enumerate((e for e in root.iter() if e.tag.endswith("page")), start=1):
        w, h = float(page.get("width")), float(page.get("height"))
        for word in (e for e in page.iter() if e.tag.endswith("word")):
            x0, x1 = float(word.get("xMin")), float(word.get("xMax"))
            y0, y1 = float(word.get("yMin")), float(word.get("yMax"))
            if x0 < left - 0.5 or x1 > w - right + 0.5 or y0 < top - 0.5 or y1 > h - bottom + 0.5:
                out.append(f"page {n}: {word.text} ({x0:.0f}..{x1:.0f}, {y0:.0f}..{y1:.0f})")
    return out


def wide_analysis(n_racks: int = 12, nodes_per_rack: int = 3) -> dict:
    """An analysis as wide as a prospect's can get: long device, node and rack names, many findings on many racks
    (one kind on every node of a rack), long signal names in the evidence, many sources and gaps."""
    a = synthetic.analysis()
    t0 = analysis_pdf._epoch(a["coverage"]["start"])
    long_node = "compute-node-with-a-very-long-hostname-{:03d}.datacenter-eu-west-interconnect.example.org"
    devices, findings, gaps = [], [], []
    for r in range(n_racks):
        rack = f"rack-row{r:02d}-aisle-B-cold-containment-{r:03d}"
        for k in range(nodes_per_rack):
            node = long_node.format(r * nodes_per_rack + k)
            uuid = f"GPU-{r:04x}{k:04x}-aaaa-bbbb-cccc-{'d' * 40}"
            devices.append({"uuid": uuid, "node": node, "index": k, "sku": "NVIDIA H100 80GB HBM3 SXM5 (long name)",
                            "samples": 1440, "coverage": 0.99})
            gaps.append({"device": uuid, "start": t0 + 3600 * k, "end": t0 + 3600 * (k + 1),
                         "cause": "collector_down_because_of_a_very_long_reason_string_without_spaces"})
            findings.append({
                "id": f"f-{r}-{k}", "agent": "attribution", "kind": "power_cap", "cause": "power_cap",
                "level": "device", "scope": {"cluster": "a-cluster-with-a-long-name", "rack": rack, "node": node,
                                             "device_uuid": uuid, "job_id": f"{9_000_000 + r}", "tenant": "tenant-x"},
                "start": t0 + 3600 * (2 + k), "end": t0 + 3600 * (9 + k), "gpu_hours": 0.5 + r + k / 10,
                "cost": 1.0, "confidence": 0.9,
                "summary": f"GPU {uuid} on {node} was held at a 310 W power cap " + "for a long while " * 8,
                "evidence": [{"signal": "share_of_loaded_samples_with_power_cap_bit_0x4_set_by_the_driver",
                              "unit": "fraction_of_samples_under_load", "before": 0.0, "during": 1.0, "after": 0.0},
                             "a free-text note " * 30]})
    a["devices"] = devices
    a["coverage"]["gaps"] = gaps
    a["findings"] = findings + a["findings"]
    a["sources"] = [{"kind": "dmon", "name": f"dmon-{long_node.format(i)}-capture-2026-11-10.txt", "samples": 1440,
                     "sha256": "ab" * 32} for i in range(len(devices))]
    a["recommendations"] = [{"title": f"Check why node {f['scope']['node']} runs with a lowered power limit "
                                      "and restore the default limit " * 2, "gpu_hours": 99.0,
                             "gpu_hours_per_week": 99.0, "reversible": True, "finding_ids": [f["id"]],
                             "command": f"ssh {f['scope']['node']} sudo nvidia-smi -pl <power.default_limit>"}
                            for f in findings] + a["recommendations"]
    return a


def test_every_page_keeps_its_text_inside_the_margins(tmp_path):
    """A wide analysis (36 devices with long names, 12 racks, long signal names, sources, gaps, commands):
    every word on every page lies inside the margins; the footer is the one thing in the bottom margin."""
    out = analysis_pdf.render(wide_analysis(), tmp_path / "wide.pdf")
    outside = words_outside_margins(out, left=analysis_pdf.MARGIN_LEFT, right=analysis_pdf.MARGIN_RIGHT,
                                    top=analysis_pdf.MARGIN_TOP, bottom=8 * 2.8346)
    assert not outside, outside[:10]
    text = " ".join(pdf_text(out).split())
    assert "rack-row11-aisle-B-cold-containment-011" in text


def test_the_margin_check_sees_a_table_that_runs_past_the_margin(tmp_path):
    """The check above can fail: an unfitted table (pdf_statement.table, one long cell) is caught."""
    from reportlab.lib.pagesizes import A4
    from reportlab.platypus import SimpleDocTemplate

    from reports.pdf_statement import table

    path = tmp_path / "over.pdf"
    doc = SimpleDocTemplate(str(path), pagesize=A4, leftMargin=analysis_pdf.MARGIN_LEFT,
                            rightMargin=analysis_pdf.MARGIN_RIGHT)
    doc.build([table(["device", "node"], [("GPU-" + "x" * 60, "node " * 40)])])
    assert words_outside_margins(path, analysis_pdf.MARGIN_LEFT, analysis_pdf.MARGIN_RIGHT, 0, 0)


def _page_one(path: Path) -> str:
    return " ".join(subprocess.run(["pdftotext", "-layout", "-f", "1", "-l", "1", str(path), "-"], check=True,
                                   capture_output=True, text=True).stdout.split())


def test_first_page_follows_paid_to_delivered_to_each_loss(tmp_path):
    """Page one: paid, delivered and every loss line of the account, largest first, in GPU-hours and saying so
    when no price is given; at a stated rate every figure is hours x rate in that currency."""
    a = synthetic.analysis()
    pdf_text(analysis_pdf.render(a, tmp_path / "h.pdf"))   # skips without poppler
    one = _page_one(tmp_path / "h.pdf")
    acct = a["account"]
    assert "no price per GPU-hour was given" in one and "in GPU-hours" in one
    assert f"Of {fmt_hours(acct['paid'])} paid GPU-hours, {fmt_hours(acct['delivered'])}" in one
    lines = sorted(((analysis_pdf.cause_label(k), v) for k, v in acct["by_cause"].items() if v > 0),
                   key=lambda kv: -kv[1])
    at = [one.index(f"{lab} ") for lab, _ in lines]
    assert at == sorted(at), "loss rows largest first"
    for lab, v in lines:
        assert f"{fmt_hours(v)} GPU-h" in one, lab
    assert "EUR" not in one   # the account's own cost is at no price the prospect stated
    a["rate"] = {"price": 2.49, "currency": "USD"}
    one = _page_one(analysis_pdf.render(a, tmp_path / "r.pdf"))
    assert "stated rate of 2.49 USD per GPU-hour" in one
    from reports.pdf_statement import fmt_money
    for v in [acct["paid"], acct["delivered"]] + [v for _, v in lines]:
        assert f"{fmt_money(v * 2.49)} USD" in one, v
    assert "thermal_throttle" in one or "idle_held" in one   # the largest findings, listed


def test_rack_findings_are_shown_at_rack_scope():
    """One kind on several nodes of one rack is one rack item (hours summed, span the union, members listed);
    a rack with one such node, and findings of another kind, stay as they are; its recommendations become one."""
    a = wide_analysis(n_racks=3)
    fs = [f for f in a["findings"] if f.get("agent") != "recommendation"]
    fs[0] = dict(fs[0], scope=dict(fs[0]["scope"], rack="rack-alone"))   # alone in its rack
    grouped = analysis_pdf.group_racks(fs)
    racks = [g for g in grouped if g.get("level") == "rack"]
    assert len(racks) == 3 and len(grouped) == len(fs) - 2 * 3 + 1 + 0   # rack 0 keeps 2 of 3 nodes: one item
    for g in racks:
        members = [f for f in fs if f["id"] in g["members"]]
        assert len({f["scope"]["node"] for f in members}) == len(g["scope"]["nodes"]) >= 2
        assert g["gpu_hours"] == pytest.approx(sum(f["gpu_hours"] for f in members))
        assert analysis_pdf._epoch(g["start"]) == min(analysis_pdf._epoch(f["start"]) for f in members)
    assert any(f["scope"].get("rack") == "rack-alone" for f in grouped)
    recs = analysis_pdf.recommendations_seen(analysis_pdf._recommendations(a), grouped)
    power = [r for r in recs if "lowered power limit" in r["title"]]
    assert len(power) == 3 + 1 and sum(r["title"].startswith("Rack ") for r in power) == 3
    # one step per rack, but every node's command is kept
    assert sorted(c for r in power for c in r["commands"]) == sorted(r["command"] for r in a["recommendations"]
                                                                     if "lowered power limit" in r["title"])


def test_recommendation_hours_are_over_the_period_seen():
    """A recommendation recovers what its findings cost over the span they were seen, never the weekly figure
    the agents extrapolate; without a finding behind it and only a weekly figure it shows none."""
    f = {"id": "f1", "kind": "sibling_divergence", "start": "2026-11-02T11:00:00Z", "end": "2026-11-03T00:00:00Z",
         "gpu_hours": 0.75, "scope": {"node": "n1"}}
    recs = analysis_pdf.recommendations_seen(
        [{"title": "Drain n1", "gpu_hours": 9.73, "gpu_hours_per_week": 9.73, "finding_ids": ["f1"]},
         {"title": "Something weekly", "gpu_hours": 5.0, "gpu_hours_per_week": 5.0, "finding_ids": ["gone"]}], [f])
    by = {r["title"]: r for r in recs}
    assert by["Drain n1"]["seen_hours"] == 0.75
    assert (by["Drain n1"]["seen_to"] - by["Drain n1"]["seen_from"]) / 3600 == 13.0
    assert by["Something weekly"]["seen_hours"] is None


def test_analyze_pdf_of_a_real_export_priced_and_over_the_period_seen(tmp_path):
    """analyze --pdf --rate on an export: page one priced at the rate; each recommendation's recoverable hours are
    its findings' hours over the period they were seen (that period printed), in the JSON as in the PDF, also for
    a cause still present at the end of the data (never extrapolated to a week); the largest findings each carry a timeline from the samples."""
    import json

    from click.testing import CliRunner

    from bench.scenario import generate, write_export
    from ledger.cli.main import cli
    from reports.pdf_statement import fmt_money

    path = write_export(generate(2, nodes=8, hours=24.0, cadence=60.0), tmp_path / "export.json")
    r = CliRunner().invoke(cli, ["analyze", str(path), "--json", "--pdf", str(tmp_path / "a.pdf"),
                                 "--rate", "2.49", "--currency", "usd"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[:r.output.rindex("}") + 1])
    assert out["rate"] == {"price": 2.49, "currency": "USD"}
    acct = out["account"]
    one = _page_one(tmp_path / "a.pdf")
    assert f"{fmt_money(acct['paid'] * 2.49)} USD" in one and "stated rate of 2.49 USD" in one
    flat = " ".join(pdf_text(tmp_path / "a.pdf").split())
    section = flat[flat.index("Recommendations, priced in GPU-hours"):flat.index("Method and its limits")]
    by_id = {f["id"]: f for f in out["findings"]}
    assert out["recommendations"]
    still_present = 0
    for rec in out["recommendations"]:
        based = [by_id[i] for i in rec["finding_ids"] if i in by_id]
        seen = sum(f["gpu_hours"] for f in based)
        assert fmt_hours(seen) in section, rec["title"]
        # the agents' own figure is the hours over the period seen, not a weekly rate carried past the data
        assert "gpu_hours_per_week" not in rec and abs(rec["gpu_hours"] - seen) <= 0.002, rec["title"]
        s0 = min(analysis_pdf._epoch(f["start"]) for f in based)
        s1 = max(analysis_pdf._epoch(f["end"]) for f in based)
        assert (analysis_pdf._epoch(rec["start"]), analysis_pdf._epoch(rec["end"])) == (s0, s1), rec["title"]
        assert abs(rec["seen_hours"] - (s1 - s0) / 3600) <= 0.001, rec["title"]
        assert f"({fmt_hours((s1 - s0) / 3600)} h)" in section, rec["title"]
        still_present += s1 >= analysis_pdf._epoch(out["meta"]["end"]) - 3 * 60.0
    assert still_present, "the scenario has a cause still present at the end (once extrapolated to a week)"
    top = sorted((f for f in out["findings"] if f["agent"] != "recommendation"), key=lambda f: -f["gpu_hours"])[:5]
    for f in top:
        sig = out["series"][f["id"]]
        s0, s1 = analysis_pdf._epoch(f["start"]), analysis_pdf._epoch(f["end"])
        pad = max(s1 - s0, 600.0)
        assert sig and all(s0 - pad <= t <= s1 + pad for pts in sig.values() for t, _ in pts), f["id"]
    assert "sm_active (fraction): before, during, after" in flat
    for i, f in enumerate(top[:4]):   # the largest findings' timelines are on the first page too
        assert f"{i + 1}. {f['kind']}: " in one, f["id"]


def test_analyze_currency_needs_a_rate(tmp_path):
    from click.testing import CliRunner

    from ledger.cli.main import cli

    r = CliRunner().invoke(cli, ["analyze", str(tmp_path / "x.json"), "--currency", "USD"])
    assert r.exit_code != 0 and "--rate" in r.output
    for bad in (["--rate", "inf"], ["--rate", "-1"], ["--rate", "2", "--currency", "U$D"]):
        r = CliRunner().invoke(cli, ["analyze", str(tmp_path / "x.json"), *bad])
        assert r.exit_code != 0 and ("--rate" in r.output or "--currency" in r.output), bad


from hypothesis import given, settings, strategies as st  # noqa: E402

_cell_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200)


@settings(max_examples=200, deadline=None)
@given(text=_cell_text, width=st.floats(min_value=12.0, max_value=400.0))
def test_wrapped_cells_fit_their_column_and_keep_every_character(text, width):
    """Every line of a wrapped cell is no wider than its column, and the lines hold the text's characters in
    order (only the spaces the lines break at are dropped)."""
    from reportlab.pdfbase.pdfmetrics import stringWidth

    wrapped = analysis_pdf._wrap_to(text, width)
    for line in wrapped.split("\n"):
        assert stringWidth(line, analysis_pdf.CELL_FONT, analysis_pdf.CELL_SIZE) <= width + 0.01 or len(line) == 1
    assert wrapped.replace("\n", "").replace(" ", "") == text.replace(" ", "")


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.lists(_cell_text, min_size=4, max_size=4), min_size=1, max_size=6),
       numeric=st.sets(st.integers(0, 3), max_size=2))
def test_fitted_columns_never_exceed_the_frame_unless_numbers_alone_do(rows, numeric):
    """column_widths: the columns sum to at most the frame, unless the numeric columns (never wrapped) and a
    30-point floor for the others are wider by themselves; a table that fits keeps its natural widths."""
    from reportlab.pdfbase.pdfmetrics import stringWidth

    head = ["a", "b", "c", "d"]
    widths = analysis_pdf.column_widths(head, rows, numeric)
    nat = [max([stringWidth(h, "Helvetica-Bold", 7.5) for h in [head[i]]] +
               [stringWidth(ln, "Helvetica", 7.5) for r in rows for ln in r[i].split("\n")]) + analysis_pdf.CELL_PAD
           for i in range(4)]
    if sum(nat) <= analysis_pdf.FRAME_WIDTH:
        assert widths == pytest.approx(nat)
    else:
        floor = sum(nat[i] for i in numeric) + analysis_pdf.MIN_COLUMN * (4 - len(numeric))
        assert sum(widths) <= max(analysis_pdf.FRAME_WIDTH, floor) + 1e-6
