"""Issuing receipts (``receipt_issued`` entries), verifying them by replay, issuing them in bulk
(``ipledger issue``), and writing a receipt's JSON file.

Issuing them automatically after a shipment, and replaying them all in ``ipledger verify``, is
:mod:`ledger.receipts.auto` (bound to the site's settings).

A re-issue never changes the contract a receipt was priced under when the run is billed in a month whose
statement has been exported (:mod:`ledger.chain.closed`): the receipt is recomputed under the contract its last
issue had, and the run is reported as *kept*; only ``reprice_closed`` (``ipledger issue --reprice-closed
--yes``) lets the new contract through, and the change is then booked as a correction in the next statement.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TYPE_CHECKING

from ..chain.lite import text

from ..chain.canonical import now_ts, ts_to_epoch
from ..chain.closed import ClosedMonths, read_closed
from ..chain.contracts import PINNED_DEFAULT
from ..chain.entries import ChainedEntry, Entry, Kind, make_entry
from ..base.fsmodes import RECEIPTS_DIR, RECEIPTS_FILE, make_dirs, open_subdir, write_beside
from ..method import METHOD_NAME, METHOD_VERSION
from ..chain.db import write_tx
from ..chain.store import append_in, iter_entries, lock_chain
from ..method.attribution import DEFAULT_THRESHOLDS
from ..method.carbon import CarbonSettings
from ..method.lens import LENS_METHOD_VERSIONS
from .compute import ENERGY_RECEIPT_VERSION, LensSettings, Receipt, ReceiptError, RunKey, compute_receipt
from .gather import gather

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..telemetry.sealed import DecodedSegments


@dataclass(frozen=True)
class IssueResult:
    receipt: Receipt
    status: str                   # "issued" (first), "reissued" (changed), "unchanged"
    entry: Entry | None           # the receipt_issued entry appended (None when unchanged)
    previous: ChainedEntry | None
    changes: tuple[str, ...]
    kept_months: tuple[str, ...] = ()      # exported months whose contract this issue kept (a newer one applies)
    repriced_months: tuple[str, ...] = ()  # exported months this issue repriced (reprice_closed)


def issued_entries(engine_or_conn, key: RunKey) -> list[ChainedEntry]:  # noqa: ANN001
    return [c for c in iter_entries(engine_or_conn, kinds=[Kind.RECEIPT_ISSUED], job_id=key.job_id)
            if c.entry.cluster == key.cluster and (c.entry.run or 0) == key.run]


def replay(engine: Engine, issued: ChainedEntry, sku_table: Mapping | None = None, workers: int = 1,
           carbon: CarbonSettings | None = None, decoded: DecodedSegments | None = None,
           timelines: bool = True, issued_data: Mapping | None = None) -> Receipt:
    """Recompute the receipt an issued entry names: same run, same through_seq, same contract, and the same
    method version it was issued under (1.0.0 without the lens, 1.1.0 with it at its recorded precision), and a
    receipt issued as 1.4 with its shared devices billed the whole GPU's energy, as 1.4 did.
    ``carbon`` is the site's carbon settings now: a changed intensity file shows as a changed carbon block.
    ``decoded``: verify's decoded sample blocks (the same samples, not decompressed again). ``timelines``
    False: the receipt without its devices' PDF timelines (the body, and so the hash, are the same; verify's
    replays compare hashes only). ``issued_data``: the issued entry's payload, where the caller has parsed it."""
    d = issued.entry.data if issued_data is None else issued_data
    return compute_receipt(gather(engine, issued.entry.job_id, issued.entry.run or 0, cluster=issued.entry.cluster,
                                  as_of=d["through_seq"], contract_id=d["contract"]["id"], workers=workers,
                                  contract_entry_id=_pin(d), lens_columns=issued_lens(d) is not None,
                                  decoded=decoded), sku_table,
                           thresholds=DEFAULT_THRESHOLDS if timelines else NO_TIMELINES,
                           lens=issued_lens(d), carbon=carbon,
                           energy_shares=d.get("receipt_version") != ENERGY_RECEIPT_VERSION)


# The method's thresholds without the PDF's timeline strip (timeline_bins is not hashed: the same body)
NO_TIMELINES = replace(DEFAULT_THRESHOLDS, timeline_bins=0)


def issued_lens(issued_data: Mapping) -> LensSettings | None:
    """The lens an issued receipt was computed with: None under method 1.0.0; under 1.1.0 or 1.2.0 that version at
    its recorded precision."""
    version = (issued_data.get("method") or {}).get("version")
    if version not in LENS_METHOD_VERSIONS:
        return None
    block = (issued_data.get("receipt") or {}).get("effective_compute") or {}
    return LensSettings(compute_precision=block.get("precision", "bf16"), version=version)


