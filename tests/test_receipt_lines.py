"""Flat receipt lines (``receipt_lines``): written with every issued receipt in its own transaction, split
exactly over period parts, derived once for a ledger issued before the table existed, checked by `ipledger
verify` (a line missing, extra or altered names its seq), and read by the monthly export in place of the
receipt JSON, with the same statement as the dict path."""

from __future__ import annotations

import datetime as dt
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger.chain import db as db_mod
from ledger.base import periods
from ledger.chain import receipt_lines, store
from ledger.chain.entries import Kind, make_entry
from ledger.receipts.auto import check_receipt_lines, verify_checks
from ledger.chain.verify import verify
from reports import issued_columns, issued_lines
from ledger.sim import synthetic_receipts as synthetic
from reports.export import build_statement, long_table
from tests.test_issue_cli import write_export

UTC = dt.timezone.utc
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()


def _issue_entries(receipts: list[dict], at: str = "2026-11-29T00:00:00Z") -> list:
    return [make_entry(Kind.RECEIPT_ISSUED, at, {"receipt_hash": r["receipt_hash"], "receipt": r}, cluster="hpc1",
                       job_id=r["job"]["job_id"], run=0) for r in receipts]


LINES = (check_receipt_lines,)  # synthetic receipts do not replay from telemetry; their lines are checked


def _lines(engine, kind: str = "part") -> pd.DataFrame:  # noqa: ANN001
    with engine.connect() as conn:
        return pd.read_sql_query(f"SELECT * FROM receipt_lines WHERE line_kind = '{kind}' ORDER BY seq, line_no",
                                 conn)


def test_ipledger_issue_writes_each_receipts_lines_and_verify_checks_them(tmp_path, runner, cli, monkeypatch):
    """Path B import -> `ipledger issue --all`: one part line per receipt (the receipt's own figures), none
    missing; then an attacker with the file alters, removes and adds lines, and verify names each seq."""
    monkeypatch.setenv("IPLEDGER_AUTO_RECEIPTS", "0")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    for args in (["init"], ["import", "prometheus", str(write_export(tmp_path / "export")), "--quiet",
                            "--cluster", "lab"], ["issue", "--all", "--quiet"]):
        res = runner.invoke(cli, ["--db", url, *args])
        assert res.exit_code == 0, res.output
    engine = db_mod.make_engine(url)
    issued = list(store.iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]))
    parts = _lines(engine)
    assert len(issued) == 2 and sorted(parts["seq"]) == [c.seq for c in issued]
    for ce in issued:
        r = ce.entry.data["receipt"]
        row = parts[parts["seq"] == ce.seq].iloc[0]
        assert (row["job_id"], row["tenant"], row["part_month"]) == (r["job"]["job_id"], r["job"]["account"],
                                                                    "2026-11")
        assert row["paid"] == r["gpu_hours"]["paid"] and row["cost_paid"] == r["cost"]["paid"]
    assert verify(engine, checks=verify_checks()).ok
    first, second = (c.seq for c in issued)
    with engine.begin() as conn:  # triggers dropped: the table is otherwise append-only
        for action in ("update", "delete"):
            conn.exec_driver_sql(f"DROP TRIGGER receipt_lines_no_{action}")
        conn.exec_driver_sql("UPDATE receipt_lines SET paid = paid + 1 WHERE seq = ?", (first,))
        conn.exec_driver_sql("DELETE FROM receipt_lines WHERE seq = ?", (second,))
        conn.exec_driver_sql("INSERT INTO receipt_lines (seq, line_kind, line_no, plain) VALUES (1, 'part', 0, 1)")
    res = runner.invoke(cli, ["--db", url, "verify", "--json"])
    assert res.exit_code != 0
    problems = {p["seq"]: p["reason"] for p in json.loads(res.stdout)["problems"]}
    assert "differ" in problems[first] and "missing" in problems[second] and "no receipt_issued" in problems[1]
    engine.dispose()


def test_lines_are_append_only(sqlite_url):
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _issue_entries(list(synthetic.receipts(3, "2026-11", seed=1))))
    for sql in ("UPDATE receipt_lines SET paid = 0", "DELETE FROM receipt_lines"):
        with pytest.raises(Exception, match="append-only"):
            with engine.begin() as conn:
                conn.exec_driver_sql(sql)
    engine.dispose()


