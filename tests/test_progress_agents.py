"""The agents read the application's marks: requeue_loss is the receipt's lost_since_checkpoint, explain --job
lists the marks in the job's timeline, and a "step" mark is no checkpoint."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.cli.main import cli
from ledger.chain.entries import Kind, make_entry

T0 = 1_764_590_400.0
KEYS = {"cluster": "c1", "job_id": "88", "node": "n1"}


@pytest.fixture()
def ledger_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "init"]).exit_code == 0
    es = []
    for run, (a, b, state) in enumerate([(0, 1000, "NODE_FAIL"), (1100, 2000, "COMPLETED")]):
        k = {**KEYS, "run": run}
        es.append(make_entry(Kind.ALLOCATION_STARTED, T0 + a, {"account": "acct"}, **k))
        es += [make_entry(Kind.DEVICE_BOUND, T0 + a, {"index": i, "uuid": f"GPU-{i}", "sku": "NVIDIA H100 80GB HBM3"},
                          device=f"GPU-{i}", **k) for i in range(2)]
        es.append(make_entry(Kind.ALLOCATION_ENDED, T0 + b, {"state": state}, **k))
    es += [make_entry(Kind.PROGRESS, T0 + t, {"kind": kind, "step": step, "note": None, "via": "drop"},
                      **{**KEYS, "run": 0}) for t, kind, step in [(300, "checkpoint", 10), (600, "checkpoint", 20),
                                                                  (900, "step", 30)]]
    eng = db_mod.make_engine(url)
    store.append(eng, es)
    eng.dispose()
    return url


def test_requeue_loss_is_the_receipts_lost_since_checkpoint(ledger_url):
    r = CliRunner().invoke(cli, ["--db", ledger_url, "receipt", "88", "--run", "0", "--format", "json"])
    lost = json.loads(r.output)["progress"]["lost_since_checkpoint"]
    assert lost["gpu_hours"] == pytest.approx(2 * 400 / 3600, abs=1e-9)  # the step mark at 900 saved nothing
    r = CliRunner().invoke(cli, ["--db", ledger_url, "findings", "--json"])
    assert r.exit_code == 0, r.output
    (f,) = [f for f in json.loads(r.output)["findings"] if f["kind"] == "requeue_loss"]
    assert f["gpu_hours"] == pytest.approx(lost["gpu_hours"], abs=1e-4)  # findings JSON: 4 decimals
    assert any(e["signal"] == "lost_since_checkpoint" for e in f["evidence"])


def test_explain_job_lists_the_marks_in_its_timeline(ledger_url):
    r = CliRunner().invoke(cli, ["--db", ledger_url, "explain", "--job", "88", "--json"])
    assert r.exit_code == 0, r.output
    tl = json.loads(r.output)["timeline"]
    events = [(t["run"], t["event"]) for t in tl]
    assert events[:5] == [(0, "start"), (0, "checkpoint"), (0, "checkpoint"), (0, "step"), (0, "end")]
    assert (1, "start") in events and (1, "end") in events and (0, "lost_since_checkpoint") in events
    assert [t["detail"] for t in tl if t["event"] == "checkpoint"] == ["step 10", "step 20"]
    text = CliRunner().invoke(cli, ["--db", ledger_url, "explain", "--job", "88"]).output
    assert "timeline:" in text and "checkpoint" in text and "NODE_FAIL" in text


def test_monthly_statement_sums_credited_failure_losses(ledger_url, tmp_path):
    contract = tmp_path / "c.toml"
    contract.write_text('id = "k"\nversion = "1"\nunknown_policy = "charge"\nprovider_failure_loss = "credit"\n'
                        'effective_from = 2000-01-01\n'  # the runs below started before today
                        '[skus.default]\nrate_per_gpu_hour = "2.00"\n')
    runner = CliRunner()
    assert runner.invoke(cli, ["--db", ledger_url, "contract", "set", str(contract)]).exit_code == 0
    from ledger.receipts import issue_receipt

    eng = db_mod.make_engine(ledger_url)
    for run in (0, 1):
        issue_receipt(eng, "88", run=run)
    eng.dispose()
    r = runner.invoke(cli, ["--db", ledger_url, "receipt", "88", "--run", "0", "--format", "json"])
    credited = json.loads(r.output)["billing"]["lost_since_checkpoint_credited"]
    assert credited == pytest.approx(2 * 400 / 3600, abs=1e-9)
    r = runner.invoke(cli, ["--db", ledger_url, "export", "monthly", "--month", "2025-12", "--format", "json",
                            "--out", "-", "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["totals"]["failure_loss_credited"] == pytest.approx(credited, abs=1e-6)


def test_pdf_receipt_has_the_progress_lines(ledger_url, tmp_path):
    import shutil
    import subprocess

    from tests.services import unavailable

    if shutil.which("pdftotext") is None:
        unavailable("pdftotext (poppler-utils) is not installed")
    out = tmp_path / "r.pdf"
    r = CliRunner().invoke(cli, ["--db", ledger_url, "receipt", "88", "--run", "0", "--format", "pdf",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = subprocess.run(["pdftotext", "-layout", str(out), "-"], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    assert "Application progress" in text and "end state NODE_FAIL" in text
    assert "lost since last checkpoint 0.222222 h" in text
