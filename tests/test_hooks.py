"""The prolog/epilog logic with stand-in tools: what is recorded, every failure mode, the fast path, install.

The hooks never run a Slurm command: the job comes from the environment alone (test_no_slurm_command_*)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ledger
from ledger.base import commands
from ledger.chain.canonical import ts_to_epoch
from ledger.capture.hooks import run
from ledger.cli import install_hooks as install_mod
from tests.standins import make_site, with_derived

ROOT = Path(ledger.__file__).resolve().parent.parent


def slurm_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def record(job="77", state="RUNNING", restarts=0, start=None, end=None, exit_code="0:0", run_time="00:00:00",
           suspend=None, pre=0) -> str:
    return (f"JobId={job} JobName=wrap UserId=root(0) GroupId=root(0) Account=tenant QOS=normal JobState={state} "
            f"Reason=None Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode={exit_code} RunTime={run_time} "
            f"TimeLimit=UNLIMITED SubmitTime={slurm_time(start or time.time())} "
            f"StartTime={slurm_time(start) if start else 'Unknown'} EndTime={slurm_time(end) if end else 'Unknown'} "
            f"SuspendTime={slurm_time(suspend) if suspend else 'None'} SecsPreSuspend={pre} Partition=gpu "
            f"NodeList=node1 TRES=cpu=1,node=1,billing=1 JOB_GRES=gpu:2 Nodes=node1 CPU_IDs=0 GRES=gpu:2(IDX:1-2) "
            f"WorkDir=/home/alice/my project StdOut=/dev/null")


def env(job="77", gpus="1,2", restart=0, **extra) -> dict:
    e = {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": str(restart), "SLURM_JOB_ACCOUNT": "tenant",
         "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_PARTITION": "gpu",
         "SLURM_CLUSTER_NAME": "c1", "SLURMD_NODENAME": "node1", "SLURM_JOB_GPUS": gpus, "SLURM_JOB_NODELIST": "node1",
         "CUDA_VISIBLE_DEVICES": gpus, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    e.update(extra)
    return e


def spooled(site) -> list[dict]:
    out = []
    for f in sorted(site.spool.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["data"] = json.loads(r["payload"])
            out.append(r)
    return with_derived(out)  # the raw tool output's summaries and gaps, as ship derives them


def kinds(recs, kind):
    return [r for r in recs if r["kind"] == kind]


@pytest.fixture
def site(tmp_path):
    # A loaded test machine can take seconds between scontrol's StartTime and `dcgmi stats -s`; the tolerance
    # keeps that from showing up as a (true but irrelevant) dcgm_watch_late gap in tests about other things.
    return make_site(tmp_path, hooks={"trace": str(tmp_path / "trace.jsonl"), "gap_tolerance_s": 15.0}, timeout=3.0)


def prolog_epilog(site, job="77", started_ago=None, between=None, epilog_env=None):
    """Prolog, ``between()``, epilog; ``started_ago``: pretend the prolog ran that many seconds earlier."""
    assert run("prolog", env(job), str(site.config)) == 0
    if started_ago:
        p = site.spool / "hook-state" / f"{job}.json"
        state = json.loads(p.read_text())
        state["start"] -= started_ago
        p.write_text(json.dumps(state))
    if between:
        between()
    assert run("epilog", epilog_env or env(job, SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_EXIT_CODE2="0:0"),
               str(site.config)) == 0
    return spooled(site)


def test_clean_job_records_start_bindings_summaries_end_and_cleans_dcgm(site):
    recs = prolog_epilog(site)
    (start,) = kinds(recs, "allocation_started")
    # Only what the environment holds: QOS and TRES come from accounting at ship time (test_accounting.py).
    assert start["data"] == {"account": "tenant", "user": "alice", "partition": "gpu", "nodes": "node1", "gpus": 2}
    assert (start["cluster"], start["job_id"], start["run"], start["node"]) == ("c1", "77", 0, "node1")
    bound = kinds(recs, "device_bound")
    assert [b["data"]["index"] for b in bound] == [1, 2]
    assert [b["device"] for b in bound] == [site.gpus[1]["uuid"], site.gpus[2]["uuid"]]
    assert all(b["data"]["sku"] == "NVIDIA H100 80GB HBM3" and b["ts"] == start["ts"] for b in bound)
    summaries = kinds(recs, "telemetry_summary")
    assert sorted(s["device"] for s in summaries) == sorted(b["device"] for b in bound)
    assert {s["data"]["dcgm_gpu_id"] for s in summaries} == {1, 2}
    for s in summaries:
        assert s["data"]["values"]["power_w_avg"] > 0 and s["data"]["missing"]["pcie_tx_mb_max"] == "not_available"
    (end,) = kinds(recs, "allocation_ended")
    assert end["data"] == {"exit_code": 0, "signal": 0, "state": "COMPLETED", "state_basis": "environment"}
    assert not kinds(recs, "unknown_interval") and not kinds(recs, "hook_error")
    dcgm = json.loads((site.state / "dcgm.json").read_text())
    assert dcgm["jobs"] == {} and dcgm["groups"] == {}, "the hooks remove their DCGM job record and group"
    assert not any(site.spool.glob("hook-state/*.json")), "the epilog removes the prolog's state"


def test_dcgm_host_engine_restart_is_an_unknown_interval_over_the_run(site):
    recs = prolog_epilog(site, between=lambda: site.control(restart=True))
    (start,), (end,) = kinds(recs, "allocation_started"), kinds(recs, "allocation_ended")
    gaps = kinds(recs, "unknown_interval")
    assert sorted(g["device"] for g in gaps) == sorted(b["device"] for b in kinds(recs, "device_bound"))
    for g in gaps:
        assert g["data"]["cause"] == "dcgm_host_engine_restart" and g["data"]["scope"] == "device"
        assert (g["ts"], g["ts_end"]) == (start["ts"], end["ts"])
    assert not kinds(recs, "telemetry_summary")
    assert [e["data"]["stage"] for e in kinds(recs, "hook_error")] == ["dcgm stats"]


def test_watch_started_late_leaves_exactly_the_uncovered_head(site):
    recs = prolog_epilog(site, started_ago=60)
    for s in kinds(recs, "telemetry_summary"):
        (gap,) = [g for g in kinds(recs, "unknown_interval") if g["device"] == s["device"]]
        assert gap["data"]["cause"] == "dcgm_watch_late"
        started = ts_to_epoch(kinds(recs, "allocation_started")[0]["ts"])
        assert abs(ts_to_epoch(gap["ts"]) - (started - 60)) < 1e-3 and gap["ts_end"] == s["ts"]
        assert 55 <= ts_to_epoch(gap["ts_end"]) - ts_to_epoch(gap["ts"]) <= 90


@pytest.mark.parametrize("control,cause", [
    ({"no_data_jobs": ["77.0"]}, "dcgm_no_data"),
    ({"down": True}, "dcgm_unreachable"),
])
def test_dcgm_failures_in_the_epilog(site, control, cause):
    recs = prolog_epilog(site, between=lambda: site.control(**control))
    gaps = kinds(recs, "unknown_interval")
    assert len(gaps) == 2 and {g["data"]["cause"] for g in gaps} == {cause}
    assert not kinds(recs, "telemetry_summary") and len(kinds(recs, "allocation_ended")) == 1


def test_dcgm_never_started_when_the_engine_is_down_at_prolog(site):
    site.control(down=True)
    recs = prolog_epilog(site, between=site.clear_control)
    assert {g["data"]["cause"] for g in kinds(recs, "unknown_interval")} == {"dcgm_watch_not_started"}
    assert "dcgm start" in {e["data"]["stage"] for e in kinds(recs, "hook_error")}
    assert len(kinds(recs, "allocation_started")) == 1 and len(kinds(recs, "allocation_ended")) == 1


def test_hung_tools_time_out_and_the_hooks_stay_quick(tmp_path):
    site = make_site(tmp_path, timeout=0.5)
    site.control(hang_s=5, nvsmi_hang_s=5)
    t0 = time.time()
    recs = prolog_epilog(site)
    # One deadline per hook (0.5 s for all its tools), not per call: two hooks, well under one 5 s hang.
    assert time.time() - t0 < 4
    assert len(kinds(recs, "allocation_started")) == 1 and len(kinds(recs, "allocation_ended")) == 1
    # No UUID could be learnt: none is invented, the GPUs are bound by index and their time is unknown.
    assert {b["device"] for b in kinds(recs, "device_bound")} == {"index:node1:1", "index:node1:2"}
    assert {b["data"]["uuid"] for b in kinds(recs, "device_bound")} == {None}
    assert {g["data"]["cause"] for g in kinds(recs, "unknown_interval")} == {"dcgm_timeout", "device_uuid_unknown"}


def test_requeued_run_keeps_its_own_run_number(site):
    # Slurm already shows the next run's restart count in a requeued run's epilog.
    recs = prolog_epilog(site, epilog_env=env(restart=1, SLURM_SCRIPT_CONTEXT="epilog_slurmd"))
    assert {r["run"] for r in recs} == {0}
    (end,) = kinds(recs, "allocation_ended")
    assert end["data"]["state"] == "REQUEUED"
    assert kinds(recs, "allocation_requeued")[0]["data"] == {"next_run": 1, "reason": "requeued"}


def test_cancelled_job_signal_from_the_environment(site):
    recs = prolog_epilog(site, epilog_env=env(SLURM_JOB_EXIT_CODE="0", SLURM_JOB_EXIT_CODE2="0:15",
                                              SLURM_JOB_DERIVED_EC="0:0"))
    # The node's view; the final state (CANCELLED) is the accounting database's (tests/test_accounting.py).
    assert kinds(recs, "allocation_ended")[0]["data"] == {"exit_code": 0, "signal": 15, "state": "SIGNALED",
                                                          "state_basis": "environment", "derived_exit_code": 0}


def test_amd_counters_are_differenced(tmp_path):
    site = make_site(tmp_path, tools=("amd-smi", "scontrol"))
    recs = prolog_epilog(site, between=lambda: time.sleep(0.3))
    bound = kinds(recs, "device_bound")
    assert [b["data"]["sku"] for b in bound] == ["AMD Instinct MI300X"] * 2
    assert all(b["data"]["vendor"] == "amd" and b["device"] for b in bound)
    for s in kinds(recs, "telemetry_summary"):
        assert s["data"]["source"] == "amdsmi_counters"
        assert s["data"]["values"]["energy.total_energy_consumption"] > 0
        assert s["data"]["values"]["ecc.total_correctable_count"] == 0
        assert s["data"]["missing"]["ecc.total_deferred_count"] == "not_available"
        assert s["data"]["missing"]["throttle.hbm_thermal_accumulated"] == "not_available"
    assert not kinds(recs, "unknown_interval")


def test_amd_counter_reset_is_missing_not_negative(tmp_path):
    site = make_site(tmp_path, tools=("amd-smi", "scontrol"))
    recs = prolog_epilog(site, between=lambda: site.control(amd_reset=True))
    for s in kinds(recs, "telemetry_summary"):
        assert s["data"]["missing"]["energy.total_energy_consumption"] == "counter_reset"
        assert all(v >= 0 for v in s["data"]["values"].values())


def test_epilog_without_prolog_binds_the_devices_and_leaves_the_start_to_the_job_level(site):
    assert run("epilog", env("78"), str(site.config)) == 0
    recs = spooled(site)
    # The node cannot know when the allocation began (no Slurm command may ask): the start is the controller's
    # prolog's or the accounting database's; the node still says what it held and that its prolog is missing.
    assert kinds(recs, "allocation_started") == [] and len(kinds(recs, "device_bound")) == 2
    assert len(kinds(recs, "allocation_ended")) == 1
    assert "state" in {e["data"]["stage"] for e in kinds(recs, "hook_error")}


@pytest.mark.parametrize("torn", ["empty", "truncated", "zeros"])
def test_a_prolog_state_a_crash_left_torn_reads_as_no_state(site, torn):
    """The node prolog's state is not fsynced (ledger.capture.hooks.core.prolog says why): whatever a crash could
    leave of it — nothing written yet, a cut line, the zero-filled blocks of delayed allocation — the epilog
    takes the "no prolog state" path, exactly as with no state file, and still binds the devices and ends."""
    assert run("prolog", env("79"), str(site.config)) == 0
    p = site.spool / "hook-state" / "79.json"
    whole = p.read_bytes()
    p.write_bytes({"empty": b"", "truncated": whole[: len(whole) // 2], "zeros": b"\0" * len(whole)}[torn])
    assert run("epilog", env("79", SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_EXIT_CODE2="0:0"),
               str(site.config)) == 0
    recs = spooled(site)
    assert len(kinds(recs, "allocation_started")) == 1      # the prolog's, spooled (and fsynced) before the state
    assert len(kinds(recs, "allocation_ended")) == 1
    assert "state" in {e["data"]["stage"] for e in kinds(recs, "hook_error")}


def test_hooks_always_exit_zero(tmp_path, capsys):
    assert run("prolog", {}, None) == 0  # not run by Slurm
    assert run("bogus", env(), None) == 0
    assert run("prolog", env(), str(tmp_path / "missing.toml")) == 0  # config file missing
    bad = tmp_path / "spool-is-a-file"
    bad.write_text("x")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{bad}"\n')
    assert run("prolog", env(), str(cfg)) == 0  # the spool cannot be written
    err = capsys.readouterr().err
    assert "no SLURM_JOB_ID" in err and "missing.toml" in err and "prolog failed" in err


def _comparable(site) -> list:
    """The hooks' own spool records without what differs between two runs of the same job: times, ids, and of
    a tool's answer (a DCGM report counts the seconds it watched) only which call it was and how it ended."""
    out = []
    for f in site.spool.glob("*.jsonl"):
        for r in map(json.loads, f.read_text().splitlines()):
            data = json.loads(r["payload"])
            if r["kind"] == "tool_output":
                data = [data["step"]] + [(c["program"], c["args"], c["exit_code"], c["timed_out"])
                                         for c in data["calls"]]
            out.append((r["kind"], r["device"], data))
    return sorted(out, key=repr)


