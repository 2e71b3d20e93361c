"""The export over receipts issued by the receipts package itself (its worked example: every bucket, a gap, a
credit): totals equal the issued receipt to the cent on both backends; a gap resolved after the month closed
comes back as a correction in the next month, and the closed month is unchanged."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from ledger.chain import store
from ledger.chain.adjustments import resolution_entry
from ledger.chain.entries import Kind, make_entry
from ledger.receipts import issue_receipt
from ledger.receipts.example import KEY, load_example
from reports.focus import read_focus, validate
from reports.monthly import cents


def export_json(runner, cli, url, month, *extra):
    res = runner.invoke(cli, ["--db", url, "export", "monthly", "--month", month, "--format", "json", "--out", "-",
                              "--quiet", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _sum(parts: list[dict], key: str) -> float:
    return sum(p["totals"][key] for p in parts)


def test_export_equals_the_issued_receipt_and_corrections_follow_close(engine, ledger_url, runner, cli, tmp_path):
    info = load_example(engine)
    first = issue_receipt(engine, KEY["job_id"], KEY["run"], cluster=KEY["cluster"]).receipt.body
    # the example crosses a month end: billed in both months, in proportion to its seconds in each
    months = [first["window"]["start"][:7], first["window"]["end"][:7]]
    assert months[0] < months[1]
    month = months[1]
    parts = [export_json(runner, cli, ledger_url, m) for m in months]
    j = parts[1]
    for p in parts:
        assert p["totals"]["runs"] == 1 and p["tenants"][0]["tenant"] == first["job"]["account"]
    # the parts sum to the receipt: hours to the nanohour (shown to 6 decimals), money to the cent of each
    # month's rounding
    assert _sum(parts, "billed") == pytest.approx(cents(first["cost"]["billed_after_adjustments"]), abs=0.011)
    assert _sum(parts, "billed_before_adjustments") == pytest.approx(first["cost"]["billed_before_adjustments"],
                                                                     abs=0.011)
    assert _sum(parts, "adjustment_cost") == pytest.approx(first["cost"]["adjustments"], abs=0.011)
    assert _sum(parts, "adjustment_cost") < 0  # the example's credit
    assert _sum(parts, "paid") == pytest.approx(first["gpu_hours"]["paid"], abs=2e-6)
    assert _sum(parts, "unknown") == pytest.approx(first["gpu_hours"]["unknown"], abs=2e-6)
    for p in parts:
        t = p["totals"]
        assert t["unknown_pending"] + t["unknown_resolved"] == pytest.approx(t["unknown"], abs=1e-6)
    # FOCUS: the usage rows bill the receipt before adjustments, the credit is its own row
    billed = 0.0
    for m in months:
        out = tmp_path / f"f-{m}.csv"
        runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", m, "--format", "focus", "--out",
                            str(out), "--quiet"])
        f = read_focus(out)
        assert validate(f) == []
        assert set(f["ChargeCategory"]) == {"Usage", "Credit"}
        billed += sum(float(x) for x in f["BilledCost"])
    assert billed == pytest.approx(cents(first["cost"]["billed_after_adjustments"]), abs=0.011)

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
    # both months' parts changed: one correction each, booked in the month open at the re-issue
    assert corr["totals"]["corrections"] == 2 and corr["totals"]["runs"] == 0
    delta = second["cost"]["billed_after_adjustments"] - first["cost"]["billed_after_adjustments"]
    assert corr["totals"]["billed"] == pytest.approx(cents(delta), abs=0.011)
    assert {c["replaces_hash"] for c in corr["corrections"]} == {first["receipt_hash"]}
    # the resolved interval is listed with its resolution in the correction month
    assert [u["resolution"] for u in corr["unknown_intervals"]] == ["credit"]
