"""One number for one question (issue 27): whatever scope (fleet, rack, node, tenant, job) and period (a day, a
week, the month) is asked, `account` (and its alias `daily`), `explain`, `ask`, the statement and the written
analysis give the same paid / delivered GPU-hours to the nanohour and the same money to the cent, or differ by
exactly the difference lines they print. On the demo ledger (every run issued) and on a ledger with open runs
(half the runs issued)."""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger.agents import hourly, period_analysis, run_agents
from ledger.agents import query
from ledger.agents.ask import answer, parse_period
from tests.test_agents import small_hall

NANOHOUR = 1e-9 * 50   # the device-hours' own sums: a few float roundings of a nanohour


def _load(url: str) -> dict:
    engine = db_mod.make_engine(url)
    ds = hourly.load_compact(engine, detail=True)
    analysis = run_agents(ds)
    month = parse_period("2026-11", ds.start, ds.end)
    return {"engine": engine, "ds": ds, "analysis": analysis, "found": analysis.findings, "url": url,
            "billed": query.billed_rows(engine, month[0], month[1])}


@pytest.fixture(scope="module")
def issued(demo):
    out, _ = demo
    return _load(f"sqlite:///{out / 'ledger.db'}")


@pytest.fixture(scope="module")
def half_open(tmp_path_factory):
    """The small hall with the receipts of every other run issued: the rest are open (no receipt yet)."""
    from ledger.receipts import issue_receipt

    hall, _ = small_hall()
    path = tmp_path_factory.mktemp("half") / "ledger.db"
    shutil.copy(hall.db_path, path)
    engine = db_mod.make_engine(f"sqlite:///{path}")
    for j in hall.sim.jobs[::2]:
        issue_receipt(engine, j.job_id, run=j.run, cluster=hall.sim.spec.cluster)
    engine.dispose()
    return _load(f"sqlite:///{path}")


def _scopes(ds):  # noqa: ANN001, ANN202
    nodes = sorted(ds.devices["node"].dropna().unique())
    racks = sorted(ds.devices["rack"].dropna().unique())
    tenants = sorted(ds.allocs["tenant"].dropna().unique())
    jobs = sorted(ds.allocs["job_id"].dropna().unique())
    return st.sampled_from([("fleet", None)] + [("rack", r) for r in racks] + [("node", n) for n in nodes] +
                           [("tenant", t) for t in tenants] + [("job", j) for j in jobs[::5]])


def _periods(ds):  # noqa: ANN001, ANN202
    import pandas as pd

    days = pd.date_range(pd.Timestamp(ds.start, unit="s").normalize(), pd.Timestamp(ds.end - 1, unit="s"), freq="D")
    weeks = sorted({f"{d.isocalendar().year}-W{d.isocalendar().week:02d}" for d in days})
    return st.sampled_from([d.strftime("%Y-%m-%d") for d in days] + weeks + ["2026-11"])


def _question(kind: str, name: str | None, period: str) -> str:
    who = "the fleet" if kind == "fleet" else f"{kind} {name}"
    when = f"on {period}" if re.fullmatch(r"\d{4}-\d\d-\d\d", period) else f"in {period}"
    return f"how many GPU-hours did {who} pay for {when}?"


