"""`ipledger demo` end to end (small hall): ledger verified, receipts issued, findings beside the ground truth, a
Prometheus export; then `ipledger findings` and `finding confirm|dismiss` on that ledger through the CLI."""

from __future__ import annotations

import json

from ledger.sim.score import score


# `demo` (the small demo hall, built once per session) is in tests/conftest.py: tests/test_docs_run.py runs the
# README against it too.


def test_demo_writes_everything_it_promises(demo):
    out, summary = demo
    assert summary["out"] == str(out)
    assert summary["verified"] is True
    assert summary["receipts_issued"] == summary["jobs"] and not summary["receipt_errors"]
    for key in ("ledger", "ground_truth", "findings_json", "prometheus_export"):
        assert (out / summary[key].split("/")[-1]).exists(), key
    assert list((out / "receipts").glob("receipt-*.json"))
    truth = json.loads((out / "ground-truth.json").read_text())
    found = json.loads((out / "findings.json").read_text())
    assert {"findings", "account"} <= set(found)
    assert all(s.recall == 1.0 for s in score(truth, found["findings"]).values())
    prom = json.loads((out / "prometheus-export.json").read_text())
    assert prom["status"] == "success" and prom["data"]["resultType"] == "matrix"


def test_findings_cli_lists_recorded_findings_and_verdicts(runner, cli, demo, tmp_path):
    import shutil

    shutil.copy(demo[0] / "ledger.db", tmp_path / "ledger.db")  # it records verdicts: on a copy of the session's demo
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    r = runner.invoke(cli, ["--db", url, "findings", "--no-refresh", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["findings"]
    assert rows and all(f["status"]["status"] == "open" for f in rows)
    cool = next(f for f in rows if f["kind"] == "hot_because_cooling")
    r = runner.invoke(cli, ["--db", url, "finding", "confirm", cool["id"], "--by", "alice", "--note", "CRAH fan"])
    assert r.exit_code == 0 and "confirmed by alice" in r.output
    r = runner.invoke(cli, ["--db", url, "findings", "--no-refresh", "--since", "2026-11-01", "--json"])
    st = {f["id"]: f["status"] for f in json.loads(r.output)["findings"]}
    assert st[cool["id"]]["status"] == "confirmed" and st[cool["id"]]["by"] == "alice"
    r = runner.invoke(cli, ["--db", url, "finding", "dismiss", "Fdoesnotexist", "--by", "bob"])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(cli, ["--db", url, "findings", "--since", "yesterday-ish"])
    assert r.exit_code == 1 and "--since" in r.output
    r = runner.invoke(cli, ["--db", url, "verify"])
    assert r.exit_code == 0, r.output


def test_findings_refresh_records_nothing_new_on_an_unchanged_ledger(runner, cli, demo):
    """The demo already recorded its findings; a refresh finds the same ids and appends no new entries."""
    out, summary = demo
    url = f"sqlite:///{out / 'ledger.db'}"
    before = json.loads((out / "findings.json").read_text())["findings"]
    r = runner.invoke(cli, ["--db", url, "findings", "--json"])
    assert r.exit_code == 0, r.output
    assert sorted(f["id"] for f in json.loads(r.output)["findings"]) == sorted(f["id"] for f in before)
    from ledger import db as db_mod
    from ledger.store import head
    eng = db_mod.make_engine(url)
    with eng.connect() as conn:
        seq_before = head(conn)[0]
    eng.dispose()
    text = runner.invoke(cli, ["--db", url, "findings"])
    assert "hot_because_cooling" in text.output and "could run (not run)" in text.output
    eng = db_mod.make_engine(url)
    with eng.connect() as conn:
        assert head(conn)[0] == seq_before
    eng.dispose()


def test_help_has_examples(runner, cli):
    for cmd in (["demo"], ["findings"], ["finding"], ["finding", "confirm"], ["finding", "dismiss"], ["explain"],
                ["ask"], ["analyze"]):
        r = runner.invoke(cli, [*cmd, "--help"])
        assert r.exit_code == 0 and "Example:" in r.output, cmd


def test_demo_statement_passes_the_focus_validator(demo):
    """The FinOps Foundation's focus-validator (FOCUS 1.2) finds no failure in the demo's statement."""
    from tests.focus_validator import Unavailable, validate
    from tests.services import unavailable

    out, _ = demo
    try:
        v = validate(out / "statement-2026-11.focus.csv")
    except Unavailable as exc:
        unavailable(str(exc))
    assert v.failed == [], v.summary()
    assert len(v.passed) >= 130 and "InvoiceId-C-000-O" in v.passed, v.summary()


def test_a_requeued_jobs_later_run_says_how_it_itself_ended(runner, cli, demo):
    """`receipt JOB --run R` of a run the simulator requeued (its allocation_requeued names the previous run)
    says the end state of the run's own allocation_ended (the demo's 400389 run 1: COMPLETED, not REQUEUED)."""
    from ledger import db as db_mod
    from ledger.entries import Kind
    from ledger.store import iter_entries

    out, _ = demo
    url = f"sqlite:///{out / 'ledger.db'}"
    eng = db_mod.make_engine(url)
    ends, requeues = {}, []
    for ce in iter_entries(eng, kinds=[Kind.ALLOCATION_ENDED, Kind.ALLOCATION_REQUEUED]):
        key = (ce.entry.job_id, ce.entry.run or 0)
        if ce.entry.kind == Kind.ALLOCATION_ENDED:
            ends[key] = ce.entry.data["state"]
        else:
            requeues.append(key)
    eng.dispose()
    assert requeues
    completed = [k for k in requeues if ends.get(k) == "COMPLETED"][:2]
    assert completed, "the demo has a requeued job whose rerun completed"
    for job, run in completed:
        r = runner.invoke(cli, ["--db", url, "receipt", job, "--run", str(run)])
        assert r.exit_code == 0, r.output
        assert "Progress  end state COMPLETED;" in r.output and "lost since last checkpoint" not in r.output
        assert "REQUEUED" not in r.output


