"""The benchmark harness: timing a subject against a floor measured in the same run, and recording the result.

Absolute times on shared machines are noise; a figure is the RATIO of the subject's median to its floor's
median, both measured here, now, on the same generated data. Each run is appended, dated, to
docs/performance-history.md (the record of runs, never rewritten), and its figure's row in docs/performance.md's
one table of current figures gets the run's headline and date (:func:`write_doc`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
PERF_DOC = ROOT / "docs" / "performance.md"
PY = sys.executable


@dataclass(frozen=True)
class Timing:
    label: str
    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


@dataclass(frozen=True)
class Figure:
    """One benchmark result: subject(s) against a floor, with the scale it ran at."""

    key: str                 # module name, e.g. "ship_sqlite"
    title: str               # the figure's heading in docs/performance-history.md
    target: float            # ratio target (subject median / floor median)
    floor: Timing | None
    subjects: tuple[Timing, ...] = ()
    scale_note: str = ""
    notes: tuple[str, ...] = ()
    status: str = "ok"       # "ok" | "not available yet" | "failed: ..."
    extra: dict = field(default_factory=dict)
    summary: tuple[str, bool] | None = None   # (latest, met) where the verdict is more than the table's subjects

    def ratio(self, t: Timing) -> float:
        return t.median / self.floor.median if self.floor and self.floor.median > 0 else float("nan")

    def meets(self) -> bool:
        return self.status == "ok" and all(self.ratio(t) <= self.target for t in self.subjects)

    def headline(self) -> tuple[str, str]:
        """(latest, status) for the figure's row in the table of current figures: the worst subject's ratio against
        its ratio target, or, for a figure judged on absolute budgets (``target`` infinite), its own ``met`` line."""
        if self.status != "ok":
            return self.status, "NOT met"
        if self.summary is not None:
            return self.summary[0], "met" if self.summary[1] else "NOT met"
        verdict = next((str(v) for k, v in self.extra.items() if k.startswith("met")), None)
        if self.target == float("inf") or not self.subjects or self.floor is None:
            ok = verdict is not None and (verdict in ("yes", "all") or verdict.startswith("met"))
            return (verdict or "see the record"), ("met" if ok else "NOT met")
        worst = max(self.subjects, key=self.ratio)
        return f"{self.ratio(worst):.2f}× ({worst.label})", "met" if self.meets() else "NOT met"

    def table(self) -> str:
        lines = [f"| measured | median s | min s | max s | runs | ratio to floor (medians) | ratio of minimums "
                 f"| target |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        rows = ([self.floor] if self.floor else []) + list(self.subjects)
        for t in rows:
            is_floor = t is self.floor
            ratio = "1.00 (floor)" if is_floor else f"{self.ratio(t):.2f}"
            tgt = "" if is_floor or self.target == float("inf") else (
                f"≤ {self.target:g}× {'met' if self.ratio(t) <= self.target else 'NOT met'}")
            rmin = "" if is_floor else f"{min(t.runs) / min(self.floor.runs):.2f}" if self.floor else ""
            lines.append(f"| {t.label} | {t.median:.4f} | {min(t.runs):.4f} | {max(t.runs):.4f} | {len(t.runs)} "
                         f"| {ratio} | {rmin} | {tgt} |")
        return "\n".join(lines)

    def render(self) -> str:
        out = [f"{self.title}", "", f"Scale: {self.scale_note}" if self.scale_note else ""]
        if self.status != "ok":
            out += ["", f"Status: **{self.status}**"]
        else:
            out += ["", self.table()]
        for k, v in self.extra.items():
            out.append(f"- {k}: {v}")
        out += ["", *[f"{n}" for n in self.notes]] if self.notes else []
        return "\n".join(x for x in out if x is not None)


def timeit(fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None,
           label: str = "") -> Timing:
    """Run ``setup`` (untimed) then ``fn`` (timed), ``repeat`` times."""
    runs = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return Timing(label, tuple(runs))


def timeit_interleaved(cases: list[tuple[str, Callable[[], object], Callable[[], object] | None]],
                       repeat: int) -> list[Timing]:
    """Time several (label, fn, setup) cases round-robin — floor, subject, floor, subject... — so that a
    burst of load from other processes on a shared machine hits floor and subject alike."""
    runs: list[list[float]] = [[] for _ in cases]
    for _ in range(repeat):
        for i, (_label, fn, setup) in enumerate(cases):
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            runs[i].append(time.perf_counter() - t0)
    return [Timing(label, tuple(r)) for (label, _fn, _setup), r in zip(cases, runs)]


def cli_env(env: dict | None = None) -> dict:
    """The environment a subject command runs in: this one, ``env`` added, the repository importable."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return full_env