def _check(led: dict, kind: str, name: str | None, period: str) -> None:
    ds, found = led["ds"], led["found"]
    start, end, label = parse_period(period, ds.start, ds.end)
    billed = led["billed"] if query.calendar_month(start, end) else None
    ex = query.scope(ds, found, kind, name, start, end, billed)
    acct = ex["account"]
    # ask answers from the same figures, and says them in its sentence
    asked = answer(ds, found, _question(kind, name, period), billed=billed)
    assert asked["account"] == acct and asked["table"] == ex["table"]
    assert f"was paid for {ex['table']['paid']:,.1f} GPU-hours" in asked["answer"]
    # the table adds up to the figure beside it
    t = ex["table"]
    assert round(sum(ln["gpu_hours"] for ln in t["lines"]), 1) == t["lost"] == round(t["paid"] - t["delivered"], 1)
    assert acct["cost"]["lost"] == round(acct["cost"]["paid"] - acct["cost"]["delivered"], 2)
    # account (and daily: one command) of the same period: its fleet figures are explain's; its tenant row is
    # the tenant's explain; its per-day rows sum to the paid figure to the nanohour (each row rounded to 1e-4)
    acc = query.period(ds, found, start, end, label, billed)
    if kind == "fleet":
        assert acc["account"] == acct and acc["table"] == t
    for k in ("paid", "delivered", "lost"):
        assert round(sum(r[k] for r in acc["tenants"]), 1) == acc["total"][k]
    assert acc["total"]["paid"] == acc["table"]["paid"] == round(acc["account"]["paid"], 1)
    assert abs(sum(r["paid"] for r in acc["daily"]) - acc["account"]["paid"]) <= 5e-5 * len(acc["daily"]) + 1e-4
    if kind == "tenant":
        row = next(r for r in acc["tenants"] if r["tenant"] == name)
        assert (row["paid"], row["delivered"]) == (t["paid"], t["delivered"])
        day_paid = sum(r["paid"] for r in acc["daily"] if r["tenant"] == name)
        assert abs(day_paid - acct["paid"]) <= 5e-5 * len(acc["daily"]) + 1e-4
    # the written analysis of the period: the fleet's account
    if kind == "fleet":
        doc = period_analysis(ds, led["analysis"], start, end, label)
        assert {k: doc["account"][k] for k in ("paid", "delivered", "lost", "cost")} == \
            {k: acct[k] for k in ("paid", "delivered", "lost", "cost")}
    # the statement of a billed month: billed + the printed difference lines == the device-hours, exactly
    if ex["basis"] == query.RECEIPTS:
        b, diffs = ex["billed"], ex["differences"]
        for k in ("paid", "delivered"):
            assert abs(b[k] + sum(d[k] for d in diffs) - acct[k]) <= 2e-4
        for k in ("paid", "delivered", "lost"):
            assert round(b["cost"][k] + sum(d["cost"][k] for d in diffs), 2) == acct["cost"][k]
        rows = billed if kind == "fleet" else billed[billed["tenant"] == name] if kind == "tenant" else \
            billed[billed["job_id"].astype(str) == str(name)]
        assert b["paid"] == round(float(rows["paid"].sum()), 4)
        assert b["cost"]["paid"] == round(float(rows["cost_paid"].sum()), 2)


