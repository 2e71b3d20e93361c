"""Ship-time accounting (ledger.ingest.sacct): what the hooks' environment lacks, from sacct, in batches.

The stand-in ``sacct`` (tests/standins/sacct) answers in the parsable format and counts its calls; the real one
against a real slurmdbd is exercised in tests/test_slurm_e2e.py.
"""

from __future__ import annotations

import json
import time

import pytest

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.canonical import ts_to_epoch
from ledger.ingest import sacct as accounting
from ledger.capture.hooks.records import entry_record, spool_line
from tests.standins import make_site

T0 = int(time.time()) - 7200  # whole seconds, as sacct prints them; within the lookback


def slurm_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def sacct_line(job: str, state: str = "COMPLETED", start: float = T0, end: float = T0 + 60, exit_code: str = "0:0",
               suspended: str = "00:00:00", qos: str = "normal") -> str:
    elapsed = int(end - start)
    return "|".join([job, state, exit_code, "0:0", slurm_time(start), slurm_time(end), str(elapsed), suspended, qos,
                     "billing=1,cpu=1,gres/gpu=2,mem=1000M,node=1", "60", "tenant", "gpu", "node1"])


def node_run(job: str, run: int = 0, start: float = T0, end: float = T0 + 60, state: str = "COMPLETED") -> list[dict]:
    keys = {"cluster": "c1", "job_id": job, "run": run, "node": "node1", "source": "hook.slurm",
            "source_version": "test"}
    return [entry_record("allocation_started", start, {"account": "tenant", "partition": "gpu", "gpus": 1}, **keys),
            entry_record("device_bound", start, {"index": 0, "uuid": f"GPU-{job}-{run}"}, device=f"GPU-{job}-{run}",
                         **keys),
            entry_record("allocation_ended", end, {"state": state, "state_basis": "environment"}, **keys)]


@pytest.fixture
def site(tmp_path):
    s = make_site(tmp_path, tools=("sacct",))
    with open(s.config, "a") as f:
        f.write('[accounting]\nbatch = 400\n')
    return s


def ship(runner, cli, site, db, *extra):
    return runner.invoke(cli, ["--db", db, "--config", str(site.config), "ship", "--spool", str(site.spool),
                               "--json", *extra])


def entries(db, job):
    eng = db_mod.make_engine(db)
    try:
        return [c.entry for c in store.iter_entries(eng, job_id=job)]
    finally:
        eng.dispose()


def test_parse_reads_every_field_and_skips_what_is_not_a_record():
    text = "\n".join([sacct_line("7", "CANCELLED by 0", exit_code="0:15", suspended="00:00:03"),
                      "garbage", "8|RUNNING", ""])
    (r,) = accounting.parse(text)
    assert (r.job_id, r.state, r.exit_code, r.signal, r.suspended_s, r.qos) == ("7", "CANCELLED", 0, 15, 3.0, "normal")
    assert (r.start, r.end, r.elapsed_s, r.time_limit_s) == (T0, T0 + 60, 60, 3600)
    assert r.tres.startswith("billing=1") and (r.account, r.partition, r.nodes) == ("tenant", "gpu", "node1")


def test_requeued_job_runs_in_start_order():
    recs = accounting.parse("\n".join([sacct_line("5", "COMPLETED", start=T0 + 100, end=T0 + 160),
                                       sacct_line("5", "REQUEUED", start=T0, end=T0 + 30)]))
    runs = accounting.runs_of(recs)
    assert runs[("5", 0)].state == "REQUEUED" and runs[("5", 1)].state == "COMPLETED"


def test_a_thousand_runs_cost_one_accounting_query_per_batch(site, sqlite_url, runner, cli):
    """1,000 runs end in one shipment: sacct is asked once per batch of 400 (3 calls), never per run."""
    n = 1000
    recs = []
    for i in range(n):
        job = str(1000 + i)
        recs += node_run(job)
        site.sacct_record(job, [sacct_line(job, "TIMEOUT" if i % 10 == 0 else "COMPLETED")])
    spool.write_records(site.spool, recs, prefix="hook", encode=spool_line)
    assert runner.invoke(cli, ["--db", sqlite_url, "init"]).exit_code == 0
    r = ship(runner, cli, site, sqlite_url, "--no-receipts")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["accounting"]["calls"] == 3 == len(site.sacct_calls())
    assert rep["accounting"]["recorded"] == n and rep["accounting"]["still_pending_count"] == 0
    assert all(len(c[c.index("-j") + 1].split(",")) <= 400 for c in site.sacct_calls())
    eng = db_mod.make_engine(sqlite_url)
    try:
        ends = [c.entry for c in store.iter_entries(eng, kinds=["allocation_ended"]) if c.entry.source == "sacct"]
    finally:
        eng.dispose()
    assert len(ends) == n and all(e.node is None and e.data["state_basis"] == "sacct" for e in ends)
    assert sum(e.data["state"] == "TIMEOUT" for e in ends) == n // 10
    # A second shipment has nothing pending: no call at all.
    again = json.loads(ship(runner, cli, site, sqlite_url, "--no-receipts").output)
    assert again["accounting"]["pending"] == 0 and again["accounting"]["calls"] == 0 and len(site.sacct_calls()) == 3


