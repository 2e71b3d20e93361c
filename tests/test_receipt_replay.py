"""Replay: the same ledger through the same sequence gives byte-identical canonical JSON and the same hash, on
SQLite and on the real PostgreSQL, in this process and in another; unrelated later entries change nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.canonical import canonical_json
from ledger.chain.entries import Kind, make_entry
from ledger.receipts import receipt_for
from ledger.receipts.example import KEY, START, UUID, load_example
from ledger.telemetry.model import Sample
from ledger.telemetry.sealed import segment_entry, write_segment


def _noisy_run(engine, job="8001", seed=7):
    """A 2-node, 4-GPU run with irregular float telemetry, a node gap, a suspend, requeue-free."""
    rnd = random.Random(seed)
    key = dict(cluster="hpc1", job_id=job, run=0)
    t0 = START.timestamp() + 17.25
    uuids = [f"GPU-{job}-{i}" for i in range(4)]
    es = [make_entry(Kind.ALLOCATION_STARTED, t0, {"account": "chem", "partition": "gpu", "qos": "high"},
                     node=f"n{n}", **key) for n in (1, 2)]
    es += [make_entry(Kind.DEVICE_BOUND, t0, {"index": i % 2, "sku": "AMD Instinct MI300X" if i % 2 else
                                              "NVIDIA H100 80GB HBM3"}, device=u, node=f"n{1 + i // 2}", **key)
           for i, u in enumerate(uuids)]
    store.append(engine, es)
    for u in uuids:
        samples, t = [], t0 - 3.0
        while t < t0 + 5400:
            dt = rnd.choice([10.0, 10.0, 10.0, 9.7, 30.0])
            samples.append(Sample(device=u, t=t, dt=dt, clock_reasons=rnd.choice([0, 4, 0x20, 0x8, None, 0x14]),
                                  sm_active=rnd.choice([None, rnd.random(), 0.0, 0.03]),
                                  gpu_util=rnd.random(), sm_clock_mhz=rnd.uniform(300, 2100),
                                  compute_procs=rnd.choice([0.0, 1.0, None]), fb_used_mib=rnd.uniform(0, 9e4)))
            t += dt + rnd.choice([0.0, 0.0, 0.0, 45.0])
        write_segment(engine, samples, segment_entry(samples, node="n1", source="test"))
    store.append(engine, [
        make_entry(Kind.UNKNOWN_INTERVAL, t0 + 600.5, {"cause": "collector_down", "scope": "node"},
                   ts_end=t0 + 901, node="n2", source="collector"),  # importer-style: no job keys
        make_entry(Kind.ALLOCATION_SUSPENDED, t0 + 3000, {}, ts_end=t0 + 3333.3, **key),
        make_entry(Kind.ALLOCATION_ENDED, t0 + 5400, {"exit_code": 0}, node="n1", **key),
        make_entry(Kind.ALLOCATION_ENDED, t0 + 5401.5, {"exit_code": 0}, node="n2", **key),
    ])
    return uuids


def _build(url):
    eng = db_mod.make_engine(url)
    load_example(eng)
    _noisy_run(eng)
    out = {job: receipt_for(eng, job) for job in ("7001", "8001")}
    eng.dispose()
    return out


def test_byte_identical_on_sqlite_and_postgresql(sqlite_url, postgres):
    pg_url = postgres.create_db(f"ipledger_replay_{os.getpid()}")
    eng = db_mod.make_engine(pg_url)
    db_mod.upgrade(eng)
    eng.dispose()
    a, b = _build(sqlite_url), _build(pg_url)
    for job in a:
        assert a[job].canonical() == b[job].canonical(), job
        assert a[job].hash == b[job].hash
    r = a["8001"].body
    assert r["job"]["devices"][0]["node"] == "n1" and len(r["job"]["devices"]) == 4
    assert r["window"]["end"].startswith("2026-12-01T01:00:18.75")  # merged: the later node's end
    assert any(u["cause"] == "collector_down" and u["gpu_hours"] > 0 for u in r["unknown_intervals"])
    assert r["method"]["fidelity"] == "samples" and r["gpu_hours"]["suspended"] > 0


def test_same_hash_in_another_process(sqlite_url):
    mine = _build(sqlite_url)
    env = dict(os.environ, IPLEDGER_CONFIG="", PYTHONHASHSEED="123")
    for job, r in mine.items():
        out = subprocess.run([sys.executable, "-m", "ledger.cli.main", "--db", sqlite_url, "receipt", job,
                              "--format", "json"], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        theirs = json.loads(out.stdout)
        assert canonical_json(theirs) == r.canonical() and theirs["receipt_hash"] == r.hash


def test_unrelated_later_entries_do_not_change_as_of_receipts(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    load_example(eng)
    head = store.get_head(eng)[0]
    before = receipt_for(eng, "7001", as_of=head)
    # unrelated: another job, telemetry of another device, a contract for another account, a gap elsewhere
    _noisy_run(eng, job="9001")
    other = [Sample(device="GPU-other", t=START.timestamp(), dt=10.0, sm_active=0.5)]
    write_segment(eng, other, segment_entry(other, node="n9", source="test"))
    store.append(eng, [
        make_entry(Kind.CONTRACT_VERSION, "2026-12-02T00:00:00Z", {"id": "chem-only", "version": "9",
                                                                   "accounts": ["chem"],
                                                                   "skus": {"default": {"rate_per_gpu_hour": "9"}}}),
        make_entry(Kind.UNKNOWN_INTERVAL, START, {"cause": "collector_down"}, ts_end="2026-12-01T01:00:00Z",
                   device="GPU-other", node="n9"),
    ])
    after_head = store.get_head(eng)[0]
    assert after_head > head + 5
    assert receipt_for(eng, "7001", as_of=head).canonical() == before.canonical()
    assert receipt_for(eng, "7001", as_of=after_head).canonical() == before.canonical()
    assert receipt_for(eng, "7001").hash == before.hash  # through_seq is the last *relevant* entry
    # a relevant later entry does change the head receipt, and the as-of one still stays
    store.append(eng, [make_entry(Kind.ADJUSTMENT, "2026-12-03T00:00:00Z", {"direction": "debit", "amount": "1.00",
                                                                            "reason": "x", "by": "y"}, **KEY)])
    assert receipt_for(eng, "7001").hash != before.hash
    assert receipt_for(eng, "7001", as_of=after_head).hash == before.hash
    eng.dispose()


def test_as_of_before_the_telemetry_does_not_see_it(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    info = load_example(eng)
    seg_seq = next(c.seq for c in store.iter_entries(eng, kinds=[Kind.TELEMETRY_SEGMENT])
                   if c.entry.entry_id == info["segment_id"])
    early = receipt_for(eng, "7001", as_of=seg_seq - 1).body
    assert early["method"]["fidelity"] == "none" and early["ledger"]["through_seq"] == seg_seq - 1
    assert early["gpu_hours"]["delivered"] == 0.0
    full = receipt_for(eng, "7001").body
    assert full["gpu_hours"]["delivered"] == 0.405
    with pytest.raises(LookupError):
        receipt_for(eng, "7001", as_of=0)
    eng.dispose()
    assert UUID in {d["uuid"] for d in full["job"]["devices"]}



def test_worker_processes_give_the_same_receipt(sqlite_url, monkeypatch):
    import importlib

    gmod = importlib.import_module("ledger.receipts.gather")
    eng = db_mod.make_engine(sqlite_url)
    _noisy_run(eng)
    here = receipt_for(eng, "8001")  # library default: in-process
    monkeypatch.setattr(gmod, "PARALLEL_MIN_DEVICES", 2)
    results = spy_attribute_all(monkeypatch, gmod)
    there = receipt_for(eng, "8001", workers=2)
    eng.dispose()
    assert results and results[0] is not None and len(results[0]) == 4  # the worker path did the devices
    assert there.canonical() == here.canonical()


def spy_attribute_all(monkeypatch, gmod) -> list:  # noqa: ANN001
    """Record what LazySamples.attribute_all (the worker path) returns, call by call."""
    results = []
    original = gmod.LazySamples.attribute_all

    def spy(self, tasks):  # noqa: ANN001, ANN202
        out = original(self, tasks)
        results.append(out)
        return out

    monkeypatch.setattr(gmod.LazySamples, "attribute_all", spy)
    return results
