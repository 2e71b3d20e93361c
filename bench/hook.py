"""Figure: the Slurm prolog/epilog hook's own cost, against a bare `python3 -I -S -c pass` (with vendor tools: that
start plus the same tool spawns).

The hooks are installed exactly as a site installs them (`ipledger hooks install --dir DIR --config CFG`) and
run as slurmd runs them: the script by path, Slurm's variables in a minimal environment. "Own cost" is the
interpreter start, the hook's imports, reading the config and the environment, building the entries and the
durable spool write, without the time the vendor tools take: for the DCGM variant the tools are instant
stand-ins, /bin/sh scripts that replay answers recorded once from the test stand-ins (tests/standins), so
what remains of their cost is a fork+exec of /bin/sh per call (counted against the hook, not excluded).
Database up and down: the hooks never open the database (spool first, shipped later), so both are measured
to show exactly that.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Figure, main_for, timeit_interleaved

TITLE = "Hook (prolog/epilog) own cost"
TARGET_PLAIN = 2.0        # no vendor tools: against a bare `python3 -I -S -c pass`
TARGET_WITH_TOOLS = 1.5   # instant stand-ins: against a bare start plus the same tool spawns
JOB_ENV = {"SLURM_JOB_ID": "777001", "SLURM_JOB_GPUS": "0,1,2,3", "SLURMD_NODENAME": "node1",
           "SLURM_CLUSTER_NAME": "hpc1", "SLURM_JOB_ACCOUNT": "acct", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_UID": "1000", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_QOS": "normal",
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_EXIT_CODE2": "0:0",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "PATH": "/usr/bin:/bin"}

_RECORDER = """#!{py}
import json, os, subprocess, sys
p = subprocess.run([{py!r}, {tool!r}, *sys.argv[1:]], capture_output=True, text=True,
                   env={{**os.environ, "STANDIN_STATE": {state!r}}})
n = len(os.listdir({rec!r}))
json.dump({{"args": sys.argv[1:], "out": p.stdout, "err": p.stderr, "rc": p.returncode}},
          open(os.path.join({rec!r}, f"{{n:04d}}.json"), "w"))
sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); sys.exit(p.returncode)
"""


def _replay_script(calls: list[dict], outdir: Path, tool: str) -> str:
    """A /bin/sh stand-in answering each recorded argument list with its recorded output, at once."""
    lines = ["#!/bin/sh", 'case "$*" in']
    seen = set()
    for i, c in enumerate(calls):
        key = " ".join(c["args"])
        if key in seen:
            continue
        seen.add(key)
        (outdir / f"{tool}-{i}.out").write_text(c["out"])
        lines.append(f"  {shlex.quote(key)}) cat {shlex.quote(str(outdir / f'{tool}-{i}.out'))}; exit {c['rc']};;")
    lines += ["esac", "exit 1", ""]
    return "\n".join(lines)


def _install(site_root: Path, config: Path) -> Path:
    from bench.common import run_cli

    hooks = site_root / "hooks"
    run_cli(["hooks", "install", "--dir", str(hooks), "--config", str(config)])
    return hooks


def _instant_tools(root: Path, tools: tuple[str, ...]) -> tuple[dict[str, str], dict[str, list[list[str]]]]:
    """Record the test stand-ins' answers to one prolog+epilog, then build instant /bin/sh replays of them.

    Returns the replay script per tool, and per hook kind the tool calls it made (argv[0] the replay script)."""
    from tests.standins import HERE, make_site

    rec_site = make_site(root / "record", tools=tools)
    recdir = root / "recorded"
    for tool in tools:
        (recdir / tool).mkdir(parents=True)
        w = rec_site.bin / tool
        w.write_text(_RECORDER.format(py=sys.executable, tool=str(HERE / tool), state=str(rec_site.state),
                                      rec=str(recdir / tool)))
        w.chmod(0o755)
    hooks = _install(rec_site.root, rec_site.config)
    env = {**JOB_ENV}
    made: dict[str, list[tuple[str, int]]] = {}
    for kind in ("prolog", "epilog"):
        before = {tool: len(os.listdir(recdir / tool)) for tool in tools}
        subprocess.run([str(hooks / kind)], env=env, check=True, capture_output=True)
        made[kind] = [(tool, i) for tool in tools for i in range(before[tool], len(os.listdir(recdir / tool)))]
    replay = {}
    outdir = root / "replay"
    outdir.mkdir()
    for tool in tools:
        calls = [json.loads(p.read_text()) for p in sorted((recdir / tool).iterdir())]
        script = outdir / tool
        script.write_text(_replay_script(calls, outdir, tool))
        script.chmod(0o755)
        replay[tool] = str(script)
    calls = {kind: [[replay[tool], *json.loads((recdir / tool / f"{i:04d}.json").read_text())["args"]]
                    for tool, i in sorted(seq, key=lambda c: c[1])] for kind, seq in made.items()}
    return replay, calls


def _site(root: Path, db: str, commands: dict[str, str]) -> tuple[Path, Path]:
    """A site config (spool, db, commands) and its installed hooks."""
    root.mkdir(parents=True)
    spool = root / "spool"
    lines = [f'spool = "{spool}"', f'db = "{db}"', "hook_timeout_s = 3.0", "[commands]"]
    lines += [f'"{k}" = "{v}"' for k, v in commands.items()]
    # the drop places beside the spool here (one tmp directory); a site mounts them apart (docs/slurm.md)
    lines += ["[hooks]", "drop_dir_shared_fs = true"]
    cfg = root / "config.toml"
    cfg.write_text("\n".join(lines) + "\n")
    # A site's config is older than its jobs: the hook parses the TOML once and reads its snapshot after that
    # (ledger.base.config, made only once the file is SNAPSHOT_SETTLE_S old); a fresh file would time tomllib.
    old = time.time() - 60
    os.utime(cfg, (old, old))
    return _install(root, cfg), spool


def run(scale: float, repeat: int) -> Figure:
    try:
        import ledger.capture.hooks  # noqa: F401
        from ledger.cli import install_hooks as install  # noqa: F401
    except ImportError as exc:
        from bench.common import FeatureMissing

        raise FeatureMissing(TITLE, f"ledger.capture.hooks not importable: {exc}") from None
    reps = max(repeat, int(30 * scale) or 1)
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-hook-"))
    try:
        instant, tool_calls = _instant_tools(work, ("dcgmi", "nvidia-smi"))
        db_up = f"sqlite:///{work / 'ledger.db'}"
        db_down = "postgresql+psycopg://ipledger@127.0.0.1:9/unreachable"
        variants = {
            "no vendor tools, DB up": _site(work / "plain-up", db_up, {}),
            "no vendor tools, DB down": _site(work / "plain-down", db_down, {}),
            "instant DCGM/nvidia-smi stand-ins, DB up": _site(work / "dcgm-up", db_up, instant),
            "instant DCGM/nvidia-smi stand-ins, DB down": _site(work / "dcgm-down", db_down, instant),
        }
        env = dict(JOB_ENV)
        cases = [("`python3 -I -S -c pass` (same interpreter)",
                  lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], env=env, check=True), None)]
        for name, (hooks, _spool) in variants.items():
            for kind in ("prolog", "epilog"):
                def one(kind: str = kind, hooks: Path = hooks) -> None:
                    subprocess.run([str(hooks / kind)], env=env, check=True, capture_output=True)

                def pre(kind: str = kind, hooks: Path = hooks) -> None:
                    if kind == "epilog":  # the epilog needs its prolog's state, as on a real node
                        one("prolog", hooks)

                cases.append((f"{kind}, {name}", one, pre))
        from ledger.base.commands import spawn_and_wait

        for kind in ("prolog", "epilog"):  # the stand-ins' own fork+exec, as the hook starts them, nothing else
            def calls_only(argvs: list[list[str]] = tool_calls[kind]) -> None:
                for argv in argvs:
                    spawn_and_wait(argv, timeout=10.0, env=env)

            cases.append((f"{kind}'s {len(tool_calls[kind])} stand-in calls alone (posix_spawn, no hook)",
                          calls_only, None))
        for kind in ("prolog", "epilog"):  # the stand-in rows' floor: a bare start plus the same tool spawns
            def floor_and_calls(argvs: list[list[str]] = tool_calls[kind]) -> None:
                subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], env=env, check=True)
                for argv in argvs:
                    spawn_and_wait(argv, timeout=10.0, env=env)

            cases.append((f"`python3 -I -S -c pass` then {kind}'s {len(tool_calls[kind])} stand-in calls "
                          f"(the {kind} with stand-ins' floor)", floor_and_calls, None))
        floor, *subjects = timeit_interleaved(cases, reps)
        *subjects, prolog_calls, epilog_calls, prolog_floor, epilog_floor = subjects
        alone = {"prolog": prolog_calls, "epilog": epilog_calls}
        tool_floor = {"prolog": prolog_floor, "epilog": epilog_floor}
        for name, (_hooks, spool) in variants.items():
            written = sum(1 for p in spool.iterdir() if p.suffix == ".jsonl")
            if written == 0:
                raise RuntimeError(f"{name}: the hooks wrote nothing to the spool")
        interp = os.path.realpath(sys.executable)
        extra = {}
        for kind, t in alone.items():
            extra[f"{t.label}: median"] = f"{t.median * 1000:.1f} ms ({t.median / floor.median:.2f}× the floor)"
        for kind, t in tool_floor.items():
            extra[f"{t.label}: median"] = f"{t.median * 1000:.1f} ms ({t.median / floor.median:.2f}× the bare floor)"
        verdicts = []   # (label, ratio, target): each row against its own floor
        for subj in subjects:
            kind = subj.label.split(",")[0]
            if "stand-ins" in subj.label:
                net = (subj.median - alone[kind].median) / floor.median
                extra[f"{subj.label}, net of its stand-in calls"] = f"{net:.2f}× the floor"
                verdicts.append((subj.label, subj.median / tool_floor[kind].median, TARGET_WITH_TOOLS))
            else:
                verdicts.append((subj.label, subj.median / floor.median, TARGET_PLAIN))
        for label, r, tgt in verdicts:
            extra[f"{label}: against its floor"] = f"{r:.2f}× (≤ {tgt:g}×: {'met' if r <= tgt else 'NOT met'})"
        worst_plain = max(r for _l, r, t in verdicts if t == TARGET_PLAIN)
        worst_tools = max(r for _l, r, t in verdicts if t == TARGET_WITH_TOOLS)
        summary = (f"{worst_plain:.2f}× without tools (≤ {TARGET_PLAIN:g}×); {worst_tools:.2f}× with instant "
                   f"DCGM/nvidia-smi stand-ins against a bare start plus the same spawns (≤ {TARGET_WITH_TOOLS:g}×)",
                   all(r <= t for _l, r, t in verdicts))
        try:
            load = " ".join(open("/proc/loadavg").read().split()[:3])
        except OSError:
            load = "?"
        return Figure(key="hook", title=TITLE, target=float("inf"), floor=floor, subjects=tuple(subjects),
                      extra=extra, summary=summary,
                      scale_note=f"{reps} runs each; 4 GPUs; interpreter {interp}; installed scripts run by path; "
                                 f"load average at the end {load}",
                      notes=("The DCGM variants include one /bin/sh fork+exec per tool call (the instant stand-ins,"
                             " which also fork+exec `cat`); real dcgmi/nvidia-smi take longer, which the budget"
                             " excludes. \"Net of its stand-in calls\" subtracts the median time of the same calls"
                             " started alone (the rows above) from the hook's median. The rows without tools are"
                             " judged against the bare start (≤ 2×); the rows with stand-ins against a bare start"
                             " followed by the same tool spawns, the least any hook calling those tools could cost"
                             " (≤ 1.5×). That floor starts the calls one after another; the hooks start the ones"
                             " that read independently together (the prolog's nvidia-smi inventory with dcgmi"
                             " discovery, the epilog's stats -r with group -d: docs/slurm.md, \"Bounds\"), which"
                             " records the same entries as starting them in turn.",))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=1.0, default_repeat=10, argv=argv)


if __name__ == "__main__":
    main()
