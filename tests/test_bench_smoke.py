"""Each benchmark module runs end to end at a tiny scale and reports a figure (correctness, not timing).

Benchmarks are not timed tests: these only prove `make bench` will not crash on a fresh clone and that
each figure checks its own result (rows shipped, entries verified, receipt paid hours...).
"""

from __future__ import annotations

import pytest

from bench import common


def _run(module: str, scale: float, tmp_path, monkeypatch) -> common.Figure:
    import importlib

    monkeypatch.setattr(common, "PERF_DOC", tmp_path / "performance.md")
    mod = importlib.import_module(f"bench.{module}")
    fig = mod.run(scale=scale, repeat=1)
    common.write_doc(fig, tmp_path / "performance.md")
    return fig


@pytest.mark.parametrize("module,scale", [("ship_sqlite", 0.0005), ("verify", 0.0003), ("mark", 0.03),
                                          ("proofs", 0.0005), ("agents", 0.016)])
def test_core_figures_run_and_check_themselves(module, scale, tmp_path, monkeypatch):
    fig = _run(module, scale, tmp_path, monkeypatch)
    assert fig.status == "ok"
    assert fig.floor is not None and fig.floor.median > 0
    assert all(t.median > 0 for t in fig.subjects)
    doc = (tmp_path / "performance-history.md").read_text()
    assert f"## {fig.title}" in doc and "ratio to floor" in doc


def test_ship_segments_figure_has_both_floors_and_the_device_hours_share(tmp_path, monkeypatch):
    """bench.ship_segments at 2 nodes x 1 batch: the floor of the same rows, the floor of the ledger's own rows
    and the seal-time aggregation's share measured in the shipping process, of a shipment that checked out."""
    fig = _run("ship_segments", 0.0005, tmp_path, monkeypatch)
    assert fig.status == "ok" and fig.floor.median > 0 and fig.subjects[0].median > 0
    assert "sample rows" in fig.floor.label and "16 segments" in fig.scale_note
    extra = "\n".join(f"{k}: {v}" for k, v in fig.extra.items())
    assert "rows the ledger holds" in extra or "the ledger's own rows" in extra
    assert "% of the shipment" in extra and "without it" in extra and "verify` clean" in extra
    assert "the energy counter adds" in extra
    assert "## Ship collector segments into SQLite" in (tmp_path / "performance-history.md").read_text()


def test_capture_set_figure_prints_both_ratios_and_peak_memory(tmp_path, monkeypatch):
    """bench.analyze_captures at 600 s sampling: the dmon set against its DuckDB floor in the table, the amd-smi
    set's own ratio and both sets' peak memory beside it, each set seen whole (64 GPUs) by analyze and the floor."""
    fig = _run("analyze_captures", 0.02, tmp_path, monkeypatch)
    assert fig.status == "ok" and fig.floor.median > 0 and fig.subjects[0].median > 0
    for name in ("dmon", "amd-smi"):
        line = fig.extra[f"{name} set"]
        assert "64 GPUs" in line and "×" in line and "peak memory" in line and "MiB" in line
    latest, _status = fig.headline()     # the row's verdict names both sets, not the table's alone
    assert latest.startswith("dmon ") and ", amd-smi " in latest and latest.endswith(" MiB")
    assert "## Capture-set analysis" in (tmp_path / "performance-history.md").read_text()


