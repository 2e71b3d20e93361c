"""Pods as runs (``ipledger collect --kubelet-socket``): at every tick, the kubelet's pod-resources answer
(:mod:`ledger.capture.sources.kubelet`) becomes the ledger's allocation facts, written to the spool like the Slurm
hooks' (docs/kubernetes.md).

* A pod holding a GPU is a run: cluster = the site's cluster (``k8s`` when none is set), job id
  ``k8s:<namespace>/<pod>``, account = the namespace. ``allocation_started`` and one ``device_bound`` per
  physical device when the collector first sees the pod holding it; ``allocation_ended`` (state ``GONE``,
  basis ``kubelet``) at the first tick that no longer lists it. The pod-resources API carries no pod UID or
  restart count, so a pod that is gone for a tick and comes back under the same name (a StatefulSet pod
  recreated, a restarted pod) is the next run of that job id.
* Device ids: a time-slicing replica ``GPU-<uuid>::<n>`` is bound as the physical ``GPU-<uuid>`` (the replica
  id is kept in the payload, never as the device); a MIG device UUID is its own device. Each ``device_bound``
  says how many pods held the device at that tick (``sharers``) and the share rule the collector saw
  (``mig_slice``/``whole`` for a device one pod holds, ``equal`` for time-slicing). When the pods holding a
  device change, each pod that still holds it gets a new ``device_bound`` (``restated``) with the new count, so
  its receipt pays each part of its window at that part's share (:func:`ledger.method.shares.share_segments`).
* The collector's own downtime: when two successful ticks lie further apart than ``max_gap_s``, every run still
  held gets an ``unknown_interval`` (cause ``collector_down``, scope ``device``) over the hole. A kubelet that
  does not answer changes nothing (its view is unknown); the hole is recorded when it answers again.
* :func:`tick` is pure (state in, records and state out); :func:`collect_tick` reads the kubelet, keeps the
  state in ``<spool>/.k8s-pods.json`` (written atomically) and writes the records durably to the spool.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import spool
from ..chain.entries import Kind, make_entry
from .sources.kubelet import Assignment, KubeletUnavailable, PodResourcesClient

SOURCE = "collector.k8s"
STATE_NAME = ".k8s-pods.json"
DEFAULT_CLUSTER = "k8s"


def clock() -> float:
    """The tick's time (one name, so a test can set the clock without touching ``time.time``)."""
    return time.time()


def job_id(namespace: str, pod: str) -> str:
    return f"k8s:{namespace}/{pod}"


@dataclass(frozen=True)
class PodRunsConfig:
    spool: str
    node: str
    socket: str
    cluster: str | None = None
    max_gap_s: float = 180.0      # ticks further apart than this leave a collector_down hole
    timeout_s: float = 5.0


@dataclass
class TickReport:
    ts: float
    pods: int = 0
    started: int = 0
    ended: int = 0
    gaps: int = 0
    error: str | None = None
    spool_file: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _share_rule(a: Assignment, sharers: int) -> str:
    if sharers > 1:
        return "equal"
    return "mig_slice" if a.device.startswith("MIG-") or a.resource.startswith("nvidia.com/mig-") else "whole"


def held_by_pod(held: Iterable[Assignment]) -> dict[str, list[Assignment]]:
    """``k8s:<ns>/<pod>`` -> its assignments, one per physical device (the first container naming it)."""
    out: dict[str, dict[str, Assignment]] = {}
    for a in held:
        out.setdefault(job_id(a.namespace, a.pod), {}).setdefault(a.device, a)
    return {j: list(d.values()) for j, d in out.items()}


