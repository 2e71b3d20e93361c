"""Recommendation agent: a cause becomes one specific, reversible next step, priced in the GPU-hours its findings
cost over the period they were seen, with the read-only evidence an operator can gather and the command they *could*
run. Nothing here runs anything: commands are text (docs/agents.md, "Recommendation").

Confirmed findings come first (and keep their confidence); open ones are discounted; dismissed ones yield none.
The hours are never extrapolated past the evidence: a step "would have recovered" what its findings cost between the
first one's start and the last one's end (the recommendation's ``start``/``end``; ``seen_hours`` long), and says so.
"""

from __future__ import annotations

from .common import fmt_h
from .data import Dataset
from .model import Evidence, Finding, clamp01, make_scope

AGENT = "recommendation"
OPEN_DISCOUNT = 0.8



def _node_list(nodes: list[str]) -> str:
    return ",".join(nodes) if nodes else "<nodes>"


def _one(ds: Dataset, f: Finding) -> tuple[str, str, list[str], str, tuple] | None:
    """(kind, action text, read-only evidence commands, command an operator could run, scope) for a finding."""
    sc = f.scope_dict()
    node, dev, rack = sc["node"], sc["device_uuid"], sc["rack"]
    if f.kind == "hot_because_cooling":
        nodes = dict(f.extra).get("nodes") or sorted(ds.devices.loc[ds.devices["rack"] == rack, "node"].unique()) \
            if rack else [node]
        where = f"rack {rack}" if f.level == "rack" else f"node {node}"
        what = (f"Inspect GPU {dev}'s own cooling on node {node} (its fans, heatsink, thermal paste, airflow past "
                f"its slot); until fixed, keep heavy jobs off node {node}." if f.level == "device" else
                f"Inspect cooling for {where} (CRAH/CDU, rear-door, blanking panels, inlet sensors); until fixed, "
                f"keep heavy jobs off {where}.")
        return ("inspect_cooling", what,
                [f"ssh {n} nvidia-smi -q -d TEMPERATURE,PERFORMANCE" for n in nodes[:2]] +
                [f"ssh {nodes[0] if nodes else node} ipmitool sdr type Temperature"],
                f"scontrol update NodeName={_node_list(nodes)} State=DRAIN Reason=\"cooling {rack or node}\"  "
                f"# undo: scontrol update NodeName={_node_list(nodes)} State=RESUME",
                make_scope(rack=rack, node=None if f.level == "rack" else node,
                           device_uuid=dev if f.level == "device" else None))
    if f.kind == "power_cap":
        return ("restore_power_limit", f"Check why node {node} runs with a lowered power limit and restore the "
                                       f"default limit.",
                [f"ssh {node} nvidia-smi -q -d POWER", f"ssh {node} nvidia-smi --query-gpu=index,power.limit,"
                                                       f"power.default_limit --format=csv"],
                f"ssh {node} sudo nvidia-smi -pl <power.default_limit>  # reversible: note power.limit first",
                make_scope(node=node, rack=rack))
    if f.kind in ("ecc_drift", "sibling_divergence", "row_remap_failure", "row_remap_pending",
                  "flops_behind_siblings"):
        return ("drain_and_check_device", f"Drain node {node}, run DCGM diagnostics on GPU {dev}; reseat or RMA it "
                                          f"if they fail.",
                [f"ssh {node} nvidia-smi -q -d ECC,ROW_REMAPPER,CLOCK -i {dev}", f"ssh {node} dcgmi diag -r 3"],
                f"scontrol update NodeName={node} State=DRAIN Reason=\"GPU {dev[:12]} slow/ECC\"  "
                f"# undo: scontrol update NodeName={node} State=RESUME",
                make_scope(device_uuid=dev, node=node, rack=rack))
    if f.kind == "xid":
        codes = dict(f.extra).get("xid_codes", [])
        return ("reseat_or_rma_device", f"GPU {dev} on {node} keeps raising XID {codes}: drain the node, reset the "
                                        f"GPU and reseat or RMA it if the XIDs return.",
                [f"ssh {node} journalctl -k | grep -i 'NVRM: Xid'", f"ssh {node} nvidia-smi -q -i {dev}"],
                f"scontrol update NodeName={node} State=DRAIN Reason=\"XID {codes} on {dev[:12]}\"  "
                f"# undo: scontrol update NodeName={node} State=RESUME",
                make_scope(device_uuid=dev, node=node, rack=rack))
    if f.kind == "unknown_gap" and f.cause in ("collector_down", "dcgm_host_engine_restart", "scrape_missing"):
        what = "nv-hostengine" if f.cause == "dcgm_host_engine_restart" else "the ipledger collector / dcgm-exporter"
        return ("fix_telemetry", f"Find out why {what} on node {node} stopped; resolve the unknown interval under the "
                                 f"contract (`ipledger resolve`).",
                [f"ssh {node} systemctl status nvidia-dcgm ipledger-collector", f"ssh {node} journalctl -u nvidia-dcgm"],
                f"ipledger findings --json  # then: ipledger resolve <gap id> ...", make_scope(node=node, rack=rack))
    return None


