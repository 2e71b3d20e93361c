"""Crash consistency: the shipper, the collector and the importer killed with SIGKILL at seeded random instants,
and power cuts simulated by freezing a writer and copying its files mid-write.

After each kill one more `ipledger ship` (or the same import again) must leave every fact in the ledger exactly
once (counted by entry_id against the set that had to arrive), the sequence gapless, each segment's samples
stored once, one receipt per ended run, and `ipledger verify` passing. `make test` runs 10 trials per process
kind on SQLite (3 for the shipper on PostgreSQL, 2 power cuts), `--soak` 100 (50 power cuts;
docs/reliability.md). Each test prints its figures on a ``FIGURES`` line (``pytest -s``).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

from ledger.capture import spool
from tests import adversarial_harness as h

JOBS_PER_TRIAL = 6


def _job_spool(directory: Path, jobs: int, seed: int) -> set[str]:
    """One epilog-shaped spool file per job run (bench.data), plus a collector batch with sample rows."""
    from bench.data import job_records
    from ledger.capture import collector
    from ledger.importers.dmon import parse as parse_dmon

    rng = random.Random(seed)
    for j in range(jobs):
        spool.write(directory, job_records(rng, seed * 1000 + j), prefix="hook")
    dmon = "#Entity    GPUTL        POWER\nID\n" + "".join(
        f"GPU {g}      {40 + k % 7:<13}{300 + k:<13}\n" for k in range(20) for g in (0, 1))
    cfg = collector.CollectorConfig(spool=str(directory), node="n01", interval=1.0, count=20, cluster="hpc1")
    c = parse_dmon(dmon, "dmon", start=1_780_000_000.0 + seed, interval=1.0, node="n01")
    records, _, _ = collector.batch_records(c, cfg, {})
    spool.write(directory, records, prefix="collector")
    return set(h.spooled_ids(directory))


def _landing(url: str, spool_dir: Path) -> str:
    """Where a kill landed, read from what it left: before the entries' commit, after it while the automatic
    receipts were being issued, while the files were being moved aside, or after everything."""
    t = h.tally(url)
    if not t.ids:
        return "before_commit"
    if len(t.receipts) < len(t.ended_runs):
        return "during_receipts"
    return "during_moves" if spool.pending_files(spool_dir) else "after_everything"


def _shipper_trials(tmp_path: Path, n: int, new_ledger, name: str) -> None:
    figs = h.Figures(name)
    template = tmp_path / "template-spool"
    want = _job_spool(template, JOBS_PER_TRIAL, seed=7)
    calibrate = tmp_path / "calibrate"
    shutil.copytree(template, calibrate)
    args = ["ship", "--quiet"]
    env = {"IPLEDGER_AUTO_RECEIPTS": "1"}
    # the kill clock starts when the shipper takes its spool lock (start-up and imports done): kills land
    # anywhere from there to the end of an uninterrupted run, which the calibration run measures
    killed, window = h.kill_after(h.start_cli(["--db", new_ledger("calibrate"), *args, "--spool", str(calibrate)], env),
                                  1e9, ready=lambda: h.holds_flock(calibrate))
    assert not killed
    rng = random.Random(20261130)
    for trial in range(n):
        url = new_ledger(f"t{trial}")
        sp = tmp_path / f"spool-{trial}"
        shutil.copytree(template, sp)
        proc = h.start_cli(["--db", url, *args, "--spool", str(sp)], env)
        if trial % 2:   # every other kill after the commit: the receipts and the moves are short but matter
            probe, close = h.committed(url)
            try:
                killed, _ = h.kill_after(proc, rng.uniform(0, 0.5 * window), ready=probe)
            finally:
                close()
        else:
            killed, _ = h.kill_after(proc, rng.uniform(0, window), ready=lambda: h.holds_flock(sp))  # noqa: B023
        figs.add("trials")
        figs.add("killed" if killed else "finished_before_kill")
        before = h.tally(url)
        _, dup, unexpected = before.exactly_once(want)
        assert dup == 0 and unexpected == 0, f"trial {trial}: the kill itself left duplicates"
        landed = _landing(url, sp)
        figs.add(f"landed_{landed}")
        if landed == "after_everything" and not trial % 2:   # the cold calibration run was slower than this one
            window = max(0.1, 0.85 * window)
        h.invoke(url, ["ship", "--spool", str(sp), "--quiet"])
        t = h.check_ledger(url, want, receipts=True)
        assert not spool.pending_files(sp), "every spool file was moved aside by the recovery shipment"
        figs.add("entries_checked", len(t.ids))
    figs.values.update(lost=0, duplicated=0, facts_per_trial=len(want), window_s=round(window, 3))
    figs.emit()


@pytest.mark.soak
def test_shipper_killed_at_random_sqlite(tmp_path, trials):
    template = h.sqlite_template(tmp_path)
    _shipper_trials(tmp_path, trials(10, 100),
                    lambda tag: h.fresh_sqlite(template, tmp_path / f"ledger-{tag}.db"), "shipper_kill_sqlite")


@pytest.mark.postgres
@pytest.mark.soak
def test_shipper_killed_at_random_postgres(tmp_path, trials, postgres):
    import psycopg

    from ledger.chain import db as db_mod

    base = f"ipl_crash_{os.getpid()}"
    template_url = postgres.create_db(f"{base}_tpl")
    engine = db_mod.make_engine(template_url)
    db_mod.upgrade(engine)
    engine.dispose()

    def new_ledger(tag: str) -> str:
        # CREATE DATABASE ... TEMPLATE copies the migrated schema in milliseconds
        with psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{base}_{tag}"')
            conn.execute(f'CREATE DATABASE "{base}_{tag}" TEMPLATE "{base}_tpl"')
        return postgres.url(f"{base}_{tag}")

    # 3 here (the shipper's 10 quick trials run on SQLite above; the suite's time is shared); 100 under --soak
    _shipper_trials(tmp_path, trials(3, 100), new_ledger, "shipper_kill_postgres")


def test_a_shipper_dying_in_its_after_ship_work_leaves_the_files_for_the_next(tmp_path, sqlite_url, monkeypatch):
    """Deterministic form of the crash the random kills found: the shipper dies after committing the entries
    but before the automatic receipts ran. The files must still be pending, so the next shipment (all its
    entries duplicates) issues the receipts; before the fix they had already been moved and the receipts
    of those runs were never issued."""
    from ledger.chain import db as db_mod
    from ledger.ingest import ship as ship_mod
    from ledger.receipts.auto import after_ship_steps
    from ledger.ingest.site import Site

    sp = tmp_path / "spool"
    want = _job_spool(sp, 3, seed=5)
    receipts = after_ship_steps(Site(db=sqlite_url, spool=str(sp)))

    def power_fails(engine, entries):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt("the shipper died here")

    engine = db_mod.make_engine(sqlite_url)
    try:
        with pytest.raises(KeyboardInterrupt):
            ship_mod.ship(engine, sp, after=[power_fails, *receipts])
        assert h.tally(sqlite_url).ids.keys() == want, "the entries were committed before the crash"
        assert len(spool.pending_files(sp)) == 4, "the files stay until the after-ship work is done"
        rep = ship_mod.ship(engine, sp, after=receipts)
        assert (rep.appended, rep.duplicates) == (0, len(want))
    finally:
        engine.dispose()
    t = h.check_ledger(sqlite_url, want, receipts=True)
    assert len(t.receipts) == 3 and not spool.pending_files(sp)


@pytest.mark.soak
def test_collector_killed_at_random_sqlite(tmp_path, trials):
    """`ipledger collect` killed again and again while writing batches into one spool: the next shipment
    delivers every batch it had put in place, and every complete record of a batch it was writing when
    killed (its ``.tmp`` file, once stale), exactly once; a torn tail is set aside, never half-shipped."""
    from tests.test_collector import _standin

    figs = h.Figures("collector_kill_sqlite")
    url = h.fresh_sqlite(h.sqlite_template(tmp_path), tmp_path / "ledger.db")
    sp = tmp_path / "spool"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'spool = "{sp}"\n[commands]\ndcgmi = "{_standin(tmp_path)}"\n')
    env = {"IPLEDGER_CONFIG": str(cfg)}
    args = ["collect", "--source", "dcgmi", "--interval", "10ms", "--count", "20", "--node", "n01"]
    rng = random.Random(7)
    want: set[str] = set()
    for trial in range(trials(10, 100)):
        log = tmp_path / "collector.log"
        proc = h.start_cli(args, env, log=log)
        before = len(list(sp.glob("*.jsonl*")))
        # a batch every ~0.1 s once started: the kill lands within the first few batches after the first
        killed, _ = h.kill_after(proc, rng.uniform(0.0, 0.4), ready=lambda: len(list(sp.glob("*.jsonl*"))) > before)
        assert killed, f"the collector runs until stopped; it exited {proc.returncode}: {log.read_text()[-1500:]}"
        figs.add("trials")
        figs.add("tmp_files_left", h.age_tmp_files(sp))
        offered = h.spooled_ids(sp, tmp_too=True)
        assert all(n == 1 for n in offered.values()), "a batch was written twice"
        figs.add("batches_in_spool", len(spool.pending_files(sp)))
        want |= set(offered)
        report = h.invoke(url, ["ship", "--spool", str(sp), "--quiet", "--json", "--no-receipts"])
        figs.add("torn_tails_set_aside", len(report["torn"]))
        assert not report["errors"], report["errors"]
        t = h.check_ledger(url, want)
    assert figs.values["batches_in_spool"] > 0 and len(t.ids) == len(want) > 0
    figs.values.update(entries=len(t.ids), lost=0, duplicated=0)
    figs.emit()


@pytest.mark.soak
def test_importer_killed_at_random_sqlite(tmp_path, trials):
    """`ipledger import prometheus` killed mid-import (one transaction): the same import run again gives the
    ledger exactly what an uninterrupted import gives, samples included."""
    from ledger.importers import synth

    figs = h.Figures("importer_kill_sqlite")
    export = tmp_path / "export"
    synth.write_query_range(export, n_gpus=2, hours=1, cadence=15, jobs="slurm")
    template = h.sqlite_template(tmp_path)
    args = ["import", "prometheus", str(export), "--quiet"]

    def writing(db: Path):  # noqa: ANN202 - the import's transaction has begun writing: its WAL grows
        wal = Path(f"{db}-wal")
        return lambda: wal.exists() and wal.stat().st_size > 0

    reference = tmp_path / "reference.db"
    killed, window = h.kill_after(h.start_cli(["--db", h.fresh_sqlite(template, reference), *args], {}), 1e9,
                                  ready=writing(reference))
    assert not killed
    want = set(h.tally(f"sqlite:///{reference}").ids)
    rng = random.Random(11)
    for trial in range(trials(10, 100)):
        db = tmp_path / f"ledger-{trial}.db"
        url = h.fresh_sqlite(template, db)
        killed, ran = h.kill_after(h.start_cli(["--db", url, *args], {}), rng.uniform(0, window),
                                   ready=writing(db))
        figs.add("trials")
        figs.add("killed_while_writing" if killed else "finished_before_kill")
        after_kill = h.tally(url)
        figs.add("left_partial_import", int(0 < len(after_kill.ids) < len(want)))
        assert len(after_kill.ids) in (0, len(want)), "an import is all or nothing"
        h.invoke(url, args)
        t = h.check_ledger(url, want)
        figs.add("entries_checked", len(t.ids))
        for leftover in tmp_path.glob(f"ledger-{trial}.db*"):
            leftover.unlink()
    figs.values.update(facts_per_import=len(want), lost=0, duplicated=0, window_s=round(window, 3))
    figs.emit()


_HOOKS = """
import sys, time
from ledger.capture.hooks import run
config, seed = sys.argv[1], int(sys.argv[2])
for j in range(400):   # a job's prolog and epilog (the real hook code, in one interpreter) every ~30 ms
    job = str(seed * 100_000 + j)
    for kind in ("prolog", "epilog"):
        run(kind, {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
                   "SLURM_JOB_USER": "alice", "SLURM_CLUSTER_NAME": "c1", "SLURMD_NODENAME": "node1",
                   "SLURM_JOB_GPUS": "0,1", "SLURM_SCRIPT_CONTEXT": kind + "_slurmd"}, config)
    time.sleep(0.03)
