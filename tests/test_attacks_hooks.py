"""The hooks under hostile or broken conditions (issue 13, point 5; and the hook-state symlink of point 1).

Each test reproduces one attack on the installed hook scripts, run the way slurmd runs them (as root, a
minimal environment without PATH, a separate process), and asserts the safe outcome: bounded memory and time,
nothing written outside the spool, every record kept, nothing recorded as zero that was not measured.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger.capture.hooks import slurm
from ledger.cli.install_hooks import install
from tests.standins import make_site
from tests.test_hooks import kinds as _kinds
from tests.test_hooks import spooled as _records


def _env(job: str = "61", gpus: str = "0,1", **extra) -> dict:
    e = {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
         "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1",
         "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": gpus, "SLURM_JOB_EXIT_CODE2": "0:0"}
    e.update(extra)
    return e


def _hooks(site, tmp_path):
    return install(tmp_path / "hooks", str(site.config))


def _run(script, env, timeout=60) -> subprocess.CompletedProcess:
    p = subprocess.run([str(script)], env=env, capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: killed, waiting for whoever inherited it to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _tool(site, name: str, body: str) -> None:
    """Replace a stand-in with a shell script (the hooks run it by absolute path, as configured)."""
    path = site.bin / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def test_a_tool_that_prints_endlessly_is_cut_and_the_hook_stays_small(tmp_path):
    """Was: 2.9 GB RSS (output buffered without a bound). Now: killed at the cap, the cause recorded."""
    site = make_site(tmp_path, tools=("nvidia-smi",), timeout=20.0)
    _tool(site, "nvidia-smi", "exec /usr/bin/yes 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)'")
    hooks = _hooks(site, tmp_path)
    # Peak memory through a small wrapper: a child's ru_maxrss starts from its parent's high-water mark at
    # fork and exec, so measured from the (large) test process it would be the test's, not the hook's.
    wrapper = ("import resource, subprocess, sys; subprocess.run([sys.argv[1]], env=%r, capture_output=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)" % _env())
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-I", "-S", "-c", wrapper, str(hooks[0])], capture_output=True, text=True,
                       timeout=60)
    assert time.monotonic() - t0 < 15
    peak_kib = int(p.stdout.strip())
    assert 0 < peak_kib < 100 * 1024, f"hook peaked at {peak_kib} KiB"  # was 2.9 GB; the cap is 4 MiB of output
    recs = _records(site)
    errors = [e["data"]["error"] for e in _kinds(recs, "hook_error")]
    assert any("output_truncated" in e for e in errors), errors
    assert len(_kinds(recs, "device_bound")) == 2 and len(_kinds(recs, "allocation_started")) == 1


def test_fourteen_kilobytes_of_gpu_ranges_are_fast_and_capped():
    """Was: 254 s and a 3 GB spool file (the cap was per range). Now: distinct GPUs, at most MAX_GPUS."""
    text = ",".join(["0-4095"] * 2000)[:14_000]
    t0 = time.perf_counter()
    gpus, note = slurm.parse_index_list(text)
    assert time.perf_counter() - t0 < 0.5
    assert len(gpus) == slurm.MAX_GPUS and "cut" in note
    assert slurm.parse_index_list("0-3,1-2") == ([0, 1, 2, 3], None)  # overlapping ranges count once
    worst = ",".join(["0-255"] * 2400)  # every range full-size, all of them duplicates
    t0 = time.perf_counter()
    assert slurm.parse_index_list(worst)[0] == list(range(256))
    assert time.perf_counter() - t0 < 1.0


def test_gpu_ranges_in_the_hook_env_write_a_bounded_spool_and_say_so(tmp_path):
    site = make_site(tmp_path, tools=(), timeout=2.0)
    hooks = _hooks(site, tmp_path)
    t0 = time.monotonic()
    _run(hooks[0], _env(gpus=",".join(["0-4095"] * 2000)[:14_000]))
    assert time.monotonic() - t0 < 10
    size = sum(f.stat().st_size for f in site.spool.glob("*.jsonl"))
    assert size < 1 << 20, size
    recs = _records(site)
    assert len(_kinds(recs, "device_bound")) == slurm.MAX_GPUS
    assert any("cut" in e["data"]["error"] for e in _kinds(recs, "hook_error"))


@pytest.mark.parametrize("var", ["SLURM_JOB_ACCOUNT", "SLURM_JOB_USER", "SLURM_JOB_PARTITION", "SLURMD_NODENAME"])
def test_a_non_utf8_byte_is_kept_escaped_and_the_run_recorded(tmp_path, var):
    """Was: both hooks recorded nothing. Now: every record, the value escaped (\\xff), the hook saying so."""
    site = make_site(tmp_path, tools=("nvidia-smi",))
    hooks = _hooks(site, tmp_path)
    env = {k.encode(): v.encode() for k, v in _env().items()}
    env[var.encode()] = b"ab\xffc"
    _run(hooks[0], env)
    _run(hooks[1], env)
    recs = _records(site)
    assert len(_kinds(recs, "allocation_started")) == 1 and len(_kinds(recs, "allocation_ended")) == 1
    assert len(_kinds(recs, "device_bound")) == 2
    field = {"SLURM_JOB_ACCOUNT": "account", "SLURM_JOB_USER": "user", "SLURM_JOB_PARTITION": "partition"}
    started = _kinds(recs, "allocation_started")[0]
    if var in field:
        assert started["data"][field[var]] == "ab\\xffc"
    else:
        assert started["node"] == "ab\\xffc"
    assert any(var in e["data"]["error"] for e in _kinds(recs, "hook_error"))


def test_a_hung_gpu_tool_binds_devices_by_index_and_the_receipt_pays_them_as_unknown(tmp_path, runner, cli):
    """Was: device_bound with uuid null and a receipt of 0 devices, paid 0. Now: bound by index, time unknown."""
    site = make_site(tmp_path, tools=("nvidia-smi",), timeout=0.5)
    site.control(nvsmi_hang_s=30)
    hooks = _hooks(site, tmp_path)
    _run(hooks[0], _env())
    time.sleep(1.0)
    _run(hooks[1], _env())
    recs = _records(site)
    bound = _kinds(recs, "device_bound")
    assert sorted(b["device"] for b in bound) == ["index:node1:0", "index:node1:1"]
    gaps = _kinds(recs, "unknown_interval")
    assert sorted(g["device"] for g in gaps) == ["index:node1:0", "index:node1:1"]
    assert {g["data"]["cause"] for g in gaps} == {"device_uuid_unknown"}
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert runner.invoke(cli, ["--db", db, "init"]).exit_code == 0
    assert runner.invoke(cli, ["--db", db, "ship", "--spool", str(site.spool), "--no-receipts"]).exit_code == 0
    r = runner.invoke(cli, ["--db", db, "receipt", "61", "--format", "json"])
    assert r.exit_code == 0, r.output
    receipt = json.loads(r.output)
    assert len(receipt["job"]["devices"]) == 2
    hours = receipt["gpu_hours"]
    assert hours["paid"] > 0 and hours["unknown"] == pytest.approx(hours["paid"])
    assert "device_uuid_unknown" in receipt["unknown_by_cause"]


def test_hung_tools_share_one_deadline_and_their_grandchildren_die_with_them(tmp_path):
    """Was: 4 x hook_timeout_s, and grandchildren kept running. Now: one deadline; the process group is killed."""
    site = make_site(tmp_path, tools=("dcgmi", "nvidia-smi"), timeout=1.0)
    pids = tmp_path / "pids"
    for name in ("dcgmi", "nvidia-smi"):
        _tool(site, name, f"/bin/sleep 60 & echo $! >> {pids}\nwait")
    hooks = _hooks(site, tmp_path)
    t0 = time.monotonic()
    _run(hooks[0], _env())
    took = time.monotonic() - t0
    assert took < 1.0 + 2.5, took  # nvidia-smi, dcgmi discovery, group create...: all within one 1 s budget
    time.sleep(0.2)
    alive = [pid for pid in map(int, pids.read_text().split()) if _alive(pid)]
    for pid in alive:
        os.kill(pid, 9)
    assert not alive, f"grandchildren {alive} outlived the hook"


@pytest.mark.parametrize("value", ["inf", "nan", "-1.0", "1e9"])
def test_an_unusable_hook_timeout_still_records_within_the_default_budget(tmp_path, value):
    """Was: hook_timeout_s = inf recorded nothing (a hung tool held the hook for ever). Now: the default
    budget is used and the hook says why."""
    site = make_site(tmp_path, tools=("nvidia-smi",))
    text = site.config.read_text().replace("hook_timeout_s = 3.0", f"hook_timeout_s = {value}")
    site.config.write_text(text)
    site.control(nvsmi_hang_s=60)
    hooks = _hooks(site, tmp_path)
    t0 = time.monotonic()
    _run(hooks[0], _env())
    assert time.monotonic() - t0 < 5.0 + 5.0
    recs = _records(site)
    assert len(_kinds(recs, "allocation_started")) == 1 and len(_kinds(recs, "device_bound")) == 2
    assert any(e["data"]["stage"] == "config" and "hook_timeout_s" in e["data"]["error"]
               for e in _kinds(recs, "hook_error"))


def test_newlines_in_a_job_id_or_tool_output_cannot_inject_log_lines(tmp_path):
    log = tmp_path / "errors.log"
    site = make_site(tmp_path, tools=("nvidia-smi",), hooks={"error_log": str(log)})
    _tool(site, "nvidia-smi", "printf 'bad\\nipledger-hook: job 1: FORGED\\n' >&2; exit 9")
    hooks = _hooks(site, tmp_path)
    p = _run(hooks[0], _env(job="61\nipledger-hook: job 2: FORGED"))
    # Every line is one of the hook's own, about job 61 (its id's newline escaped), however much was injected.
    err_lines = p.stderr.decode().splitlines()
    assert err_lines and all(x.startswith("ipledger-hook: job 61\\x0aipledger-hook: job 2: FORGED: ")
                             for x in err_lines), err_lines
    log_lines = log.read_text().splitlines()
    assert len(log_lines) == len(err_lines) and all(
        re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \S+ ipledger-hook\[\d+\]: job 61\\x0a.*", x)
        for x in log_lines), log_lines
    assert any("bad\\x0aipledger-hook: job 1: FORGED" in x for x in log_lines)
    assert "\\x0a" in log.read_text()


def test_a_symlink_at_the_hook_state_temp_file_is_not_followed(tmp_path):
    """Was: a symlink at hook-state/<job>.json.tmp made the root prolog truncate, overwrite and chmod its
    target. Now: the name is replaced, the target untouched; a symlinked state file or directory is not read."""
    site = make_site(tmp_path, tools=("nvidia-smi",))
    hooks = _hooks(site, tmp_path)
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    target.chmod(0o600)
    state_dir = site.spool / "hook-state"
    state_dir.mkdir(parents=True)
    (state_dir / "61.json.tmp").symlink_to(target)
    _run(hooks[0], _env())
    assert target.read_text() == "root's file\n" and (target.stat().st_mode & 0o777) == 0o600
    state = state_dir / "61.json"
    assert state.is_file() and not state.is_symlink() and json.loads(state.read_text())["run"] == 0
    assert not (state_dir / "61.json.tmp").exists() and not (state_dir / "61.json.tmp").is_symlink()

    # A state file that is a symlink (to attacker-chosen JSON) is not read; the epilog records what it knows.
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({"run": 7, "start": 0, "devices": [], "cluster": "evil"}))
    state.unlink()
    state.symlink_to(forged)
    _run(hooks[1], _env())
    ended = _kinds(_records(site), "allocation_ended")
    assert [(e["run"], e["cluster"]) for e in ended] == [(0, "c1")]
    assert forged.exists() and json.loads(forged.read_text())["run"] == 7  # the epilog's unlink took the link

    # A regular state file written by another user (whoever can write the spool) is not believed either.
    _run(hooks[0], _env(job="63"))
    forged_state = state_dir / "63.json"
    forged_state.write_text(json.dumps({"run": 9, "start": 0, "devices": [], "cluster": "evil"}))
    os.chown(forged_state, 65534, 65534)  # nobody
    _run(hooks[1], _env(job="63"))
    ended = _kinds([r for r in _records(site) if r["job_id"] == "63"], "allocation_ended")
    assert [(e["run"], e["cluster"]) for e in ended] == [(0, "c1")]

    # The whole state directory a symlink: refused (the prolog still records the allocation).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state_dir.rename(tmp_path / "old-state")
    state_dir.symlink_to(elsewhere)
    _run(hooks[0], _env(job="62"))
    assert list(elsewhere.iterdir()) == []
    recs = [r for r in _records(site) if r["job_id"] == "62"]
    assert len(_kinds(recs, "allocation_started")) == 1
    assert any(e["data"]["stage"] == "state" for e in _kinds(recs, "hook_error"))


def test_the_hooks_import_nothing_but_the_standard_library_after_the_bounds():
    """The bounds live on the hook's fast path; they must not pull in anything outside the standard library."""
    code = ("import sys; sys.path.insert(0, %r); import ledger.capture.hooks.core, ledger.capture.hooks.controller; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'click', 'pandas', "
            "'numpy', 'subprocess', 'signal', 'json')))" % str(Path(__file__).resolve().parents[1]))
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
