"""Receipt work bound to a site: issuing receipts after a shipment, and replaying every issued one in verify.

Both price under the site's SKU table (its ``[skus]`` overrides included), the same table ``ipledger receipt
--issue`` uses, so an automatically issued receipt and a hand-issued one of the same run have the same hash.
"""

from __future__ import annotations

import logging
from functools import partial

from sqlalchemy.engine import Engine

from ..entries import Entry, Kind
from ..heads import check_tree
from ..site import Site
from ..store import iter_entries
from ..telemetry.store import check_segment_digests
from ..telemetry.derived import check_device_hours
from ..verify import ChainProblem, ExtraCheck, VerifyReport
from .issue import issue_receipt, replay, write_receipt_files

log = logging.getLogger("ipledger.receipts")


def issue_ended_runs(engine: Engine, shipped: list[Entry], site: Site) -> list[str]:
    """Issue the receipt of every run whose ``allocation_ended`` is among ``shipped``; the failures, one line each.

    With the site's ``receipts_dir`` the JSON is also written there, a directory per account. One run that
    fails does not stop the others.
    """
    ended = sorted({(e.cluster, e.job_id, e.run or 0) for e in shipped
                    if e.kind == Kind.ALLOCATION_ENDED and e.job_id is not None}, key=str)
    errors = []
    for cluster, job_id, run in ended:
        try:
            res = issue_receipt(engine, job_id, run, cluster=cluster, sku_table=site.sku_table)
            if site.receipts_dir:
                write_receipt_files(res.receipt, site.receipts_dir)
        except Exception as exc:  # noqa: BLE001 - any failure is reported; the shipment itself has committed
            errors.append(f"automatic receipt for job {job_id} run {run} (cluster {cluster or '-'}) failed: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            log.warning("%s", errors[-1])
    return errors


def after_ship_steps(site: Site) -> list:
    """What a shipper of this site does once entries are committed: automatic receipts, unless turned off."""
    return [partial(issue_ended_runs, site=site)] if site.auto_receipts else []


def check_issued_receipts(engine: Engine, report: VerifyReport, site: Site | None = None) -> list[ChainProblem]:
    """Every issued receipt recomputes, under the site's SKU table, to the hash it recorded."""
    skus = None if site is None else site.sku_table
    problems = []
    for ce in iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]):
        try:
            r = replay(engine, ce, skus)
        except Exception as exc:  # noqa: BLE001 - whatever stops a replay (a damaged block too) is a named problem
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id, f"issued receipt cannot be replayed: {exc}"))
            continue
        if r.hash != ce.entry.data.get("receipt_hash"):
            problems.append(ChainProblem(ce.seq, ce.entry.entry_id,
                                         f"issued receipt {ce.entry.data.get('receipt_hash')} replays as {r.hash}"))
    return problems


def verify_checks(site: Site | None = None) -> tuple[ExtraCheck, ...]:
    """The checks ``ipledger verify`` runs after the chain: telemetry evidence, issued receipts replayed under
    ``site``'s SKU table (None: the built-in table, for a ledger with no site overrides), then the Merkle tree
    and the signed heads recorded in the ledger."""
    return (check_segment_digests, partial(check_issued_receipts, site=site), check_tree, check_device_hours)
