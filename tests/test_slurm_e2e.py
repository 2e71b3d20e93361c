"""End to end on a real Slurm: hooks installed by `ipledger hooks install`, real jobs, stand-in DCGM/NVIDIA tools.

The four hooks are installed (Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld), Slurm has real accounting
storage (slurmdbd over MariaDB, so `sacct` is the real one), and every Slurm command the site config names
(`scontrol`, `squeue`, `sacct`, `sacctmgr`) is a recording wrapper around the real one: the hooks must never
call any of them, while the shipper's batched `sacct` fills in what their environment lacked.

One module-scoped scenario submits all jobs at once and drives them (requeue, suspend/resume, cancel, a DCGM
host-engine restart, a lost epilog) so the suite stays well under a minute; each test then checks one promise
on the ledger the scenario shipped into.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections import defaultdict
from pathlib import Path

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.canonical import ts_to_epoch
from ledger.cli.main import cli as ipledger
from ledger.ingest import sacct as accounting
from ledger.cli.install_hooks import install
from tests import slurm_service
from tests.standins import make_site, with_derived

pytestmark = pytest.mark.slurm


def _wait(cond, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = cond()
        except (OSError, ValueError, KeyError):  # a file not written yet, or mid-write
            v = None
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _spool_records(spool: Path) -> list[dict]:
    out = []
    for f in sorted(spool.glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def _trace(site) -> list[dict]:
    p = site.root / "trace.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


SLURM_COMMANDS = ("scontrol", "squeue", "sacct", "sacctmgr")


def _recording_wrappers(root: Path) -> tuple[dict, Path]:
    """One wrapper per Slurm command: appends tool, SLURM_SCRIPT_CONTEXT, SLURM_JOB_ID and argv to a log (one
    O_APPEND write per call), then runs the real command."""
    calls = root / "slurm-calls.tsv"
    d = root / "slurm-bin"
    d.mkdir()
    paths = {}
    for tool in SLURM_COMMANDS:
        real = slurm_service._which(tool)
        if real is None:
            continue
        w = d / tool
        w.write_text(f"#!/bin/sh\nprintf '%s\\t%s\\t%s\\t%s\\n' {tool} \"${{SLURM_SCRIPT_CONTEXT:-}}\" "
                     f"\"${{SLURM_JOB_ID:-}}\" \"$*\" >> '{calls}'\nexec '{real}' \"$@\"\n")
        w.chmod(0o755)
        paths[tool] = str(w)
    return paths, calls


def _calls(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        tool, context, job, argv = (line.split("\t") + ["", "", ""])[:4]
        out.append({"tool": tool, "context": context, "job": job, "argv": argv})
    return out


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-site")
    node = socket.gethostname().split(".")[0]
    wrappers, calls = _recording_wrappers(root)
    site = make_site(root, node=node, ngpus=8, tools=("dcgmi", "nvidia-smi"), extra_commands=wrappers,
                     hooks={"trace": str(root / "trace.jsonl")})
    site.calls = calls
    paths = install(root / "hooks", str(site.config))
    s = slurm_service.start(str(paths[0]), str(paths[1]), ngpus=8, prolog_slurmctld=str(paths[2]),
                            epilog_slurmctld=str(paths[3]), accounting=True)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(s.conf)  # for `ipledger reconcile`, which runs scontrol from this process
    yield s, site
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    s.stop()


@pytest.fixture(scope="module")
def scenario(slurm, tmp_path_factory, runner_module):
    s, site = slurm
    jobs = {
        "complete": s.sbatch("--gres=gpu:2", "-A", "tenant", "--wrap", "sleep 2"),
        "requeue": s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 3"),
        "suspend": s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 6"),
        "cancel": s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 120"),
        "restart": s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 4"),
        "noepilog": s.sbatch("--gres=gpu:1", "-A", "other", "--wrap", "sleep 1"),
    }
    for name in ("requeue", "suspend", "cancel", "restart"):
        s.wait(jobs[name], states=("RUNNING",), timeout=30)
    # With PrologFlags=Alloc a job shows RUNNING while its prolog runs; act only once every prolog is done.
    _wait(lambda: {t["job_id"] for t in _trace(site) if t["hook"] == "prolog"} >= set(jobs.values()),
          timeout=30, what="every prolog")
    # DCGM "restarts" once the restart job's stats are being recorded: its record is lost.
    _wait(lambda: f"{jobs['restart']}.0" in json.loads((site.state / "dcgm.json").read_text())["jobs"],
          what="DCGM job record of the restart job")
    site.control(restart_jobs=[f"{jobs['restart']}.0"])
    s.cmd("scontrol", "suspend", jobs["suspend"])
    time.sleep(1.0)
    s.cmd("scontrol", "requeue", jobs["requeue"])
    s.cmd("scancel", jobs["cancel"])
    time.sleep(2.0)
    s.cmd("scontrol", "resume", jobs["suspend"])
    # Slurm holds a requeued job back ~2 minutes; let it start again now.
    s.wait(jobs["requeue"], states=("PENDING",), restarts=1, timeout=30)
    s.cmd("scontrol", "update", f"jobid={jobs['requeue']}", "StartTime=now")
    for name, jid in jobs.items():
        s.wait(jid, timeout=60, restarts=1 if name == "requeue" else None)
    # Epilogs run while the job is COMPLETING; wait until every epilog has traced its exit (the requeued job
    # has two runs; Slurm may skip the second run's prolog, see test_requeued_job_has_two_runs).
    _wait(lambda: len([t for t in _trace(site) if t["hook"] == "epilog"]) >= len(jobs) + 1, timeout=30,
          what="every epilog to finish")
    # The node died before the "noepilog" job's epilog: its epilog never reached the spool.
    lost = site.root / "lost-epilog"
    lost.mkdir()
    for f in site.spool.glob("*.jsonl"):
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if any(r["job_id"] == jobs["noepilog"] and r["kind"] != "allocation_started" and r["kind"] != "device_bound"
               for r in recs):
            shutil.move(str(f), lost / f.name)
    db_url = f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
    r = runner_module.invoke(ipledger, ["--db", db_url, "init"])
    assert r.exit_code == 0, r.output
    # Ship with the site config: the shipper asks sacct (one call per batch) for what the hooks could not know.
    # slurmctld hands finished jobs to slurmdbd asynchronously, so a run may stay pending for a shipment or two.
    ship_args = ["--db", db_url, "--config", str(site.config), "ship", "--spool", str(site.spool), "--json"]
    r = runner_module.invoke(ipledger, ship_args)
    assert r.exit_code == 0, r.output
    _wait(lambda: json.loads(runner_module.invoke(ipledger, ship_args).stdout)["accounting"]["still_pending_count"]
          == 0, timeout=30, what="accounting for every ended run")
    engine = db_mod.make_engine(db_url)
    yield {"jobs": jobs, "db": db_url, "engine": engine, "site": site, "slurm": s}
    engine.dispose()


@pytest.fixture(scope="module")
def runner_module():
    from click.testing import CliRunner

    return CliRunner()


def _entries(engine, job_id):
    return [c.entry for c in store.iter_entries(engine, job_id=job_id)]


def _node(entries, kind):
    """The node hooks' entries of a kind (the controller's and the accounting database's are job-level)."""
    return [e for e in entries if e.kind == kind and e.source == "hook.slurm"]


