"""Outages (issue 9 point 3): what the ledger keeps when the parts around the hooks fail.

* DCGM or amd-smi hangs: every call is cut at ``hook_timeout_s``; the run gets an ``unknown_interval``
  (``dcgm_timeout`` / ``amdsmi_timeout``) per GPU over exactly the allocation, no summary, and its receipt
  counts those hours as unknown — never as delivered or idle.
* The spool cannot be written (unwritable: a non-root hook and mode 000; full: a tiny tmpfs filled up,
  ENOSPC; RLIMIT_FSIZE 0, EFBIG, which also stands in for "full" where mounting is not allowed): the hook
  still exits 0, says SPOOL WRITE FAILED with what was lost on stderr and in ``[hooks] error_log``, and
  ``ipledger reconcile`` later closes the run with an ``epilog_missing`` unknown interval.
* PostgreSQL stopped in the middle of a burst of jobs on the real Slurm, with a shipper running throughout:
  the hooks never notice, shipping fails while it is down and leaves the spool alone, and once it is back one
  ``ipledger ship`` leaves every entry exactly once, ``verify`` passes and every run's receipt balances.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import ledger
from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.canonical import ts_to_epoch
from ledger.cli.main import cli as ipledger
from ledger.cli.install_hooks import install
from tests import services, slurm_service
from tests.standins import make_site

ROOT = Path(ledger.__file__).resolve().parent.parent


def _slurm_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _record(job: str, start: int, end: int | None = None, state: str = "RUNNING") -> str:
    run_time = f"00:00:{(end or start) - start:02d}"
    return (f"JobId={job} JobName=wrap UserId=root(0) Account=tenant QOS=normal JobState={state} Restarts=0 "
            f"ExitCode=0:0 RunTime={run_time} StartTime={_slurm_time(start)} "
            f"EndTime={_slurm_time(end) if end else 'Unknown'} Partition=gpu NodeList=node1 "
            f"TRES=cpu=1,node=1,gres/gpu=2")


def _env(job: str, gpus: str = "0,1") -> dict:
    # slurmd's minimal environment: no PATH
    return {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
            "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1",
            "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus}


def _entries(db: str, job_id: str | None = None) -> list:
    eng = db_mod.make_engine(db)
    try:
        return [c.entry for c in store.iter_entries(eng, job_id=job_id)]
    finally:
        eng.dispose()


def _cli(runner, *argv: str, ok: bool = True):
    r = runner.invoke(ipledger, list(argv))
    if ok:
        assert r.exit_code == 0, (argv, r.output)
    return r


def assert_balanced(receipt: dict) -> None:
    """paid = delivered + throttled + underutilized + starved + idle_held + unknown, overall and per device."""
    def parts(h: dict) -> float:
        return (h["delivered"] + sum(h["throttled"].values()) + h["underutilized"] + h["starved"] + h["idle_held"]
                + h["unknown"])

    assert abs(receipt["gpu_hours"]["paid"] - parts(receipt["gpu_hours"])) <= 1e-9, receipt["gpu_hours"]
    for d in receipt.get("devices", []):
        assert abs(d["gpu_hours"]["paid"] - parts(d["gpu_hours"])) <= 1e-9, d


# --- DCGM / amd-smi hanging --------------------------------------------------------------------------------------

HANGS = {
    # nv-hostengine accepts connections and never answers, from before the prolog; nvidia-smi still works
    "dcgm": dict(tools=("dcgmi", "nvidia-smi", "scontrol"), control={"hang_s": 30}, before_prolog=True,
                 cause="dcgm_timeout", stages={"dcgm start", "dcgm stats"}),
    # amd-smi answers at the prolog (inventory, counter snapshot) and hangs by the epilog
    "amd-smi": dict(tools=("amd-smi", "scontrol"), control={"amd_hang_s": 30}, before_prolog=False,
                    cause="amdsmi_timeout", stages={"amd-smi counters"}),
}


@pytest.mark.parametrize("tool", sorted(HANGS))
def test_hung_gpu_tool_times_out_and_the_run_is_unknown_not_measured(tool, tmp_path, runner):
    hang = HANGS[tool]
    site = make_site(tmp_path, tools=hang["tools"], timeout=0.5, hooks={"trace": str(tmp_path / "trace.jsonl")})
    if hang["before_prolog"]:
        site.control(**hang["control"])
    start = int(time.time()) - 4
    site.scontrol_record("71", _record("71", start))
    hooks = install(tmp_path / "hooks", str(site.config))
    t0 = time.time()
    p = subprocess.run([str(hooks[0])], env=_env("71"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    site.control(**hang["control"])
    end = int(time.time())
    site.scontrol_record("71", _record("71", start, end, "COMPLETING"))
    p = subprocess.run([str(hooks[1])], env=_env("71"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    # At most five calls (DCGM: discovery, group create; stats -x, -j, -r), each cut at 0.5 s, not 30 s.
    assert time.time() - t0 < 15
    assert "timed out" in p.stderr or "timeout" in p.stderr, p.stderr
    trace = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [t["hook"] for t in trace] == ["prolog", "epilog"] and all(t["elapsed_s"] < 6 for t in trace)

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    _cli(runner, "--db", db, "init")
    _cli(runner, "--db", db, "ship", "--spool", str(site.spool))
    es = _entries(db, "71")
    bound = sorted(e.device for e in es if e.kind == "device_bound")
    assert len(bound) == 2 and all(bound)  # the GPUs are known (nvidia-smi / the prolog's amd-smi answered)
    (started,) = [e for e in es if e.kind == "allocation_started"]
    (ended,) = [e for e in es if e.kind == "allocation_ended"]
    gaps = [e for e in es if e.kind == "unknown_interval"]
    assert sorted(g.device for g in gaps) == bound
    for g in gaps:
        assert g.data["cause"] == hang["cause"] and (g.ts, g.ts_end) == (started.ts, ended.ts)
    assert not [e for e in es if e.kind == "telemetry_summary"], "a hung tool measured nothing"
    assert {e.data["stage"] for e in es if e.kind == "hook_error"} >= hang["stages"]
    receipt = json.loads(_cli(runner, "--db", db, "receipt", "71", "--format", "json").output)
    assert_balanced(receipt)
    hours = receipt["gpu_hours"]
    assert hours["paid"] > 0 and hours["unknown"] == pytest.approx(hours["paid"]) and hours["delivered"] == 0
    assert {u["cause"] for u in receipt["unknown_intervals"]} == {hang["cause"]}


# --- the spool unwritable or full --------------------------------------------------------------------------------

def _python_for(user: str) -> str | None:
    """An interpreter ``user`` may run (the test venv may live under /root); the hooks need only the stdlib."""
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run(services.as_user(user, [py, "-I", "-S", "-c", "pass"]),
                                                 capture_output=True, timeout=30).returncode == 0:
            return py
    return None


def _mount_tmpfs(path: Path, size_kb: int) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", "tmpfs", str(path)],
                          capture_output=True, timeout=30).returncode == 0


def _fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _no_file_growth() -> None:  # preexec: every write that extends a file fails with EFBIG instead of SIGXFSZ
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


@pytest.fixture
def world_readable_dir():
    # pytest's tmp_path is root's 0700 directory; the unwritable case runs the hook as nobody.
    d = Path(tempfile.mkdtemp(prefix="ipledger-outage-"))
    os.chmod(d, 0o755)
    yield d
    if os.path.ismount(d / "spool-fs"):
        subprocess.run(["umount", "-l", str(d / "spool-fs")], capture_output=True, timeout=30)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("failure", ["unwritable", "full", "rlimit_fsize"])
def test_spool_failure_exits_zero_logs_loudly_and_reconcile_closes_the_run(failure, world_readable_dir, runner):
    root = world_readable_dir
    how = failure
    spool_dir = root / "spool"
    if failure == "full" and _mount_tmpfs(root / "spool-fs", 256):
        spool_dir = root / "spool-fs" / "spool"
    elif failure == "full":
        how = "rlimit_fsize"  # no mount allowed here: a file-size limit fails writes the same way (EFBIG)
    error_log = root / "hook-errors.log"
    error_log.touch(mode=0o666)
    os.chmod(error_log, 0o666)
    # DCGM where the hook runs as root with its files elsewhere (its stand-in keeps state on disk)
    tools = ("nvidia-smi", "scontrol") + (("dcgmi",) if how == "full" else ())
    site = make_site(root, tools=tools, hooks={"error_log": str(error_log)})
    cfg = site.config.read_text().replace(f'spool = "{site.spool}"', f'spool = "{spool_dir}"')
    site.config.write_text(cfg)
    user, python, preexec = "root", sys.executable, None
    if how == "unwritable":
        user = "nobody" if os.geteuid() == 0 else None
        python = _python_for(user) if user else sys.executable
        if python is None:
            services.unavailable("no Python interpreter the user nobody can run")
    elif how == "rlimit_fsize":
        preexec = _no_file_growth
    hooks = install(root / "hooks", str(site.config), python=python)
    start = int(time.time()) - 3
    site.scontrol_record("61", _record("61", start))
    p = subprocess.run([str(hooks[0])], env=_env("61"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "SPOOL" not in p.stderr, p.stderr
    db = f"sqlite:///{root / 'ledger.db'}"
    _cli(runner, "--db", db, "init")
    _cli(runner, "--db", db, "ship", "--spool", str(spool_dir))
    assert len([e for e in _entries(db, "61") if e.kind == "device_bound"]) == 2

    # The spool fails now: the epilog's entries cannot be kept.
    if how == "unwritable":
        os.chmod(spool_dir, 0o000)
    elif how == "full":
        _fill(spool_dir.parent)
    end = int(time.time()) + 2  # at or after the prolog's own clock, which is the run's start
    site.scontrol_record("61", _record("61", start, end, "COMPLETING"))
    argv = services.as_user(user, [str(hooks[1])]) if user not in (None, "root") else [str(hooks[1])]
    argv[0] = shutil.which(argv[0]) or argv[0]  # the hook's environment has no PATH
    p = subprocess.run(argv, env=_env("61"), capture_output=True, text=True, timeout=60, preexec_fn=preexec)
    assert p.returncode == 0, p.stderr
    loud = [line for line in p.stderr.splitlines() if "SPOOL WRITE FAILED" in line]
    assert len(loud) == 1, p.stderr
    assert all(w in loud[0] for w in ("job 61", "epilog failed", str(spool_dir), "NOT recorded",
                                      "allocation_ended", "ipledger reconcile")), loud[0]
    if how == "full":  # the DCGM record and group are cleaned up all the same (DCGM holds at most 64 groups)
        dcgm = json.loads((site.state / "dcgm.json").read_text())
        assert dcgm["groups"] == {} and dcgm["jobs"] == {}, dcgm
    if how != "rlimit_fsize":  # with RLIMIT_FSIZE no file can grow, the error log included: stderr only
        assert "SPOOL WRITE FAILED" in error_log.read_text() and "job 61" in error_log.read_text()

    # The operator frees the spool; nothing of the epilog was kept, so reconcile has to close the run.
    if how == "unwritable":
        os.chmod(spool_dir, 0o750)
    elif how == "full":
        (spool_dir.parent / "filler").unlink()
    assert not list(spool_dir.glob("*.jsonl*")), "a failed write leaves no file, complete-looking or partial"
    site.scontrol_record("61", _record("61", start, end, "COMPLETED"))
    out = json.loads(_cli(runner, "--db", db, "--config", str(site.config), "reconcile", "--json").output)
    assert [c["job_id"] for c in out["closed"]] == ["61"]
    es = _entries(db, "61")
    (started,) = [e for e in es if e.kind == "allocation_started"]
    (ended,) = [e for e in es if e.kind == "allocation_ended"]
    assert ended.data["cause"] == "epilog_missing" and ended.data["state"] == "COMPLETED"
    assert ts_to_epoch(ended.ts) == end
    gaps = [e for e in es if e.kind == "unknown_interval"]
    assert sorted(g.device for g in gaps) == sorted(e.device for e in es if e.kind == "device_bound")
    assert all(g.data["cause"] == "epilog_missing" and (g.ts, g.ts_end) == (started.ts, ended.ts) for g in gaps)
    _cli(runner, "--db", db, "verify")
    receipt = json.loads(_cli(runner, "--db", db, "receipt", "61", "--format", "json").output)
    assert_balanced(receipt)
    hours = receipt["gpu_hours"]
    assert hours["paid"] > 0 and hours["unknown"] == pytest.approx(hours["paid"])


def test_spool_loss_goes_to_syslog_as_an_error(tmp_path, monkeypatch):
    import syslog

    from ledger.capture.hooks import run

    sent = []
    monkeypatch.setattr(syslog, "syslog", lambda priority, msg: sent.append((priority, msg)))
    blocked = tmp_path / "spool"
    blocked.write_text("a file where the spool directory should be")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{blocked}"\n')
    assert run("prolog", _env("62"), str(cfg)) == 0
    assert run("epilog", _env("62"), str(cfg)) == 0
    prolog_loss, epilog_loss = [m for p, m in sent if p == syslog.LOG_ERR]
    assert "prolog failed: SPOOL WRITE FAILED" in prolog_loss and "allocation_started" in prolog_loss
    assert "its epilog" in prolog_loss  # what could still repair it
    assert "epilog failed: SPOOL WRITE FAILED" in epilog_loss and "allocation_ended" in epilog_loss
    assert "ipledger reconcile" in epilog_loss
    assert all(p == syslog.LOG_WARNING for p, m in sent if "SPOOL WRITE FAILED" not in m)


# --- PostgreSQL stopped mid-burst on the real Slurm -------------------------------------------------------------

def _wait(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = cond()
        except (OSError, ValueError):  # a trace line being written
            v = None
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Shipper(threading.Thread):
    """``ipledger ship`` in a loop, as the systemd timer runs it: each attempt a fresh process."""

    def __init__(self, url: str, spool: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.spool = url, spool
        self.attempts: list[dict] = []  # {t0, t1, rc, report}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t0 = time.time()
            p = subprocess.run([sys.executable, "-m", "ledger.cli.main", "--db", self.url, "ship", "--spool",
                                str(self.spool), "--json", "--quiet"], capture_output=True, text=True, timeout=120,
                               cwd=ROOT)
            report = json.loads(p.stdout) if p.returncode == 0 else None
            self.attempts.append({"t0": t0, "t1": time.time(), "rc": p.returncode, "report": report,
                                  "stderr": p.stderr[-300:]})
            self.halt.wait(1.0)

    def appended(self) -> int:
        return sum(a["report"]["appended"] for a in self.attempts if a["report"])


def _spool_ids(spool: Path) -> list[str]:
    """Entry ids of every record the hooks wrote (shipped or not)."""
    ids = []
    for f in spool.rglob("*.jsonl"):
        ids += [json.loads(line)["entry_id"] for line in f.read_text().splitlines() if line.strip()]
    return ids


@pytest.mark.slurm
@pytest.mark.postgres
def test_postgres_stopped_mid_burst_leaves_every_entry_exactly_once(tmp_path_factory, runner, trials):
    n_jobs = trials(20, 60)
    pg = services.start_postgres()  # private: stopping it disturbs no other test
    s = shipper = None
    try:
        url = pg.create_db("ipledger_outage")
        _cli(runner, "--db", url, "init")
        root = tmp_path_factory.mktemp("outage-slurm")
        # No DCGM here: what is under test is delivery, and the stand-in's process starts would dominate the run.
        site = make_site(root, node=socket.gethostname().split(".")[0], ngpus=8, tools=("nvidia-smi", "scontrol"),
                         scontrol_path=slurm_service._which("scontrol"), hooks={"trace": str(root / "trace.jsonl")})
        prolog, epilog = install(root / "hooks", str(site.config))[:2]  # the node hooks
        s = slurm_service.start(str(prolog), str(epilog), ngpus=8)

        def traces() -> list[dict]:
            p = root / "trace.jsonl"
            return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

        def epilogs() -> set[str]:
            return {t["job_id"] for t in traces() if t["hook"] == "epilog"}

        def burst(n: int) -> list[str]:
            return [s.sbatch("--gres=gpu:1", "-A", "tenant", "--wrap", "sleep 0.2") for _ in range(n)]

        # Half the burst before the outage (still running when it starts), half during it: jobs certainly
        # start, finish and spool while the database is down, whatever the machine's speed.
        before = burst(n_jobs // 2)
        shipper = Shipper(url, site.spool)
        shipper.start()
        _wait(lambda: epilogs() and shipper.appended() > 0, 180, "the first shipments")
        stopped_at = time.time()
        pg.pg_ctl("stop")
        try:
            during = burst(n_jobs - len(before))
            _wait(lambda: epilogs() >= set(during) and any(a["t0"] > stopped_at for a in shipper.attempts), 180,
                  "the second half of the burst to finish while the db is down")
        finally:
            started_at = time.time()
            pg.pg_ctl("start")
        ids = before + during
        _wait(lambda: epilogs() >= set(ids), 240, "every epilog")
        shipper.halt.set()
        shipper.join(timeout=150)

        # The hooks never noticed: all exited 0 within their budget and the node took every job.
        ts = traces()
        assert len(ts) == 2 * n_jobs and all(t["ok"] and t["elapsed_s"] < 10 for t in ts), ts
        assert not s.node_state().startswith(("drain", "down")), s.node_state()
        # Shipping during the outage failed, and said so; before it, it worked.
        down = [a for a in shipper.attempts if a["t0"] > stopped_at and a["t1"] < started_at]
        assert down and all(a["rc"] != 0 for a in down), down
        assert any(a["rc"] == 0 and a["report"]["appended"] for a in shipper.attempts if a["t1"] < stopped_at)

        final = json.loads(_cli(runner, "--db", url, "ship", "--spool", str(site.spool), "--json").output)
        again = json.loads(_cli(runner, "--db", url, "ship", "--spool", str(site.spool), "--json").output)
        assert again["records"] == 0 and not list(site.spool.glob("*.jsonl")), (final, again)
        written = _spool_ids(site.spool)
        assert len(written) == len(set(written))
        entries = _entries(url)
        facts = [e.entry_id for e in entries if e.kind != "receipt_issued"]
        assert sorted(facts) == sorted(written), "every entry the hooks wrote, exactly once, nothing else"
        for job in ids:
            kinds = [e.kind for e in entries if e.job_id == job and e.kind != "receipt_issued"]
            assert kinds.count("allocation_started") == 1 and kinds.count("allocation_ended") == 1, (job, kinds)
        _cli(runner, "--db", url, "verify")  # the chain and every issued receipt's replay
        issued = [e for e in entries if e.kind == "receipt_issued"]
        assert sorted(e.job_id for e in issued) == sorted(ids), "one automatic receipt per run"
        for e in issued:
            assert_balanced(e.data["receipt"])
    finally:
        if shipper is not None:
            shipper.halt.set()
        if s is not None:
            s.stop()
        pg.stop()
