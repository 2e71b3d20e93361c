"""The four analysis agents (docs/agents.md): attribution, drift, recommendation, accounting.

Agents are pure functions over a :class:`~ledger.agents.data.Dataset` (entries + samples as of one sequence
number) returning :class:`~ledger.agents.model.Finding` records. They never act on the fleet; the only thing
written anywhere is ``finding_recorded`` entries in the ledger (:func:`record`), and operators' verdicts
(``finding_confirmed`` / ``finding_dismissed``).

Public API::

    analyze(engine, through_seq=None) -> Analysis          # all agents; Analysis.to_json() is the Findings JSON (docs/agents.md)
    record(engine, findings) -> AppendResult               # finding_recorded entries (idempotent)
    verdict(engine, finding_id, confirm: bool, by, note)   # finding_confirmed / finding_dismissed entry
    recorded_findings(engine) -> list[dict]                 # recorded findings with their status

May import: `ledger.base`, `ledger.chain`, `ledger.method`, `ledger.telemetry`, `ledger.importers`,
`ledger.receipts`, `reports`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..chain.canonical import format_ts, now_ts
from ..chain.entries import Kind, make_entry

if TYPE_CHECKING:   # a ledger only where one is read or written: `ipledger analyze` of an export needs none
    from collections.abc import Sequence

    from sqlalchemy.engine import Engine

    from .data import Dataset
    from .model import Finding

# The agents (pandas) load on first use, not with the package: a reader of recorded findings or of a period's
# text (`ipledger serve`'s server process, ledger.web) never loads the analysis stack.
_LAZY = {"Dataset": ".data", "load": ".data", "Finding": ".model"}


def __getattr__(name: str):  # noqa: ANN202 - PEP 562: ``Dataset``, ``load`` and ``Finding`` on first use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Analysis:
    """Everything the agents produced over one dataset; what ``analyze --json`` prints and reports render."""

    findings: list[Finding]
    account: dict
    daily: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)   # optional report context (sources, coverage, title, ...)

    def to_json(self) -> dict:
        recs = [{"title": dict(f.extra).get("action", f.summary), "gpu_hours": round(f.gpu_hours, 3),
                 "start": format_ts(f.start), "end": format_ts(f.end),
                 "seen_hours": dict(f.extra).get("seen_hours"),
                 "cost": round(f.cost, 2), "command": dict(f.extra).get("command"), "reversible": True,
                 "finding_ids": dict(f.extra).get("based_on", []), "confidence": round(f.confidence, 3)}
                for f in self.findings if f.agent == "recommendation"]
        return {"findings": [f.to_json() for f in self.findings], "account": self.account, "daily": self.daily,
                "meta": self.meta, "recommendations": recs, "method": method_info(), **self.context}


def method_info() -> dict:
    """The method's name and version, for whatever renders an analysis (a PDF states what produced it)."""
    from ..method import METHOD_NAME, METHOD_VERSION

    return {"name": METHOD_NAME, "version": METHOD_VERSION, "notes": "docs/method.md; agents: docs/agents.md"}


def find(ds: Dataset, causes: Sequence[Finding] | None = None) -> list[Finding]:
    """Every agent's findings over ``ds``: the causes by GPU-hours, then the recommendations in their own order
    (confirmed causes first). What `account`, `explain`, `ask` and the web view need; :func:`run_agents` adds the
    whole-dataset account, daily rows and metadata that `analyze` and the written analysis print. ``causes``:
    :func:`causes_of` ``ds`` when already known (a cached dataset's, :mod:`ledger.agents.dataset_cache`)."""
    return _find(ds, causes)[1]


def causes_of(ds: Dataset) -> list[Finding]:
    """The causes the agents find in ``ds`` (every finding but the recommendations), in the order they produce
    them. They read no operator's verdict: only the recommendations do."""
    from . import accounting, causes as attribution, compute, drift

    drift_f, xid_mask = drift.run(ds)
    attr_f = attribution.run(ds, xid_mask, drift.silent_spans(drift_f))
    acct_f = accounting.findings(ds)
    return [*attr_f, *compute.run(ds), *drift_f, *acct_f]


def _find(ds: Dataset, causes: Sequence[Finding] | None = None) -> tuple[list[Finding], list[Finding]]:
    """(the causes in the order the agents produce them, every finding in :func:`find`'s order)."""
    from . import recommendation

    base = causes_of(ds) if causes is None else list(causes)
    return base, sorted(base, key=lambda f: (-f.gpu_hours, f.id)) + recommendation.run(ds, base)


def run_agents(ds: Dataset, causes: Sequence[Finding] | None = None) -> Analysis:
    """Every agent over ``ds``: the findings (:func:`find`), the whole dataset's account, daily rows and metadata.
    The plain, one-process reference of :func:`ledger.agents.lanes.run_agents_in_lanes`."""
    return analysis_of(ds, causes)


