"""A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian's slurm-wlm, and on request
real accounting storage: Debian's slurmdbd over a private MariaDB (so ``sacct`` in the tests is the real thing).

Everything is private to a temp dir: munge key and socket, slurm.conf/gres.conf, state and spool dirs, pid and
log files, and fake GPUs made as character devices (``mknod DIR/nvidiaN c 195 N``) listed in gres.conf, so
Slurm sets ``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` in the prolog and epilog. Ports are free ones on
127.0.0.1; ``Prolog=``/``Epilog=`` (and ``PrologSlurmctld=``/``EpilogSlurmctld=`` when given) are the scripts
``ipledger hooks install`` wrote. With ``accounting=True``: ``mariadbd`` with its own datadir, socket and port,
``slurmdbd`` (its slurmdbd.conf mode 0600, owned by the SlurmUser, root here) on a free port, the cluster, accounts
and user registered with ``sacctmgr``, and ``AccountingStorageType=accounting_storage/slurmdbd``. Needs root
(munged, slurmd, mknod). :func:`start` calls ``tests.services.unavailable`` with the daemons' log tails when it
cannot start.
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
ACCOUNTING_BINARIES = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")
ACCOUNTS = ("tenant", "other")


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
        from ledger.capture.hooks.slurm import parse_scontrol_oneline

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
        for name in ("slurmctld.log", "slurmd.log", "slurmdbd.log", "mariadb.log"):
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
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            pid = self.pids.get(name)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    os.waitpid(pid, os.WNOHANG)  # mariadbd is our child: reap it, or it lingers as a zombie
                except ChildProcessError:
                    pass
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


def _start_accounting(root: Path, s: "Slurm", sock: Path, fail) -> int:  # noqa: ANN001
    """mariadbd (private datadir/socket/port) and slurmdbd; returns slurmdbd's port."""
    db_port, dbd_port = services.free_port(), services.free_port()
    data = root / "mysql"
    p = subprocess.run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        fail(f"mariadb-install-db failed: {p.stderr.strip()[-500:]}")
    proc = subprocess.Popen([_which("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root",
                             f"--socket={root}/run/mariadb.sock", f"--port={db_port}", "--bind-address=127.0.0.1",
                             f"--pid-file={root}/run/mariadb.pid", f"--log-error={root}/log/mariadb.log",
                             "--innodb-buffer-pool-size=32M", "--skip-log-bin"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    s.pids["mariadbd"] = proc.pid
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", db_port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None:
                fail("mariadbd exited")
            time.sleep(0.2)
    else:
        fail("mariadbd did not listen")
    conf = root / "slurmdbd.conf"
    conf.write_text(f"""# generated by tests/slurm_service.py
AuthType=auth/munge
AuthInfo=socket={sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
DebugLevel=info
LogFile={root}/log/slurmdbd.log
PidFile={root}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
""")
    os.chown(conf, 0, 0)  # slurmdbd refuses a config readable by others or not owned by its SlurmUser
    os.chmod(conf, 0o600)
    env = {**s.env, "SLURM_CONF": str(s.conf)}
    # slurmdbd takes no config path: it reads slurmdbd.conf beside the slurm.conf that SLURM_CONF names.
    p = subprocess.run([_which("slurmdbd")], env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"slurmdbd did not start: {p.stderr.strip()}")
    s.pids["slurmdbd"] = _read_pid(root / "run" / "slurmdbd.pid")
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", dbd_port), timeout=1):
                return dbd_port
        except OSError:
            time.sleep(0.2)
    fail("slurmdbd did not listen")
    return dbd_port


def _register(s: "Slurm", cluster: str, fail) -> None:  # noqa: ANN001
    for argv in (("sacctmgr", "-i", "add", "cluster", cluster),
                 ("sacctmgr", "-i", "add", "account", ",".join(ACCOUNTS), f"cluster={cluster}"),
                 ("sacctmgr", "-i", "add", "user", "root", f"account={','.join(ACCOUNTS)}", f"cluster={cluster}")):
        p = s.cmd(*argv, check=False, timeout=60)
        if p.returncode != 0 and "Nothing new added" not in p.stdout + p.stderr:
            fail(f"{' '.join(argv)} failed: {p.stdout.strip()} {p.stderr.strip()}")


def start(prolog: str, epilog: str, ngpus: int = 4, cpus: int = 8, cluster: str = "ipltest",
          prolog_slurmctld: str | None = None, epilog_slurmctld: str | None = None,
          accounting: bool = False) -> Slurm:
    missing = [b for b in (*BINARIES, *(ACCOUNTING_BINARIES if accounting else ())) if _which(b) is None]
    if missing:
        services.unavailable(f"Slurm/munge binaries missing: {missing} (Debian slurm-wlm, munge, slurmdbd, "
                             f"mariadb-server; `make test` installs them)")
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
    s = Slurm(root=root, conf=conf, node=node, cluster=cluster)
    controller_hooks = "".join(f"{k}={v}\n" for k, v in (("PrologSlurmctld", prolog_slurmctld),
                                                          ("EpilogSlurmctld", epilog_slurmctld)) if v)
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
@ACCOUNTING@
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
{controller_hooks}MinJobAge=600
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:{ngpus} State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root}/dev/nvidia[0-{ngpus - 1}]\n")
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
    if accounting:
        dbd_port = _start_accounting(root, s, sock, fail)
        conf.write_text(conf.read_text().replace("@ACCOUNTING@", "\n".join([
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageTRES=gres/gpu",
            "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={sock}"])))  # the clients' munge socket for slurmdbd (AuthInfo is slurmctld's)
        _register(s, cluster, fail)
    else:
        conf.write_text(conf.read_text().replace("@ACCOUNTING@", "AccountingStorageType=accounting_storage/none"))
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
