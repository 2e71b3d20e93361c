"""What the pages show, read through the same calls the CLI makes: the agents' dataset and findings
(`ipledger account`/`explain` read :mod:`ledger.agents.query`), the recorded findings (`ipledger findings
--no-refresh`), the issued receipts and the month's statement (`ipledger export monthly`). Read once per ledger
head and kept until the head moves. The figures that need the agents' dataset are computed in a short-lived
child process (:mod:`ledger.web.figures`): the server keeps their answers, never the dataset."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..chain.canonical import ts_to_epoch
from ..base.heap import return_freed_heap
from ..chain.kinds import Kind
from ..base.periods import calendar_month
from ..chain.store import head, iter_entries
from .figures import ALONE, Bounds, NotAnswerable, ask, key


FIGURES_LIMIT = 4096   # the figures children's answers: the prefetch of the demo is about 200 of them
# what the pages and /metrics read of an issued receipt (the whole body is its JSON file, made on request)
RECEIPT_FIELDS = ("job", "window", "gpu_hours", "cost", "unknown_by_cause")
FILES_LIMIT = 256      # statements and receipt files (text, JSON, PDF, proof bundle: up to tens of kB each)


@dataclass
class Snapshot:
    """The ledger as read at one head: everything a page needs that is not per request."""

    seq: int
    head_hash: str
    read_at: float
    bounds: Bounds | None = None                   # the dataset's span and names (None: no child has run yet)
    child_peaks_mib: list = field(default_factory=list)   # each figures child's own peak memory at this head
    recorded: list = field(default_factory=list)   # recorded findings with status (dicts)
    receipts: dict = field(default_factory=dict)   # (cluster, job_id, run) -> latest issued receipt body's
                                                   # RECEIPT_FIELDS
    last_ts: float | None = None                   # the newest entry's time
    months: list = field(default_factory=list)     # months with issued receipts
    figures: dict = field(default_factory=dict)    # the figures children's answers at this head, by key
                                                   # (the ledger is append-only: the same head, the same answer)
    files: dict = field(default_factory=dict)      # statements and receipt files at this head, by question


class LedgerView:
    """The pages' reader of one ledger: a snapshot per head (thread-safe), and the per-request calls."""

    def __init__(self, engine, site, log=None) -> None:  # noqa: ANN001
        """``log``: called with one line per figures child (its head, time and peak memory); None: silent."""
        self.engine, self.site, self.log = engine, site, log
        self.url = engine.url.render_as_string(hide_password=False)   # for the child, on its stdin only
        self._lock = threading.Lock()
        self._figures_lock = threading.Lock()   # one figures child at a time
        self._snap: Snapshot | None = None

    def head(self) -> tuple[int, str]:
        with self.engine.connect() as conn:
            return head(conn)

    def snapshot(self, with_agents: bool = True) -> Snapshot:
        """The snapshot at the head; ``with_agents``: with the figures children's bounds (a child has run)."""
        seq, h = self.head()
        with self._lock:
            s = self._snap
            if s is None or s.seq != seq:
                s = self._read(seq, h)
                self._snap = s
        if with_agents and s.bounds is None:
            self._ask(s, [], with_prefetch=True)
        return s

    def figures(self, snap: Snapshot, question: tuple):  # noqa: ANN201
        """The answer to ``question`` at ``snap``'s head (ledger.web.figures), from a child when not yet kept;
        NotAnswerable for a bad period or an unknown name."""
        if snap.bounds is None:
            self._ask(snap, [question], with_prefetch=True)
        k = key(question, snap.bounds)
        got = snap.figures.get(k)   # one lookup: another request's child may clear the dict meanwhile
        if got is None:
            self._ask(snap, [question], with_prefetch=False, billed=self._billed(snap, k))
            got = snap.figures.get(k)
        if got is None:   # the child had no answer to a question its bounds allow
            raise NotAnswerable(404, "not found")
        return got

    def alone(self, snap: Snapshot, question: tuple) -> dict:
        """The answer to a statement or receipt question at ``snap``'s head (ledger.web.figures.answer_alone),
        from a child of its own (it reads no agents' dataset) when not yet kept."""
        got = snap.files.get(question)
        if got is None:
            self._ask(snap, [question], with_prefetch=False)
            got = snap.files.get(question)
        return got if got is not None else {"error": (404, "not found")}

    def _billed(self, snap: Snapshot, k: tuple) -> dict | None:
        """For a question of a calendar month: {month: its statement rows}, pickled by a child of their own (the
        ("billed", month) question), so that the child holding the dataset does not also build the statement."""
        bounds = {"fleet": k[1:3], "scope": k[3:5]}.get(k[0])
        month = calendar_month(*bounds) if bounds else None
        if month is None:
            return None
        got = self.alone(snap, ("billed", month))
        return {month: got["rows"]} if "rows" in got else None

    def _ask(self, snap: Snapshot, questions: list[tuple], with_prefetch: bool, billed: dict | None = None) -> None:
        with self._figures_lock:
            if with_prefetch and snap.bounds is not None:   # another request's child did it meanwhile
                with_prefetch = False
                questions = [q for q in questions if key(q, snap.bounds) not in snap.figures]
                if not questions:
                    return
            got = ask(self.url, questions, with_prefetch, getattr(self.site, "sku_table", None), billed)
            alone = {k: a for k, a in got.by_key.items() if k[0] in ALONE}
            for kept, new, limit in ((snap.figures, {k: a for k, a in got.by_key.items() if k not in alone},
                                      FIGURES_LIMIT), (snap.files, alone, FILES_LIMIT)):
                if len(kept) + len(new) > limit:
                    kept.clear()   # arbitrary periods and receipts cannot grow the server without bound
                kept.update(new)
            snap.child_peaks_mib.append(got.peak_mib)
            if self.log is not None:
                self.log(f"ipledger serve: figures at head {snap.seq}: {len(got.by_key)} answers in {got.seconds:.1f} s, "
                         f"child peak {got.peak_mib:.0f} MiB")
            if snap.bounds is None and got.bounds is not None:
                snap.bounds = got.bounds

    def _read(self, seq: int, h: str) -> Snapshot:
        from .. import agents

        s = Snapshot(seq, h, time.time())
        s.recorded = agents.recorded_findings(self.engine)
        months = set()
        with self.engine.connect() as conn:
            for ce in iter_entries(conn, kinds=[Kind.RECEIPT_ISSUED]):
                r = ce.entry.data.get("receipt", {})
                j = r.get("job", {})
                s.receipts[(j.get("cluster"), str(j.get("job_id")), int(j.get("run", 0)))] = {
                    k: r[k] for k in RECEIPT_FIELDS if k in r}
                w = r.get("window", {})
                if w.get("start"):
                    months.add(w["start"][:7])
            row = conn.exec_driver_sql("SELECT ts FROM entries ORDER BY seq DESC LIMIT 1").first()
        if row is not None:
            v = row[0]
            s.last_ts = v.timestamp() if hasattr(v, "timestamp") else ts_to_epoch(str(v))
        s.months = sorted(months)
        return_freed_heap()   # the entries' decoded payloads, dropped but for the fields kept
        return s


def receipt_account(body: dict) -> str | None:
    return body.get("job", {}).get("account")


def finding_accounts(f: dict, snap: Snapshot) -> set[str]:
    """The accounts whose runs a recorded finding is on: its tenant, or the account of its job's receipts.
    A finding of a rack, node or device with no job names no tenant (operators only)."""
    sc = f.get("scope", {})
    out = {sc["tenant"]} if sc.get("tenant") else set()
    if sc.get("job_id"):
        out |= {receipt_account(b) for (c, j, _r), b in snap.receipts.items() if j == str(sc["job_id"])}
    return {a for a in out if a}


def visible_findings(user, snap: Snapshot) -> list[dict]:  # noqa: ANN001
    if user.operator:
        return list(snap.recorded)
    return [f for f in snap.recorded if finding_accounts(f, snap) & user.accounts]
