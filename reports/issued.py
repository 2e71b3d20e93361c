"""Issued receipts as the ledger holds them, and which of them a month's statement bills.

An issued receipt is a ``receipt_issued`` entry. If its payload carries the receipt itself (key ``receipt``,
or the receipt's own keys) that is used as is; if it carries only the hash and ``through_seq``, the receipt
is recomputed with the receipts package's public function at that ``through_seq`` (receipts are pure
functions of the ledger) and its hash compared with the issued one.

Billing rule (pure, :func:`select_month`): periods are half-open and a receipt is billed in the months of its
parts (:mod:`ledger.base.periods`: under the default ``split`` rule every month its window overlaps, each with
its share; under ``end`` the month of its last paid instant). Month ``M`` *closes* at the first ledger
entry recording a fact from after it (the lowest ``seq`` whose ``ts`` is at or after the first instant of the
next month, plus ``grace_s``; a ``statement_exported`` entry, stamped with the wall clock, does not count): the ledger's own event time is the clock, so a simulated or replayed fleet
closes its months the same way a live one does, whatever the wall clock says. The part billed in ``M`` is
that of the latest issue made before ``M`` closed, or, if every issue came later, of the first one (an
open run's receipt issued during the month is its usage accrued so far). Every later issue that changes
the receipt is a **correction** of ``M``'s part, booked in the month that was open when it was issued
(never earlier than ``M``): a row with the difference between its part of ``M`` and the part billed
before, marked ``ChargeClass=Correction`` in FOCUS. A closed month therefore never changes silently;
``--as-of SEQ`` reproduces any past export exactly.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from sqlalchemy import text

from ledger.base import periods
from .monthly import SUM_COLUMNS, Flat, epoch, flatten, month_bounds, month_of

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class Issue:
    """One issue of one run's receipt."""

    seq: int
    issued_at: float  # epoch seconds; NaN when unknown
    receipt: Mapping[str, Any]
    issued_hash: str | None = None
    replays: bool = True  # False when a recomputed receipt's hash differs from the issued one
    part: str | None = None  # the month whose part of the receipt this issue stands for (None: all of it)

    @property
    def key(self) -> tuple:
        j = self.receipt.get("job") or {}
        return (j.get("cluster"), str(j.get("job_id")), int(j.get("run") or 0))

    @property
    def receipt_hash(self) -> str | None:
        return self.receipt.get("receipt_hash") or self.issued_hash

    @property
    def tenant(self) -> str | None:
        j = self.receipt.get("job") or {}
        return j.get("account") or j.get("namespace") or j.get("tenant")

    @property
    def window_start(self) -> float:
        return epoch((self.receipt.get("window") or {}).get("start"))

    @property
    def window_end(self) -> float:
        """The window's end (its start when it has none)."""
        e = epoch((self.receipt.get("window") or {}).get("end"))
        return self.window_start if math.isnan(e) else e

    @property
    def period_rule(self) -> str:
        rule = (self.receipt.get("contract") or {}).get("period_rule")
        return rule if rule in periods.PERIOD_RULES else periods.DEFAULT_PERIOD_RULE

    @property
    def parts(self) -> list[tuple[str, float, float]]:
        """``(month, lo, hi)`` of each month this receipt is billed in (see :mod:`ledger.base.periods`)."""
        return periods.part_spans(self.window_start, self.window_end, self.period_rule,
                                  bool(self.receipt.get("open")))

    def share(self, month: str) -> "Share":
        """This receipt's part of ``month``: the whole, a weighted part, or nothing."""
        spans = self.parts
        k = next((n for n, (m, _, _) in enumerate(spans) if m == month), None)
        if k is None:
            return Share(None)
        if len(spans) == 1:
            return Share(k, (spans[k][1], spans[k][2]))
        return Share(k, (spans[k][1], spans[k][2]), tuple(periods.weights_of([(lo, hi) for _, lo, hi in spans])))

    def as_part(self, month: str) -> "Issue":
        return Issue(self.seq, self.issued_at, self.receipt, self.issued_hash, self.replays, month)


