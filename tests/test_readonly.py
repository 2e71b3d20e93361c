"""Read-only toward the fleet: ipledger reads the scheduler and the GPUs, it never changes them.

Three layers, each able to fail on its own:

* static: no module of ipledger other than ``ledger/base/commands.py`` imports ``subprocess`` or calls
  ``os.system``/``os.popen``/``os.exec*``/``os.spawn*``/``os.posix_spawn*``/``pty.spawn`` (an AST walk over
  every ``.py`` under ledger/, reports/, schema/ and the hook templates under slurm/);
* the allowlist: ``check_allowed`` refuses every write operation on the fleet's tools, alone or hidden behind
  an allowed read;
* dynamic: the whole flow (installed prolog/epilog scripts for an NVIDIA and an AMD job, the collector on
  dcgmi and amd-smi, a dmon import, ship, reconcile, verify, a receipt) runs with a PATH and a ``[commands]``
  table of recording shims (tests/shims/record.py) in front of the stand-ins, plus shims for dangerous
  programs; afterwards every logged call must pass ``check_allowed`` and none may be a write.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ledger
from ledger.base import commands
from ledger.cli import install_hooks as install_mod
from tests.standins import make_site

ROOT = Path(ledger.__file__).resolve().parent.parent
SCANNED = ("ledger", "reports", "schema", "slurm")
ALLOWED_MODULE = ROOT / "ledger" / "base" / "commands.py"

# --- static ------------------------------------------------------------------------------------------------------

_PROCESS_MODULES = {"subprocess", "asyncio.subprocess"}
_FORBIDDEN_CALLS = {("pty", "spawn"), ("asyncio", "create_subprocess_exec"),
                    ("asyncio", "create_subprocess_shell")}


def _os_runner(name: str) -> bool:
    """os.system, os.popen, os.exec*, os.spawn*, os.posix_spawn*, os.fork/forkpty (a fork is half of an exec)."""
    return name in ("system", "popen", "fork", "forkpty") or name.startswith(("exec", "spawn", "posix_spawn"))


def process_violations(source: str, filename: str) -> list[str]:
    """``file:line: what`` for every way ``source`` could start a program without ledger/base/commands.py."""
    tree = ast.parse(source, filename)
    out: list[str] = []
    aliases: dict[str, str] = {}  # local name -> module it is bound to (import os as _os -> {"_os": "os"})
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in _PROCESS_MODULES or a.name.startswith("subprocess."):
                    out.append(f"{filename}:{node.lineno}: import {a.name}")
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}"
                if mod in _PROCESS_MODULES or full in _PROCESS_MODULES or mod.startswith("subprocess."):
                    out.append(f"{filename}:{node.lineno}: from {mod} import {a.name}")
                elif mod == "os" and _os_runner(a.name):
                    out.append(f"{filename}:{node.lineno}: from os import {a.name}")
                elif (mod, a.name) in _FORBIDDEN_CALLS:
                    out.append(f"{filename}:{node.lineno}: from {mod} import {a.name}")
                aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            mod = aliases.get(f.value.id, f.value.id)
            if (mod == "os" and _os_runner(f.attr)) or (mod, f.attr) in _FORBIDDEN_CALLS:
                out.append(f"{filename}:{node.lineno}: {mod}.{f.attr}()")
        if (isinstance(f, ast.Name) and f.id == "__import__") or (
                isinstance(f, ast.Attribute) and f.attr == "import_module"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                    arg.value.split(".")[0] in ("subprocess", "pty") or arg.value in _PROCESS_MODULES):
                out.append(f"{filename}:{node.lineno}: dynamic import of {arg.value}")
    return out


def scanned_sources() -> list[tuple[Path, str]]:
    files = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in p.parts:
                files.append((p, p.read_text(encoding="utf-8")))
    for kind in install_mod.KINDS:  # the installed hook scripts are Python too (rendered from slurm/*/*.in)
        files.append((install_mod.template_path(kind), install_mod.render(kind, sys.executable, None)))
    return files


def test_only_the_allowlist_module_can_start_a_program():
    files = scanned_sources()
    assert len(files) > 50 and any(p == ALLOWED_MODULE for p, _ in files)
    found = []
    for path, text in files:
        if path != ALLOWED_MODULE:
            found += process_violations(text, str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("snippet", [
    "import subprocess",
    "import subprocess as sp",
    "from subprocess import run",
    "from subprocess import Popen as P",
    "import asyncio.subprocess",
    "import os\nos.system('x')",
    "import os as _o\n_o.popen('x')",
    "import os\nos.execv('/bin/x', ['x'])",
    "import os\nos.execlp('x', 'x')",
    "import os\nos.spawnv(0, '/bin/x', ['x'])",
    "import os\nos.posix_spawn('/bin/x', ['x'], {})",
    "import os\nos.posix_spawnp('x', ['x'], {})",
    "from os import system",
    "from os import execve as e",
    "import pty\npty.spawn('x')",
    "from pty import spawn",
    "import asyncio\nasyncio.create_subprocess_exec('x')",
    "__import__('subprocess')",
    "import importlib\nimportlib.import_module('subprocess')",
])
def test_the_static_check_catches_each_way_to_start_a_program(snippet):
    assert process_violations(snippet, "x.py"), snippet


def test_the_static_check_leaves_harmless_code_alone():
    harmless = "import os\nos.path.join('a')\nos.environ.get('X')\nos.replace('a', 'b')\nimport ptyx\n" \
               "from os import path\nsystem = 1\nsystem()\n"
    assert process_violations(harmless, "x.py") == []


def test_commands_module_is_the_one_that_spawns():
    # The exemption is not vacuous: the allowlist module really is where programs start.
    text = ALLOWED_MODULE.read_text(encoding="utf-8")
    assert process_violations(text, "ledger/base/commands.py")


# --- the allowlist ---------------------------------------------------------------------------------------------

WRITES = [
    ("scontrol", "update jobid=1 StartTime=now"),
    ("scontrol", "update NodeName=n1 State=DRAIN Reason=x"),
    ("scontrol", "requeue 1"),
    ("scontrol", "reconfigure"),
    ("nvidia-smi", "-pl 300"),
    ("nvidia-smi", "-r"),
    ("nvidia-smi", "--gpu-reset -i 0"),
    ("nvidia-smi", "-ac 1593,1410"),
    ("nvidia-smi", "-rac"),
    ("nvidia-smi", "-lgc 1000,1500"),
    ("nvidia-smi", "-pm 1"),
    ("nvidia-smi", "-c EXCLUSIVE_PROCESS"),
    ("nvidia-smi", "-e 0"),
    ("nvidia-smi", "-mig 1"),
    ("amd-smi", "set --power-cap 300"),
    ("amd-smi", "set -g 0 --perf-level HIGH"),
    ("amd-smi", "reset"),
    ("amd-smi", "reset -G -g 0"),
    ("dcgmi", "config --set -P 300"),
    ("dcgmi", "config -g 1 --set -c 1"),
    ("dcgmi", "policy --set 0,0 -T 90"),
    ("dcgmi", "diag -r 3"),
    ("dcgmi", "modules --denylist nvswitch"),
    # a write hidden behind an allowed read: every token must be a read's
    ("nvidia-smi", "--query-gpu=name -pl 300"),
    ("nvidia-smi", "--query-gpu=name --format=csv -ac 1593,1410"),
    ("nvidia-smi", "-q -r"),
    ("nvidia-smi", "-L -pm 1"),
    ("nvidia-smi", "-q -i 0 --reset-ecc-errors=0"),
    ("nvidia-smi", "-q -f /etc/passwd"),
    ("nvidia-smi", "-i 0"),
    ("scontrol", "show job 1 update"),
    ("scontrol", "show node n1 update State=DRAIN"),
    ("scontrol", "-o show job 1 requeue"),
    ("ipmitool", "chassis power cycle"),
    ("scancel", "1"),
    ("rocm-smi", "--setpoweroverdrive 300"),
]


@pytest.mark.parametrize("program,args", WRITES, ids=[f"{p} {a}" for p, a in WRITES])
def test_allowlist_refuses_writes(program, args):
    with pytest.raises(commands.CommandRefused):
        commands.check_allowed(program, args.split())


def test_refused_command_is_never_started(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(commands, "_SPAWN", lambda *a, **kw: started.append(a))
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    with pytest.raises(commands.CommandRefused):
        commands.run("nvidia-smi", ["-pl", "300"], commands={"nvidia-smi": str(tool)})
    assert started == []


def test_run_all_refuses_every_call_before_starting_any(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(commands, "_SPAWN", lambda argvs, **kw: started.extend(argvs) or [])
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    with pytest.raises(commands.CommandRefused):
        commands.run_all([("nvidia-smi", ["-L"]), ("nvidia-smi", ["-pl", "300"])],
                         commands={"nvidia-smi": str(tool)})
    assert started == []


# Every shape ipledger itself uses must stay allowed (else the refusals above would be trivially true).
READS = [
    ("scontrol", "show job -d -o 77"),
    ("sacct", "-n -X -P -j 77 -o State,End"),
    ("nvidia-smi", "--query-gpu=index,uuid --format=csv,noheader,nounits"),
    ("nvidia-smi", "-q -d PERFORMANCE -i 0"),
    ("nvidia-smi", "-L"),
    ("scontrol", "--json show node n1"),
    ("scontrol", "-d -o show job 77"),
    ("amd-smi", "list --json"),
    ("amd-smi", "static --asic --json"),
    ("amd-smi", "metric -g 0 --energy --ecc --throttle --json"),
    ("dcgmi", "discovery -l"),
    ("dcgmi", "group -c ipledger-77.0 -a 0,1"),
    ("dcgmi", "stats -g 2 -e"),
    ("dcgmi", "stats -g 2 -s 77.0"),
    ("dcgmi", "stats -x 77.0"),
    ("dcgmi", "stats -v -j 77.0"),
    ("dcgmi", "stats -r 77.0"),
    ("dcgmi", "group -d 2"),
    ("dcgmi", "dmon -e 1001,1002 -d 1000 -c 60"),
]


@pytest.mark.parametrize("program,args", READS, ids=[f"{p} {a}" for p, a in READS])
def test_allowlist_keeps_the_reads_ipledger_makes(program, args):
    commands.check_allowed(program, args.split())


# --- dynamic: the whole flow behind recording shims ------------------------------------------------------------

SHIM = ROOT / "tests" / "shims" / "record.py"
FLEET = ("dcgmi", "nvidia-smi", "amd-smi", "scontrol", "squeue", "sacct")
DANGEROUS = ("ipmitool", "nvidia-settings", "rocm-smi", "rocm-smi-cli", "scancel", "sbatch", "srun", "sacctmgr",
             "systemctl", "reboot", "shutdown", "sudo", "modprobe", "rmmod", "nvidia-persistenced",
             "dcgmproftester12", "nv-hostengine", "nvidia-modprobe", "kill", "pkill", "sh", "bash", "curl", "wget")


def _shims(tmp: Path, state: Path, log: Path, dmon: Path) -> Path:
    d = tmp / "shims"
    d.mkdir()
    for name in FLEET + DANGEROUS:
        w = d / name
        # Absolute interpreter and baked-in settings: the hooks run with Slurm's minimal environment.
        w.write_text(f"#!/bin/sh\nSHIM_LOG='{log}' SHIM_DMON='{dmon}' STANDIN_STATE='{state}' "
                     f"exec '{sys.executable}' '{SHIM}' '{name}' \"$@\"\n")
        w.chmod(0o755)
    return d


def _dmon_capture(ngpus: int, ticks: int) -> str:
    from ledger.importers.dcgm_fields import BY_ID, COLLECT_FIELD_IDS

    names = [BY_ID[i].dmon for i in COLLECT_FIELD_IDS]
    lines = ["#Entity    " + "".join(f"{n:<13}" for n in names), "ID"]
    for k in range(ticks):
        for g in range(ngpus):
            lines.append(f"GPU {g}      " + "".join(f"{'0.500' if n == 'SMACT' else 'N/A':<13}" for n in names))
    return "\n".join(lines) + "\n"


def _config(path: Path, spool: Path, commands_: dict[str, str], hooks: dict | None = None) -> Path:
    lines = [f'spool = "{spool}"', "hook_timeout_s = 5.0", "[commands]"]
    lines += [f'"{k}" = "{v}"' for k, v in commands_.items()]
    if hooks:
        lines.append("[hooks]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in hooks.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _slurm_env(job: str, gpus: str) -> dict:
    # What slurmd gives a prolog/epilog: no PATH, no PYTHONPATH.
    return {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
            "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1",
            "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus}


def _job_record(job: str, start: float, end: float | None) -> str:
    def t(x):
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(x)) if x else "Unknown"

    return (f"JobId={job} JobName=wrap Account=tenant QOS=normal JobState={'COMPLETED' if end else 'RUNNING'} "
            f"Restarts=0 ExitCode=0:0 RunTime=00:00:{int((end or start) - start):02d} StartTime={t(start)} "
            f"EndTime={t(end)} Partition=gpu NodeList=node1 TRES=cpu=1,node=1,gres/gpu=1")


def _calls(log: Path) -> list[tuple[str, list[str]]]:
    if not log.exists():
        return []
    return [(c["program"], c["args"]) for c in map(json.loads, log.read_text().splitlines())]


def test_whole_flow_runs_only_allowlisted_reads(tmp_path, monkeypatch, runner, cli):
    site = make_site(tmp_path / "site", ngpus=2, tools=())  # stand-in state (GPU lists) only
    log, dmon = tmp_path / "calls.jsonl", tmp_path / "dmon.txt"
    dmon.write_text(_dmon_capture(ngpus=2, ticks=3))
    shims = _shims(tmp_path, site.state, log, dmon)
    spool, db = tmp_path / "spool", f"sqlite:///{tmp_path / 'ledger.db'}"
    tools = {name: str(shims / name) for name in FLEET}
    nv_cfg = _config(tmp_path / "nvidia.toml", spool, {k: tools[k] for k in ("dcgmi", "nvidia-smi", "scontrol",
                                                                                "sacct")})
    amd_cfg = _config(tmp_path / "amd.toml", spool, {k: tools[k] for k in ("amd-smi", "scontrol")})
    bare_cfg = _config(tmp_path / "bare.toml", spool, {})  # the collector finds its tools on PATH
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("IPLEDGER_AUTO_RECEIPTS", "1")

    # Hooks: the installed scripts, as slurmd runs them. Job 501 (NVIDIA) and 503 (AMD) run to the end;
    # job 502 loses its epilog and is later closed by reconcile, which asks scontrol and then sacct.
    nv_hooks = install_mod.install(tmp_path / "hooks-nv", str(nv_cfg))
    amd_hooks = install_mod.install(tmp_path / "hooks-amd", str(amd_cfg))
    start = time.time() - 5
    for job in ("501", "502", "503"):
        site.scontrol_record(job, _job_record(job, start, None))
    for script, job in ((nv_hooks[0], "501"), (nv_hooks[0], "502"), (amd_hooks[0], "503")):
        p = subprocess.run([str(script)], env=_slurm_env(job, "0,1"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    time.sleep(0.2)
    end = time.time()
    for job in ("501", "503"):
        site.scontrol_record(job, _job_record(job, start, end))
    for script, job in ((nv_hooks[1], "501"), (amd_hooks[1], "503")):
        p = subprocess.run([str(script)], env=_slurm_env(job, "0,1"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    (site.state / "scontrol" / "502.txt").unlink()  # Slurm forgot it: reconcile must fall back to sacct

    # The collector on both vendors' tools, found through PATH; a dmon capture imported.
    for source in ("dcgmi", "amd-smi"):
        r = runner.invoke(cli, ["--config", str(bare_cfg), "collect", "--source", source, "--once", "--count", "2",
                                "--interval", "0.05s", "--node", "node1", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["error"] is None, r.output
    def ipledger(*argv: str, config: Path = nv_cfg) -> str:
        r = runner.invoke(cli, ["--db", db, "--config", str(config), *argv])
        assert r.exit_code == 0, (argv, r.output)
        return r.output

    ipledger("init")
    ipledger("import", "dmon", str(dmon), "--start", str(int(start)), "--interval", "1s", "--node", "node9")
    # Ship, reconcile, verify, a receipt: of these only reconcile may ask the scheduler anything.
    ipledger("ship", "--json")
    assert [c["job_id"] for c in json.loads(ipledger("reconcile", "--json"))["closed"]] == ["502"]
    ipledger("verify")
    assert json.loads(ipledger("receipt", "501", "--format", "json"))["job"]["job_id"] == "501"

    calls = _calls(log)
    programs = {p for p, _ in calls}
    # The flow really went through the shims: every tool it needs was called.
    assert {"dcgmi", "nvidia-smi", "amd-smi", "scontrol", "sacct"} <= programs, calls
    assert not programs & set(DANGEROUS), [c for c in calls if c[0] in DANGEROUS]
    for program, args in calls:
        commands.check_allowed(program, args)  # raises CommandRefused on anything off the allowlist
    flat = [(p, " ".join(a)) for p, a in calls]
    assert not [c for c in flat if c[0] == "scontrol" and "update" in c[1].split()]
    assert not [c for c in flat if c[0] == "nvidia-smi" and set(c[1].split()) & {
        "-pl", "--power-limit", "-ac", "--applications-clocks", "-r", "--gpu-reset", "-rac", "-lgc", "-pm"}]
    assert not [c for c in flat if c[0] == "amd-smi" and c[1].split()[:1] in (["set"], ["reset"])]
    assert not [c for c in flat if c[0] == "dcgmi" and c[1].startswith("config") and "--set" in c[1]]