def _by_run(entries):
    runs = defaultdict(list)
    for e in entries:
        runs[e.run].append(e)
    return runs


def test_hooks_exit_zero_and_node_stays_up(scenario):
    trace = _trace(scenario["site"])
    assert trace and all(t["ok"] for t in trace), trace
    assert all(t["elapsed_s"] < 10 for t in trace), [t["elapsed_s"] for t in trace]
    assert not scenario["slurm"].node_state().startswith(("drain", "down")), scenario["slurm"].node_state()


def test_two_gpu_job_has_start_binding_dcgm_summaries_and_end(scenario, runner_module):
    jid = scenario["jobs"]["complete"]
    es = _entries(scenario["engine"], jid)
    # One start and one end from each of: the node's hooks, the controller's hooks, the accounting database.
    for kind in ("allocation_started", "allocation_ended"):
        assert sorted((e.source, e.node is None) for e in es if e.kind == kind) == [
            ("hook.slurm", False), ("hook.slurmctld", True), ("sacct", True)], kind
    bound = [e for e in es if e.kind == "device_bound"]
    uuids = {e.device for e in bound}
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids)
    summaries = [e for e in es if e.kind == "telemetry_summary"]
    assert {e.device for e in summaries} == uuids
    for e in summaries:
        assert e.data["source"] == "dcgm_job_stats"
        assert e.data["values"]["power_w_avg"] > 0 and e.data["values"]["energy_j"] >= 0
        assert e.data["missing"]["pcie_rx_mb_avg"] == "not_available"  # N/A stays missing, not zero
    (start,) = _node(es, "allocation_started")
    assert start.data["account"] == "tenant" and start.data["partition"] == "gpu" and start.data["gpus"] == 2
    (end,) = _node(es, "allocation_ended")
    assert end.data["state"] == "COMPLETED" and end.data["exit_code"] == 0
    # The only gap a clean job may have is the prolog's own time before the DCGM watch began (the job's tasks
    # cannot start before the prolog ends with PrologFlags=Alloc); it must end where the DCGM record begins.
    for g in (e for e in es if e.kind == "unknown_interval"):
        assert g.data["cause"] == "dcgm_watch_late" and g.ts == start.ts
        summary = next(e for e in summaries if e.device == g.device)
        assert g.ts_end == summary.ts and ts_to_epoch(g.ts_end) - ts_to_epoch(g.ts) < 15
    r = runner_module.invoke(ipledger, ["--db", scenario["db"], "receipt", jid, "--format", "json"])
    assert r.exit_code == 0, r.output
    receipt = json.loads(r.output)
    assert receipt["job"]["account"] == "tenant" and receipt["job"]["partition"] == "gpu"
    assert receipt["job"]["qos"] == "normal"  # from the accounting database: no hook could know it
    assert receipt["job"]["accounting"] == {"source": "sacct", "state": "COMPLETED"}
    assert {d["uuid"] for d in receipt["job"]["devices"]} == uuids
    # The window is the allocation's: the job-level start (at or before the node's prolog) to the latest end.
    assert ts_to_epoch(receipt["window"]["start"]) <= ts_to_epoch(start.ts)
    assert ts_to_epoch(receipt["window"]["end"]) >= ts_to_epoch(end.ts) - 1
    assert ts_to_epoch(end.ts) - ts_to_epoch(start.ts) >= 2


