"""Figure: `ipledger ship` of node collectors' spool (sealed sample segments) into SQLite, device-hours included.

The spool is what ``ipledger collect`` leaves on a fleet's nodes, made by the collector's own code: for each
node and batch, ``dcgmi dmon`` output in its real layout (a deterministic stand-in for the tool: 16 fields of
8 GPUs, one tick a second, 60 ticks a batch) is parsed by ``importers.dmon.parse`` and turned into spool
records by ``collector.batch_records`` (one ``telemetry_segment`` per GPU with its rows in ``samples``, owned
by the job whose ``device_bound`` the node's hooks spooled), one spool file per batch. Full scale is one hour
of 36 nodes × 8 GPUs (288 GPUs at 1 s: 1,036,800 samples in 17,280 segments of 60, 2,160 files): an hour of
a mid-size fleet, and the hour that one shipper drains when it runs hourly. Smaller scales keep the 60-sample
segments and cut batches.

The subject is the real command in a fresh interpreter into a fresh SQLite ledger: read and check every
record (each segment's rows against its digest), append and chain the entries, store each segment's rows as
one columnar block and its device-hours (``telemetry.hours``: what the agents read, computed at seal time).
The floor is a bulk append of the same data by ``sqlite3.executemany`` in one transaction (WAL,
synchronous=FULL): the ledger's entries, and one row per sample the collector produced into a plain table of
the sample columns. Beside it: the floor that inserts the very rows the ledger ends up holding (entries,
sample_blocks, device_hours, read back from a shipped ledger), and the device-hours' share of the shipment,
timed inside the shipping process (timers around ``telemetry.hours.segments_hours``, the aggregation, and
``telemetry.hours.insert_in``, their insert).
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import statistics
import tempfile
from pathlib import Path

from bench.common import Figure, Timing, main_for, restore_spool, run_cli, run_cli_timed, timeit_interleaved
from bench.ship_sqlite import fresh_db

TITLE = "Ship collector segments into SQLite"
FULL_NODES = 36
GPUS = 8
TICKS = 60                  # samples per segment: the collector's default batch (count=60, interval=1 s)
FULL_BATCHES = 60           # per node: one hour
HOUR0 = 1_779_998_400       # 2026-05-28 20:00 UTC, an hour boundary
SKU = "NVIDIA H100 80GB HBM3"
# dmon columns the collector asks for (ledger.importers.dcgm_fields.COLLECT_FIELD_IDS), by their dmon names
DMON_COLUMNS = ("GRACT", "SMACT", "SMOCC", "TENSO", "DRAMA", "GPUTL", "MCUTL", "SMCLK", "MMCLK", "DVCCTR", "POWER",
                "TMPTR", "MMTMP", "TOTEC", "FBUSD", "XIDER")

# the device-hours' seal-time aggregation and insert, timed inside the shipping process
DEVICE_HOURS_TIMERS = {"hours": ("ledger.telemetry.hours:segments_hours", "ledger.telemetry.hours:insert_in")}


def plan(scale: float) -> tuple[int, int]:
    """(nodes, batches per node) for a scale: the fleet first shrinks in batches, then in nodes."""
    total = max(2, round(FULL_NODES * FULL_BATCHES * scale))
    nodes = min(FULL_NODES, total)
    return nodes, max(1, round(total / nodes))


def dmon_batch(rng: random.Random, node: int, batch: int, energy: list[float], with_energy: bool = True) -> str:
    """One ``dcgmi dmon -e ... -d 1000 -c 60`` output of 8 GPUs: header, units line, a tick per second, the
    header repeated every 14 ticks as dmon does. ``energy`` (mJ, per GPU) carries the counter across batches;
    without ``with_energy`` the energy counter's column (TOTEC, field 156) is not asked for (the same other
    values: the same random draws)."""
    columns = DMON_COLUMNS if with_energy else tuple(c for c in DMON_COLUMNS if c != "TOTEC")
    head = "#Entity    " + "".join(f"{c:<13}" for c in columns)
    lines = []
    for k in range(TICKS):
        if k % 14 == 0:
            lines += [head, "ID"]
        for g in range(GPUS):
            load = ((node * 7 + g * 3 + batch) % 10) / 10        # each GPU's own workload level
            act = min(1.0, max(0.0, load + rng.uniform(-0.05, 0.05)))
            capped = load > 0.8 and rng.random() < 0.2
            power = 90 + 600 * act + rng.uniform(-10, 10)
            energy[g] += power * 1000
            vals = (f"{act:.3f}", f"{act * 0.98:.3f}", f"{act * 0.6:.3f}", f"{act * 0.4:.3f}", f"{act * 0.5:.3f}",
                    str(round(act * 100)), str(round(act * 40)), str(1755 if capped else 1980), "2619",
                    "4" if capped else "0", f"{power:.3f}", str(round(35 + act * 40)),
                    "N/A" if g == 7 else str(round(40 + act * 35)), str(round(energy[g])),
                    str(round(1024 + act * 70000)) if act > 0.05 else "0", "0")
            if not with_energy:
                vals = vals[:DMON_COLUMNS.index("TOTEC")] + vals[DMON_COLUMNS.index("TOTEC") + 1:]
            lines.append(f"GPU {g:<6} " + "".join(f"{v:<13}" for v in vals))
    return "\n".join(lines) + "\n"


def _uuid(node: int, g: int) -> str:
    return f"GPU-{node:08x}-{g:04x}-4a1b-9c2d-{node * GPUS + g:012x}"


def hook_records(node: int) -> list[dict]:
    """What the node's prolog spooled: one job holding its 8 GPUs for the hour (the segments' owner)."""
    from ledger.chain.entries import Kind, make_entry

    key = dict(cluster="hpc1", job_id=str(2_000_000 + node), run=0, node=f"gpu-node-{node:04d}",
               source="slurm-prolog", source_version="1")
    recs = [make_entry(Kind.ALLOCATION_STARTED, HOUR0 - 600, {"account": f"acct{node % 7}", "gpus": GPUS,
                                                              "partition": "gpu"}, **key).to_record()]
    for g in range(GPUS):
        recs.append(make_entry(Kind.DEVICE_BOUND, HOUR0 - 600, {"index": g, "uuid": _uuid(node, g), "sku": SKU,
                                                                "node": key["node"]},
                               device=_uuid(node, g), **key).to_record())
    return recs


def _write(directory: Path, name: str, records: list[dict]) -> None:
    # the spool's encoding (spool.write_records) without its fsyncs: durability is not what is timed
    data = "".join(json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n" for r in records)
    (directory / f"{name}.jsonl").write_text(data, encoding="utf-8")


def write_spool(directory: Path, nodes: int, batches: int, seed: int = 21, with_energy: bool = True) -> dict:
    """The fleet's spool: per node its hooks' file, then one collector file per batch. Returns the counts."""
    from ledger.capture import collector
    from ledger.importers import dmon

    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    rng = random.Random(seed)
    counts = {"files": 0, "records": 0, "segments": 0, "samples": 0}
    for node in range(nodes):
        hooks = hook_records(node)
        scratch = directory.parent / f"{directory.name}-hooks"   # the node's own spool: its hooks' file only
        scratch.mkdir(exist_ok=True)
        _write(scratch, f"hook-{node:04d}", hooks)
        own = collector.owners(str(scratch), f"gpu-node-{node:04d}")
        (scratch / f"hook-{node:04d}.jsonl").rename(directory / f"hook-{node:04d}.jsonl")
        counts["files"] += 1
        counts["records"] += len(hooks)
        energy = [1e9 * (1 + g) for g in range(GPUS)]
        cfg = collector.CollectorConfig(spool=str(directory), node=f"gpu-node-{node:04d}", source="dcgmi",
                                        interval=1.0, count=TICKS, cluster="hpc1")
        for b in range(batches):
            start = float(HOUR0 + b * TICKS + node % 17)    # nodes' collectors do not start in step
            c = dmon.parse(dmon_batch(rng, node, b, energy, with_energy), "dcgmi dmon", start=start, interval=1.0,
                           node=cfg.node)
            records, n_samples, _gaps = collector.batch_records(c, cfg, own)
            _write(directory, f"collector-{b:06d}-{node:04d}", records)
            counts["files"] += 1
            counts["records"] += len(records)
            counts["segments"] += sum(1 for r in records if r["kind"] == "telemetry_segment")
            counts["samples"] += n_samples
    return counts


PLAIN_SAMPLES = "bench_samples"


def floor_insert(db_path: Path, tables: dict[str, tuple[tuple[str, ...], list[tuple]]]) -> None:
    """A bulk append by sqlite3.executemany: each table's rows, one transaction, WAL, synchronous=FULL."""
    con = sqlite3.connect(db_path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("BEGIN IMMEDIATE")
    for table, (columns, rows) in tables.items():
        con.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({','.join('?' * len(columns))})",
                        rows)
    con.execute("COMMIT")
    con.close()


