"""Who controls the evidence (docs/method.md): the billed party cannot move its own bill.

Attacks as the job's user, through the real hooks (tests/test_hooks.py's stand-in dcgmi), the real node
collector (its ``dmon`` batch from the same stand-in), ``ipledger ship`` and ``ipledger receipt``, under a
contract that credits provider failures and unknown time:

* an XID the user's own code raises (a device assert: XID 13, counted in DCGM's "Critical XID Errors"), then a
  non-zero exit: billed in full;
* ``dcgmi stats --jremove`` of the run's DCGM job record from inside the job, while the node collector kept
  sampling: the samples measure the run, billed in full, and the receipt says which evidence was missing;
* the other way: a hardware XID (79) the collector saw raised during the run, then the run's failure: credited.

And the tables the rule reads, row by row: the XID catalogue classes (ledger/method/xids.toml), the causes'
parties, and that the tenant's verifier (proofcheck.py) holds the same tables.
"""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.capture import collector
from ledger import proofcheck as pc
from ledger.chain.contracts import ContractError, parse_contract
from ledger.capture.hooks import run
from ledger.method import evidence
from tests.standins import make_site
from tests.test_hooks import env

CONTRACT = """id = "acme"
version = "1"
effective_from = "2020-01-01"   # the runs below start now: the contract is in effect for them
unknown_policy = "credit"
provider_failure_loss = "credit"
{extra}
[skus.default]
rate_per_gpu_hour = "2.00"
"""

# NVIDIA's classification (xids.toml cites it row by row): the user's application can cause these ...
APPLICATION = {8, 13, 31, 43, 45}
# ... these the catalogue attributes to the GPU, its memory, bus or NVLink, or to the driver/firmware.
HARDWARE = {48, 62, 63, 64, 74, 79, 92, 94, 95}
DRIVER = {32, 119, 120}


# --- the tables ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", sorted(APPLICATION | HARDWARE | DRIVER))
def test_each_xid_row_has_its_catalogue_class_and_source(code):
    row = evidence.xid_table()[code]
    want = "application" if code in APPLICATION else "hardware" if code in HARDWARE else "driver"
    assert row["class"] == want and evidence.xid_class(code) == want
    assert row["source"].split(":")[0].split()[0] in ("xid-causes", "xid-catalog", "page-retirement")
    assert (code in evidence.provider_xids()) == (want != "application")
    if want == "application":  # the catalogue names the user's application (or its own abort) among the causes
        assert "User App" in row["source"] or "user application" in row["source"]
    else:
        assert "User App" not in row["source"].replace("not User App", "")


def test_the_table_holds_exactly_the_rows_above_and_unknown_codes_are_never_provider_evidence():
    assert set(evidence.xid_table()) == APPLICATION | HARDWARE | DRIVER
    assert evidence.xid_class(999) == "unclassified" and 999 not in evidence.provider_xids()
    assert evidence.provider_failure("FAILED", [("GPU-0", 1.0, 999), ("GPU-0", 2.0, 13)]) is None
    assert evidence.provider_failure("FAILED", [("GPU-0", 1.0, 74)]) == "xid"
    # never the user's own end state alone; the scheduler's node failure always
    for state in ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "SIGNALED", "PREEMPTED"):
        assert evidence.provider_failure(state, []) is None
    assert evidence.provider_failure("NODE_FAIL", []) == "NODE_FAIL"


def test_a_bad_xid_table_row_is_one_line_naming_the_field():
    with pytest.raises(evidence.XidTableError, match=r"^x.toml: \[79\]\.class must be one of"):
        evidence.parse_xid_table({"79": {"text": "t", "class": "gpu", "source": "s"}}, "x.toml")
    with pytest.raises(evidence.XidTableError, match=r"\[13\]\.source is required"):
        evidence.parse_xid_table({"13": {"text": "t", "class": "application"}}, "x.toml")


