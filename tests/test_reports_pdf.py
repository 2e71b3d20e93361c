"""The monthly statement PDF renders (pdftoppm: non-empty pages) and pdftotext finds the same totals as the JSON
export; an empty month's PDF says it is empty."""

from __future__ import annotations

import json

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.sim import synthetic_receipts as synthetic
from reports.pdf_statement import fmt_hours, fmt_money
from tests.test_export_monthly import NOV, issue_entry, nov_receipts
from tests.test_analysis_pdf import non_blank, pdf_text, png_pages


def _pdf_and_json(receipts, sqlite_url, runner, cli, tmp_path):  # noqa: ANN001, ANN202
    """Issue ``receipts`` in November, then export the month as PDF (a file) and JSON (parsed)."""
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 29 * 86400) for r in receipts])
    eng.dispose()
    pdf = tmp_path / "nov.pdf"
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "pdf",
                              "--out", str(pdf), "--quiet"])
    assert res.exit_code == 0, res.output
    return pdf, json.loads(runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11",
                                               "--format", "json", "--out", "-", "--quiet"]).output)


def test_statement_pdf_renders_with_the_json_totals(sqlite_url, runner, cli, tmp_path):
    pdf, j = _pdf_and_json(nov_receipts(30), sqlite_url, runner, cli, tmp_path)
    pages = png_pages(pdf, tmp_path)
    assert len(pages) >= 3 and all(non_blank(p) for p in pages)
    text = pdf_text(pdf)
    t = j["totals"]
    for v in (t["paid"], t["delivered"], t["lost"], t["unknown_resolved"], t["unknown_pending"]):
        assert fmt_hours(v) in text, v
    for v in (t["cost_paid"], t["billed"], t["adjustment_cost"]):
        assert fmt_money(v) in text, v
    for tenant in j["tenants"]:
        assert fmt_money(tenant["billed"]) in text and fmt_hours(tenant["paid"]) in text
    assert j["ledger"]["head_hash"] in text.replace("\n", "")
    for needle in ("Paid vs delivered per tenant", "losses by cause", "Hour-of-day profile", "Top runs by lost",
                   "Unknown intervals", "Adjustments", "How to verify", "GPU-hours", "EUR"):
        assert needle in text, needle


def test_empty_month_pdf_says_so(sqlite_url, runner, cli, tmp_path):
    pdf = tmp_path / "empty.pdf"
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2027-01", "--format", "pdf",
                              "--out", str(pdf), "--quiet"])
    assert res.exit_code == 0, res.output
    pages = png_pages(pdf, tmp_path)
    assert len(pages) == 1 and non_blank(pages[0])
    assert "This statement is empty" in pdf_text(pdf)


def test_write_statement_for_the_demo(sqlite_url, tmp_path):
    from reports.export import write_statement

    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 29 * 86400) for r in synthetic.receipts(8, "2026-11")])
    paths = write_statement(eng, "2026-11", tmp_path / "out")
    eng.dispose()
    assert sorted(p.name for p in paths) == sorted(["statement-2026-11.csv", "statement-2026-11.focus.csv",
                                                    "statement-2026-11.json", "statement-2026-11.pdf"])
    assert all(p.stat().st_size > 0 for p in paths)
    assert json.loads((tmp_path / "out" / "statement-2026-11.json").read_text())["totals"]["runs"] == 8


def test_first_page_shows_where_the_money_went_then_a_page_per_tenant(sqlite_url, runner, cli, tmp_path):
    rs = [synthetic.receipt(i, tenant=t, start=NOV + i * 3600, hours=5, rate=2.0,
                            shares={"idle_held": 0.1 * (i % 3), "thermal": 0.05 * (i % 2)})
          for i, t in enumerate(["astro", "bio", "astro", "climate", "bio", "astro"])]
    pdf, j = _pdf_and_json(rs, sqlite_url, runner, cli, tmp_path)
    pages = pdf_text(pdf).split("\f")
    first = pages[0]
    t = j["totals"]
    # the paid -> delivered split: the paid total, delivered and every nonzero bucket with its hours
    assert f"{fmt_hours(t['paid'])} GPU-hours = 100 %" in first
    assert f"delivered: {fmt_hours(t['delivered'])} GPU-hours" in first
    assert f"idle held: {fmt_hours(t['idle_held'])} GPU-hours" in first
    assert f"throttled: thermal: {fmt_hours(t['throttled_thermal'])} GPU-hours" in first
    # cost by tenant, and the top losses named by their main cause
    for tenant in j["tenants"]:
        assert tenant["tenant"] in first and fmt_money(tenant["billed"]) in first
    assert "Top losses and their causes" in first and "idle held" in first.split("Top losses")[1]
    # then one page per tenant with its own split
    for tenant in j["tenants"]:
        page = next(p for p in pages if f"Tenant {tenant['tenant']}" in p)
        assert f"{fmt_hours(tenant['paid'])} GPU-hours = 100 %" in page


def test_statement_pdf_names_the_signed_tree_head_and_how_to_check_it(sqlite_url, runner, cli, tmp_path):
    from ledger.chain import heads

    def export() -> str:
        pdf = tmp_path / "nov.pdf"
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "pdf",
                                  "--out", str(pdf), "--quiet"])
        assert res.exit_code == 0, res.output
        return " ".join(pdf_text(pdf).split())

    rs = nov_receipts(6)
    # receipt i is entry i + 1 (i >= 4: i + 3, after the first export's record, 5, and the head, 6), cut at
    # the entries before it
    for i, r in enumerate(rs):
        r["ledger"]["through_seq"] = i + 2 * (i >= 4)
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 29 * 86400) for r in rs[:4]])
    assert "None is signed: no signed tree head is recorded in the ledger through seq 4" in export()
    heads.keygen(tmp_path / "log.key")
    head = heads.checkpoint(eng, heads.load_private_key(tmp_path / "log.key"))
    store.append(eng, [issue_entry(r, NOV + 29 * 86400) for r in rs[4:]])
    text = export()
    # 4 receipts and the first export's statement_exported record (entry 5); the head's own entry is 6
    assert f"tree size {head['tree_size']:,}" in text and head["tree_size"] == 5
    assert head["root_hash"] in text.replace(" ", "") and head["log_id"] in text
    assert "It covers 4 of this statement's 6 receipt(s)" in text
    for cmd in ("ipledger receipt JOB --proof --head head.json --out b.json",
                "ipledger-verify b.json --pubkey KEY.pub"):
        assert cmd in text, cmd
    heads.checkpoint(eng, heads.load_private_key(tmp_path / "log.key"))
    eng.dispose()
    text = export()
    assert "tree size 9" in text and "It covers all 6 receipt(s) of this statement" in text  # + 2nd export's record
