"""Shared machinery of the adversarial tests (tests/test_crash.py, tests/test_concurrency.py).

Real processes of the installed `ipledger` are started, killed with SIGKILL (or frozen with SIGSTOP for a
"power cut" snapshot) at seeded random instants; what the ledger holds afterwards is counted against the set
of facts that had to arrive: by entry_id, each exactly once, with a gapless sequence, a verifying chain, the
samples of every segment stored once, and one receipt per ended run. The figures each test measured are
printed as one ``FIGURES`` line (visible with ``pytest -s``) for docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain.entries import entry_from_record
from ledger.telemetry.sealed import read_samples

IPLEDGER = str(Path(sys.executable).with_name("ipledger"))  # the installed console script of this venv
DERIVED_KINDS = ("receipt_issued",)  # facts the ledger makes itself (issued_at differs per issue)


def start_cli(args: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen:
    """The installed CLI as its own process (own session, so a kill reaches only it and its children)."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    return subprocess.Popen([IPLEDGER, *args], env={**os.environ, **env}, stdout=out, stderr=out,
                            start_new_session=True)


def kill_after(proc: subprocess.Popen, delay: float, ready=None) -> tuple[bool, float]:  # noqa: ANN001
    """SIGKILL the process group ``delay`` seconds after it started (or after ``ready()`` first returned true:
    the kill then lands in the work, whatever the start-up took on a loaded machine). Returns (killed: it was
    still running, i.e. a real crash; seconds it ran since the clock started)."""
    t0 = time.monotonic()
    while ready is not None and not ready():
        if proc.poll() is not None:
            return False, time.monotonic() - t0
        if time.monotonic() - t0 > 60:
            raise AssertionError("the process never got ready")
        time.sleep(0.005)
    t0 = time.monotonic()
    while time.monotonic() - t0 < delay:
        if proc.poll() is not None:
            return False, time.monotonic() - t0
        time.sleep(0.005)
    alive = proc.poll() is None
    if alive:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            alive = False
    proc.wait(timeout=30)
    return alive, delay


def holds_flock(path: Path) -> bool:
    """Whether some process holds a flock on ``path`` (/proc/locks: the shipper's spool lock)."""
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return any(parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino)
                   for parts in (line.split() for line in f) if len(parts) > 5)


def committed(url: str):  # noqa: ANN201
    """A probe (for kill_after's ``ready``) that turns true once the ledger holds any entry: the shipper has
    committed. Returns (probe, close)."""
    engine = db_mod.make_engine(url)

    def probe() -> bool:
        with engine.connect() as conn:
            return conn.execute(text("SELECT 1 FROM entries LIMIT 1")).first() is not None

    return probe, engine.dispose


def invoke(url: str, args: list[str], **env: str) -> dict | str:
    """The CLI in this process (recovery steps: same code as the installed command, without a new interpreter)."""
    from ledger.cli.main import cli

    res = CliRunner().invoke(cli, ["--db", url, *args], env={"IPLEDGER_AUTO_RECEIPTS": "1", **env},
                             catch_exceptions=False)
    assert res.exit_code == 0, f"ipledger {' '.join(args)} exited {res.exit_code}: {res.output[-2000:]}"
    try:
        return json.loads(res.output)
    except ValueError:
        return res.output


def spooled_ids(*directories: Path, tmp_too: bool = False) -> Counter:
    """entry_id -> times offered, over every spool file (``.jsonl``; with ``tmp_too`` also complete lines of
    ``.jsonl.tmp`` files, which a later shipment delivers once they are stale)."""
    ids: Counter = Counter()
    for d in directories:
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.name.endswith(".jsonl") or (tmp_too and p.name.endswith(".jsonl.tmp")):
                for rec in spool.read(p).records:
                    ids[entry_from_record(rec).entry_id] += 1
    return ids


def age_tmp_files(directory: Path) -> int:
    """Make abandoned ``.tmp`` files look stale to the shipper (as they will after STALE_TMP_SECONDS)."""
    old = time.time() - spool.STALE_TMP_SECONDS - 60
    n = 0
    for p in directory.glob("*.jsonl.tmp"):
        os.utime(p, (old, old))
        n += 1
    return n


@dataclass
class Tally:
    """What a ledger holds, counted."""

    ids: Counter                 # entry_id -> rows (every kind but the derived ones)
    rows: int
    seqs: tuple                  # (count, min, max)
    sample_problems: list        # segments whose stored sample rows != the rows their entry seals
    ended_runs: set
    receipts: Counter            # (cluster, job_id, run) -> receipt_issued entries
    receipt_hash_repeats: int    # the same receipt (hash) issued twice for one run

    def exactly_once(self, want: set[str]) -> tuple[int, int, int]:
        """(lost, duplicated, unexpected) against the set of facts that had to arrive."""
        lost = len(want - set(self.ids))
        dup = sum(n - 1 for n in self.ids.values() if n > 1)
        unexpected = len(set(self.ids) - want)
        return lost, dup, unexpected