def tick(state: dict[str, Any], held: Iterable[Assignment], now: float, *, node: str, cluster: str | None,
         max_gap_s: float) -> tuple[list[dict], dict[str, Any], TickReport]:
    """One successful tick: the records it adds and the next state. Pure."""
    cluster = cluster or DEFAULT_CLUSTER
    pods_now = held_by_pod(held)
    open_runs: dict[str, dict] = dict(state.get("open", {}))
    last_run: dict[str, int] = dict(state.get("last_run", {}))
    last_tick = state.get("last_tick")
    rep = TickReport(ts=now, pods=len(pods_now))
    records: list[dict] = []

    def keys(j: str, run: int) -> dict:
        return {"cluster": cluster, "job_id": j, "run": run, "node": node, "source": SOURCE}

    if isinstance(last_tick, (int, float)) and now - last_tick > max_gap_s:
        for j in sorted(open_runs):
            o = open_runs[j]
            for dev in o["devices"]:
                records.append(make_entry(Kind.UNKNOWN_INTERVAL, last_tick, {
                    "cause": "collector_down", "scope": "device", "source": "kubelet",
                    "detail": f"no pod-resources tick between {last_tick:.0f} and {now:.0f}"},
                    ts_end=now, device=dev, **keys(j, o["run"])).to_record())
                rep.gaps += 1
    for j in sorted(set(open_runs) - set(pods_now)):
        o = open_runs.pop(j)
        records.append(make_entry(Kind.ALLOCATION_ENDED, now, {
            "state": "GONE", "state_basis": "kubelet", "last_seen": last_tick, "exit_code": None, "signal": None},
            **keys(j, o["run"])).to_record())
        rep.ended += 1
    sharers: dict[str, int] = {}
    for assigned in pods_now.values():
        for a in assigned:
            sharers[a.device] = sharers.get(a.device, 0) + 1
    for j in sorted(set(pods_now) - set(open_runs)):
        assigned = pods_now[j]
        run = last_run[j] + 1 if j in last_run else 0
        first = assigned[0]
        records.append(make_entry(Kind.ALLOCATION_STARTED, now, {
            "account": first.namespace, "user": None, "partition": None, "nodes": node, "gpus": len(assigned),
            "kubernetes": {"namespace": first.namespace, "pod": first.pod,
                           "containers": sorted({a.container for a in assigned})}}, **keys(j, run)).to_record())
        for a in assigned:
            n = sharers[a.device]
            records.append(make_entry(Kind.DEVICE_BOUND, now, {
                "index": None, "uuid": a.device, "sku": None, "vendor": "amd" if a.resource.startswith("amd.com/")
                else "nvidia", "node": node, "resource": a.resource, "device_id": a.device_id,
                "replica": a.replica, "container": a.container, "sharers": n, "share_rule": _share_rule(a, n)},
                device=a.device, **keys(j, run)).to_record())
        open_runs[j] = {"run": run, "since": now, "devices": [a.device for a in assigned]}
        last_run[j] = run
        rep.started += 1
    # The pods holding a device changed (one joined or left): every pod that held it before and still does gets
    # a new device_bound restating its share from now on (a device-second is split among the pods holding it at
    # that second: method.shares.share_segments). A device one pod held throughout gets nothing new.
    members: dict[str, list[str]] = {}
    for j in sorted(open_runs):
        for dev in open_runs[j]["devices"]:
            members.setdefault(dev, []).append(j)
    before = state.get("members")
    if not isinstance(before, dict):
        before = {}
        for j, o in state.get("open", {}).items():
            for dev in o.get("devices", []):
                before.setdefault(dev, []).append(j)
        before = {d: sorted(v) for d, v in before.items()}
    for dev in sorted(members):
        now_m, was = members[dev], before.get(dev, [])
        if not was or now_m == sorted(was):
            continue
        for j in now_m:
            if j not in was:
                continue   # just bound above, with the share at this tick
            a = next(x for x in pods_now[j] if x.device == dev)
            n = len(now_m)
            records.append(make_entry(Kind.DEVICE_BOUND, now, {
                "index": None, "uuid": a.device, "sku": None, "vendor": "amd" if a.resource.startswith("amd.com/")
                else "nvidia", "node": node, "resource": a.resource, "device_id": a.device_id,
                "replica": a.replica, "container": a.container, "sharers": n, "share_rule": _share_rule(a, n),
                "restated": True}, device=a.device, **keys(j, open_runs[j]["run"])).to_record())
    return records, {"last_tick": now, "open": open_runs, "last_run": last_run, "members": members}, rep


def load_state(spool_dir: str) -> dict[str, Any]:
    try:
        data = json.loads((Path(spool_dir) / STATE_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(spool_dir: str, state: dict[str, Any]) -> None:
    path = Path(spool_dir) / STATE_NAME
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def collect_tick(cfg: PodRunsConfig, *, now: Callable[[], float] | None = None,
                 client: PodResourcesClient | None = None) -> TickReport:
    """Ask the kubelet, add the tick's records to the spool, keep the state. Never raises on a kubelet failure."""
    ts = (now or clock)()
    try:
        if client is not None:
            held = client.list()
        else:
            with PodResourcesClient(cfg.socket, cfg.timeout_s) as c:
                held = c.list()
    except KubeletUnavailable as exc:
        return TickReport(ts=ts, error=f"kubelet_unavailable: {exc}")
    Path(cfg.spool).mkdir(parents=True, exist_ok=True)
    records, state, rep = tick(load_state(cfg.spool), held, ts, node=cfg.node, cluster=cfg.cluster,
                               max_gap_s=cfg.max_gap_s)
    if records:
        rep.spool_file = str(spool.write(cfg.spool, records, prefix="k8s"))
    save_state(cfg.spool, state)
    return rep
