"""The read-only commands' SQLite reader (ledger.chain.lite, the standard library's sqlite3) and the SQLAlchemy
engine read a ledger alike: the same receipts (byte for byte) and the same verify reports, on the demo ledger and
on copies of it tampered in each place verify looks (an entry, a sample block, a device-hour, a receipt line).
And `ipledger receipt` / `ipledger verify` on an SQLite ledger import no SQLAlchemy, pandas, duckdb or reportlab."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.base import config as config_mod
from ledger.chain import db as db_mod
from ledger.chain.entries import Kind
from ledger.chain.lite import LiteEngine
from ledger.chain.store import iter_entries
from ledger.chain.verify import verify
from ledger.ingest.site import site_from_config
from ledger.receipts import receipt_for
from ledger.receipts.auto import verify_checks
from ledger.receipts.issue import replay


def _engines(path: Path):  # noqa: ANN202 - (the SQLAlchemy engine, the standard library reader)
    sa_engine = db_mod.make_engine(f"sqlite:///{path}", create=False, read_only=True)
    reader = db_mod.make_reader(f"sqlite:///{path}")
    assert isinstance(reader, LiteEngine) and not isinstance(sa_engine, LiteEngine)
    return sa_engine, reader


def _site(demo_dir: Path, ledger: Path):  # noqa: ANN202
    return site_from_config(config_mod.load(str(demo_dir / "site.toml")), db=str(ledger))


def _report(engine, site):  # noqa: ANN001, ANN202
    r = verify(engine, checks=verify_checks(site))
    return r.ok, r.entries, r.head_seq, r.head_hash, [str(p) for p in r.problems], r.notes


def test_same_receipts_through_both_readers(demo):
    out, summary = demo
    ledger = Path(summary["ledger"])
    site = _site(out, ledger)
    sa_engine, reader = _engines(ledger)
    issued = list(iter_entries(sa_engine, kinds=[Kind.RECEIPT_ISSUED]))
    assert issued
    for ce in issued[:: max(1, len(issued) // 25)]:
        a = replay(sa_engine, ce, site.sku_table, carbon=site.carbon)
        b = replay(reader, ce, site.sku_table, carbon=site.carbon)
        assert a.hash == b.hash == ce.entry.data["receipt_hash"]
        e = ce.entry
        for as_of in (None, ce.seq):
            x = receipt_for(sa_engine, e.job_id, e.run, cluster=e.cluster, as_of=as_of, sku_table=site.sku_table,
                            lens=site.lens, carbon=site.carbon)
            y = receipt_for(reader, e.job_id, e.run, cluster=e.cluster, as_of=as_of, sku_table=site.sku_table,
                            lens=site.lens, carbon=site.carbon)
            assert json.dumps(x.body, sort_keys=True) == json.dumps(y.body, sort_keys=True) and x.hash == y.hash
    sa_engine.dispose()


def _tamper(path: Path, sql: str) -> None:
    con = sqlite3.connect(path)
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        con.execute(f'DROP TRIGGER "{name}"')
    changed = con.execute(sql).rowcount
    con.commit()
    con.close()
    assert changed == 1, sql


TAMPERS = {
    "honest": None,
    "entry payload": "UPDATE entries SET payload = replace(payload, '\"', ' \"') WHERE seq = "
                     "(SELECT MIN(seq) FROM entries WHERE kind = 'allocation_started')",
    "sample block": "UPDATE sample_blocks SET data = (SELECT data FROM sample_blocks ORDER BY segment_id LIMIT 1 "
                    "OFFSET 1), sha256 = (SELECT sha256 FROM sample_blocks ORDER BY segment_id LIMIT 1 OFFSET 1) "
                    "WHERE segment_id = (SELECT MIN(segment_id) FROM sample_blocks)",
    "device-hour": "UPDATE device_hours SET busy_s = busy_s + 60 WHERE rowid = (SELECT MIN(rowid) FROM device_hours)",
    "receipt line": "UPDATE receipt_lines SET paid = paid + 1 WHERE rowid = "
                    "(SELECT MIN(rowid) FROM receipt_lines WHERE line_kind = 'part')",
}


@pytest.mark.parametrize("where", list(TAMPERS))
def test_same_verify_reports_through_both_readers(demo, tmp_path, where):
    out, summary = demo
    ledger = tmp_path / "ledger.db"
    shutil.copy(summary["ledger"], ledger)
    if TAMPERS[where]:
        _tamper(ledger, TAMPERS[where])
    site = _site(out, ledger)
    sa_engine, reader = _engines(ledger)
    a, b = _report(sa_engine, site), _report(reader, site)
    sa_engine.dispose()
    assert a == b
    assert a[0] == (where == "honest"), a


def _modules_loaded(args: list[str]) -> set[str]:
    code = ("import sys; from ledger.cli.main import cli\n"
            "try:\n    cli(args=sys.argv[1:], prog_name='ipledger')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print('MODULES', ' '.join(sorted(sys.modules)))")
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("MODULES ")][-1]
    return set(line.split()[1:])


HEAVY = ("sqlalchemy", "pandas", "duckdb", "reportlab")


def test_receipt_and_verify_of_an_sqlite_ledger_import_no_heavy_library(demo, tmp_path):
    out, summary = demo
    db = ["--db", f"sqlite:///{summary['ledger']}", "--config", str(out / "site.toml")]
    with sqlite3.connect(summary["ledger"]) as con:
        job = con.execute("SELECT job_id FROM entries WHERE kind = 'receipt_issued' ORDER BY seq LIMIT 1").fetchone()[0]
    for args in ([*db, "receipt", str(job)], [*db, "verify"], [*db, "log", "--limit", "3"]):
        loaded = _modules_loaded(args)
        assert not {m.split(".")[0] for m in loaded} & set(HEAVY), (args[-2:], sorted(
            m for m in loaded if m.split(".")[0] in HEAVY)[:5])
    # --issue writes (on a copy): the SQLAlchemy engine, as every writing command
    shutil.copy(summary["ledger"], tmp_path / "ledger.db")
    copy = ["--db", f"sqlite:///{tmp_path / 'ledger.db'}", "--config", str(out / "site.toml")]
    assert "sqlalchemy" in _modules_loaded([*copy, "receipt", str(job), "--issue"])
