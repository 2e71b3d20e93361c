"""A receipt's end state, runs and windows agree with the log: random requeue / suspend / node-fail histories of
one job, written in both conventions the ledger holds (the Slurm hooks' ``allocation_requeued`` naming the
``next_run`` in the requeued run; the simulator's naming the ``previous_run`` in the run that follows)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.chain.canonical import format_ts
from ledger.chain.entries import ChainedEntry, Kind, make_entry
from ledger.receipts import build_receipt, runs_of

T0 = 1_762_000_000.0  # 2025-11-01
JOB = "55"
ENDS = ["COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT", "PREEMPTED"]


def _chain(entries) -> list[ChainedEntry]:
    return [ChainedEntry(seq=i + 1, entry=e, prev_hash="0" * 64, hash=f"{i + 1:064x}") for i, e in enumerate(entries)]


run_plan = st.fixed_dictionaries({
    "duration": st.integers(60, 7200),
    "gap_after": st.integers(0, 600),
    "devices": st.integers(1, 3),
    "suspend": st.one_of(st.none(), st.tuples(st.integers(1, 50), st.integers(1, 40))),  # % of the run
    "style": st.sampled_from(["hook", "sim"]),           # how a requeue of this run is written
    "state": st.sampled_from(ENDS),                      # the node's view when not requeued (or the sim's)
    "sacct": st.one_of(st.none(), st.sampled_from(ENDS + ["REQUEUED"])),  # the accounting database's word
})


def _history(plans, last_open):
    """Entries of one job's runs, and per run what the log says: (start, end or None, final state)."""
    es, truth, t = [], {}, T0
    for k, p in enumerate(plans):
        key = {"cluster": "c1", "job_id": JOB, "run": k, "node": f"n{k % 2}"}
        a, b = t, t + p["duration"]
        es.append(make_entry(Kind.ALLOCATION_STARTED, a, {"account": "acct"}, source="hook.slurm", **key))
        es += [make_entry(Kind.DEVICE_BOUND, a, {"index": i, "uuid": f"GPU-{k}-{i}"}, device=f"GPU-{k}-{i}",
                          source="hook.slurm", **key) for i in range(p["devices"])]
        if k > 0 and plans[k - 1]["style"] == "sim":  # this run is a requeue of the one before
            es.append(make_entry(Kind.ALLOCATION_REQUEUED, a, {"previous_run": k - 1, "reason": "NODE_FAIL"},
                                 source="hook.prolog", **key))
        if p["suspend"]:
            s0 = a + p["duration"] * p["suspend"][0] / 100
            es.append(make_entry(Kind.ALLOCATION_SUSPENDED, s0, {}, ts_end=s0 + p["duration"] * p["suspend"][1] / 200,
                                 source="hook.slurm", **key))
        requeued = k < len(plans) - 1
        if not requeued and last_open:
            truth[k] = (a, None, None)
            break
        state = p["state"]
        if requeued and p["style"] == "hook":  # the epilog already sees the next restart count
            es.append(make_entry(Kind.ALLOCATION_REQUEUED, b, {"reason": "requeued", "next_run": k + 1},
                                 source="hook.slurm", **key))
            state = "REQUEUED"
        es.append(make_entry(Kind.ALLOCATION_ENDED, b, {"state": state, "exit_code": 0 if state == "COMPLETED"
                                                        else 1}, source="hook.slurm", **key))
        if p["sacct"] is not None:  # job-level, recorded later: its state is the run's final word
            es.append(make_entry(Kind.ALLOCATION_ENDED, b, {"scope": "job", "state": p["sacct"]}, source="sacct",
                                 **{**key, "node": None}))
            state = p["sacct"]
        truth[k] = (a, b, state)
        t = b + p["gap_after"]
    return es, truth


@settings(max_examples=60, deadline=None)
@given(plans=st.lists(run_plan, min_size=1, max_size=4), last_open=st.booleans())
def test_receipts_hold_end_state_runs_and_windows_to_the_entries(plans, last_open):
    es, truth = _history(plans, last_open)
    chain = _chain(es)
    assert sorted(r for _c, r in runs_of(chain, JOB)) == sorted(truth)  # one receipt per run the log has
    for run, (start, end, state) in truth.items():
        b = build_receipt(chain, JOB, run)
        assert b["job"]["run"] == run
        assert b["progress"]["end_state"] == state, (run, state, b["progress"]["end_state"])
        assert b["window"]["start"] == format_ts(start)
        assert b["open"] is (end is None)
        if end is not None:
            assert b["window"]["end"] == format_ts(end)
        # work lost since the last checkpoint is a loss only of a run that did not complete
        assert (b["progress"]["lost_since_checkpoint"] is None) == (state in (None, "COMPLETED"))
        assert len(b["devices"]) == plans[run]["devices"]


def test_a_requeued_jobs_completed_rerun_says_completed():
    """The demo's job 400389: run 0 NODE_FAIL, run 1 (a requeue of it, as the simulator writes) COMPLETED."""
    plan = {"duration": 3600, "gap_after": 60, "devices": 1, "suspend": None, "style": "sim", "state": "NODE_FAIL",
            "sacct": None}
    es, truth = _history([plan, {**plan, "state": "COMPLETED"}], last_open=False)
    b = build_receipt(_chain(es), JOB, 1)
    assert b["progress"]["end_state"] == "COMPLETED" and b["progress"]["lost_since_checkpoint"] is None
    assert build_receipt(_chain(es), JOB, 0)["progress"]["end_state"] == "NODE_FAIL"
