"""Figure: the receipt of a 1,024-GPU, 72-hour run at 10 s cadence, against a DuckDB query summing the same
samples per device; and the receipt's peak memory (target ≤ 2 GiB).

The ledger (SQLite) holds the run as the hooks and the collector leave it: allocation_started, one
device_bound per GPU, one sealed telemetry_segment per GPU with its samples as one block in `sample_blocks`, and
allocation_ended. The floor is DuckDB over the same samples (the columns a receipt reads) in a Parquet file.
The subject is `ipledger receipt JOB --format json` in a fresh interpreter.

Building the full-size ledger takes far longer than the receipt, so it may be kept:
``IPLEDGER_BENCH_RECEIPT_DIR=/big/disk/receipt`` builds it there once and reuses it while its ``built.json``
(GPUs, hours, block format) matches.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from bench.common import FeatureMissing, Figure, Timing, main_for, run_cli_measured, timeit_interleaved

TITLE = "Receipt of a 1,024-GPU 72-hour run"
FULL_GPUS = 1024
KEEP_ENV = "IPLEDGER_BENCH_RECEIPT_DIR"
HOURS = 72
CADENCE = 10.0
T0 = 1_780_000_000.0
READ_COLUMNS = ("device", "t", "dt", "clock_reasons", "sm_active", "tensor_active", "gpu_util", "sm_clock_mhz",
                "compute_procs", "fb_used_mib")


def _device_columns(i: int, n: int):  # noqa: ANN202
    import numpy as np

    rng = np.random.default_rng(1000 + i)
    t = T0 + CADENCE * np.arange(n)
    busy = (np.sin(np.arange(n) / (300 + i % 17)) > -0.6)
    act = np.where(busy, rng.uniform(0.55, 0.98, n), rng.uniform(0.0, 0.03, n))
    reasons = np.where(rng.random(n) < 0.03, 0x20, 0).astype(np.int64)
    clock = np.where(reasons > 0, 1410.0, 1980.0)
    return t, act, reasons, clock, busy


def build_ledger(db_path: Path, gpus: int, hours: float) -> tuple[str, int, Path]:
    """The run in a fresh SQLite ledger, and the same samples in Parquet; returns (url, rows, parquet)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.ship_sqlite import fresh_db
    from ledger.chain import db as db_mod
    from ledger.chain.entries import Kind, make_entry
    from ledger.chain.store import append
    from ledger.telemetry.model import SAMPLE_COLUMNS
    from ledger.telemetry.sealed import segment_entry_rows, write_segment_rows_in

    url = fresh_db(db_path)
    n = int(hours * 3600 / CADENCE)
    key = {"cluster": "hpc1", "job_id": "990001", "run": 0}
    nodes = [f"gpu-n{j:04d}" for j in range((gpus + 7) // 8)]
    uuids = [f"GPU-{i:08x}-bench-4000-8000-{i:012x}" for i in range(gpus)]
    start, end = T0, T0 + n * CADENCE
    engine = db_mod.make_engine(url)
    head = [make_entry(Kind.ALLOCATION_STARTED, start, {"account": "physics", "user": "u1", "partition": "gpu",
                                                        "qos": "normal", "nodes": nodes, "gpus": gpus,
                                                        "tres": f"gres/gpu={gpus}"},
                       node=nodes[0], source="hook.prolog", **key)]
    head += [make_entry(Kind.DEVICE_BOUND, start, {"index": i % 8, "uuid": u, "sku": "NVIDIA H100 80GB HBM3",
                                                   "vendor": "nvidia", "node": nodes[i // 8]},
                        device=u, node=nodes[i // 8], source="hook.prolog", **key) for i, u in enumerate(uuids)]
    append(engine, head)
    writer = None
    parquet = db_path.with_suffix(".parquet")
    fast = engine.execution_options(ipledger_write=True)
    for i, u in enumerate(uuids):
        t, act, reasons, clock, busy = _device_columns(i, n)
        power = 70.0 + 600.0 * act
        cols = {"t": t, "sm_active": act, "tensor_active": act * 0.4, "gpu_util": (act * 1.1).clip(0, 1),
                "sm_clock_mhz": clock, "compute_procs": busy.astype(float),
                "fb_used_mib": busy * 70000.0 + 1024.0, "power_w": power,
                # the device's energy counter in joules (as the collector stores NVML's), from a per-device start
                "energy_j": 1e6 * (1 + i) + np.cumsum(power * CADENCE) - power * CADENCE}
        # Rows in the normalised form the collector ships (every other metric not measured: NULL).
        values = [[None] * n for _ in SAMPLE_COLUMNS]
        values[0], values[1], values[2], values[3] = [u] * n, t.tolist(), [CADENCE] * n, reasons.tolist()
        for c, arr in cols.items():
            values[SAMPLE_COLUMNS.index(c)] = arr.tolist()
        rows = list(zip(*values))
        # As the collector seals it: one segment entry per GPU, its rows stored by the ledger's own writer.
        seg = segment_entry_rows(rows, node=nodes[i // 8], source="collector", cluster="hpc1")
        with fast.begin() as conn:
            write_segment_rows_in(conn, rows, seg)
        table = pa.table({"device": [u] * n, "t": t, "dt": [CADENCE] * n, "clock_reasons": reasons,
                          **{c: cols[c] for c in READ_COLUMNS[4:]}})
        if writer is None:
            writer = pq.ParquetWriter(parquet, table.schema)
        writer.write_table(table)
    writer.close()
    append(engine, [make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": 0, "state": "COMPLETED"},
                               node=nodes[0], source="hook.epilog", **key)])
    engine.dispose()
    return url, n * gpus, parquet


def warm_in_process(cases: Sequence[tuple[str, str, object]], pairs: int) -> dict[str, tuple[Timing, dict]]:
    """CPU seconds of the receipt computed in this warm process (``receipt_for``, one process), the cases (name,
    ledger url, lens settings or None) taking turns: a cost the CLI figure's interpreter start hides. The first
    round warms the process (imports, caches) and is not counted. Returns each case's timing and last body."""
    from ledger.chain import db as db_mod
    from ledger.receipts import receipt_for

    engines = {url: db_mod.make_engine(url) for _n, url, _l in cases}
    try:
        bodies: dict = {}
        runs: dict[str, list[float]] = {name: [] for name, _u, _l in cases}
        for _ in range(pairs + 1):
            for name, url, lens in cases:
                t0 = time.process_time()
                bodies[name] = receipt_for(engines[url], "990001", lens=lens).body
                runs[name].append(time.process_time() - t0)
    finally:
        for engine in engines.values():
            engine.dispose()
    return {name: (Timing(name, tuple(runs[name][1:])), bodies[name]) for name, _u, _l in cases}


def lens_in_process(url: str, pairs: int) -> tuple[Timing, Timing, dict, dict]:
    """Method 1.0.0 and 1.1.0 (the lens) alternately in one warm process (:func:`warm_in_process`): the lens's
    own cost. Returns both timings and the last two receipt bodies."""
    from ledger.receipts import LensSettings

    got = warm_in_process((("`receipt_for` in one warm process, method 1.0.0 (CPU s)", url, None),
                           ("the same under method 1.1.0 (plus the lens)", url, LensSettings())), pairs)
    (off_t, off_body), (on_t, on_body) = got.values()
    return off_t, on_t, off_body, on_body


def energy_in_process(url: str, energy_url: str, pairs: int) -> tuple[Timing, Timing, dict, dict]:
    """The receipt without and with energy (the same run; the second ledger adds a contract pricing measured
    energy) alternately in one warm process (:func:`warm_in_process`): energy's own cost, which start-up
    swamps in the CLI figure. Returns both timings and the last two receipt bodies."""
    got = warm_in_process((("`receipt_for` in one warm process, without energy (CPU s)", url, None),
                           ("the same with energy (receipt 1.4)", energy_url, None)), pairs)
    (off_t, off_body), (on_t, on_body) = got.values()
    return off_t, on_t, off_body, on_body


ENERGY_CONTRACT = {"id": "bench-energy", "version": "1", "currency": "USD", "effective_from": "2020-01-01",
                   "skus": {"default": {"rate_per_gpu_hour": "2.00", "energy_price_per_kwh": "0.15", "pue": 1.2,
                                        "energy_basis": "measured"}}}


def energy_ledger(db_path: Path, energy_path: Path) -> str:
    """A copy of the built ledger with a contract pricing measured energy (receipt 1.4 reads the counters)."""
    from ledger.chain import db as db_mod
    from ledger.chain.contracts import contract_entry, parse_contract
    from ledger.chain.store import append

    for p in energy_path.parent.glob(energy_path.name + "*"):
        p.unlink()
    shutil.copyfile(db_path, energy_path)
    url = f"sqlite:///{energy_path}"
    engine = db_mod.make_engine(url)
    append(engine, [contract_entry(parse_contract(ENERGY_CONTRACT, "bench contract"), "2020-01-01T00:00:00Z")])
    engine.dispose()
    return url


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    try:
        from ledger.receipts import receipt_for  # noqa: F401
    except ImportError as exc:
        raise FeatureMissing(TITLE, f"ledger.receipts not importable: {exc}") from None
    from ledger.telemetry import blocks

    gpus = max(8, int(FULL_GPUS * scale))
    keep = os.environ.get(KEEP_ENV)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="ipledger-bench-receipt-"))
    try:
        stamp = {"gpus": gpus, "hours": HOURS, "format": blocks.FORMAT, "batch_rows": blocks.BATCH_ROWS,
                 "energy": 1}
        built = work / "built.json"
        if keep and built.exists() and json.loads(built.read_text()) == stamp:
            url, rows, parquet = f"sqlite:///{work / 'ledger.db'}", gpus * int(HOURS * 3600 / CADENCE), \
                work / "ledger.parquet"
        else:
            work.mkdir(parents=True, exist_ok=True)
            built.unlink(missing_ok=True)
            url, rows, parquet = build_ledger(work / "ledger.db", gpus, HOURS)
            built.write_text(json.dumps(stamp))
        ledger_bytes = sum(f.stat().st_size for f in work.glob("ledger.db*"))
        energy_url = energy_ledger(work / "ledger.db", work / "energy.db")
        q = (f"SELECT device, sum(dt), sum(sm_active * dt), sum(tensor_active * dt), sum(gpu_util * dt), "
             f"sum(sm_clock_mhz * dt), sum(compute_procs), sum(fb_used_mib), count(*) FILTER (clock_reasons > 0) "
             f"FROM read_parquet('{parquet}') GROUP BY device")
        out: dict = {}

        def floor() -> None:
            con = duckdb.connect()
            out["floor"] = con.execute(q).fetchall()
            con.close()

        peaks: dict[str, list[float]] = {"default": [], "in-process": [], "lens": [], "energy": []}
        site = work / "site-1.1.0.toml"  # method 1.1.0: the same receipt plus the effective-compute lens
        site.write_text('method_version = "1.1.0"\ncompute_precision = "bf16"\n')
        site.chmod(0o600)

        def subject(kind: str, env: dict | None, extra: tuple[str, ...] = (), db: str = url) -> Callable[[], None]:
            def go() -> None:
                proc, peak = run_cli_measured(["--db", db, *extra, "receipt", "990001", "--format", "json"],
                                              env=env)
                if proc.returncode != 0:
                    raise RuntimeError(f"ipledger receipt failed: {proc.stderr.strip()[-300:]}")
                out[kind] = proc.stdout
                peaks[kind].append(peak)
            return go

        floor_t, subj_t, one_t, lens_t, energy_t = timeit_interleaved([
            (f"DuckDB: sum the {rows:,} samples per device (Parquet)", floor, None),
            ("`ipledger receipt JOB --format json` (SQLite ledger; worker processes where ≥ 128 GPUs)",
             subject("default", None), None),
            ("the same, in one process (`IPLEDGER_RECEIPT_WORKERS=1`)",
             subject("in-process", {"IPLEDGER_RECEIPT_WORKERS": "1"}), None),
            ("the default receipt under method 1.1.0 (`method_version = \"1.1.0\"`: plus the lens)",
             subject("lens", None, ("--config", str(site))), None),
            ("the default receipt with energy (a contract with `energy_basis = \"measured\"`: receipt 1.4)",
             subject("energy", None, db=energy_url), None)], repeat)
        if out["default"] != out["in-process"]:
            raise RuntimeError("the receipt differs between worker processes and one process")
        r = json.loads(out["default"])
        paid = r["gpu_hours"]["paid"]
        if len(out["floor"]) != gpus or abs(paid - gpus * HOURS) > 1e-6 * gpus * HOURS:
            raise RuntimeError(f"receipt paid {paid} GPU-h, expected {gpus * HOURS}")
        peak, peak_one = max(peaks["default"]), max(peaks["in-process"])
        lens = json.loads(out["lens"])
        if abs(lens["gpu_hours"]["paid"] - paid) > 1e-9 or "effective_compute" not in lens:
            raise RuntimeError("the 1.1.0 receipt's time identity differs from 1.0.0's, or it has no lens")
        lens_extra = lens_t.median / subj_t.median - 1.0
        off_t, on_t, off_body, on_body = lens_in_process(url, max(5, 3 * repeat))
        if off_body["gpu_hours"] != on_body["gpu_hours"] or "effective_compute" not in on_body:
            raise RuntimeError("in one process, the 1.1.0 receipt's time identity differs from 1.0.0's")
        pair_extra = statistics.median(b / a - 1.0 for a, b in zip(off_t.runs, on_t.runs))
        warm_extra = on_t.median / off_t.median - 1.0
        en = json.loads(out["energy"])
        if abs(en["gpu_hours"]["paid"] - paid) > 1e-9 or en.get("receipt_version") != "1.4" or \
                not en["energy"]["kwh"] > 0:
            raise RuntimeError("the energy receipt's time identity differs, or it measured no energy")
        energy_extra = energy_t.median / subj_t.median - 1.0
        eoff_t, eon_t, eoff_body, eon_body = energy_in_process(url, energy_url, max(5, 3 * repeat))
        if eoff_body["gpu_hours"] != eon_body["gpu_hours"] or eon_body.get("energy") != en["energy"]:
            raise RuntimeError("in one process, the energy receipt's time identity or energy differs from the CLI's")
        e_pair_extra = statistics.median(b / a - 1.0 for a, b in zip(eoff_t.runs, eon_t.runs))
        e_warm_extra = eon_t.median / eoff_t.median - 1.0
        return Figure(key="receipt", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t, one_t),
                      scale_note=f"{gpus:,} GPUs × {HOURS} h at {CADENCE:g} s = {rows:,} samples "
                                 f"(scale {scale:g} of {FULL_GPUS:,} GPUs)",
                      extra={"peak memory of the receipt process": f"{peak:,.0f} MiB, in one process "
                                                                   f"{peak_one:,.0f} MiB (target ≤ 2048 MiB: "
                                                                   f"{'met' if max(peak, peak_one) <= 2048 else 'NOT met'}; "
                                                                   f"the largest of the process and each worker)",
                             "ledger size": f"{ledger_bytes / 2**20:,.0f} MiB SQLite = {ledger_bytes / rows:.1f} B "
                                            f"per sample (sample blocks; Parquet floor file "
                                            f"{parquet.stat().st_size / rows:.1f} B per sample)",
                             "the lens (method 1.1.0) adds": f"{lens_extra * 100:+.1f} % to the default receipt "
                                                             f"({lens_t.median:.2f} s against {subj_t.median:.2f} s,"
                                                             f" medians; minimums {min(lens_t.runs):.2f} s against "
                                                             f"{min(subj_t.runs):.2f} s; target ≤ 10 %: "
                                                             f"{'met' if lens_extra <= 0.10 else 'NOT met'})",
                             "the lens (method 1.1.0) adds, in one warm process":
                                 f"{warm_extra * 100:+.1f} % CPU to the receipt ({on_t.median:.3f} s against "
                                 f"{off_t.median:.3f} s, medians of {len(on_t.runs)} alternating pairs; median "
                                 f"of the pairs' ratios {pair_extra * 100:+.1f} %; minimums {min(on_t.runs):.3f} s "
                                 f"against {min(off_t.runs):.3f} s; target ≤ 10 %: "
                                 f"{'met' if warm_extra <= 0.10 else 'NOT met'}; time identity equal)",
                             "energy (receipt 1.4) adds": f"{energy_extra * 100:+.1f} % to the default receipt "
                                                          f"({energy_t.median:.2f} s against {subj_t.median:.2f} s,"
                                                          f" medians; {en['energy']['kwh']:,.1f} kWh measured, "
                                                          f"source {en['energy']['source']}; target ≤ 10 %: "
                                                          f"{'met' if energy_extra <= 0.10 else 'NOT met'})",
                             "energy (receipt 1.4) adds, in one warm process":
                                 f"{e_warm_extra * 100:+.1f} % CPU to the receipt ({eon_t.median:.3f} s against "
                                 f"{eoff_t.median:.3f} s, medians of {len(eon_t.runs)} alternating pairs; median "
                                 f"of the pairs' ratios {e_pair_extra * 100:+.1f} %; minimums "
                                 f"{min(eon_t.runs):.3f} s against {min(eoff_t.runs):.3f} s; start-up excluded, "
                                 f"so no target: the CLI figure above is the one held to ≤ 10 %)",
                             "paid GPU-hours on the receipt": f"{paid:,.1f}",
                             "delivered GPU-hours": f"{r['gpu_hours']['delivered']:,.1f}"})
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=0.05, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
