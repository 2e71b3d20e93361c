"""Figure: `ipledger ship` of N spooled entries into PostgreSQL, against a raw psycopg COPY of the same rows.

The floor COPYs the very rows the ledger ends up holding (sequence numbers and hashes precomputed) into the
same schema (indexes, unique constraint, append-only triggers) in one transaction on a fresh database. The
subject is the real command in a fresh interpreter against another fresh database of the same server.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench import data, pg
from bench.common import Figure, main_for, restore_spool, run_cli, timeit_interleaved
from ledger.chain.store import ENTRY_COLUMNS

TITLE = "Ship into PostgreSQL"
FULL_ENTRIES = 1_000_000


def run(scale: float, repeat: int) -> Figure:
    import psycopg

    n = max(100, int(FULL_ENTRIES * scale))
    pg.server(TITLE)
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-shippg-"))
    try:
        pristine = work / "spool-pristine"
        files = data.write_spool(pristine, n)
        rows = list(data.chained_rows(n))
        spool_dir = work / "spool"
        state: dict = {}

        def setup_floor() -> None:
            state["url"] = pg.fresh_ledger(TITLE, "floor")

        def floor() -> None:
            with psycopg.connect(pg.conninfo(state["url"])) as conn:
                with conn.cursor() as cur:
                    with cur.copy(f"COPY entries ({', '.join(ENTRY_COLUMNS)}) FROM STDIN") as copy:
                        for row in rows:
                            copy.write_row(row)
                conn.commit()

        def setup_subject() -> None:
            state["url"] = pg.fresh_ledger(TITLE, "ship")
            restore_spool(pristine, spool_dir)

        def subject() -> None:
            run_cli(["--db", state["url"], "ship", "--spool", str(spool_dir), "--quiet", "--no-receipts"])

        floor_t, subj_t = timeit_interleaved([(f"raw psycopg COPY, {len(rows):,} rows, one tx", floor, setup_floor),
                                              (f"`ipledger ship` ({files:,} spool files)", subject, setup_subject)], repeat)
        with psycopg.connect(pg.conninfo(state["url"])) as conn:
            got = conn.execute("SELECT COUNT(*), MAX(seq) FROM entries").fetchone()
        if tuple(got) != (len(rows), len(rows)):
            raise RuntimeError(f"ship left {got} rows, expected {len(rows)}")
        return Figure(key="ship_postgres", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,),
                      scale_note=f"{len(rows):,} entries in {files:,} spool files (one per job run, 8 GPUs); "
                                 f"scale {scale:g} of {FULL_ENTRIES:,}; server on 127.0.0.1, fsync=off "
                                 f"(the test server's settings)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.1, argv=argv)


if __name__ == "__main__":
    main()
