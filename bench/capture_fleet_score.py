"""Scoring the agents' findings against :mod:`bench.capture_fleet`'s truth: recall, GPU-hours error, and a verdict
on every finding (right or wrong) for the calibration table. Written apart from :mod:`bench.scenario_score`
(it imports nothing from it, nor from ``ledger``).

- A finding's *devices*: its ``scope.device_uuid``; else the ``devices`` / ``held_devices`` it lists; else every
  GPU of its ``scope.node`` (a capture's run ``node:<node>`` is that node's GPUs).
- A fault is *found* when a finding of one of its ``EXPECTED`` kinds (for ``capture_restarted``: an
  ``unknown_gap`` with that cause) at confidence >= ``FOUND_MIN_CONF`` shares a device with it and overlaps its
  window; its estimated GPU-hours are the sum over those findings. The error is |estimate - truth| / truth, the
  truth taken as at least ``ERR_FLOOR_H``; faults with no GPU-hours (ECC) are scored for recall only.
- A finding is *right* when it matches a fault that way (any confidence), or one of the fault's ``ALSO_RIGHT``
  kinds (true statements about the same devices and hours: the slowest member of a sync-boost group does run
  slower than its siblings; telemetry is missing across a reboot), or, for ``unallocated``, when at least half
  of its hours were truly hours with no process on those GPUs. Every other finding is *wrong*: a false alarm.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

EXPECTED = {"fan_failure": ("hot_because_cooling",), "crac_failure": ("hot_because_cooling",),
            "power_brake": ("hw_slowdown",), "sync_boost": ("sync_boost",), "starved": ("starved",),
            "ecc_volatile": ("ecc_drift",), "xid": ("xid",), "capture_restarted": ("unknown_gap",),
            "ppt_cap": ("power_cap",), "amd_drift": ("sibling_divergence",),
            "hot_working": ("hot_because_working",), "spin_wait": ("busy_not_computing",),
            "slow_part": ("flops_behind_siblings",)}
ALSO_RIGHT = {"sync_boost": ("sibling_divergence",), "xid": ("unknown_gap",), "capture_restarted": ("unknown_gap",)}
FOUND_MIN_CONF, FALSE_MIN_CONF = 0.5, 0.7
ERR_FLOOR_H = 0.25
BINS = ((0.0, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01))


@dataclass(frozen=True)
class FaultScore:
    cause: str
    found: bool
    truth_h: float | None
    found_h: float
    findings: int

    @property
    def error(self) -> float | None:
        if self.truth_h is None:
            return None
        return abs(self.found_h - self.truth_h) / max(self.truth_h, ERR_FLOOR_H)


@dataclass(frozen=True)
class Verdict:
    kind: str
    confidence: float
    right: bool
    why: str


def epoch(v) -> float:  # noqa: ANN001
    if isinstance(v, (int, float)):
        return float(v)
    return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()


def finding_devices(f: dict, truth: dict) -> set[str]:
    sc = f.get("scope") or {}
    if sc.get("device_uuid"):
        return {sc["device_uuid"]}
    listed = set(f.get("devices") or ()) | set(f.get("held_devices") or ())
    if listed:
        return {d if isinstance(d, str) else d.get("device", "") for d in listed}
    node = sc.get("node") or (sc.get("job_id") or "").removeprefix("node:")
    return {d for d, nd in truth["devices"].items() if nd == node}


def _overlaps(fault: dict, f: dict, devs: set[str]) -> bool:
    return bool(devs & set(fault["devices"])) and epoch(f["start"]) < fault["end"] and epoch(f["end"]) > fault["start"]


def _matches(fault: dict, f: dict, devs: set[str]) -> bool:
    if f["kind"] not in EXPECTED[fault["cause"]]:
        return False
    if fault["cause"] == "capture_restarted" and f.get("cause") != "capture_restarted":
        return False
    return _overlaps(fault, f, devs)


def findings_of(analysis_json: dict) -> list[dict]:
    """The agents' findings, without the recommendations that restate them."""
    return [f for f in analysis_json["findings"] if f.get("agent") != "recommendation"]


def score(truth: dict, findings: list[dict], unallocated_between=None) -> tuple[list[FaultScore], list[Verdict]]:  # noqa: ANN001
    """Per fault its score; per finding its verdict. ``unallocated_between(device, start, end)`` -> hours with
    no process (the generator's :meth:`Fleet.unallocated_between`), to judge ``unallocated`` findings."""
    devs_of = [finding_devices(f, truth) for f in findings]
    scores = []
    for fault in truth["faults"]:
        hit = [f for f, d in zip(findings, devs_of) if f["confidence"] >= FOUND_MIN_CONF and _matches(fault, f, d)]
        scores.append(FaultScore(fault["cause"], bool(hit), fault["gpu_hours"],
                                 sum(float(f["gpu_hours"]) for f in hit), len(hit)))
    verdicts = []
    for f, devs in zip(findings, devs_of):
        why = next((fault["cause"] for fault in truth["faults"] if _matches(fault, f, devs)), None)
        if why is None:
            why = next((f"{fault['cause']} (also true)" for fault in truth["faults"]
                        if f["kind"] in ALSO_RIGHT.get(fault["cause"], ()) and _overlaps(fault, f, devs)), None)
        if why is None and f["kind"] == "unallocated" and unallocated_between is not None:
            idle = sum(unallocated_between(d, epoch(f["start"]), epoch(f["end"])) for d in devs)
            if idle >= 0.5 * float(f["gpu_hours"]):
                why = f"unallocated ({idle:.2f} h with no process)"
        verdicts.append(Verdict(f["kind"], float(f["confidence"]), why is not None, why or "no such fault"))
    return scores, verdicts


def calibration(verdicts: list[Verdict]) -> list[tuple[str, int, int]]:
    """Per confidence bin: (label, findings, right)."""
    out = []
    for lo, hi in BINS:
        inside = [v for v in verdicts if lo <= v.confidence < hi]
        label = f"< {hi:.1f}" if lo == 0.0 else f"≥ {lo:.1f}" if hi > 1 else f"{lo:.1f}–{hi:.1f}"
        out.append((label, len(inside), sum(v.right for v in inside)))
    return out


def false_alarms(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if not v.right and v.confidence >= FALSE_MIN_CONF]
