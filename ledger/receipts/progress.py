"""The receipt's ``progress`` block: the run's marks, how it ended, and what a failure cost since the last one.

Pure: from the run's entries and frame. ``lost_since_checkpoint`` is the paid device-time between the last
checkpoint or accepted output (else the start) and the end of a run that did not complete: work the
application had done but not saved, so a rerun pays for it again. It sits beside the accounting identity (those
seconds stay in their buckets); the contract's ``provider_failure_loss`` says whether it is credited when the
run ended by the provider's failure, and it is charged otherwise. A provider failure needs provider-side
evidence (``ledger.method.evidence``): the scheduler's NODE_FAIL/BOOT_FAIL, or an XID of a hardware or driver
class raised on one of the run's devices during its window, as the node collector's samples show it -- never
an application XID, DCGM's bare count of XIDs, or the user's own end state. The block lists that evidence,
each piece with the party that controls it, and says that the marks are the job user's.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..accounting import end_state as accounting_end_state
from ..canonical import format_ts, ts_to_epoch
from ..entries import ChainedEntry, Kind
from ..method import nh_to_hours
from ..method.attribution import seconds_to_nh
from ..proofcheck import cut, seconds_of
from ..method.evidence import (MARKS_CONTROLLED_BY, PROVIDER_FAILURE_STATES, dcgm_xid_count, failure_evidence,
                               provider_failure)

SAVED = ("checkpoint", "output")               # marks after which the work done so far survives a failure
MAX_LISTED_OUTPUTS = 20                        # accepted outputs listed on the receipt (all are counted)


def end_state(entries: Sequence[ChainedEntry]) -> str | None:
    """How the run ended, as its own ``allocation_ended`` entries say: the state of the most authoritative
    source (the accounting database's, else the controller's epilog's, else a node's or reconcile's:
    ``ledger.accounting``), among equals the latest. Only a run with no recorded end that was itself requeued
    (an ``allocation_requeued`` naming a ``next_run``) is ``REQUEUED``; an ``allocation_requeued`` naming the
    ``previous_run`` says this run *is* a requeue, not how it ended. None while it runs. The one place the
    receipt reads the end state."""
    state, _source = accounting_end_state(c.entry for c in entries)
    if state:
        return str(state)
    requeued = any(c.entry.kind == Kind.ALLOCATION_REQUEUED and c.entry.data.get("next_run") is not None
                   for c in entries)
    return "REQUEUED" if requeued else None


def marks_of(entries: Sequence[ChainedEntry]) -> list[dict]:
    """The run's progress marks in time order: ``{"ts", "t", "kind", "step", "note"}``."""
    out = []
    for c in entries:
        if c.entry.kind != Kind.PROGRESS:
            continue
        d = c.entry.data
        out.append({"ts": c.entry.ts, "t": ts_to_epoch(c.entry.ts), "kind": d.get("kind") or "checkpoint",
                    "step": d.get("step"), "note": d.get("note")})
    return sorted(out, key=lambda m: (m["t"], m["kind"]))


def lost_since_checkpoint(saved: Sequence[float], window: tuple[float, float], n_devices: int,
                          suspended: Sequence[tuple[float, float]] = ()) -> tuple[float | None, int]:
    """(the last saved mark inside the window, or None for the start; device-nanohours paid after it)."""
    w0, w1 = window
    frm = max((t for t in saved if w0 <= t <= w1), default=None)
    return frm, n_devices * seconds_to_nh(seconds_of(cut((w0 if frm is None else frm, w1), suspended)))


def progress_block(entries: Sequence[ChainedEntry], window: tuple[float, float], n_devices: int,
                   suspended: Sequence[tuple[float, float]], credit_provider_failures: bool,
                   xids: Sequence[tuple[str, float, int]] = ()
                   ) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """The receipt's ``progress`` block, and the lost span [from, to) when it is credited (else None).

    ``xids``: (device, t, code) raised on the run's devices in its window (``evidence.xids_raised``)."""
    w0, w1 = window
    marks = [m for m in marks_of(entries) if w0 <= m["t"] <= w1]
    counts = {k: sum(1 for m in marks if m["kind"] == k) for k in ("checkpoint", "output", "step")}
    checkpoints = [m for m in marks if m["kind"] == "checkpoint"]
    outputs = [m for m in marks if m["kind"] == "output"]
    steps = [m["step"] for m in marks if m["step"] is not None]
    state = end_state(entries)
    block: dict[str, Any] = {
        "marks": {"count": len(marks), **counts},
        "first_checkpoint": checkpoints[0]["ts"] if checkpoints else None,
        "last_checkpoint": checkpoints[-1]["ts"] if checkpoints else None,
        "last_step": max(steps) if steps else None,
        "accepted_outputs": [{"ts": m["ts"], "step": m["step"], "note": m["note"]}
                             for m in outputs[-MAX_LISTED_OUTPUTS:]],
        "end_state": state,
        "lost_since_checkpoint": None,
        "marks_controlled_by": MARKS_CONTROLLED_BY,
    }
    if state is None or state == "COMPLETED":
        return block, None
    saved = [m for m in marks if m["kind"] in SAVED]
    since = saved[-1] if saved else None
    frm, lost_nh = lost_since_checkpoint([m["t"] for m in saved], window, n_devices, suspended)
    frm = w0 if frm is None else frm
    cause = provider_failure(state, xids)
    credited = cause is not None and credit_provider_failures
    dcgm_count = dcgm_xid_count(c.entry.data for c in entries if c.entry.kind == Kind.TELEMETRY_SUMMARY)
    block["lost_since_checkpoint"] = {
        "gpu_hours": nh_to_hours(lost_nh),
        "from": since["ts"] if since else format_ts(w0), "from_basis": since["kind"] if since else "start",
        "to": format_ts(w1), "provider_failure": cause, "billed_as": "credit" if credited else "charge",
        "evidence": failure_evidence(state, xids, dcgm_count),
    }
    return block, ((frm, w1) if credited else None)
