"""Figure: what a person waits for at the terminal — the interactive commands on the demo ledger, each in a fresh
interpreter, against its own budget in seconds (``python -m bench.latency``).

The subjects are the commands as typed: ``ipledger --help``; ``receipt`` of a one-node job; ``findings`` (it runs
the agents and records what is new: the untimed first call records and writes the checked cache of the agents'
dataset, the timed calls read it and find nothing new to record; ``ask``, ``explain`` and ``account`` read it too); ``ask`` (the demo's own question); ``explain --rack``; ``account``; ``verify``. The floor is
a bare interpreter start (``python -I -S -c pass``): what no command can answer faster than. The budgets are wall
seconds, not ratios, since the figure is the time a person waits; ``met`` lists each against its budget.

Scale 1 (the default) is the demo `make demo` builds (its ledger built here, seed 3); below 1 the small demo hall;
below 0.1 the small hall over two days, for the smoke test.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

from bench.common import PY, Figure, cli_env, main_for, timeit_interleaved

TITLE = "Interactive commands on the demo ledger (wall seconds a person waits)"
QUESTION = "why did rack R3 lose GPU-hours this week?"
BUDGETS_S = {"--help": 0.15, "receipt": 0.25, "findings": 1.5, "ask": 1.5, "explain": 1.5, "account": 1.5,
             "verify": 2.0}


def _tiny():  # noqa: ANN202 - a FleetSpec
    from ledger.sim import FleetSpec

    return FleetSpec(nvidia_racks=3, nodes_per_rack=3, days=2)


def one_node_job(ledger: Path) -> str:
    """A job whose devices are all on one node (the smallest receipt a user asks for)."""
    with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as con:
        row = con.execute("SELECT job_id FROM entries WHERE kind = 'device_bound' GROUP BY job_id, run "
                          "HAVING COUNT(DISTINCT node) = 1 ORDER BY job_id LIMIT 1").fetchone()
    if row is None:
        raise RuntimeError(f"{ledger}: no one-node job")
    return str(row[0])


def installed_env(pycache: Path) -> dict:
    """The subjects' environment: the project's modules read from bytecode compiled once into ``pycache``, as an
    installed package has it (pip compiles on install), even where the machine sets PYTHONDONTWRITEBYTECODE (then
    every command would compile the project's sources again, a cost no installed copy pays)."""
    env = {k: v for k, v in cli_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def compile_project(env: dict) -> None:
    from bench.common import ROOT

    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "ledger")], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def _command(args: list[str], env: dict):  # noqa: ANN202 - a timed callable
    def run() -> None:
        p = subprocess.run([PY, "-m", "ledger.cli.main", *args], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"ipledger {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-300:]}")
    return run


def run(scale: float, repeat: int) -> Figure:
    from ledger.sim.hall import run_demo
    from ledger.sim import FleetSpec

    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-latency-"))
    try:
        spec = None if scale >= 1 else FleetSpec.small() if scale >= 0.1 else _tiny()
        summary = run_demo(work / "demo", seed=3, spec=spec)
        ledger = Path(summary["ledger"])
        db = ["--db", f"sqlite:///{ledger}", "--config", summary["site_config"]]   # as the demo prints them
        rack = "R3" if scale >= 1 else "R1"
        commands = {"--help": ["--help"], "receipt": [*db, "receipt", one_node_job(ledger)],
                    "findings": [*db, "findings"], "ask": [*db, "ask", QUESTION.replace("R3", rack)],
                    "explain": [*db, "explain", "--rack", rack], "account": [*db, "account"],
                    "verify": [*db, "verify"]}
        env = installed_env(work / "pycache")
        compile_project(env)
        _command(commands["findings"], env)()   # records the demo's findings once: the timed calls add none
        cases = [("bare interpreter start (python -I -S -c pass)",
                  lambda: subprocess.run([PY, "-I", "-S", "-c", "pass"], check=True, env=env), None)]
        shown = {f"sqlite:///{ledger}": "DB", summary["site_config"]: "SITE"}
        cases += [(f"ipledger {' '.join(shown.get(a, a) for a in args)}",
                   _command(args, env), None) for args in commands.values()]
        floor, *subjects = timeit_interleaved(cases, max(repeat, 1))
        met = {name: (t.median, BUDGETS_S[name]) for name, t in zip(commands, subjects)}
        over = [f"{n} {m:.2f} s > {b:g} s" for n, (m, b) in met.items() if m > b]
        return Figure(key="latency", title=TITLE, target=float("inf"), floor=floor, subjects=tuple(subjects),
                      scale_note=(f"the {'' if scale >= 1 else 'small ' if scale >= 0.1 else 'two-day small '}"
                                  f"demo hall (seed 3): {summary['jobs']} jobs, "
                                  f"{summary['devices']} devices"),
                      extra={"budgets (median wall seconds)": ", ".join(f"{n} ≤ {b:g}" for n, b in BUDGETS_S.items()),
                             "met": "all" if not over else f"NOT met: {'; '.join(over)}"},
                      notes=("Each command is a fresh interpreter, as typed at a terminal, reading the project's "
                             "modules from bytecode compiled once beforehand (as an installed copy has them); the "
                             "ratio column is to a bare interpreter start and says how much of the wait is the "
                             "command's own work.",))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=1.0, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