@dataclass(frozen=True)
class Share:
    """Which part of a receipt a row carries: ``index`` None = nothing; ``weights`` empty = all of it."""

    index: int | None
    span: tuple[float, float] | None = None
    weights: tuple[int, ...] = ()

    def of(self, value: float) -> float:
        if self.index is None:
            return 0.0
        return value if not self.weights else periods.split_nano(value, list(self.weights))[self.index]

    @property
    def whole(self) -> bool:
        return self.index is not None and not self.weights


CloseFn = Callable[[str], "int | None"]


def closes_from_issue_times(issues: Iterable[Issue], grace_s: float = 0.0) -> CloseFn:
    """A close function for issues held in memory: month M closes at the first issue made after it."""
    its = [(i.issued_at, i.seq) for i in issues if not math.isnan(i.issued_at)]
    cache: dict[str, int | None] = {}

    def close(month: str) -> int | None:
        if month not in cache:  # one pass per month, not per issue
            b = month_bounds(month)[1].timestamp() + grace_s
            cache[month] = min((seq for t, seq in its if t >= b), default=None)
        return cache[month]
    return close


@dataclass(frozen=True)
class IssuedSet:
    issues: list[Issue]
    through_seq: int
    head_hash: str
    not_replayed: int = 0
    close_seq: CloseFn | None = None  # month -> seq at which it closed (None: still open); see module doc

    @property
    def tenants(self) -> set[str]:
        return {i.tenant for i in self.issues if i.tenant}


def is_receipt(d: Any) -> bool:
    return isinstance(d, Mapping) and "gpu_hours" in d and "job" in d


def ledger_head(engine, through_seq: int | None) -> tuple[int, str]:  # noqa: ANN001
    """(seq, hash) of the last entry at or before ``through_seq`` (the whole ledger when None), not counting
    the exports' own records (``statement_exported``): exporting a statement again, in any format, gives the
    same cut and the same bytes."""
    from ledger.chain.entries import GENESIS_HASH

    sql = "SELECT seq, hash FROM entries WHERE kind <> 'statement_exported'" + (
        " AND seq <= :s" if through_seq is not None else "")
    with engine.connect() as conn:
        row = conn.execute(text(sql + " ORDER BY seq DESC LIMIT 1"),
                           {"s": through_seq} if through_seq is not None else {}).first()
    return (0, GENESIS_HASH) if row is None else (int(row[0]), row[1])


def ledger_closes(engine, through_seq: int, grace_s: float = 0.0) -> CloseFn:  # noqa: ANN001
    """Month -> the first seq (<= through_seq) whose entry's ``ts`` is at or after the month's end + grace."""
    cache: dict[str, int | None] = {}

    def close(month: str) -> int | None:
        if month not in cache:
            b = dt.datetime.fromtimestamp(month_bounds(month)[1].timestamp() + grace_s, tz=dt.timezone.utc)
            # ts is RFC 3339 text; comparing against the boundary without its "Z" orders sub-second
            # spellings correctly ("...00Z" and "...00.5Z" both sort after "...00").
            bound = b.strftime("%Y-%m-%dT%H:%M:%S")
            with engine.connect() as conn:
                # an export's own record (statement_exported, ts = when it was made) is no fact of the fleet
                v = conn.execute(text("SELECT MIN(seq) FROM entries WHERE ts >= :b AND seq <= :s "
                                      "AND kind <> 'statement_exported'"),
                                 {"b": bound, "s": through_seq}).scalar()
            cache[month] = None if v is None else int(v)
        return cache[month]
    return close


def _recompute(engine, pending: list[tuple[Any, dict]]) -> list[tuple[Any, dict, bool]]:  # noqa: ANN001
    """Receipts the issue entries name only by hash: rebuilt from the entries through their ``through_seq``."""
    if not pending:  # the usual case: no need to import the receipts package at all
        return []
    from ledger.receipts import receipt_for

    out = []
    for ce, p in pending:
        through = int(p.get("through_seq") or ce.seq)
        job_id = str(p.get("job_id") or ce.entry.job_id)
        run = p.get("run", ce.entry.run)
        contract = (p.get("contract") or {}).get("id")
        r = receipt_for(engine, job_id, None if run is None else int(run), cluster=ce.entry.cluster, as_of=through,
                        contract_id=contract).body
        want = p.get("receipt_hash") or p.get("hash")
        out.append((ce, r, want is None or want == r.get("receipt_hash")))
    return out


