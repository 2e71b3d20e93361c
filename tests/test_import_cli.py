"""`ipledger import ...` end to end through the CLI: gaps, formats agreeing, synthetic runs, malformed input."""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from ledger.chain import db as db_mod
from ledger.chain.entries import Kind
from ledger.importers import synth
from ledger.chain.store import iter_entries

ENV = {"IPLEDGER_CONFIG": ""}
START = synth.DEFAULT_START
SMALL = dict(n_gpus=4, hours=2, cadence=60, start=START, metrics=synth.DEFAULT_METRICS[:6])


def _entries(url):
    eng = db_mod.make_engine(url)
    try:
        return [(ce.entry.entry_id, ce.entry.kind) for ce in iter_entries(eng)]
    finally:
        eng.dispose()


def _gaps(url):
    eng = db_mod.make_engine(url)
    try:
        return [ce.entry for ce in iter_entries(eng, kinds=[Kind.UNKNOWN_INTERVAL])]
    finally:
        eng.dispose()


def _import(runner, cli, url, *args):
    return runner.invoke(cli, ["--db", url, "import", *args], env=ENV)


def test_twenty_minute_hole_gives_one_unknown_interval_on_that_device(runner, cli, tmp_path, ledger_url):
    kw = dict(n_gpus=16, hours=6, cadence=60, start=START, holes=[(5, 7200, 1200)], jobs="slurm",
              metrics=synth.DEFAULT_METRICS[:5])
    synth.write_query_range(tmp_path / "qr", **kw)
    r = _import(runner, cli, ledger_url, "prometheus", str(tmp_path / "qr"), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["devices"] == 16 and out["unknown_intervals"] == 1 and out["runs"] == 4
    gaps = _gaps(ledger_url)
    assert len(gaps) == 1
    g = gaps[0]
    assert g.device == synth.gpu_uuid(0, 5)
    from ledger.chain.canonical import parse_ts
    seconds = (parse_ts(g.ts_end) - parse_ts(g.ts)).total_seconds()
    assert abs(seconds - 1200) <= 60
    assert g.data["cause"] == "scrape_missing" and g.data["scope"] == "device"
    # verify (hash chain + segment digests) passes; re-import appends nothing
    assert runner.invoke(cli, ["--db", ledger_url, "verify"], env=ENV).exit_code == 0
    r2 = _import(runner, cli, ledger_url, "prometheus", str(tmp_path / "qr"), "--json")
    assert r2.exit_code == 0 and json.loads(r2.output)["appended"] == 0


def test_every_prometheus_file_shape_gives_the_same_ledger(runner, cli, tmp_path):
    kw = dict(SMALL, holes=[(1, 1800, 900)], jobs="k8s")
    qr = tmp_path / "qr"
    synth.write_query_range(qr, **kw)
    om = synth.write_openmetrics(tmp_path / "om.txt", **kw)
    csvp = synth.write_csv(tmp_path / "long.csv", **kw)
    jsonl = tmp_path / "all.jsonl"
    jsonl.write_text("".join(json.dumps(json.loads(p.read_text())) + "\n" for p in sorted(qr.iterdir())))
    with tarfile.open(tmp_path / "qr.tar.gz", "w:gz") as tf:
        tf.add(qr, arcname="qr")
    with zipfile.ZipFile(tmp_path / "qr.zip", "w") as zf:
        for p in sorted(qr.iterdir()):
            zf.write(p, arcname=p.name)
    results = {}
    receipts = {}
    for name, src in [("dir", [str(qr)]), ("files", [str(p) for p in sorted(qr.iterdir())]),
                      ("tar", [str(tmp_path / "qr.tar.gz")]), ("zip", [str(tmp_path / "qr.zip")]),
                      ("jsonl", [str(jsonl)]), ("csv", [str(csvp)]), ("openmetrics", [str(om)])]:
        url = f"sqlite:///{tmp_path / (name + '.db')}"
        eng = db_mod.make_engine(url)
        db_mod.upgrade(eng)
        eng.dispose()
        r = _import(runner, cli, url, "prometheus", *src, "--json", "--quiet")
        assert r.exit_code == 0, (name, r.output)
        # the import issues the closed runs' receipts; their entries carry the time of issue, so they are
        # compared by the receipt they record
        results[name] = [e for e in _entries(url) if e[1] != Kind.RECEIPT_ISSUED]
        receipts[name] = [json.loads(r.output)["receipts"]["issued"],
                          sorted(c.entry.data["receipt_hash"] for c in iter_entries(
                              db_mod.make_engine(url), kinds=[Kind.RECEIPT_ISSUED]))]
    assert all(r == receipts["dir"] and r[0] >= 1 for r in receipts.values()), receipts
    first = results["dir"]
    kinds = [k for _, k in first]
    assert kinds.count(Kind.UNKNOWN_INTERVAL) == 1 and kinds.count(Kind.ALLOCATION_STARTED) == 1
    for name, got in results.items():
        assert got == first, name


def test_synthetic_runs_from_k8s_labels(runner, cli, tmp_path, sqlite_url):
    synth.write_query_range(tmp_path / "qr", **dict(SMALL, n_gpus=8, jobs="k8s"))
    assert _import(runner, cli, sqlite_url, "prometheus", str(tmp_path / "qr")).exit_code == 0
    eng = db_mod.make_engine(sqlite_url)
    starts = [ce.entry for ce in iter_entries(eng, kinds=[Kind.ALLOCATION_STARTED])]
    bound = [ce.entry for ce in iter_entries(eng, kinds=[Kind.DEVICE_BOUND])]
    ends = [ce.entry for ce in iter_entries(eng, kinds=[Kind.ALLOCATION_ENDED])]
    eng.dispose()
    assert sorted(e.job_id for e in starts) == ["team-0/train-0", "team-0/train-1"]
    assert all(e.cluster == "pathb" and e.run == 0 and e.data["account"] == "team-0" for e in starts)
    assert len(bound) == 8 and all(b.data["sku"] == synth.SKU for b in bound)
    assert {e.job_id for e in ends} == {e.job_id for e in starts}
    assert all(e.ts_end is None for e in ends)


def test_dmon_capture_with_metadata_line(runner, cli, tmp_path, sqlite_url):
    src = Path(__file__).parent / "fixtures" / "pathb" / "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"
    p = tmp_path / "dmon.txt"
    p.write_text("# ipledger: start=2026-01-01T00:00:00Z interval_ms=1000 node=gpu07\n" + src.read_text())
    r = _import(runner, cli, sqlite_url, "dmon", str(p), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["devices"] == 8 and out["samples"] == 8 + 2
    assert out["missing"]["sm_active"]["not_available"] >= 8
    r = _import(runner, cli, sqlite_url, "dmon", str(src))
    assert r.exit_code != 0 and "--start and --interval" in r.output


MALFORMED = {
    "truncated.json": (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL",'
                       b'"UUID":"GPU-1"},"values":[[1767225600,"5"],[1767225660,', "line 1 column"),
    "wrong_columns.csv": (b"when,what,howmuch\n1767225600,DCGM_FI_DEV_GPU_UTIL,5\n", "line 1: wrong columns"),
    # (an unreadable value is no longer a refusal: tests/test_real_captures.py, unreadable value = missing)
    "empty.json": (b"", "empty file"),
    "binary.bin": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "binary data"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_input_is_one_line_error_and_writes_nothing(runner, cli, tmp_path, ledger_url, name):
    data, place = MALFORMED[name]
    good = tmp_path / "good"
    synth.write_query_range(good, **SMALL)
    bad = good / name               # a bad file among good ones: nothing of the good ones may land either
    bad.write_bytes(data)
    r = _import(runner, cli, ledger_url, "prometheus", str(good))
    assert r.exit_code != 0
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert name in lines[0] and place in lines[0], lines[0]
    assert _entries(ledger_url) == []


def test_missing_source_and_bad_options(runner, cli, tmp_path, sqlite_url):
    r = _import(runner, cli, sqlite_url, "prometheus", str(tmp_path / "nope"))
    assert r.exit_code != 0 and "no such file" in r.output
    r = _import(runner, cli, sqlite_url, "prometheus", "--url", "http://127.0.0.1:9")
    assert r.exit_code != 0 and "--start and --end" in r.output
    r = _import(runner, cli, sqlite_url, "dmon", str(tmp_path), "--interval", "fast")
    assert r.exit_code != 0 and "--interval" in r.output


@pytest.mark.parametrize("exporter,needle", [("dcgm-exporter", "api/v1/query_range"), ("dcgmi", "dcgmi dmon -e"),
                                             ("amd-smi", "amd-smi monitor"), ("nvidia-smi", "--query-gpu=")])
def test_capture_recipe_command_prints_an_importable_recipe(runner, cli, exporter, needle):
    r = runner.invoke(cli, ["pathb-command", "--exporter", exporter, "--hours", "24"], env=ENV)
    assert r.exit_code == 0 and needle in r.output and "ipledger analyze" in r.output
    if exporter == "dcgm-exporter":   # one call stays within Prometheus' 11,000 points per series
        step = int(r.output.split("step=")[1].split("s")[0])
        assert 24 * 3600 / step <= 11_000


def test_dmon_capture_recipe_metadata_is_what_the_importer_reads(tmp_path):
    from ledger.cli.importers import capture_recipes
    from ledger.importers import dmon

    recipe = capture_recipes("dmon", 1, 1, "")
    assert "# ipledger-start %Y-%m-%dT%H:%M:%SZ node=$NODE interval_ms=1000" in recipe
    text = ("# ipledger-start 2026-01-01T00:00:00Z node=h interval_ms=1000\n#Entity SMACT\nID\nGPU 0 0.5\nGPU 0 0.25\n")
    c = dmon.parse(text, "x")
    assert list(c.series["h/gpu0"]["sm_active"][0]) == [1767225600.0, 1767225601.0]
    old = ("# ipledger: start=1767225600 interval_ms=1000 node=h\n#Entity SMACT\nID\nGPU 0 0.5\nGPU 0 0.25\n")
    assert list(dmon.parse(old, "x").series["h/gpu0"]["sm_active"][0]) == [1767225600.0, 1767225601.0]


def test_progress_only_on_a_tty_and_not_with_quiet(monkeypatch):
    import io

    from ledger.cli import importers as cli_imp

    class Tty(io.StringIO):
        def isatty(self):
            return True

    import sys

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cli_imp._progress(quiet=False) is None            # not a terminal: silent
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli_imp._progress(quiet=True) is None             # --quiet
    show = cli_imp._progress(quiet=False)
    show(1, 2)
    show(2, 2)
    # the one progress bar (ledger.base.progressbar): label, bar, counts; the line ended when done
    assert "import" in tty.getvalue() and "1/2" in tty.getvalue() and "2/2" in tty.getvalue()
    assert tty.getvalue().endswith("\n")


@pytest.mark.parametrize("cmd", [["import"], ["import", "prometheus"], ["import", "dmon"], ["import", "amd-smi"],
                                 ["import", "nvidia-smi"], ["pathb-command"], ["collect"]])
def test_every_command_has_help_with_an_example(runner, cli, cmd):
    r = runner.invoke(cli, [*cmd, "--help"], env=ENV)
    assert r.exit_code == 0 and "Example:" in r.output and "ipledger " in r.output.split("Example:")[1]


def test_dcgm_exporter_version_is_reported_only_and_rescales_no_energy(runner, cli, tmp_path, ledger_url):
    """Field 156 is mJ in every exporter version (DCGM 4.7's joule counter is field 1611): giving
    `--dcgm-exporter-version 4.9.0` says so in the import's warnings and stores the same joules as without it."""
    from ledger.method.energy import J_PER_KWH
    from ledger.telemetry.energy import device_energy_of
    from ledger.telemetry.sealed import read_samples

    kw = dict(n_gpus=2, hours=1, cadence=60, start=START,
              metrics=("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"))
    rows, truth = [], {}
    for labels, pts in synth.series(**kw):
        if labels["__name__"] == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":      # the counter in mJ
            truth[labels["UUID"]] = (pts[0][0], pts[-1][0], (int(pts[-1][1]) - int(pts[0][1])) / 1000)
        rows.append({"metric": labels, "values": [[t, v] for t, v in pts]})
    src = tmp_path / "qr.json"
    src.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": rows}}))
    r = _import(runner, cli, ledger_url, "prometheus", str(src), "--dcgm-exporter-version", "4.9.0")
    assert r.exit_code == 0, r.output
    assert "--dcgm-exporter-version 4.9.0: reported only" in r.output and "nothing rescaled" in r.output
    eng = db_mod.make_engine(ledger_url)
    try:
        table = read_samples(eng, columns=("device", "t", "power_w", "energy_j")).to_pydict()
    finally:
        eng.dispose()
    for dev, (t0, t1, joules) in truth.items():
        mine = [i for i, d in enumerate(table["device"]) if d == dev]
        cols = {k: ([table["t"][i] for i in mine], [table[k][i] for i in mine]) for k in ("power_w", "energy_j")}
        de = device_energy_of(dev, cols, t0, t1)
        assert abs(de.joules - joules) / J_PER_KWH <= 1e-6 and de.source == "counter"