def spool_sample_rows(directory: Path) -> list[tuple]:
    """Every sample row the collector spooled, with its segment's id (what a plain bulk append inserts)."""
    from ledger.chain.entries import entry_from_record

    out = []
    for p in sorted(directory.glob("collector-*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            rows = rec.pop("samples", None)
            if rows:
                sid = entry_from_record(rec).entry_id
                out.extend((sid, *r) for r in rows)
    return out


def ledger_rows(db_path: Path) -> dict[str, tuple[tuple[str, ...], list[tuple]]]:
    """The rows a shipment left in the tables it fills, read back (columns as stored)."""
    from ledger.chain.store import ENTRY_COLUMNS
    from ledger.telemetry import hours

    con = sqlite3.connect(db_path)
    try:
        out = {}
        for table, cols in (("entries", tuple(ENTRY_COLUMNS)),
                            ("sample_blocks", ("segment_id", "format", "rows", "sha256", "data")),
                            (hours.TABLE, ("segment_id", *hours.FIELDS))):
            out[table] = (cols, con.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY rowid").fetchall())
        return out
    finally:
        con.close()


def check_ledger(url: str, db_path: Path, counts: dict, entries: int) -> str:
    """The subject's ledger holds every entry, a block and device-hours for every segment, and verifies."""
    con = sqlite3.connect(db_path)
    try:
        got = {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
               for t in ("entries", "sample_blocks", "device_hours")}
        stored = con.execute("SELECT COALESCE(SUM(rows), 0) FROM sample_blocks").fetchone()[0]
        hour_n = con.execute("SELECT COALESCE(SUM(n), 0) FROM device_hours").fetchone()[0]
    finally:
        con.close()
    want = {"entries": entries, "sample_blocks": counts["segments"]}
    if any(got[k] != v for k, v in want.items()) or stored != counts["samples"] or hour_n != counts["samples"]:
        raise RuntimeError(f"ship left {got} ({stored} rows in blocks, {hour_n} in device-hours), expected {want} "
                           f"and {counts['samples']} samples")
    proc = run_cli(["--db", url, "verify", "--json"], check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"verify of the shipped ledger failed: {proc.stdout.strip()[-300:]}")
    return f"{got['entries']:,} entries, {got['sample_blocks']:,} blocks, {got['device_hours']:,} device-hours"


def _lens_note(off: Timing, on: Timing) -> str:
    """Method 1.1.0 against 1.0.0, same rounds: medians, the median of the rounds' ratios, the target."""
    extra = on.median / off.median - 1.0 if off.median > 0 else float("nan")
    pairs = statistics.median(b / a - 1.0 for a, b in zip(off.runs, on.runs) if a > 0)
    return (f"{extra * 100:+.1f} % ({on.median:.3f} s against {off.median:.3f} s, medians; median of the rounds' "
            f"ratios {pairs * 100:+.1f} %; target ≤ 10 %: {'met' if extra <= 0.10 else 'NOT met'})")


def run(scale: float, repeat: int) -> Figure:
    from ledger.chain.store import ENTRY_COLUMNS
    from ledger.telemetry.sealed import INSERT_COLUMNS

    nodes, batches = plan(scale)
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-segments-"))
    try:
        pristine = work / "spool-pristine"
        counts = write_spool(pristine, nodes, batches)
        no_energy = work / "spool-no-energy"   # the same fleet, its collectors not asking for the energy counter
        write_spool(no_energy, nodes, batches, with_energy=False)
        db_path, spool_dir, spent = work / "ledger.db", work / "spool", work / "hours-seconds"
        state: dict = {}

        def setup_subject() -> None:
            state["url"] = fresh_db(db_path)
            restore_spool(pristine, spool_dir)

        hours_s: list[float] = []
        lens_hours_s: list[float] = []
        site = work / "site-1.1.0.toml"  # method 1.1.0 (the effective-compute lens) on, as a site turns it on
        site.write_text('method_version = "1.1.0"\ncompute_precision = "bf16"\n')
        site.chmod(0o600)

        def setup_no_energy() -> None:
            state["url_ne"] = fresh_db(work / "ledger-no-energy.db")
            restore_spool(no_energy, work / "spool-ne")

        def subject_no_energy() -> None:
            args = ["--db", state["url_ne"], "ship", "--spool", str(work / "spool-ne"), "--quiet", "--no-receipts"]
            proc, _took = run_cli_timed(args, DEVICE_HOURS_TIMERS, work / "hours-seconds-ne")  # timed alike
            if proc.returncode != 0:
                raise RuntimeError(f"ship (no energy) failed: {proc.stderr.strip()[-300:]}")

        def shipment(extra: tuple[str, ...], into: list[float]) -> None:
            args = ["--db", state["url"], *extra, "ship", "--spool", str(spool_dir), "--quiet", "--no-receipts"]
            proc, took = run_cli_timed(args, DEVICE_HOURS_TIMERS, spent)
            if proc.returncode != 0:
                raise RuntimeError(f"ship failed: {proc.stderr.strip()[-300:]}")
            into.append(took.get("hours", 0.0))

        def subject() -> None:
            shipment((), hours_s)

        def subject_lens() -> None:
            shipment(("--config", str(site)), lens_hours_s)

        # one shipment first, untimed: its ledger gives the rows the floors insert
        setup_subject()
        subject()
        hours_s.clear()
        held = ledger_rows(db_path)
        entries = len(held["entries"][1])
        plain = {"entries": held["entries"],
                 PLAIN_SAMPLES: (INSERT_COLUMNS, spool_sample_rows(pristine))}
        assert held["entries"][0] == tuple(ENTRY_COLUMNS)

        def setup_floor() -> None:
            fresh_db(db_path)
            con = sqlite3.connect(db_path)
            con.execute(f"CREATE TABLE {PLAIN_SAMPLES} (segment_id TEXT, device TEXT, "
                        + ", ".join(f"{c} REAL" for c in INSERT_COLUMNS[2:]) + ")")
            con.close()

        floor_t, held_t, lens_t, ne_t, subj_t = timeit_interleaved([  # the subject last: checked below
            (f"raw sqlite3.executemany: {entries:,} entries + {counts['samples']:,} sample rows, one tx",
             lambda: floor_insert(db_path, plain), setup_floor),
            ("raw executemany of the rows the ledger holds (entries, sample_blocks, device_hours)",
             lambda: floor_insert(db_path, held), lambda: fresh_db(db_path)),
            ("the same under a site of method 1.1.0 (the effective-compute lens on)", subject_lens, setup_subject),
            ("`ipledger ship` of the same spool without the energy counter (no TOTEC column)", subject_no_energy,
             setup_no_energy),
            (f"`ipledger ship` ({counts['files']:,} spool files)", subject, setup_subject)], repeat)
        checked = check_ledger(state["url"], db_path, counts, entries)
        hours_t = Timing("time inside telemetry.hours.segments_hours and insert_in", tuple(hours_s))
        lens_hours_t = Timing("the same, method 1.1.0", tuple(lens_hours_s))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [s / f for s, f in zip(subj_t.runs, floor_t.runs)]
    shares = [h / s for h, s in zip(hours_t.runs, subj_t.runs)]
    without = [(s - h) / f for s, h, f in zip(subj_t.runs, hours_t.runs, floor_t.runs)]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    per = subj_t.median / counts["samples"] * 1e6
    extra = {
        "the ledger's own rows by raw executemany (floor a)":
            f"median {held_t.median:.3f} s; `ipledger ship` is {subj_t.median / held_t.median:.2f}× that",
        "`ipledger ship` against the floor": f"{statistics.median(ratios):.2f}× (median of per-round ratios); "
                                             f"{per:.1f} µs per sample shipped",
        "of which the device-hours (seal-time aggregation, timed in the shipping process)":
            f"median {hours_t.median:.3f} s = {statistics.median(shares) * 100:.1f} % of the shipment (per round: "
            f"{', '.join(f'{x * 100:.1f}' for x in shares)} %); the same shipment without it: "
            f"{statistics.median(without):.2f}× the floor",
        "the subject's ledger, checked after the last round": f"{checked}; `ipledger verify` clean",
        "the lens (method 1.1.0) adds to the device-hours' aggregation":
            "the same code under both (device-hours read no lens field; a difference is the machine's noise): "
            + _lens_note(hours_t, lens_hours_t),
        "the lens (method 1.1.0) adds to the shipment": _lens_note(subj_t, lens_t),
        "the energy counter adds": f"{(subj_t.median / ne_t.median - 1) * 100:+.1f} % to the shipment "
                                   f"({subj_t.median:.3f} s against {ne_t.median:.3f} s without it, medians; "
                                   f"target ≤ 10 %: {'met' if subj_t.median <= 1.10 * ne_t.median else 'NOT met'})",
    }
    notes = ("The floor is a bulk append of this data: the entries, and each sample the collectors produced as "
             "a row of a plain table of the sample columns. The ledger stores less than that — one compressed "
             "Arrow block per segment and its device-hours — so inserting exactly its rows (floor a) is cheaper "
             "still. What the shipper does beyond either is checking and deriving: every record re-identified; "
             "every segment's rows checked against the sample columns' types and ranges and re-hashed (as "
             "canonical JSON) against the digest its entry seals; each segment encoded as a block; the "
             "device-hours aggregated. From 1,000 spool files on, worker processes read and check the files "
             "and hand the rows back as numpy columns while the shipping process chains, encodes and "
             "aggregates a batch at a time.",)
    return Figure(key="ship_segments", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,), extra=extra,
                  notes=notes,
                  scale_note=f"{nodes} nodes × {GPUS} GPUs × {batches} batches of {TICKS} s at 1 s: "
                             f"{counts['samples']:,} samples in {counts['segments']:,} segments, "
                             f"{counts['files']:,} spool files ({counts['records']:,} records); scale {scale:g} of "
                             f"{FULL_NODES} nodes × {FULL_BATCHES} batches; load average at the end {load}")


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.05, argv=argv)


if __name__ == "__main__":
    main()
