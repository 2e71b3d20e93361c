"""Figure: `ipledger analyze` of a Path B capture set — an 8-node `dcgmi dmon` set and an 8-node `amd-smi metric`
set, 24 hours at 15 s — against DuckDB reading the same files and summing each field per file and GPU; and the
peak memory of each command (target ≤ 3× and ≤ 1 GiB).

The files are what a prospect sends, written by the report-on generator (:mod:`bench.capture_fleet`: the dmon
field list `ipledger pathb-command --format dmon` prints with its header every 14 ticks; amd-smi's watch banner,
CRLF and the CSV header before every iteration; a restart in one file of each set). The subject is the real
command (`ipledger analyze DIR --json`: every agent over the set's device-hours); the floor is one DuckDB query per
set over the same files (lines read as text, the rows split into fields, each field summed per file and GPU). The
memory is the command's whole process tree (the parsing workers included), sampled every 50 ms.
``--scale F`` keeps 24 hours and samples every 15 / F seconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from bench.common import Figure, Timing, main_for, run_cli, run_cli_tree_peak, timeit_interleaved

TITLE = "Capture-set analysis (dmon and amd-smi sets)"
NODES = 8
MEMORY_TARGET_MIB = 1024
TARGET = 3.0


def dmon_floor_query(directory: Path, fields: int) -> str:
    sums = ", ".join(f"sum(TRY_CAST(c[{k}] AS DOUBLE))" for k in range(3, 3 + fields))
    return (f"WITH l AS (SELECT filename, line FROM read_csv('{directory}/*.txt', columns={{'line': 'VARCHAR'}}, "
            f"delim=E'\\x01', header=false, quote='', escape='', auto_detect=false, filename=true)), "
            f"r AS (SELECT filename, string_split_regex(trim(line), '\\s+') AS c FROM l WHERE line LIKE 'GPU %') "
            f"SELECT filename, c[2] AS gpu, count(*), {sums} FROM r GROUP BY ALL")


def amd_floor_query(directory: Path, columns: int) -> str:
    sums = ", ".join(f"sum(TRY_CAST(c[{k}] AS DOUBLE))" for k in range(3, columns + 1))
    return (f"WITH l AS (SELECT filename, line FROM read_csv('{directory}/*.csv', columns={{'line': 'VARCHAR'}}, "
            f"delim=E'\\x01', header=false, quote='', escape='', auto_detect=false, filename=true)), "
            f"r AS (SELECT filename, string_split(rtrim(line, E'\\r'), ',') AS c FROM l "
            f"WHERE regexp_matches(line, '^[0-9]')) "
            f"SELECT filename, c[2] AS gpu, count(*), {sums} FROM r GROUP BY ALL")


def run(scale: float, repeat: int) -> Figure:
    import duckdb

    from bench.capture_fleet import AMD_COLUMNS, DMON_FIELDS, generate, write_captures

    cadence = min(600.0, 15.0 / max(scale, 1e-3))
    work = Path(tempfile.mkdtemp(prefix="ipledger-bench-captures-"))
    try:
        fl = generate(0, hours=24.0, cadence=cadence, nv_nodes=NODES, amd_nodes=NODES)
        sets = {"dmon": (work / "dmon", ("nvidia",)), "amd-smi": (work / "amdsmi", ("amd",))}
        files = {name: write_captures(fl, d, vendors=v, exporter=False) for name, (d, v) in sets.items()}
        queries = {"dmon": dmon_floor_query(sets["dmon"][0], len(DMON_FIELDS)),
                   "amd-smi": amd_floor_query(sets["amd-smi"][0], len(AMD_COLUMNS))}
        out: dict = {}
        timings: dict[str, tuple[Timing, Timing]] = {}
        extra: dict = {}
        verdicts: dict[str, tuple[float, float]] = {}
        for name, (directory, _v) in sets.items():
            def floor(name=name) -> None:  # noqa: ANN001
                con = duckdb.connect()
                out[f"{name} floor"] = con.execute(queries[name]).fetchall()
                con.close()

            def subject(directory=directory, name=name) -> None:  # noqa: ANN001
                out[f"{name} proc"] = run_cli(["analyze", str(directory), "--json"], check=False)

            f_t, s_t = timeit_interleaved([(f"DuckDB: read the {name} files, sum each field per file and GPU", floor,
                                            None), (f"`ipledger analyze {name}-set/ --json`", subject, None)], repeat)
            proc = out[f"{name} proc"]
            if proc.returncode != 0:
                reason = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
                return Figure(key="analyze_captures", title=TITLE, target=TARGET, floor=None,
                              status=f"failed on the {name} set: {reason}")
            analysis = json.loads(out[f"{name} proc"].stdout)
            gpus = NODES * 8
            if analysis["meta"]["devices"] != gpus or len({(r[0], r[1]) for r in out[f"{name} floor"]}) < gpus:
                raise RuntimeError(f"{name}: analyze saw {analysis['meta']['devices']} GPUs, the floor "
                                   f"{len(out[f'{name} floor'])} (file, GPU) rows; expected {gpus}")
            restarted = [f for f in analysis["findings"] if f.get("cause") == "capture_restarted"]
            rc, peak = run_cli_tree_peak(["analyze", str(directory), "--json"])
            if rc != 0:
                raise RuntimeError(f"analyze of the {name} set exited {rc} in the memory run")
            timings[name] = (f_t, s_t)
            ratio = s_t.median / f_t.median
            verdicts[name] = (ratio, peak)
            size = sum(p.stat().st_size for p in files[name])
            extra[f"{name} set"] = (
                f"{len(files[name])} files ({size / 2**20:,.0f} MiB), {gpus} GPUs: analyze {s_t.median:.2f} s vs "
                f"DuckDB {f_t.median:.2f} s = **{ratio:.2f}×** (target ≤ {TARGET:g}×: "
                f"{'met' if ratio <= TARGET else 'NOT met'}); peak memory of its process tree {peak:,.0f} MiB "
                f"(target ≤ {MEMORY_TARGET_MIB:,} MiB: {'met' if peak <= MEMORY_TARGET_MIB else 'NOT met'}); "
                f"{len(analysis['findings'])} findings, {len(restarted)} capture_restarted gap(s)")
        f_d, s_d = timings["dmon"]
        f_a, s_a = timings["amd-smi"]
        # the row's verdict is both sets' (the table holds the dmon set only): each ratio and each peak
        latest = (", ".join(f"{n} {r:.2f}×" for n, (r, _p) in verdicts.items()) + "; "
                  + " / ".join(f"{p:,.0f}" for _r, p in verdicts.values()) + " MiB")
        met = all(r <= TARGET and p <= MEMORY_TARGET_MIB for r, p in verdicts.values())
        return Figure(key="analyze_captures", title=TITLE, target=TARGET, floor=f_d, subjects=(s_d,),
                      scale_note=(f"{NODES} NVIDIA nodes (dmon, 23 fields) and {NODES} MI300X nodes (amd-smi metric "
                                  f"CSV, {len(AMD_COLUMNS)} columns), 8 GPUs each, 24 h at {cadence:g} s; scale "
                                  f"{scale:g} of 15 s sampling. The table is the dmon set; the amd-smi set's own "
                                  f"floor and ratio are below."),
                      extra={**extra, "amd-smi set timings": f"floor {f_a.median:.3f} s (runs {len(f_a.runs)}), "
                                                             f"analyze {s_a.median:.3f} s"},
                      summary=(latest, met))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> Figure:
    return main_for(run, __doc__.splitlines()[0], default_scale=1.0, default_repeat=3, argv=argv)


if __name__ == "__main__":
    main()