def issue_rows(engine, through_seq: int, batch: int = 10_000):  # noqa: ANN001, ANN202
    """(seq, payload text, recorded_at, ts) of every issue through ``through_seq``, in sequence order, in
    batches: only the columns the statement reads, without building an entry object per row."""
    from ledger.chain.entries import Kind

    sql = text("SELECT seq, payload, recorded_at, ts FROM entries WHERE kind = :k AND seq > :after "
               "AND seq <= :s ORDER BY seq LIMIT :lim")
    last = 0
    with engine.connect() as conn:
        while True:
            rows = conn.execute(sql, {"k": Kind.RECEIPT_ISSUED, "after": last, "s": through_seq,
                                      "lim": batch}).fetchall()
            yield rows
            if len(rows) < batch:
                return
            last = int(rows[-1][0])


def _hash_only_entries(engine, through_seq: int, seqs: set[int]) -> list:  # noqa: ANN001
    """The entries of issues that carry only a receipt's hash (rare: their receipts are recomputed)."""
    from ledger.chain import store
    from ledger.chain.entries import Kind

    return [ce for ce in store.iter_entries(engine, through_seq=through_seq, kinds=[Kind.RECEIPT_ISSUED])
            if ce.seq in seqs]


def load_issues(engine, through_seq: int | None = None,  # noqa: ANN001
                progress: ProgressFn | None = None, grace_s: float = 0.0) -> IssuedSet:
    """Every issued receipt through ``through_seq`` (default: the whole ledger), in sequence order."""
    import json

    from ledger.chain.entries import Kind

    seq, head = ledger_head(engine, through_seq)
    issues: list[Issue] = []
    pending_seqs: set[int] = set()
    n = 0
    total = 0
    if progress:
        with engine.connect() as conn:
            total = int(conn.execute(text("SELECT COUNT(*) FROM entries WHERE kind = :k AND seq <= :s"),
                                     {"k": Kind.RECEIPT_ISSUED, "s": seq}).scalar() or 0)
    loads = json.loads
    for rows in issue_rows(engine, seq):
        for entry_seq, payload, recorded_at, ts in rows:
            p = loads(payload)
            issued_at = epoch(p.get("issued_at") or recorded_at or ts)
            r = p.get("receipt")
            if is_receipt(r):
                issues.append(Issue(int(entry_seq), issued_at, r, p.get("receipt_hash")))
            elif is_receipt(p):
                issues.append(Issue(int(entry_seq), issued_at, p, p.get("receipt_hash")))
            else:
                pending_seqs.add(int(entry_seq))
        n += len(rows)
        if progress and rows:
            progress(n, total)
    pending = [(ce, ce.entry.data) for ce in _hash_only_entries(engine, seq, pending_seqs)] if pending_seqs else []
    bad = 0
    for ce, r, ok in _recompute(engine, pending):
        p = ce.entry.data
        issued_at = epoch(p.get("issued_at") or ce.entry.recorded_at or ce.entry.ts)
        issues.append(Issue(ce.seq, issued_at, r, p.get("receipt_hash") or p.get("hash"), replays=ok))
        bad += not ok
    issues.sort(key=lambda i: i.seq)
    return IssuedSet(issues=issues, through_seq=seq, head_hash=head, not_replayed=bad,
                     close_seq=ledger_closes(engine, seq, grace_s))


@dataclass(frozen=True)
class Correction:
    month: str
    new: Issue
    old: Issue


def _plan(issues: Iterable[Issue], close_seq: CloseFn) -> tuple[dict, list[Correction]]:
    """(run key, month) -> the issue whose part of that month is billed there; and every correction, each
    with the month it is booked in (its ``new``/``old`` issues stand for their part of the corrected month)."""
    by_run: dict[tuple, list[Issue]] = {}
    for i in issues:
        by_run.setdefault(i.key, []).append(i)
    billed: dict[tuple, Issue] = {}
    corrections: list[Correction] = []

    def open_month(seq: int, m: str) -> str:
        """The first month from ``m`` on that had not closed when ``seq`` was recorded."""
        for _ in range(1200):
            c = close_seq(m)
            if c is None or seq < c:
                return m
            m = month_of(month_bounds(m)[1].timestamp())
        return m

    for key, its in by_run.items():
        its.sort(key=lambda i: i.seq)
        months = sorted({m for i in its for m, _, _ in i.parts})
        for m in months:
            close = close_seq(m)
            on_time = [i for i in its if close is None or i.seq < close]
            base = on_time[-1] if on_time else its[0]
            billed[(key, m)] = base.as_part(m)
            prev = base
            later: dict[str, Issue] = {}
            for i in its:
                if i.seq > base.seq:
                    later[open_month(i.seq, m)] = i  # the last issue of each month stands for that month
            for cm in sorted(later):
                cur = later[cm]
                if cur.receipt_hash != prev.receipt_hash and (cur.share(m).index is not None
                                                              or prev.share(m).index is not None):
                    corrections.append(Correction(cm, cur.as_part(m), prev.as_part(m)))
                    prev = cur
    return billed, corrections


