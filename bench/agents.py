"""Figure: `ipledger findings` over a fleet's device-hours (1,000 GPUs × 7 days at 10 s at full size) and its
peak memory, against DuckDB computing the same hourly aggregates from the same samples in Parquet; `ipledger
daily` beside it.

The bench generates the samples itself (numpy, one 8-GPU node-day at a time, so memory stays bounded): each
chunk is written as one Parquet file, as one sample block (``ledger.telemetry.blocks.encode_columns``: what the
agents read raw samples from, for their findings' scopes and windows) and aggregated by the project's seal-time
function (``ledger.telemetry.hours.aggregate``), whose rows go into the ledger's `device_hours` table beside the
allocation entries of one job per node and day. The segment entries and their digests are what `bench.receipt`
and `bench.ship_sqlite` measure and are left out here (an hour of hashing at full size that says nothing about
the agents), so the ledger this builds does not verify. The subject is the real command in a fresh interpreter;
the floor is one DuckDB query over the Parquet files computing, per device and hour, the sums the subject reads
ready-made.

The fleet is busy with noise; about 0.7 % of node-days hold an idle-held GPU, 0.7 % a starved job, 0.1 % a
power-capped node, and 2 % of all samples carry a stray power-cap reason (no finding; the screen must not read
them raw). The findings' raw samples — a job's hours, a capped node's hours with a day of evidence each side —
are what `findings` reads beyond the device-hours.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import Figure, main_for, run_cli_measured, timeit_interleaved

TITLE = "Agents at scale (findings over device-hours)"
FULL_GPUS, DAYS, CADENCE = 1000, 7, 10.0
T0 = 1_793_577_600.0        # 2026-11-02 00:00 UTC
MODEL = "NVIDIA H100 80GB HBM3"
RATED = 1980.0


def _faults(node: int, day: int) -> tuple[bool, bool, bool]:
    """(an idle-held GPU, a starved job, a power-capped node) on this node-day."""
    k = node * 7 + day
    return k % 149 == 1, k % 139 == 8, k % 877 == 15


def _chunk(rng: np.random.Generator, node: int, day: int) -> dict:
    """One node-day of samples for 8 GPUs: busy jobs with noise and stray power-cap samples, and the node-day's
    faults (:func:`_faults`): GPU node % 8 idle for the afternoon (no process, no activity); every GPU starved
    for two hours (process resident); every GPU power-capped most of the day."""
    n = int(86400 / CADENCE)
    idle, starve, cap = _faults(node, day)
    t = T0 + day * 86400.0 + np.arange(n) * CADENCE
    dev, cols = [], {k: [] for k in ("t", "sm_active", "sm_clock_mhz", "power_w", "gpu_temp_c", "clock_reasons",
                                     "fb_used_mib", "compute_procs")}
    for g in range(8):
        act = np.clip(rng.normal(0.7, 0.1, n), 0.0, 1.0)
        procs = np.ones(n)
        if idle and g == node % 8:
            act[n // 2:] = 0.0
            procs[n // 2:] = 0.0
        if starve:
            act[n // 4:n // 4 + 720] = 0.01
        reasons = np.where(rng.random(n) < (0.7 if cap else 0.02), 4, 0)
        clk = np.clip(rng.normal(1700.0, 40.0, n) - 200.0 * (reasons == 4), 300.0, RATED)
        power = 90.0 + 560.0 * act * (clk / RATED) ** 2
        dev.append(np.full(n, f"GPU-{node:04d}-{g}"))
        for k, v in (("t", t), ("sm_active", act), ("sm_clock_mhz", clk), ("power_w", power),
                     ("gpu_temp_c", 30.0 + 0.07 * power), ("clock_reasons", reasons.astype(float)),
                     ("fb_used_mib", np.where(procs > 0, 40_000.0, 0.0)), ("compute_procs", procs)):
            cols[k].append(v)
    out = {k: np.concatenate(v) for k, v in cols.items()}
    out["device"] = np.concatenate(dev)
    out["dt"] = np.full(len(out["t"]), CADENCE)
    for k in ("tensor_active", "gpu_util", "ecc_sbe_aggregate", "ecc_sbe_volatile", "xid", "row_remap_pending",
              "row_remap_failure"):
        out[k] = np.full(len(out["t"]), np.nan)
    return out


def build(work: Path, gpus: int, days: int) -> tuple[str, Path, int, float]:
    """The ledger (entries + device-hours) and the Parquet files; returns (url, parquet dir, samples, seconds
    the seal-time aggregation took)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sqlalchemy import text

    from ledger.chain import db as db_mod
    from ledger.chain.entries import Kind, make_entry
    from ledger.chain.store import append
    from ledger.telemetry import blocks, hours

    url = f"sqlite:///{work / 'ledger.db'}"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    pq_dir = work / "parquet"
    pq_dir.mkdir()
    rng = np.random.default_rng(7)
    samples, agg_s = 0, 0.0
    cols_out = ("device", "t", "dt", "clock_reasons", "sm_active", "sm_clock_mhz", "power_w", "gpu_temp_c",
                "fb_used_mib", "compute_procs")
    for node in range((gpus + 7) // 8):
        entries = []
        for day in range(days):
            c = _chunk(rng, node, day)
            pq.write_table(pa.table({k: c[k] for k in cols_out}), pq_dir / f"n{node:04d}-d{day}.parquet")
            t = time.perf_counter()
            rows = hours.aggregate(c)
            agg_s += time.perf_counter() - t
            samples += len(c["t"])
            sid = hashlib.sha256(f"bench-{node}-{day}".encode()).hexdigest()
            block = blocks.encode_columns(c)
            with engine.begin() as conn:
                conn.execute(text("INSERT INTO sample_blocks (segment_id, format, rows, sha256, data) "
                                  "VALUES (:s, :f, :n, :h, :d)"),
                             {"s": sid, "f": block.format, "n": block.rows, "h": block.sha256, "d": block.data})
                conn.execute(hours.device_hours_insert_sql(), [{"segment_id": sid, **dict(zip(hours.FIELDS, map(
                    hours.device_hours_db_value, (getattr(h, f) for f in hours.FIELDS))))} for h in rows])
            key = dict(cluster="bench", job_id=str(100000 + node * 100 + day), run=0, node=f"n{node:04d}")
            a, b = T0 + day * 86400.0, T0 + (day + 1) * 86400.0
            entries.append(make_entry(Kind.ALLOCATION_STARTED, a, {"account": f"t{node % 5}", "partition": "gpu",
                                                                   "qos": "normal", "gpus": 8}, **key))
            entries += [make_entry(Kind.DEVICE_BOUND, a, {"index": g, "uuid": f"GPU-{node:04d}-{g}", "sku": MODEL,
                                                          "vendor": "NVIDIA", "node": key["node"]},
                                   device=f"GPU-{node:04d}-{g}", **key) for g in range(8)]
            entries.append(make_entry(Kind.ALLOCATION_ENDED, b, {"exit_code": 0, "state": "COMPLETED"}, **key))
        append(engine, entries)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT SUM(n) FROM device_hours")).scalar() == samples
    engine.dispose()
    return url, pq_dir, samples, agg_s


def floor_query(pq_dir: Path) -> str:
    """Per device and hour, the sums the subject reads from `device_hours` (the method's activity buckets,
    busy and busy x clock per reason, the temperature-on-power fit's sums)."""
    a = "LEAST(GREATEST(sm_active, 0), 1)"
    work, low = f"(sm_active IS NOT NULL AND {a} >= 0.05)", f"(sm_active IS NOT NULL AND {a} < 0.05)"
    res = "(compute_procs > 0 OR fb_used_mib > 512)"
    reason = ("CASE WHEN clock_reasons IS NULL THEN 4 WHEN (CAST(clock_reasons AS BIGINT) & 96) > 0 THEN 0 "
              "WHEN (CAST(clock_reasons AS BIGINT) & 136) > 0 THEN 2 WHEN (CAST(clock_reasons AS BIGINT) & 4) > 0 "
              "THEN 1 WHEN (CAST(clock_reasons AS BIGINT) & 16) > 0 THEN 3 ELSE 4 END")
    per_reason = ", ".join(f"SUM(CASE WHEN {work} AND r = {i} THEN dt * {a} ELSE 0 END), "
                           f"SUM(CASE WHEN {work} AND r = {i} THEN dt * {a} * sm_clock_mhz ELSE 0 END)"
                           for i in range(5))
    return (f"SELECT device, floor(t / 3600) AS hour, count(*), sum(dt), "
            f"SUM(CASE WHEN {work} THEN dt * {a} ELSE 0 END), SUM(CASE WHEN {work} THEN dt * (1 - {a}) ELSE 0 END), "
            f"SUM(CASE WHEN {low} AND {res} THEN dt ELSE 0 END), "
            f"SUM(CASE WHEN {low} AND NOT {res} THEN dt ELSE 0 END), "
            f"{per_reason}, MAX(CASE WHEN {work} THEN sm_clock_mhz END), "
            f"SUM(power_w), SUM(gpu_temp_c), SUM(power_w * power_w), SUM(power_w * gpu_temp_c), count(power_w) "
            f"FROM (SELECT *, {reason} AS r FROM read_parquet('{pq_dir}/*.parquet')) GROUP BY ALL")


NOTE = ("The subject is every agent over device-hours (`ipledger findings`: allocation entries and the "
        "`device_hours` rows, plus the raw samples of its findings' scopes and windows read from their blocks); "
        "`ipledger daily` is the second line: since `daily` became `account` (one command, one number), it gives the "
        "loss by cause beside the daily rows, so it runs the agents as `findings` does and costs what `account` "
        "cost before (the daily rows alone, as `daily` once printed them, were about half). The seal-time "
        "aggregation above runs on columns, as `ipledger ship` (a batch's segments grouped in one pass) and `ipledger import` (each "
        "segment's timeline columns) now run it; its share of those commands is in their own figures (Ship "
        "collector segments into SQLite, Import a Prometheus export into SQLite).")


def _load() -> str:
    p = Path("/proc/loadavg")
    return " ".join(p.read_text().split()[:3]) if p.exists() else "?"


def _kinds(res: dict) -> str:
    counts: dict[str, int] = {}
    for f in res["findings"]:
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))