def run_cli(args: list[str], env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ipledger`` as a user would (a fresh interpreter), with the repository importable."""
    proc = subprocess.run([PY, "-m", "ledger.cli.main", *args], capture_output=True, text=True, env=cli_env(env))
    if check and proc.returncode != 0:
        raise RuntimeError(f"ipledger {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc


def versions() -> str:
    pkgs = []
    for name in ("SQLAlchemy", "psycopg", "duckdb", "pandas", "pyarrow"):
        try:
            pkgs.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pkgs.append(f"{name} (not installed)")
    import sqlite3

    pkgs.append(f"SQLite {sqlite3.sqlite_version}")
    pg = _pg_version()
    if pg:
        pkgs.append(f"PostgreSQL {pg}")
    return ", ".join(pkgs)


def _pg_version() -> str:
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), reverse=True)
    if not found:
        return ""
    try:
        out = subprocess.run([found[0], "--version"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return ""
    m = re.search(r"\d+(?:\.\d+)+", out)
    return m.group(0) if m else ""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}){mem}, {platform.system()} {platform.release()}"


def header() -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Run {now} on {machine()}; Python {platform.python_version()}; {versions()}.")


ROW_RE = re.compile(r"^\| (?P<figure>[^|]+) \| `python -m bench\.(?P<key>\w+)` \|", re.M)


def write_doc(fig: Figure, path: Path | None = None, history: Path | None = None) -> None:
    """Append this run to the record (``history``, docs/performance-history.md: the figure's title, when and where
    it ran, its table), and put its headline and date in its row of ``path``'s table of current figures (the row
    whose reproduce column is ``python -m bench.<key>``; a figure without a row gets none, and the record keeps it).
    Nothing else in either file changes."""
    path = path or PERF_DOC
    history = history or path.with_name(path.stem + "-history.md")   # docs/performance-history.md
    title = fig.title[3:] if fig.title.startswith("## ") else fig.title
    body = fig.render().split("\n", 1)[1] if "\n" in fig.render() else ""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    record = history.read_text(encoding="utf-8") if history.exists() else "# Performance: the record of runs\n"
    history.parent.mkdir(parents=True, exist_ok=True)
    history.write_text(f"{record.rstrip()}\n\n## {title} — {when}\n\n{header()}\n{body.rstrip()}\n",
                       encoding="utf-8")
    if not path.exists():
        return
    latest, status = fig.headline()
    latest = latest.replace("|", "/").replace("\n", " ")
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        m = ROW_RE.match(line)
        if m and m.group("key") == fig.key:
            cells = line.split(" | ")
            # | figure | reproduce | floor | target | latest | status |
            if len(cells) >= 6:
                cells[4] = f"{latest} ({when[:10]})"
                cells[5] = f"{status} |" if cells[5].endswith("|") else status
                lines[i] = " | ".join(cells[:6])
    path.write_text("\n".join(lines), encoding="utf-8")


def print_figure(fig: Figure) -> None:
    print(fig.render())
    print(flush=True)


def arg_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--scale", type=float, default=None,
                   help="fraction of the full-size figure (default $IPLEDGER_BENCH_SCALE or the module's default)")
    p.add_argument("--full", action="store_true", help="the full-size figure (scale 1.0)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per measurement")
    p.add_argument("--no-write", action="store_true", help="do not update docs/performance.md or its record of runs")
    return p


def resolve_scale(args: argparse.Namespace, default: float) -> float:
    if args.full:
        return 1.0
    if args.scale is not None:
        return args.scale
    env = os.environ.get("IPLEDGER_BENCH_SCALE")
    return float(env) if env else default


def main_for(run: Callable[..., Figure], description: str, default_scale: float, default_repeat: int = 3,
             argv: list[str] | None = None) -> Figure:
    """The command line every bench module shares: ``python -m bench.X [--scale F | --full] [--repeat N]``."""
    args = arg_parser(description).parse_args(argv)
    scale = resolve_scale(args, default_scale)
    repeat = args.repeat or default_repeat
    load_before = _load()
    try:
        fig = run(scale=scale, repeat=repeat)
    except FeatureMissing as exc:
        fig = Figure(key=getattr(run, "__module__", "?"), title=str(exc.title), target=0, floor=None,
                     status="not available yet", notes=(str(exc.reason),))
    fig = dataclasses.replace(fig, notes=fig.notes + (load_note(load_before, _load()),))
    print_figure(fig)
    if not args.no_write:
        write_doc(fig)
    return fig


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def load_note(before: float | None, after: float | None, cpus: int | None = None) -> str:
    """The machine's load around a figure: other work on the CPUs slows floor and subject unequally (a
    one-process floor keeps its CPU while a multi-process subject loses one, and the reverse), so a ratio
    taken under load is flagged as not comparable with a quiet machine's."""
    cpus = cpus or os.cpu_count() or 1
    if before is None or after is None:
        return "Machine load: unknown."
    # the load after includes the figure's own processes; the load before is other work's
    busy = before > 0.5 * cpus
    return (f"Machine load (1-minute average) {before:.2f} before, {after:.2f} after (the figure's own work "
            f"included), on {cpus} CPUs"
            + (": **taken under load, the ratio is not comparable with a quiet machine's**." if busy
               else ": quiet before the run."))


