"""Figure: the monthly export over N issued receipts, against DuckDB writing the same statement from Parquet.

The ledger (SQLite) holds N ``receipt_issued`` entries carrying their receipts (ledger.sim.synthetic_receipts, the
receipt shape of docs/receipts.md, every window ending in the month), and each receipt's flat lines as the
store writes them at issue (``ledger.chain.receipt_lines.lines_of``; built here in bulk with raw ``executemany``, as
the entries are, so a million receipts take minutes rather than the hours of issuing one by one).

The subject is :func:`reports.statement_file.export_file` (``--format csv``), the library function
`ipledger export monthly` is a thin shell over, run in this process and writing the same file: read the
month's lines, pick what the month bills, aggregate, write the long table (total, tenant, class and hour rows
and one row per billed run). The floor is DuckDB producing the same statement content from a Parquet file of
the receipts' flat rows (one per receipt, every column the long table shows): the total, tenant, class and
hour levels (the hour level grouped by the hour the run starts: cheaper than the export's exact spread over
the hours it held) and one row per run with its ``lost`` column, the figures rounded as the export rounds
them, written to CSV by ``COPY ... TO``, so floor and subject write comparable bytes.

Why this comparison (changed 2026-12-01): the subject used to be a fresh interpreter (the CLI) and the floor
an in-process GROUP BY to a handful of class rows that writes nothing. Interpreter start-up and imports alone
were 32× that floor at the default scale, and the export must write a row per run (a million at full size)
that the floor never produced; the ratio measured mostly those two differences. Both are still reported,
as extra lines: the CLI's wall time and peak memory (a fresh interpreter, measured from a small spawner, the
figure the ≤ 1 GiB target is read against), a bare interpreter importing the export's modules, and the ratio
against the old GROUP BY-only floor (which now reads the wider Parquet file, its columns pruned by DuckDB).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from itertools import islice
from pathlib import Path

from bench.common import PY, ROOT, FeatureMissing, Figure, main_for, run_cli_measured, timeit_interleaved

TITLE = "Monthly export over issued receipts"
FULL_RECEIPTS = 1_000_000
MONTH = "2026-11"
_IMPORTS = ("import ledger.cli.main, ledger.cli.context, reports.statement_file, reports.export, reports.long_csv, "
            "duckdb, pyarrow.compute, adbc_driver_sqlite.dbapi")
HOUR_KEYS = ("paid", "delivered", "underutilized", "starved", "idle_held", "unknown", "suspended")


FLAT_TEXT = ("tenant", "partition", "qos", "currency", "cluster", "job_id", "user", "nodes", "sku", "receipt_hash",
             "replaces_hash")


def build_ledger(db_path: Path, n: int) -> tuple[str, Path]:
    """The ledger of ``n`` issued receipts and, beside it, the Parquet file of their flat rows (the floors)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.ship_sqlite import fresh_db
    from ledger.chain import receipt_lines
    from ledger.chain.canonical import ts_to_epoch
    from ledger.chain.entries import GENESIS_HASH, Kind, chain_hash, make_entry
    from ledger.chain.store import ENTRY_COLUMNS
    from ledger.sim import synthetic_receipts as synthetic
    from reports.monthly import SUM_COLUMNS, flatten

    url = fresh_db(db_path)
    con = sqlite3.connect(db_path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")
    sql = f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({','.join('?' * len(ENTRY_COLUMNS))})"
    seq, prev = 0, GENESIS_HASH
    parquet = db_path.with_suffix(".parquet")
    writer = None
    it = synthetic.receipts(n, MONTH, seed=8)
    while True:
        chunk = list(islice(it, 20_000))
        if not chunk:
            break
        rows, lines = [], []
        for r in chunk:
            j = r["job"]
            issued_at = ts_to_epoch(r["window"]["end"]) + 60
            payload = {"receipt_hash": r["receipt_hash"], "through_seq": r["ledger"]["through_seq"],
                       "issued_at": dt.datetime.fromtimestamp(issued_at, tz=dt.timezone.utc).isoformat(),
                       "receipt": r}
            e = make_entry(Kind.RECEIPT_ISSUED, issued_at, payload, cluster=j["cluster"], job_id=j["job_id"],
                           run=j["run"], source="bench")
            seq += 1
            h = chain_hash(seq, e, prev)
            rows.append((seq, e.entry_id, e.kind, e.ts, e.ts_end, e.recorded_at, e.cluster, e.job_id, e.run,
                         e.node, e.device, e.payload, e.source, e.source_version, prev, h))
            lines.extend(receipt_lines.lines_of_entries([(seq, e.payload)]))  # what the store derives
            prev = h
        con.execute("BEGIN")
        con.executemany(sql, rows)
        con.executemany(receipt_lines.insert_sql(), lines)
        con.execute("COMMIT")
        flat = flatten(chunk).rows  # the floor's rows: every column the long table shows, one per receipt
        t = pa.table({**{c: pa.array(flat[c].to_numpy(dtype=object), pa.string(), from_pandas=True)
                         for c in FLAT_TEXT},
                      "run": flat["run"].to_numpy(), "window_start": flat["window_start"].to_numpy(),
                      "window_end": flat["window_end"].to_numpy(),
                      "ws": [r["window"]["start"] for r in chunk], "we": [r["window"]["end"] for r in chunk],
                      **{c: flat[c].to_numpy() for c in SUM_COLUMNS}})
        writer = writer or pq.ParquetWriter(parquet, t.schema)
        writer.write_table(t)
    if writer:
        writer.close()
    con.close()
    return url, parquet


def floor_sql(parquet: Path, out: Path, through_seq: int, head_hash: str) -> str:
    """DuckDB writing the statement's levels and run rows from the flat rows (see the module doc)."""
    from reports.export import HOURS_DECIMALS, LONG_COLUMNS
    from reports.monthly import MONEY_COLUMNS, SUM_COLUMNS

    def rnd(expr: str, c: str) -> str:
        return f"round({expr}, {2 if c in MONEY_COLUMNS else HOURS_DECIMALS})"

    sums = ", ".join(rnd(f"sum({c})", c) + f" AS {c}" for c in SUM_COLUMNS)
    agg = f"count(*) AS runs, 0 AS corrections, {rnd('sum(paid) - sum(delivered)', 'lost')} AS lost, {sums}"
    levels = {
        "total": ("string_agg(DISTINCT currency, ',') AS currency", ""),
        "tenant": ("tenant, currency", "GROUP BY ALL"),
        "class": ("tenant, partition, qos, currency", "GROUP BY ALL"),
    }
    parts = [f"SELECT '{lv}' AS level, {keys}, {agg} FROM r {grp}" for lv, (keys, grp) in levels.items()]
    parts.append("SELECT 'hour' AS level, tenant, currency, "
                 "CAST(floor((window_start % 86400) / 3600) AS BIGINT) AS hour, "
                 f"{rnd('sum(paid)', 'paid')} AS paid, {rnd('sum(delivered)', 'delivered')} AS delivered "
                 "FROM r GROUP BY ALL")
    run_cols = ", ".join(rnd(c, c) + f" AS {c}" for c in SUM_COLUMNS)
    parts.append(f"SELECT 'run' AS level, {', '.join(FLAT_TEXT)}, run, 'usage' AS row_kind, ws AS window_start, "
                 f"we AS window_end, 1 AS runs, 0 AS corrections, {rnd('paid - delivered', 'lost')} AS lost, "
                 f"{run_cols} FROM r")
    cols = ", ".join(f'"{c}"' if c not in ("month", "through_seq", "head_hash") else
                     {"month": f"'{MONTH}' AS month", "through_seq": f"{through_seq} AS through_seq",
                      "head_hash": f"'{head_hash}' AS head_hash"}[c] for c in LONG_COLUMNS)
    union = " UNION ALL BY NAME ".join(f"({q})" for q in parts)
    return (f"COPY (WITH r AS (SELECT * FROM read_parquet('{parquet}')) SELECT {cols} FROM ({union})) "
            f"TO '{out}' (FORMAT csv, HEADER)")


def run(scale: float, repeat: int) -> Figure:
    import hashlib

    import duckdb

    try:
        from reports.statement_file import export_file
        from ledger.sim import synthetic_receipts as synthetic  # noqa: F401
    except ImportError as exc:
        raise FeatureMissing(TITLE, f"reports.statement_file.export_file not importable: {exc}") from None
    from ledger.chain import db as db_mod
    from reports.issued import ledger_head

    n = max(1000, int(FULL_RECEIPTS * scale))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-export-"))
    try:
        built = time.perf_counter()
        url, parquet = build_ledger(work / "ledger.db", n)
        built = time.perf_counter() - built
        engine = db_mod.make_engine(url)
        through_seq, head_hash = ledger_head(engine, None)
        engine.dispose()
        sums = ", ".join(f"sum({c})" for c in (*HOUR_KEYS, "cost_paid", "cost_delivered", "cost_lost"))
        group_q = (f"SELECT tenant, partition, qos, currency, count(*), {sums} FROM read_parquet('{parquet}') "
                   f"GROUP BY ALL ORDER BY ALL")
        floor_csv, csv_path, cli_csv = work / "floor.csv", work / "statement.csv", work / "cli.csv"
        copy_q = floor_sql(parquet, floor_csv, through_seq, head_hash)
        out: dict = {}

        def floor() -> None:
            con = duckdb.connect()
            con.execute(copy_q)
            con.close()

        def group_floor() -> None:
            con = duckdb.connect()
            out["group"] = con.execute(group_q).fetchall()
            con.close()

        def subject() -> None:
            eng = db_mod.make_engine(url)
            out["written"] = export_file(eng, MONTH, "csv", csv_path)
            eng.dispose()

        peaks: list[float] = []

        def cli() -> None:
            proc, peak = run_cli_measured(["--db", url, "export", "monthly", "--month", MONTH, "--format", "csv",
                                           "--out", str(cli_csv), "--quiet"])
            if proc.returncode != 0:
                raise RuntimeError(f"export failed: {proc.stderr.strip()[-500:]}")
            peaks.append(peak)

        def start_only() -> None:
            # what any export pays before reading a row: a fresh interpreter importing the export's modules
            subprocess.run([PY, "-c", _IMPORTS], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})

        floor_t, subj_t, group_t, cli_t, start_t = timeit_interleaved(
            [(f"DuckDB writing the statement's levels and {n:,} run rows from Parquet (`COPY ... TO` CSV)", floor,
              None),
             ("`reports.statement_file.export_file(..., 'csv', ...)` in process (what `ipledger export monthly` runs)",
              subject, None),
             ("old floor: DuckDB GROUP BY to the class rows", group_floor, None),
             ("CLI", cli, None), ("imports", start_only, None)], repeat)
        runs = sum(r[4] for r in out["group"])
        if runs != n or out["written"].totals["runs"] != n:
            raise RuntimeError("export or floor did not cover every receipt")

        def digest(p: Path) -> str:
            return hashlib.sha256(p.read_bytes()).hexdigest()

        if digest(csv_path) != digest(cli_csv):
            raise RuntimeError("the CLI and the library function wrote different files")
        f = floor_t.median
        return Figure(key="export", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,),
                      scale_note=f"{n:,} issued receipts (scale {scale:g} of {FULL_RECEIPTS:,}); SQLite ledger "
                                 f"of {(work / 'ledger.db').stat().st_size / 2**20:,.0f} MiB; statement CSV "
                                 f"{csv_path.stat().st_size / 2**20:,.1f} MiB (floor's "
                                 f"{floor_csv.stat().st_size / 2**20:,.1f} MiB)",
                      extra={"peak memory of `ipledger export monthly --format csv` (max over runs)":
                                 f"{max(peaks):,.0f} MiB",
                             "`ipledger export monthly --format csv` in a fresh interpreter (median)":
                                 f"{cli_t.median:.3f} s = {cli_t.median / f:.2f}× the floor",
                             "a fresh interpreter importing the export's modules, no work (median)":
                                 f"{start_t.median:.3f} s = {start_t.median / f:.2f}× the floor",
                             "old floor, DuckDB GROUP BY to the class rows from the same Parquet (median)":
                                 f"{group_t.median:.4f} s; the export is {subj_t.median / group_t.median:.1f}× it "
                                 f"in process, the CLI {cli_t.median / group_t.median:.1f}×",
                             "ledger generated in (not timed against the floor)": f"{built:,.0f} s"})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.02, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