def _check(res: dict, daily_rows: list, gpus: int, days: int, floor_rows: int) -> None:
    """The subjects saw the whole fleet and found what was put there: every injected idle GPU, starved job and
    capped node, and nothing on the rest."""
    paid = sum(r["paid"] for r in daily_rows)
    if abs(paid - gpus * days * 24) > 1e-3 * paid or floor_rows != gpus * days * 24 or \
            abs(res["account"]["paid"] - paid) > 1e-3 * paid:
        raise RuntimeError(f"the account ({paid:.1f} GPU-h) or the floor ({floor_rows} device-hours) missed "
                           f"device time")
    want = {"idle_held": set(), "starved": set(), "power_cap": set()}
    for node in range(gpus // 8):
        for day in range(days):
            for kind, hit in zip(want, _faults(node, day)):
                if hit:
                    want[kind].add(f"n{node:04d}" if kind == "power_cap" else str(100000 + node * 100 + day))
    got = {k: set() for k in want}
    for f in res["findings"]:
        if f["kind"] in got:
            sc = f["scope"]
            got[f["kind"]].add(sc["node"] if f["kind"] == "power_cap" else sc["job_id"])
    if got != want:
        raise RuntimeError(f"findings {got} are not the injected faults {want}")


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    gpus = max(16, int(FULL_GPUS * scale)) // 8 * 8   # whole 8-GPU nodes
    days = DAYS if scale >= 0.5 else 2
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-agents-"))
    try:
        t = time.perf_counter()
        url, pq_dir, samples, agg_s = build(work, gpus, days)
        build_s = time.perf_counter() - t
        q = floor_query(pq_dir)
        out: dict = {}

        def floor() -> None:
            con = duckdb.connect()
            out["floor_rows"] = len(con.execute(q).fetchall())
            con.close()

        def subject() -> None:
            out["proc"], peak = run_cli_measured(["--db", url, "findings", "--json"])
            out.setdefault("peaks", []).append(peak)

        def daily() -> None:
            out["daily"], peak = run_cli_measured(["--db", url, "daily", "--json"])
            out.setdefault("daily_peaks", []).append(peak)

        floor_t, subj_t, daily_t = timeit_interleaved(
            [("DuckDB: the hourly aggregates from the Parquet files", floor, None),
             ("`ipledger findings --json` (device-hours)", subject, None),
             ("`ipledger daily --json` (device-hours; `account` under its other name)", daily, None)], repeat)
        for p in (out["proc"], out["daily"]):
            if p.returncode != 0:
                raise RuntimeError(p.stderr.strip()[-300:])
        _check(json.loads(out["proc"].stdout), json.loads(out["daily"].stdout)["daily"], gpus, days,
               out["floor_rows"])
        peak, daily_peak = max(out["peaks"]), max(out["daily_peaks"])
        return Figure(key="agents", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t, daily_t),
                      scale_note=f"{gpus:,} GPUs × {days} days at {CADENCE:g} s = {samples:,} samples "
                                 f"({gpus * days * 24:,} device-hours); scale {scale:g} of {FULL_GPUS:,} "
                                 f"GPUs × {DAYS} days",
                      extra={"peak memory of `ipledger findings`": f"{peak:,.0f} MiB (target ≤ 2048 MiB: "
                                                                   f"{'met' if peak <= 2048 else 'NOT met'})",
                             "peak memory of `ipledger daily`": f"{daily_peak:,.0f} MiB",
                             "findings": _kinds(json.loads(out["proc"].stdout)),
                             "seal-time aggregation (hours.aggregate)": f"{agg_s:,.1f} s for {samples:,} samples, "
                                                                        f"{agg_s / samples * 1e6:.2f} µs per sample",
                             "building the bench's data": f"{build_s:,.0f} s",
                             "load average at the end": _load()},
                      notes=(NOTE,))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.032, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