@settings(max_examples=60, deadline=None)
@given(start=hs.floats(min_value=NOV - 40 * 86400, max_value=NOV + 5 * 86400),
       hours=hs.floats(min_value=0.0, max_value=24 * 70), paid=hs.floats(min_value=0, max_value=1e5),
       rule=hs.sampled_from(["split", "end"]))
def test_a_receipt_across_month_ends_has_one_line_per_month_summing_exactly(start, hours, paid, rule):
    r = synthetic.receipt(1, tenant="astro", start=round(start), hours=hours / 3600 * 3600 or 1.0)
    r["gpu_hours"]["paid"] = paid
    r["contract"]["period_rule"] = rule
    rows = [dict(zip(receipt_lines.NAMES, t)) for t in receipt_lines.lines_of(7, {"receipt": r})]
    parts = [x for x in rows if x["line_kind"] == "part"]
    s = dt.datetime.fromisoformat(r["window"]["start"]).timestamp()
    e = dt.datetime.fromisoformat(r["window"]["end"]).timestamp()
    assert [x["part_month"] for x in parts] == [m for m, _, _ in periods.part_spans(s, e, rule)]
    assert sum(round(x["paid"] * periods.NANO) for x in parts) == round(paid * periods.NANO)
    assert all(x["part_start"] < x["part_end"] or len(parts) == 1 for x in parts)
    assert [x["run_key"] is not None for x in parts] == [True] + [False] * (len(parts) - 1)
    assert len([x for x in rows if x["line_kind"] == "unknown"]) == len(r["unknown_intervals"])


def test_a_ledger_issued_before_the_table_gets_its_lines_on_upgrade(tmp_path):
    """A ledger at 0004 holding issued receipts: the upgrade derives every line once; verify is clean and the
    export reads them (the same statement as from the JSON)."""
    from alembic import command

    engine = db_mod.make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.begin() as conn:
        command.upgrade(db_mod._alembic_config(conn), "0004")
    rs = list(synthetic.receipts(40, "2026-11", seed=3))
    rs[0]["window"]["start"] = "2026-10-20T00:00:00Z"  # billed in two months
    store.append(engine, _issue_entries(rs))  # no table yet: the store writes no lines
    db_mod.upgrade(engine)
    assert len(_lines(engine)) == 41 and verify(engine, checks=LINES).ok
    store.append(engine, _issue_entries(list(synthetic.receipts(2, "2026-12", seed=4)), "2026-12-30T00:00:00Z"))
    assert len(_lines(engine)) == 43 and verify(engine, checks=LINES).ok
    got = issued_lines.read_month(engine, "2026-11")
    assert got is not None and len(got.usage.rows) == 40
    want = long_table(build_statement(engine, "2026-11", columnar=False)).to_csv()
    assert long_table(build_statement(engine, "2026-11")).to_csv() == want
    engine.dispose()


def test_plain_receipts_are_read_from_their_lines_alone(sqlite_url, monkeypatch):
    """Synthetic receipts (unknown intervals with and without resolution objects, issued once): the export
    reads no receipt JSON at all; without the ADBC reader the portable one gives the same frame."""
    engine = db_mod.make_engine(sqlite_url)
    rs = list(synthetic.receipts(300, "2026-11", seed=4))
    store.append(engine, _issue_entries(rs))
    seen: list[int] = []
    monkeypatch.setattr(issued_columns, "_rows_by_seq", lambda eng, seqs: seen.append(len(seqs)) or iter(()))
    got = issued_lines.read_month(engine, "2026-11")
    assert seen == [0] and len(got.usage.rows) == 300
    assert len(got.usage.unknowns) == sum(len(r["unknown_intervals"]) for r in rs)
    monkeypatch.setattr(issued_lines, "arrow_sqlite", lambda *a: None)
    portable = issued_lines.read_month(engine, "2026-11")
    pd.testing.assert_frame_equal(portable.usage.rows, got.usage.rows)
    pd.testing.assert_frame_equal(portable.usage.unknowns, got.usage.unknowns)
    engine.dispose()


