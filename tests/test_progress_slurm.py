"""On a real Slurm: a 2-GPU job marks checkpoints as its user (not root), its GPUs raise XID 79 (the node
collector's samples and DCGM's job statistics show it), its node is taken down, and the receipt shows the marks
and the device-time lost since the last checkpoint, credited under a contract that credits the provider's
failures, with the provider-side evidence it rests on.

Its own private Slurm (tests/slurm_service.py), because the node goes down. The hooks and the job's ``mark``
script run on the system Python with the standard library only, as a site installs them; the job's user is
``nobody``, who may write its run's drop place and nothing of the spool.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.chain.canonical import ts_to_epoch
from ledger.cli.main import cli as ipledger
from ledger.capture import collector
from ledger.capture.hooks.core import dcgm_job_key
from ledger.cli.install_hooks import install, mark_path
from tests import services, slurm_service
from tests.standins import make_site

pytestmark = pytest.mark.slurm
SYSTEM_PY = "/usr/bin/python3"

CONTRACT = """id = "acme-gpu"
version = "2026-12"
currency = "EUR"
unknown_policy = "charge"
provider_failure_loss = "credit"
effective_from = 2000-01-01  # set after the job ran: a contract set without it starts when it is set
[skus.default]
rate_per_gpu_hour = "2.00"
"""


def _wait(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = cond()
        except (OSError, ValueError, KeyError):
            v = None
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def hooked_cluster(prefix: str, accounting: bool):
    """A real Slurm whose prolog/epilog are the hooks `ipledger hooks install` writes, run by the system
    interpreter (the job's user needs one it may run), with a drop place and the stand-in GPU tools:
    yields (slurm, site, the mark script's path). With ``accounting``: slurmdbd, and the shipper's sacct."""
    if not os.path.exists(SYSTEM_PY):
        services.unavailable("the job's user needs an interpreter it may run: /usr/bin/python3")
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o711)  # the job's user passes through to the drop place and the mark script
    node = socket.gethostname().split(".")[0]
    site = make_site(root, node=node, ngpus=4, scontrol_path=slurm_service._which("scontrol"),
                     hooks={"trace": str(root / "trace.jsonl"), "drop_dir": str(root / "drop")},
                     **({"extra_commands": {"sacct": slurm_service._which("sacct")}} if accounting else {}))
    scripts = install(root / "hooks", str(site.config), python=SYSTEM_PY)
    s = slurm_service.start(str(scripts[0]), str(scripts[1]), ngpus=4, accounting=accounting)
    yield s, site, mark_path(root / "hooks")
    s.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    # The final state (NODE_FAIL) is the accounting database's: no hook runs a Slurm command, so the shipper's
    # sacct (real slurmdbd) says how the run ended.
    yield from hooked_cluster("ipledger-progress-", accounting=True)


def _trace(site) -> list[dict]:
    p = site.root / "trace.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_node_fail_receipt_shows_marks_and_credited_loss_since_checkpoint(cluster, tmp_path):
    s, site, mark = cluster
    script = site.root / "job.sh"  # sbatch reads it as the job's user
    script.write_text(f"#!/bin/sh\n{mark} checkpoint --step 100 --strict || exit 3\nsleep 2\n"
                      f"{mark} checkpoint --step 200 --note 'epoch 2' --strict || exit 3\nsleep 300\n")
    script.chmod(0o755)
    sub = subprocess.run(["runuser", "-u", "nobody", "--", slurm_service._which("sbatch"), "--parsable",
                          "--no-requeue", "--gres=gpu:2", "-A", "tenant", "--chdir=/tmp", "-o", "/dev/null",
                          "-e", "/dev/null", str(script)],
                         env=s.env, capture_output=True, text=True, timeout=30)
    assert sub.returncode == 0, sub.stderr
    jid = sub.stdout.strip().split(";")[0]
    rec = s.wait(jid, states=("RUNNING",), timeout=30)
    assert rec["UserId"].startswith("nobody(")
    drop = site.root / "drop" / jid / "marks.jsonl"
    _wait(lambda: len(drop.read_text().splitlines()) >= 2, 30, "the job's second checkpoint mark")
    assert os.stat(drop).st_uid == 65534 and not list(site.spool.glob("mark-*"))
    # another user (daemon) cannot mark this job, even naming it
    other = subprocess.run([str(mark), "checkpoint", "--job", jid, "--strict"], env={"PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=30, user=1, group=1, extra_groups=[])
    assert other.returncode == 1 and "Permission denied" in other.stderr, other.stderr
    # XID 79 (the GPU fell off the bus), 1 s from now: the node collector's dmon batch shows field 230 change
    # to 79 (the stand-in prints the batch at once), and DCGM's job statistics count it, as the real epilog
    # records them.
    now = time.time()
    site.control(dmon_xid={str(g["index"]): [6, 79] for g in site.gpus}, xid_jobs={dcgm_job_key(jid, 0): [1]})
    cfg = collector.CollectorConfig(spool=str(site.spool), node=s.node, source="dcgmi", interval=0.5,
                                    count=80, commands={"dcgmi": str(site.bin / "dcgmi")})
    rep = collector.collect_batch(cfg, now=lambda: now - 2.0)
    assert rep.error is None and rep.devices == 4, rep
    time.sleep(3.0)  # work done after the last checkpoint, lost when the node goes
    s.cmd("scontrol", "update", f"nodename={s.node}", "state=down", "reason=ipledger-test")
    try:
        s.wait(jid, states=("NODE_FAIL",), timeout=30)
        _wait(lambda: any(t["hook"] == "epilog" and t["job_id"] == jid for t in _trace(site)), 60,
              "the epilog of the failed job")
    finally:
        s.cmd("scontrol", "update", f"nodename={s.node}", "state=resume", check=False)

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    runner = CliRunner()
    contract = tmp_path / "acme.toml"
    contract.write_text(CONTRACT)
    env = {"SLURM_CONF": str(s.conf)}
    for argv in (["init"], ["contract", "set", str(contract)],
                 ["--config", str(site.config), "ship", "--spool", str(site.spool)],
                 ["--config", str(site.config), "reconcile", "--json"]):
        r = runner.invoke(ipledger, ["--db", db, *argv], env=env)
        assert r.exit_code == 0, (argv, r.output)
    # slurmctld hands the finished job to slurmdbd asynchronously: ship again until sacct has the run.
    ship = ["--db", db, "--config", str(site.config), "ship", "--spool", str(site.spool), "--json"]
    _wait(lambda: json.loads(runner.invoke(ipledger, ship, env=env).stdout)["accounting"]["still_pending_count"]
          == 0, 60, "the accounting record of the failed job")
    r = runner.invoke(ipledger, ["--db", db, "receipt", jid, "--format", "json"])
    assert r.exit_code == 0, r.output
    receipt = json.loads(r.output)
    p = receipt["progress"]
    assert p["end_state"] == "NODE_FAIL"
    assert p["marks"] == {"count": 2, "checkpoint": 2, "output": 0, "step": 0} and p["last_step"] == 200
    lost = p["lost_since_checkpoint"]
    assert lost["from"] == p["last_checkpoint"] and lost["from_basis"] == "checkpoint"
    assert lost["to"] == receipt["window"]["end"]
    since = ts_to_epoch(receipt["window"]["end"]) - ts_to_epoch(p["last_checkpoint"])
    assert len(receipt["job"]["devices"]) == 2
    assert lost["gpu_hours"] == pytest.approx(2 * since / 3600, abs=1e-9)
    assert 2.0 <= since <= 60, since  # slept 3 s after the mark, then the node went (Slurm's EndTime: whole seconds)
    assert (lost["provider_failure"], lost["billed_as"]) == ("NODE_FAIL", "credit")
    # what the answer rests on, and who controls it: the scheduler's node failure (provider-side), and DCGM's
    # count of the XID, read where the hooks record it (the summaries' values; one per GPU), which names no XID
    assert lost["evidence"][0] == {"what": "end_state", "value": "NODE_FAIL", "controlled_by": "scheduler",
                                   "provider_side": True}
    assert {"what": "dcgm_critical_xid_errors", "value": 2, "controlled_by": "vendor_tool",
            "provider_side": False} in lost["evidence"]
    xids = [e for e in lost["evidence"] if e["what"] == "xid"]
    assert sorted(e["device"] for e in xids) == sorted(d["uuid"] for d in receipt["job"]["devices"])
    assert all((e["value"], e["class"], e["provider_side"]) == (79, "hardware", True) for e in xids)
    assert receipt["method"]["fidelity"] == "samples"
    assert p["marks_controlled_by"] == "job_user"
    assert receipt["contract"]["provider_failure_loss"] == "credit"
    assert receipt["billing"]["lost_since_checkpoint_credited"] == pytest.approx(lost["gpu_hours"], abs=2e-9)
    assert receipt["billing"]["gpu_hours_billed"] == pytest.approx(
        receipt["billing"]["gpu_hours_paid"] - lost["gpu_hours"], abs=2 / 3600)  # each device rounded up to 1 s
    text = runner.invoke(ipledger, ["--db", db, "receipt", jid])
    assert "NODE_FAIL" in text.output and "lost since last checkpoint" in text.output, text.output
