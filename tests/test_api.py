"""The library's entry points (ledger.api) against the CLI, and the site's settings checked once (ledger.ingest.site).

A Python caller that builds a Site and calls ``api.ship`` → ``api.issue`` → ``api.export_month`` gets, byte for
byte, the ledger and the statement files ``ipledger ship`` → ``issue`` → ``export monthly`` make from the same
spool under the same config (the clock held still, so both record the same times).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger import api
from ledger.base.config import load
from ledger.capture import spool
from ledger.chain import db as db_mod
from ledger.chain.entries import Kind, make_entry
from ledger.ingest.site import SiteError, site_from_config

CLOCK = 1_796_200_000.0   # 2026-12-02, after the billed month
SITE_TOML = '[focus]\ninvoice_id = "INV/{YYYY}{MM}/{cluster}/{tenant}"\nauto_receipts = true\n'


def _records(job: str, account: str, hours: int) -> list[dict]:
    key = dict(cluster="c1", job_id=job, run=0, node="n01")
    return [make_entry(Kind.ALLOCATION_STARTED, "2026-11-03T10:00:00Z",
                       {"account": account, "partition": "gpu", "qos": "high"}, **key).to_record(),
            make_entry(Kind.DEVICE_BOUND, "2026-11-03T10:00:00Z", {"index": 0, "sku": "H100-SXM5-80GB"},
                       device=f"GPU-{job}", **key).to_record(),
            make_entry(Kind.ALLOCATION_ENDED, f"2026-11-03T{10 + hours:02d}:00:00Z", {"exit_code": 0},
                       **key).to_record()]


def _spool(where: Path) -> Path:
    sp = where / "spool"
    spool.write(sp, _records("71", "astro", 2))
    spool.write(sp, _records("72", "bio", 3))
    return sp


def _ledger(where: Path) -> str:
    url = f"sqlite:///{where / 'ledger.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    return url


def _rows(url: str) -> list[tuple]:
    eng = db_mod.make_engine(url, create=False)
    with eng.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text("SELECT * FROM entries ORDER BY seq"))]
    eng.dispose()
    return rows


FORMATS = {"csv": "csv", "focus": "focus.csv", "json": "json"}


def test_ship_issue_export_through_the_library_is_what_the_cli_makes(tmp_path, runner, cli, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: CLOCK)
    cfg = tmp_path / "site.toml"
    cfg.write_text(SITE_TOML)
    by_cli, by_lib = tmp_path / "cli", tmp_path / "lib"
    for d in (by_cli, by_lib):
        d.mkdir()
    cli_url, lib_url = _ledger(by_cli), _ledger(by_lib)

    env = {"IPLEDGER_SPOOL": str(_spool(by_cli)), "IPLEDGER_CONFIG": str(cfg), "IPLEDGER_RECEIPT_WORKERS": "1"}
    base = ["--config", str(cfg), "--db", cli_url]
    r = runner.invoke(cli, [*base, "ship", "--json"], env=env)
    assert r.exit_code == 0, r.output
    cli_ship = json.loads(r.output)
    r = runner.invoke(cli, [*base, "issue", "--month", "2026-11", "--json"], env=env)
    assert r.exit_code == 0, r.output
    cli_issue = json.loads(r.output)
    for fmt, ext in FORMATS.items():
        r = runner.invoke(cli, [*base, "export", "monthly", "--month", "2026-11", "--format", fmt,
                                "--out", str(by_cli / f"nov.{ext}"), "--quiet"], env=env)
        assert r.exit_code == 0, r.output

    # the library alone: no click, no AppContext; the site from the same file
    site = site_from_config(load(str(cfg), environ={"IPLEDGER_SPOOL": str(_spool(by_lib))}), db=lib_url, environ={})
    assert site.focus_invoice_scheme == "INV/{YYYY}{MM}/{cluster}/{tenant}"
    engine = db_mod.make_engine(site.db, create=False)
    lib_ship = api.ship(site, engine)
    lib_issue = api.issue(site, engine, month="2026-11")
    for fmt, ext in FORMATS.items():
        api.export_month(site, engine, "2026-11", fmt, by_lib / f"nov.{ext}")
    engine.dispose()

    assert lib_ship.to_json() == cli_ship and lib_ship.appended == 6
    assert {"month": "2026-11", "dry_run": False, **lib_issue.to_json()} == cli_issue
    rows = _rows(lib_url)
    assert rows == _rows(cli_url)
    kinds = [r[2] for r in rows]
    assert kinds.count(Kind.RECEIPT_ISSUED) == 2, "the shipment issued both receipts automatically"
    assert kinds.count(Kind.STATEMENT_EXPORTED) == 1, "the export was recorded once, whatever the formats"
    for ext in FORMATS.values():
        assert (by_lib / f"nov.{ext}").read_bytes() == (by_cli / f"nov.{ext}").read_bytes(), ext
    assert b"INV/202611/c1/astro" in (by_lib / "nov.focus.csv").read_bytes()


def test_library_ship_honours_the_sites_receipt_setting(tmp_path):
    url = _ledger(tmp_path)
    cfg = tmp_path / "site.toml"
    cfg.write_text("auto_receipts = false\n")
    site = site_from_config(load(str(cfg), environ={"IPLEDGER_SPOOL": str(_spool(tmp_path))}), db=url, environ={})
    engine = db_mod.make_engine(site.db, create=False)
    assert api.ship(site, engine).appended == 6
    engine.dispose()
    assert Kind.RECEIPT_ISSUED not in [r[2] for r in _rows(url)]


@pytest.mark.parametrize("toml, key", [
    ("[accounting]\nenabled = true\nbatch = \"many\"\n", "accounting.batch"),
    ("[accounting]\nenabled = true\nlookback_days = -1\n", "accounting.lookback_days"),
    ("[accounting]\nenabled = true\ntimeout_s = \"soon\"\n", "accounting.timeout_s"),
    ("[accounting]\nenabled = \"yes\"\n", "accounting.enabled"),
    ("accounting = 3\n", "[accounting]"),
    ("[focus]\ninvoice_id = \"{cluster}-{month}\"\n", "focus.invoice_id"),
    ("focus = \"x\"\n", "[focus]"),
    ("max_adjustment_factor = 0\n", "max_adjustment_factor"),
    ("max_adjustment_factor = \"ten\"\n", "max_adjustment_factor"),
])
def test_a_bad_setting_is_one_line_naming_the_file_and_key(tmp_path, runner, cli, toml, key):
    cfg = tmp_path / "site.toml"
    cfg.write_text(toml)
    with pytest.raises(SiteError) as err:
        site_from_config(load(str(cfg), environ={}), environ={})
    assert str(err.value).startswith(f"{cfg}: ") and key in str(err.value) and "\n" not in str(err.value)
    sp = tmp_path / "spool"
    sp.mkdir()
    r = runner.invoke(cli, ["--config", str(cfg), "--db", _ledger(tmp_path), "ship", "--spool", str(sp)])
    assert r.exit_code == 1 and r.output.strip() == f"ipledger: {err.value}", r.output


def test_the_sites_settings_are_read_once_into_the_site(tmp_path):
    cfg = tmp_path / "site.toml"
    cfg.write_text('max_adjustment_factor = 2.5\ntrusted_keys = ["k.pub"]\n[commands]\nsacct = "/usr/bin/sacct"\n'
                   '[accounting]\nbatch = 400\nlookback_days = 3\ntimeout_s = 9\n')
    site = site_from_config(load(str(cfg), environ={}), environ={})
    assert site.max_adjustment_factor == 2.5 and site.trusted_keys == (str(tmp_path / "k.pub"),)
    acct = site.accounting
    assert acct is not None and (acct.batch, acct.lookback_days, acct.timeout_s) == (400, 3.0, 9.0)
    assert acct.commands == {"sacct": "/usr/bin/sacct"}
    assert site_from_config(load(None, environ={}), environ={}).accounting is None, "no sacct, no accounting"


def test_no_cli_command_reads_the_sites_settings_from_the_raw_config():
    """The CLI passes the Site on; only the hooks' own commands ([hooks], read by the node-side code) and serve
    ([serve], the web package's settings) still read the parsed file."""
    allowed = {"hooks.py", "serve.py"}
    cli_dir = Path(__file__).parent.parent / "ledger" / "cli"
    readers = sorted(p.name for p in cli_dir.glob("*.py") if ".extra" in p.read_text() and p.name not in allowed)
    assert readers == []