def analysis_of(ds: Dataset, causes: Sequence[Finding] | None = None, daily: list[dict] | None = None,
                hour_of_day: list[dict] | None = None, totals=None) -> Analysis:  # noqa: ANN001
    """:func:`run_agents`' analysis, with any of its parts already computed (``causes``: :func:`causes_of`
    ``ds``; ``daily``: ``accounting.daily(ds)``; ``hour_of_day``: ``accounting.hour_of_day(ds)``; ``totals``:
    ``accounting.slice_totals(ds)``)."""
    from . import accounting

    base, findings = _find(ds, causes)
    account = accounting.account(ds, base, totals=totals)
    meta = {"through_seq": ds.through_seq, "start": format_ts(ds.start) if ds.end else None,
            "end": format_ts(ds.end) if ds.end else None, "devices": int(len(ds.devices)),
            "samples": int(len(ds.samples) if ds.sample_count is None else ds.sample_count), "runs": int(ds.allocs[["cluster", "job_id", "run"]].drop_duplicates()
                                                            .shape[0]) if len(ds.allocs) else 0,
            "currency": ds.currency, "cadence_s": ds.cadence}
    meta["hour_of_day"] = accounting.hour_of_day(ds) if hour_of_day is None else hour_of_day
    return Analysis(findings=findings, account=account, daily=accounting.daily(ds) if daily is None else daily,
                    meta=meta)


def period_analysis(ds: Dataset, analysis: Analysis, start: float, end: float, label: str) -> dict:
    """The analysis of one period of a ledger, as ``reports.analysis_pdf.render`` takes it: the findings overlapping the
    period (and the recommendations based on them), the period's account (its loss lines from the same
    partition), its daily rows, and a title naming the period."""
    keep = [f for f in analysis.findings if f.agent != "recommendation" and f.start < end and f.end > start]
    ids = {f.id for f in keep}
    recs = [f for f in analysis.findings if f.agent == "recommendation" and set(dict(f.extra).get("based_on", [])) & ids]
    from . import accounting, query

    sub = Analysis(findings=keep + recs, account=query.scope(ds, keep, "fleet", None, start, end)["account"],
                   daily=accounting.daily(ds, start, end),
                   meta=dict(analysis.meta, start=format_ts(max(start, ds.start)), end=format_ts(min(end, ds.end))),
                   context={"title": f"Where the GPU-hours went: {label}", "path": "ledger"})
    return sub.to_json()


def analyze(engine: Engine, through_seq: int | None = None, topology: dict | None = None) -> Analysis:
    from .data import load

    return run_agents(load(engine, through_seq=through_seq, topology=topology))


def record(engine: Engine, findings: list[Finding]):  # noqa: ANN201
    """Record findings as ``finding_recorded`` entries; the same finding recorded twice is one entry."""
    entries = []
    for f in findings:
        j = f.to_json()
        sc = j["scope"]
        entries.append(make_entry(Kind.FINDING_RECORDED, f.start, {"finding_id": f.id, "finding": j},
                                  ts_end=f.end, cluster=sc.get("cluster"), job_id=sc.get("job_id"),
                                  node=sc.get("node"), device=sc.get("device_uuid"), source=f"agent.{f.agent}"))
    from ..chain.store import append

    return append(engine, entries)


class UnknownFinding(LookupError):
    pass


def recorded_findings(engine: Engine, since: float | None = None) -> list[dict]:
    """Findings in the ledger (latest record per id), each with status open / confirmed / dismissed."""
    found: dict[str, dict] = {}
    status: dict[str, dict] = {}
    with engine.connect() as conn:
        from ..chain.store import iter_entries

        for ce in iter_entries(conn, kinds=[Kind.FINDING_RECORDED, Kind.FINDING_CONFIRMED, Kind.FINDING_DISMISSED]):
            d = ce.entry.data
            if ce.entry.kind == Kind.FINDING_RECORDED:
                found[d["finding_id"]] = dict(d["finding"], recorded_seq=ce.seq)
            else:
                status[d.get("finding_id")] = {"status": "confirmed" if ce.entry.kind == Kind.FINDING_CONFIRMED
                                               else "dismissed", "by": d.get("by"), "note": d.get("note"),
                                               "at": ce.entry.ts, "seq": ce.seq}
    out = []
    from ..chain.canonical import ts_to_epoch
    for fid, f in found.items():
        if since is not None and ts_to_epoch(f["end"]) < since:
            continue
        f["status"] = status.get(fid, {"status": "open"})
        out.append(f)
    out.sort(key=lambda f: (-f["gpu_hours"], f["id"]))
    return out


def verdict(engine: Engine, finding_id: str, confirm: bool, by: str, note: str = ""):  # noqa: ANN201
    """An operator's verdict on a recorded finding, as a ledger entry."""
    known = {f["id"]: f for f in recorded_findings(engine)}
    if finding_id not in known:
        raise UnknownFinding(f"no recorded finding {finding_id!r} (run `ipledger findings` to record them)")
    f = known[finding_id]
    kind = Kind.FINDING_CONFIRMED if confirm else Kind.FINDING_DISMISSED
    sc = f.get("scope", {})
    e = make_entry(kind, now_ts(), {"finding_id": finding_id, "by": by, "note": note, "finding_kind": f["kind"]},
                   cluster=sc.get("cluster"), node=sc.get("node"), device=sc.get("device_uuid"),
                   job_id=sc.get("job_id"), source="operator")
    from ..chain.store import append

    return append(engine, [e])


__all__ = ["Analysis", "Finding", "Dataset", "analyze", "find", "causes_of", "run_agents", "analysis_of", "load",
           "record", "verdict", "recorded_findings", "UnknownFinding"]
