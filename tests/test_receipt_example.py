"""The worked example of docs/method.md through the real CLI: text, JSON and PDF carry the hand-computed figures;
issuing, re-issuing, verifying, and the `ipledger verify` replay check."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.receipts.example import EXPECTED_COST, EXPECTED_HOURS, load_example
from ledger.receipts.render import LINE_ORDER


@pytest.fixture
def example_db(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    info = load_example(eng)
    eng.dispose()
    return sqlite_url, info


def _json(runner, cli, url, *args):
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_json_matches_the_hand_computed_example(runner, cli, example_db):
    url, info = example_db
    rec = _json(runner, cli, url)
    assert rec["gpu_hours"] == EXPECTED_HOURS
    for k, v in EXPECTED_COST.items():
        assert rec["cost"][k] == pytest.approx(v, abs=1e-9), k
    assert rec["method"] == {"name": "ipledger-attribution", "version": "1.0.0", "fidelity": "samples",
                             "coarse_signal_gpu_hours": 0.0,
                             "thresholds": {"active_min": 0.05, "resident_fb_mib": 512.0}}
    assert rec["contract"]["id"] == "example-contract" and rec["contract"]["version"] == "1"
    assert rec["window"] == {"start": "2026-11-30T23:30:00Z", "end": "2026-12-01T00:30:00Z"}
    [gap] = rec["unknown_intervals"]
    assert gap["id"] == info["gap_id"] and gap["cause"] == "collector_down" and gap["gpu_hours"] == 0.1
    assert gap["resolution"] is None and gap["policy"] == "credit" and gap["controlled_by"] == "provider"
    assert gap["replaced_by"] is None
    assert rec["totals"] == {"before_adjustments": {"gpu_hours": 0.8, "amount": 1.6},
                             "after_adjustments": {"gpu_hours": 0.75, "amount": 1.5}}
    assert rec["receipt_hash"].startswith("sha256:") and len(rec["receipt_hash"]) == 71
    # the receipt's documented top-level keys (docs/receipts.md)
    for k in ("receipt_version", "receipt_hash", "job", "window", "contract", "method", "gpu_hours", "cost",
              "unknown_intervals", "adjustments", "ledger"):
        assert k in rec
    assert set(rec["job"]) >= {"cluster", "job_id", "run", "account", "partition", "qos", "devices"}
    assert set(rec["job"]["devices"][0]) == {"uuid", "node", "index", "sku"}
    assert rec["ledger"]["through_seq"] == store.get_head(db_mod.make_engine(url))[0]


def _doc_table():
    """The example's table as docs/method.md prints it (label -> (hours, cost))."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "method.md").read_text()
    block = text.split("<!-- example-receipt -->", 2)[1]
    rows = {}
    for line in block.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\d+\.\d{6})(?:\s+(\d+\.\d{2}))?\s*$", line)
        if m:
            rows[m.group(1).strip()] = (m.group(2), m.group(3))
    return rows


def test_text_receipt_prints_the_figures_of_docs_method_md(runner, cli, example_db):
    url, _ = example_db
    r = runner.invoke(cli, ["--db", url, "receipt", "7001"])
    assert r.exit_code == 0, r.output
    printed = {}
    for line in r.output.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\d+\.\d{6})(?:\s+(\d+\.\d{2}))?\s*$", line)
        if m:
            printed[m.group(1).strip()] = (m.group(2), m.group(3))
    doc = _doc_table()
    assert len(doc) >= 14
    for label, figures in doc.items():
        assert printed.get(label) == figures, label


def test_pdf_text_carries_the_json_figures(runner, cli, example_db, tmp_path):
    if shutil.which("pdftotext") is None:
        from tests.services import unavailable

        unavailable("pdftotext (poppler-utils) is not installed")
    url, _ = example_db
    out = tmp_path / "r.pdf"
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--format", "pdf", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes().startswith(b"%PDF")
    text = subprocess.run(["pdftotext", "-layout", str(out), "-"], capture_output=True, text=True, check=True).stdout
    rec = _json(runner, cli, url)
    info = subprocess.run(["pdfinfo", str(out)], capture_output=True, text=True, check=True).stdout  # poppler-utils
    assert re.search(r"Pages:\s+1\b", info), "one page per run"
    lines = {re.sub(r"\s{2,}", "|", ln.strip()) for ln in text.splitlines()}
    gh, cost = rec["gpu_hours"], rec["cost"]
    for key, label in LINE_ORDER:
        hours = gh["throttled"][key.split(".")[1]] if key.startswith("throttled.") else gh[key]
        assert f"{label}|{hours:.6f}|{cost['by_bucket'][key]:.2f}" in lines, label
    assert f"Paid|{gh['paid']:.6f}|{cost['paid']:.2f}" in lines
    assert f"Lost (paid - delivered)|{cost['lost']:.2f}" in lines
    assert f"{rec['totals']['after_adjustments']['gpu_hours']:.6f}" in text
    assert rec["receipt_hash"] in text and rec["ledger"]["head_hash"] in text
    assert "collector_down" in text and "goodwill for the outage" in text


def test_issue_reissue_verify_and_the_verify_check(runner, cli, example_db):
    url, info = example_db
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--issue", "--json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)  # the status line goes to stderr, so stdout stays one JSON document
    assert "issued: " + first["receipt_hash"] in r.stderr
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--issue"])
    assert "unchanged: " + first["receipt_hash"] in r.output
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--verify", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True
    # late evidence: the gap is resolved as charge -> a re-issue that says what changed
    r = runner.invoke(cli, ["--db", url, "resolve", info["gap_id"], "--as", "charge", "--reason", "tenant agreed",
                            "--by", "acct-mgr"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--issue"])
    assert "reissued: " in r.output
    assert "changed totals.before_adjustments.amount: 1.6 -> 1.8" in r.output
    eng = db_mod.make_engine(url)
    issued = list(store.iter_entries(eng, kinds=[Kind.RECEIPT_ISSUED]))
    assert len(issued) == 2 and issued[1].entry.data["previous"]["receipt_hash"] == first["receipt_hash"]
    assert issued[1].entry.data["receipt"]["receipt_hash"] == issued[1].entry.data["receipt_hash"]
    assert runner.invoke(cli, ["--db", url, "verify"]).exit_code == 0
    # a receipt_issued entry whose hash does not replay is named by `ipledger verify`
    bad = dict(issued[1].entry.data, receipt_hash="sha256:" + "0" * 64, previous=None, receipt=None)
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, "2026-12-01T00:30:00Z", bad, cluster="hpc1", job_id="7001",
                                  run=0)])
    eng.dispose()
    r = runner.invoke(cli, ["--db", url, "verify"])
    assert r.exit_code == 1 and "replays as" in r.output
    r = runner.invoke(cli, ["--db", url, "receipt", "7001", "--verify"])
    assert r.exit_code == 1 and "MISMATCH" in r.output


def test_receipt_errors_are_one_line(runner, cli, example_db):
    url, _ = example_db
    for args, needle in ([["receipt", "999"], "job 999: no entries"],
                         [["receipt", "7001", "--run", "4"], "no run 4"],
                         [["receipt", "7001", "--format", "pdf"], "--out"],
                         [["receipt", "7001", "--verify"], "no receipt has been issued"]):
        r = runner.invoke(cli, ["--db", url, *args])
        assert r.exit_code != 0 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_help_has_examples(runner, cli):
    for cmd in (["receipt"], ["contract"], ["contract", "set"], ["contract", "show"], ["adjust"], ["resolve"]):
        r = runner.invoke(cli, [*cmd, "--help"])
        assert r.exit_code == 0 and "Example:" in r.output, cmd
