"""Figure: proof bundle of a 1,024-GPU receipt, and the Merkle tree's upkeep while shipping.

Two measurements, one figure:

1. **Proof generation.** The 1,024-GPU run of bench/receipt.py (same ledger builder, a shorter window so the
   bundle, which carries every sample row as JSON, stays a file one can mail), a signed checkpoint, then
   ``ipledger receipt JOB --proof --head H --out B`` against its floor, ``ipledger receipt JOB --format json``
   of the same run (the receipt the bundle proves). The tenant's side, ``proofcheck.py B --pubkey K`` in a
   fresh interpreter, is timed beside it.
2. **Tree upkeep.** ``ipledger ship`` of the ship_sqlite spool against its floor (raw ``executemany`` of the
   same rows), with the time spent inside the tree's append hook measured in that very process (a timer
   around ``ledger.chain.merkle.on_append``), so the tree's share is measured, not inferred from two noisy runs.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench import data
from bench.common import PY, ROOT, Figure, Timing, main_for, restore_spool, run_cli, run_cli_timed, timeit_interleaved

TITLE = "Proof bundles and the Merkle tree"
FULL_GPUS = 1024
BUNDLE_HOURS = 1.0
SHIP_FULL_ENTRIES = 1_000_000
def _proof_part(work: Path, gpus: int, repeat: int) -> tuple[Timing, Timing, Timing, dict]:
    from bench.receipt import build_ledger
    from ledger.chain import heads

    url, rows, _parquet = build_ledger(work / "ledger.db", gpus, BUNDLE_HOURS)
    key = work / "site.key"
    heads.keygen(key)
    head = work / "head.json"
    run_cli(["--db", url, "checkpoint", "--key", str(key), "--out", str(head)])
    bundle = work / "bundle.json"
    out: dict = {}

    def receipt() -> None:
        out["receipt"] = json.loads(run_cli(["--db", url, "receipt", "990001", "--format", "json"]).stdout)

    def proof() -> None:
        run_cli(["--db", url, "receipt", "990001", "--proof", "--head", str(head), "--out", str(bundle)])

    def check() -> None:
        proc = subprocess.run([PY, "-I", str(ROOT / "ledger" / "proofcheck.py"), str(bundle), "--pubkey",
                               f"{key}.pub"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"proofcheck.py failed: {proc.stderr.strip()[-300:]}")
        out["verified"] = proc.stdout.strip()

    floor_t, proof_t, check_t = timeit_interleaved([
        (f"`ipledger receipt JOB --format json` ({gpus:,} GPUs, {rows:,} samples)", receipt, None),
        ("`ipledger receipt JOB --proof --head H --out B` (the bundle)", proof, None),
        ("`python -I proofcheck.py B --pubkey K` (the tenant's check, stdlib + cryptography)", check, None)],
        repeat)
    if out["verified"] != out["receipt"]["receipt_hash"]:
        raise RuntimeError(f"proofcheck printed {out['verified']}, the receipt is {out['receipt']['receipt_hash']}")
    doc = json.loads(bundle.read_text())
    info = {"bundle": f"{bundle.stat().st_size / 2**20:,.1f} MiB: {len(doc['entries']):,} entries with inclusion "
                      f"proofs, {len(doc['samples']):,} segments, {rows:,} sample rows",
            "samples": rows}
    return floor_t, proof_t, check_t, info


def _ship_part(work: Path, scale: float, repeat: int) -> tuple[Timing, Timing, Timing, int]:
    from bench.ship_sqlite import fresh_db, raw_insert

    n = max(100, int(SHIP_FULL_ENTRIES * scale))
    pristine = work / "spool-pristine"
    files = data.write_spool(pristine, n)
    rows = list(data.chained_rows(n))
    db_path, spool_dir = work / "ship.db", work / "spool"
    state: dict = {}

    def setup() -> None:
        state["url"] = fresh_db(db_path)
        restore_spool(pristine, spool_dir)

    def floor() -> None:
        raw_insert(db_path, rows)

    tree_s: list[float] = []
    spent = work / "tree-seconds"

    def ship() -> None:
        args = ["--db", state["url"], "ship", "--spool", str(spool_dir), "--quiet", "--no-receipts"]
        proc, took = run_cli_timed(args, {"tree": ("ledger.chain.merkle:on_append",)}, spent)
        if proc.returncode != 0:
            raise RuntimeError(f"ship failed: {proc.stderr.strip()[-300:]}")
        tree_s.append(took.get("tree", 0.0))

    floor_t, ship_t = timeit_interleaved([
        (f"raw sqlite3.executemany, {n:,} rows, one tx", floor, setup),
        (f"`ipledger ship` ({files:,} spool files), the tree kept on every append", ship, setup)], repeat)
    from ledger.chain import db as db_mod
    from ledger.chain import merkle

    engine = db_mod.make_engine(state["url"])
    try:
        size, _root = merkle.current_root(engine)
    finally:
        engine.dispose()
    if size != n:
        raise RuntimeError(f"the shipped ledger's tree covers {size} entries, expected {n}")
    return floor_t, ship_t, Timing("time inside the tree's append hook", tuple(tree_s)), n


def run(scale: float, repeat: int) -> Figure:
    gpus = max(8, int(FULL_GPUS * min(1.0, scale * 20)))  # the default scale (0.05) is the full 1,024 GPUs
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-proofs-"))
    try:
        floor_t, proof_t, check_t, info = _proof_part(work, gpus, repeat)
        sfloor, ship_t, tree_t, n = _ship_part(work, scale, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [s / f for s, f in zip(ship_t.runs, sfloor.runs)]
    shares = [t / s for t, s in zip(tree_t.runs, ship_t.runs)]
    without = [(s - t) / f for s, t, f in zip(ship_t.runs, tree_t.runs, sfloor.runs)]
    return Figure(
        key="proofs", title=TITLE, target=float("inf"), floor=floor_t, subjects=(proof_t, check_t),
        scale_note=f"{gpus:,} GPUs × {BUNDLE_HOURS:g} h at 10 s for the bundle; {n:,} entries shipped "
                   f"(scale {scale:g})",
        extra={"bundle": info["bundle"],
               "ship, floor (raw executemany, same rows)": f"median {sfloor.median:.3f} s ({len(sfloor.runs)} runs)",
               "`ipledger ship`, tree kept": f"median {ship_t.median:.3f} s = {statistics.median(ratios):.2f}× "
                                             f"the floor (median of per-round ratios)",
               "of which inside the tree's hook": f"median {tree_t.median:.3f} s = "
                                                  f"{statistics.median(shares) * 100:.1f} % of the shipment "
                                                  f"(per round: {', '.join(f'{x * 100:.1f}' for x in shares)} %); "
                                                  f"the same shipment without it: "
                                                  f"{statistics.median(without):.2f}× the floor"},
        notes=("The bundle's time is dominated by reading every sample row of the run's segments out of their "
               "columnar blocks and writing them as JSON: the tenant recomputes the receipt from the rows, so "
               "the rows travel. The tree's upkeep is one SHA-256 per entry (its leaf) and about one per entry "
               "for the subtrees it completes; one row per 8 entries is written.",))


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.05, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