def test_lines_that_lag_the_ledger_leave_the_export_to_the_json(sqlite_url):
    """An issue entry written without its lines (a writer that predates them): the lines do not answer, and
    sync derives the missing ones."""
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _issue_entries(list(synthetic.receipts(5, "2026-11", seed=5))))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER receipt_lines_no_delete")
        conn.exec_driver_sql("DELETE FROM receipt_lines WHERE seq = 2")
    assert issued_lines.read_month(engine, "2026-11") is None
    assert len(build_statement(engine, "2026-11").rows) == 5
    with engine.begin() as conn:
        assert receipt_lines.sync(conn) == 1
    assert issued_lines.read_month(engine, "2026-11") is not None and verify(engine, checks=LINES).ok
    engine.dispose()


def test_lines_on_each_backend_verify_and_export_as_the_dict_path(engine):
    """SQLite and the real PostgreSQL: the store writes the lines, verify re-derives them, and the export
    read from them (ADBC on SQLite, the portable reader on PostgreSQL) is the dict path's statement."""
    rs = list(synthetic.receipts(60, "2026-11", seed=6))
    rs[1]["window"]["start"] = "2026-10-30T12:00:00Z"
    rs[2]["adjustments"] = [{"id": "a", "amount": 1.5, "by": "ops"}]
    store.append(engine, _issue_entries(rs))
    assert verify(engine, checks=LINES).ok
    got = issued_lines.read_month(engine, "2026-11")
    assert got is not None and len(got.usage.rows) == 60
    want = long_table(build_statement(engine, "2026-11", columnar=False)).to_csv()
    assert long_table(build_statement(engine, "2026-11")).to_csv() == want


def test_an_issue_and_its_lines_commit_together(sqlite_url, monkeypatch):
    """Lines that cannot be written take their receipt_issued entry down with them (one transaction)."""
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _issue_entries(list(synthetic.receipts(2, "2026-11", seed=7))))

    def broken(conn, rows):  # noqa: ANN001, ANN202
        raise RuntimeError("disk full")

    monkeypatch.setattr(receipt_lines, "insert", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        store.append(engine, _issue_entries(list(synthetic.receipts(3, "2026-12", seed=8)), "2026-12-30T00:00:00Z"))
    assert store.count(engine) == 2 and verify(engine, checks=LINES).ok
    engine.dispose()


_JSON = hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.floats() | hs.text(max_size=30),
                     lambda kids: hs.lists(kids, max_size=4) | hs.dictionaries(hs.text(max_size=10), kids, max_size=5),
                     max_leaves=20)
_TIMES = hs.sampled_from(["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-13-01T00:00:00Z", "2026-11-30T23:59:59.5Z",
                          "2026-12-01T00:00:00+00:00", "", "x"])


@settings(max_examples=200, deadline=None)
@given(base=hs.integers(min_value=0, max_value=40), path=hs.sampled_from(
    ["job", "job.devices", "job.run", "job.job_id", "job.account", "gpu_hours", "gpu_hours.paid", "cost",
     "cost.adjustments", "window", "window.start", "window.end", "contract.period_rule", "billing",
     "billing.unknown_gpu_hours_by_policy", "unknown_intervals", "adjustments", "open", "receipt_hash"]),
       value=_JSON | _TIMES, top=_JSON)
def test_any_payload_gives_lines_and_never_stops_an_append(base, path, value, top):
    """Whatever an issue entry carries — a receipt with any field replaced by any JSON, or any JSON at all —
    its lines derive without an error (the append of the issue must not fail on them), deterministically,
    with exactly one line carrying the run key."""
    r = list(synthetic.receipts(base + 1, "2026-11", seed=9))[-1]
    *parents, last = path.split(".")
    node = r
    for k in parents:
        node = node.setdefault(k, {})
    node[last] = value
    for payload in ({"receipt": r}, top, {"receipt_hash": "sha256:x"}):
        rows = receipt_lines.lines_of(3, payload)
        assert rows == receipt_lines.lines_of(3, json.loads(json.dumps(payload)))
        assert sum(t[receipt_lines.NAMES.index("run_key")] is not None for t in rows) == 1
        assert len(rows) <= receipt_lines.MAX_PARTS + 100
