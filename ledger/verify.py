"""Tamper evidence: walk the hash chain and name the first entry whose content or link does not match.

Pure over the rows it reads; errors are returned as values (:class:`ChainProblem`), not raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from sqlalchemy.engine import Engine

from .entries import GENESIS_HASH, ChainedEntry, chain_hash, compute_entry_id
from .store import iter_entries


@dataclass(frozen=True)
class ChainProblem:
    seq: int
    entry_id: str
    reason: str

    def __str__(self) -> str:
        return f"entry seq {self.seq} ({self.entry_id}): {self.reason}"


@dataclass(frozen=True)
class VerifyReport:
    entries: int
    head_seq: int
    head_hash: str
    problems: tuple[ChainProblem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"ok": self.ok, "entries": self.entries, "head_seq": self.head_seq, "head_hash": self.head_hash,
                "problems": [{"seq": p.seq, "entry_id": p.entry_id, "reason": p.reason} for p in self.problems]}


def check_chain(rows: Iterable[ChainedEntry]) -> VerifyReport:
    """Recompute every id, link and hash; stop at the first break (everything after it is unproven)."""
    expected_prev = GENESIS_HASH
    expected_seq = 0
    n = 0
    for ce in rows:
        n += 1
        expected_seq += 1
        e = ce.entry
        problem = None
        if ce.seq != expected_seq:
            problem = f"sequence gap: expected {expected_seq}"
        elif ce.prev_hash != expected_prev:
            problem = "prev_hash does not link to the previous entry's hash"
        elif compute_entry_id(e) != e.entry_id:
            problem = "content does not match its entry_id"
        elif chain_hash(ce.seq, e, ce.prev_hash) != ce.hash:
            problem = "content does not match its hash"
        if problem:
            return VerifyReport(entries=n, head_seq=ce.seq, head_hash=ce.hash,
                                problems=(ChainProblem(ce.seq, e.entry_id, problem),))
        expected_prev = ce.hash
    return VerifyReport(entries=n, head_seq=expected_seq, head_hash=expected_prev)


ExtraCheck = Callable[[Engine, VerifyReport], list[ChainProblem]]
_EXTRA_CHECKS: list[ExtraCheck] = []


def register_check(fn: ExtraCheck) -> ExtraCheck:
    """Other modules (telemetry evidence digests, issued receipts) add their checks to `ipledger verify`."""
    _EXTRA_CHECKS.append(fn)
    return fn


# Modules whose import registers a check (kept as names: verify must not import the world at load time).
CHECK_MODULES = ["ledger.telemetry.store", "ledger.receipts.issue"]


def verify(engine: Engine, chain_only: bool = False) -> VerifyReport:
    import importlib

    for name in CHECK_MODULES:
        importlib.import_module(name)
    report = check_chain(iter_entries(engine))
    if not report.ok or chain_only:
        return report
    problems: list[ChainProblem] = []
    for check in _EXTRA_CHECKS:
        problems.extend(check(engine, report))
    if problems:
        return VerifyReport(report.entries, report.head_seq, report.head_hash, tuple(problems))
    return report