def test_requeued_job_has_two_runs(scenario):
    jid = scenario["jobs"]["requeue"]
    runs = _by_run(_entries(scenario["engine"], jid))
    assert sorted(runs) == [0, 1]
    for run, es in runs.items():
        # Each run has its own job-level start and end (controller hooks, accounting) and its node's end.
        for kind in ("allocation_started", "allocation_ended"):
            assert {e.source for e in es if e.kind == kind} >= {"hook.slurmctld", "sacct"}, (run, kind)
        assert len(_node(es, "allocation_ended")) == 1, run
    (end0,) = _node(runs[0], "allocation_ended")
    assert end0.data["state"] == "REQUEUED"
    assert any(e.kind == "allocation_requeued" for e in runs[0])
    assert accounting.end_state(runs[0]) == ("REQUEUED", "sacct")
    assert accounting.end_state(runs[1]) == ("COMPLETED", "sacct")
    start1 = min(ts_to_epoch(e.ts) for e in runs[1] if e.kind == "allocation_started")
    assert start1 >= ts_to_epoch(end0.ts) - 1  # sacct's times are whole seconds
    # slurmd may skip the prolog of a run requeued onto the same node right away ("reissued job credential" in
    # its log). The epilog then binds the devices it held and says its prolog state is missing; the run's start
    # is the controller's and the accounting database's.
    if not _node(runs[1], "allocation_started"):
        assert _node(runs[1], "device_bound") and any(e.kind == "hook_error" for e in runs[1])


def test_suspended_job_shows_the_suspended_time(scenario):
    """No hook can see a suspension (Slurm tells them nothing of it); the accounting database keeps its total."""
    es = _entries(scenario["engine"], scenario["jobs"]["suspend"])
    (sus,) = [e for e in es if e.kind == "allocation_suspended"]
    assert sus.source == "sacct" and sus.data["exact"] is False and 1.0 <= sus.data["seconds"] <= 8.0
    assert ts_to_epoch(sus.ts_end) - ts_to_epoch(sus.ts) == sus.data["seconds"]
    start = min(ts_to_epoch(e.ts) for e in es if e.kind == "allocation_started")
    end = max(ts_to_epoch(e.ts) for e in es if e.kind == "allocation_ended")
    assert start <= ts_to_epoch(sus.ts) < ts_to_epoch(sus.ts_end) <= end


