"""The receipt's ``progress`` block as properties: what was lost since the last checkpoint is exactly the paid
device-time after it, it sits beside the identity (the buckets do not move), and the contract decides whether
it is credited — never twice for seconds an unknown-interval policy already left unbilled."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.chain.contracts import contract_entry, parse_contract
from ledger.chain.entries import ChainedEntry, Kind, make_entry
from ledger.method.attribution import seconds_to_nanohours
from ledger.receipts import build_receipt
from ledger.proofcheck import cut as minus
from ledger.proofcheck import seconds_of as seconds
from ledger.receipts.progress import end_state

T0 = 1_764_590_400.0  # 2025-12-01T12:00:00Z
KEYS = {"cluster": "c1", "job_id": "77", "run": 0, "node": "n1"}


def _chain(entries) -> list[ChainedEntry]:
    return [ChainedEntry(seq=i + 1, entry=e, prev_hash="0" * 64, hash=f"{i + 1:064x}") for i, e in enumerate(entries)]


def _run(duration, n_dev, marks, state, *, loss="credit", unknown="charge", suspended=None, gap=None,
         measured=False):
    es = [contract_entry(parse_contract({"id": "k", "version": "1", "unknown_policy": unknown,
                                         "provider_failure_loss": loss,
                                         "skus": {"default": {"rate_per_gpu_hour": "3.00"}}}),
                         ts="2025-01-01T00:00:00Z"),
          make_entry(Kind.ALLOCATION_STARTED, T0, {"account": "a"}, **KEYS)]
    es += [make_entry(Kind.DEVICE_BOUND, T0, {"index": i, "uuid": f"GPU-{i}"}, device=f"GPU-{i}", **KEYS)
           for i in range(n_dev)]
    if measured:  # a DCGM job summary per device: its time is known, not unknown
        es += [make_entry(Kind.TELEMETRY_SUMMARY, T0, {"values": {"sm_util_pct_avg": 80}}, ts_end=T0 + duration,
                          device=f"GPU-{i}", **KEYS) for i in range(n_dev)]
    es += [make_entry(Kind.PROGRESS, T0 + t, {"kind": k, "step": None, "note": None}, **KEYS) for t, k in marks]
    if suspended:
        es.append(make_entry(Kind.ALLOCATION_SUSPENDED, T0 + suspended[0], {"seconds": suspended[1] - suspended[0]},
                             ts_end=T0 + suspended[1], **KEYS))
    if gap:
        es.append(make_entry(Kind.UNKNOWN_INTERVAL, T0 + gap[0], {"cause": "dcgm_timeout", "scope": "run"},
                             ts_end=T0 + gap[1], **KEYS))
    es.append(make_entry(Kind.ALLOCATION_ENDED, T0 + duration, {"state": state}, **KEYS))
    return build_receipt(_chain(es), "77")


mark_lists = st.lists(st.tuples(st.integers(0, 3600), st.sampled_from(["checkpoint", "output", "step"])),
                      max_size=6)


@settings(max_examples=80, deadline=None)
@given(duration=st.integers(60, 3600), n_dev=st.integers(1, 4), marks=mark_lists,
       state=st.sampled_from(["NODE_FAIL", "FAILED", "CANCELLED", "TIMEOUT", "COMPLETED", "PREEMPTED"]),
       loss=st.sampled_from(["credit", "charge"]), susp=st.one_of(st.none(), st.tuples(st.integers(0, 3600),
                                                                                       st.integers(1, 600))))
def test_lost_since_checkpoint_is_the_paid_time_after_the_last_saved_mark(duration, n_dev, marks, state, loss,
                                                                           susp):
    suspended = None if susp is None or susp[0] + susp[1] > duration else (susp[0], susp[0] + susp[1])
    b = _run(duration, n_dev, marks, state, loss=loss, suspended=suspended)
    p = b["progress"]
    inside = [(t, k) for t, k in marks if t <= duration]
    assert p["marks"]["count"] == len(inside) and p["end_state"] == state
    assert p["marks"]["checkpoint"] == sum(1 for _t, k in inside if k == "checkpoint")
    if state == "COMPLETED":
        assert p["lost_since_checkpoint"] is None
        assert b["billing"]["lost_since_checkpoint_credited"] == 0
        return
    saved = [t for t, k in inside if k in ("checkpoint", "output")]  # a "step" mark saves nothing
    frm = max(saved, default=0)
    lost_s = seconds(minus((frm, duration), [suspended] if suspended else []))
    lost = p["lost_since_checkpoint"]
    assert lost["gpu_hours"] == n_dev * seconds_to_nanohours(lost_s) / 1e9
    assert lost["from_basis"] == (max((k for t, k in inside if k in ("checkpoint", "output") and t == frm),
                                      default="start"))
    credited = state == "NODE_FAIL" and loss == "credit"
    assert lost["billed_as"] == ("credit" if credited else "charge")
    assert lost["provider_failure"] == ("NODE_FAIL" if state == "NODE_FAIL" else None)
    # beside the identity: the buckets still hold every paid second; only the bill moves
    paid = b["billing"]["gpu_hours_paid"]
    assert b["gpu_hours"]["unknown"] == pytest.approx(paid, abs=1e-9)
    billed = b["billing"]["gpu_hours_billed"]
    if credited:
        assert b["billing"]["lost_since_checkpoint_credited"] == lost["gpu_hours"]
        assert paid - lost["gpu_hours"] - 1e-9 <= billed <= paid - lost["gpu_hours"] + n_dev / 3600 + 1e-9
    else:
        assert b["billing"]["lost_since_checkpoint_credited"] == 0
        assert paid - 1e-9 <= billed <= paid + n_dev / 3600 + 1e-9


def test_seconds_already_unbilled_by_an_unknown_policy_are_not_credited_twice():
    # 1000 s run, checkpoint at 400: 600 s lost; a credited unknown interval covers 700..1000 already.
    b = _run(1000, 2, [(400, "checkpoint")], "NODE_FAIL", unknown="credit", gap=(700, 1000),
             measured=True)
    assert b["progress"]["lost_since_checkpoint"]["gpu_hours"] == pytest.approx(2 * 600 / 3600, abs=1e-9)
    assert b["billing"]["lost_since_checkpoint_credited"] == pytest.approx(2 * 300 / 3600, abs=1e-9)
    # billed time is rounded up to whole seconds per device (nanohour remainders can tip it by one)
    assert 2 * 400 / 3600 - 1e-9 <= b["billing"]["gpu_hours_billed"] <= 2 * 401 / 3600 + 1e-9


def test_dcgm_s_count_of_xids_alone_is_not_a_provider_failure():
    # DCGM's "Critical XID Errors" counts XIDs of any class (a device assert in the user's kernel too) and
    # names none: listed as evidence, never provider-side on its own (docs/method.md).
    es = _chain([make_entry(Kind.ALLOCATION_STARTED, T0, {}, **KEYS),
                 make_entry(Kind.TELEMETRY_SUMMARY, T0, {"values": {"xid_errors": 1}}, ts_end=T0 + 60,
                            device="GPU-0", **KEYS),
                 make_entry(Kind.ALLOCATION_ENDED, T0 + 60, {"state": "FAILED"}, **KEYS)])
    from ledger.method.evidence import provider_failure
    from ledger.receipts.progress import progress_block

    assert provider_failure(end_state(es), []) is None
    assert provider_failure(end_state(es), [("GPU-0", T0 + 5, 79)]) == "xid"
    assert provider_failure("COMPLETED", [("GPU-0", T0 + 5, 79)]) is None
    block, credited = progress_block(es, (T0, T0 + 60), 1, [], True)
    assert credited is None and block["lost_since_checkpoint"]["provider_failure"] is None
    assert {"what": "dcgm_critical_xid_errors", "value": 1, "controlled_by": "vendor_tool",
            "provider_side": False} in block["lost_since_checkpoint"]["evidence"]


def test_end_state_prefers_requeue_and_is_none_while_running():
    started = make_entry(Kind.ALLOCATION_STARTED, T0, {}, **KEYS)
    assert end_state(_chain([started])) is None
    requeued = make_entry(Kind.ALLOCATION_REQUEUED, T0 + 5, {"next_run": 1}, **KEYS)
    ended = make_entry(Kind.ALLOCATION_ENDED, T0 + 5, {"state": "REQUEUED"}, **KEYS)
    assert end_state(_chain([started, requeued, ended])) == "REQUEUED"
    reconciled = make_entry(Kind.ALLOCATION_ENDED, T0 + 9, {"state": "NODE_FAIL", "cause": "epilog_missing"}, **KEYS)
    assert end_state(_chain([started, reconciled])) == "NODE_FAIL"
