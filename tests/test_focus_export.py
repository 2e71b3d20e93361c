"""FOCUS 1.1 export: every mandatory column present with its type, allowed values, corrections and credits
classed as FOCUS says, and BilledCost per sub-account (tenant) equal to that tenant's receipts."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict

import pandas as pd
import pytest

from reports import focus, monthly
from ledger.sim import synthetic_receipts as synthetic
from reports.export import statement_from_issues, write
from reports.issued import Issue, IssuedSet

NOV = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp()
OCT = dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc).timestamp()


def statement(tmp_path):
    rs = list(synthetic.receipts(24, "2026-11", seed=5))
    rs[1]["adjustments"] = [{"id": "c1", "kind": "credit", "amount": -7.25, "gpu_hours": -3.0, "reason": "gap"}]
    rs[2]["adjustments"] = [{"id": "d1", "kind": "debit", "amount": 1.5, "gpu_hours": 0.5, "reason": "late end"}]
    old = synthetic.receipt(9, tenant="astro", start=OCT + 86400, hours=5, rate=2.0)
    new = json.loads(json.dumps(old))
    new["receipt_hash"] = "sha256:fixed"
    new["gpu_hours"]["paid"] -= 1.0
    new["gpu_hours"]["delivered"] -= 1.0
    new["cost"]["paid"] -= 2.0
    issues = [Issue(1, OCT + 2 * 86400, old)] + [Issue(i + 2, NOV + 29 * 86400, r) for i, r in enumerate(rs)]
    issues.append(Issue(99, NOV + 5 * 86400, new))
    st = statement_from_issues(IssuedSet(issues, 99, "f" * 64), "2026-11")
    path = tmp_path / "nov.focus.csv"
    write(st, "focus", path)
    return rs, old, new, st, focus.read_focus(path)


def test_every_mandatory_column_and_type_matches_focus_1_1(tmp_path):
    _, _, _, _, df = statement(tmp_path)
    names = {c.name for c in focus.FOCUS_COLUMNS}
    mandatory = {c.name for c in focus.FOCUS_COLUMNS if c.level == "Mandatory"}
    assert mandatory <= set(df.columns)
    assert {"BilledCost", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ConsumedQuantity", "ConsumedUnit",
            "PricingQuantity", "PricingUnit", "ResourceId", "ResourceType", "SkuId", "SubAccountId",
            "SubAccountName", "Tags", "ContractedCost", "ListCost", "EffectiveCost"} <= set(df.columns)
    for c in df.columns:  # every other column is ipledger's own, x_-prefixed
        assert c in names or c.startswith("x_")
    assert focus.validate(df) == []  # every row read back as text from the CSV
    for c in focus.FOCUS_COLUMNS:
        vals = df[c.name].dropna()
        if c.type == "Decimal":
            assert all(focus._is_number(v) for v in vals), c.name
        if c.type == "DateTime":
            assert all(focus._DATETIME_RE.match(v) for v in vals), c.name
        if not c.nullable:
            assert df[c.name].notna().all(), c.name
    assert set(df["ConsumedUnit"].dropna()) == {"GPU-Hours"} and set(df["BillingCurrency"]) == {"EUR"}
    assert set(df["BillingPeriodStart"]) == {"2026-11-01T00:00:00Z"}
    assert set(df["BillingPeriodEnd"]) == {"2026-12-01T00:00:00Z"}


def test_charge_categories_credits_and_corrections(tmp_path):
    _, old, new, _, df = statement(tmp_path)
    credit = df[df["x_AdjustmentId"] == "c1"].iloc[0]
    assert credit["ChargeCategory"] == "Credit" and float(credit["BilledCost"]) == -7.25
    assert pd.isna(credit["ConsumedQuantity"])
    assert df[df["x_AdjustmentId"] == "d1"].iloc[0]["ChargeCategory"] == "Adjustment"
    corr = df[df["ChargeClass"] == "Correction"]
    assert len(corr) == 1
    row = corr.iloc[0]
    assert row["ChargeCategory"] == "Usage" and row["x_JobId"] == "9"
    assert float(row["BilledCost"]) == pytest.approx(-2.0) and float(row["ConsumedQuantity"]) == pytest.approx(-1.0)
    assert row["x_ReplacesReceiptHash"] == old["receipt_hash"] and row["x_ReceiptHash"] == new["receipt_hash"]
    usage = df[(df["ChargeCategory"] == "Usage") & df["ChargeClass"].isna()]
    assert (usage["ConsumedQuantity"].astype(float) > 0).all()
    tags = json.loads(usage.iloc[0]["Tags"])
    assert set(tags) <= {"ipledger/partition", "ipledger/qos", "ipledger/user", "ipledger/nodes"}


def test_billed_cost_per_tenant_equals_the_tenants_receipts(tmp_path):
    rs, old, new, st, df = statement(tmp_path)
    want = defaultdict(float)
    for r in rs:
        want[r["job"]["account"]] += r["cost"]["paid"] + sum(a["amount"] for a in r["adjustments"])
    want["astro"] += new["cost"]["paid"] - old["cost"]["paid"]  # the correction lands in November
    got = df.assign(b=df["BilledCost"].astype(float)).groupby("SubAccountId")["b"].sum()
    assert {k: round(v, 2) for k, v in got.items()} == {k: monthly.cents(v) for k, v in want.items()}
    tenants = st.summary.by_tenant.set_index("tenant")["billed"]
    for t, v in got.items():
        assert round(v, 2) == monthly.cents(tenants[t])


def test_validator_rejects_what_focus_forbids():
    good = focus.focus_table(statement_from_issues(
        IssuedSet([Issue(1, NOV, synthetic.receipt(1, tenant="a", start=NOV + 3600, hours=1))], 1, "0" * 64),
        "2026-11"))
    assert focus.validate(good) == []
    cases = {
        "missing mandatory column BilledCost": good.drop(columns=["BilledCost"]),
        "not a Decimal": good.assign(BilledCost="12,5"),
        "not a FOCUS DateTime": good.assign(ChargePeriodStart="2026-11-01 01:00"),
        "not one of": good.assign(ChargeCategory="Refund"),
        "ConsumedQuantity must be positive": good.assign(ConsumedQuantity=0.0),
        "not prefixed x_": good.assign(MyColumn="1"),
        "is null": good.assign(BillingCurrency=None),
        "not a JSON object": good.assign(Tags="[1]"),
    }
    for msg, df in cases.items():
        problems = focus.validate(df)
        assert any(msg in p for p in problems), (msg, problems)


def test_empty_month_focus_has_the_header_only(tmp_path):
    st = statement_from_issues(IssuedSet([], 0, "0" * 64), "2026-09")
    p = tmp_path / "e.csv"
    write(st, "focus", p)
    df = pd.read_csv(p)
    assert len(df) == 0 and list(df.columns) == list(focus.COLUMN_NAMES)