"""


@pytest.mark.soak
def test_power_cut_while_shipping_and_spooling_sqlite(tmp_path, trials):
    """A shipper and the Slurm hooks (prolog + epilog of job after job) frozen at a random instant; their
    disk copied; what was not yet synced dropped (the WAL after its last commit frame, the unrenamed .tmp
    spool files) at a random byte. On the copy, `ipledger ship` then delivers every
    acknowledged fact (a spool file renamed into place, pending or already shipped) exactly once, and every
    complete record of a torn .tmp at most once; SQLite recovers and `ipledger verify` passes."""
    import sys

    figs = h.Figures("power_cut_sqlite")
    template = h.sqlite_template(tmp_path)
    spool_template = tmp_path / "template-spool"
    _job_spool(spool_template, JOBS_PER_TRIAL, seed=3)
    rng = random.Random(42)
    for trial in range(trials(2, 50)):
        disk = tmp_path / f"disk-{trial}"
        disk.mkdir()
        sp = disk / "spool"
        shutil.copytree(spool_template, sp)
        db = disk / "ledger.db"
        url = h.fresh_sqlite(template, db)
        config = disk / "config.toml"
        config.write_text(f'spool = "{sp}"\n[hooks]\nvendor = "none"\n')
        writer = _hooks_writer(sys.executable, config, trial)
        # receipts off: the shipper's time goes to what a cut can tear (the transaction, the moves)
        shipper = h.start_cli(["--db", url, "ship", "--spool", str(sp), "--quiet", "--no-receipts"], {})
        wal = Path(f"{db}-wal")
        _wait(shipper, wal, 0.4 * rng.random() ** 2)   # most cuts early: in or near the entries' transaction
        figs.add("frozen_while_shipping", int(shipper.poll() is None))
        figs.add("frozen_while_spooling", int(writer.poll() is None))
        h.freeze(shipper, writer)
        cut = tmp_path / f"after-cut-{trial}"
        h.snapshot([sp, db, wal], cut)
        h.kill_frozen(shipper, writer)
        figs.add("trials")
        tail, dropped = h.drop_unsynced_wal_tail(cut / wal.name, rng)
        figs.add("cut_mid_transaction", int(tail > 0))
        figs.add("wal_bytes_dropped", dropped)
        figs.add("tmp_files_torn", h.tear_tmp_files(cut / "spool", rng))
        h.age_tmp_files(cut / "spool")
        acknowledged = h.spooled_ids(cut / "spool", cut / "spool" / spool.SHIPPED_DIR)
        unacknowledged = h.spooled_ids(cut / "spool", tmp_too=True) - h.spooled_ids(cut / "spool")
        url2 = f"sqlite:///{cut / db.name}"
        in_ledger_at_cut = set(h.tally(url2).ids)
        figs.add("facts_already_in_ledger_at_cut", len(in_ledger_at_cut))
        figs.add("acknowledged_facts", len(acknowledged))
        h.invoke(url2, ["ship", "--spool", str(cut / "spool"), "--quiet", "--no-receipts"])
        t = h.check_ledger(url2, set(acknowledged) | set(unacknowledged))
        figs.add("entries_checked", len(t.ids))
        shutil.rmtree(disk)
    figs.values.update(lost=0, duplicated=0)
    figs.emit()


def _hooks_writer(python: str, config: Path, seed: int):  # noqa: ANN201
    import subprocess

    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen([python, "-c", _HOOKS, str(config), str(seed)], cwd=root, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(proc, wal: Path, delay: float) -> None:  # noqa: ANN001
    """Until the shipper has begun writing (its WAL grows), then ``delay`` more seconds (or until it exits)."""
    deadline = time.monotonic() + 60
    while not (wal.exists() and wal.stat().st_size > 0) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    end = time.monotonic() + delay
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.005)


def test_the_power_cut_model_drops_exactly_the_uncommitted_wal_tail(tmp_path):
    """The harness's power cut on a WAL whose open transaction has spilled frames: the frames after the last
    commit are found and cut at a random byte, the committed rows survive and SQLite opens the copy intact."""
    import sqlite3

    db = tmp_path / "w.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA cache_size=2")   # a small cache spills the open transaction's pages into the WAL
    conn.execute("CREATE TABLE t (x)")
    for _ in range(5):
        conn.execute("INSERT INTO t VALUES (?)", ("c" * 5000,))
    conn.execute("BEGIN")
    for _ in range(50):
        conn.execute("INSERT INTO t VALUES (?)", ("u" * 9000,))
    cut = tmp_path / "cut"
    h.snapshot([db, Path(f"{db}-wal")], cut)
    conn.close()
    tail, dropped = h.drop_unsynced_wal_tail(cut / "w.db-wal", random.Random(1))
    assert tail > 0 and 0 <= dropped <= tail
    copy = sqlite3.connect(cut / "w.db")
    assert copy.execute("SELECT COUNT(*) FROM t").fetchone() == (5,)
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    copy.close()


def _recording_chunk(paths):  # noqa: ANN001, ANN202
    """A shipper worker's task that first notes which directories the worker holds open (runs in the worker)."""
    from ledger.ingest import ship as ship_mod

    fds = os.listdir("/proc/self/fd")
    held = []
    for fd in fds:
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    note = Path(os.environ["IPLEDGER_TEST_WORKER_NOTES"]) / f"worker-{os.getpid()}.json"
    note.write_text(__import__("json").dumps(held))
    return ship_mod._REAL_PREPARE_CHUNK(paths)


