"""Scoring the agents' findings against the independent generator's truth (:mod:`bench.scenario`).

A fault is found when a finding of an expected kind, at confidence >= 0.5, names its scope (the device for a
device-scale fault, the job for a job-scale one, the node for a node-scale one) and overlaps its window. Its
estimated GPU-hours are the sum over those findings; the error is |estimate - truth| / truth (faults whose truth is
zero GPU-hours, such as accelerating ECC, are scored for recall only; below ``ERR_FLOOR_H`` the error is taken
against that floor, since a relative error on a few GPU-minutes, say a cooling fault on a lightly loaded node, says
nothing). A *false finding on a healthy device* is a
finding at confidence >= 0.7 whose devices (its device, its job's devices, or its node's devices) include no device
any fault touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.canonical import ts_to_epoch

KINDS = {"cooling": ("hot_because_cooling",), "power_cap": ("power_cap",), "idle_held": ("idle_held",),
         "starved": ("starved",), "drift": ("sibling_divergence", "ecc_drift"), "ecc": ("ecc_drift",),
         "xid": ("xid",), "collector_outage": ("unknown_gap",)}
SCOPE = {"cooling": "node", "collector_outage": "node", "starved": "job", "idle_held": "job",
         "power_cap": "device", "drift": "device", "ecc": "device", "xid": "device"}
FOUND_MIN_CONF, FALSE_MIN_CONF = 0.5, 0.7
ERR_FLOOR_H = 0.25


@dataclass(frozen=True)
class FaultScore:
    cause: str
    found: bool
    truth_h: float
    found_h: float
    findings: int

    @property
    def error(self) -> float | None:
        return abs(self.found_h - self.truth_h) / max(self.truth_h, ERR_FLOOR_H) if self.truth_h > 0 else None


def _t(v) -> float:  # noqa: ANN001
    return float(v) if isinstance(v, (int, float)) else ts_to_epoch(v)


def _matches(fault: dict, f: dict) -> bool:
    sc = f["scope"]
    if f["kind"] not in KINDS[fault["cause"]] or f["confidence"] < FOUND_MIN_CONF:
        return False
    level = SCOPE[fault["cause"]]
    if level == "device" and sc.get("device_uuid") != fault["device"]:
        return False
    if level == "job" and sc.get("job_id") != fault["job"]:
        return False
    if level == "node" and sc.get("node") != fault["node"]:
        return False
    return _t(f["start"]) < fault["end"] and _t(f["end"]) > fault["start"]


def findings_of(analysis_json: dict) -> list[dict]:
    """The agents' findings, without the recommendations that restate them."""
    return [f for f in analysis_json["findings"] if f.get("agent") != "recommendation"]


def score(truth: dict, findings: list[dict]) -> tuple[list[FaultScore], list[dict]]:
    """Per fault its score; and the false findings on healthy devices."""
    out = []
    for fault in truth["faults"]:
        hit = [f for f in findings if _matches(fault, f)]
        out.append(FaultScore(fault["cause"], bool(hit), float(fault["gpu_hours"]),
                              sum(float(f["gpu_hours"]) for f in hit), len(hit)))
    touched = {d for fault in truth["faults"] for d in fault["devices"]}
    by_node: dict[str, set] = {}
    for dev, node in truth["devices"].items():
        by_node.setdefault(node, set()).add(dev)
    false = []
    for f in findings:
        if f["confidence"] < FALSE_MIN_CONF:
            continue
        sc = f["scope"]
        devs = ({sc["device_uuid"]} if sc.get("device_uuid") else set(truth["jobs"].get(sc.get("job_id"), ()))
                or by_node.get(sc.get("node"), set()))
        if devs and not devs & touched:
            false.append(f)
    return out, false
