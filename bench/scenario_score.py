"""Scoring the agents' findings against the independent generator's truth (:mod:`bench.scenario`).

A fault is found when a finding of an expected kind, at confidence >= 0.5, names its scope (the device for a
device-scale fault, the job for a job-scale one, the node for a node-scale one) and overlaps its window. Its
estimated GPU-hours are the sum over those findings; the error is |estimate - truth| / truth (faults whose truth is
zero GPU-hours, such as accelerating ECC, are scored for recall only; below ``ERR_FLOOR_H`` the error is taken
against that floor, since a relative error on a few GPU-minutes, say a cooling fault on a lightly loaded node, says
nothing). A *false finding on a healthy device* is a
finding at confidence >= 0.7 whose devices (its device, its job's devices, or its node's devices) include no device
any fault touched; and :func:`wrong_confident` counts every finding at >= 0.7 that states no injected fault (the
tune-on set's calibration: a wrong cause on a faulty device counts there).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.chain.canonical import ts_to_epoch

KINDS = {"cooling": ("hot_because_cooling",), "power_cap": ("power_cap",), "idle_held": ("idle_held",),
         "starved": ("starved",), "drift": ("sibling_divergence", "ecc_drift"), "ecc": ("ecc_drift",),
         "xid": ("xid",), "collector_outage": ("unknown_gap",), "fan": ("hot_because_cooling",),
         "hot_working": ("hot_because_working",), "power_brake": ("hw_slowdown",),
         "spin_wait": ("busy_not_computing",), "slow_part": ("flops_behind_siblings",)}
SCOPE = {"cooling": "node", "collector_outage": "node", "starved": "job", "idle_held": "job",
         "power_cap": "device", "drift": "device", "ecc": "device", "xid": "device", "fan": "device",
         "hot_working": "job", "power_brake": "node", "spin_wait": "job", "slow_part": "device"}
# a finding that states another true thing about a fault's devices and hours (a GPU silent after its XID has no
# telemetry; a sliding clock is also a device slower than its siblings)
ALSO_TRUE = {"xid": ("unknown_gap",), "drift": ("sibling_divergence", "ecc_drift")}
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


def finding_devices(f: dict, truth: dict) -> set[str]:
    """The devices a finding names: its device, else the devices it lists, its job's, or its node's."""
    sc = f["scope"]
    if sc.get("device_uuid"):
        return {sc["device_uuid"]}
    listed = set(f.get("devices") or ()) | set(f.get("held_devices") or ())
    if listed:
        return listed
    if sc.get("job_id") and sc["job_id"] in truth["jobs"]:
        return set(truth["jobs"][sc["job_id"]])
    return {d for d, nd in truth["devices"].items() if nd == sc.get("node")}


def wrong_confident(truth: dict, findings: list[dict]) -> list[dict]:
    """The findings at confidence >= FALSE_MIN_CONF that state no injected fault: none of the faults whose kinds
    include the finding's (or for which it is ``ALSO_TRUE``) shares a device with it and overlaps its window. The
    calibration of the tune-on set: a confident finding on a faulty device but of the wrong cause counts here (a
    hot-because-working job called a cooling failure), where ``score``'s false findings on healthy devices miss it."""
    out = []
    for f in findings:
        if f["confidence"] < FALSE_MIN_CONF:
            continue
        devs = finding_devices(f, truth)
        ok = any((f["kind"] in KINDS[x["cause"]] or f["kind"] in ALSO_TRUE.get(x["cause"], ()))
                 and devs & set(x["devices"]) and _t(f["start"]) < x["end"] and _t(f["end"]) > x["start"]
                 for x in truth["faults"])
        if not ok:
            out.append(f)
    return out


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