def _pin(issued_data: Mapping) -> str:
    """The contract_version an issued receipt was priced under, as select_contract's ``entry_id``."""
    return (issued_data.get("contract") or {}).get("entry_id") or PINNED_DEFAULT


def _closed_parts(receipt: Receipt, closed: ClosedMonths) -> list[str]:
    b = receipt.body
    w = b["window"]
    start = ts_to_epoch(w["start"])
    return closed.closed_parts(start, ts_to_epoch(w["end"]) if w.get("end") else start, b["job"].get("account"))


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = obj
    return out


def describe_changes(old: Mapping, new: Mapping) -> list[str]:
    """What a re-issue changed, in a few plain lines (figures, contract, counts of gaps and adjustments)."""
    lines = []
    for section in ("gpu_hours", "cost", "totals", "billing", "contract", "window"):
        a, b = _flat(old.get(section, {})), _flat(new.get(section, {}))
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                lines.append(f"{section}.{k}: {a.get(k)} -> {b.get(k)}")
    for section in ("unknown_intervals", "adjustments"):
        a, b = old.get(section, []), new.get(section, [])
        if a != b:
            lines.append(f"{section}: {len(a)} -> {len(b)}"
                         + (" (resolutions changed)" if section == "unknown_intervals" and len(a) == len(b) else ""))
    if old.get("ledger", {}).get("through_seq") != new.get("ledger", {}).get("through_seq"):
        lines.append(f"ledger.through_seq: {old['ledger']['through_seq']} -> {new['ledger']['through_seq']}")
    return lines


def receipt_issued_entry(r: Receipt, previous: ChainedEntry | None, changes: list[str],
                         tree_head: dict | None = None) -> Entry:
    b = r.body
    payload = {"receipt_hash": b["receipt_hash"], "through_seq": b["ledger"]["through_seq"],
               "head_hash": b["ledger"]["head_hash"],
               "contract": {"id": b["contract"]["id"], "version": b["contract"]["version"],
                            "entry_id": b["contract"]["entry_id"]},
               "method": {"name": METHOD_NAME, "version": b["method"]["version"]},
               "receipt_version": b["receipt_version"],
               "previous": None if previous is None else {"entry_id": previous.entry.entry_id,
                                                          "receipt_hash": previous.entry.data.get("receipt_hash")},
               "changes": changes,
               "issued_at": now_ts(),
               # The Merkle tree at the receipt's cut and the newest signed head (docs/proofs.md).
               "tree_head": tree_head,
               # The receipt itself travels with the entry, so readers (monthly export) need not recompute.
               "receipt": dict(b)}
    job = b["job"]
    return make_entry(Kind.RECEIPT_ISSUED, b["window"]["end"] or b["window"]["start"], payload,
                      cluster=job["cluster"], job_id=job["job_id"], run=job["run"], source="ipledger.receipt",
                      source_version=b["method"]["version"])


def issue_receipt(engine: Engine, job_id: str, run: int | None = None, *, cluster: str | None = None,
                  contract_id: str | None = None, sku_table: Mapping | None = None, workers: int = 1,
                  closed: ClosedMonths | None = None, reprice_closed: bool = False,
                  dry_run: bool = False, lens: LensSettings | None = None,
                  carbon: CarbonSettings | None = None) -> IssueResult:
    """Compute the run's receipt at the ledger head and record it, unless the last issued one is identical.

    A run billed in an exported month (``closed``; read from the ledger when None) keeps the contract of its
    last issue unless ``reprice_closed``. ``dry_run``: say what would be issued, record nothing."""
    receipt = compute_receipt(gather(engine, job_id, run, cluster=cluster, contract_id=contract_id, workers=workers,
                                     lens_columns=lens is not None), sku_table, lens=lens, carbon=carbon)
    job = receipt.body["job"]
    key = RunKey(job["cluster"], job["job_id"], job["run"])
    prior = issued_entries(engine, key)
    previous = prior[-1] if prior else None
    kept: tuple[str, ...] = ()
    repriced: tuple[str, ...] = ()
    if previous is not None and previous.entry.data.get("receipt_hash") != receipt.hash \
            and _pin(previous.entry.data) != (receipt.body["contract"]["entry_id"] or PINNED_DEFAULT):
        months = tuple(_closed_parts(receipt, read_closed(engine) if closed is None else closed))
        if months and reprice_closed:
            repriced = months
        elif months:  # an exported month: the terms its statement was computed under stay
            kept = months
            receipt = compute_receipt(gather(engine, job_id, key.run, cluster=key.cluster, workers=workers,
                                             contract_entry_id=_pin(previous.entry.data),
                                             lens_columns=lens is not None), sku_table, lens=lens, carbon=carbon)
    if previous is not None and previous.entry.data.get("receipt_hash") == receipt.hash:
        return IssueResult(receipt, "unchanged", None, previous, (), kept)
    if dry_run:
        return IssueResult(receipt, "issued" if previous is None else "reissued", None, previous, (), kept, repriced)
    changes: list[str] = []
    if previous is not None:
        try:
            changes = describe_changes(replay(engine, previous, sku_table, workers, carbon).body, receipt.body)
        except ReceiptError as exc:  # pragma: no cover - the previous inputs are still in the ledger
            changes = [f"previous receipt could not be replayed: {exc}"]
    from ..chain import heads   # signed heads: only where a receipt is issued, not where one is shown

    with engine.connect() as conn:
        tree_head = heads.tree_head_at(conn, receipt.body["ledger"]["through_seq"])
    entry = receipt_issued_entry(receipt, previous, changes, tree_head)
    with write_tx(engine) as conn:
        # Look again under the chain lock: another shipper may have issued this very receipt since the read
        # above, and two issues of one receipt differ only in issued_at, so the ledger would keep both.
        lock_chain(conn)
        latest = issued_entries(conn, key)
        if latest and latest[-1].entry.data.get("receipt_hash") == receipt.hash:
            return IssueResult(receipt, "unchanged", None, latest[-1], (), kept)
        append_in(conn, [entry])
    return IssueResult(receipt, "issued" if previous is None else "reissued", entry, previous, tuple(changes),
                       kept, repriced)


