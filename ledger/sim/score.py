"""Scoring agents' findings against the demo hall's ground truth (used by bench/accuracy.py and the tests).

A truth fault is *found* when a finding (not a recommendation) names the same cause, the same kind, the right
scope at the right level (rack / node / device / job) and a window that overlaps the truth's. Per cause:
recall = found faults / faults; precision = findings of that cause that match some fault / findings of that
cause; GPU-hours error = |sum of matched findings' GPU-hours - sum of truth GPU-hours| / truth.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..chain.canonical import ts_to_epoch

# finding cause -> truth cause (the agents may be more specific than the injection)
CAUSE_ALIASES = {"starved": "checkpoint_starved"}
KIND_ALIASES = {"sibling_divergence": "ecc_drift"}


def finding_cause(f: dict) -> str | None:
    c = f.get("cause")
    return CAUSE_ALIASES.get(c, c)


def matches(truth: dict, f: dict) -> bool:
    if f.get("agent") == "recommendation" or finding_cause(f) != truth["cause"]:
        return False
    if KIND_ALIASES.get(f["kind"], f["kind"]) != truth["kind"]:
        return False
    sc, ts = f["scope"], truth["scope"]
    level = ts["level"]
    ok = {"rack": f.get("level") == "rack" and sc.get("rack") == ts.get("rack"),
          "node": f.get("level") == "node" and sc.get("node") == ts.get("node"),
          "device": sc.get("device_uuid") == ts.get("device_uuid"),
          "job": sc.get("job_id") == ts.get("job_id")}[level]
    if not ok:
        return False
    a, b = ts_to_epoch(f["start"]), ts_to_epoch(f["end"])
    return a < truth["end"] and b > truth["start"]


@dataclass(frozen=True)
class CauseScore:
    cause: str
    faults: int
    found: int
    findings: int
    true_findings: int
    truth_gpu_hours: float
    found_gpu_hours: float

    @property
    def recall(self) -> float:
        return self.found / self.faults if self.faults else 1.0

    @property
    def precision(self) -> float:
        return self.true_findings / self.findings if self.findings else 1.0

    @property
    def hours_error(self) -> float:
        return abs(self.found_gpu_hours - self.truth_gpu_hours) / self.truth_gpu_hours if self.truth_gpu_hours else 0.0


def score(truth: dict, findings: list[dict]) -> dict[str, CauseScore]:
    faults = truth["faults"]
    causes = sorted({f["cause"] for f in faults})
    out = {}
    for c in causes:
        fs = [f for f in faults if f["cause"] == c]
        cand = [f for f in findings if f.get("agent") != "recommendation" and finding_cause(f) == c]
        found, hours_found, used = 0, 0.0, set()
        for t in fs:
            m = [f for f in cand if matches(t, f)]
            if m:
                found += 1
                for f in m:
                    if f["id"] not in used:
                        used.add(f["id"])
                        hours_found += f["gpu_hours"]
        true_f = sum(1 for f in cand if any(matches(t, f) for t in fs))
        out[c] = CauseScore(c, len(fs), found, len(cand), true_f, sum(f["gpu_hours"] for f in fs), hours_found)
    return out


def false_alarms_on_healthy(truth: dict, findings: list[dict], min_confidence: float = 0.7) -> list[dict]:
    """Device-scope findings with high confidence on devices the simulation left healthy (excluding the
    explicitly benign "hot_because_working", which says the device is fine)."""
    healthy = set(truth["healthy_devices"])
    return [f for f in findings if f.get("agent") != "recommendation" and f["scope"].get("device_uuid") in healthy
            and f["confidence"] >= min_confidence and f["kind"] != "hot_because_working"]
