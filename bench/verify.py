"""Figure: `ipledger verify` over N entries, against hashlib over the same canonical bytes in one loop.

Verification must recompute, for every entry, its id (sha256 over the identity encoding) and its chain hash
(sha256 over the chain encoding); the floor hashes exactly those bytes, already in memory, in one tight
loop. The subject is the real command in a fresh interpreter on a SQLite ledger holding the rows.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import tempfile
import time
from itertools import islice
from pathlib import Path

from bench import data
from bench.common import Figure, Timing, main_for, run_cli, timeit
from bench.ship_sqlite import _fresh_db
from ledger.canonical import canonical_json
from ledger.entries import HASH_DOMAIN, ID_DOMAIN
from ledger.store import ENTRY_COLUMNS

TITLE = "Verify"
FULL_ENTRIES = 10_000_000
CHUNK = 100_000


def _canonical_bytes(row: tuple) -> tuple[bytes, bytes]:
    seq, eid, kind, ts, ts_end, rec, cluster, job, run, node, device, payload, source, sv, prev, _h = row
    ident = canonical_json([ID_DOMAIN, kind, ts, ts_end, cluster, job, run, node, device, payload, source])
    chain = canonical_json([HASH_DOMAIN, seq, eid, kind, ts, ts_end, rec, cluster, job, run, node, device,
                            payload, source, sv, prev])
    return ident.encode("utf-8"), chain.encode("utf-8")


def run(scale: float, repeat: int) -> Figure:
    n = max(1000, int(FULL_ENTRIES * scale))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-verify-"))
    try:
        db_path = work / "ledger.db"
        url = _fresh_db(db_path)
        con = sqlite3.connect(db_path, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")
        sql = (f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({','.join('?' * len(ENTRY_COLUMNS))})")
        floor_runs = [0.0] * repeat
        rows_iter = data.chained_rows(n)
        total = 0
        while True:
            chunk = list(islice(rows_iter, CHUNK))
            if not chunk:
                break
            total += len(chunk)
            con.execute("BEGIN")
            con.executemany(sql, chunk)
            con.execute("COMMIT")
            blobs = [b for row in chunk for b in _canonical_bytes(row)]
            del chunk
            for i in range(repeat):  # the floor, chunk by chunk so 10M entries never sit in memory at once
                sha = hashlib.sha256
                t0 = time.perf_counter()
                for b in blobs:
                    sha(b).hexdigest()
                floor_runs[i] += time.perf_counter() - t0
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        floor_t = Timing(f"hashlib.sha256 over the {2 * total:,} canonical encodings, one loop", tuple(floor_runs))
        out: dict = {}

        def subject() -> None:
            out["proc"] = run_cli(["--db", url, "verify", "--json"])

        subj_t = timeit(subject, repeat, label=f"`ipledger verify` ({total:,} entries, SQLite)")
        if f'"entries": {total}' not in out["proc"].stdout or '"ok": true' not in out["proc"].stdout:
            raise RuntimeError(f"verify did not report {total} good entries: {out['proc'].stdout[:300]}")
        return Figure(key="verify", title=TITLE, target=2.0, floor=floor_t, subjects=(subj_t,),
                      scale_note=f"{total:,} entries (scale {scale:g} of {FULL_ENTRIES:,}); SQLite ledger "
                                 f"of {db_path.stat().st_size / 2**20:,.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.02, argv=argv)


if __name__ == "__main__":
    main()
