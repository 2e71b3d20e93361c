"""The written analysis of a telemetry export renders (pdftoppm: non-empty pages), pdftotext finds the account's totals, and
render() survives an analysis that has only the Findings JSON core, or less."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from reports import analysis_pdf, synthetic
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
    """analyze --pdf on an export: each recommendation once and whole, weekly figures under a weekly heading, the
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
    assert "GPU-h / week recoverable" in text and "GPU-h / day" not in text
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
