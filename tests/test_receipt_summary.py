"""Summary-only runs from REAL `dcgmi stats -v -j` output (tests/fixtures/dcgmi_stats, with their sources):
the telemetry_summary payload the epilog records, priced into a receipt marked fidelity "summary"."""

from __future__ import annotations

from pathlib import Path

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.receipts import receipt_for
from ledger.capture.sources import dcgm

FIX = Path(__file__).parent / "fixtures" / "dcgmi_stats"


def _run(engine, text: str, job: str, sku: str, with_gap: bool = False):
    report = dcgm.parse_stats(text)
    block = report.blocks[0]
    key = dict(cluster="c1", job_id=job, run=0)
    uuid = f"GPU-{job}"
    payload = {"source": "dcgm_job_stats", "dcgm_gpu_id": block.gpu_id, "dcgm_job": job,
               **dcgm.summary_fields(block)}  # exactly what the epilog records (ledger/capture/hooks/core.py)
    es = [make_entry(Kind.ALLOCATION_STARTED, block.start, {"account": "acme"}, node="n1", **key),
          make_entry(Kind.DEVICE_BOUND, block.start, {"index": 0, "sku": sku}, device=uuid, node="n1", **key),
          make_entry(Kind.TELEMETRY_SUMMARY, block.start, payload, ts_end=block.end, device=uuid, node="n1", **key),
          make_entry(Kind.ALLOCATION_ENDED, block.end, {"exit_code": 0}, node="n1", **key)]
    if with_gap:  # what the epilog adds when a block measured nothing (MIG, NVIDIA/DCGM#93)
        es.append(make_entry(Kind.UNKNOWN_INTERVAL, block.start, {"cause": "dcgm_no_data", "scope": "device"},
                             ts_end=block.end, device=uuid, node="n1", **key))
    store.append(engine, es)
    return block


def test_dcgm_job_stats_summary_gives_a_summary_fidelity_receipt(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    block = _run(eng, (FIX / "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt").read_text(), "232", "NVIDIA A100-SXM4-40GB")
    b = receipt_for(eng, "232").body
    eng.dispose()
    assert b["method"]["fidelity"] == "summary" and b["devices"][0]["fidelity"] == "summary"
    gh = b["gpu_hours"]
    assert gh["paid"] == round((block.end - block.start) / 3600, 9)
    # SM utilisation 0 % with one process resident: the whole run was starved, nothing delivered
    assert gh["starved"] == gh["paid"] and gh["delivered"] == 0.0 and gh["unknown"] == 0.0


def test_a_summary_that_measured_nothing_leaves_the_run_unknown_with_its_cause(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    _run(eng, (FIX / "dcgmi_stats_j_summary_mig_a100_dcgm_issue93.txt").read_text(), "93", "NVIDIA A100-SXM4-80GB",
         with_gap=True)
    b = receipt_for(eng, "93").body
    eng.dispose()
    gh = b["gpu_hours"]
    assert gh["unknown"] == gh["paid"] > 1.7  # 6392 s
    assert b["unknown_by_cause"] == {"dcgm_no_data": gh["paid"]}
    [gap] = b["unknown_intervals"]
    assert gap["cause"] == "dcgm_no_data" and gap["policy"] == "hold"  # the default contract holds unknown time
    assert b["totals"]["before_adjustments"]["gpu_hours"] == 0.0
