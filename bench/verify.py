"""Figure: `ipledger verify` over N entries, against hashlib over every byte it must hash, in one loop.

The floor is the hashing the checks require, over bytes already in memory: for every entry its id (sha256
over the identity encoding) and its chain hash (sha256 over the chain encoding), and for the Merkle tree
(ledger/chain/merkle.py, RFC 9162) every leaf hash (sha256 of 0x00 and the chain encoding) and every internal
node hash (sha256 of 0x01 and its two children) — n leaves and n - 1 nodes. The floor's root is checked
against the root of the ledger's stored tree (merkle.root_at), and its first rows' encodings against
``row_encodings`` (ledger.chain.entries), so it hashes exactly what the reference defines. The subject is the real
command in a fresh interpreter on a SQLite ledger holding the rows.

Until 2026-12-01 the floor was only the two hashes per entry the chain needs, while ``verify`` also checked
the tree; that floor is still measured in the same run and its ratio reported beside (``extra``), so the
figure stays comparable with the earlier ones.

Building a 10,000,000-entry ledger takes longer than verifying it many times over (16 minutes in bulk, see
build_ledger), so the ledger may be kept:
``IPLEDGER_BENCH_VERIFY_LEDGER=/big/disk/verify.db`` builds it there once and reuses it while it holds
the rows that build recorded (scale, count and head hash, in ``verify.db.built``). The floor is measured
in every run, on bytes read back from that ledger (untimed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
import time
from itertools import islice
from pathlib import Path

from bench import data
from bench.common import Figure, Timing, main_for, run_cli, timeit
from bench.ship_sqlite import fresh_db
from ledger.chain import db as db_mod
from ledger.chain import merkle
from ledger.chain.entries import SQLITE_CHAIN, SQLITE_IDENTITY, chain_encoding, row_encodings
from ledger.chain.store import ENTRY_COLUMNS

TITLE = "Verify"
FULL_ENTRIES = 10_000_000
CHUNK = 100_000
FLOOR_CHUNK = 1 << 16  # a power of two: every chunk but the last is a perfect subtree of the Merkle tree
KEEP_ENV = "IPLEDGER_BENCH_VERIFY_LEDGER"

_ENCODINGS_SQL = f"SELECT {SQLITE_IDENTITY}, {SQLITE_CHAIN} FROM entries WHERE seq > ? AND seq <= ? ORDER BY seq"
BUILD_CACHE_KIB = 2 * 2**20  # the build's page cache: the entry_id index takes inserts at random places


def _kept(db_path: Path, sidecar: Path, n: int) -> int | None:
    """The row count of a kept ledger still holding what its build recorded (scale, count, head hash)."""
    if not (db_path.exists() and sidecar.exists()):
        return None
    want_n, rows, head = sidecar.read_text().split()
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        got = con.execute("SELECT COUNT(*), MAX(seq) FROM entries").fetchone()
        last = con.execute("SELECT hash FROM entries WHERE seq = ?", (got[1],)).fetchone()
    except sqlite3.Error:
        got, last = (0, 0), None
    finally:
        con.close()
    if int(want_n) == n and got == (int(rows), int(rows)) and last and last[0] == head:
        return int(rows)
    return None


def build_ledger(db_path: Path, n: int) -> tuple[str, int]:
    """A SQLite ledger holding the generator's rows for ``n`` entries and their Merkle tree; (url, rows).

    The rows are the ones shipping the generated spool would chain (bench.data.chained_rows), bulk-inserted
    100,000 to a transaction with the tree extended by the library's own merkle.extend over each row's chain
    encoding, as the append path does. Durability is off for the build only (no journal, no fsync): a
    crash leaves no sidecar, and the next run builds again. A kept ledger is reused when its sidecar
    (written once the build finished) names the same ``n`` and its rows still end at the head hash
    recorded then."""
    sidecar = Path(str(db_path) + ".built")
    kept = _kept(db_path, sidecar, n)
    if kept is not None:
        url = f"sqlite:///{db_path}"
        eng = db_mod.make_engine(url)  # a kept ledger follows the schema's later revisions (new tables)
        db_mod.upgrade(eng)
        eng.dispose()
        return url, kept
    sidecar.unlink(missing_ok=True)
    url = fresh_db(db_path)
    sql = f"INSERT INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES ({','.join('?' * len(ENTRY_COLUMNS))})"
    rows_iter = data.chained_rows(n)
    total, head = 0, ""
    eng = db_mod.make_engine(url)
    with eng.connect() as conn:
        raw = conn.connection.driver_connection  # outside SQLAlchemy's transaction: the journal mode can change
        for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{BUILD_CACHE_KIB}"):
            raw.execute(f"PRAGMA {pragma}")
        while chunk := list(islice(rows_iter, CHUNK)):
            with conn.begin():
                conn.exec_driver_sql(sql, chunk)
                merkle.extend(conn, total, [chain_encoding(row).encode("utf-8") for row in chunk])
            total += len(chunk)
            head = chunk[-1][-1]
        raw.execute("PRAGMA journal_mode=WAL")
    eng.dispose()
    sidecar.write_text(f"{n} {total} {head}\n")
    return url, total


def _tree_level(level: list[bytes]) -> list[bytes]:
    """One level of RFC 9162's tree up: pairs hashed as ledger.proofcheck.node_hash does, an odd last node
    carried up unhashed (pairing level by level from the left builds the RFC's tree: it splits at powers of two)."""
    node0 = hashlib.sha256(b"\x01")
    up = []
    for i in range(0, len(level) - 1, 2):
        h = node0.copy()
        h.update(level[i])
        h.update(level[i + 1])
        up.append(h.digest())
    if len(level) & 1:
        up.append(level[-1])
    return up


def _floor_root(leaves: list[bytes]) -> bytes:
    while len(leaves) > 1:
        leaves = _tree_level(leaves)
    return leaves[0]


def time_floor(db_path: Path, total: int, repeat: int) -> tuple[Timing, Timing]:
    """(full floor, two-hash floor), timed chunk by chunk (10M entries never sit in memory).

    Full: hashlib.sha256 over every row's two encodings, its Merkle leaf and the tree's internal nodes;
    two-hash: the encodings only (the floor before the tree check). Each repeat times both, on the same bytes."""
    full, two = [0.0] * repeat, [0.0] * repeat
    roots: list[bytes] = []
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        cols = ", ".join(ENTRY_COLUMNS)
        first = con.execute(f"SELECT {cols} FROM entries WHERE seq <= ? ORDER BY seq", (FLOOR_CHUNK,)).fetchall()
        reference = [tuple(s.encode("utf-8") for s in row_encodings(row)) for row in first]
        sha = hashlib.sha256
        leaf0 = sha(b"\x00")
        for lo in range(0, total, FLOOR_CHUNK):
            pairs = con.execute(_ENCODINGS_SQL, (lo, lo + FLOOR_CHUNK)).fetchall()
            if lo == 0 and pairs != reference:
                raise RuntimeError("SQLite json_array encodings differ from row_encodings: the floor would lie")
            blobs = [b for pair in pairs for b in pair]
            for i in range(repeat):
                t0 = time.perf_counter()
                for b in blobs:
                    sha(b).hexdigest()
                two[i] += time.perf_counter() - t0
                t0 = time.perf_counter()
                leaves = []
                for ident, chain in pairs:
                    sha(ident).hexdigest()
                    sha(chain).hexdigest()
                    h = leaf0.copy()
                    h.update(chain)
                    leaves.append(h.digest())
                root = _floor_root(leaves)
                full[i] += time.perf_counter() - t0
            roots.append(root)
        t0 = time.perf_counter()
        root = _floor_root(roots)  # the chunks' roots up to the tree's: the last ≈ n / 65,536 nodes
        top = time.perf_counter() - t0
        full = [t + top for t in full]
    finally:
        con.close()
    eng = db_mod.make_engine(f"sqlite:///{db_path}")
    try:
        with eng.connect() as conn:
            if merkle.root_at(conn, total) != root:
                raise RuntimeError("the floor's Merkle root differs from the ledger's stored tree: the floor would lie")
    finally:
        eng.dispose()
    return (Timing(f"hashlib.sha256 over every byte verify hashes: the {2 * total:,} canonical encodings, "
                   f"{total:,} Merkle leaves and {total - 1:,} nodes, one loop", tuple(full)),
            Timing(f"two-hash floor: the {2 * total:,} canonical encodings only", tuple(two)))


def run(scale: float, repeat: int) -> Figure:
    n = max(1000, int(FULL_ENTRIES * scale))
    kept = os.environ.get(KEEP_ENV)
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-verify-"))
    try:
        db_path = Path(kept) if kept else work / "ledger.db"
        url, total = build_ledger(db_path, n)
        floor_t, two_t = time_floor(db_path, total, repeat)
        out: dict = {}

        def subject() -> None:
            out["proc"] = run_cli(["--db", url, "verify", "--json"])

        subj_t = timeit(subject, repeat, label=f"`ipledger verify` ({total:,} entries, SQLite)")
        if f'"entries": {total}' not in out["proc"].stdout or '"ok": true' not in out["proc"].stdout:
            raise RuntimeError(f"verify did not report {total} good entries: {out['proc'].stdout[:300]}")
        load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
        two_note = (f"{two_t.median:.4f} s median, {min(two_t.runs):.4f} s min; `ipledger verify` "
                    f"{subj_t.median / two_t.median:.2f}× it (medians), {min(subj_t.runs) / min(two_t.runs):.2f}× "
                    f"(minimums)")
        return Figure(key="verify", title=TITLE, target=2.0, floor=floor_t, subjects=(subj_t,),
                      extra={"the earlier two-hash floor (identity and chain encodings only, no tree), same run":
                             two_note},
                      scale_note=f"{total:,} entries (scale {scale:g} of {FULL_ENTRIES:,}); SQLite ledger "
                                 f"of {db_path.stat().st_size / 2**20:,.0f} MiB"
                                 + (f"; load average at the end {' '.join(load)}" if load else ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.02, argv=argv)


if __name__ == "__main__":
    main()
