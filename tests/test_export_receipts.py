"""The export over receipts issued by the receipts package itself (its worked example: every bucket, a gap, a
credit): totals equal the issued receipt to the cent on both backends; a gap resolved after the month closed
comes back as a correction in the next month, and the closed month is unchanged."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from ledger import store
from ledger.adjustments import resolution_entry
from ledger.entries import Kind, make_entry
from ledger.receipts import issue_receipt
from ledger.receipts.example import KEY, load_example
from reports.focus import read_focus, validate
from reports.monthly import cents


def export_json(runner, cli, url, month, *extra):
    res = runner.invoke(cli, ["--db", url, "export", "monthly", "--month", month, "--format", "json", "--out", "-",
                              "--quiet", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_export_equals_the_issued_receipt_and_corrections_follow_close(engine, ledger_url, runner, cli, tmp_path):
    info = load_example(engine)
    first = issue_receipt(engine, KEY["job_id"], KEY["run"], cluster=KEY["cluster"]).receipt.body
    month = first["window"]["end"][:7]  # the example crosses a month end: billed where it ends
    j = export_json(runner, cli, ledger_url, month)
    t = j["totals"]
    assert t["runs"] == 1 and j["tenants"][0]["tenant"] == first["job"]["account"]
    assert t["billed"] == cents(first["cost"]["billed_after_adjustments"])
    assert t["billed_before_adjustments"] == cents(first["cost"]["billed_before_adjustments"])
    assert t["adjustment_cost"] == cents(first["cost"]["adjustments"]) < 0  # the example's credit
    assert t["paid"] == pytest.approx(first["gpu_hours"]["paid"], abs=1e-6)
    assert t["unknown"] == pytest.approx(first["gpu_hours"]["unknown"], abs=1e-6)
    assert t["unknown_pending"] + t["unknown_resolved"] == pytest.approx(t["unknown"], abs=1e-6)
    # FOCUS: the usage row bills the receipt before adjustments, the credit is its own row
    out = tmp_path / "f.csv"
    runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", month, "--format", "focus", "--out",
                        str(out), "--quiet"])
    f = read_focus(out)
    assert validate(f) == []
    assert round(sum(float(x) for x in f["BilledCost"]), 2) == cents(first["cost"]["billed_after_adjustments"])
    assert set(f["ChargeCategory"]) == {"Usage", "Credit"}

    # the month closes: the ledger records a fact from the next month
    nxt = (dt.datetime.fromisoformat(month + "-01T00:00:00+00:00") + dt.timedelta(days=40)).replace(day=2)
    store.append(engine, [make_entry(Kind.ALLOCATION_STARTED, nxt, {"account": "other"}, cluster="hpc1",
                                     job_id="9999", run=0)])
    closed_at = j["ledger"]["through_seq"]
    gap = next(c for c in store.iter_entries(engine, kinds=[Kind.UNKNOWN_INTERVAL]) if c.entry_id == info["gap_id"])
    store.append(engine, [resolution_entry(gap, resolution="credit", reason="host engine restart is ours",
                                           by="ops@example.org")])
    res = issue_receipt(engine, KEY["job_id"], KEY["run"], cluster=KEY["cluster"])
    assert res.status == "reissued"
    second = res.receipt.body
    again = export_json(runner, cli, ledger_url, month)
    assert again["totals"] == j["totals"]  # the closed month does not change
    assert export_json(runner, cli, ledger_url, month, "--as-of", str(closed_at)) == j
    corr = export_json(runner, cli, ledger_url, nxt.strftime("%Y-%m"))
    assert corr["totals"]["corrections"] == 1 and corr["totals"]["runs"] == 0
    delta = second["cost"]["billed_after_adjustments"] - first["cost"]["billed_after_adjustments"]
    assert corr["totals"]["billed"] == cents(delta)
    assert corr["corrections"][0]["replaces_hash"] == first["receipt_hash"]
    # the resolved interval is listed with its resolution in the correction month
    assert [u["resolution"] for u in corr["unknown_intervals"]] == ["credit"]
