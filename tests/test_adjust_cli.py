"""`ipledger adjust` / `ipledger resolve` through the CLI, and receipts issued automatically after shipping."""

from __future__ import annotations

import json

import pytest

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.adjustments import AdjustmentError, parse_quantity
from ledger.chain.entries import Kind
from ledger.receipts import receipt_for
from ledger.receipts.example import example_entries, load_example


@pytest.fixture
def ex(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    info = load_example(eng, with_adjustment=False)
    eng.dispose()
    return sqlite_url, info


def test_credit_hours_and_debit_amount_are_listed_below_the_measured_lines(runner, cli, ex):
    url, _ = ex
    eng = db_mod.make_engine(url)
    before = receipt_for(eng, "7001").body
    r = runner.invoke(cli, ["--db", url, "adjust", "7001", "--credit", "0.25h", "--reason", "rack R3 cooling",
                            "--by", "ops", "--ref", "e123", "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["payload"] == {"direction": "credit", "hours": "0.25", "reason": "rack R3 cooling", "by": "ops",
                              "references": ["e123"]}
    r = runner.invoke(cli, ["--db", url, "adjust", "7001", "--run", "0", "--debit", "12.34", "--reason", "support",
                            "--by", "billing"])
    assert r.exit_code == 0 and "recorded at seq" in r.output
    after = receipt_for(eng, "7001").body
    eng.dispose()
    assert after["gpu_hours"] == before["gpu_hours"] and after["cost"]["by_bucket"] == before["cost"]["by_bucket"]
    adj = after["adjustments"]
    assert [(a["direction"], a["gpu_hours"], a["amount"]) for a in adj] == [("credit", 0.25, 0.5), ("debit", None, 12.34)]
    assert after["cost"]["adjustments"] == pytest.approx(12.34 - 0.5)
    t = after["totals"]
    assert t["before_adjustments"] == before["totals"]["after_adjustments"]
    assert t["after_adjustments"]["amount"] == pytest.approx(t["before_adjustments"]["amount"] + 11.84)
    assert t["after_adjustments"]["gpu_hours"] == pytest.approx(t["before_adjustments"]["gpu_hours"] - 0.25)
    text = runner.invoke(cli, ["--db", url, "receipt", "7001"]).output
    assert text.index("Billed before adjustments") < text.index("Adjustments") < text.index("Billed after adjustments")


@pytest.mark.parametrize("args,needle", [
    (["--credit", "1h", "--debit", "1h"], "exactly one of --credit or --debit"),
    (["--credit", "-2"], "must be a positive number"),
    (["--credit", "abc"], "expected hours like 2.5h"),
    (["--credit", "1.234"], "at most 2 decimals"),
    (["--credit", "1h", "--run", "3"], "no run 3"),
])
def test_adjust_rejects_bad_input_in_one_line(runner, cli, ex, args, needle):
    url, _ = ex
    r = runner.invoke(cli, ["--db", url, "adjust", "7001", *args, "--reason", "r", "--by", "b"])
    assert r.exit_code != 0 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_resolve_records_a_gap_resolution_that_names_the_gap(runner, cli, ex):
    url, info = ex
    r = runner.invoke(cli, ["--db", url, "resolve", info["gap_id"], "--as", "estimate", "--reason", "partial data",
                            "--by", "am", "--json"])
    assert r.exit_code == 0, r.output
    eng = db_mod.make_engine(url)
    [res] = list(store.iter_entries(eng, kinds=[Kind.GAP_RESOLUTION]))
    eng.dispose()
    assert res.entry.data["gap_id"] == info["gap_id"] and res.entry.data["resolution"] == "estimate"
    assert (res.entry.job_id, res.entry.run) == ("7001", 0)
    r = runner.invoke(cli, ["--db", url, "resolve", "nope", "--as", "credit", "--reason", "r", "--by", "b"])
    assert r.exit_code == 1 and "no unknown_interval entry with id nope" in r.output
    r = runner.invoke(cli, ["--db", url, "resolve", info["gap_id"], "--as", "hold", "--reason", "r", "--by", "b"])
    assert r.exit_code == 2  # click rejects a choice that is not a resolution


def test_parse_quantity():
    assert parse_quantity("2.5h") == ("hours", parse_quantity("2.5H")[1])
    assert parse_quantity("120.00")[0] == "amount"
    with pytest.raises(AdjustmentError):
        parse_quantity("0h")


def test_receipts_are_issued_after_the_epilog_is_shipped(runner, cli, sqlite_url, tmp_path):
    entries, samples, _ = example_entries()
    sp = tmp_path / "spool"
    spool.write(sp, [e.to_record() for e in entries])
    out = tmp_path / "receipts"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'receipts_dir = "{out}"\n')
    env = {"IPLEDGER_CONFIG": str(cfg), "IPLEDGER_SPOOL": str(sp)}
    r = runner.invoke(cli, ["--db", sqlite_url, "ship", "--json"], env=env)
    assert r.exit_code == 0, r.output
    eng = db_mod.make_engine(sqlite_url)
    issued = list(store.iter_entries(eng, kinds=[Kind.RECEIPT_ISSUED]))
    eng.dispose()
    assert len(issued) == 1 and issued[0].entry.job_id == "7001"
    f = out / "physics" / "hpc1-7001-0.json"
    body = json.loads(f.read_text())
    assert body["receipt_hash"] == issued[0].entry.data["receipt_hash"]
    # no telemetry was shipped: all of paid is unknown, and still balanced
    assert body["gpu_hours"]["unknown"] == body["gpu_hours"]["paid"] == 0.9
    # shipping again adds nothing; verify replays the issued receipt
    r = runner.invoke(cli, ["--db", sqlite_url, "verify"], env=env)
    assert r.exit_code == 0, r.output
