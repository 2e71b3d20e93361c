"""Figure: `ipledger mark` (a progress mark from a job) against a bare `python3 -I -S -c pass`.

A training loop may mark every checkpoint, so the mark starts like the hooks: the installed ``DIR/mark``
script (``ipledger hooks install``) runs the interpreter isolated (-I -S), imports the standard library only
and writes one durable spool file (as root here; the job's user appends one line to its drop place instead,
which skips the fsync and is cheaper). The console script ``ipledger mark`` is shown beside it: the same code,
after the interpreter has processed site-packages, which no fast path can skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Figure, main_for, timeit_interleaved

TITLE = "Progress mark (`ipledger mark`) own cost"
JOB_ENV = {"SLURM_JOB_ID": "777001", "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "node1", "PATH": "/usr/bin:/bin"}


def run(scale: float, repeat: int) -> Figure:
    from ledger.cli.install_hooks import install, mark_path

    reps = max(repeat, int(30 * scale) or 1)
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-mark-"))
    try:
        spool = work / "spool"
        cfg = work / "config.toml"
        cfg.write_text(f'spool = "{spool}"\ncluster = "hpc1"\n')
        old = time.time() - 60  # a site's config is older than its jobs: read through the snapshot, not tomllib
        os.utime(cfg, (old, old))
        install(work / "hooks", str(cfg))
        mark = mark_path(work / "hooks")
        console = Path(sys.executable).parent / "ipledger"
        env = dict(JOB_ENV)
        argv = ["checkpoint", "--step", "1200", "--note", "epoch 3"]
        subprocess.run([str(mark), *argv], env=env, check=True)  # makes the config snapshot, as a prolog would
        cases = [("`python3 -I -S -c pass` (same interpreter)",
                  lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], env=env, check=True), None),
                 ("installed DIR/mark checkpoint (spool write, fsync)",
                  lambda: subprocess.run([str(mark), *argv], env=env, check=True), None)]
        if console.exists():
            cases.append(("reference: `python3 -c pass` with site-packages (same venv)",
                          lambda: subprocess.run([sys.executable, "-c", "pass"], env=env, check=True), None))
            cases.append(("console script `ipledger mark checkpoint` (site-packages start)",
                          lambda: subprocess.run([str(console), "mark", *argv],
                                                 env={**env, "IPLEDGER_CONFIG": str(cfg)}, check=True), None))
        floor, *subjects = timeit_interleaved(cases, reps)
        written = len(list(spool.glob("mark-*.jsonl")))
        if written < reps + 1:
            raise RuntimeError(f"{written} mark files for {reps + 1} marks: a mark was lost")
        return Figure(key="mark", title=TITLE, target=2.0, floor=floor, subjects=tuple(subjects),
                      scale_note=f"{reps} runs each; interpreter {os.path.realpath(sys.executable)}",
                      notes=("The budget (≤ 2×) is the installed script's; the console script pays the "
                             "interpreter's site-packages start (editable install finders) before any ipledger "
                             "code runs (in a development checkout, `pip install -e`'s finder imports pathlib and re"
                             " there), and is shown for comparison with that start alone.",))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=1.0, default_repeat=10, argv=argv)


if __name__ == "__main__":
    main()