def test_the_tenants_verifier_holds_the_same_tables():
    assert pc.XID_CLASS == {x: r["class"] for x, r in evidence.xid_table().items()}
    assert pc.PROVIDER_XIDS == evidence.provider_xids()
    assert pc.CAUSE_CONTROLLED_BY == dict(evidence.CAUSE_CONTROLLED_BY)
    assert pc.END_STATE_CONTROLLED_BY == dict(evidence.END_STATE_CONTROLLED_BY)
    assert set(evidence.CAUSE_CONTROLLED_BY.values()) <= set(evidence.PARTIES) == set(pc.PARTIES)


def test_every_cause_the_hooks_derive_from_dcgm_has_a_party():
    from ledger.capture.sources.observed import _DCGM_CAUSES

    for cause in (*_DCGM_CAUSES.values(), "dcgm_error", "dcgm_host_engine_restart", "dcgm_watch_not_started",
                  "dcgm_device_missing", "dcgm_watch_late", "dcgm_stopped_early", "prolog_missing"):
        assert cause in evidence.CAUSE_CONTROLLED_BY, cause
        if cause.startswith("dcgm_"):
            assert evidence.rests_on_dcgm_job_record(cause, "ipledger.derive")
            assert not evidence.rests_on_dcgm_job_record(cause, "collector")  # a collector's own gap stays


codes = st.sampled_from([0.0, 13.0, 48.0, 79.0, None, math.nan])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40).map(float), codes), max_size=12), st.randoms(use_true_random=False))
def test_xids_raised_are_changes_of_the_gauge_in_any_order(samples, rnd):
    got = evidence.xids_raised(samples)
    shuffled = list(samples)
    rnd.shuffle(shuffled)
    assert evidence.xids_raised(shuffled) == got == pc.xids_raised(shuffled)
    measured = [(t, int(x)) for t, x in samples if x is not None and x == x]
    for t, code in got:
        assert code > 0 and (t, code) in measured
        assert any(t2 < t and x2 != code for t2, x2 in measured)  # something else was shown before it
    for code in {x for _t, x in measured if x > 0} - {c for _t, c in got}:
        # never counted: the code was shown from the first measured instant on (left over from before the run)
        first_other = min((t for t, x in measured if x != code), default=None)
        assert first_other is None or all(t <= first_other for t, x in measured if x == code)


def test_user_caused_unknown_is_charge_or_hold_never_credit():
    base = {"id": "k", "version": "1"}
    assert parse_contract(base).user_caused_unknown == "charge"
    assert parse_contract({**base, "user_caused_unknown": "hold"}).to_payload()["user_caused_unknown"] == "hold"
    assert "user_caused_unknown" not in parse_contract(base).to_payload()  # recorded versions keep their bytes
    with pytest.raises(ContractError, match=r"^c\.toml: user_caused_unknown must be one of charge, hold, got 'credit'$"):
        parse_contract({**base, "user_caused_unknown": "credit"}, "c.toml")


# --- the attacks, through the hooks, the collector, ship and receipt -----------------------------------------

@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path, hooks={"gap_tolerance_s": 15.0}, timeout=5.0)


def _job(site, tmp_path, runner, cli, *, exit_code="1:0", during=None, dmon_xid=None, extra=""):
    """Prolog, ``during()`` (the job's user at work) while the node collector takes its batch (0.1 s ticks;
    dmon field 230 per ``dmon_xid``: GPU id -> [tick, code]), a 2 s run, epilog (exit ``exit_code``); ship; the
    receipt as JSON and as text."""
    start = time.time()
    assert run("prolog", env("77", gpus="1,2"), str(site.config)) == 0
    if during:
        during()
    if dmon_xid:
        site.control(dmon_xid=dmon_xid)
    cfg = collector.CollectorConfig(spool=str(site.spool), node="node1", source="dcgmi", interval=0.1, count=40,
                                    cluster="c1", commands={"dcgmi": str(site.bin / "dcgmi")})
    rep = collector.collect_batch(cfg, now=lambda: start)
    assert rep.error is None and rep.devices == len(site.gpus), rep
    time.sleep(max(0.0, start + 2.0 - time.time()))
    assert run("epilog", env("77", gpus="1,2", SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_EXIT_CODE2=exit_code),
               str(site.config)) == 0
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    contract = tmp_path / "acme.toml"
    contract.write_text(CONTRACT.format(extra=extra))
    for argv in (["init"], ["contract", "set", str(contract)],
                 ["--config", str(site.config), "ship", "--spool", str(site.spool)]):
        r = runner.invoke(cli, ["--db", db, *argv])
        assert r.exit_code == 0, (argv, r.output)
    r = runner.invoke(cli, ["--db", db, "receipt", "77", "--format", "json"])
    assert r.exit_code == 0, r.output
    text = runner.invoke(cli, ["--db", db, "receipt", "77"])
    assert text.exit_code == 0, text.output
    rec = json.loads(r.output)
    assert rec["method"]["fidelity"] == "samples", "the collector's samples measure the run"
    return rec, text.output


