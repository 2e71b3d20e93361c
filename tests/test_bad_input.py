"""Bad input end to end (issue 9, point 4): through ``ipledger import`` on an SQLite ledger.

* A failed import leaves the ledger byte-for-byte unchanged (mutated exports, and a failure injected in the
  middle of the write transaction), and the failure is one line naming the file and the place.
* Huge exports stream within a memory bound: peak RSS of an ``ipledger import`` subprocess
  (``resource.getrusage``) against the file size (``make test``: a few MB per format; ``--soak``: 1 GB).
* Sample times in the future or before 2000 are refused with the point named; clock skew between the nodes of
  one job is flagged on the run and the receipt still balances; the same job id on two clusters is two runs;
  Unicode and control characters in account, user and job names are stored faithfully and cannot inject
  formulas into CSV exports.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from ledger.importers import pipeline, synth
from tests.test_fuzz_parsers import _OPS, SYNTH, _mutate, _read

T0 = synth.DEFAULT_START
ENV = {"IPLEDGER_CONFIG": ""}


def _state(db: Path) -> tuple:
    """Everything an import could change: entry and sample counts and the chain head."""
    with sqlite3.connect(db) as con:
        n = con.execute("SELECT count(*) FROM entries").fetchone()[0]
        head = con.execute("SELECT hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        samples = con.execute("SELECT count(*) FROM samples").fetchone()[0]
    return n, head, samples


def _seeded_ledger(runner, cli, tmp_path, url: str) -> tuple[str, Path]:
    """A ledger that already holds one import, so 'unchanged' means something."""
    db = Path(url.removeprefix("sqlite:///"))
    synth.write_query_range(tmp_path / "first", n_gpus=2, hours=0.5, cadence=60, start=T0, jobs="slurm")
    r = runner.invoke(cli, ["--db", url, "import", "prometheus", str(tmp_path / "first"), "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    return url, db


SEEDS = {
    "prometheus": [_read("pathb", "api_v1_query_range_matrix_format_prometheus_docs.json"),
                   *(SYNTH[k] for k in ("csv", "jsonl", "openmetrics"))],
    "dmon": ["# ipledger: start=2026-01-01T00:00:00Z interval_ms=1000 node=n1\n"
             + _read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt")],
    "amd-smi": ["# ipledger: start=1767225600 interval_ms=1000 node=mi\n"
                + _read("pathb", "amd_smi", "L0079_amd_smi_monitor_violation.txt")],
    "nvidia-smi": [_read("pathb", "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt")],
}


@pytest.mark.soak
def test_a_failed_import_leaves_the_ledger_unchanged(runner, cli, tmp_path, sqlite_url, trials):
    url, db = _seeded_ledger(runner, cli, tmp_path, sqlite_url)
    outcomes = {"ok": 0, "refused": 0}

    @settings(max_examples=trials(15, 1000), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(fmt=st.sampled_from(sorted(SEEDS)), ops=_OPS, data=st.data())
    def run(fmt, ops, data):
        src = tmp_path / "in.txt"
        src.write_text(_mutate(data.draw(st.sampled_from(SEEDS[fmt])), ops), encoding="utf-8", errors="surrogatepass")
        before = _state(db)
        extra = ["--node", "n1"] if fmt != "prometheus" else ["--at", str(T0)]
        r = runner.invoke(cli, ["--db", url, "import", fmt, str(src), "--quiet", *extra], env=ENV)
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        if r.exit_code == 0:
            outcomes["ok"] += 1
            return
        outcomes["refused"] += 1
        assert r.exit_code == 1
        assert _state(db) == before
        line = r.output.strip()
        assert "\n" not in line and str(src) in line, line

    run()
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0, outcomes


def test_a_failure_inside_the_write_transaction_appends_nothing(runner, cli, tmp_path, sqlite_url, monkeypatch):
    url, db = _seeded_ledger(runner, cli, tmp_path, sqlite_url)
    before = _state(db)
    synth.write_query_range(tmp_path / "second", n_gpus=3, hours=1, cadence=60, start=T0 + 7200, jobs="slurm")
    real = pipeline.device_entries
    calls = []

    def fail_on_the_third_device(c, tl, opts):
        calls.append(tl.device)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(c, tl, opts)

    monkeypatch.setattr(pipeline, "device_entries", fail_on_the_third_device)
    r = runner.invoke(cli, ["--db", url, "import", "prometheus", str(tmp_path / "second"), "--quiet"], env=ENV)
    assert r.exit_code != 0 and len(calls) == 3
    assert _state(db) == before          # two devices' segments were written inside the transaction, then undone
    monkeypatch.setattr(pipeline, "device_entries", real)
    r = runner.invoke(cli, ["--db", url, "import", "prometheus", str(tmp_path / "second"), "--quiet"], env=ENV)
    assert r.exit_code == 0 and _state(db)[0] > before[0]


# --- sample times out of range ------------------------------------------------------------------------------------

def _query_range(points: list, **labels) -> str:
    metric = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1", "Hostname": "n1", **labels}
    return json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                    "result": [{"metric": metric, "values": points}]}})


@pytest.mark.parametrize("bad,why", [
    (4102444800, "more than a day after this machine's clock"),     # 2100-01-01
    (1767225600000, "more than a day after"),                       # milliseconds where seconds belong
    (86400, "before 2000-01-01"),
    (-5, "before 2000-01-01"),
    ("NaN", "not a finite number"),
    ("Inf", "not a finite number"),
])
def test_sample_times_in_the_future_or_far_past_are_refused(runner, cli, tmp_path, sqlite_url, bad, why):
    src = tmp_path / "bad.json"
    src.write_text(_query_range([[T0, "50"], [T0 + 60, "40"], [bad, "30"]]))
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    before = _state(db)
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src)], env=ENV)
    assert r.exit_code == 1 and _state(db) == before
    assert f"{src}: result[0] point 2: timestamp" in r.output and why in r.output, r.output
    # the same through the per-line formats: the line is named
    csv_src = tmp_path / "bad.csv"
    csv_src.write_text(f"timestamp,metric,UUID,value\n{T0},DCGM_FI_DEV_GPU_UTIL,GPU-1,5\n{bad},DCGM_FI_DEV_GPU_UTIL,GPU-1,5\n")
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(csv_src)], env=ENV)
    assert r.exit_code == 1 and f"{csv_src}: line 3" in r.output and why in r.output, r.output


def test_a_capture_start_in_the_far_past_is_refused_at_its_first_row(runner, cli, tmp_path, sqlite_url):
    src = tmp_path / "dmon.txt"
    src.write_text(_read("pathb", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"))
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "dmon", str(src), "--start", "1970-01-02T00:00:00Z",
                            "--interval", "1s", "--node", "n1"], env=ENV)
    assert r.exit_code == 1 and f"{src}: line 5 column" in r.output and "before 2000-01-01" in r.output, r.output


# --- the same job id on two clusters ------------------------------------------------------------------------------

def test_the_same_job_id_on_two_clusters_is_two_runs(runner, cli, tmp_path, sqlite_url):
    synth.write_query_range(tmp_path / "a", n_gpus=4, hours=1, cadence=60, start=T0, jobs="slurm", seed=1)
    synth.write_query_range(tmp_path / "b", n_gpus=2, hours=2, cadence=60, start=T0, jobs="slurm", seed=2)
    for cluster, d in (("east", "a"), ("west", "b")):
        r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(tmp_path / d), "--cluster", cluster,
                                "--json", "--quiet"], env=ENV)
        assert r.exit_code == 0 and json.loads(r.output)["runs"] == 1, r.output   # hpc_job 1000 on each
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "1000", "--json"], env=ENV)
    assert r.exit_code != 0 and "several clusters (east, west)" in r.output
    got = {}
    for cluster in ("east", "west"):
        r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "1000", "--cluster", cluster, "--json"], env=ENV)
        assert r.exit_code == 0, r.output
        rec = json.loads(r.output)
        got[cluster] = (rec["job"]["cluster"], len(rec["job"]["devices"]), round(rec["gpu_hours"]["paid"], 1))
    assert got == {"east": ("east", 4, 4.0), "west": ("west", 2, 4.0)}


# --- Unicode and control characters in names ----------------------------------------------------------------------

NASTY = st.text(alphabet=st.sampled_from(list("=+-@\t\r\n\x00\x07\x1b\x7f\x85\u202e\u2066;,\"'|!aé中🙂 ")),
                min_size=1, max_size=12)


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(account=NASTY, user=NASTY, job=NASTY.filter(lambda s: s.strip() == s and "\x00" not in s))
@example(account="=cmd|' /C calc'!A0", user="@u", job="-;")   # a job id that looks like an option
def test_names_are_stored_faithfully_and_shown_escaped(runner, cli, tmp_path_factory, account, user, job):
    import csv as csv_mod

    from ledger.chain import db as db_mod, store
    from ledger.chain.entries import Kind, make_entry

    d = tmp_path_factory.mktemp("names")
    url = f"sqlite:///{d / 'l.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    key = dict(cluster="c1", job_id=job, run=0)
    store.append(eng, [
        make_entry(Kind.ALLOCATION_STARTED, T0, {"account": account, "user": user, "job_name": job, "gpus": 1},
                   node="n1", **key),
        make_entry(Kind.DEVICE_BOUND, T0, {"index": 0, "uuid": "GPU-a", "sku": "NVIDIA H100 80GB HBM3"},
                   device="GPU-a", node="n1", **key),
        make_entry(Kind.ALLOCATION_ENDED, T0 + 3600, {"exit_code": 0, "state": "COMPLETED"}, node="n1", **key)])
    started = next(e for e in store.iter_entries(eng) if e.entry.kind == Kind.ALLOCATION_STARTED)
    payload = json.loads(started.entry.payload)
    assert (payload["account"], payload["user"], started.entry.job_id) == (account, user, job)   # byte for byte
    r = runner.invoke(cli, ["--db", url, "receipt", "--json", "--", job], env=ENV)
    assert r.exit_code == 0 and json.loads(r.output)["job"]["account"] == account   # JSON: exact, escaped by JSON
    r = runner.invoke(cli, ["--db", url, "receipt", "--issue", "--", job], env=ENV, color=True)
    assert r.exit_code == 0, r.output
    text = r.output
    assert not any(ch in text for ch in "\x00\x07\x1b\x7f\x85\u202e\u2066\r"), repr(text)
    assert all(ln.startswith(("GPU receipt", "account", "window", "devices", "contract", "method")) or "\\x" not in ln
               for ln in text.splitlines()[:6])
    out = d / "m.csv"
    r = runner.invoke(cli, ["--db", url, "export", "monthly", "--month", "2026-01", "--out", str(out), "--quiet"],
                      env=ENV)
    assert r.exit_code == 0, r.output
    raw = out.read_text(encoding="utf-8")
    assert not any(ch in raw for ch in "\x00\x07\x1b\x7f\x85\u202e\u2066\r"), repr(raw)
    rows = list(csv_mod.reader(raw.splitlines()))
    assert len(rows) >= 2 and all(len(row) == len(rows[0]) for row in rows)   # no name broke a row
    for row in rows[1:]:
        for cell in row:
            if cell.startswith(("=", "+", "-", "@")):
                float(cell)            # only numbers may start so (a negative figure); a name never does
    tenant = rows[1][rows[0].index("tenant")] if rows[1][0] != "total" else rows[2][rows[0].index("tenant")]
    from ledger.base.textsafe import csv_cell
    assert tenant == csv_cell(account)


# --- huge exports ---------------------------------------------------------------------------------------------------

BIG_GPUS = 64
BIG_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_PROF_SM_ACTIVE")


def _big_labels(g: int) -> dict[str, str]:
    return {"gpu": str(g % 8), "UUID": f"GPU-{g:08d}-0000-4000-8000-000000000000", "Hostname": f"node-{g // 8:02d}",
            "modelName": "NVIDIA H100 80GB HBM3", "hpc_job": str(1000 + g // 16)}


def _big_value(m: str, k: int) -> str:
    return {"DCGM_FI_DEV_GPU_UTIL": str(k % 101), "DCGM_FI_DEV_POWER_USAGE": f"{100 + k % 500}.25",
            "DCGM_FI_DEV_SM_CLOCK": "1980", "DCGM_FI_PROF_SM_ACTIVE": f"{(k % 100) / 100:.2f}"}[m]


def write_big(kind: str, path: Path, size: int) -> None:
    """A synthetic export of about ``size`` bytes: 64 GPUs at 1 s (long CSV, JSON Lines, one query_range JSON
    response) or a dmon capture."""
    with open(path, "w", encoding="utf-8") as f:
        k = 0
        if kind == "csv":
            names = list(_big_labels(0))
            f.write("timestamp,metric," + ",".join(names) + ",value\n")
            cells = [",".join(_big_labels(g)[n] for n in names) for g in range(BIG_GPUS)]
            while f.tell() < size:
                f.write("".join(f"{T0 + k},{m},{cells[g]},{_big_value(m, k + g)}\n"
                                for g in range(BIG_GPUS) for m in BIG_METRICS))
                k += 1
        elif kind == "jsonl":
            per_line = 60
            while f.tell() < size:
                for g in range(BIG_GPUS):
                    for m in BIG_METRICS:
                        pts = ",".join(f'[{T0 + k * per_line + i},"{_big_value(m, i + g)}"]' for i in range(per_line))
                        metric = json.dumps({"__name__": m, **_big_labels(g)}, separators=(",", ":"))
                        f.write('{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
                                f'{metric},"values":[{pts}]}}]}}}}\n')
                k += 1
        elif kind == "json":   # one query_range response: a long series per GPU and metric at 1 s
            n = max(1, size // (BIG_GPUS * len(BIG_METRICS) * 22))
            f.write('{"status":"success","data":{"resultType":"matrix","result":[')
            for j, (g, m) in enumerate((g, m) for g in range(BIG_GPUS) for m in BIG_METRICS):
                metric = json.dumps({"__name__": m, **_big_labels(g)}, separators=(",", ":"))
                f.write(("," if j else "") + '{"metric":' + metric + ',"values":[')
                for a in range(0, n, 10_000):
                    f.write(("," if a else "") + ",".join(f'[{T0 + i},"{_big_value(m, i + g)}"]'
                                                          for i in range(a, min(n, a + 10_000))))
                f.write("]}")
            f.write("]}}")
        else:
            f.write(f"# ipledger: start={T0:.0f} interval_ms=1000 node=n1\n")
            header = "#Entity   GPUTL  POWER  SMCLK  SMACT  TMPTR  FBUSD  MCUTL  MMCLK\nID\n"
            while f.tell() < size:
                rows = [header]
                for _ in range(14):          # dmon repeats its header every 14 ticks
                    rows += [f"GPU {g}   {k % 101}   {100 + k % 500}.25   1980   0.{k % 100:02d}   61   40000   "
                             f"{k % 50}   2619\n" for g in range(BIG_GPUS)]
                    k += 1
                f.write("".join(rows))


MEASURE = """
import json, resource, sys
from click.testing import CliRunner
from ledger.chain import db as db_mod
from ledger.cli.main import cli
import ledger.cli.importers, ledger.importers.pipeline, numpy, sqlalchemy
for kind, path, db in json.loads(sys.argv[1]):
    url = "sqlite:///" + db
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    engine.dispose()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    args = ["--db", url, "import", "dmon" if kind == "dmon" else "prometheus", path, "--quiet", "--json"]
    r = CliRunner().invoke(cli, args, env={"IPLEDGER_CONFIG": ""})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = json.loads(r.output) if r.exit_code == 0 else {}
    print(json.dumps({"kind": kind, "exit_code": r.exit_code, "error": r.output[-300:] if r.exit_code else "",
                      "base_mb": base / 1024, "peak_mb": peak / 1024, "samples": out.get("samples"),
                      "devices": out.get("devices")}), flush=True)
