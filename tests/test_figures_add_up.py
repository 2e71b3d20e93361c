"""One accounting of figures: whatever scope and period is asked, the loss lines add up to the loss, the shown
lines (each rounded once) add up to the shown total, and the headline says nothing its table does not show."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.agents.accounting import (OTHER_LINE, UNKNOWN_LINE, WORKLOAD_LINE, explain, loss_partition,
                                      shown_lines)
from tests.test_agents import small_hall

DAY = 86400.0


@pytest.fixture(scope="module")
def ds_found():
    from ledger.agents import load

    hall, _ = small_hall()
    return load(hall.engine), hall.analysis.findings


def _scopes(ds):  # noqa: ANN001, ANN202
    nodes = sorted(ds.devices["node"].dropna().unique())
    racks = sorted(ds.devices["rack"].dropna().unique())
    tenants = sorted(ds.allocs["tenant"].dropna().unique())
    jobs = sorted(ds.allocs["job_id"].dropna().unique())
    return ([("fleet", None)] + [("node", n) for n in nodes] + [("rack", r) for r in racks] +
            [("tenant", t) for t in tenants] + [("job", j) for j in jobs[::7]])


def check_headline(ex: dict) -> None:
    """Every figure in the headline is one of its table's shown figures, and the table adds up."""
    t = ex["table"]
    assert round(sum(ln["gpu_hours"] for ln in t["lines"]), 1) == t["lost"]
    assert t["lost"] == round(t["paid"] - t["delivered"], 1)
    text = ex["answer"]
    assert f"paid for {t['paid']:,.1f} GPU-hours" in text
    assert f"delivered {t['delivered']:,.1f}" in text and f"of the {t['lost']:,.1f} lost" in text
    named = re.findall(r"([a-z_ ]+?) ([\d,]+\.\d)(?:;|$)", text.split("the largest causes: ")[-1]) \
        if "the largest causes: " in text else []
    shown = {ln["cause"].replace("_", " "): ln["gpu_hours"] for ln in t["lines"]}
    for cause, figure in named:
        cause = cause.strip()
        assert cause in shown, (cause, shown)
        assert float(figure.replace(",", "")) == shown[cause]
    # and the headline's causes are the table's largest, in its order
    ranked = [ln["cause"].replace("_", " ") for ln in t["lines"]
              if ln["cause"] not in (WORKLOAD_LINE, OTHER_LINE, UNKNOWN_LINE, "rounding")][:3]
    assert [c.strip() for c, _ in named] == ranked


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_explain_lines_add_up_and_the_headline_matches_its_table(ds_found, data):
    ds, found = ds_found
    kind, name = data.draw(st.sampled_from(_scopes(ds)))
    d0 = data.draw(st.integers(0, 6))
    span = data.draw(st.integers(1, 7))
    start = ds.start - ds.start % DAY + d0 * DAY
    ex = explain(ds, found, kind, name, start, start + span * DAY)
    acct = ex["account"]
    assert sum(ex["by_cause"].values()) == pytest.approx(acct["paid"] - acct["delivered"], abs=1e-3)
    assert all(v >= -1e-9 for v in ex["by_cause"].values())
    check_headline(ex)


def test_the_fleet_account_is_one_partition(ds_found):
    ds, found = ds_found
    from ledger.agents.accounting import account

    acct = account(ds, found)
    lines, per_finding = loss_partition(ds, found, paid=acct["paid"])
    assert sum(lines.values()) == pytest.approx(acct["lost"], abs=1e-3)
    assert acct["by_cause"] == pytest.approx({k: round(v, 4) for k, v in lines.items()}, abs=2e-4)
    # each claimed GPU-hour is claimed once: per-finding hours never exceed their cause's line
    assert all(v >= 0 for v in per_finding.values())


@given(st.dictionaries(st.sampled_from(["cooling", "power_cap", "starved", "idle_held", WORKLOAD_LINE, OTHER_LINE]),
                       st.floats(0, 5000, allow_nan=False), min_size=1))
def test_shown_lines_sum_to_the_shown_total(lines):
    shown, total = shown_lines(lines, sum(lines.values()))
    assert round(sum(v for _, v in shown), 1) == total == round(sum(lines.values()), 1)


def _money_column(lines: list[str]) -> tuple[list[float], float]:
    """The cost column of a receipt's text (the lines between its two rules) and the Paid line's cost."""
    rules = [k for k, ln in enumerate(lines) if ln == "-" * 60]
    rows = [float(ln[44:60].replace(",", "")) for ln in lines[rules[0] + 1:rules[1]]]
    paid = next(float(ln[44:60].replace(",", "")) for ln in lines if ln.startswith("Paid "))
    return rows, paid


def test_receipt_cost_column_adds_up_to_paid(ds_found):
    """Each line rounded to the cent once; where the rounded lines miss Paid, a Rounding line shows the cent."""
    from ledger.receipts import receipt_for
    from ledger.receipts.render import text_lines

    hall, _ = small_hall()
    ds, _ = ds_found
    runs = ds.allocs[["job_id", "run"]].drop_duplicates().head(25)
    seen_rounding = 0
    for job, run in runs.itertuples(index=False):
        lines = text_lines(receipt_for(hall.engine, str(job), int(run)))
        rows, paid = _money_column(lines)
        seen_rounding += any(ln.startswith("Rounding") for ln in lines)
        assert round(sum(rows), 2) == paid, (job, rows, paid)
    assert seen_rounding   # the case the rounding line exists for does occur


def test_a_jobs_explanation_covers_the_job_not_the_week(ds_found):
    from ledger.chain.canonical import format_ts

    ds, found = ds_found
    job = ds.allocs["job_id"].iloc[len(ds.allocs) // 2]
    al = ds.allocs[ds.allocs["job_id"] == job]
    ex = explain(ds, found, "job", job, ds.start, ds.end)
    assert ex["period"] == {"start": format_ts(float(al["start"].min())), "end": format_ts(float(al["end"].max()))}
    check_headline(ex)