def verify_receipt(engine: Engine, job_id: str, run: int | None = None, *, cluster: str | None = None,
                   sku_table: Mapping | None = None, workers: int = 1,
                   carbon: CarbonSettings | None = None) -> tuple[bool, ChainedEntry, Receipt]:
    """Replay the latest issued receipt of the run; True when the recomputed hash equals the recorded one."""
    from .gather import pick_run, runs_of_job

    with engine.connect() as conn:
        key = pick_run(runs_of_job(conn, str(job_id), None), str(job_id), run, cluster)
    prior = issued_entries(engine, key)
    if not prior:
        raise ReceiptError(f"job {job_id} run {key.run}: no receipt has been issued (use --issue first)")
    r = replay(engine, prior[-1], sku_table, workers, carbon)
    return r.hash == prior[-1].entry.data.get("receipt_hash"), prior[-1], r


# --- bulk issuing ------------------------------------------------------------------------------------------

@dataclass
class IssueSummary:
    """What a bulk issue did: counts per outcome, and every run that failed with its one-line reason."""

    issued: int = 0
    reissued: int = 0
    unchanged: int = 0
    failed: list[tuple[RunKey, str]] = field(default_factory=list)
    kept: list[tuple[RunKey, tuple[str, ...]]] = field(default_factory=list)  # exported months' contract kept
    repriced: list["Repriced"] = field(default_factory=list)  # exported months' receipts the new contract changed

    @property
    def runs(self) -> int:
        return self.issued + self.reissued + self.unchanged + len(self.failed)

    def to_json(self) -> dict:
        return {"runs": self.runs, "issued": self.issued, "reissued": self.reissued, "unchanged": self.unchanged,
                "failed": [{"cluster": k.cluster, "job_id": k.job_id, "run": k.run, "error": e}
                           for k, e in self.failed],
                "kept_contract": [{"cluster": k.cluster, "job_id": k.job_id, "run": k.run, "months": list(m)}
                                  for k, m in self.kept],
                "repriced": [r.to_json() for r in self.repriced]}


@dataclass(frozen=True)
class Repriced:
    """A receipt of an exported month that a newer contract changes: its billed amount before and after."""

    key: RunKey
    months: tuple[str, ...]
    tenant: str | None
    before: str   # billed after adjustments, cents, as text
    after: str
    currency: str

    def to_json(self) -> dict:
        return {"cluster": self.key.cluster, "job_id": self.key.job_id, "run": self.key.run, "months": list(self.months),
                "tenant": self.tenant, "before": self.before, "after": self.after, "currency": self.currency}


def _billed(body: Mapping) -> str:
    return f"{Decimal(str(body['cost']['billed_after_adjustments'])).quantize(Decimal('0.01'))}"


@dataclass(frozen=True)
class RunSpan:
    key: RunKey
    start: float
    end: float | None  # None: no allocation_ended yet (open)


