"""`ipledger ask` and `explain`: the documented question forms are answered from the ledger; anything else is
refused with "I can't answer that" and a non-zero exit, rather than guessed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.agents.ask import CannotAnswer, parse_period, parse_question
from tests.test_agents import small_hall

WEEK0 = 1793577600.0  # Monday 2026-11-02, the demo week (ISO 2026-W45)


@pytest.fixture(scope="module")
def hall_db():
    hall, found = small_hall()
    return f"sqlite:///{hall.db_path}", hall, found


@pytest.fixture(scope="module")
def ds_found(hall_db):
    from ledger.agents import load

    _, hall, _ = hall_db
    return load(hall.engine), hall.analysis.findings


@pytest.mark.parametrize("question", [
    "why did C2 lose 400 GPU-hours this week?",
    "Why did rack R3 lose GPU-hours in 2026-W45?",
    "how many GPU-hours did tenant climate lose this week",
    "how many gpu hours did node A2 deliver on 2026-11-04?",
    "how many GPU-hours did tenant vision pay for between 2026-11-02 and 2026-11-04?",
    "where did the GPU-hours go yesterday?",
    "what happened on R3 in 2026-W45?",
    "what happened to node B3 in the last 2 days?",
])
def test_documented_forms_are_answered(ds_found, question):
    from ledger.agents.ask import answer

    ds, found = ds_found
    out = answer(ds, found, question)
    acct = out["account"]
    assert acct["paid"] >= acct["delivered"] >= 0
    assert abs(acct["paid"] - acct["delivered"] - acct["lost"]) < 1e-3  # each figure is rounded to 4 places
    assert out["answer"] and "can't" not in out["answer"]
    if out["form"] == "how_many":
        verb = question.split(" did ")[1]
        key = "delivered" if "deliver" in verb else "paid" if "pay for" in verb else "lost"
        assert f"{out['table'][key]:,.1f} GPU-hours" in out["answer"]   # the shown figure, not a re-rounding
    if "400" in question:
        assert "(you said 400)" in out["answer"]


def test_cli_ask_json(runner, cli, hall_db):
    url, _, _ = hall_db
    r = runner.invoke(cli, ["--db", url, "ask", "how many GPU-hours did tenant climate lose this week?", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["form"] == "how_many" and out["scope"] == {"kind": "tenant", "name": "climate"}
    assert out["by_cause"].get("checkpoint_starved", 0) > 0


def test_why_answer_names_the_cooling_cause_with_evidence(runner, cli, hall_db):
    url, _, _ = hall_db
    r = runner.invoke(cli, ["--db", url, "ask", "why did rack R3 lose GPU-hours this week?", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    top = out["findings"][0]
    assert top["kind"] == "hot_because_cooling" and top["scope"]["rack"] == "R3"
    assert out["by_cause"]["cooling"] > 0
    assert top["evidence"][0]["during"] > top["evidence"][0]["before"]
    assert "cooling" in out["answer"]


@pytest.mark.parametrize("question", ["what is the meaning of life?", "delete node C2", "why is the sky blue", ""])
def test_other_questions_are_refused(runner, cli, hall_db, question):
    url, _, _ = hall_db
    r = runner.invoke(cli, ["--db", url, "ask", question])
    assert r.exit_code != 0
    assert "I can't answer that" in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("question", ["why did Z9 lose 10 GPU-hours this week?",
                                      "how many GPU-hours did node C2 lose in 2031-W02?"])
def test_questions_about_what_the_ledger_lacks_are_refused(ds_found, question):
    from ledger.agents.ask import answer

    ds, found = ds_found
    with pytest.raises(CannotAnswer, match="I can't answer that"):
        answer(ds, found, question)


def test_explain_cli_and_its_errors(runner, cli, hall_db):
    url, _, _ = hall_db
    r = runner.invoke(cli, ["--db", url, "explain", "--node", "A2", "--period", "2026-W45", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["scope"] == {"kind": "node", "name": "A2"}
    assert any(f["kind"] == "power_cap" for f in out["findings"])
    for args, msg in ((["--node", "A2", "--rack", "R1"], "exactly one"), (["--node", "nope"], "unknown node"),
                      (["--node", "A2", "--period", "someday"], "cannot read period")):
        r = runner.invoke(cli, ["--db", url, "explain", *args])
        assert r.exit_code == 1 and msg in r.output and len(r.output.strip().splitlines()) == 1


@given(st.integers(min_value=2020, max_value=2035), st.integers(min_value=1, max_value=52))
@settings(max_examples=40, deadline=None)
def test_iso_week_periods_are_seven_days_starting_monday(year, week):
    a, b, label = parse_period(f"{year}-W{week:02d}", 0.0, 1.0)
    assert b - a == 7 * 86400
    import datetime as dt
    assert dt.datetime.fromtimestamp(a, dt.timezone.utc).weekday() == 0
    assert label == f"week {year}-W{week:02d}"


def test_relative_periods_follow_the_ledger_not_the_clock():
    end = WEEK0 + 5 * 86400 + 3600  # Saturday 01:00
    a, b, _ = parse_period("this week", WEEK0, end)
    assert (a, b) == (WEEK0, WEEK0 + 7 * 86400)
    a, b, _ = parse_period("yesterday", WEEK0, end)
    assert (a, b) == (WEEK0 + 4 * 86400, WEEK0 + 5 * 86400)
    a, b, _ = parse_period("last week", WEEK0, end)
    assert b == WEEK0


@given(st.text(max_size=60))
@settings(max_examples=200, deadline=None)
def test_parser_never_guesses(text):
    """Any text either parses to one of the documented forms or raises CannotAnswer, never anything else."""
    try:
        q = parse_question(text)
    except CannotAnswer:
        return
    assert q.form in ("why", "how_many", "where", "what")


# --- the question families: one test each, through the CLI, checked against the ledger's own figures -----------

def _ask(runner, cli, url, q):  # noqa: ANN001, ANN202
    r = runner.invoke(cli, ["--db", url, "ask", q, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_family_ranking(runner, cli, hall_db, ds_found):
    from ledger.agents.accounting import account, scope_masks

    url, _, _ = hall_db
    out = _ask(runner, cli, url, "which jobs wasted the most GPU-hours this week?")
    rows = out["ranking"]
    assert out["form"] == "rank" and out["by"] == "job" and 1 <= len(rows) <= 10
    assert [r["lost"] for r in rows] == sorted((r["lost"] for r in rows), reverse=True)
    # the top job's figure is the job's own account for the week
    ds, found = ds_found
    smask, amask = scope_masks(ds, "job", rows[0]["job"])
    acct = account(ds, found, sel=smask, start=WEEK0, end=WEEK0 + 7 * 86400, alloc_mask=amask)
    assert rows[0]["paid"] == round(acct["paid"], 1) and rows[0]["delivered"] == round(acct["delivered"], 1)
    assert f"{rows[0]['job']} {rows[0]['lost']:,.1f}" in out["answer"]
    out = _ask(runner, cli, url, "which tenants lost the most GPU-hours this week?")
    assert {r["tenant"] for r in out["ranking"]} <= set(ds.allocs["tenant"])


def test_family_cost(runner, cli, hall_db):
    url, _, _ = hall_db
    out = _ask(runner, cli, url, "how much did cooling cost us this week?")
    m = out["money"]
    line = next(ln for ln in out["table"]["lines"] if ln["cause"] == "cooling")
    assert m["cause"] == "cooling" and m["gpu_hours"] == line["gpu_hours"] > 0
    rate = out["account"]["cost"]["paid"] / out["account"]["paid"]
    assert m["amount"] == pytest.approx(out["by_cause"]["cooling"] * rate, abs=0.01)
    assert f"{m['amount']:,.2f} USD" in out["answer"]
    out = _ask(runner, cli, url, "how much did tenant vision cost us this week?")
    assert out["money"]["paid"] == pytest.approx(out["account"]["cost"]["paid"], abs=0.005)


def test_family_delivered_totals(runner, cli, hall_db):
    url, _, _ = hall_db
    out = _ask(runner, cli, url, "how many GPU-hours did the cluster deliver this week")
    assert out["scope"] == {"kind": "fleet", "name": None}
    assert out["answer"].startswith(f"the fleet delivered {out['table']['delivered']:,.1f} GPU-hours")


def test_family_utilisation_of_a_scope_at_a_time(runner, cli, hall_db):
    url, _, _ = hall_db
    out = _ask(runner, cli, url, "what was the utilization of R3 on Wednesday?")
    assert out["scope"] == {"kind": "rack", "name": "R3"}
    assert out["period"]["start"] == "2026-11-04T00:00:00Z" and out["period"]["end"] == "2026-11-05T00:00:00Z"
    t = out["table"]
    assert f"was {t['delivered'] / t['paid']:.0%}" in out["answer"]


def test_family_why_is_x_slow(runner, cli, hall_db):
    url, _, _ = hall_db
    out = _ask(runner, cli, url, "why is B2 slow?")
    assert out["form"] == "slow" and out["scope"] == {"kind": "node", "name": "B2"}
    assert any(f["kind"] in ("sibling_divergence", "ecc_drift") for f in out["findings"])   # B2 hosts the drift
    out = _ask(runner, cli, url, "why did vision lose so much?")
    assert out["scope"] == {"kind": "tenant", "name": "vision"} and out["by_cause"]["idle_held"] > 0


def test_refusal_says_what_can_be_asked(runner, cli, hall_db):
    url, _, _ = hall_db
    r = runner.invoke(cli, ["--db", url, "ask", "what is the meaning of life?"])
    assert r.exit_code == 1 and "I can answer:" in r.output and "which jobs" in r.output


def test_account_day_and_week(runner, cli, hall_db):
    url, _, _ = hall_db
    for args in (["--day", "2026-11-04"], ["--week", "2026-W45"]):
        r = runner.invoke(cli, ["--db", url, "account", *args, "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        rows, tot = out["tenants"], out["total"]
        for k in ("paid", "delivered", "lost"):
            assert round(sum(x[k] for x in rows), 1) == tot[k]        # totals are sums of the shown rows
        assert round(sum(ln["gpu_hours"] for ln in out["table"]["lines"]), 1) == tot["lost"]
        assert f"paid {tot['paid']:,.1f} GPU-hours" in out["answer"]
    r = runner.invoke(cli, ["--db", url, "account", "--day", "2026-11-04"])
    assert r.exit_code == 0 and "lost by cause" in r.output
    r = runner.invoke(cli, ["--db", url, "account", "--week", "2026-13-99"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(cli, ["--db", url, "account", "--day", "2026-11-04", "--week", "2026-W45"])
    assert r.exit_code != 0 and r.output.strip() == "ipledger: give at most one of --day, --week, --period"