@pytest.mark.parametrize("control", [{}, {"nvsmi_fail": True}, {"down": True}])
def test_tools_started_together_record_what_one_at_a_time_records(tmp_path, monkeypatch, control):
    """The hooks start independent reads together (the prolog's inventory and DCGM discovery; the epilog's
    stats -r and group -d): the records, the prolog's state and the DCGM calls made are those of the same hooks
    starting every call in turn — also when nvidia-smi fails or DCGM is down."""
    seen = {}
    for how in ("together", "in turn"):
        site = make_site(tmp_path / how, hooks={"gap_tolerance_s": 15.0}, timeout=3.0)
        site.control(**control)
        if how == "in turn":
            one_by_one = commands.spawn_all_and_wait
            monkeypatch.setattr(commands, "_SPAWN", lambda argvs, **kw: [one_by_one([a], **kw)[0] for a in argvs])
        assert run("prolog", env("77", gpus="0,2"), str(site.config)) == 0
        state = json.loads((site.spool / "hook-state" / "77.json").read_text())
        assert run("epilog", env("77", gpus="0,2"), str(site.config)) == 0
        calls = sorted(json.dumps(c).replace(str(site.root), "ROOT") for c in site.dcgm_calls())
        seen[how] = _comparable(site), state["devices"], state.get("dcgm", {}).get("error"), calls
    assert seen["together"] == seen["in turn"]
    recs, devices, err, calls = seen["together"]
    # discovery, group -c, stats -e, -s; stats -x, -v -j, -r, group -d (DCGM down: no group, so no -e, -s, -d)
    assert len(devices) == 2 and len(calls) == (5 if control.get("down") else 8)
    assert ("hook_error" in {r[0] for r in recs}) == bool(control) and (err is None) == (not control.get("down"))


