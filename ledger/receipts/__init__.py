"""Receipts: a pure function of (ledger entries through seq N, contract version, method version).

Public API (other areas build on these; docs/receipts.md describes the JSON)::

    from ledger.receipts import receipt_for, issue_receipt, verify_receipt, render_text, render_pdf

    r = receipt_for(engine, "4242", run=None, cluster=None, as_of=None, contract_id=None)  # -> Receipt
    r.body            # the receipt JSON (dict), docs/receipts.md keys; r.hash == r.body["receipt_hash"]
    r.canonical()     # canonical JSON text (what receipt_hash is taken over, minus the hash field)
    render_text(r)    # terminal layout;  render_pdf([r, ...], "out.pdf")  # one page per run
    res = issue_receipt(engine, "4242", run=0)   # records receipt_issued; res.status issued|reissued|unchanged
    ok, issued_entry, recomputed = verify_receipt(engine, "4242", run=0)
    write_receipt_files(r, receipts_dir)         # DIR/<account>/<cluster>-<job>-<run>.json

    # lower level, no database:
    inputs = gather(engine, job_id, run, as_of=SEQ)   # from ledger.receipts.gather import gather   # RunInputs (entries, gaps, contract, samples)
    r = compute_receipt(inputs, sku_table)            # pure
    build_receipt(entries, job_id, run=None)          # from an in-memory list of ChainedEntry (no samples);
                                                      # returns the body dict (kept for the demo)

Issuing receipts after a shipment, and the ``ipledger verify`` check that replays every issued receipt, are
:mod:`ledger.receipts.auto`, bound to a :class:`ledger.ingest.site.Site` (its SKU table and receipts directory).
Errors the user can fix raise :class:`ReceiptError` (one line).

May import: `ledger.proofcheck`, `ledger.base`, `ledger.chain`, `ledger.method`, `ledger.telemetry`,
`ledger.ingest`.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from typing import TYPE_CHECKING, Iterable

from ..chain.entries import ChainedEntry, Kind

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from .compute import LensSettings, Receipt

# The names this package re-exports, by the module that defines them: imported when first used (PEP 562), so a
# caller of one light submodule (`ledger.receipts.progress`, which `account` and the agents read) does not pay
# for SQLAlchemy, the sample reader and the PDF renderer. tests/test_architecture.py holds the table to the modules.
# `gather` is not re-exported: the name is its submodule's, which the import system binds on the package.
REEXPORTS = {
    "compute": ("RECEIPT_VERSION", "LensSettings", "Receipt", "ReceiptError", "RunInputs", "RunKey",
                "compute_receipt", "receipt_hash", "run_frame"),
    "issue": ("IssueResult", "issue_receipt", "replay", "verify_receipt", "write_receipt_files"),
    "render": ("render_pdf", "render_text"),
}
_HOME = {name: mod for mod, names in REEXPORTS.items() for name in names}


def __getattr__(name: str):  # noqa: ANN202 - whatever the defining module holds
    mod = _HOME.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value

__all__ = ["RECEIPT_VERSION", "LensSettings", "Receipt", "ReceiptError", "RunInputs", "RunKey", "IssueResult", "build_receipt",
           "compute_receipt", "issue_receipt", "receipt_for", "receipt_hash", "render_pdf", "render_text",
           "replay", "run_frame", "runs_of", "verify_receipt", "write_receipt_files"]


def receipt_for(engine: Engine, job_id: str, run: int | None = None, *, cluster: str | None = None,
                as_of: int | None = None, contract_id: str | None = None, sku_table=None,  # noqa: ANN001
                workers: int = 1, lens: LensSettings | None = None, carbon=None) -> Receipt:  # noqa: ANN001
    """The receipt of one run as the ledger stands at ``as_of`` (default: now); ``lens``: method 1.1."""
    from .compute import compute_receipt
    from .gather import gather

    return compute_receipt(gather(engine, str(job_id), run, cluster=cluster, as_of=as_of,
                                  contract_id=contract_id, workers=workers, lens_columns=lens is not None),
                           sku_table, lens=lens, carbon=carbon)


def runs_of(entries: Iterable[ChainedEntry], job_id: str) -> dict[tuple[str | None, int], list[ChainedEntry]]:
    runs: dict[tuple[str | None, int], list[ChainedEntry]] = defaultdict(list)
    for ce in entries:
        if ce.entry.job_id == job_id and ce.entry.kind != Kind.RECEIPT_ISSUED:
            runs[(ce.entry.cluster, ce.entry.run or 0)].append(ce)
    return runs


def build_receipt(entries: list[ChainedEntry], job_id: str, run: int | None = None) -> dict:
    """Receipt body from an in-memory list of entries (no telemetry samples: DCGM summaries and gaps only)."""
    from .compute import ReceiptError, RunInputs, RunKey, compute_receipt

    runs = runs_of(entries, str(job_id))
    if not runs:
        raise ReceiptError(f"job {job_id}: no entries in the ledger")
    key = max(runs, key=lambda k: k[1]) if run is None else next((k for k in runs if k[1] == run), None)
    if key is None:
        raise ReceiptError(f"job {job_id}: no run {run} (runs: {sorted(k[1] for k in runs)})")
    inputs = RunInputs(
        key=RunKey(key[0], str(job_id), key[1]), entries=tuple(runs[key]),
        gaps=tuple(c for c in entries if c.entry.kind == Kind.UNKNOWN_INTERVAL and c.entry.job_id is None),
        resolutions=tuple(c for c in entries if c.entry.kind == Kind.GAP_RESOLUTION),
        contracts=tuple(c for c in entries if c.entry.kind == Kind.CONTRACT_VERSION))
    return compute_receipt(inputs).body