def test_cancelled_job_is_closed(scenario):
    es = _entries(scenario["engine"], scenario["jobs"]["cancel"])
    end = _node(es, "allocation_ended")
    (start,) = _node(es, "allocation_started")
    assert len(end) == 1
    assert ts_to_epoch(end[0].ts) - ts_to_epoch(start.ts) < 60, "closed when cancelled, not after its 120 s sleep"
    # The node's environment only has the exit status (0:0 or 0:15 for a cancelled job); the final state is
    # the accounting database's, recorded as the job-level allocation_ended.
    assert end[0].data["state_basis"] == "environment" and end[0].data["state"] in ("SIGNALED", "COMPLETED")
    assert accounting.end_state(es) == ("CANCELLED", "sacct")
    assert scenario["slurm"].job(scenario["jobs"]["cancel"])["JobState"] == "CANCELLED"


def test_dcgm_restart_mid_job_is_an_unknown_interval(scenario):
    es = _entries(scenario["engine"], scenario["jobs"]["restart"])
    (start,) = _node(es, "allocation_started")
    (end,) = _node(es, "allocation_ended")
    gaps = [e for e in es if e.kind == "unknown_interval"]
    bound = {e.device for e in es if e.kind == "device_bound"}
    assert {g.device for g in gaps} == bound
    for g in gaps:
        assert g.data["cause"] == "dcgm_host_engine_restart"
        assert (g.ts, g.ts_end) == (start.ts, end.ts)  # the whole run: the restarted engine kept nothing
    assert not [e for e in es if e.kind == "telemetry_summary"], "no summary may stand in for lost data"


def test_lost_epilog_is_closed_by_reconcile(scenario, runner_module):
    jid = scenario["jobs"]["noepilog"]
    before = _entries(scenario["engine"], jid)
    assert _node(before, "allocation_ended") == []
    r = runner_module.invoke(ipledger, ["--db", scenario["db"], "--config", str(scenario["site"].config),
                                        "reconcile", "--no-ship", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert [c["job_id"] for c in rep["closed"]] == [jid]
    after = _entries(scenario["engine"], jid)
    end = [e for e in after if e.kind == "allocation_ended" and e.source == "reconcile"]
    assert len(end) == 1 and end[0].data["cause"] == "epilog_missing" and end[0].data["state"] == "COMPLETED"
    gaps = [e for e in after if e.kind == "unknown_interval"]
    (start,) = _node(after, "allocation_started")
    assert len(gaps) == 1 and gaps[0].data["cause"] == "epilog_missing"
    assert gaps[0].ts == start.ts and gaps[0].ts_end == end[0].ts
    slurm_end = scenario["slurm"].job(jid).get("EndTime")
    assert end[0].ts.startswith(time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.mktime(
        time.strptime(slurm_end, "%Y-%m-%dT%H:%M:%S")))))
    # A second pass finds nothing left to close.
    r2 = runner_module.invoke(ipledger, ["--db", scenario["db"], "--config", str(scenario["site"].config),
                                         "reconcile", "--no-ship", "--json"])
    assert json.loads(r2.output)["closed"] == []