def test_nothing_outside_the_allowlist_is_executed(site, monkeypatch):
    seen = []
    real = commands._SPAWN

    def spy(argvs, *a, **kw):
        seen.extend(list(argv) for argv in argvs)
        return real(argvs, *a, **kw)

    monkeypatch.setattr(commands, "_SPAWN", spy)
    prolog_epilog(site)
    cfg_paths = {"dcgmi": str(site.bin / "dcgmi"), "nvidia-smi": str(site.bin / "nvidia-smi")}
    assert "scontrol" in open(site.config).read()  # configured, and still never run by a hook
    by_path = {v: k for k, v in cfg_paths.items()}
    assert seen and all(argv[0] in by_path for argv in seen), seen
    for argv in seen:
        commands.check_allowed(by_path[argv[0]], argv[1:])  # raises if not allowlisted
    assert {by_path[a[0]] for a in seen} == set(cfg_paths)


def test_fast_path_imports_only_the_standard_library(site):
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from ledger.capture.hooks import run
env = {env()!r}
run("prolog", env, {str(site.config)!r})
run("epilog", env, {str(site.config)!r})
heavy = sorted(m for m in sys.modules if m.split(".")[0] in
               ("sqlalchemy", "click", "pandas", "numpy", "pyarrow", "duckdb", "alembic", "reportlab", "psycopg"))
