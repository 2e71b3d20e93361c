"""Receipt work bound to a site: issuing receipts after a shipment, and replaying every issued one in verify.

Both price under the site's SKU table (its ``[skus]`` overrides included), the same table ``ipledger receipt
--issue`` uses, so an automatically issued receipt and a hand-issued one of the same run have the same hash.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Mapping, TYPE_CHECKING


from ..chain import receipt_lines
from ..chain.entries import Entry, Kind, make_entry
from ..chain.heads import check_tree
from ..ingest.site import Site
from ..chain.store import append, iter_entries
from ..telemetry.derived import check_segments
from ..telemetry.sealed import DecodedSegments
from ..chain.verify import ChainProblem, ExtraCheck, VerifyReport
from .issue import issue_receipt, replay, write_receipt_files

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

log = logging.getLogger("ipledger.receipts")


def issue_ended_runs(engine: Engine, shipped: list[Entry], site: Site) -> list[str]:
    """Issue the receipt of every run whose ``allocation_ended`` is among ``shipped``; the failures, one line each.

    With the site's ``receipts_dir`` the JSON is also written there, a directory per account. One run that
    fails does not stop the others.
    """
    from ..ingest.ship import SHIP_SOURCE   # here: verify, which replays receipts, need not import shipping

    ended = sorted({(e.cluster, e.job_id, e.run or 0) for e in shipped
                    if e.kind == Kind.ALLOCATION_ENDED and e.job_id is not None}, key=str)
    errors = []
    failed = []
    for cluster, job_id, run in ended:
        try:
            res = issue_receipt(engine, job_id, run, cluster=cluster, sku_table=site.sku_table, lens=site.lens,
                               carbon=site.carbon)
            if site.receipts_dir:
                write_receipt_files(res.receipt, site.receipts_dir)
        except Exception as exc:  # noqa: BLE001 - any failure is reported; the shipment itself has committed
            cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            errors.append(f"automatic receipt for job {job_id} run {run} (cluster {cluster or '-'}) failed: {cause}")
            log.warning("%s", errors[-1])
            failed.append(make_entry(Kind.RECEIPT_FAILED, time.time(), {"cause": cause[:500], "step": "auto_receipt"},
                                     cluster=cluster, job_id=job_id, run=run, source=SHIP_SOURCE, recorded_at=time.time()))
    if failed:  # the ledger keeps the failure too: a run without its receipt says why
        try:
            append(engine, failed)
        except Exception as exc:  # noqa: BLE001 - the database may be what failed; the report still says so
            errors.append(f"the failures above could not be recorded in the ledger: {str(exc).splitlines()[0]}")
    return errors


def after_ship_steps(site: Site) -> list:
    """What a shipper of this site does once entries are committed: automatic receipts, unless turned off."""
    return [partial(issue_ended_runs, site=site)] if site.auto_receipts else []


def check_issued_receipts(engine: Engine, report: VerifyReport, site: Site | None = None,
                          decoded: DecodedSegments | None = None) -> list[ChainProblem]:
    """Every issued receipt recomputes, under the site's SKU table, to the hash it recorded (``decoded``: the
    sample blocks verify's segment check decoded, read from there instead of decompressed again)."""
    skus = None if site is None else site.sku_table
    carbon = None if site is None else site.carbon
    problems = []
    for ce in iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]):
        try:
            r = replay(engine, ce, skus, carbon=carbon, decoded=decoded)
        except Exception as exc:  # noqa: BLE001 - whatever stops a replay (a damaged block too) is a named problem
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id, f"issued receipt cannot be replayed: {exc}"))
            continue
        issued = ce.entry.data   # the issue's payload (the whole receipt), parsed once
        if r.hash != issued.get("receipt_hash"):
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id,
                                         f"issued receipt {issued.get('receipt_hash')} replays as {r.hash}"
                                         + intensity_change(issued.get("receipt") or {}, r.body)))
    return problems


def intensity_change(issued: Mapping, replayed: Mapping) -> str:
    """``": the carbon intensity file changed (...)"`` when the two bodies' carbon blocks name different intensity
    tables (or one has a block and the other none), else ""."""
    a, b = issued.get("carbon"), replayed.get("carbon")
    if a is None and b is None:
        return ""
    va = None if a is None else f"{a.get('zone')} {a.get('intensity_version')}"
    vb = None if b is None else f"{b.get('zone')} {b.get('intensity_version')}"
    if va == vb:
        return ""
    return f": the carbon intensity changed (issued under {va or 'no carbon settings'}, the site now has " \
           f"{vb or 'no carbon settings'})"


def check_receipt_lines(engine: Engine, report: VerifyReport) -> list[ChainProblem]:
    """Every issued receipt's flat lines (``receipt_lines``) are the ones its entry derives: none missing,
    extra or altered (ledger/chain/receipt_lines.py)."""
    with engine.connect() as conn:
        if not receipt_lines.has_table(conn):
            return []
        return [ChainProblem(seq, "", problem) for seq, problem in receipt_lines.problems(conn)]


def verify_checks(site: Site | None = None, pinned: tuple = ()) -> tuple[ExtraCheck, ...]:
    """The checks ``ipledger verify`` runs after the chain: telemetry evidence and the device-hours derived from
    it (each segment read once), issued receipts replayed under ``site``'s SKU table (None: the built-in table,
    for a ledger with no site overrides), their flat lines re-derived, then the Merkle tree and the signed heads
    recorded in the ledger (each signed by one of the ``pinned`` public keys, when given). The segment check
    keeps the sample blocks it decodes for the replays (each block decompressed once; a test holds the
    replays equal to plain ones)."""
    decoded = DecodedSegments()
    return (partial(check_segments, decoded=decoded), partial(check_issued_receipts, site=site, decoded=decoded),
            check_receipt_lines,
            partial(check_tree, pinned=pinned) if pinned else check_tree)
