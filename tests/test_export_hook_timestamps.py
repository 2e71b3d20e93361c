"""The monthly export of receipts whose windows carry what the real hooks write: timestamps with microseconds
(``2026-11-03T10:00:19.989802Z``). Every format is written with exit 0, and the CSV's run rows show each
window to the second (the streamed CSV declines such a month and the row path writes it)."""

from __future__ import annotations

import csv
import io

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.sim import synthetic_receipts as synthetic
from tests.test_export_monthly import NOV, issue_entry


def _microsecond_receipts() -> list[dict]:
    rs = []
    for i in range(1, 4):
        r = synthetic.receipt(i, tenant="astro", start=NOV + i * 3600, hours=1, shares={"unknown": 0.1})
        r["window"] = {"start": r["window"]["start"][:-1] + f".98980{i}Z",
                       "end": r["window"]["end"][:-1] + f".12345{i}Z"}
        rs.append(r)
    return rs


def test_monthly_export_of_hook_timestamps_with_microseconds(sqlite_url, runner, cli, tmp_path):
    rs = _microsecond_receipts()
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 20 * 86400) for r in rs])
    eng.dispose()
    for fmt in ("csv", "parquet", "focus", "json", "pdf"):
        out = tmp_path / f"nov.{fmt}"
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", fmt,
                                  "--out", str(out), "--quiet"])
        assert res.exit_code == 0 and res.exception is None, (fmt, res.output)
        assert out.stat().st_size > 0, fmt
    rows = [r for r in csv.DictReader(io.StringIO((tmp_path / "nov.csv").read_text())) if r["level"] == "run"]
    # the statement shows windows to the second, as it does every window
    assert sorted(r["window_start"] for r in rows) == sorted(r["window"]["start"][:19] + "Z" for r in rs)
    assert sum(float(r["paid"]) for r in rows) == sum(r["gpu_hours"]["paid"] for r in rs)
