"""One site, one set of settings: ``ipledger --config X`` governs shipping, automatic receipts, issuing and verify.

The site here overrides the H100's TDP in ``[skus]`` under a contract that prices energy by TDP, so the SKU
table a receipt is priced under shows in its hash: the automatically issued receipt, ``receipt --issue`` and
``verify``'s replay must all use the site's table (before the Site value, the first and the last used the
built-in one and ignored ``--config``).
"""

from __future__ import annotations

import json

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.base.config import load
from ledger.chain.contracts import contract_entry, parse_contract
from ledger.chain.entries import Kind, make_entry
from ledger.method.skus import builtin_table
from ledger.receipts import receipt_for
from ledger.ingest.site import Site, site_from_config

CONTRACT = {"id": "energy", "version": "1", "currency": "USD", "effective_from": "2026-10-01T00:00:00Z",
            "skus": {"H100-SXM5-80GB": {"capex_price": "24000", "capex_years": 4, "energy_price_per_kwh": "0.50"}}}
SITE_TDP_W = 350.0  # the built-in H100-SXM5-80GB row says 700 W


def _spool_job(sp, job: str = "81") -> None:
    key = dict(cluster="c1", job_id=job, run=0, node="n01")
    spool.write(sp, [
        make_entry(Kind.ALLOCATION_STARTED, "2026-11-01T10:00:00Z", {"account": "acme/physics"}, **key).to_record(),
        make_entry(Kind.DEVICE_BOUND, "2026-11-01T10:00:00Z", {"index": 0, "sku": "H100-SXM5-80GB"},
                   device="GPU-aaa", **key).to_record(),
        make_entry(Kind.ALLOCATION_ENDED, "2026-11-01T12:00:00Z", {"exit_code": 0}, **key).to_record()])


def _record_contract(url: str) -> None:
    """The site's contract, recorded as an operator does (a spool carries observations only)."""
    engine = db_mod.make_engine(url)
    try:
        store.append(engine, [contract_entry(parse_contract(CONTRACT, "test contract"), "2026-10-01T00:00:00Z")])
    finally:
        engine.dispose()


def _site_config(tmp_path, receipts_dir) -> tuple:  # noqa: ANN001
    """A config file naming its own database, spool and receipts directory (no environment to fall back on)."""
    db, sp = tmp_path / "site.db", tmp_path / "site-spool"
    cfg = tmp_path / "site.toml"
    cfg.write_text(f'db = "sqlite:///{db}"\nspool = "{sp}"\nreceipts_dir = "{receipts_dir}"\n\n'
                   f'[skus.H100-SXM5-80GB]\ntdp_w = {SITE_TDP_W}\n', encoding="utf-8")
    return cfg, f"sqlite:///{db}", sp


def test_config_x_governs_ship_automatic_receipts_issue_and_verify(runner, cli, tmp_path):
    receipts_dir = tmp_path / "receipts"
    cfg, url, sp = _site_config(tmp_path, receipts_dir)
    env = {"IPLEDGER_CONFIG": "", "IPLEDGER_DB": "", "IPLEDGER_SPOOL": "", "IPLEDGER_RECEIPTS_DIR": "",
           "IPLEDGER_AUTO_RECEIPTS": ""}
    assert runner.invoke(cli, ["--config", str(cfg), "init"], env=env).exit_code == 0
    _record_contract(url)
    _spool_job(sp)
    r = runner.invoke(cli, ["--config", str(cfg), "ship", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["after_errors"] == []

    # the shipper wrote the receipt where X says, priced under X's SKU table
    written = json.loads((receipts_dir / "acme_physics" / "c1-81-0.json").read_text(encoding="utf-8"))
    engine = db_mod.make_engine(url)
    try:
        site = site_from_config(load(str(cfg), {}))
        assert site.sku_table["H100-SXM5-80GB"].tdp_w == SITE_TDP_W
        by_site = receipt_for(engine, "81", sku_table=site.sku_table)
        by_builtin = receipt_for(engine, "81", sku_table=builtin_table())
    finally:
        engine.dispose()
    assert by_site.hash != by_builtin.hash, "the override must show in the receipt, or this test proves nothing"
    assert written["receipt_hash"] == by_site.hash

    # receipt --issue of the same run: the very receipt the shipper issued, so nothing new is recorded
    r = runner.invoke(cli, ["--config", str(cfg), "receipt", "81", "--issue", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["receipt_hash"] == written["receipt_hash"]
    assert f"unchanged: {by_site.hash}" in r.stderr
    r = runner.invoke(cli, ["--config", str(cfg), "log", "--json", "--kind", "receipt_issued"], env=env)
    assert [e["payload"]["receipt_hash"] for e in json.loads(r.output)] == [by_site.hash]

    # verify replays it under the same table
    r = runner.invoke(cli, ["--config", str(cfg), "verify", "--json"], env=env)
    assert r.exit_code == 0 and json.loads(r.output)["ok"], r.output


def test_a_failed_automatic_receipt_fails_ship_and_says_why(runner, cli, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")  # receipts_dir names a file: writing the receipt's JSON fails
    cfg, url, sp = _site_config(tmp_path, blocker)
    env = {"IPLEDGER_CONFIG": "", "IPLEDGER_DB": "", "IPLEDGER_SPOOL": "", "IPLEDGER_AUTO_RECEIPTS": ""}
    assert runner.invoke(cli, ["--config", str(cfg), "init"], env=env).exit_code == 0
    _record_contract(url)
    _spool_job(sp, "82")
    r = runner.invoke(cli, ["--config", str(cfg), "ship", "--json"], env=env)
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["appended"] == 3, "the entries are in the ledger all the same"
    assert len(report["after_errors"]) == 1 and "job 82 run 0" in report["after_errors"][0]
    assert "ipledger: automatic receipt for job 82 run 0" in r.stderr and str(blocker) in r.stderr
    assert not spool.pending_files(sp)


def test_automatic_receipts_off_by_config_or_environment(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("auto_receipts = false\n", encoding="utf-8")
    assert not site_from_config(load(str(cfg), {})).auto_receipts
    empty = tmp_path / "empty.toml"
    empty.write_text("", encoding="utf-8")
    plain = load(str(empty), {})
    assert site_from_config(plain, environ={}).auto_receipts
    assert not site_from_config(plain, environ={"IPLEDGER_AUTO_RECEIPTS": "0"}).auto_receipts
    assert Site(db="sqlite://", spool=str(tmp_path)).sku_table == builtin_table()


def test_receipt_workers_are_the_sites_policy(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("", encoding="utf-8")
    plain = load(str(cfg), {})
    assert site_from_config(plain, environ={}).receipt_workers == 1, "a library caller stays in-process"
    assert site_from_config(plain, environ={"IPLEDGER_RECEIPT_WORKERS": "3"}).receipt_workers == 3
    assert site_from_config(plain, environ={"IPLEDGER_RECEIPT_WORKERS": "1"}, main_program=True).receipt_workers == 1
    assert 1 <= site_from_config(plain, environ={}, main_program=True).receipt_workers <= 8