def run_spans(engine: Engine, after_seq: int = 0) -> list[RunSpan]:
    """Every run with an ``allocation_started`` (its first start, its last end), in (cluster, job, run)
    order; with ``after_seq``, only runs that have an entry after that sequence number."""
    sql = text("SELECT cluster, job_id, run, kind, ts, seq FROM entries WHERE kind IN (:s, :e) "
               "AND job_id IS NOT NULL")
    starts: dict[RunKey, float] = {}
    ends: dict[RunKey, float] = {}
    touched: set[RunKey] = set()
    with engine.connect() as conn:
        for cluster, job_id, run, kind, ts, seq in conn.execute(
                sql, {"s": Kind.ALLOCATION_STARTED, "e": Kind.ALLOCATION_ENDED}):
            key = RunKey(cluster, str(job_id), int(run or 0))
            t = ts_to_epoch(ts)
            if seq > after_seq:
                touched.add(key)
            if kind == Kind.ALLOCATION_STARTED:
                starts[key] = min(t, starts.get(key, t))
            else:
                ends[key] = max(t, ends.get(key, t))
    keys = sorted((k for k in starts if not after_seq or k in touched),
                  key=lambda k: (str(k.cluster), k.job_id, k.run))
    return [RunSpan(k, starts[k], ends.get(k)) for k in keys]


def runs_to_issue(engine: Engine, period: tuple[float, float] | None = None, include_open: bool = False,
                  after_seq: int = 0) -> list[RunKey]:
    """Closed runs (and open ones with ``include_open``) whose window ``[start, end)`` overlaps ``period``
    (``[lo, hi)`` in epoch seconds, e.g. a billing month; every run when None; an open run's window runs to
    now)."""
    lo, hi = period if period is not None else (None, None)
    out = []
    for sp in run_spans(engine, after_seq):
        if sp.end is None and not include_open:
            continue
        if lo is not None:
            end = sp.end if sp.end is not None else float("inf")
            if not (sp.start < hi and (end > lo or (end == sp.start and sp.start >= lo))):
                continue
        out.append(sp.key)
    return out


def issue_runs(engine: Engine, keys: Iterable[RunKey], *, sku_table: Mapping | None = None,
               progress: Callable[[int, int], None] | None = None, reprice_closed: bool = False,
               dry_run: bool = False, lens: LensSettings | None = None,
               carbon: CarbonSettings | None = None) -> IssueSummary:
    """Issue (or re-issue where changed) the receipt of each run; a run that cannot be computed is counted
    as failed with its reason and does not stop the others. Idempotent: a second pass issues nothing.
    Exported months keep their contract unless ``reprice_closed`` (see the module doc); ``dry_run`` records
    nothing and says what would be issued."""
    keys = list(keys)
    out = IssueSummary()
    closed = read_closed(engine)
    for n, key in enumerate(keys, start=1):
        try:
            res = issue_receipt(engine, key.job_id, key.run, cluster=key.cluster, sku_table=sku_table,
                                closed=closed, reprice_closed=reprice_closed, dry_run=dry_run, lens=lens,
                                carbon=carbon)
        except ReceiptError as exc:
            out.failed.append((key, str(exc)))
        except Exception as exc:  # noqa: BLE001 - one bad run must not stop the others (as auto_issue)
            out.failed.append((key, f"{type(exc).__name__}: {exc}"))
        else:
            setattr(out, res.status, getattr(out, res.status) + 1)
            if res.kept_months:
                out.kept.append((key, res.kept_months))
            if res.repriced_months and res.previous is not None:
                old = res.previous.entry.data.get("receipt") or replay(engine, res.previous, sku_table, carbon=carbon).body
                out.repriced.append(Repriced(key, res.repriced_months, res.receipt.body["job"].get("account"),
                                             _billed(old), _billed(res.receipt.body),
                                             res.receipt.body["cost"]["currency"]))
        if progress:
            progress(n, len(keys))
    return out


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A file name from a name in the ledger: only [A-Za-z0-9._-], never empty, never starting with a dot
    (so never ``.`` or ``..``), bounded in length."""
    name = _SAFE.sub("_", text)[:120]
    return "_" + name[1:] if not name or name.startswith(".") else name


def write_receipt_files(receipt: Receipt, receipts_dir: str | Path) -> Path:
    """``DIR/<account>/<cluster>-<job>-<run>.json`` (one directory per account, names made path-safe).

    The names come from the ledger (an account is whatever Slurm said), so they are made safe, and every
    open is relative to a directory descriptor without following links: a link planted in the receipts
    directory cannot turn a root shipper's write into a write elsewhere."""
    job = receipt.body["job"]
    acct = safe_name(str(job.get("account") or "unknown-account"))
    name = safe_name(f"{job.get('cluster') or 'cluster'}-{job['job_id']}-{job['run']}") + ".json"
    make_dirs(receipts_dir, RECEIPTS_DIR)  # receipts name users, accounts and nodes: not for every local user
    top = os.open(receipts_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sub = open_subdir(top, acct, RECEIPTS_DIR)
        try:
            data = json.dumps(receipt.body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            write_beside(sub, name, data.encode("utf-8"), RECEIPTS_FILE)
        finally:
            os.close(sub)
    finally:
        os.close(top)
    return Path(receipts_dir) / acct / name
