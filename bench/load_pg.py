"""Load figure: many shippers at once against the real PostgreSQL — entries/s, p99 latency of one epilog's
shipment, and the count that proves no entry was lost or duplicated and the chain is one line.

Each shipper is a node: its own spool directory and its own database connection. It plays epilogs: write one
job run's records durably to its spool (spool.write), then ship (the latency measured). Every epilog also
carries one fact that every node records identically (a shared progress entry: same content, same
entry_id), so concurrent shippers race to record the same fact; and every few epilogs a shipped file is put
back in the spool (a crash after commit, before the file was moved), so at-least-once delivery is exercised.

Floor: the same number of entries COPYed in one transaction by one connection (the best the server does).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench import data, pg
from bench.common import Figure, Timing, main_for

TITLE = "Load: concurrent shippers into PostgreSQL"
FULL_SHIPPERS = 64
FULL_EPILOGS = 40  # per shipper


def epilog_records(shipper: int, epilog: int) -> list[dict]:
    """What node ``shipper``'s epilog number ``epilog`` spools (deterministic)."""
    rng = random.Random(shipper * 1_000_003 + epilog)
    # job numbers close together: a job's times grow with its number, and the shipper refuses times more
    # than a day ahead of its clock (docs/security.md)
    recs = data.job_records(rng, shipper * 1_000 + epilog)
    # an observation (a spool may hold nothing else, docs/security.md) that every node records identically
    recs.append({"kind": "progress", "ts": "2026-06-01T00:00:00Z", "ts_end": None, "recorded_at": None,
                 "cluster": "hpc1", "job_id": None, "run": None, "node": None, "device": None,
                 "source": "bench", "source_version": "1",
                 "payload": {"shared": "fact", "version": epilog % 5}})
    return recs


def expected_ids(shippers: int, epilogs: int) -> set[str]:
    from ledger.chain.entries import entry_from_record

    return {entry_from_record(r).entry_id for s in range(shippers) for e in range(epilogs)
            for r in epilog_records(s, e)}


def shipper(url: str, index: int, epilogs: int, spool_root: str, reship_every: int = 7,
            start: threading.Event | None = None) -> dict:
    """One node: play ``epilogs`` epilogs, shipping after each; returns latencies and counts."""
    from ledger.capture import spool
    from ledger.chain.db import make_engine
    from ledger.ingest.ship import ship

    engine = make_engine(url)
    directory = Path(spool_root) / f"node-{index:03d}"
    latencies, appended, duplicates, records = [], 0, 0, 0
    if start is not None:
        start.wait()
    try:
        for e in range(epilogs):
            t0 = time.perf_counter()
            spool.write(directory, epilog_records(index, e))
            rep = ship(engine, directory)
            latencies.append(time.perf_counter() - t0)
            if rep.errors:
                raise RuntimeError(f"shipper {index}: {rep.errors[0]}")
            appended += rep.appended
            duplicates += rep.duplicates
            records += rep.records
            if reship_every and e % reship_every == reship_every - 1:
                done = sorted((directory / spool.SHIPPED_DIR).iterdir())[-1]
                shutil.copy(done, directory / done.name)  # shipped, but the move "did not happen"
        rep = ship(engine, directory)
        appended += rep.appended
        duplicates += rep.duplicates
        records += rep.records
        pending = len(spool.pending_files(directory))
    finally:
        engine.dispose()
    return {"latencies": latencies, "appended": appended, "duplicates": duplicates, "records": records,
            "pending": pending}