def test_write_doc_appends_to_the_record_and_updates_only_its_row(tmp_path):
    """A run is appended to the record (never rewritten: two runs, two entries) and its headline and date go into
    its own row of the table of current figures; other rows and sections stay as they were."""
    doc = tmp_path / "performance.md"
    rows = ("| figure | reproduce | floor | target | latest | status |\n|---|---|---|---|---|---|\n"
            "| some figure | `python -m bench.x` | a floor | ≤ 2× | old | NOT met |\n"
            "| other figure | `python -m bench.xy` | a floor | ≤ 3× | 2.00× (2026-01-01) | met |\n")
    doc.write_text(f"# Performance\n\nintro\n\n## Current figures\n\n{rows}\n## Accuracy\n\nsomeone else's numbers\n")
    fig = common.Figure(key="x", title="Some figure", target=2.0, floor=common.Timing("floor", (1.0, 1.0)),
                        subjects=(common.Timing("subject", (1.5, 1.7)),))
    common.write_doc(fig, doc)
    common.write_doc(fig, doc)
    record = (tmp_path / "performance-history.md").read_text()
    assert record.count("## Some figure — ") == 2       # appended, never replaced
    assert "| 1.60 | 1.50 | ≤ 2× met |" in record      # medians 1.6/1.0, minimums 1.5/1.0
    text = doc.read_text()
    row = next(r for r in text.splitlines() if "`python -m bench.x`" in r)
    assert "| 1.60× (subject) (" in row and row.endswith("| met |") and "old" not in row
    assert "| other figure | `python -m bench.xy` | a floor | ≤ 3× | 2.00× (2026-01-01) | met |" in text
    assert "## Accuracy\n\nsomeone else's numbers" in text and text.startswith("# Performance\n\nintro")
    slow = common.Figure(key="x", title="Some figure", target=2.0, floor=common.Timing("floor", (1.0,)),
                         subjects=(common.Timing("subject", (2.5,)),))
    common.write_doc(slow, doc)
    assert next(r for r in doc.read_text().splitlines() if "`python -m bench.x`" in r).endswith("| NOT met |")


def test_every_figure_has_a_row_in_the_table_of_current_figures():
    """docs/performance.md's table names every figure `make bench` runs, by the command that reproduces it."""
    from bench import FIGURES

    keys = {m.group("key") for m in common.ROW_RE.finditer(common.PERF_DOC.read_text())}
    assert set(FIGURES) <= keys, sorted(set(FIGURES) - keys)


def test_missing_feature_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "PERF_DOC", tmp_path / "performance.md")

    def run(scale, repeat):  # noqa: ANN001, ANN202
        raise common.FeatureMissing("Future figure", "not there yet")

    fig = common.main_for(run, "x", default_scale=1.0, argv=["--scale", "0.1"])
    assert fig.status == "not available yet"
    assert "not available yet" in (tmp_path / "performance-history.md").read_text()


@pytest.mark.postgres
def test_load_pg_shipper_processes_lose_and_duplicate_nothing(postgres):
    """bench.load_pg's process mode (the 64-shipper figure uses it), small: 4 processes x 3 epilogs."""
    from bench.load_pg import expected_ids, ledger_tally, run_shippers
    from ledger.chain import db as db_mod

    url = postgres.create_db("ipledger_load_smoke")
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    tally = run_shippers(url, 4, 3, processes=True)
    got = ledger_tally(url)
    want = expected_ids(4, 3)
    assert got["ids"] == want and got["rows"] == len(want) and got["chain_ok"]
    assert tally["pending"] == 0 and len(tally["latencies"]) == 12


def test_verify_bench_builds_the_ledger_shipping_would(tmp_path):
    """bench.verify's bulk build holds the generator's chained rows and the very tree the append path keeps
    (merkle.sync over the same rows, the way the ledger was built before), and is reused while it matches."""
    import sqlite3

    from bench import data
    from bench.verify import build_ledger
    from ledger.chain import db as db_mod
    from ledger.chain import merkle

    n = 1000
    url, total = build_ledger(tmp_path / "bulk.db", n)
    assert total == n
    ref = tmp_path / "ref.db"
    engine = db_mod.make_engine(f"sqlite:///{ref}")
    db_mod.upgrade(engine)
    with db_mod.write_tx(engine) as conn:
        conn.exec_driver_sql(f"INSERT INTO entries VALUES ({','.join('?' * 16)})", list(data.chained_rows(n)))
        merkle.sync(conn, n)
    engine.dispose()

    def dump(path, table):  # noqa: ANN001, ANN202
        con = sqlite3.connect(path)
        try:
            return con.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        finally:
            con.close()

    for table in ("entries", "merkle_nodes"):
        assert dump(tmp_path / "bulk.db", table) == dump(ref, table)
    mtime = (tmp_path / "bulk.db").stat().st_mtime_ns
    assert build_ledger(tmp_path / "bulk.db", n) == (url, n)  # kept: not built again
    assert (tmp_path / "bulk.db").stat().st_mtime_ns == mtime


