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
    # the receipts' carbon blocks replay under the demo site's intensity file (site.toml beside the ledger)
    r = runner.invoke(cli, ["--config", str(demo[0] / "site.toml"), "--db", url, "verify"])
    assert r.exit_code == 0, r.output


def test_findings_refresh_records_nothing_new_on_an_unchanged_ledger(runner, cli, demo):
    """The demo already recorded its findings; a refresh finds the same ids and appends no new entries."""
    out, summary = demo
    url = f"sqlite:///{out / 'ledger.db'}"
    before = json.loads((out / "findings.json").read_text())["findings"]
    r = runner.invoke(cli, ["--db", url, "findings", "--json"])
    assert r.exit_code == 0, r.output
    assert sorted(f["id"] for f in json.loads(r.output)["findings"]) == sorted(f["id"] for f in before)
    from ledger.chain import db as db_mod
    from ledger.chain.store import head
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
    from ledger.chain import db as db_mod
    from ledger.chain.entries import Kind
    from ledger.chain.store import iter_entries

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




def test_demo_receipt_prints_kwh_energy_cost_and_carbon_and_replays(runner, cli, demo):
    """A run on the demo hall: its receipt (1.4) prints measured kWh, the energy cost with TDP pricing beside it
    and kg CO2e under the demo site's illustrative DE intensity file; replaying it gives the issued hash; the
    demo statement's tenant kWh sum to the hall's."""
    import csv
    import re

    out, summary = demo
    site = summary["site_config"]
    assert "illustrative" in (out / "site.toml").read_text() and (out / "carbon-intensity-DE-2026-11.csv").exists()
    body = json.loads(sorted((out / "receipts").glob("receipt-*.json"))[0].read_text())
    job, run = body["job"]["job_id"], str(body["job"]["run"])
    base = ["--config", site, "--db", f"sqlite:///{summary['ledger']}"]
    res = runner.invoke(cli, [*base, "receipt", job, "--run", run])
    assert res.exit_code == 0, res.output
    e, c = body["energy"], body["carbon"]
    assert body["receipt_version"] == "1.4" and e["kwh"] > 0 and c["kg_co2e"] > 0
    assert e["cost"]["basis"] == "measured" and float(e["cost"]["tdp"]) > float(e["cost"]["measured"]) > 0
    assert re.search(rf"^Energy: {e['kwh']:.3f} kWh measured", res.output, re.M), res.output
    assert (f"Energy cost (measured): {e['cost']['charged']} USD   [measured {e['cost']['measured']}, "
            f"TDP pricing {e['cost']['tdp']}]") in res.output
    assert f"Carbon: {c['kg_co2e']:.3f} kg CO2e (zone DE, electricitymaps:lca {c['intensity_version']}" in res.output
    v = runner.invoke(cli, [*base, "receipt", job, "--run", run, "--verify"])
    assert v.exit_code == 0 and v.output.startswith("OK") and body["receipt_hash"] in v.output, v.output
    assert v.output.count(body["receipt_hash"]) == 2   # issued and recomputed
    rows = list(csv.DictReader((out / "statement-2026-11.csv").open(encoding="utf-8")))
    total = next(float(r["kwh"]) for r in rows if r["level"] == "total")
    tenants = [float(r["kwh"]) for r in rows if r["level"] == "tenant"]
    runs = [float(r["kwh"]) for r in rows if r["level"] == "run"]
    assert total > 0 and len(tenants) == 5
    assert abs(sum(tenants) - total) <= 1e-5 and abs(sum(runs) - total) <= 1e-4