"""


@pytest.mark.soak
def test_huge_exports_are_imported_within_a_memory_bound(tmp_path, soak):
    """Peak RSS of the importing process grows with what was parsed, not with the file: baseline + 250 MB +
    24 bytes a value (the columns, 16 bytes, with their growth slack) + 2 KB a sample of one device (its timeline
    while it is written). The text is streamed, never held whole: a 1 GB file would otherwise add 2 GB (bytes
    and str) by itself, and a query_range response read by ``json.loads`` ten times its size. ``make test``:
    0.4 MB of each format in one process; ``--soak``: 1 GB each, a process each. Figures: docs/telemetry.md, "Bad input"."""
    size = 1_000_000_000 if soak else 400_000
    groups = [["csv"], ["jsonl"], ["json"], ["dmon"]] if soak else [["csv", "jsonl", "json", "dmon"]]
    for kinds in groups:
        jobs = []
        for kind in kinds:
            path = tmp_path / f"big.{kind}"
            write_big(kind, path, size)
            jobs.append((kind, str(path), str(tmp_path / f"{kind}.db")))
        proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(jobs)], capture_output=True, text=True,
                              timeout=4 * 3600, cwd=Path(__file__).parent.parent)
        assert proc.returncode == 0, proc.stderr[-2000:]
        for line, (kind, path, _db) in zip(proc.stdout.strip().splitlines(), jobs):
            res = json.loads(line)
            size_mb = Path(path).stat().st_size / 1e6
            print(f"\n{kind}: {size_mb:.0f} MB, {res['samples']} samples of {res['devices']} devices: peak RSS "
                  f"{res['peak_mb']:.0f} MB (baseline {res['base_mb']:.0f} MB)")
            assert res["exit_code"] == 0, res["error"]
            assert res["devices"] == BIG_GPUS and res["samples"] > 0
            values = res["samples"] * (8 if kind == "dmon" else len(BIG_METRICS))
            bound = res["base_mb"] + 250 + (24 * values + 2048 * res["samples"] / res["devices"]) / 2**20
            assert res["peak_mb"] <= bound, (res, bound)


# --- clock skew between nodes ---------------------------------------------------------------------------------------

def test_clock_skew_between_nodes_is_flagged_and_the_receipt_still_balances(runner, cli, tmp_path, sqlite_url):
    """Job 1000 holds GPUs 0-1 on node-00 and 2-3 on node-01; node-01's clock is 5 minutes fast."""
    skew = 300.0
    files = synth.write_query_range(tmp_path / "qr", n_gpus=4, hours=1, cadence=15, start=T0, jobs="slurm",
                                    node_gpus=2)
    for p in files:
        doc = json.loads(p.read_text())
        for series in doc["data"]["result"]:
            if series["metric"]["Hostname"] == "node-01":
                series["values"] = [[t + skew, v] for t, v in series["values"]]
        p.write_text(json.dumps(doc))
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(tmp_path / "qr"), "--json", "--quiet"],
                      env=ENV)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    assert summary["clock_skew"] == {"1000": {"node-01": skew}}
    assert "node-01's telemetry runs 300 s ahead" in r.output       # the warning (stderr, mixed in by the runner)
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "1000", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    gh = rec["gpu_hours"]
    parts = gh["delivered"] + sum(gh["throttled"].values()) + gh["underutilized"] + gh["starved"] + \
        gh["idle_held"] + gh["unknown"]
    assert abs(gh["paid"] - parts) <= 1e-9                            # the accounting identity holds
    assert gh["paid"] == pytest.approx(4 * (3600 + skew) / 3600, abs=0.02)   # the allocation spans both clocks
    assert gh["unknown"] == pytest.approx(4 * skew / 3600, abs=0.02)        # what each node's clock leaves uncovered
    # a node that merely starts late (one end moved) is not skew
    assert pipeline.clock_skew(*_two_node_spans(late_start=600.0)) == {}
    assert pipeline.clock_skew(*_two_node_spans(late_start=600.0, late_end=600.0)) == {"b": 600.0}


def _two_node_spans(late_start: float, late_end: float = 0.0):
    from ledger.importers.common import Collected, DeviceInfo

    c = Collected("x")
    for d, node in (("d1", "a"), ("d2", "b")):
        c.device(DeviceInfo(device=d, node=node))
    spans = {"d1": (T0, T0 + 3600, 15.0), "d2": (T0 + late_start, T0 + 3600 + late_end, 15.0)}
    return c, ["d1", "d2"], spans, pipeline.ImportOptions()
