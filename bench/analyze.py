"""Figure: `ipledger analyze` of a 24-hour, 64-GPU, 12-metric Prometheus export at 15 s, against DuckDB
reading the same files and summing each metric per device; and the peak memory of `ipledger analyze` on a
24-hour export of 256 GPUs (target ≤ 1 GiB).

The export is what a prospect sends: one `/api/v1/query_range` JSON response per metric (ledger.importers.synth,
deterministic, dcgm-exporter labels). The subject is the real command (every agent over the export's device-hours,
the Findings JSON); the floor is one DuckDB query over the same files. The memory figure is one run of the same
command on a second export, MEMORY_GPUS × scale GPUs (its own interpreter, its peak resident memory).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from ledger.importers import synth

from bench.common import (FeatureMissing, Figure, main_for, run_cli, run_cli_measured, run_cli_tree_peak,
                          timeit_interleaved)

TITLE = "Export analysis (Prometheus export)"
FULL_GPUS = 64
MEMORY_GPUS = 256
MEMORY_TARGET_MIB = 1024


def floor_query(directory: Path) -> str:
    return (f"WITH r AS (SELECT unnest(data.result) AS s FROM read_json('{directory}/*.json', "
            f"maximum_object_size=2000000000)), "
            f"v AS (SELECT s.metric.UUID AS dev, s.metric.__name__ AS metric, unnest(s.\"values\") AS p FROM r) "
            f"SELECT dev, metric, count(*), sum(CAST(p[2] AS DOUBLE)) FROM v GROUP BY ALL")


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    if "analyze" not in run_cli(["--help"]).stdout:
        raise FeatureMissing(TITLE, "`ipledger analyze` is not there yet")
    gpus = max(16, int(FULL_GPUS * scale))  # at least two nodes of 8
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-analyze-"))
    try:
        export = work / "export"
        files = synth.write_query_range(export, n_gpus=gpus, hours=24, cadence=15, jobs="slurm",
                                        metrics=synth.DEFAULT_METRICS[:12])
        size = sum(p.stat().st_size for p in files)
        q = floor_query(export)
        out: dict = {}

        def floor() -> None:
            con = duckdb.connect()
            out["floor_rows"] = con.execute(q).fetchall()
            con.close()

        def subject() -> None:
            out["proc"] = run_cli(["analyze", *map(str, files), "--json"], check=False)

        subject()  # one untimed run first: fail fast with the reason instead of timing a crash
        if out["proc"].returncode != 0:
            reason = (out["proc"].stderr.strip().splitlines() or ["no output"])[-1][:300]
            return Figure(key="analyze", title=TITLE, target=3.0, floor=None, status=f"failed: {reason}",
                          scale_note=f"{gpus} GPUs × 24 h × 12 metrics at 15 s ({size / 2**20:,.0f} MiB JSON)")
        floor_t, subj_t = timeit_interleaved([("DuckDB: read the JSON files, sum each metric per device", floor, None),
                                              ("`ipledger analyze FILES --json`", subject, None)], repeat)
        findings = json.loads(out["proc"].stdout)
        if len(out["floor_rows"]) != gpus * 12 or "findings" not in findings:
            raise RuntimeError("analyze or the floor did not see every device and metric")
        shutil.rmtree(export)
        memory = peak_memory(work / "large", max(16, int(MEMORY_GPUS * scale)))
        return Figure(key="analyze", title=TITLE, target=3.0, floor=floor_t, subjects=(subj_t,),
                      scale_note=f"{gpus} GPUs × 24 h × 12 metrics at 15 s = {gpus * 5760 * 12:,} points in "
                                 f"{len(files)} query_range files ({size / 2**20:,.0f} MiB); scale {scale:g} "
                                 f"of {FULL_GPUS} GPUs",
                      extra={"findings": len(findings["findings"]), **memory})
    finally:
        shutil.rmtree(work, ignore_errors=True)


def peak_memory(directory: Path, gpus: int) -> dict:
    """One `ipledger analyze` of a 24-hour export of ``gpus`` GPUs: its peak resident memory and time."""
    files = synth.write_query_range(directory, n_gpus=gpus, hours=24, cadence=15, jobs="slurm",
                                    metrics=synth.DEFAULT_METRICS[:12])
    size = sum(p.stat().st_size for p in files)
    t = time.perf_counter()
    proc, peak = run_cli_measured(["analyze", *map(str, files), "--json"])
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-300:])
    devices = json.loads(proc.stdout)["meta"]["devices"]
    if devices != gpus:
        raise RuntimeError(f"analyze saw {devices} of {gpus} devices")
    # the files are parsed by worker processes: their memory is not in the command's own peak, so the whole
    # tree is sampled in a second run (and the target judged on the larger of the two)
    rc, tree = run_cli_tree_peak(["analyze", *map(str, files), "--json"])
    if rc != 0:
        raise RuntimeError(f"analyze exited {rc} in the process-tree run")
    verdict = "met" if max(peak, tree) <= MEMORY_TARGET_MIB else "NOT met"
    return {f"peak memory of `ipledger analyze`, {gpus} GPUs × 24 h ({size / 2**20:,.0f} MiB JSON)":
            f"{peak:,.0f} MiB in {took:,.0f} s; its process tree with the parsing workers, sampled every 50 ms "
            f"(RSS summed, shared pages counted in each): {tree:,.0f} MiB (target ≤ {MEMORY_TARGET_MIB:,} MiB at "
            f"{MEMORY_GPUS} GPUs: {verdict if gpus == MEMORY_GPUS else 'scaled down'})"}


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=1.0, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