@pytest.mark.parametrize("which", ["issued", "half_open"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_view_gives_one_number(request, which, data):
    """On the demo (every run issued) and on the half-issued hall (open runs): explain, ask, account / daily, the
    analysis and the billed month agree, or differ by exactly their printed difference lines."""
    led = request.getfixturevalue(which)
    kind, name = data.draw(_scopes(led["ds"]))
    _check(led, kind, name, data.draw(_periods(led["ds"])))


def test_the_issued_demo_month_is_the_statement_to_the_cent(issued, demo, runner, cli):
    """End to end: `account --period` of the demo's month (and `daily`, the same command) print the statement
    CSV's paid, delivered and money; no difference line, since every run is issued."""
    out, _ = demo
    total = next(r for r in csv.DictReader(open(out / "statement-2026-11.csv")) if r["level"] == "total")
    res = [json.loads(runner.invoke(cli, ["--db", issued["url"], name, "--period", "2026-11", "--json"]).output)
           for name in ("account", "daily")]
    assert res[0] == res[1]
    r = res[0]
    assert r["basis"] == "receipts" and r["differences"] == []
    assert abs(r["account"]["paid"] - float(total["paid"])) <= 1e-4
    assert abs(r["account"]["delivered"] - float(total["delivered"])) <= 1e-4
    assert (r["cost"]["paid"], r["cost"]["delivered"], r["cost"]["lost"]) == \
        (float(total["cost_paid"]), float(total["cost_delivered"]), float(total["cost_lost"]))


def test_open_runs_are_their_own_printed_line(half_open, runner, cli):
    """With half the runs issued, `account --period 2026-11` prints the receipts' figure, the open runs' line
    and the device-hours, and the printed figures add up."""
    r = runner.invoke(cli, ["--db", half_open["url"], "account", "--period", "2026-11"])
    assert r.exit_code == 0, r.output
    lines = {m.group(1).strip(): [float(x.replace(",", "")) for x in m.group(2, 3, 4, 5)]
             for m in re.finditer(r"^ {2}[+=]? ?(.+?)\s+([\d,]+\.\d{4})\s+([\d,]+\.\d{4}) GPU-h\s+([\d,.]+)\s+"
                                  r"([\d,.]+) ", r.output, re.M)}
    billed, opened = lines["billed (issued receipts)"], lines[query.OPEN_LINE]
    total = lines["device-hours (paid, delivered)"]
    assert opened[0] > 0
    rest = lines.get(query.SPLIT_LINE, [0.0] * 4)
    for i, tol in ((0, 2e-4), (1, 2e-4), (2, 0.005), (3, 0.005)):
        assert abs(billed[i] + opened[i] + rest[i] - total[i]) <= tol, (i, r.output)


def test_a_cost_sentence_multiplies_to_what_it_prints(issued):
    """"Cooling cost the fleet H GPU-hours ..., A at R per GPU-hour": H x R rounds to A."""
    ds, found = issued["ds"], issued["found"]
    for cause in ("cooling", "idle held", "power cap"):
        res = answer(ds, found, f"how much did {cause} cost us in 2026-11?")
        m = re.search(r"cost the fleet ([\d,.]+) GPU-hours in [^,]+, ([\d,.]+) \w+ at ([\d,.]+) \w+ per GPU-hour",
                      res["answer"])
        assert m, res["answer"]
        h, amount, rate = (float(x.replace(",", "")) for x in m.groups())
        assert round(h * rate + 1e-12, 2) == amount
        assert amount == res["money"]["amount"]


def test_query_rate_text_finds_the_precision_that_multiplies():
    from ledger.agents.accounting import cents

    for hours, rate in ((258.5, 2.48240232), (0.1, 2.5), (1234.5, 2.2000001), (3.3, 2.4949)):
        amount = cents(hours * rate)
        shown = float(query.rate_text(amount, hours, rate).replace(",", ""))
        assert cents(hours * shown) == amount


def test_an_explanation_names_the_requeue_loss_it_lists(issued):
    """A job whose requeue_loss finding is listed under its explanation says so in its headline, with the listed
    figure (it is delivered work to redo, not a line of paid - delivered)."""
    ds, found = issued["ds"], issued["found"]
    jobs = sorted({f.scope_dict()["job_id"] for f in found if f.kind == "requeue_loss"})
    assert jobs, "the demo hall requeues a job"
    start, end, _ = parse_period("all", ds.start, ds.end)
    ex = query.scope(ds, found, "job", jobs[0], start, end)
    listed = [f["gpu_hours_in_scope"] for f in ex["findings"] if f["kind"] == "requeue_loss"]
    assert listed
    assert f"requeue loss: {sum(round(h, 1) for h in listed):,.1f} GPU-hours" in ex["answer"]
    assert "no finding explains any" not in ex["answer"]


def test_the_statement_pdf_unknown_sentence_adds_up(demo, issued):
    """The statement PDF's unknown section says the listed intervals' hours and the unknown time no interval
    covers as two parts that add up to the month's unknown (was: 'N interval(s): ... X pending' above rows that
    add up to far less)."""
    from reports.export import build_statement
    from reports.pdf_statement import fmt_hours, listed_unknown_hours
    from tests.test_analysis_pdf import pdf_text

    out, _ = demo
    st = build_statement(issued["engine"], "2026-11")
    text = " ".join(pdf_text(out / "statement-2026-11.pdf").split())
    m = re.search(r"(\d+) interval\(s\) listed below: ([\d,.]+) GPU-hours; allocated time without telemetry and "
                  r"without an interval entry: ([\d,.]+) GPU-hours; unknown in all ([\d,.]+) GPU-hours, of which "
                  r"([\d,.]+) resolved and ([\d,.]+) pending", text)
    assert m, text[:2000]
    n, listed, rest, total, resolved, pending = (float(x.replace(",", "")) for x in m.groups())
    assert n == len(st.flat.unknowns) and m.group(2) == fmt_hours(listed_unknown_hours(st.flat.unknowns))
    assert m.group(4) == fmt_hours(st.totals["unknown_resolved"] + st.totals["unknown_pending"])
    assert abs(listed + rest - total) <= 0.011 and abs(resolved + pending - total) <= 0.011