def _group_tenant(ds: Dataset, found: list[Finding], kind: str) -> list[Finding]:
    out = []
    by_t: dict[str, list[Finding]] = {}
    for f in found:
        if f.kind == kind:
            by_t.setdefault(f.scope_dict()["tenant"] or "-", []).append(f)
    for tenant, fs in sorted(by_t.items()):
        hours = sum(f.gpu_hours for f in fs)
        jobs = sorted({f.scope_dict()["job_id"] for f in fs})
        conf = clamp01(max(f.confidence for f in fs) * _disc(ds, fs))
        if kind == "idle_held":
            text = (f"Tell {'tenant ' + tenant if tenant != '-' else 'the owners'}: jobs {', '.join(jobs[:5])} "
                    f"held {fmt_h(hours)} idle GPU-hours; "
                    f"suggest shorter --time limits or releasing GPUs when done.")
            rk = "tell_tenant_idle"
            cmd = f"sacct -j {','.join(jobs[:5])} --format=JobID,Account,Elapsed,AllocTRES,State"
        elif kind == "busy_not_computing":   # the tenant's own loss: told to the tenant, no operator command
            text = (f"Busy without math: tell {'tenant ' + tenant if tenant != '-' else 'the owners'} that jobs "
                    f"{', '.join(jobs[:5])} kept "
                    f"GPUs busy with every pipe idle for {fmt_h(hours)} delivered GPU-hours that did no math "
                    f"(spin-waiting, a lock, a hung collective); suggest a profile (Nsight Systems) of those hours.")
            rk = "tell_tenant_not_computing"
            cmd = f"sacct -j {','.join(jobs[:5])} --format=JobID,Account,Elapsed,AllocTRES,State"
        else:
            whose = f"Jobs of tenant {tenant}" if tenant != "-" else "Runs"
            text = (f"{whose} ({', '.join(jobs[:5])}{'...' if len(jobs) > 5 else ''}) starved "
                    f"{fmt_h(hours)} GPU-hours waiting on checkpoints: check checkpoint storage throughput and "
                    f"move this job class's checkpoints to faster storage or stagger them.")
            rk = "check_checkpoint_storage"
            cmd = f"sacct -j {','.join(jobs[:5])} --format=JobID,Partition,QOS,Elapsed,State"
        out.append(_rec(ds, rk, make_scope(tenant=None if tenant == "-" else tenant), fs, conf, text,
                        [cmd], "(no command: a conversation with the tenant)" if kind != "starved"
                        else "(no command: storage team)", level="tenant"))
    return out


def _disc(ds: Dataset, fs: list[Finding]) -> float:
    return 1.0 if any(ds.statuses.get(f.id, {}).get("status") == "confirmed" for f in fs) else OPEN_DISCOUNT


def _rec(ds: Dataset, kind: str, scope: tuple, based: list[Finding], conf: float,
         text: str, evidence_cmds: list[str], command: str, level: str) -> Finding:
    """The step for ``based``: the hours its findings cost (over the period they were seen), at their cost rate."""
    ev = tuple(Evidence(f"{b.kind} finding {b.id}", "GPU-h", None, b.gpu_hours, None, note=b.summary) for b in based[:5])
    a = min(b.start for b in based)
    e = max(b.end for b in based)
    hours = sum(b.gpu_hours for b in based)
    rate = sum(b.cost for b in based) / max(hours, 1e-9)
    status = "confirmed" if _disc(ds, based) == 1.0 else "open"
    return Finding(AGENT, kind, scope, a, e, hours, hours * rate, conf, ev,
                   f"{text} Would have recovered about {fmt_h(hours)} GPU-hours over the {fmt_h((e - a) / 3600.0)} h "
                   f"its findings were seen.", cause=based[0].cause, level=level,
                   extra=(("action", text), ("seen_hours", round((e - a) / 3600.0, 3)),
                          ("read_only_evidence", evidence_cmds), ("command", command), ("runs_anything", False),
                          ("based_on", [b.id for b in based]), ("based_on_status", status)))


def run(ds: Dataset, found: list[Finding]) -> list[Finding]:
    live = [f for f in found if ds.statuses.get(f.id, {}).get("status") != "dismissed"]
    live.sort(key=lambda f: (ds.statuses.get(f.id, {}).get("status") != "confirmed", -f.gpu_hours, f.id))
    out = []
    for f in live:
        r = _one(ds, f)
        if r is None:
            continue
        kind, text, ev, cmd, scope = r
        conf = clamp01(f.confidence * _disc(ds, [f]))
        out.append(_rec(ds, kind, scope, [f], conf, text, ev, cmd, f.level))
    out += _group_tenant(ds, live, "idle_held")
    out += _group_tenant(ds, [f for f in live if f.kind == "starved"], "starved")
    out += _group_tenant(ds, live, "busy_not_computing")
    return out