def tally(url: str) -> Tally:
    engine = db_mod.make_engine(url)
    try:
        with engine.connect() as conn:
            ids: Counter = Counter()
            ended, receipts, hashes = set(), Counter(), Counter()
            for entry_id, kind, cluster, job_id, run, payload in conn.execute(text(
                    "SELECT entry_id, kind, cluster, job_id, run, payload FROM entries")):
                if kind == "receipt_issued":
                    key = (cluster, job_id, run or 0)
                    receipts[key] += 1
                    hashes[(key, json.loads(payload)["receipt_hash"])] += 1
                    continue
                ids[entry_id] += 1
                if kind == "allocation_ended" and job_id is not None:
                    ended.add((cluster, job_id, run or 0))
            seqs = tuple(conn.execute(text("SELECT COUNT(*), MIN(seq), MAX(seq) FROM entries")).one())
            sealed = {eid: json.loads(p)["rows"] for eid, p in conn.execute(text(
                "SELECT entry_id, payload FROM entries WHERE kind = 'telemetry_segment'"))}
            # through the telemetry store's reader, whatever layout it keeps the rows in
            problems = [eid for eid, n in sealed.items()
                        if read_samples(conn, segment_ids=[eid], columns=("device", "t")).num_rows != n]
    finally:
        engine.dispose()
    return Tally(ids=ids, rows=sum(ids.values()) + sum(receipts.values()), seqs=seqs, sample_problems=problems,
                 ended_runs=ended, receipts=receipts, receipt_hash_repeats=sum(n - 1 for n in hashes.values()))


def verify_ok(url: str) -> bool:
    """`ipledger verify` (chain, sample digests, issued receipts replayed) exits 0."""
    from ledger.cli.main import cli

    return CliRunner().invoke(cli, ["--db", url, "verify"]).exit_code == 0


def check_ledger(url: str, want: set[str], receipts: bool = False) -> Tally:
    """Assert every wanted fact is in the ledger exactly once and the ledger is whole; returns the tally."""
    t = tally(url)
    lost, dup, unexpected = t.exactly_once(want)
    assert (lost, dup, unexpected) == (0, 0, 0), f"lost {lost}, duplicated {dup}, unexpected {unexpected}"
    count, lo, hi = t.seqs
    assert count == t.rows and (lo, hi) == ((1, count) if count else (None, None)), f"sequence not gapless: {t.seqs}"
    assert not t.sample_problems, f"segments whose samples are missing or doubled: {t.sample_problems[:3]}"
    if receipts:
        assert set(t.receipts) == t.ended_runs, (
            f"runs ended without a receipt: {sorted(t.ended_runs - set(t.receipts))[:3]}")
        assert t.receipt_hash_repeats == 0, "the same receipt was issued twice for a run"
    assert verify_ok(url), "ipledger verify fails"
    return t


def sqlite_template(directory: Path) -> Path:
    """An initialised, empty SQLite ledger to copy for each trial (cheaper than a migration per trial)."""
    path = directory / "template.db"
    engine = db_mod.make_engine(f"sqlite:///{path}")
    db_mod.upgrade(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return path


def fresh_sqlite(template: Path, path: Path) -> str:
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@dataclass
class Figures:
    """The numbers one adversarial test produced, printed as one line for docs/reliability.md."""

    name: str
    values: dict = field(default_factory=dict)

    def add(self, key: str, n: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + n

    def worst(self, key: str, v: float) -> None:
        self.values[key] = max(self.values.get(key, v), v)

    def emit(self) -> None:
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in self.values.items()}
        print(f"\nFIGURES {self.name}: " + json.dumps(shown, sort_keys=True), flush=True)


def freeze(*procs: subprocess.Popen) -> None:
    """SIGSTOP the writers' process groups: the files as they stand are what a power cut would leave,
    plus writes not yet synced (dropped afterwards by the caller)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass


def kill_frozen(*procs: subprocess.Popen) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
            os.killpg(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


_WAL_HEADER, _FRAME_HEADER = 32, 24


def drop_unsynced_wal_tail(wal: Path, rng) -> tuple[int, int]:  # noqa: ANN001
    """Cut a SQLite WAL after its last committed frame at a random byte: a transaction's frames are synced
    only at its commit (synchronous=FULL), so whatever follows the last commit frame may be lost or torn by a
    power cut. Returns (bytes after the last commit, bytes dropped)."""
    if not wal.exists() or wal.stat().st_size < _WAL_HEADER:
        return 0, 0
    data = wal.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    salts = data[16:24]
    end_of_commit = _WAL_HEADER
    pos = _WAL_HEADER
    while pos + _FRAME_HEADER + page_size <= len(data):
        frame = data[pos:pos + _FRAME_HEADER]
        if frame[8:16] != salts:      # a frame of an earlier WAL generation: not part of this log
            break
        pos += _FRAME_HEADER + page_size
        if int.from_bytes(frame[4:8], "big"):   # "database size after commit": a commit frame
            end_of_commit = pos
    cut = rng.randint(end_of_commit, len(data))
    with open(wal, "r+b") as f:
        f.truncate(cut)
    return len(data) - end_of_commit, len(data) - cut


def tear_tmp_files(directory: Path, rng) -> int:  # noqa: ANN001
    """Cut every ``.jsonl.tmp`` (written, not yet fsynced and renamed) at a random byte; returns how many."""
    n = 0
    for p in directory.glob("*.jsonl.tmp"):
        size = p.stat().st_size
        with open(p, "r+b") as f:
            f.truncate(rng.randint(0, size))
        n += 1
    return n


def snapshot(paths: list[Path], into: Path) -> None:
    """Copy files and directories (a frozen machine's disk) into ``into``; SQLite's -shm is left behind, as
    a reboot would (it is rebuilt from the WAL)."""
    into.mkdir(parents=True)
    for p in paths:
        if p.is_dir():
            shutil.copytree(p, into / p.name, ignore=shutil.ignore_patterns("*-shm"))
        elif p.exists() and not p.name.endswith("-shm"):
            shutil.copy2(p, into / p.name)
