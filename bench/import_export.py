"""Figure: `ipledger import prometheus FILES` of a 24-hour, 64-GPU, 12-metric export at 15 s into a fresh SQLite
ledger, against DuckDB reading the same files plus raw sqlite3.executemany of the sample rows they hold.

The export is bench.analyze's (ledger.importers.synth, one ``/api/v1/query_range`` JSON response per metric).
The subject is the real command in a fresh interpreter, with timers around the stages it passes through (the
query_range reading, the pipeline's write, the device-hour aggregation sealed with each segment, the receipts),
so each stage's share is measured inside the very process that is timed, not inferred from other runs. The
floor reads the export and bulk-appends its rows: DuckDB turns the files into one row per device per timestamp
with the metric columns, which go into a plain table by ``executemany`` in one transaction (WAL,
synchronous=FULL). Beside it, the rows the ledger ends up holding (entries, sample blocks, device-hours...),
read back from the subject's ledger, inserted the same way into a fresh ledger's schema.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import tempfile
from pathlib import Path

from ledger.importers import synth

from bench.common import Figure, Timing, main_for, run_cli_timed, timeit_interleaved

TITLE = "Import a Prometheus export into SQLite"
FULL_GPUS = 64
METRICS = synth.DEFAULT_METRICS[:12]
SAMPLES_PER_DAY = 24 * 3600 // 15
# the import's stages, timed inside the importing process (module attributes looked up at call time by their callers)
STAGE_TIMERS = {"read": ("ledger.importers.prometheus:read",), "write": ("ledger.importers.pipeline:write",),
                "hours": ("ledger.telemetry.hours:store_in",), "hours_aggregate": ("ledger.telemetry.hours:aggregate",),
                "block_encode": ("ledger.telemetry.blocks:encode", "ledger.telemetry.blocks:encode_columns"),
                "digest": ("ledger.telemetry.sealed:digest_normalised",),
                "receipts": ("ledger.cli.importers:_issue_closed",)}
STAGES = (("read", "reading the query_range files (ledger.importers.prometheus.read)"),
          ("write", "the pipeline's write: timelines, segments, blocks, device-hours, one transaction"),
          ("hours", "of which the device-hours sealed with each segment (telemetry.hours.store_in)"),
          ("hours_aggregate", "of which their computation (hours.aggregate), the rest their INSERT"),
          ("block_encode", "of the write: the columnar sample blocks (blocks.encode_columns; its first call "
                           "imports pyarrow)"),
          ("digest", "of the write: the segments' sha256 over canonical JSON rows"),
          ("receipts", "the receipts of the runs the import closed"))


NOTES = ("The subject's time includes everything a user waits for: the interpreter, reading the export, one "
         "timeline per device, a segment per device per 6 h sealed by its sha256 over canonical JSON rows, the "
         "samples as a compressed Arrow block, the device-hours computed and stored beside each block, the synthetic "
         "runs, the Merkle tree, and the receipts of the runs the import closed. The stages above are timed by "
         "wrappers around those functions inside the timed process (a few timer calls per segment). The floor makes "
         "Python rows for executemany; the lower floor shows how much of it is DuckDB turning points into rows.",)


def floor_query(directory: Path) -> str:
    """One row per (device, t), a column per metric, from the query_range files (the points' shape as in
    bench.analyze's floor)."""
    cols = ", ".join(f"max(CASE WHEN metric = '{m}' THEN CAST(p[2] AS DOUBLE) END) AS \"{m}\"" for m in METRICS)
    return (f"WITH r AS (SELECT unnest(data.result) AS s FROM read_json('{directory}/*.json', "
            f"maximum_object_size=2000000000)), "
            f"v AS (SELECT s.metric.UUID AS dev, s.metric.__name__ AS metric, unnest(s.\"values\") AS p FROM r) "
            f"SELECT dev, CAST(p[1] AS DOUBLE) AS t, {cols} FROM v GROUP BY dev, t ORDER BY dev, t")


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    return con


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def read_and_append(directory: Path, db_path: Path, out: dict) -> None:
    """The floor: DuckDB reads the export into sample rows, sqlite3 appends them in one transaction."""
    import time

    import duckdb

    t0 = time.perf_counter()
    con = duckdb.connect()
    rows = con.execute(floor_query(directory)).fetchall()
    con.close()
    t1 = time.perf_counter()
    _remove_db(db_path)
    db = _connect(db_path)
    db.execute(f"CREATE TABLE samples (device TEXT, t REAL, {', '.join(f'm{i} REAL' for i in range(len(METRICS)))})")
    db.execute("BEGIN IMMEDIATE")
    db.executemany(f"INSERT INTO samples VALUES ({','.join('?' * (2 + len(METRICS)))})", rows)
    db.execute("COMMIT")
    db.close()
    out.setdefault("read_s", []).append(t1 - t0)
    out.setdefault("append_s", []).append(time.perf_counter() - t1)
    out["rows"] = len(rows)


def ledger_rows(db_path: Path) -> dict[str, tuple[list[str], list[tuple]]]:
    """Every row the ledger holds, table by table (alembic's own table left out)."""
    con = sqlite3.connect(db_path)
    try:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%' AND name != 'alembic_version' ORDER BY name")]
        out = {}
        for t in tables:
            cur = con.execute(f"SELECT * FROM {t}")  # in its key order (some have no rowid)
            rows = cur.fetchall()
            if rows:
                out[t] = ([d[0] for d in cur.description], rows)
        return out
    finally:
        con.close()


def insert_ledger_rows(db_path: Path, held: dict[str, tuple[list[str], list[tuple]]]) -> None:
    """The extra floor: those very rows into a fresh ledger's schema (same indexes and triggers), one transaction.
    Entries go first, as the ledger's own tables reference them."""
    con = _connect(db_path)
    con.execute("BEGIN IMMEDIATE")
    for table in sorted(held, key=lambda t: (t != "entries", t)):
        names, rows = held[table]
        con.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({','.join('?' * len(names))})", rows)
    con.execute("COMMIT")
    con.close()


def check_ledger(db_path: Path, summary: dict, gpus: int, floor_rows: int) -> dict:
    """The subject's ledger holds the whole export: every device's samples in blocks, its device-hours adding
    up to the same samples and seconds, one block per segment entry. Returns the counts."""
    con = sqlite3.connect(db_path)
    try:
        q = lambda sql: con.execute(sql).fetchone()  # noqa: E731
        block_rows, blocks_n = q("SELECT SUM(rows), COUNT(*) FROM sample_blocks")
        segs, = q("SELECT COUNT(*) FROM entries WHERE kind = 'telemetry_segment'")
        dh_rows, dh_devices, dh_n, dh_covered = q("SELECT COUNT(*), COUNT(DISTINCT device), SUM(n), SUM(covered_s) "
                                                  "FROM device_hours")
        dh_segments, = q("SELECT COUNT(DISTINCT segment_id) FROM device_hours")
    finally:
        con.close()
    want = gpus * SAMPLES_PER_DAY
    problems = []
    if not (summary.get("devices") == dh_devices == gpus):
        problems.append(f"devices: import says {summary.get('devices')}, device_hours {dh_devices}, export {gpus}")
    if not (summary.get("samples") == block_rows == dh_n == floor_rows == want):
        problems.append(f"samples: import {summary.get('samples')}, blocks {block_rows}, device-hours {dh_n}, "
                        f"floor {floor_rows}, export {want}")
    if not (dh_rows == gpus * 24 and segs == blocks_n == dh_segments == summary.get("segments")):
        problems.append(f"device_hours rows {dh_rows} (want {gpus * 24}); segments {segs}, blocks {blocks_n}, "
                        f"with device-hours {dh_segments}")
    if abs((dh_covered or 0) - gpus * 86400) > 1e-6 * gpus * 86400:
        problems.append(f"device-hours cover {dh_covered} s, the export {gpus * 86400} s")
    if problems:
        raise RuntimeError("the imported ledger is not the export: " + "; ".join(problems))
    return {"blocks": blocks_n, "device_hours": dh_rows, "samples": block_rows}


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    from bench.analyze import floor_query as plain_read_query
    from bench.ship_sqlite import fresh_db

    gpus = max(1, int(FULL_GPUS * scale))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-import-"))
    try:
        export = work / "export"
        files = synth.write_query_range(export, n_gpus=gpus, hours=24, cadence=15, jobs="slurm", metrics=METRICS)
        ledger, floor_db, extra_db, spent = work / "ledger.db", work / "floor.db", work / "extra.db", work / "spent"
        state: dict = {"stages": []}
        floor_parts: dict = {}

        def setup_subject() -> None:
            state["url"] = fresh_db(ledger)

        def subject() -> None:
            args = ["--db", state["url"], "import", "prometheus", *map(str, files), "--json", "--quiet"]
            proc, stages = run_cli_timed(args, STAGE_TIMERS, spent)
            if proc.returncode != 0:
                raise RuntimeError(f"ipledger import failed: {proc.stderr.strip()[-300:]}")
            state["summary"] = json.loads(proc.stdout)
            state["stages"].append(stages)

        def plain_read() -> None:
            con = duckdb.connect()
            con.execute(plain_read_query(export)).fetchall()
            con.close()

        floor_t, plain_t, subj_t = timeit_interleaved(  # the subject last: its ledger is checked and read back below
            [("DuckDB reads the JSON files into sample rows + sqlite3.executemany of them, one tx",
              lambda: read_and_append(export, floor_db, floor_parts), None),
             ("DuckDB reads the files alone (bench.analyze's floor: a sum per device and metric)", plain_read, None),
             (f"`ipledger import prometheus FILES --json` ({len(files)} files), device-hours sealed", subject,
              setup_subject)], repeat)
        counts = check_ledger(ledger, state["summary"], gpus, floor_parts["rows"])
        held = ledger_rows(ledger)

        def setup_extra() -> None:
            fresh_db(extra_db)

        extra_t = timeit_interleaved([("", lambda: insert_ledger_rows(extra_db, held), setup_extra)], repeat)[0]
        counts.update(gpus=gpus, files=len(files), size=sum(p.stat().st_size for p in files))
        return _figure(scale, counts, floor_t, subj_t, {"plain": plain_t, "ledger_rows": extra_t, "held": held,
                                                        "floor_parts": floor_parts, "stages": state["stages"]})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _figure(scale: float, counts: dict, floor_t: Timing, subj_t: Timing, m: dict) -> Figure:
    med = statistics.median
    parts, stages, held = m["floor_parts"], m["stages"], m["held"]
    duck, append = med(parts["read_s"]), med(parts["append_s"])
    ledger_rows_s, plain = m["ledger_rows"].median, m["plain"].median
    extra = {
        "floor's parts (medians)": f"DuckDB reading the files into {parts['rows']:,} Python rows {duck:.3f} s, "
                                   f"their executemany {append:.3f} s",
        "extra floor: the rows the ledger ends up holding, inserted by executemany into a fresh ledger, one tx":
            f"median {ledger_rows_s:.3f} s ({sum(len(r) for _, r in held.values()):,} rows: "
            + ", ".join(f"{t} {len(r):,}" for t, (_, r) in sorted(held.items())) + "); with the floor's DuckDB "
            f"read {duck + ledger_rows_s:.3f} s, against which the import is "
            f"{subj_t.median / (duck + ledger_rows_s):.2f}×",
        "a lower floor: DuckDB reading the files alone (no rows out) + the floor's executemany":
            f"{plain:.3f} + {append:.3f} s, against which the import is {subj_t.median / (plain + append):.2f}×",
    }
    for key, label in STAGES:
        per_run = [s.get(key, 0.0) for s in stages]
        shares = [s.get(key, 0.0) / t for s, t in zip(stages, subj_t.runs)]
        extra[f"inside the import: {label}"] = (f"median {med(per_run):.3f} s = {med(shares) * 100:.1f} % of the "
                                                f"import (per run: {', '.join(f'{x * 100:.1f}' for x in shares)} %)")
    rest = [s["process"] - s.get("read", 0) - s.get("write", 0) - s.get("receipts", 0) for s in stages]
    extra["inside the import: the rest (module imports, the schema check, the summary)"] = f"median {med(rest):.3f} s"
    outside = [t - s.get("process", t) for s, t in zip(stages, subj_t.runs)]
    extra["outside the timed code (the interpreter's start and exit)"] = f"median {med(outside):.3f} s"
    hours_s = [s.get("hours", 0.0) for s in stages]
    without = [(t - h) / f for t, h, f in zip(subj_t.runs, hours_s, floor_t.runs)]
    extra["the import without the device-hours"] = (f"{med(without):.2f}× the floor (median of per-run ratios); "
                                                    f"with them {subj_t.median / floor_t.median:.2f}×")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    return Figure(key="import_export", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,), extra=extra,
                  notes=NOTES,
                  scale_note=f"{counts['gpus']} GPUs × 24 h × {len(METRICS)} metrics at 15 s = {counts['samples']:,} "
                             f"samples ({counts['samples'] * len(METRICS):,} points) in {counts['files']} query_range "
                             f"files ({counts['size'] / 2**20:,.0f} MiB); {counts['blocks']} segments, "
                             f"{counts['device_hours']:,} device-hours; scale {scale:g} of {FULL_GPUS} GPUs; load "
                             f"average at the end {load}")


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.25, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
