"""FOCUS 1.2 files checked by the FinOps Foundation's own focus-validator (2.2.1, in its own Python >= 3.12
venv, tests/focus_validator.py): an imported imported statement and a month with a run across its end, a
correction and an adjustment; and the InvoiceId scheme. The demo statement is checked in test_demo.py."""

from __future__ import annotations

import datetime as dt
import json


from ledger.chain import store
from reports import focus
from ledger.sim import synthetic_receipts as synthetic
from tests.focus_validator import Unavailable, validate, verdict
from tests.services import unavailable
from tests.test_export_monthly import issue_entry
from tests.test_issue_cli import write_export

UTC = dt.timezone.utc
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def _validated(path):
    try:
        return validate(path)
    except Unavailable as exc:
        unavailable(str(exc))


def test_imported_path_b_statement_passes(tmp_path, runner, cli):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    for args in (["init"], ["import", "prometheus", str(write_export(tmp_path / "export")), "--quiet"],
                 ["issue", "--all", "--quiet"],
                 ["export", "monthly", "--month", "2026-11", "--format", "focus", "--out",
                  str(tmp_path / "nov.focus.csv"), "--quiet"]):
        res = runner.invoke(cli, ["--db", url, *args])
        assert res.exit_code == 0, res.output
    v = _validated(tmp_path / "nov.focus.csv")
    assert v.failed == [], v.summary()


def test_month_with_split_runs_corrections_and_credits_passes(tmp_path, engine, ledger_url, runner, cli):
    long_run = synthetic.receipt(1, tenant="astro", start=NOV + 20 * 86400, hours=20 * 24, n_devices=2)
    late = synthetic.receipt(2, tenant="bio", start=NOV + 3 * 86400, hours=30)
    fixed = dict(late, receipt_hash="sha256:fixed",
                 adjustments=[{"id": "a1", "kind": "credit", "amount": -7.5, "gpu_hours": -3.0, "reason": "gap"}])
    store.append(engine, [issue_entry(late, NOV + 5 * 86400), issue_entry(long_run, DEC + 11 * 86400),
                          issue_entry(fixed, DEC + 12 * 86400)])
    out = tmp_path / "dec.focus.csv"
    res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2026-12", "--format", "focus",
                              "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    df = focus.read_focus(out)
    # charge periods are days inside the billing period (the correction's lies in the month it corrects)
    usage = df[(df.ChargeCategory == "Usage") & df.ChargeClass.isna()]
    assert len(usage) == 10 and (usage.ChargePeriodStart >= usage.BillingPeriodStart).all()
    assert (usage.ChargePeriodEnd <= usage.BillingPeriodEnd).all()
    assert set(df.ChargeClass.dropna()) == {"Correction"} and set(df.InvoiceId) == {"hpc1-2026-12-astro",
                                                                                       "hpc1-2026-12-bio"}
    v = _validated(out)
    assert v.failed == [], v.summary()


def test_invoice_id_scheme_from_the_site_config(tmp_path, engine, ledger_url, runner, cli, monkeypatch):
    store.append(engine, [issue_entry(synthetic.receipt(3, tenant="ästro ops", start=NOV + 86400, hours=2),
                                      NOV + 2 * 86400)])
    cfg = tmp_path / "config.toml"
    cfg.write_text('[focus]\ninvoice_id = "INV/{YYYY}{MM}/{cluster}/{tenant}"\n')
    monkeypatch.setenv("IPLEDGER_CONFIG", str(cfg))
    res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2026-11", "--format", "focus",
                              "--out", str(tmp_path / "f.csv"), "--quiet"])
    assert res.exit_code == 0, res.output
    ids = set(focus.read_focus(tmp_path / "f.csv").InvoiceId)
    assert ids == {"INV/202611/hpc1/%C3%A4stro%20ops"} and all(i.isascii() for i in ids)
    cfg.write_text('[focus]\ninvoice_id = "{cluster}-{month}"\n')
    res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2026-11", "--format", "focus",
                              "--out", str(tmp_path / "g.csv"), "--quiet"])
    assert res.exit_code != 0 and "focus.invoice_id: unknown field {month}" in res.output
    assert str(cfg) in res.output and res.output.strip().count("\n") == 0


def test_verdict_excuses_only_alternatives_of_a_passed_or():
    model = {"A-C-000-C": {"ValidationCriteria": {"Requirement": {"CheckFunction": "OR", "Items": [
        {"CheckFunction": "CheckModelRule", "ModelRuleId": "A-C-001-C"},
        {"CheckFunction": "CheckModelRule", "ModelRuleId": "A-C-002-C"}]}}},
             "B-C-000-C": {"ValidationCriteria": {"Requirement": {"CheckFunction": "OR", "Items": [
                 {"CheckFunction": "CheckModelRule", "ModelRuleId": "B-C-001-C"}]}}}}
    report = "\n".join(["✅ A-C-000-C: PASS  (x)", "❌ A-C-001-C: FAIL  (violations=3)", "✅ A-C-002-C: PASS",
                        "❌ B-C-000-C: FAIL", "❌ B-C-001-C: FAIL", "⏭️ C-D-001-M: SKIPPED  (y)",
                        "- A-C-001-C: violations=3; detail line, not a status"])
    v = verdict(report, model)
    assert v.alternatives == ["A-C-001-C"] and v.failed == ["B-C-000-C", "B-C-001-C"] and v.skipped == 1
    assert json.dumps(v.passed) == '["A-C-000-C", "A-C-002-C"]'