def test_verify_floor_hashes_the_tree_the_ledger_stores(tmp_path, monkeypatch):
    """bench.verify's floor hashes every leaf and node of the stored tree (its root is the ledger's, over
    several chunks and a partial last one) and refuses to report a figure when the stored tree differs."""
    import sqlite3

    from bench import verify as bench_verify

    monkeypatch.setattr(bench_verify, "FLOOR_CHUNK", 256)
    n = 1000
    bench_verify.build_ledger(tmp_path / "l.db", n)
    full, two = bench_verify.time_floor(tmp_path / "l.db", n, 2)
    assert len(full.runs) == len(two.runs) == 2 and f"{n - 1:,} nodes" in full.label
    con = sqlite3.connect(tmp_path / "l.db")
    con.execute("DROP TRIGGER merkle_nodes_no_update")
    con.execute("UPDATE merkle_nodes SET hash = ? WHERE level = 9 AND idx = 0", (b"\x07" * 32,))
    con.commit()
    con.close()
    with pytest.raises(RuntimeError, match="Merkle root"):
        bench_verify.time_floor(tmp_path / "l.db", n, 1)


def test_the_process_tree_peak_counts_a_forked_workers_memory():
    import sys

    # the parent stays small; a forked child holds 200 MiB for a second
    code = ("import os, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.0); os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    rc, peak = common.tree_peak([sys.executable, "-c", code], every_s=0.02)
    assert rc == 0 and 200 <= peak < 400


def test_a_figure_taken_under_load_says_so():
    assert "quiet" in common.load_note(0.4, 0.9, cpus=2)
    assert "quiet" in common.load_note(0.4, 1.6, cpus=2)       # the run's own load afterwards
    assert "not comparable" in common.load_note(1.5, 1.6, cpus=2)
    assert "not comparable" in common.load_note(3.0, 0.2, cpus=2)
    assert common.load_note(None, 1.0) == "Machine load: unknown."


def test_k8s_tick_figure_runs_against_the_stand_in_kubelet(tmp_path, monkeypatch):
    """bench.k8s_tick at 8 pods: the floor and both subjects measured in CPU seconds, the first-seen ticks
    spooled their runs, and the budget line written."""
    fig = _run("k8s_tick", 0.125, tmp_path, monkeypatch)
    assert fig.status == "ok" and fig.floor.median > 0 and len(fig.subjects) == 2
    assert all(t.median > 0 for t in fig.subjects) and "8 pods" in fig.scale_note
    assert fig.extra["CPU per tick"].count(" ms") == 2
    assert f"## {fig.title}" in (tmp_path / "performance-history.md").read_text()


def test_latency_figure_times_each_interactive_command_against_its_budget(tmp_path, monkeypatch):
    """bench.latency on the two-day small hall: every command of the budget table ran (a failing command raises),
    and the figure names each budget and whether it was met."""
    from bench import latency

    fig = _run("latency", 0.01, tmp_path, monkeypatch)
    assert fig.status == "ok" and fig.floor.median > 0
    assert len(fig.subjects) == len(latency.BUDGETS_S) and all(t.median > 0 for t in fig.subjects)
    assert fig.extra["met"] == "all" or fig.extra["met"].startswith("NOT met: ")
    assert all(f"{name} ≤ " in fig.extra["budgets (median wall seconds)"] for name in latency.BUDGETS_S)