def _proc_main(url: str, index: int, epilogs: int, spool_root: str, start, out) -> None:  # noqa: ANN001
    try:
        out.put((index, shipper(url, index, epilogs, spool_root, start=start)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        out.put((index, {"error": f"{type(exc).__name__}: {exc}"}))


def run_shippers(url: str, shippers: int, epilogs: int, processes: bool = True) -> dict:
    """Run the shippers at once (processes, or threads each with its own connection); return the tally."""
    root = tempfile.mkdtemp(prefix="ipledger-load-")
    try:
        results: dict[int, dict] = {}
        t0 = time.perf_counter()
        if processes:
            import multiprocessing as mp

            ctx = mp.get_context("fork")
            start, out = ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=_proc_main, args=(url, i, epilogs, root, start, out))
                     for i in range(shippers)]
            for p in procs:
                p.start()
            t0 = time.perf_counter()
            start.set()
            for _ in procs:
                i, r = out.get(timeout=900)
                results[i] = r
            wall = time.perf_counter() - t0
            for p in procs:
                p.join()
        else:
            start = threading.Event()
            errors: list[str] = []

            def body(i: int) -> None:
                try:
                    results[i] = shipper(url, i, epilogs, root, start=start)
                except BaseException as exc:  # noqa: BLE001
                    errors.append(f"shipper {i}: {type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=body, args=(i,)) for i in range(shippers)]
            for t in threads:
                t.start()
            t0 = time.perf_counter()
            start.set()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            if errors:
                raise RuntimeError(errors[0])
        bad = [f"shipper {i}: {r['error']}" for i, r in results.items() if "error" in r]
        if bad:
            raise RuntimeError(bad[0])
        lat = sorted(x for r in results.values() for x in r["latencies"])
        return {"wall": wall, "latencies": lat,
                "appended": sum(r["appended"] for r in results.values()),
                "duplicates": sum(r["duplicates"] for r in results.values()),
                "records": sum(r["records"] for r in results.values()),
                "pending": sum(r["pending"] for r in results.values())}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def ledger_tally(url: str) -> dict:
    """What the ledger holds: rows, distinct ids, seq range, and whether the chain verifies."""
    from sqlalchemy import text

    from ledger.chain.db import make_engine
    from ledger.chain.verify import verify

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows, distinct, lo, hi = conn.execute(text(
                "SELECT COUNT(*), COUNT(DISTINCT entry_id), MIN(seq), MAX(seq) FROM entries")).one()
            ids = {r[0] for r in conn.execute(text("SELECT entry_id FROM entries"))}
        report = verify(engine, chain_only=True)
    finally:
        engine.dispose()
    return {"rows": int(rows), "distinct": int(distinct), "min_seq": lo, "max_seq": hi, "ids": ids,
            "chain_ok": report.ok, "verified": report.entries}


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    return sorted(values)[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]


def run(scale: float, repeat: int) -> Figure:
    import psycopg

    from ledger.chain.entries import entry_from_record
    from ledger.chain.store import ENTRY_COLUMNS

    shippers = max(2, int(round(FULL_SHIPPERS * min(1.0, scale * 4))))  # default scale 0.25 -> 64 shippers
    epilogs = max(2, int(round(FULL_EPILOGS * scale)))
    want = expected_ids(shippers, epilogs)
    runs, rates, p99s, checks = [], [], [], []
    for _ in range(repeat):
        url = pg.fresh_ledger(TITLE, "load")
        tally = run_shippers(url, shippers, epilogs, processes=True)
        got = ledger_tally(url)
        ok = (got["rows"] == got["distinct"] == len(want) and got["ids"] == want and got["chain_ok"]
              and got["min_seq"] == 1 and got["max_seq"] == len(want) and tally["pending"] == 0)
        checks.append(ok)
        if not ok:
            raise RuntimeError(f"load run lost or duplicated entries: ledger rows {got['rows']}, distinct "
                               f"{got['distinct']}, expected {len(want)}, chain ok {got['chain_ok']}, "
                               f"pending files {tally['pending']}")
        runs.append(tally["wall"])
        rates.append(len(want) / tally["wall"])
        p99s.append(p99(tally["latencies"]))
        shipped = tally["records"]
    # the floor: the same entries, one COPY, one connection
    rows = []
    from bench.data import GENESIS_HASH
    from ledger.chain.entries import chain_hash

    seq, prev = 0, GENESIS_HASH
    seen = set()
    for s in range(shippers):
        for e in range(epilogs):
            for r in epilog_records(s, e):
                ent = entry_from_record(r)
                if ent.entry_id in seen:
                    continue
                seen.add(ent.entry_id)
                seq += 1
                h = chain_hash(seq, ent, prev)
                rows.append((seq, ent.entry_id, ent.kind, ent.ts, ent.ts_end, ent.recorded_at, ent.cluster,
                             ent.job_id, ent.run, ent.node, ent.device, ent.payload, ent.source,
                             ent.source_version, prev, h))
                prev = h
    floor_runs = []
    for _ in range(repeat):
        url = pg.fresh_ledger(TITLE, "loadfloor")
        t0 = time.perf_counter()
        with psycopg.connect(pg.conninfo(url)) as conn:
            with conn.cursor() as cur:
                with cur.copy(f"COPY entries ({', '.join(ENTRY_COLUMNS)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            conn.commit()
        floor_runs.append(time.perf_counter() - t0)
    fig = Figure(
        key="load_pg", title=TITLE, target=float("inf"),
        floor=Timing(f"one connection, one COPY of the {len(rows):,} entries", tuple(floor_runs)),
        subjects=(Timing(f"{shippers} shippers × {epilogs} epilogs each, wall time", tuple(runs)),),
        scale_note=f"{shippers} concurrent shipper processes (own spool, own connection) × {epilogs} epilogs "
                   f"(scale {scale:g}; full = {FULL_SHIPPERS} × {FULL_EPILOGS})",
        extra={"entries/s (median)": f"{statistics.median(rates):,.0f}",
               "p99 latency of one epilog's shipment (spool write + ship), median over runs":
                   f"{statistics.median(p99s) * 1000:,.0f} ms",
               "records shipped (incl. re-shipped and shared)": f"{shipped:,}",
               "unique entries expected / in ledger": f"{len(want):,} / {len(want):,} (no loss, no duplicate; "
                                                      f"seq 1..{len(want)} without gaps)",
               "chain verifies": "yes" if all(checks) else "NO"},
        notes=("No ratio target: this figure is about correctness under concurrency and the throughput "
               "the single chain lock allows (docs/scale.md).",))
    return fig


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.25, default_repeat=1, argv=argv)


if __name__ == "__main__":
    main()