def _bound_ids(receipt) -> list[str]:
    return [str(d["index"]) for d in receipt["job"]["devices"]]


def test_an_xid_the_users_own_code_raises_then_a_failed_exit_is_billed_in_full(site, tmp_path, runner, cli):
    # the user's kernel hits a device assert on both GPUs: XID 13, which DCGM counts in the job's statistics
    rec, text = _job(site, tmp_path, runner, cli, exit_code="1:0",
                     during=lambda: site.control(xid_jobs={"77.0": [12]}), dmon_xid={"1": [8, 13], "2": [8, 13]})
    lost = rec["progress"]["lost_since_checkpoint"]
    assert rec["progress"]["end_state"] == "FAILED" and lost["provider_failure"] is None
    assert lost["billed_as"] == "charge" and rec["billing"]["lost_since_checkpoint_credited"] == 0
    ev = lost["evidence"]
    assert ev[0] == {"what": "end_state", "value": "FAILED", "controlled_by": "job_user", "provider_side": False}
    xids = [e for e in ev if e["what"] == "xid"]
    assert len(xids) == 2 and all(e["value"] == 13 and e["class"] == "application" and not e["provider_side"]
                                  for e in xids)
    # DCGM's count, read where the hooks record it (under the summary's values): 1 per GPU, and no credit
    assert {"what": "dcgm_critical_xid_errors", "value": 2, "controlled_by": "vendor_tool",
            "provider_side": False} in ev
    b = rec["billing"]
    assert b["gpu_hours_paid"] > 2 * 1.9 / 3600 and b["gpu_hours_billed"] >= b["gpu_hours_paid"] - 1e-9
    assert "XID 13 (application" in text


def test_a_hardware_xid_the_collector_saw_raised_then_the_failure_is_credited(site, tmp_path, runner, cli):
    rec, text = _job(site, tmp_path, runner, cli, exit_code="1:0",
                     during=lambda: site.control(xid_jobs={"77.0": [20]}), dmon_xid={"2": [12, 79]})
    lost = rec["progress"]["lost_since_checkpoint"]
    assert (lost["provider_failure"], lost["billed_as"]) == ("xid", "credit")
    (xid,) = [e for e in lost["evidence"] if e["what"] == "xid"]
    assert (xid["value"], xid["class"], xid["provider_side"], xid["controlled_by"]) == (79, "hardware", True,
                                                                                         "vendor_tool")
    b = rec["billing"]
    assert b["lost_since_checkpoint_credited"] == pytest.approx(lost["gpu_hours"], abs=1e-9)
    assert lost["gpu_hours"] > 2 * 1.9 / 3600  # both devices' whole run: no checkpoint was marked
    assert b["gpu_hours_billed"] <= b["gpu_hours_paid"] - lost["gpu_hours"] + 2 / 3600
    assert "XID 79 (hardware" in text