def select_month(issues: Iterable[Issue], month: str, close_seq: CloseFn | None = None,
                 grace_s: float = 0.0) -> tuple[list[Issue], list[Correction]]:
    """The issues billed as usage in ``month`` and the corrections booked in ``month`` (pure).

    ``close_seq`` says when each month closed (see the module doc); by default it is derived from the
    issues' own ``issued_at`` times.
    """
    month_bounds(month)  # validates
    issues = list(issues)
    billed, corrections = _plan(issues, close_seq or closes_from_issue_times(issues, grace_s))
    usage = sorted((i for (_, m), i in billed.items() if m == month and i.share(m).index is not None),
                   key=lambda i: i.seq)
    return usage, [c for c in corrections if c.month == month]


def flatten_issues(issues: list[Issue], row_kind: str = "usage",
                   replaces: list[str | None] | None = None) -> Flat:
    """:func:`reports.monthly.flatten` of the issues' receipts, each row carrying only its issue's part of
    the month it stands for (``Issue.part``); ``replaces`` fills ``replaces_hash`` row by row."""
    receipts = [i.receipt if not replaces or replaces[k] is None else dict(i.receipt, _replaces_hash=replaces[k])
                for k, i in enumerate(issues)]
    flat = flatten(receipts, row_kind)
    return apply_shares(flat, [None if i.part is None else i.share(i.part) for i in issues])


def apply_shares(flat: Flat, shares: list[Share | None]) -> Flat:
    """Scale each row's hours and money to its share (exact nano-unit parts), clamp its window to the part's
    span, scale its adjustment lines alike and keep the unknown intervals that overlap the span."""
    if all(s is None or s.whole for s in shares):
        return flat
    import numpy as np

    rows = flat.rows.copy()
    adjs = flat.adjustments.copy()
    unks = flat.unknowns
    adj_row = np.repeat(np.arange(len(rows)), rows["n_adjustments"].to_numpy())
    unk_row = np.repeat(np.arange(len(rows)), rows["n_unknown_intervals"].to_numpy())
    keep_unk = np.ones(len(unks), dtype=bool)
    cols = [rows.columns.get_loc(c) for c in SUM_COLUMNS]
    for k, sh in enumerate(shares):
        if sh is None or sh.whole:
            continue
        rows.iloc[k, cols] = [sh.of(float(v)) for v in rows.iloc[k, cols]]
        for c in ("gpu_hours", "amount"):
            at = np.flatnonzero(adj_row == k)
            adjs.loc[adjs.index[at], c] = [sh.of(float(v)) if v == v and v is not None else v
                                           for v in adjs[c].iloc[at]]
        mine = unk_row == k
        if sh.span is None:
            keep_unk[mine] = False
            continue
        lo, hi = sh.span
        rows.iloc[k, rows.columns.get_loc("window_start")] = lo
        rows.iloc[k, rows.columns.get_loc("window_end")] = hi
        for j in np.flatnonzero(mine):
            s, e = epoch(unks["start"].iat[j]), epoch(unks["end"].iat[j])
            keep_unk[j] = math.isnan(s) or math.isnan(e) or (s < hi and e > lo) or (s == e and lo <= s < hi)
    if not keep_unk.all():
        rows["n_unknown_intervals"] = np.bincount(unk_row[keep_unk], minlength=len(rows)).astype("int64")
        unks = unks[keep_unk].reset_index(drop=True)
    return Flat(rows=rows, unknowns=unks, adjustments=adjs)