class FeatureMissing(Exception):
    """The feature a figure measures has not landed yet: report "not available yet" instead of crashing."""

    def __init__(self, title: str, reason: str):
        super().__init__(reason)
        self.title = title
        self.reason = reason


# Started from a small interpreter, not from this (large) bench process: Linux carries the exec'ing parent's
# memory high-water mark into the child's ru_maxrss (vfork/fork then exec), so a child started directly from
# here would report at least the bench process's own peak.
_MEASURE = ("import os, sys\n"
            "pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)\n"
            "_, status, usage = os.wait4(pid, 0)\n"
            "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


def run_cli_measured(args: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Like :func:`run_cli`, also returning the command's own peak resident memory in MiB."""
    full_env = cli_env(env)
    import tempfile as _tf

    with _tf.TemporaryDirectory() as d:
        rss_file = os.path.join(d, "maxrss")
        argv = [PY, "-I", "-S", "-c", _MEASURE, rss_file, PY, "-m", "ledger.cli.main", *args]
        cp = subprocess.run(argv, capture_output=True, text=True, env=full_env)
        with open(rss_file) as f:
            maxrss_kib = int(f.read())
    return cp, maxrss_kib / 1024


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc (parent ids)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_cli_tree_peak(args: list[str], env: dict | None = None, every_s: float = 0.05) -> tuple[int, float]:
    """A command's exit status and the peak of its whole process tree's resident memory in MiB (the command and
    any worker processes it starts), sampled every ``every_s``: the sum of their RSS, so pages a forked worker
    shares with its parent count twice (an upper bound). Complements :func:`run_cli_measured`, whose figure is
    the command's own process."""
    return tree_peak([PY, "-m", "ledger.cli.main", *args], cli_env(env), every_s)


def tree_peak(argv: list[str], env: dict | None = None, every_s: float = 0.05) -> tuple[int, float]:
    """:func:`run_cli_tree_peak` of any command line."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_rss_kib(p) for p in _descendants(proc.pid)))
        time.sleep(every_s)
    return proc.returncode, peak / 1024


def restore_spool(pristine: Path, spool_dir: Path) -> None:
    """``spool_dir`` made a fresh copy of ``pristine`` (a shipment moves its files aside)."""
    if spool_dir.exists():
        shutil.rmtree(spool_dir)
    shutil.copytree(pristine, spool_dir)


# `ipledger` with timers around functions of its modules (module attributes, looked up at call time by their
# callers): $IPLEDGER_BENCH_TIMERS maps a key to "module:function" names; the seconds spent in them are summed
# per key and written, with "process" (from this script's start to exit), to $IPLEDGER_BENCH_TIMERS_OUT as JSON
_TIMED_CLI = """
import atexit, importlib, json, os, sys, time
t_start = time.perf_counter()
spent = {}
def timed(key, real):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
    return wrapper
for key, targets in json.loads(os.environ["IPLEDGER_BENCH_TIMERS"]).items():
    for target in targets:
        module, name = target.split(":")
        m = importlib.import_module(module)
        setattr(m, name, timed(key, getattr(m, name)))
def done():
    spent["process"] = time.perf_counter() - t_start
    open(os.environ["IPLEDGER_BENCH_TIMERS_OUT"], "w").write(json.dumps(spent))
atexit.register(done)
from ledger.cli.main import cli
cli(sys.argv[1:], prog_name="ipledger")
"""


def run_cli_timed(args: list[str], timers: dict[str, tuple[str, ...]],
                  out: Path) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """Run ``ipledger`` like :func:`run_cli`, timing inside it the functions ``timers`` names per key
    ("module:function"); returns the process and the seconds per key (a key never called is absent) and
    "process". ``out`` is the file the timings pass through."""
    env = cli_env({"IPLEDGER_BENCH_TIMERS": json.dumps(timers), "IPLEDGER_BENCH_TIMERS_OUT": str(out)})
    out.unlink(missing_ok=True)
    proc = subprocess.run([PY, "-c", _TIMED_CLI, *args], capture_output=True, text=True, env=env)
    spent = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else {}
    return proc, spent

