"""bench.import_export at a tiny scale: the figure carries its floor, the extra floor (the ledger's own rows) and the
device-hours' share timed inside the importing process, and it refuses to report an import that lost anything.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from bench import common
from bench import import_export as bench_import


def test_import_figure_has_the_floor_the_extra_floor_and_the_share(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "PERF_DOC", tmp_path / "performance.md")
    fig = bench_import.run(scale=1 / 64, repeat=1)   # one GPU, 24 h at 15 s
    common.write_doc(fig, tmp_path / "performance.md")
    assert fig.status == "ok" and fig.floor.median > 0 and fig.subjects[0].median > 0
    assert "DuckDB" in fig.floor.label and "ipledger import prometheus" in fig.subjects[0].label
    extra_floor = next(v for k, v in fig.extra.items() if k.startswith("extra floor"))
    assert "device_hours 24" in extra_floor and "sample_blocks 4" in extra_floor and "entries " in extra_floor
    share = fig.extra["inside the import: of which the device-hours sealed with each segment "
                      "(telemetry.hours.store_in)"]
    seconds, percent = float(share.split()[1]), float(share.split("= ")[1].split()[0])
    assert seconds > 0 and 0 < percent < 100
    assert float(fig.extra["inside the import: reading the query_range files "
                           "(ledger.importers.prometheus.read)"].split()[1]) > 0
    doc = (tmp_path / "performance-history.md").read_text()
    assert f"## {bench_import.TITLE}" in doc and "1 GPUs × 24 h" in doc and "ratio to floor" in doc


def test_a_broken_import_is_not_reported(tmp_path):
    """check_ledger holds the subject's ledger to the export: device-hours lost (or a sample short) is an error."""
    from bench.ship_sqlite import fresh_db
    from ledger.importers import synth

    files = synth.write_query_range(tmp_path / "export", n_gpus=1, hours=24, cadence=15, jobs="slurm",
                                    metrics=bench_import.METRICS)
    db = tmp_path / "ledger.db"
    url = fresh_db(db)
    summary = json.loads(common.run_cli(["--db", url, "import", "prometheus", *map(str, files), "--json",
                                         "--quiet"]).stdout)
    want = bench_import.SAMPLES_PER_DAY
    assert bench_import.check_ledger(db, summary, 1, want)["device_hours"] == 24
    with pytest.raises(RuntimeError, match="samples"):
        bench_import.check_ledger(db, summary, 1, want - 1)   # the floor read a different export
    with pytest.raises(RuntimeError, match="devices"):
        bench_import.check_ledger(db, summary, 2, want)   # a device of the export missing
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER device_hours_no_delete")   # the damage an import that skipped an hour would leave
    con.execute("DELETE FROM device_hours WHERE hour = (SELECT MAX(hour) FROM device_hours)")
    con.commit()
    con.close()
    with pytest.raises(RuntimeError, match="device_hours rows 23"):
        bench_import.check_ledger(db, summary, 1, want)