def test_removing_the_dcgm_job_record_from_inside_the_job_bills_the_collectors_samples(site, tmp_path, runner,
                                                                                         cli):
    def jremove():  # as the job's user: the host engine answers anyone who reaches it
        r = subprocess.run([str(site.bin / "dcgmi"), "stats", "--jremove", "77.0"], capture_output=True, text=True)
        assert r.returncode == 0 and "Successfully removed job 77.0" in r.stdout, r.stdout

    rec, text = _job(site, tmp_path, runner, cli, exit_code="0:0", during=jremove)
    intervals = [i for i in rec["unknown_intervals"] if i["cause"] == "dcgm_host_engine_restart"]
    assert len(intervals) == 2  # the record is gone on both GPUs: the receipt says which evidence was missing
    for i in intervals:
        assert i["replaced_by"] == "node_collector_samples" and i["gpu_hours"] == 0
        assert i["controlled_by"] == "vendor_tool"
    b = rec["billing"]
    assert rec["method"]["fidelity"] == "samples"
    assert rec["gpu_hours"]["unknown"] < 0.1 * b["gpu_hours_paid"]  # measured, not unknown (credited)
    assert b["gpu_hours_billed"] >= b["gpu_hours_paid"] - rec["gpu_hours"]["unknown"] - 1e-9 > 0
    assert "replaced by node_collector_samples" in text


@pytest.mark.parametrize("term,policy", [("", "charge"), ('user_caused_unknown = "hold"', "hold")])
def test_time_the_jobs_user_controls_is_charged_or_held_never_credited(tmp_path, runner, cli, term, policy):
    # the run's drop place could not be emptied (the hooks' cause): unknown time the job's user caused
    from ledger.chain import db as db_mod
    from ledger.chain.entries import Kind, make_entry
    from ledger.chain.store import append

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    keys = {"cluster": "c1", "job_id": "88", "run": 0, "node": "n1"}
    t0 = 1_767_225_600.0
    assert runner.invoke(cli, ["--db", url, "init"]).exit_code == 0
    contract = tmp_path / "c.toml"
    contract.write_text(CONTRACT.format(extra=term))
    assert runner.invoke(cli, ["--db", url, "contract", "set", str(contract)]).exit_code == 0
    engine = db_mod.make_engine(url)
    append(engine, [
        make_entry(Kind.ALLOCATION_STARTED, t0, {"account": "a"}, source="hook.prolog", **keys),
        make_entry(Kind.DEVICE_BOUND, t0, {"index": 0, "uuid": "GPU-a"}, device="GPU-a", source="hook.prolog",
                   **keys),
        make_entry(Kind.UNKNOWN_INTERVAL, t0 + 60, {"cause": "drop_place_over_quota", "scope": "run"}, ts_end=t0 + 3600,
                   source="hook.epilog", **keys),
        make_entry(Kind.UNKNOWN_INTERVAL, t0, {"cause": "collector_down", "scope": "run"}, ts_end=t0 + 60,
                   source="collector", **keys),
        make_entry(Kind.ALLOCATION_ENDED, t0 + 3600, {"state": "COMPLETED"}, source="hook.epilog", **keys)])
    engine.dispose()
    r = runner.invoke(cli, ["--db", url, "receipt", "88", "--format", "json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    by_cause = {i["cause"]: i for i in rec["unknown_intervals"]}
    assert (by_cause["drop_place_over_quota"]["controlled_by"], by_cause["drop_place_over_quota"]["policy"]) == ("job_user",
                                                                                                   policy)
    assert (by_cause["collector_down"]["controlled_by"], by_cause["collector_down"]["policy"]) == ("provider",
                                                                                                 "credit")
    billed = rec["billing"]["gpu_hours_billed"]
    assert billed == pytest.approx(3540 / 3600 if policy == "charge" else 0.0, abs=2 / 3600)
    assert rec["contract"].get("user_caused_unknown", "charge") == policy
    assert rec["progress"]["marks_controlled_by"] == "job_user"


def test_hooks_doctor_warns_when_the_host_engine_port_answers_on_tcp(runner, cli):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        r = runner.invoke(cli, ["hooks", "doctor", "--port", str(port)])
        assert r.exit_code == 1 and f"127.0.0.1:{port} accepts TCP connections" in r.stderr, r.output
        assert "--domain-socket" in r.stderr and "Traceback" not in r.output
    finally:
        listener.close()
    r = runner.invoke(cli, ["hooks", "doctor", "--port", str(port)])  # nothing listens there now
    assert r.exit_code == 0 and "ok: nothing answers" in r.stdout, r.output