@pytest.mark.postgres
def test_database_down_jobs_finish_and_ship_delivers_exactly_once(scenario, slurm, runner_module, request):
    """The real PostgreSQL ledger is stopped while jobs run; after it is restarted, one ship delivers it all."""
    s, site = slurm
    pg = request.getfixturevalue("postgres")
    url = pg.create_db(f"ipledger_slurm_{os.getpid()}")
    assert runner_module.invoke(ipledger, ["--db", url, "init"]).exit_code == 0
    pg.pg_ctl("stop")
    try:
        # The scenario shipped its files already; what is in the spool now is only this test's.
        t0 = len(_trace(site))
        ids = [s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 1") for _ in range(3)]
        for j in ids:
            s.wait(j, timeout=60)
        _wait(lambda: len(_trace(site)) >= t0 + 6, what="hooks of the db-down jobs")
        new = _trace(site)[t0:]
        assert all(t["ok"] and t["elapsed_s"] < 10 for t in new), new
        assert not s.node_state().startswith(("drain", "down"))
        records = _spool_records(site.spool)
        assert {r["job_id"] for r in records} == set(ids)
        t = time.time()
        down = runner_module.invoke(ipledger, ["--db", url, "ship", "--spool", str(site.spool)])
        assert down.exit_code != 0 and time.time() - t < 30
        assert len(_spool_records(site.spool)) == len(records), "nothing may leave the spool while the db is down"
    finally:
        pg.pg_ctl("start")
    up = runner_module.invoke(ipledger, ["--db", url, "ship", "--spool", str(site.spool), "--json"])
    assert up.exit_code == 0, up.output
    rep = json.loads(up.output)
    records = with_derived(records)  # the hooks' raw DCGM reports, and the summaries ship derives from them
    assert rep["records"] == len(records) and rep["appended"] == len(records)
    again = json.loads(runner_module.invoke(ipledger, ["--db", url, "ship", "--spool", str(site.spool),
                                                       "--json"]).output)
    assert again["records"] == 0
    eng = db_mod.make_engine(url)
    try:
        chained = list(store.iter_entries(eng))
    finally:
        eng.dispose()
    # The shipper also issued each finished run's receipt on its own (automatic receipts): one per job.
    issued = [c.entry for c in chained if c.entry.kind == "receipt_issued"]
    assert sorted(e.job_id for e in issued) == sorted(set(ids))
    got = [c.entry.entry_id for c in chained if c.entry.kind != "receipt_issued"]
    assert len(got) == len(set(got)) == len(records)
    assert sorted(got) == sorted({r["entry_id"] for r in records})


def test_no_slurm_command_from_any_hook_context(scenario):
    """Slurm's Prolog and Epilog Guide: hooks "should not call Slurm commands". Every hook of every job ran
    (node and controller, for the normal, requeued and suspended jobs alike) and none called scontrol, squeue,
    sacct or sacctmgr; the shipper's sacct calls went through the same wrappers (they record)."""
    site, jobs = scenario["site"], scenario["jobs"]
    calls = _calls(site.calls)
    assert [c for c in calls if c["context"]] == []
    assert any(c["tool"] == "sacct" and not c["context"] for c in calls), calls  # the wrappers do record
    ran = defaultdict(set)
    for t in _trace(site):
        ran[t["job_id"]].add(t["context"])
    for name in ("complete", "requeue", "suspend"):
        assert ran[jobs[name]] >= {"prolog_slurmd", "epilog_slurmd", "prolog_slurmctld", "epilog_slurmctld"}, \
            (name, ran[jobs[name]])
    # One sacct call per shipment that had runs pending, never one per run or per node.
    sacct_calls = [c for c in calls if c["tool"] == "sacct"]
    assert 1 <= len(sacct_calls) < len(jobs)


def test_receipts_carry_identity_devices_both_runs_suspension_and_end_state(scenario, runner_module):
    jobs, db = scenario["jobs"], scenario["db"]

    def receipt(job, *extra):
        r = runner_module.invoke(ipledger, ["--db", db, "receipt", job, "--format", "json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    for name, want in (("complete", 2), ("suspend", 1), ("cancel", 1)):
        r = receipt(jobs[name])
        assert (r["job"]["account"], r["job"]["partition"], len(r["job"]["devices"])) == ("tenant", "gpu", want)
    run0, run1 = receipt(jobs["requeue"], "--run", "0"), receipt(jobs["requeue"], "--run", "1")
    assert (run0["job"]["run"], run1["job"]["run"]) == (0, 1)
    assert run0["job"]["accounting"]["state"] == "REQUEUED" and run1["job"]["accounting"]["state"] == "COMPLETED"
    assert all(len(r["job"]["devices"]) == 1 and r["job"]["account"] == "tenant" for r in (run0, run1))
    sus = receipt(jobs["suspend"])
    assert sus["gpu_hours"]["suspended"] > 0 and sus["job"]["accounting"]["state"] == "COMPLETED"
    assert receipt(jobs["cancel"])["job"]["accounting"] == {"source": "sacct", "state": "CANCELLED"}
