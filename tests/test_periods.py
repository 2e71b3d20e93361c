"""Half-open periods (hour, day, month) at every boundary; receipts split exactly over the months and days
they paid seconds in; the ``end`` period rule; open runs as accrued usage; corrections of changed parts;
``--as-of`` reproducing a closed month byte for byte after later issues; ``--month`` range errors."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger.chain import store
from reports import monthly
from ledger.base import periods
from ledger.sim import synthetic_receipts as synthetic
from reports.export import statement_from_issues
from reports.issued import Issue, IssuedSet, flatten_issues, select_month
from tests.test_export_monthly import issue_entry

UTC = dt.timezone.utc
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
JAN = dt.datetime(2027, 1, 1, tzinfo=UTC).timestamp()
H = 3600.0


def test_month_boundaries_are_half_open():
    assert periods.billing_month(DEC - 86400, DEC) == "2026-11"  # ends at the instant December begins
    assert periods.billing_month(DEC, DEC + 1) == "2026-12"  # starts at it
    assert periods.billing_month(DEC - 1, DEC + 1) == "2026-12"
    assert periods.billing_month(DEC, DEC) == "2026-12"  # empty window: its start
    assert periods.billing_month(DEC, float("nan")) == "2026-12"
    assert periods.months_spanned(NOV, DEC) == [("2026-11", NOV, DEC)]
    assert periods.months_spanned(NOV, DEC + 1) == [("2026-11", NOV, DEC), ("2026-12", DEC, DEC + 1)]
    assert periods.months_spanned(DEC - 1, JAN + 1) == [("2026-11", DEC - 1, DEC), ("2026-12", DEC, JAN),
                                                        ("2027-01", JAN, JAN + 1)]
    # days: the midnight instant starts the next day
    assert periods.days_spanned(DEC - H, DEC) == [(DEC - H, DEC)]
    assert periods.days_spanned(DEC - H, DEC + H) == [(DEC - H, DEC), (DEC, DEC + H)]
    # the hour-of-day profile: a window ending on the hour puts nothing in that hour
    r = synthetic.receipt(1, tenant="t", start=DEC - 2 * H, hours=2, n_devices=1)
    prof = monthly.hour_profile(monthly.flatten([r]).rows).set_index("hour")["paid"]
    assert prof[22] == pytest.approx(1.0) and prof[23] == pytest.approx(1.0) and prof[0] == 0.0


@pytest.mark.parametrize("month,why", [("0000-01", "out of range"), ("9999-12", "out of range"),
                                       ("2026-13", "expected YYYY-MM"), ("2026-1", "expected YYYY-MM"),
                                       ("", "expected YYYY-MM")])
def test_month_errors_are_one_line(month, why, runner, cli, sqlite_url):
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", month, "--quiet"])
    assert res.exit_code != 0
    assert why in res.output and res.output.strip().count("\n") == 0, res.output
    assert "Traceback" not in res.output
    assert periods.month_bounds("0001-01")[0].year == 1 and periods.month_bounds("9999-11")[1].month == 12


@settings(max_examples=200, deadline=None)
@given(value=hs.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
       weights=hs.lists(hs.integers(min_value=0, max_value=10**9), min_size=1, max_size=40))
def test_split_parts_sum_exactly_to_the_nanohour(value, weights):
    parts = periods.split_nano(value, weights)
    assert sum(round(p * periods.NANO) for p in parts) == round(value * periods.NANO)
    if sum(weights):  # each part within 1.5 nano-units of its exact share: the value itself is rounded to
        # whole nano-units (half a unit, spread by weight), then the largest remainder moves a part by < 1 unit
        for p, w in zip(parts, weights):
            assert abs(p - value * w / sum(weights)) <= 1.5 / periods.NANO + abs(value) * 1e-15


def _long_run(rule: str | None = None, **kw) -> dict:
    """Nov 21 00:00 to Dec 11 00:00: 10 days in November, 10 in December, 4 devices."""
    r = synthetic.receipt(77, tenant="astro", start=NOV + 20 * 86400, hours=20 * 24, n_devices=4, rate=2.5,
                          shares={"thermal": 0.1, "idle_held": 0.2, "unknown": 0.05}, **kw)
    if rule:
        r["contract"]["period_rule"] = rule
    return r


@settings(max_examples=60, deadline=None)
@given(start=hs.floats(min_value=NOV - 40 * 86400, max_value=DEC + 5 * 86400),
       hours=hs.floats(min_value=0.001, max_value=24 * 70), n=hs.integers(min_value=1, max_value=8))
def test_a_run_across_month_ends_is_split_and_the_parts_sum_to_its_receipt(start, hours, n):
    r = synthetic.receipt(5, tenant="t", start=start, hours=hours, n_devices=n, rate=3.3,
                          shares={"starved": 0.3, "power_cap": 0.1})
    issue = Issue(1, JAN + 86400, r)
    rows = [flatten_issues([issue.as_part(m)]).rows.iloc[0] for m, _, _ in issue.parts]
    s, e = monthly.epoch(r["window"]["start"]), monthly.epoch(r["window"]["end"])
    assert [m for m, _, _ in issue.parts] == sorted({periods.month_of(t) for t in (s, periods.placement(s, e))}
                                                    | {m for m, _, _ in periods.months_spanned(s, e)})
    whole = monthly.flatten([r]).rows.iloc[0]
    for col in monthly.SUM_COLUMNS:
        assert sum(round(x[col] * periods.NANO) for x in rows) == round(whole[col] * periods.NANO), col
    # each part's charge period lies in its month, and the paid hours follow the seconds in it
    for (m, lo, hi), x in zip(issue.parts, rows):
        a, b = periods.month_bounds(m)
        assert a.timestamp() <= x["window_start"] <= x["window_end"] <= b.timestamp()
        assert x["paid"] == pytest.approx(whole["paid"] * (hi - lo) / (e - s), abs=2e-9)


def test_long_run_billed_in_both_months_through_the_cli(ledger_url, engine, runner, cli):
    r = _long_run()
    store.append(engine, [issue_entry(r, DEC + 10 * 86400 + 60)])

    def month(m: str) -> dict:
        res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", m, "--format", "json",
                                  "--out", "-", "--quiet"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    nov, dec = month("2026-11"), month("2026-12")
    assert nov["totals"]["runs"] == dec["totals"]["runs"] == 1
    assert nov["totals"]["paid"] == pytest.approx(r["gpu_hours"]["paid"] / 2, abs=1e-6)
    assert nov["totals"]["paid"] + dec["totals"]["paid"] == pytest.approx(r["gpu_hours"]["paid"], abs=1e-6)
    assert monthly.cents(nov["totals"]["billed"] + dec["totals"]["billed"]) == monthly.cents(r["cost"]["paid"])
    # the unknown interval (the run's last hours) is listed only in the month it lies in
    assert nov["unknown_intervals"] == [] and len(dec["unknown_intervals"]) == 1
    # under "end" the whole receipt is billed in December
    e = _long_run("end")
    st_nov = statement_from_issues(IssuedSet([Issue(1, DEC + 10 * 86400, e)], 1, "h"), "2026-11")
    st_dec = statement_from_issues(IssuedSet([Issue(1, DEC + 10 * 86400, e)], 1, "h"), "2026-12")
    assert st_nov.empty and st_dec.summary.totals["paid"] == pytest.approx(e["gpu_hours"]["paid"])


def test_open_run_accrues_then_its_reissue_corrects_only_changed_months():
    # issued open on Nov 25 (accrued usage so far), closed Dec 10 and re-issued after November closed
    acc = synthetic.receipt(9, tenant="bio", start=NOV + 19 * 86400, hours=5 * 24, n_devices=2, rate=2.0)
    acc["open"] = True
    final = _long_run()
    final["job"] = dict(acc["job"])
    issues = [Issue(1, NOV + 24 * 86400 + 1, acc), Issue(2, DEC + 10 * 86400 + 60, final)]
    close = {"2026-11": 2, "2026-12": None}.get
    usage_nov, corr_nov = select_month(issues, "2026-11", close)
    assert [i.seq for i in usage_nov] == [1] and corr_nov == []  # accrued usage of the month so far
    usage_dec, corr_dec = select_month(issues, "2026-12", close)
    assert [i.seq for i in usage_dec] == [2]
    assert [(c.month, c.new.part, c.old.part) for c in corr_dec] == [("2026-12", "2026-11", "2026-11")]
    # November as billed + its correction = the final receipt's November part; December bills its own part
    iset = IssuedSet(issues, 2, "h", close_seq=close)
    nov_paid = statement_from_issues(iset, "2026-11").summary.totals["paid"]
    dec = statement_from_issues(iset, "2026-12").rows
    corr = dec[dec.row_kind == "correction"]["paid"].sum()
    assert nov_paid + corr == pytest.approx(final["gpu_hours"]["paid"] / 2, abs=1e-6)
    assert dec[dec.row_kind == "usage"]["paid"].sum() == pytest.approx(final["gpu_hours"]["paid"] / 2, abs=1e-6)
    # under "end" an open run is not billed until it closes
    acc_end = dict(acc, contract={"id": "c", "version": "1", "period_rule": "end"})
    assert select_month([Issue(1, NOV + 24 * 86400, acc_end)], "2026-11", close) == ([], [])


def test_as_of_reproduces_a_closed_month_byte_for_byte(ledger_url, engine, runner, cli, tmp_path):
    from reports.issued import ledger_head

    r = _long_run()
    store.append(engine, [issue_entry(r, DEC + 10 * 86400 + 60)])
    nov_seq = ledger_head(engine, None)[0]
    paths = []
    for n, as_of in ((1, None), (2, nov_seq)):
        if n == 2:  # later: the run is corrected (a credit), and a new run ends in January
            fixed = dict(r, receipt_hash="sha256:fixed",
                         adjustments=[{"id": "a", "kind": "credit", "amount": -10.0, "gpu_hours": -4.0}])
            store.append(engine, [issue_entry(fixed, JAN + 3 * 86400),
                                  issue_entry(synthetic.receipt(3, tenant="x", start=DEC + 86400, hours=3),
                                              JAN + 4 * 86400)])
        for fmt in ("csv", "focus", "json"):
            out = tmp_path / f"{n}.{fmt}"
            args = ["--db", ledger_url, "export", "monthly", "--month", "2026-11", "--format", fmt,
                    "--out", str(out), "--quiet"] + (["--as-of", str(as_of)] if as_of else [])
            res = runner.invoke(cli, args)
            assert res.exit_code == 0, res.output
        paths.append(n)
    for fmt in ("csv", "focus", "json"):
        assert (tmp_path / f"1.{fmt}").read_bytes() == (tmp_path / f"2.{fmt}").read_bytes(), fmt
