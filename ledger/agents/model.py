"""The Finding record every agent returns, its deterministic id, and its JSON (docs/agents.md, "Findings JSON")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..chain.canonical import canonical_json, format_ts, sha256_hex

AGENTS = ("attribution", "drift", "recommendation", "accounting")
SCOPE_KEYS = ("cluster", "rack", "node", "device_uuid", "job_id", "tenant")


@dataclass(frozen=True)
class Evidence:
    """One signal, with its value before, during and after the finding's window (None = no data there)."""

    signal: str
    unit: str
    before: float | None
    during: float | None
    after: float | None
    reference: float | None = None     # siblings / fleet / SKU rating during the window, when compared
    reference_label: str | None = None
    note: str = ""

    def to_json(self) -> dict:
        out = {"signal": self.signal, "unit": self.unit, "before": _num(self.before), "during": _num(self.during),
               "after": _num(self.after)}
        if self.reference is not None:
            out["reference"] = _num(self.reference)
            out["reference_label"] = self.reference_label
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Finding:
    agent: str
    kind: str
    scope: tuple[tuple[str, Any], ...]      # sorted (key, value) pairs; see scope_dict()
    start: float
    end: float
    gpu_hours: float
    cost: float
    confidence: float
    evidence: tuple[Evidence, ...]
    summary: str
    cause: str | None = None                # the underlying cause this finding names (cooling, power_cap, ...)
    level: str = "device"                   # device | node | rack | job | tenant | cluster | fleet
    extra: tuple[tuple[str, Any], ...] = ()  # agent-specific details (recommendation text, commands, ...)
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} outside [0, 1]")
        if not self.id:
            ident = [self.agent, self.kind, list(self.scope), format_ts(self.start), format_ts(self.end)]
            object.__setattr__(self, "id", "F" + sha256_hex(canonical_json(ident))[:15])

    def scope_dict(self) -> dict:
        d = {k: None for k in SCOPE_KEYS}
        d.update(dict(self.scope))
        return d

    def to_json(self) -> dict:
        out = {"id": self.id, "agent": self.agent, "kind": self.kind, "scope": self.scope_dict(),
               "start": format_ts(self.start), "end": format_ts(self.end), "gpu_hours": round(self.gpu_hours, 4),
               "cost": round(self.cost, 2), "confidence": round(self.confidence, 3),
               "evidence": [e.to_json() for e in self.evidence], "summary": self.summary, "cause": self.cause,
               "level": self.level}
        out.update({k: v for k, v in self.extra})
        return out


def make_scope(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in kw.items() if v is not None))


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if not np.isfinite(f) else round(f, 4)


def clamp01(x: float) -> float:
    return float(min(1.0, max(0.0, x)))
