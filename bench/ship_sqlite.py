"""Figure: `ipledger ship` of N spooled entries into SQLite, against raw sqlite3.executemany of the same rows.

The floor inserts the very rows the ledger ends up holding (sequence numbers and hashes precomputed) into the
same schema (same indexes, same triggers, WAL, synchronous=FULL) in one transaction. The subject is the real
command in a fresh interpreter: read the spool files, rebuild and re-identify every entry, dedup against the
ledger, chain, insert, move the files aside.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from bench import data
from bench.common import Figure, main_for, restore_spool, run_cli, timeit_interleaved
from ledger.chain import db as db_mod
from ledger.ingest import ship as ship_mod
from ledger.chain.store import ENTRY_COLUMNS

TITLE = "Ship into SQLite"
FULL_ENTRIES = 1_000_000


def fresh_db(path: Path) -> str:
    if path.exists():
        path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    return url


def raw_insert(db_path: Path, rows: list[tuple], cache_kib: int | None = None) -> None:
    """The floor: the very rows the ledger ends up holding, by sqlite3.executemany in one transaction."""
    con = sqlite3.connect(db_path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    if cache_kib is not None:
        con.execute(f"PRAGMA cache_size={cache_kib}")
    con.execute("BEGIN IMMEDIATE")
    con.executemany(f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES "
                    f"({','.join('?' * len(ENTRY_COLUMNS))})", rows)
    con.execute("COMMIT")
    con.close()


def run(scale: float, repeat: int) -> Figure:
    n = max(100, int(FULL_ENTRIES * scale))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-ship-"))
    try:
        pristine = work / "spool-pristine"
        files = data.write_spool(pristine, n)
        rows = list(data.chained_rows(n))
        db_path = work / "ledger.db"
        spool_dir = work / "spool"
        state: dict = {}

        def setup_floor() -> None:
            state["url"] = fresh_db(db_path)

        def floor(cache_kib: int | None = None) -> None:
            raw_insert(db_path, rows, cache_kib)

        def setup_subject() -> None:
            state["url"] = fresh_db(db_path)
            restore_spool(pristine, spool_dir)

        def subject() -> None:
            run_cli(["--db", state["url"], "ship", "--spool", str(spool_dir), "--quiet", "--no-receipts"])

        cache = ship_mod.SQLITE_CACHE_KIB
        floor_t, cached_t, subj_t = timeit_interleaved(  # the subject last: its ledger is checked below
            [(f"raw sqlite3.executemany, {len(rows):,} rows, one tx", floor, setup_floor),
             ("the same executemany with the shipper's page cache", lambda: floor(cache), setup_floor),
             (f"`ipledger ship` ({files:,} spool files)", subject, setup_subject)], repeat)
        con = sqlite3.connect(db_path)
        got = con.execute("SELECT COUNT(*), MAX(seq) FROM entries").fetchone()
        con.close()
        if got != (len(rows), len(rows)):
            raise RuntimeError(f"ship left {got} rows, expected {len(rows)}")
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
        extra = {f"raw executemany with the shipper's page cache (PRAGMA cache_size={cache}), median":
                 f"{cached_t.median:.2f} s; `ipledger ship` is {subj_t.median / cached_t.median:.2f}× that "
                 f"(the floor above keeps SQLite's default 2 MiB cache)"}
        return Figure(key="ship_sqlite", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,), extra=extra,
                      scale_note=f"{len(rows):,} entries in {files:,} spool files (one per job run, 8 GPUs); "
                                 f"scale {scale:g} of {FULL_ENTRIES:,}; load average at the end {load}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.1, argv=argv)


if __name__ == "__main__":
    main()
