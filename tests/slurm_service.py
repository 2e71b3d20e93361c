"""A real single-node Slurm for the tests (no mock scheduler): munged, slurmctld and slurmd from Debian's slurm-wlm.

Everything is private to a temp dir: munge key and socket, slurm.conf/gres.conf, state and spool dirs, pid and
log files, and fake GPUs made as character devices (``mknod DIR/nvidiaN c 195 N``) listed in gres.conf, so
Slurm sets ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` in the prolog and epilog. Ports are free ones on
127.0.0.1; ``Prolog=``/``Epilog=`` are the scripts ``ipledger hooks install`` wrote. Needs root (munged, slurmd
and mknod). :func:`start` calls ``tests.services.unavailable`` with the daemons' log tails when it cannot start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import services

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)),
                                      None)


@dataclass
class Slurm:
    root: Path
    conf: Path
    node: str
    cluster: str
    pids: dict = field(default_factory=dict)

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def cmd(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        p = subprocess.run([_which(argv[0]) or argv[0], *argv[1:]], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()} {self.log_tail()}")
        return p

    def sbatch(self, *args: str) -> str:
        out = self.cmd("sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", *args).stdout.strip()
        return out.split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        from ledger.hooks.slurm import parse_scontrol_oneline

        p = self.cmd("scontrol", "show", "job", "-o", job_id, check=False)
        return parse_scontrol_oneline(p.stdout) if p.returncode == 0 else {}

    def wait(self, job_id: str, states=("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"),
             timeout: float = 60, restarts: int | None = None) -> dict[str, str]:
        deadline = time.time() + timeout
        rec: dict[str, str] = {}
        while time.time() < deadline:
            rec = self.job(job_id)
            if rec.get("JobState") in states and (restarts is None or rec.get("Restarts") == str(restarts)):
                return rec
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} did not reach {states} in {timeout}s: {rec.get('JobState')} "
                             f"{rec.get('Reason')}\n{self.log_tail()}")

    def node_state(self) -> str:
        return self.cmd("sinfo", "-h", "-n", self.node, "-o", "%T", check=False).stdout.strip()

    def log_tail(self, n: int = 15) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.root / "log" / name
            if p.exists():
                lines = p.read_text(errors="replace").splitlines()[-n:]
                parts.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, keep_logs: bool = False) -> None:
        # Jobs first, so no slurmstepd or job script outlives the daemons.
        if self.pids.get("slurmctld"):
            self.cmd("scancel", "--full", "-u", "root", check=False)
            deadline = time.time() + 15
            while time.time() < deadline and self.cmd("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.3)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(name)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if keep_logs or os.environ.get("IPLEDGER_KEEP_SLURM"):
            return
        shutil.rmtree(self.root, ignore_errors=True)


def _read_pid(path: Path, timeout: float = 10) -> int | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    return None


def start(prolog: str, epilog: str, ngpus: int = 4, cpus: int = 8, cluster: str = "ipltest") -> Slurm:
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        services.unavailable(f"Slurm/munge binaries missing: {missing} (Debian slurm-wlm, munge; `make test` "
                             f"installs them)")
    if os.geteuid() != 0:
        services.unavailable("the real Slurm needs root (munged, slurmd, mknod)")
    root = Path(tempfile.mkdtemp(prefix="ipledger-slurm-"))
    os.chmod(root, 0o755)
    for d in ("munge", "state", "spool", "log", "run", "dev"):
        (root / d).mkdir()
    os.chmod(root / "munge", 0o755)  # munged wants the socket dir reachable by clients
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    for i in range(ngpus):
        os.mknod(root / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    node = socket.gethostname().split(".")[0]
    ctld_port, d_port = services.free_port(), services.free_port()
    sock = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(f"""# generated by tests/slurm_service.py
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
GresTypes=gpu
JobRequeue=1
PrologFlags=Alloc
Prolog={prolog}
Epilog={epilog}
MinJobAge=600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:{ngpus} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root}/dev/nvidia[0-{ngpus - 1}]\n")
    s = Slurm(root=root, conf=conf, node=node, cluster=cluster)
    env = s.env

    def fail(reason: str) -> None:
        tail = s.log_tail()
        mlog = root / "munge" / "munged.log"
        if mlog.exists():
            tail += "\n--- munged.log\n" + "\n".join(mlog.read_text(errors="replace").splitlines()[-5:])
        s.stop()
        services.unavailable(f"{reason}\n{tail}")

    p = subprocess.run([_which("munged"), "-f", "-S", str(sock), f"--key-file={key}",
                        f"--log-file={root}/munge/munged.log", f"--pid-file={root}/munge/munged.pid",
                        f"--seed-file={root}/munge/munged.seed"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        fail(f"munged did not start: {p.stderr.strip()}")
    s.pids["munged"] = _read_pid(root / "munge" / "munged.pid")
    for daemon, args in (("slurmctld", ["-c", "-f", str(conf)]), ("slurmd", ["-f", str(conf)])):
        p = subprocess.run([_which(daemon), *args], env=env, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            fail(f"{daemon} did not start: {p.stderr.strip()}")
        s.pids[daemon] = _read_pid(root / "run" / f"{daemon}.pid")
        if s.pids[daemon] is None:
            fail(f"{daemon} wrote no pid file")
    deadline = time.time() + 30
    while time.time() < deadline:
        state = s.node_state()
        if state.startswith(("idle", "mixed", "allocated")):
            return s
        time.sleep(0.3)
    fail(f"node {node} did not become idle (state {s.node_state()!r})")
    raise AssertionError("unreachable")
