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

The block is the tenant's verifier's (:func:`ledger.proofcheck.progress_block`, under this package's XID
table), so the ledger and the verifier write it with one piece of code.
"""

from __future__ import annotations

from typing import Any, Sequence

from .. import proofcheck as plain
from ..chain.entries import ChainedEntry
from ..method.attribution import seconds_to_nanohours
from ..method.evidence import xid_classes
from ..proofcheck import SAVED_MARKS as SAVED  # noqa: F401  marks after which the work so far survives a failure
from ..proofcheck import cut, seconds_of


def end_state(entries: Sequence[ChainedEntry]) -> str | None:
    """How the run ended, as its own ``allocation_ended`` entries say: the state of the most authoritative
    source (the accounting database's, else the controller's epilog's, else a node's or reconcile's:
    ``ledger.ingest.sacct``), among equals the latest. Only a run with no recorded end that was itself requeued
    (an ``allocation_requeued`` naming a ``next_run``) is ``REQUEUED``; an ``allocation_requeued`` naming the
    ``previous_run`` says this run *is* a requeue, not how it ended. None while it runs. The one place the
    receipt reads the end state (the verifier's :func:`ledger.proofcheck.end_state`)."""
    return plain.end_state([c.entry for c in entries])


def lost_since_checkpoint(saved: Sequence[float], window: tuple[float, float], n_devices: int,
                          suspended: Sequence[tuple[float, float]] = ()) -> tuple[float | None, int]:
    """(the last saved mark inside the window, or None for the start; device-nanohours paid after it)."""
    w0, w1 = window
    frm = max((t for t in saved if w0 <= t <= w1), default=None)
    return frm, n_devices * seconds_to_nanohours(seconds_of(cut((w0 if frm is None else frm, w1), suspended)))


def progress_block(entries: Sequence[ChainedEntry], window: tuple[float, float], n_devices: int,
                   suspended: Sequence[tuple[float, float]], credit_provider_failures: bool,
                   xids: Sequence[tuple[str, float, int]] = ()
                   ) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """The receipt's ``progress`` block, and the lost span [from, to) when it is credited (else None): the
    verifier's :func:`ledger.proofcheck.progress_block` under this package's XID table.

    ``xids``: (device, t, code) raised on the run's devices in its window (``evidence.xids_raised``)."""
    return plain.progress_block([c.entry for c in entries], window, n_devices, suspended, credit_provider_failures,
                                xids, xid_classes())
