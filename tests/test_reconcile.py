"""`ipledger reconcile`: runs whose epilog never ran are closed from the scheduler's record, once."""

from __future__ import annotations

import json
import time

from ledger.chain import store
from ledger.chain import db as db_mod
from ledger.chain.canonical import format_ts, ts_to_epoch
from ledger.capture.hooks import run
from tests.standins import make_site
from tests.test_hooks import env, record


def test_reconcile_closes_only_finished_runs(tmp_path, ledger_url, runner, cli):
    site = make_site(tmp_path, tools=("nvidia-smi", "scontrol"))
    t0 = int(time.time())  # the prologs' own clock is the runs' start (they ask no Slurm command)
    for job in ("1", "2", "3", "4", "5"):
        assert run("prolog", env(job), str(site.config)) == 0
    time.sleep(1.1)
    next_start = int(time.time())
    # Job 5 ran its epilog normally.
    site.scontrol_record("5", record("5", state="COMPLETING", start=t0, end=t0 + 60, run_time="00:01:00"))
    assert run("epilog", env("5"), str(site.config)) == 0
    site.scontrol_record("1", record("1", state="COMPLETED", start=t0, end=t0 + 100, run_time="00:01:40"))
    (site.state / "scontrol" / "2.txt").unlink(missing_ok=True)  # job 2 is gone from slurmctld (and there is no sacct)
    site.scontrol_record("3", record("3", state="RUNNING", start=t0))
    site.scontrol_record("4", record("4", state="PENDING", restarts=1, start=next_start))  # requeued

    before = time.time()
    r = runner.invoke(cli, ["--db", ledger_url, "--config", str(site.config), "reconcile", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    closed = {c["job_id"]: c for c in rep["closed"]}
    assert set(closed) == {"1", "2", "4"} and rep["still_running"] == ["3.0"] and rep["open_runs"] == 4
    assert closed["1"]["state"] == "COMPLETED" and closed["1"]["end_source"] == "scontrol.EndTime"
    assert closed["2"]["state"] == "UNKNOWN" and closed["2"]["end_source"] == "now"
    assert closed["4"]["state"] == "REQUEUED" and closed["4"]["end_source"] == "scontrol.next_run_start"

    engine = db_mod.make_engine(ledger_url)
    try:
        def entries(job):
            return [c.entry for c in store.iter_entries(engine, job_id=job)]

        e1 = entries("1")
        (end,) = [e for e in e1 if e.kind == "allocation_ended"]
        assert end.ts == format_ts(t0 + 100) and end.data["cause"] == "epilog_missing"
        gaps = [e for e in e1 if e.kind == "unknown_interval"]
        bound = {e.device for e in e1 if e.kind == "device_bound"}
        assert {g.device for g in gaps} == bound and len(bound) == 2
        (start,) = [e for e in e1 if e.kind == "allocation_started"]
        assert all(g.data["cause"] == "epilog_missing" and (g.ts, g.ts_end) == (start.ts, end.ts) for g in gaps)
        (end2,) = [e for e in entries("2") if e.kind == "allocation_ended"]
        assert before - 5 <= ts_to_epoch(end2.ts) <= time.time() + 5
        assert not [e for e in entries("3") if e.kind == "allocation_ended"]
        assert not [e for e in entries("5") if e.kind == "unknown_interval"]
        n = store.count(engine)
    finally:
        engine.dispose()

    again = runner.invoke(cli, ["--db", ledger_url, "--config", str(site.config), "reconcile", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["closed"] == []
    engine = db_mod.make_engine(ledger_url)
    try:
        assert store.count(engine) == n
    finally:
        engine.dispose()


def test_reconcile_dry_run_appends_nothing_and_scheduler_errors_exit_1(tmp_path, sqlite_url, runner, cli):
    site = make_site(tmp_path, tools=("nvidia-smi", "scontrol"))
    assert run("prolog", env("7"), str(site.config)) == 0
    site.scontrol_record("7", record("7", state="CANCELLED", start=int(time.time()) - 60, end=int(time.time()) + 1))
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(site.config), "reconcile", "--dry-run", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["appended"] == 0
    assert [c["state"] for c in json.loads(r.output)["closed"]] == ["CANCELLED"]
    # scontrol that cannot reach slurmctld: an error naming the job, exit 1, nothing closed.
    (site.bin / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm "
                                       "controller (connect failure)' >&2\nexit 1\n")
    r = runner.invoke(cli, ["--db", sqlite_url, "--config", str(site.config), "reconcile"])
    assert r.exit_code == 1 and "job 7: scontrol failed" in r.output


def test_open_runs_are_per_node():
    from ledger.chain.entries import ChainedEntry, make_entry
    from ledger.cli.reconcile import open_runs

    def ce(i, kind, node, device=None):
        e = make_entry(kind, 1_800_000_000 + i, {}, cluster="c", job_id="9", run=0, node=node, device=device)
        return ChainedEntry(seq=i, entry=e, prev_hash="", hash="")

    es = [ce(1, "allocation_started", "a"), ce(2, "device_bound", "a", "GPU-a"),
          ce(3, "allocation_started", "b"), ce(4, "device_bound", "b", "GPU-b"),
          ce(5, "allocation_ended", "a")]
    (r,) = open_runs(es)
    assert (r.node, r.devices) == ("b", ["GPU-b"])  # node a's epilog ran; only node b's part is open


def test_job_level_entries_neither_open_nor_close_a_node_run():
    """The controller's hooks and the accounting database say the job ended, not that a node's epilog recorded
    what it measured: a node whose epilog was lost stays open for reconcile, and the job-level start is not
    a run of its own to close."""
    from ledger.chain.entries import ChainedEntry, make_entry
    from ledger.cli.reconcile import open_runs

    def ce(i, kind, node, source):
        e = make_entry(kind, 1_800_000_000 + i, {}, cluster="c", job_id="9", run=0, node=node, source=source)
        return ChainedEntry(seq=i, entry=e, prev_hash="", hash="")

    es = [ce(1, "allocation_started", None, "hook.slurmctld"), ce(2, "allocation_started", "a", "hook.slurm"),
          ce(3, "allocation_ended", None, "hook.slurmctld"), ce(4, "allocation_ended", None, "sacct")]
    (r,) = open_runs(es)
    assert r.node == "a"