def test_shipper_workers_do_not_keep_the_spool_lock(tmp_path, sqlite_url, monkeypatch):
    """A shipper's forked reading workers close their copy of the spool lock: a worker outliving a killed
    shipper must not keep the next shipper of that spool waiting forever (flock lives with any copy)."""
    from ledger.chain import db as db_mod
    from ledger.ingest import ship as ship_mod

    sp = tmp_path / "spool"
    want = _job_spool(sp, 4, seed=9)
    notes = tmp_path / "notes"
    notes.mkdir()
    monkeypatch.setenv("IPLEDGER_TEST_WORKER_NOTES", str(notes))
    monkeypatch.setattr(ship_mod, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(ship_mod, "_CHUNK_FILES", 1)
    monkeypatch.setattr(ship_mod, "_REAL_PREPARE_CHUNK", ship_mod._prepare_chunk, raising=False)
    monkeypatch.setattr(ship_mod, "_prepare_chunk", _recording_chunk)
    engine = db_mod.make_engine(sqlite_url)
    try:
        assert ship_mod.ship(engine, sp).appended == len(want)
    finally:
        engine.dispose()
    seen = [__import__("json").loads(p.read_text()) for p in notes.iterdir()]
    assert seen, "the shipment used worker processes"
    assert all(str(sp) not in held for held in seen), "a worker inherited the spool lock's descriptor"
    h.check_ledger(sqlite_url, want)
