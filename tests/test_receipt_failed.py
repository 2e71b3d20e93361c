"""A failed automatic receipt is not a log line: ``ipledger ship`` says so, exits 1, and the ledger records it."""

from __future__ import annotations

import json
import time

from ledger.chain import db as db_mod, store
from ledger.capture.hooks.records import entry_record, spool_line


def _spool(tmp_path, records) -> str:
    sp = tmp_path / "spool"
    sp.mkdir()
    (sp / "hook-1.jsonl").write_text("".join(spool_line(r) + "\n" for r in records))
    return str(sp)


def test_a_run_whose_receipt_fails_is_reported_recorded_and_fails_the_ship(tmp_path, runner, cli, sqlite_url):
    keys = {"cluster": "c1", "node": "n1", "source": "hook.slurm"}
    t0 = time.time() - 3600
    good = [entry_record("allocation_started", t0, {"account": "a", "gpus": 0}, job_id="1", run=0, **keys),
            entry_record("allocation_ended", t0 + 60, {"state": "COMPLETED"}, job_id="1", run=0, **keys)]
    # an end without any start: no window to price, so its receipt cannot be computed
    orphan = [entry_record("allocation_ended", t0 + 60, {"state": "COMPLETED"}, job_id="2", run=0, **keys)]
    spool = _spool(tmp_path, good + orphan)
    r = runner.invoke(cli, ["--db", sqlite_url, "ship", "--spool", spool, "--json"])
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    (err,) = report["after_errors"]
    assert err.startswith("automatic receipt for job 2 run 0 (cluster c1) failed: ") and "allocation_started" in err
    assert "ipledger: automatic receipt for job 2" in r.stderr

    eng = db_mod.make_engine(sqlite_url)
    (failed,) = list(store.iter_entries(eng, kinds=["receipt_failed"]))
    assert (failed.cluster, failed.job_id, failed.run, failed.source) == ("c1", "2", 0, "ipledger.ship")
    assert failed.entry.data["cause"] in err and "\n" not in failed.entry.data["cause"]
    issued = list(store.iter_entries(eng, kinds=["receipt_issued"]))
    assert [c.job_id for c in issued] == ["1"], "the other run's receipt is issued all the same"


def test_a_spool_cannot_claim_a_receipt_failed(tmp_path, runner, cli, sqlite_url):
    rec = {**entry_record("hook_error", time.time() - 60, {}, job_id="3"), "kind": "receipt_failed"}
    r = runner.invoke(cli, ["--db", sqlite_url, "ship", "--spool", _spool(tmp_path, [rec]), "--json",
                            "--no-receipts"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["refused_total"] == 1 and "receipt_failed" in report["refused"][0]