print(heavy)
"""
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60,
                       env={})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert len(kinds(spooled(site), "allocation_ended")) == 1


def test_install_writes_executable_stdlib_scripts(site, tmp_path, runner, cli):
    d = tmp_path / "hooks"
    r = runner.invoke(cli, ["hooks", "install", "--dir", str(d), "--config", str(site.config), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    for kind in install_mod.KINDS:
        p = d / kind
        assert out[kind] == str(p) and p.stat().st_mode & stat.S_IXUSR
        text = p.read_text()
        first = text.splitlines()[0]
        assert first == f"#!{sys.executable} -IS" and os.path.isabs(first[2:].split()[0])
        assert repr(str(site.config)) in text and "click" not in text and "@" not in text
        assert install_mod.template_path(kind).read_text() == install_mod.TEMPLATE.replace(
            "@KIND_TITLE@", install_mod.TITLES[kind]).replace("@KIND@", kind)
    # Slurm's environment is minimal: no PATH, no PYTHONPATH, no virtualenv.
    for kind in install_mod.KINDS:
        p = subprocess.run([str(d / kind)], env=env("90"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    recs = spooled(site)
    # One per node hook and one job-level record (node null) per controller hook.
    assert sorted(r["node"] or "" for r in kinds(recs, "allocation_started")) == ["", "node1"]
    assert sorted(r["node"] or "" for r in kinds(recs, "allocation_ended")) == ["", "node1"]
    assert {r["source"] for r in recs if r["node"] is None} == {"hook.slurmctld"}


def test_installed_scripts_end_as_the_plain_exit_would(tmp_path):
    """The installed scripts end through run_script (os._exit, no interpreter teardown): the same status, the
    same log lines on stderr, nothing on stdout, the same records and trace as the plain ``sys.exit(main(...))``
    of scripts installed before it — a stream left unflushed or a file left for the teardown to close would
    differ here. Both run the same job on two identical sites (GPU 9 is unknown to the tools: a logged error)."""
    seen = {}
    for how in ("run_script", "plain"):
        root = tmp_path / how
        site = make_site(root, tools=("dcgmi", "nvidia-smi"), hooks={"trace": str(root / "trace.jsonl")})
        scripts = install_mod.install(root / "hooks", str(site.config))
        if how == "plain":
            for script in scripts:
                text = script.read_text().replace("import run_script", "import main")
                kind = script.name
                assert f'run_script("{kind}", ' in text
                script.write_text(text.replace(f'run_script("{kind}", ', f'sys.exit(main("{kind}", ') + ")\n")
        runs = []
        for script in scripts:
            p = subprocess.run([str(script)], env=env("77", gpus="1,9"), capture_output=True, text=True, timeout=60)
            runs.append((script.name, p.returncode, p.stdout, p.stderr.replace(str(root), "ROOT")))
        recs = [(r["kind"], r["device"], sorted(r["data"])) for r in spooled(site)]
        trace = [(t["hook"], t["ok"], t["errors"])
                 for t in map(json.loads, (root / "trace.jsonl").read_text().splitlines())]
        seen[how] = runs, sorted(recs, key=repr), json.loads(json.dumps(trace).replace(str(root), "ROOT"))
    assert seen["run_script"] == seen["plain"]
    runs, recs, trace = seen["run_script"]
    assert [r[1] for r in runs] == [0, 0, 0, 0] and "GPU index 9" in runs[0][3] and len(trace) == 4
    assert {"allocation_started", "allocation_ended", "tool_output", "hook_error"} <= {r[0] for r in recs}


def test_install_refuses_a_missing_config(tmp_path, runner, cli):
    r = runner.invoke(cli, ["hooks", "install", "--dir", str(tmp_path / "h"), "--config", str(tmp_path / "no.toml")])
    assert r.exit_code == 1 and "config file not found" in r.output


@pytest.mark.parametrize("value", ["inf", "nan", "-1.0", "0"])
def test_install_refuses_an_unusable_hook_timeout(tmp_path, runner, cli, value):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{tmp_path}/spool"\nhook_timeout_s = {value}\n')
    r = runner.invoke(cli, ["hooks", "install", "--dir", str(tmp_path / "h"), "--config", str(cfg)])
    assert r.exit_code == 1 and "hook_timeout_s" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "h").exists()


def test_hook_cli_runs_the_same_logic(site, runner, cli):
    r = runner.invoke(cli, ["--config", str(site.config), "hook", "prolog"], env=env("91"))
    assert r.exit_code == 0
    assert len(kinds(spooled(site), "allocation_started")) == 1
    r = runner.invoke(cli, ["--config", str(site.config), "hook", "epilog"], env={"SLURM_JOB_ID": ""})
    assert r.exit_code == 0  # no job: logged, still 0


def test_mig_report_is_missing_values_and_an_unknown_interval_not_zeros(site):
    recs = prolog_epilog(site, between=lambda: (site.control(mig_jobs=["77.0"]), time.sleep(1.5)))
    summaries = kinds(recs, "telemetry_summary")
    assert len(summaries) == 2
    for s in summaries:
        assert s["data"]["missing"]["energy_j"] == "not_specified"
        assert s["data"]["missing"]["power_w_avg"] == "not_available"
        assert "power_w_avg" not in s["data"]["values"] and "energy_j" not in s["data"]["values"]
        (gap,) = [g for g in kinds(recs, "unknown_interval") if g["device"] == s["device"]]
        assert gap["data"]["cause"] == "dcgm_no_data" and (gap["ts"], gap["ts_end"]) == (s["ts"], s["ts_end"])
        assert "energy_j=not_specified" in gap["data"]["detail"]


def test_truncated_power_values_are_missing(site):
    recs = prolog_epilog(site, between=lambda: site.control(long_values=True))
    for s in kinds(recs, "telemetry_summary"):
        assert s["data"]["missing"]["power_w_min"] == "truncated"
        assert s["data"]["values"]["power_w_avg"] > 0
    assert not kinds(recs, "unknown_interval")  # other measurements remain: no gap, only a missing field


# Captured from the Debian slurm-wlm 22.05.8 this suite starts (epilog of a suspended+resumed job).
REAL_SCONTROL = (
    "JobId=2 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=tenant "
    "QOS=(null) JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-30T04:28:37 EligibleTime=2026-11-30T04:28:37 AccrueTime=2026-11-30T04:28:37 "
    "StartTime=2026-11-30T04:28:38 EndTime=2026-11-30T04:28:44 Deadline=N/A SuspendTime=2026-11-30T04:28:43 "
    "SecsPreSuspend=2 LastSchedEval=2026-11-30T04:28:38 Scheduler=Main Partition=gpu AllocNode:Sid=localhost:4755 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "JOB_GRES=gpu:1   Nodes=vm CPU_IDs=0 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/tmp/sx StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= TresPerNode=gres:gpu:1 ")


def test_real_scontrol_record_and_suspended_span():
    from ledger.capture.hooks import slurm

    f = slurm.parse_scontrol_oneline(REAL_SCONTROL)
    assert f["TRES"] == "cpu=1,node=1,billing=1" and f["AllocNode:Sid"] == "localhost:4755" and f["Power"] == ""
    rec = slurm.job_record(f)
    assert (rec.state, rec.restarts, rec.exit_code, rec.exit_signal, rec.qos) == ("COMPLETING", 0, 0, 0, None)
    assert rec.end - rec.start == 6 and rec.run_time == 3 and rec.suspended_total() == 3
    # Suspended at start + SecsPreSuspend, resumed at SuspendTime: exactly the 3 s RunTime does not count.
    assert rec.start + rec.secs_pre_suspend + rec.suspended_total() == rec.suspend_time


def test_environment_parsing():
    from ledger.capture.hooks import slurm

    e = slurm.job_env({"SLURM_JOBID": "12", "ROCR_VISIBLE_DEVICES": "0-2,5", "SLURM_JOB_EXIT_CODE2": "1:0"})
    assert e.job_id == "12" and e.gpus == (0, 1, 2, 5) and (e.exit_code, e.exit_signal) == (1, 0)
    assert slurm.job_env({"SLURM_JOB_GPUS": "0"}) is None
    assert slurm.parse_index_list("NoDevFiles") == ([], None) and slurm.parse_duration("1-02:03:04") == 93784


def test_requeue_seen_from_the_environment_without_scontrol(tmp_path):
    site = make_site(tmp_path, tools=("dcgmi", "nvidia-smi"))
    assert run("prolog", env("80"), str(site.config)) == 0
    assert run("epilog", env("80", restart=1), str(site.config)) == 0
    recs = spooled(site)
    assert {r["run"] for r in recs} == {0}
    assert kinds(recs, "allocation_ended")[0]["data"]["state"] == "REQUEUED"


def test_cpu_only_job_records_the_allocation_and_nothing_else(site):
    e = env("81", gpus="")
    del e["CUDA_VISIBLE_DEVICES"]
    assert run("prolog", e, str(site.config)) == 0
    assert run("epilog", e, str(site.config)) == 0
    recs = spooled(site)
    assert sorted(r["kind"] for r in recs) == ["allocation_ended", "allocation_started"]
    assert kinds(recs, "allocation_started")[0]["data"]["gpus"] == 0 and site.dcgm_calls() == []


def test_a_refused_dcgm_job_key_still_lets_the_group_be_deleted() -> None:
    """The epilog's two DCGM removals start together; a job key the allowlist refuses (a damaged or edited state
    file) refuses the pair before either starts, so the group is deleted alone (as when the two ran in turn: the
    delete ran after a failed remove), and the refusal is still raised to be reported."""
    from ledger.capture.hooks.core import _release_dcgm

    started: list[list] = []

    class Spy:
        def run_tools(self, calls):  # noqa: ANN001, ANN202 - checked as commands.run_all checks them
            for program, args in calls:
                commands.check_allowed(program, args)
            started.append(calls)
            return []

    with pytest.raises(commands.CommandRefused):
        _release_dcgm(Spy(), {"job_key": "-z", "group_id": 7})
    assert started == [[("dcgmi", ["group", "-d", "7"])]]
    started.clear()
    _release_dcgm(Spy(), {"job_key": "ipledger-1-0", "group_id": 7})
    assert started == [[("dcgmi", ["stats", "-r", "ipledger-1-0"]), ("dcgmi", ["group", "-d", "7"])]]
