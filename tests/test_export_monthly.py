"""Monthly tenant export: totals reconcile to the issued receipts, on both ledger backends and through the CLI;
empty months, unknown tenants, corrections after close, --as-of reproducibility, Parquet read-back."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections import defaultdict

import duckdb
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from reports import monthly
from ledger.sim import synthetic_receipts as synthetic
from reports.export import long_table, statement_from_issues
from reports.issued import Issue, IssuedSet, select_month
from ledger.base.progressbar import Progress

NOV = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc).timestamp()
OCT = dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc).timestamp()


def issue_entry(r: dict, issued_at: float, embed: bool = True):
    j = r["job"]
    payload = {"receipt_hash": r["receipt_hash"], "through_seq": r["ledger"]["through_seq"],
               "issued_at": dt.datetime.fromtimestamp(issued_at, tz=dt.timezone.utc).isoformat()}
    if embed:
        payload["receipt"] = r
    return make_entry(Kind.RECEIPT_ISSUED, issued_at, payload, cluster=j["cluster"], job_id=j["job_id"],
                      run=j["run"])


def per_tenant(receipts: list[dict]) -> dict[str, dict[str, float]]:
    out: dict = defaultdict(lambda: defaultdict(float))
    for r in receipts:
        t = out[r["job"]["account"]]
        t["paid"] += r["gpu_hours"]["paid"]
        t["delivered"] += r["gpu_hours"]["delivered"]
        t["billed"] += r["cost"]["paid"] + sum(a.get("amount", 0.0) for a in r["adjustments"])
        t["runs"] += 1
    return out


def nov_receipts(n: int = 40) -> list[dict]:
    rs = list(synthetic.receipts(n, "2026-11", seed=3))
    rs[0]["adjustments"] = [{"id": "adj-1", "kind": "credit", "amount": -12.5, "gpu_hours": -5.0,
                             "reason": "unknown interval credited", "by": "ops-bob"}]
    return rs


# --- pure core ------------------------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=hs.integers(min_value=0, max_value=60), seed=hs.integers(min_value=0, max_value=10_000))
def test_summary_per_tenant_equals_sum_of_receipts(n, seed):
    rs = list(synthetic.receipts(n, "2026-11", seed=seed))
    rows = monthly.monthly_rows(rs, "2026-11")
    assert len(rows) == n  # every synthetic window ends in the month
    s = monthly.summarise(rows)
    want = per_tenant(rs)
    assert set(s.by_tenant["tenant"]) == set(want)
    for r in s.by_tenant.itertuples():
        assert r.runs == want[r.tenant]["runs"]
        assert r.paid == pytest.approx(want[r.tenant]["paid"], abs=1e-6)
        assert monthly.cents(r.billed) == monthly.cents(want[r.tenant]["billed"])
        # the identity carries over to the sums: paid = delivered + every loss bucket
        losses = sum(getattr(r, b) for b in monthly.LOSS_BUCKETS)
        assert r.paid == pytest.approx(r.delivered + losses, abs=1e-4)
        assert r.unknown == pytest.approx(r.unknown_resolved + r.unknown_pending, abs=1e-9)
    # the hour-of-day profile redistributes hours, it never creates or loses any
    hp = s.by_hour.groupby("tenant")[["paid", "delivered"]].sum()
    for tenant, w in want.items():
        assert hp.loc[tenant, "paid"] == pytest.approx(w["paid"], rel=1e-9, abs=1e-6)
        assert hp.loc[tenant, "delivered"] == pytest.approx(w["delivered"], rel=1e-9, abs=1e-6)


@given(start=hs.floats(min_value=NOV, max_value=NOV + 20 * 86400), hours=hs.floats(min_value=0.01, max_value=90))
@settings(max_examples=50, deadline=None)
def test_hour_profile_follows_window_overlap(start, hours):
    r = synthetic.receipt(7, tenant="t", start=start, hours=hours, n_devices=1)
    rows = monthly.flatten([r]).rows
    prof = monthly.hour_profile(rows).set_index("hour")["paid"]
    # brute force: the share of the window in each hour of the day, minute by minute
    s, e = monthly.epoch(r["window"]["start"]), monthly.epoch(r["window"]["end"])
    edges = pd.date_range(pd.Timestamp(s, unit="s", tz="UTC").floor("h"), pd.Timestamp(e, unit="s", tz="UTC"),
                          freq="h")
    want = defaultdict(float)
    for a in edges:
        lo, hi = max(a.timestamp(), s), min(a.timestamp() + 3600, e)
        if hi > lo:
            want[a.hour] += (hi - lo) / (e - s) * r["gpu_hours"]["paid"]
    for h in range(24):
        assert prof[h] == pytest.approx(want[h], abs=1e-6)


def test_month_bounds_and_bad_month():
    assert monthly.month_bounds("2026-12")[1].year == 2027
    for bad in ("2026-13", "26-11", "2026/11", ""):
        with pytest.raises(monthly.ExportError):
            monthly.month_bounds(bad)


def test_corrections_after_close_are_deltas_and_never_change_the_closed_month():
    first = synthetic.receipt(5, tenant="astro", start=OCT + 3 * 86400, hours=10, rate=2.0,
                              shares={"unknown": 0.1}, unknown_resolved=False)
    fixed = json.loads(json.dumps(first))
    fixed["receipt_hash"] = "sha256:reissued"
    fixed["unknown_intervals"][0]["resolution"] = {"resolution": "credit"}
    fixed["adjustments"] = [{"id": "a1", "kind": "credit", "amount": -4.0, "gpu_hours": -2.0, "reason": "gap"}]
    same_month = dict(first, receipt_hash="sha256:same-month")
    issues = [Issue(1, OCT + 4 * 86400, first), Issue(2, OCT + 5 * 86400, same_month),
              Issue(3, NOV + 2 * 86400, fixed)]
    usage_oct, corr_oct = select_month(issues, "2026-10")
    assert [i.seq for i in usage_oct] == [2] and corr_oct == []  # a re-issue before close replaces
    usage_nov, corr_nov = select_month(issues, "2026-11")
    assert usage_nov == [] and [(c.new.seq, c.old.seq) for c in corr_nov] == [(3, 2)]
    st = statement_from_issues(IssuedSet(issues, 3, "h" * 64), "2026-11")
    row = st.rows.iloc[0]
    assert row.row_kind == "correction" and row.adjustment_cost == -4.0 and row.paid == 0.0
    assert row.unknown_resolved == pytest.approx(first["gpu_hours"]["unknown"])
    # October billed + November's correction = the latest receipt, to the cent
    oct_st = statement_from_issues(IssuedSet(issues, 3, "h" * 64), "2026-10")
    total = oct_st.summary.totals["billed"] + st.summary.totals["billed"]
    assert monthly.cents(total) == monthly.cents(fixed["cost"]["paid"] - 4.0)
    # a late first issue (after close) is billed in its own month, once
    late = [Issue(9, DEC + 86400, first)]
    assert [i.seq for i in select_month(late, "2026-10")[0]] == [9]
    assert select_month(late, "2026-12") == ([], [])


def test_progress_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    plain, tty, quiet = io.StringIO(), Tty(), Tty()
    for stream, q in ((plain, False), (tty, False), (quiet, True)):
        p = Progress("export", stream=stream, quiet=q, min_interval=0)
        p(5, 10)
        p(10, 10)
        p.close()
    assert plain.getvalue() == "" and quiet.getvalue() == ""
    assert "10/10" in tty.getvalue() and tty.getvalue().endswith("\n")


# --- ledger and CLI -----------------------------------------------------------------------------------------------

def test_export_reconciles_to_issued_receipts_on_each_backend(engine, ledger_url, runner, cli, tmp_path):
    rs = nov_receipts()
    store.append(engine, [issue_entry(r, NOV + 28 * 86400) for r in rs])
    seq, head = _head(engine)  # the export then records itself (statement_exported) after this head
    out = tmp_path / "nov.csv"
    res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2026-11", "--out", str(out),
                              "--quiet"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    want = per_tenant(rs)
    tenants = df[df.level == "tenant"].set_index("tenant")
    assert set(tenants.index) == set(want)
    for t, w in want.items():
        assert tenants.loc[t, "billed"] == pytest.approx(monthly.cents(w["billed"]), abs=0.001)
        assert tenants.loc[t, "paid"] == pytest.approx(w["paid"], abs=1e-5)
        assert tenants.loc[t, "runs"] == w["runs"]
    run_rows = df[df.level == "run"]
    assert len(run_rows) == len(rs)
    # the run rows reconcile the tenant rows inside the file itself
    assert run_rows.groupby("tenant")["billed"].sum().round(2).to_dict() == tenants["billed"].round(2).to_dict()
    assert set(df["head_hash"]) == {head} and set(df["through_seq"]) == {seq}
    (last,) = list(store.iter_entries(engine, kinds=[Kind.STATEMENT_EXPORTED]))  # the export recorded itself
    assert last.seq == seq + 1 and last.entry.data == {"month": "2026-11", "tenant": None, "format": "csv",
                                                      "through_seq": seq, "head_hash": head}
    # JSON to stdout carries the same totals
    res = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2026-11", "--format", "json",
                              "--out", "-", "--quiet"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    assert j["ledger"] == {"through_seq": seq, "head_hash": head}
    assert j["totals"]["billed"] == monthly.cents(sum(w["billed"] for w in want.values()))
    assert j["adjustments"][0]["amount"] == -12.5
    # the same statement again (another format) is the same cut: recorded once
    assert len(list(store.iter_entries(engine, kinds=[Kind.STATEMENT_EXPORTED]))) == 1


def _head(engine):
    from reports.issued import ledger_head

    return ledger_head(engine, None)


def test_as_of_reproduces_a_closed_month(sqlite_url, runner, cli, tmp_path):
    from ledger.chain import db as db_mod

    eng = db_mod.make_engine(sqlite_url)
    r = synthetic.receipt(11, tenant="bio", start=OCT + 86400, hours=4, rate=3.0)
    store.append(eng, [issue_entry(r, OCT + 2 * 86400)])
    seq_close = _head(eng)[0]
    args = ["--db", sqlite_url, "export", "monthly", "--month", "2026-10", "--format", "json", "--out", "-",
            "--quiet"]
    before = json.loads(runner.invoke(cli, args).output)
    r2 = json.loads(json.dumps(r))
    r2["receipt_hash"] = "sha256:changed"
    r2["cost"]["paid"] = 1.0
    store.append(eng, [issue_entry(r2, NOV + 3 * 86400)])
    after = json.loads(runner.invoke(cli, args).output)
    as_of = json.loads(runner.invoke(cli, args + ["--as-of", str(seq_close)]).output)
    assert as_of == before  # byte-for-byte the export made at close
    assert after["totals"]["billed"] == before["totals"]["billed"]  # no silent change to the closed month
    nov = json.loads(runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11",
                                         "--format", "json", "--out", "-", "--quiet"]).output)
    assert nov["totals"]["corrections"] == 1
    assert nov["totals"]["billed"] == monthly.cents(1.0 - r["cost"]["paid"])
    eng.dispose()


def test_hash_only_issues_are_recomputed_from_the_ledger(sqlite_url, runner, cli):
    from ledger.chain import db as db_mod
    from ledger.receipts import build_receipt

    eng = db_mod.make_engine(sqlite_url)
    start = dt.datetime(2026, 11, 3, 8, tzinfo=dt.timezone.utc)
    key = dict(cluster="hpc1", job_id="77", run=0, node="gpu-a01")
    store.append(eng, [
        make_entry(Kind.ALLOCATION_STARTED, start, {"account": "astro", "partition": "gpu", "qos": "normal"}, **key),
        make_entry(Kind.DEVICE_BOUND, start, {"index": 0, "sku": "H100-SXM5-80GB"}, device="GPU-a", **key),
        make_entry(Kind.ALLOCATION_ENDED, start + dt.timedelta(hours=3), {"exit_code": 0}, **key)])
    r = build_receipt(list(store.iter_entries(eng)), "77", 0)
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, start + dt.timedelta(hours=4),
                                  {"receipt_hash": r["receipt_hash"], "through_seq": r["ledger"]["through_seq"]},
                                  cluster="hpc1", job_id="77", run=0)])
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "json",
                              "--out", "-", "--quiet"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    assert j["totals"]["runs"] == 1 and j["totals"]["paid"] == pytest.approx(r["gpu_hours"]["paid"])
    assert not any("did not replay" in n for n in j["notes"])
    eng.dispose()


def test_empty_month_exits_0_and_says_so(sqlite_url, runner, cli, tmp_path):
    for fmt in ("csv", "json", "focus", "pdf", "parquet"):
        out = tmp_path / f"empty.{fmt}"
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-09", "--format", fmt,
                                  "--out", str(out), "--quiet"])
        assert res.exit_code == 0, res.output
        assert out.stat().st_size > 0
        assert "empty" in res.output
    j = json.loads((tmp_path / "empty.json").read_text())
    assert j["empty"] is True and j["totals"]["runs"] == 0 and "empty" in j["notes"][0]


def test_unknown_tenant_and_bad_month_are_one_line_errors(sqlite_url, runner, cli):
    from ledger.chain import db as db_mod

    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 28 * 86400) for r in nov_receipts(4)])
    eng.dispose()
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--tenant", "nobody"])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and "nobody" in res.output and "astro" in res.output
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-13"])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "YYYY-MM" in res.output
    # a known tenant with no runs in the month is an empty statement, not an error
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-08", "--tenant", "astro",
                              "--format", "json", "--out", "-", "--quiet"])
    assert res.exit_code == 0 and json.loads(res.output)["empty"] is True


def test_tenant_filter_keeps_only_that_tenant(sqlite_url, runner, cli):
    from ledger.chain import db as db_mod

    rs = nov_receipts(12)
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 28 * 86400) for r in rs])
    eng.dispose()
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--tenant", "bio",
                              "--format", "json", "--out", "-", "--quiet"])
    j = json.loads(res.output)
    assert [t["tenant"] for t in j["tenants"]] == ["bio"]
    assert j["totals"]["billed"] == monthly.cents(per_tenant(rs)["bio"]["billed"])


def test_parquet_reads_back_identically_with_pandas_and_duckdb(tmp_path):
    rs = nov_receipts(30)
    st = statement_from_issues(IssuedSet([Issue(i + 1, NOV + 28 * 86400, r) for i, r in enumerate(rs)], 30,
                                         "a" * 64), "2026-11")
    from reports.export import write

    p = write(st, "parquet", tmp_path / "s.parquet")
    via_pandas = pd.read_parquet(p)
    via_duckdb = duckdb.sql(f"SELECT * FROM read_parquet('{p}')").df()
    assert list(via_pandas.columns) == list(via_duckdb.columns)
    assert len(via_pandas) == len(via_duckdb) == len(long_table(st))
    for c in via_pandas.columns:
        a, b = via_pandas[c], via_duckdb[c]
        if a.dtype.kind in "fi" or b.dtype.kind in "fi":
            assert pd.to_numeric(a).fillna(-1).tolist() == pd.to_numeric(b).fillna(-1).tolist(), c
        else:
            assert a.astype(str).tolist() == b.astype(str).tolist(), c
    tot = duckdb.sql(f"SELECT SUM(billed) FROM read_parquet('{p}') WHERE level = 'run'").fetchall()[0][0]
    assert round(tot, 2) == monthly.cents(sum(w["billed"] for w in per_tenant(rs).values()))


def test_export_help_has_example(runner, cli):
    for args in (["export", "--help"], ["export", "monthly", "--help"]):
        res = runner.invoke(cli, args)
        assert res.exit_code == 0 and "Example:" in res.output


def test_a_month_closes_on_ledger_event_time_not_the_wall_clock(sqlite_url, runner, cli):
    """Re-issue entries carry the run's window end as ts (as the receipts package writes them); October closes
    when the ledger first records a November fact, so the re-issue after that is a November correction."""
    from ledger.chain import db as db_mod

    eng = db_mod.make_engine(sqlite_url)
    r = synthetic.receipt(21, tenant="vision", start=OCT + 86400, hours=3, rate=4.0)
    end = monthly.epoch(r["window"]["end"])
    store.append(eng, [issue_entry(r, end)])
    r_same = dict(r, receipt_hash="sha256:before-close", cost=dict(r["cost"], paid=10.0))
    store.append(eng, [issue_entry(r_same, end + 60)])  # still October: replaces the first issue
    store.append(eng, [make_entry(Kind.ALLOCATION_STARTED, NOV + 3600, {"account": "bio"}, cluster="hpc1",
                                  job_id="22", run=0)])
    r_late = dict(r, receipt_hash="sha256:after-close", cost=dict(r["cost"], paid=7.0))
    store.append(eng, [issue_entry(r_late, end + 120)])  # entry ts in October, recorded after the close
    eng.dispose()

    def billed(month):
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", month, "--format", "json",
                                  "--out", "-", "--quiet"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)["totals"]

    assert billed("2026-10")["billed"] == 10.0
    nov = billed("2026-11")
    assert nov["corrections"] == 1 and nov["billed"] == -3.0


@settings(max_examples=15, deadline=None)
@given(seed=hs.integers(min_value=0, max_value=10_000), n=hs.integers(min_value=1, max_value=40))
def test_one_scan_summary_equals_direct_aggregation(seed, n):
    """summarise() derives everything from one DuckDB scan; it must equal the direct computations."""
    rows = monthly.flatten(list(synthetic.receipts(n, "2026-11", seed=seed))).rows
    rows.loc[0, "window_end"] = rows.loc[0, "window_start"]  # a zero-length window
    s = monthly.summarise(rows)
    direct = monthly.hour_profile(rows).set_index(["tenant", "currency", "hour"]).sort_index()
    scan = s.by_hour.set_index(["tenant", "currency", "hour"]).sort_index()
    assert list(scan.index) == list(direct.index)
    for c in ("paid", "delivered"):
        assert scan[c].to_numpy() == pytest.approx(direct[c].to_numpy(), rel=1e-9, abs=1e-6)
    agg = monthly.aggregate(rows, ["tenant", "partition", "qos", "currency"])
    assert agg[["tenant", "partition", "qos", "currency", "runs"]].values.tolist() == \
        s.by_class[["tenant", "partition", "qos", "currency", "runs"]].values.tolist()
    assert agg["billed"].to_numpy() == pytest.approx(s.by_class["billed"].to_numpy(), abs=1e-6)
    assert s.totals["paid"] == pytest.approx(rows["paid"].sum())