def test_accounting_database_down_nothing_lost_retried_and_the_receipt_says_pending(site, ledger_url, runner, cli):
    start = time.time() - 120
    spool.write_records(site.spool, node_run("42", start=start, end=start + 60, state="SIGNALED"), prefix="hook",
                        encode=spool_line)
    site.sacct_record("42", [sacct_line("42", "CANCELLED by 0", start=int(start), end=int(start) + 60,
                                        exit_code="0:15", suspended="00:00:07", qos="high")])
    site.control(sacct_down=True)
    assert runner.invoke(cli, ["--db", ledger_url, "init"]).exit_code == 0
    r = ship(runner, cli, site, ledger_url)
    assert r.exit_code == 0, r.output  # the node's entries are shipped all the same
    rep = json.loads(r.stdout)
    assert rep["appended"] == 3 and rep["accounting"]["error"].startswith("sacct: ")
    assert "Connection refused" in rep["accounting"]["error"] and rep["accounting"]["still_pending"] == ["42.0"]
    assert "accounting pending for 1 runs" in r.stderr
    assert not [e for e in entries(ledger_url, "42") if e.source == "sacct"]
    receipt = json.loads(runner.invoke(cli, ["--db", ledger_url, "receipt", "42", "--format", "json"]).output)
    assert receipt["job"]["accounting"] == {"pending": list(accounting.ACCOUNTING_FIELDS)}
    assert receipt["job"]["qos"] is None  # unknown, not guessed

    site.control(sacct_down=False)  # slurmdbd is back: the next shipment (with an empty spool) catches up
    rep2 = json.loads(ship(runner, cli, site, ledger_url).output)
    assert rep2["files"] == 0 and rep2["accounting"]["recorded"] == 1 and rep2["accounting"]["error"] is None
    es = entries(ledger_url, "42")
    (end,) = [e for e in es if e.kind == "allocation_ended" and e.source == "sacct"]
    assert end.data["state"] == "CANCELLED" and end.data["signal"] == 15 and end.node is None
    (sus,) = [e for e in es if e.kind == "allocation_suspended"]
    assert sus.data["seconds"] == 7 and sus.data["exact"] is False
    assert accounting.end_state(es) == ("CANCELLED", "sacct")
    receipt = json.loads(runner.invoke(cli, ["--db", ledger_url, "receipt", "42", "--format", "json"]).output)
    assert receipt["job"]["accounting"] == {"source": "sacct", "state": "CANCELLED"}
    assert receipt["job"]["qos"] == "high"  # filled in from the accounting record
    assert ts_to_epoch(receipt["window"]["start"]) <= start + 1


def test_a_run_still_running_or_unknown_to_the_database_stays_pending(site, sqlite_url, runner, cli):
    recs = node_run("50") + node_run("51")
    spool.write_records(site.spool, recs, prefix="hook", encode=spool_line)
    site.sacct_record("50", [sacct_line("50", "RUNNING")])  # 51: not in the database yet
    assert runner.invoke(cli, ["--db", sqlite_url, "init"]).exit_code == 0
    eng = db_mod.make_engine(sqlite_url)
    try:
        assert ship(runner, cli, site, sqlite_url, "--no-receipts").exit_code == 0
        rep = accounting.enrich(eng, {"sacct": str(site.bin / "sacct")}, now=T0 + 3600)
    finally:
        eng.dispose()
    assert rep.recorded == 0 and sorted(rep.still_pending) == ["50.0", "51.0"] and rep.calls == 1


def test_end_state_prefers_the_database_then_the_controller():
    from ledger.chain.entries import make_entry

    def end(source, state, node=None):
        return make_entry("allocation_ended", T0, {"state": state}, job_id="1", run=0, node=node, source=source)

    assert accounting.end_state([end("hook.slurm", "SIGNALED", "n1"), end("hook.slurmctld", "SIGNALED"),
                                 end("sacct", "CANCELLED")]) == ("CANCELLED", "sacct")
    assert accounting.end_state([end("hook.slurm", "COMPLETED", "n1"), end("hook.slurmctld", "FAILED")]) == \
        ("FAILED", "hook.slurmctld")
    assert accounting.end_state([]) == (None, None)


def test_a_real_sacct_capture_gives_each_run_its_record():
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "sacct" / "requeue_cancel.txt").read_text()
    runs = accounting.runs_of(accounting.parse(text))
    assert sorted(runs) == [("1", 0), ("1", 1), ("2", 0)]
    assert (runs[("1", 0)].state, runs[("1", 1)].state, runs[("2", 0)].state) == ("REQUEUED", "COMPLETED",
                                                                                  "CANCELLED")
    assert runs[("1", 0)].end <= runs[("1", 1)].start and runs[("2", 0)].time_limit_s is None
    assert all(r.state in accounting.RUN_FINAL and r.qos == "normal" and r.account == "tenant" for r in runs.values())


def test_only_slurm_job_ids_reach_sacct_command_line():
    assert all(accounting.is_job_id(j) for j in ("1", "123456789", "12_3", "12+1"))
    assert not any(accounting.is_job_id(j) for j in ("", "-X", "1,2", "1 2", "--format=x", "٣", "1_", "a1", "9" * 40))
