"""Figure: the monthly export over N issued receipts, against a DuckDB GROUP BY over the same receipt rows.

The ledger (SQLite) holds N ``receipt_issued`` entries carrying their receipts (reports.synthetic, the
receipt shape of docs/receipts.md, every window ending in the month), and each receipt's flat lines as the
store writes them at issue (``ledger.receipt_lines.lines_of``; built here in bulk with raw ``executemany``, as
the entries are, so a million receipts take minutes rather than the hours of issuing one by one). The
subject is `ipledger export monthly --month M --format csv` in a fresh interpreter (read the month's lines,
pick what the month bills, aggregate, write). The floor is
DuckDB grouping the same receipts' rows (one per receipt: tenant, partition, qos, currency and the hour and
money columns) by tenant, partition, qos and currency from a Parquet file.
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
_IMPORTS = ("import ledger.cli.main, ledger.cli.context, reports.export, reports.issued_lines, reports.csvwrite, "
            "duckdb, pyarrow.compute, adbc_driver_sqlite.dbapi")
HOUR_KEYS = ("paid", "delivered", "underutilized", "starved", "idle_held", "unknown", "suspended")


def build_ledger(db_path: Path, n: int) -> tuple[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.ship_sqlite import _fresh_db
    from ledger import receipt_lines
    from ledger.canonical import ts_to_epoch
    from ledger.entries import GENESIS_HASH, Kind, chain_hash, make_entry
    from ledger.store import ENTRY_COLUMNS
    from reports import synthetic

    url = _fresh_db(db_path)
    con = sqlite3.connect(db_path, isolation_level=None)
    con.execute("PRAGMA synchronous=OFF")
    sql = f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({','.join('?' * len(ENTRY_COLUMNS))})"
    seq, prev = 0, GENESIS_HASH
    cols: dict[str, list] = {k: [] for k in ("tenant", "partition", "qos", "currency", *HOUR_KEYS,
                                              "cost_paid", "cost_delivered", "cost_lost")}
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
            cols["tenant"].append(j["account"])
            cols["partition"].append(j["partition"])
            cols["qos"].append(j["qos"])
            cols["currency"].append(r["cost"]["currency"])
            for k in HOUR_KEYS:
                cols[k].append(float(r["gpu_hours"][k]))
            cols["cost_paid"].append(float(r["cost"]["paid"]))
            cols["cost_delivered"].append(float(r["cost"]["delivered"]))
            cols["cost_lost"].append(float(r["cost"]["lost"]))
        con.execute("BEGIN")
        con.executemany(sql, rows)
        con.executemany(receipt_lines.insert_sql(), lines)
        con.execute("COMMIT")
    con.close()
    parquet = db_path.with_suffix(".parquet")
    pq.write_table(pa.table(cols), parquet)
    return url, parquet


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    try:
        import reports.monthly  # noqa: F401
        from reports import synthetic  # noqa: F401
    except ImportError as exc:
        raise FeatureMissing(TITLE, f"reports.monthly not importable: {exc}") from None
    n = max(1000, int(FULL_RECEIPTS * scale))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-export-"))
    try:
        built = time.perf_counter()
        url, parquet = build_ledger(work / "ledger.db", n)
        built = time.perf_counter() - built
        sums = ", ".join(f"sum({c})" for c in (*HOUR_KEYS, "cost_paid", "cost_delivered", "cost_lost"))
        q = (f"SELECT tenant, partition, qos, currency, count(*), {sums} FROM read_parquet('{parquet}') "
             f"GROUP BY ALL ORDER BY ALL")
        out: dict = {}

        def floor() -> None:
            con = duckdb.connect()
            out["floor"] = con.execute(q).fetchall()
            con.close()

        csv_path = work / "statement.csv"

        peaks: list[float] = []

        def subject() -> None:
            out["proc"], peak = run_cli_measured(["--db", url, "export", "monthly", "--month", MONTH, "--format",
                                                  "csv", "--out", str(csv_path), "--quiet"])
            if out["proc"].returncode != 0:
                raise RuntimeError(f"export failed: {out['proc'].stderr.strip()[-500:]}")
            peaks.append(peak)

        def start_only() -> None:
            # what any export pays before reading a row: a fresh interpreter importing the export's modules
            subprocess.run([PY, "-c", _IMPORTS], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})

        floor_t, subj_t, start_t = timeit_interleaved(
            [(f"DuckDB GROUP BY over the {n:,} receipt rows (Parquet)", floor, None),
             ("`ipledger export monthly --format csv`", subject, None), ("imports", start_only, None)], repeat)
        runs = sum(r[4] for r in out["floor"])
        if runs != n or not csv_path.exists():
            raise RuntimeError("export or floor did not cover every receipt")
        return Figure(key="export", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,),
                      scale_note=f"{n:,} issued receipts (scale {scale:g} of {FULL_RECEIPTS:,}); SQLite ledger "
                                 f"of {(work / 'ledger.db').stat().st_size / 2**20:,.0f} MiB",
                      extra={"peak memory of the export (max over runs)": f"{max(peaks):,.0f} MiB",
                             "a fresh interpreter importing the export's modules, no work (median)":
                                 f"{start_t.median:.3f} s = {start_t.median / floor_t.median:.2f}× the floor; the "
                                 f"export net of it: {(subj_t.median - start_t.median) / floor_t.median:.2f}×",
                             "ledger generated in (not timed against the floor)": f"{built:,.0f} s"})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.02, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
