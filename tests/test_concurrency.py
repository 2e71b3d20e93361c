"""Concurrency: many shippers at once (SQLite and the real PostgreSQL) and 200 epilogs finishing at once on one
node: no entry lost, none duplicated, one gapless verified chain, no deadlock, every hook within its budget.

The shipper tests are a small version of bench/load_pg.py: nodes (threads, or real processes) each with their
own spool and their own database connection play epilogs and ship after each; every epilog also records one
fact that all nodes record identically (so shippers race to record the same entry), and now and then a shipped
file reappears in a spool (a crash after commit, before the move), so at-least-once delivery is exercised too.
Each test prints its figures on a ``FIGURES`` line (``pytest -s``) for docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections import Counter

import pytest

from bench.load_pg import expected_ids, ledger_tally, run_shippers
from ledger.capture import spool
from tests import adversarial_harness as h

SHIPPERS = 8
EPILOGS = 6
BURST = 200
GLOBAL_TIMEOUT_S = 300   # no deadlock: everything below finishes well within this on a loaded 2-core machine


def _check_load_run(url: str, tally: dict, want: set[str]) -> dict:
    got = ledger_tally(url)
    assert tally["pending"] == 0, "every spool file was shipped and moved aside"
    assert got["ids"] == want, "exactly the expected facts are in the ledger"
    assert got["rows"] == got["distinct"] == len(want), "no fact recorded twice"
    assert (got["min_seq"], got["max_seq"]) == (1, len(want)), "one sequence, no gaps"
    assert got["chain_ok"] and got["verified"] == len(want), "one linear hash chain that verifies"
    # every record offered (including the shared facts and the re-shipped files) was either appended once or
    # recognised as a duplicate
    assert tally["appended"] == len(want)
    assert tally["appended"] + tally["duplicates"] == tally["records"]
    assert tally["duplicates"] > 0, "the shared facts and re-shipped files were offered more than once"
    return got


def test_concurrent_shippers_lose_nothing_and_duplicate_nothing(ledger_url):
    want = expected_ids(SHIPPERS, EPILOGS)
    tally = run_shippers(ledger_url, SHIPPERS, EPILOGS, processes=False)
    _check_load_run(ledger_url, tally, want)


@pytest.mark.postgres
@pytest.mark.soak
def test_eight_node_processes_ship_at_once_into_postgres(postgres, trials):
    """8 shipper processes (fork: separate interpreters, connections and spools, as 8 nodes) at once."""
    url = postgres.create_db(f"ipl_conc_{os.getpid()}")
    from ledger.chain import db as db_mod

    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    engine.dispose()
    epilogs = trials(EPILOGS, 40)
    want = expected_ids(SHIPPERS, epilogs)
    t0 = time.perf_counter()
    tally = run_shippers(url, SHIPPERS, epilogs, processes=True)
    got = _check_load_run(url, tally, want)
    h.Figures("eight_shipper_processes_postgres", {
        "shippers": SHIPPERS, "epilogs_per_shipper": epilogs, "records_offered": tally["records"],
        "entries": got["rows"], "duplicates_refused": tally["duplicates"], "lost": 0, "duplicated": 0,
        "p99_shipment_s": sorted(tally["latencies"])[int(0.99 * (len(tally["latencies"]) - 1))],
        "wall_s": time.perf_counter() - t0}).emit()


@pytest.mark.postgres
def test_eight_ipledger_ship_commands_at_once_into_postgres(postgres, tmp_path):
    """8 `ipledger ship` processes of the installed CLI at once, one per node spool, automatic receipts on:
    every spooled fact once, one receipt per ended run, one chain that `ipledger verify` accepts."""
    from bench.data import job_records
    from ledger.chain import db as db_mod

    url = postgres.create_db(f"ipl_conc_cli_{os.getpid()}")
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    engine.dispose()
    spools = [tmp_path / f"node-{i}" for i in range(SHIPPERS)]
    for i, sp in enumerate(spools):
        rng = random.Random(i)
        for j in range(4):
            spool.write(sp, job_records(rng, i * 1000 + j), prefix="hook")
    want = set(h.spooled_ids(*spools))
    procs = [h.start_cli(["--db", url, "ship", "--spool", str(sp), "--quiet"], {"IPLEDGER_AUTO_RECEIPTS": "1"})
             for sp in spools]
    t0 = time.perf_counter()
    codes = [p.wait(timeout=GLOBAL_TIMEOUT_S) for p in procs]
    wall = time.perf_counter() - t0
    assert codes == [0] * SHIPPERS
    assert not any(spool.pending_files(sp) for sp in spools)
    t = h.check_ledger(url, want, receipts=True)
    h.Figures("eight_ship_commands_postgres", {"shippers": SHIPPERS, "entries": len(t.ids),
                                               "receipts": sum(t.receipts.values()), "lost": 0, "duplicated": 0,
                                               "wall_s": wall}).emit()


@pytest.mark.soak
def test_200_epilogs_at_once_on_one_node_sqlite(tmp_path, trials):
    """200 jobs end at the same moment on one node: their installed epilog scripts run at once (as slurmd
    starts them), with an `ipledger ship` running through the burst. Every run's entries land exactly once,
    the chain is one line, no hook overruns its budget, nothing deadlocks."""
    from click.testing import CliRunner

    from ledger.cli.main import cli
    from ledger.capture.hooks import run as run_hook
    from tests.standins import make_site

    budget = 5.0   # hook_timeout_s, the site default (docs/slurm.md): with no tool to wait for, a hook's whole run
    site = make_site(tmp_path, tools=(), ngpus=2, timeout=budget,
                     hooks={"trace": str(tmp_path / "trace.jsonl"), "vendor": "none"})
    hooks = tmp_path / "hooks"
    r = CliRunner().invoke(cli, ["hooks", "install", "--dir", str(hooks), "--config", str(site.config)])
    assert r.exit_code == 0, r.output
    url = h.fresh_sqlite(h.sqlite_template(tmp_path), tmp_path / "ledger.db")
    figs = h.Figures("epilog_burst_sqlite")
    rounds = trials(1, 5)
    for rnd in range(rounds):
        jobs = [str(10_000 * (rnd + 1) + i) for i in range(BURST)]
        for job in jobs:   # prologs ran at each job's start (in-process here: the burst is the epilogs)
            assert run_hook("prolog", _slurm_env(job, "prolog_slurmd"), str(site.config)) == 0
        shipper = h.start_cli(["--db", url, "ship", "--spool", str(site.spool), "--quiet"], {})
        started = time.perf_counter()
        epilogs = [(job, time.perf_counter(), subprocess.Popen(
            [str(hooks / "epilog")], env=_slurm_env(job, "epilog_slurmd"), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)) for job in jobs]
        walls = []
        for job, t0, p in epilogs:
            _, err = p.communicate(timeout=max(1.0, GLOBAL_TIMEOUT_S - (time.perf_counter() - started)))
            assert p.returncode == 0, f"epilog of job {job} exited {p.returncode}"
            assert not err.strip(), f"epilog of job {job} logged: {err.decode()[-500:]}"
            walls.append(time.perf_counter() - t0)
        burst_wall = time.perf_counter() - started
        assert shipper.wait(timeout=GLOBAL_TIMEOUT_S) == 0
        h.invoke(url, ["ship", "--spool", str(site.spool), "--quiet"])
        figs.worst("worst_epilog_wall_s", max(walls))
        figs.worst("burst_wall_s", burst_wall)
        figs.add("epilogs", len(walls))
    trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    epilog_trace = [t for t in trace if t["hook"] == "epilog"]
    assert len(epilog_trace) == BURST * rounds and all(t["ok"] and not t["errors"] for t in trace)
    own = max(t["elapsed_s"] for t in epilog_trace)
    assert own <= budget, f"an epilog took {own} s of its own time, over its {budget} s budget"
    want = set(h.spooled_ids(site.spool, site.spool / spool.SHIPPED_DIR))
    assert not spool.pending_files(site.spool)
    t = h.check_ledger(url, want)
    per_run = Counter()
    for kind, job in _kinds_and_jobs(url):
        per_run[(kind, job)] += 1
    for rnd in range(rounds):
        for i in range(BURST):
            job = str(10_000 * (rnd + 1) + i)
            assert per_run[("allocation_started", job)] == per_run[("allocation_ended", job)] == 1, job
            assert per_run[("device_bound", job)] == 2, job
    figs.values.update(entries=len(t.ids), lost=0, duplicated=0, worst_epilog_own_s=own, budget_s=budget)
    figs.emit()


def _slurm_env(job: str, context: str) -> dict[str, str]:
    """What slurmd gives a prolog/epilog: a minimal environment, no PATH."""
    return {"SLURM_JOB_ID": job, "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_PARTITION": "gpu",
            "SLURM_CLUSTER_NAME": "c1", "SLURMD_NODENAME": "node1", "SLURM_JOB_GPUS": "0,1",
            "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_EXIT_CODE": "0"}


def _kinds_and_jobs(url: str) -> list[tuple[str, str]]:
    from sqlalchemy import text

    from ledger.chain import db as db_mod

    engine = db_mod.make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text("SELECT kind, job_id FROM entries"))]
    finally:
        engine.dispose()


def test_shippers_sharing_one_spool_take_turns(tmp_path):
    """Four shippers on ONE spool (a central shipper over a shared spool, or a timer run overlapping a manual
    one) while epilogs keep spooling: they take turns on the spool lock, so every fact lands once and no
    run's receipt is issued twice."""
    import threading

    from bench.data import job_records
    from ledger.chain import db as db_mod
    from ledger.receipts.auto import after_ship_steps
    from ledger.ingest.ship import ship
    from ledger.ingest.site import Site

    url = h.fresh_sqlite(h.sqlite_template(tmp_path), tmp_path / "ledger.db")
    sp = tmp_path / "spool"
    receipts = after_ship_steps(Site(db=url, spool=str(sp)))
    rng = random.Random(3)
    for j in range(8):
        spool.write(sp, job_records(rng, j), prefix="hook")
    errors: list[str] = []
    go = threading.Event()

    def shipper() -> None:
        engine = db_mod.make_engine(url)
        try:
            go.wait()
            for _ in range(3):
                rep = ship(engine, sp, after=receipts)
                errors.extend(rep.errors + rep.after_errors)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            engine.dispose()

    def epilogs() -> None:
        go.wait()
        for j in range(8, 20):
            spool.write(sp, job_records(rng, j), prefix="hook")
            time.sleep(0.01)

    threads = [threading.Thread(target=shipper) for _ in range(4)] + [threading.Thread(target=epilogs)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(timeout=GLOBAL_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a shipper is stuck (deadlock)"
    assert not errors, errors[:3]
    h.invoke(url, ["ship", "--spool", str(sp), "--quiet"])
    t = h.check_ledger(url, set(h.spooled_ids(sp, sp / spool.SHIPPED_DIR)), receipts=True)
    assert len(t.ended_runs) == 20 and sum(t.receipts.values()) == 20
