"""An independent fault generator: a 24-hour dcgm-exporter export of a small GPU hall with physically modelled
faults, and the truth computed from the injected parameters (``python -m bench.scenario --seed 3 --out DIR``).

Nothing here comes from ``ledger.method`` or ``ledger.agents`` (a test checks the imports): the demo hall's truth
is computed with the method's own bucket formulas, so scoring the agents against it cannot show that the method is
right. Here each device follows a small physical model instead:

- power  ``P = P_IDLE + P_DYN * activity * f**2`` with ``f`` the SM clock as a fraction of the 1,980 MHz maximum
  (H100 SXM datasheet); a power limit below the demand lowers ``f`` until ``P`` meets it (reason bit 0x4);
- temperature ``T = inlet + r * P``, with ``r`` the device's thermal resistance (°C/W); above the slowdown
  temperature the clock drops until ``T`` meets it (reason bit 0x20). A cooling failure raises the node's inlet and
  its ``r`` (lost airflow);
- stalls (a data loader, checkpoints) drop activity to ~0 while the process stays resident (framebuffer used);
- silicon drift lowers the clock a device sustains under load, with no reason bit;
- a correctable-ECC counter whose rate grows exponentially within hours;
- an XID 79 ("fallen off the bus"): the job dies, the device stops reporting for hours;
- a collector outage: a node reports nothing for a while, its jobs still running;
- an idle-held device: one GPU of a 4-GPU job with no process for hours;
- (``harder``, issue 28, from a stream of their own) a chassis with less airflow by design (``r`` 1.75-1.95x all
  day on every GPU of a node) running a heavy 4-GPU job, hot because working with the inlet normal; a failing fan
  on one GPU (its ``r`` ramps to 1.8-2.4x for 4-8 h: hot at its siblings' power); a sagging PSU's HW power-brake
  bursts (0x8 | 0x80, 0.5-2 min, the clock held to 40-60 %) on every GPU of a node, a few GPU-minutes each;
- (``lens``, issue 29, from a stream of their own, changing no array the faults above are drawn from) the pipes
  of every job (tensor, FP32, FP16, FP64 and DRAM activity: a GEMM-heavy training mix per job; one job per seed
  a memory-bound inference service, DRAM high and the pipes low); a spin-waiting job (for 3-6 h its ranks spin on
  a lock: the SMs stay as busy as before, the tensor and FP pipes and DRAM fall to ~0); and two MI300X nodes sent
  by ROCm's device-metrics-exporter with the total op counters, on which one GPU of a multi-GPU job is a slow
  part (it completes 80-90 % of its siblings' operations at the same MFMA activity, for 4-9 h).

Placement (which node, device, job and hour) is drawn per seed; healthy devices beside them carry their own noise
(a few 4x noisier than the rest, a steady trickle of correctable ECC errors on some). The truth of each fault is
the GPU-hours the injected parameters cost: Σ activity × (1 − f) × dt for clock losses, stalled / idle / silent
device-time for the rest.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

F_MAX_MHZ = 1980.0          # H100 SXM max SM clock (nvidia-smi -q "Max Clocks SM")
P_IDLE, P_DYN = 70.0, 580.0  # W: an H100 SXM idles near 70 W and draws up to its 700 W limit flat out
T_SLOWDOWN = 85.0           # °C where the driver starts pulling clocks (GPU slowdown temperature, H100 class)
MODEL = "NVIDIA H100 80GB HBM3"
T0 = 1_793_577_600.0        # 2026-11-02 00:00 UTC
HOUR = 3600.0
BIT_POWER, BIT_HW, BIT_THERMAL, BIT_BRAKE = 0x4, 0x8, 0x20, 0x80


@dataclass
class Fault:
    """One injected fault: what, where, when, and its true cost in GPU-hours."""

    cause: str                  # cooling | power_cap | idle_held | starved | drift | ecc | xid | collector_outage
    node: str
    start: float
    end: float
    gpu_hours: float = 0.0
    device: str | None = None   # UUID, for device-scale faults
    job: str | None = None
    devices: tuple[str, ...] = ()   # every device the fault touches (for "healthy device" scoring)
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"cause": self.cause, "node": self.node, "device": self.device, "job": self.job,
                "start": self.start, "end": self.end, "gpu_hours": round(self.gpu_hours, 4),
                "devices": list(self.devices), "params": self.params}


@dataclass
class Scenario:
    """The generated hall: per-device arrays (devices × steps), job labels, presence, and the faults."""

    seed: int
    t: np.ndarray
    cadence: float
    nodes: list[str]
    uuids: list[str]
    node_of: list[str]
    arrays: dict[str, np.ndarray]
    job: np.ndarray             # job index per (device, step), -1 = unallocated
    job_names: list[str]
    present: np.ndarray         # bool (device, step): a sample was scraped
    faults: list[Fault]
    jobs: dict[str, tuple[str, ...]] = field(default_factory=dict)   # job name -> its devices
    amd: "AmdNodes | None" = None   # the exporter-scraped MI300X nodes (``lens``)

    def truth(self) -> dict:
        devices = dict(zip(self.uuids, self.node_of))
        jobs = {j: list(d) for j, d in self.jobs.items()}
        if self.amd is not None:
            devices.update(zip(self.amd.keys, self.amd.node_of))
            jobs.update({j: list(d) for j, d in self.amd.jobs.items()})
        return {"seed": self.seed, "start": float(self.t[0]), "end": float(self.t[-1] + self.cadence),
                "cadence": self.cadence, "devices": devices, "jobs": jobs, "faults": [f.to_json() for f in self.faults]}


@dataclass
class AmdNodes:
    """MI300X nodes scraped by ROCm's device-metrics-exporter: per-device arrays (devices x steps), jobs."""

    nodes: list[str]
    keys: list[str]             # "<hostname>/gpu<id>": how the exporter's labels name each GPU
    node_of: list[str]
    arrays: dict[str, np.ndarray]   # sm, tensor, gfx, power, temp, ops (cumulative 16-bit op counter)
    job: np.ndarray
    job_names: list[str]
    jobs: dict[str, tuple[str, ...]]


def _lanes(rng: np.random.Generator, steps: int, cadence: float, protect: list[tuple[int, int]],
           min_h: float = 4.0, max_h: float = 11.0) -> list[tuple[int, int]]:
    """Job intervals (start, end steps) on one lane: random lengths and short gaps, no boundary inside ``protect``."""
    out, k = [], int(rng.uniform(0, 15 * 60) / cadence)
    while k < steps - int(HOUR / cadence):
        end = k + int(rng.uniform(min_h, max_h) * HOUR / cadence)
        for a, b in protect:
            if a - int(1800 / cadence) <= end <= b + int(1800 / cadence):
                end = b + int(rng.uniform(0.6, 2.0) * HOUR / cadence)
        end = min(end, steps)
        out.append((k, end))
        k = end + int(rng.uniform(3, 20) * 60 / cadence)
    return out


def _window(rng: np.random.Generator, steps: int, cadence: float, lo_h: float, hi_h: float,
            earliest_h: float = 2.0) -> tuple[int, int]:
    dur = int(rng.uniform(lo_h, hi_h) * HOUR / cadence)
    a = int(rng.uniform(earliest_h * HOUR / cadence, steps - dur - int(2 * HOUR / cadence)))
    return a, a + dur


def generate(seed: int, nodes: int = 8, gpus: int = 8, hours: float = 24.0, cadence: float = 30.0,
             harder: bool = True, lens: bool = True) -> Scenario:
    """One hall; ``harder`` adds the faults of issue 28 from a stream of their own: the first faults stay on their
    nodes (the chassis node's two lanes change the schedule, so the jobs and devices drawn after it may differ)."""
    rng = np.random.default_rng(seed)
    steps = int(hours * HOUR / cadence)
    t = T0 + np.arange(steps) * cadence
    node_names = [f"gpu-{rng.integers(100, 999)}-{i:02d}" for i in range(nodes)]
    n = nodes * gpus
    uuids = [f"GPU-{rng.integers(0, 2**32):08x}-{i:04x}-4{rng.integers(0, 4096):03x}-a000-{rng.integers(0, 2**48):012x}"
             for i in range(n)]
    node_of = [node_names[i // gpus] for i in range(n)]
    dev_of_node = {nd: list(range(k * gpus, (k + 1) * gpus)) for k, nd in enumerate(node_names)}

    # --- placement, drawn per seed: each node-scale or job-scale fault on its own node --------------------------
    order = list(rng.permutation(nodes))
    place = {c: node_names[order[i % nodes]] for i, c in enumerate(
        ["cooling", "collector_outage", "starved_loader", "starved_checkpoint", "power_cap", "idle_held",
         "drift", "ecc"])}
    place["xid"] = place["ecc"]     # a different device of that node (an ECC counter runs on, loaded or not)
    win = {"cooling": _window(rng, steps, cadence, 5, 9), "collector_outage": _window(rng, steps, cadence, 0.5, 1.5),
           "power_cap": _window(rng, steps, cadence, 8, 13, 1.0), "idle_held": _window(rng, steps, cadence, 3, 5),
           "xid": _window(rng, steps, cadence, 6, 10, 4.0), "drift": _window(rng, steps, cadence, 9, 12, 8.0),
           "ecc": _window(rng, steps, cadence, 6, 9, 8.0)}
    # issue 28's faults, drawn from their own stream: a chassis with less airflow by design running a heavy job
    # (hot because working), a failing fan on one GPU (hot at its siblings' power), a sagging PSU's brake bursts
    hr = np.random.default_rng([seed, 28])
    hot_node = str(hr.choice([x for x in node_names if x not in
                              (place["cooling"], place["xid"], place["idle_held"], place["collector_outage"])])) \
        if harder else None

    # --- schedule: per node one lane of 8-GPU jobs or two lanes of 4-GPU jobs ----------------------------------
    job = np.full((n, steps), -1, dtype=np.int32)
    job_names: list[str] = []
    jobs: dict[str, tuple[str, ...]] = {}
    lane_jobs: dict[tuple[str, int], list[int]] = {}
    xid_dev = dev_of_node[place["xid"]][int(rng.integers(0, gpus))]
    for nd in node_names:
        two = nd == place["idle_held"] or (nd != place["xid"] and (rng.random() < 0.4 or nd == hot_node))
        lanes = [dev_of_node[nd][:gpus // 2], dev_of_node[nd][gpus // 2:]] if two else [dev_of_node[nd]]
        protect = [win[c] for c in win if place.get(c) == nd and c not in ("xid",)]
        for li, devs in enumerate(lanes):
            prot = list(protect)
            if nd == place["xid"]:
                prot = [p for p in prot] + [(win["xid"][0] - int(2 * HOUR / cadence), win["xid"][0])]
            ivs = _lanes(rng, steps, cadence, prot)
            for a, b in ivs:
                if nd == place["xid"] and a < win["xid"][1] and b > win["xid"][0]:
                    if a >= win["xid"][0]:
                        continue                          # the lane waits for the lost device to come back
                    b = win["xid"][0] + 1                  # the job dies with the XID
                j = len(job_names)
                name = str(400000 + seed * 1000 + j)
                job_names.append(name)
                jobs[name] = tuple(uuids[d] for d in devs)
                lane_jobs.setdefault((nd, li), []).append(j)
                job[devs, a:b] = j
            if nd == place["xid"]:   # after the device returns, jobs resume on the lane
                k = win["xid"][1] + int(rng.uniform(10, 30) * 60 / cadence)
                if k < steps - int(HOUR / cadence):
                    j = len(job_names)
                    name = str(400000 + seed * 1000 + j)
                    job_names.append(name)
                    jobs[name] = tuple(uuids[d] for d in devs)
                    job[devs, k:] = j

    alloc = job >= 0
    # --- healthy physics ----------------------------------------------------------------------------------------
    job_level = rng.uniform(0.55, 0.92, size=max(1, len(job_names)))
    hot_job = None
    if harder:   # the hot chassis: its longest job on the first lane at full load, the others lighter
        first = dev_of_node[hot_node][0]
        on_node = {int(j) for j in np.unique(job[dev_of_node[hot_node]]) if j >= 0}
        hot_job = max((j for j in on_node if job_names[j] and (job[first] == j).any()),
                      key=lambda j: int((job[first] == j).sum()))
        for j in on_node:
            job_level[j] = hr.uniform(0.95, 0.99) if j == hot_job else min(job_level[j], hr.uniform(0.6, 0.78))
    noise = np.full(n, 0.03)
    noisy = rng.choice(n, size=3, replace=False)
    noise[noisy] = 0.12
    act = np.where(alloc, job_level[np.maximum(job, 0)] + rng.normal(0, 1, (n, steps)) * noise[:, None], 0.0)
    act = np.where(alloc, np.clip(act, 0.3, 1.0), 0.0)
    fb = np.where(alloc, rng.uniform(30_000, 70_000, n)[:, None] + rng.normal(0, 200, (n, steps)), 0.0)
    r_th = rng.normal(0.055, 0.003, n)
    inlet = np.array([rng.normal(24, 0.7) for _ in node_names])
    inlet_t = np.repeat(inlet, gpus)[:, None] + 0.8 * np.sin(2 * np.pi * (t - T0) / 86400.0)[None, :]
    if harder:   # less airflow by design, all day, on every GPU of the chassis (the inlet as everywhere)
        r_th[dev_of_node[hot_node]] *= hr.uniform(1.75, 1.95)
    r_t = np.repeat(r_th[:, None], steps, axis=1)
    f_cap = np.ones((n, steps))               # the clock each device can sustain (drift lowers it)
    p_limit = np.full((n, steps), 700.0)
    faults: list[Fault] = []
    sl = lambda w: slice(w[0], w[1])           # noqa: E731

    # cooling: the node's inlet rises, its airflow drops; in some seeds the same failure hits up to two more
    # nodes (a rack's row of them), so that "the other nodes at the same hour" are partly hot too
    others = [x for x in node_names if x != place["cooling"]]
    cool_nodes = [place["cooling"], *(str(x) for x in rng.choice(others, size=int(rng.integers(0, 3)), replace=False))]
    cool_nodes = [x for x in cool_nodes if x != hot_node]
    cd = [d for nd in cool_nodes for d in dev_of_node[nd]]
    d_in, d_r = rng.uniform(22, 28), rng.uniform(1.5, 1.8)
    inlet_t[cd, sl(win["cooling"])] += d_in
    r_t[cd, sl(win["cooling"])] *= d_r
    # power cap: one device's limit
    pc_dev = dev_of_node[place["power_cap"]][int(rng.integers(0, gpus))]
    limit = rng.uniform(250, 330)   # a board set to well under half its 700 W (nvidia-smi -pl), demand above it
    p_limit[pc_dev, sl(win["power_cap"])] = limit
    # drift: the clock a device sustains slides down
    dr_dev = dev_of_node[place["drift"]][int(rng.integers(0, gpus))]
    a, b = win["drift"]
    dmax = rng.uniform(0.06, 0.10)
    ramp = np.clip((np.arange(steps) - a) / (3 * HOUR / cadence), 0, 1)
    f_cap[dr_dev, a:] = 1.0 - dmax * ramp[a:]
    win["drift"] = (a, steps)

    # stalls: a data loader that starves every ~20 minutes, checkpoints every hour
    stall = np.zeros((n, steps), dtype=bool)
    for cause, every_min, lo, hi in (("starved_loader", 20, 3, 6), ("starved_checkpoint", 60, 8, 12)):
        nd = place[cause]
        cands = [j for (nn, _), js in lane_jobs.items() if nn == nd for j in js]
        j = max(cands, key=lambda j: int((job == j).sum()))
        devs = np.nonzero((job == j).any(axis=1))[0]
        cols = np.nonzero((job[devs[0]] == j))[0]
        k = cols[0] + int(rng.uniform(5, every_min) * 60 / cadence)
        while k < cols[-1]:
            ln = int(rng.uniform(lo, hi) * 60 / cadence)
            stall[devs, k:min(k + ln, cols[-1] + 1)] = True
            k += ln + int(rng.normal(every_min, every_min / 10) * 60 / cadence)
        h = float(stall[devs][:, cols].sum()) * cadence / HOUR
        name = job_names[j]
        faults.append(Fault("starved", nd, float(t[cols[0]]), float(t[cols[-1]] + cadence), h, job=name,
                            devices=jobs[name], params={"kind": cause.split("_")[1], "every_min": every_min}))
    act = np.where(stall, rng.uniform(0.0, 0.02, (n, steps)), act)

    # idle held: one GPU of a 4-GPU job without a process for hours
    idl_node = place["idle_held"]
    a, b = win["idle_held"]
    cands = [d for d in dev_of_node[idl_node] if job[d, a] >= 0 and job[d, a] == job[d, b - 1]]
    idle_dev = cands[int(rng.integers(0, len(cands)))] if cands else dev_of_node[idl_node][0]
    idle = np.zeros((n, steps), dtype=bool)
    idle[idle_dev, a:b] = alloc[idle_dev, a:b]
    act = np.where(idle, 0.0, act)
    fb = np.where(idle, 0.0, fb)

    # a failing fan on one GPU of a node nothing else heats: its thermal resistance ramps up over half an hour
    # to 1.8-2.4x for 4-8 hours; and a sagging PSU on another node: HW power-brake bursts (0x8 | 0x80) on all
    # its GPUs, 0.5-2 min each, a few an hour for 2-5 hours, the clock held to 40-60 % (small on each GPU)
    brake = np.zeros((n, steps), dtype=bool)
    brake_f = np.ones((n, steps))
    fan_dev = None
    if harder:
        quiet = [x for x in (place["starved_loader"], place["starved_checkpoint"], place["power_cap"],
                             place["idle_held"], place["drift"]) if x not in cool_nodes and x != hot_node]
        fan_node = str(hr.choice(quiet))
        fan_dev = int(hr.choice([d for d in dev_of_node[fan_node] if d not in (pc_dev, dr_dev, idle_dev)]))
        win["fan"] = _window(hr, steps, cadence, 4, 8)
        fa, fb_ = win["fan"]
        ramp = np.clip((np.arange(steps) - fa) / (1800 / cadence), 0, 1)
        r_t[fan_dev, fa:fb_] *= 1 + (hr.uniform(1.8, 2.4) - 1) * ramp[fa:fb_]
        brake_node = str(hr.choice([x for x in (place["starved_loader"], place["starved_checkpoint"],
                                                 place["idle_held"], place["drift"], place["ecc"])
                                    if x not in cool_nodes and x not in (hot_node, fan_node)]))
        win["power_brake"] = _window(hr, steps, cadence, 2, 5)
        k, pb = win["power_brake"]
        per_h = hr.uniform(2, 5)
        while True:
            k += max(1, int(hr.exponential(HOUR / per_h) / cadence))
            if k >= pb:
                break
            ln = int(hr.integers(1, 5))
            brake[dev_of_node[brake_node], k:min(k + ln, pb)] = True
            brake_f[dev_of_node[brake_node], k:min(k + ln, pb)] = hr.uniform(0.4, 0.6)
            k += ln

    # --- clocks, power, temperature from the physics -------------------------------------------------------------
    running = alloc & ~idle
    f = np.minimum(f_cap, 1.0)
    demand = P_IDLE + P_DYN * act * f ** 2
    reasons = np.zeros((n, steps), dtype=np.int64)
    capped = running & (demand > p_limit)
    f = np.where(capped, np.sqrt(np.clip((p_limit - P_IDLE) / (P_DYN * np.maximum(act, 1e-6)), 0, 1)), f)
    reasons |= np.where(capped, BIT_POWER, 0)
    power = P_IDLE + P_DYN * act * f ** 2
    temp = inlet_t + r_t * power
    hot = running & (temp > T_SLOWDOWN)
    f_hot = np.sqrt(np.clip(((T_SLOWDOWN - inlet_t) / r_t - P_IDLE) / (P_DYN * np.maximum(act, 1e-6)), 0.05, 1))
    f = np.where(hot, np.minimum(f, f_hot), f)
    reasons |= np.where(hot, BIT_THERMAL, 0)
    braked = running & brake
    f = np.where(braked, np.minimum(f, brake_f), f)
    reasons |= np.where(braked, BIT_HW | BIT_BRAKE, 0)
    power = P_IDLE + P_DYN * act * f ** 2
    temp = inlet_t + r_t * power
    clock_noise = np.abs(rng.normal(0, 6, (n, steps)))
    clock = np.where(running, f * F_MAX_MHZ - clock_noise, 345.0)
    power = power + rng.normal(0, 8, (n, steps))
    temp = temp + rng.normal(0, 0.6, (n, steps))

    def lost(mask: np.ndarray, ff: np.ndarray) -> float:
        return float((act * (1 - ff) * mask).sum() * cadence / HOUR)

    pm = np.zeros((n, steps), dtype=bool)
    pm[pc_dev, sl(win["power_cap"])] = True
    faults.append(Fault("power_cap", place["power_cap"], float(t[win["power_cap"][0]]),
                        float(t[win["power_cap"][1]]), lost(pm & capped & ~hot, f), device=uuids[pc_dev],
                        devices=(uuids[pc_dev],), params={"limit_w": round(limit)}))
    dm = np.zeros((n, steps), dtype=bool)
    dm[dr_dev, win["drift"][0]:] = True
    faults.append(Fault("drift", place["drift"], float(t[win["drift"][0]]), float(t[-1] + cadence),
                        lost(dm & running & ~capped & ~hot, f_cap), device=uuids[dr_dev], devices=(uuids[dr_dev],),
                        params={"clock_loss": round(dmax, 3)}))
    faults.append(Fault("idle_held", idl_node, float(t[win["idle_held"][0]]), float(t[win["idle_held"][1]]),
                        float(idle.sum()) * cadence / HOUR, device=uuids[idle_dev],
                        job=job_names[job[idle_dev, win["idle_held"][0]]], devices=(uuids[idle_dev],)))

    # --- counters and events ------------------------------------------------------------------------------------
    base = rng.integers(0, 60, n).astype(float)
    rate_h = np.where(rng.random(n) < 0.25, rng.uniform(0.5, 2.0, n), rng.uniform(0.0, 0.2, n))  # steady trickles
    lam = np.repeat(rate_h[:, None] * cadence / HOUR, steps, axis=1)
    ecc_dev = dev_of_node[place["ecc"]][int(rng.integers(0, gpus))]
    while ecc_dev == xid_dev:
        ecc_dev = dev_of_node[place["ecc"]][int(rng.integers(0, gpus))]
    a, _ = win["ecc"]
    tau = rng.uniform(1.5, 2.5) * HOUR
    lam[ecc_dev, a:] += 0.5 * np.exp((t[a:] - t[a]) / tau) * cadence / HOUR
    lam = np.minimum(lam, 400 * cadence / HOUR)
    ecc = base[:, None] + np.cumsum(rng.poisson(lam), axis=1)
    faults.append(Fault("ecc", place["ecc"], float(t[a]), float(t[-1] + cadence), 0.0, device=uuids[ecc_dev],
                        devices=(uuids[ecc_dev],), params={"doubling_h": round(tau * math.log(2) / HOUR, 2)}))
    xid = np.zeros((n, steps))
    present = np.ones((n, steps), dtype=bool)
    xa, xb = win["xid"]
    xid[xid_dev, xa] = 79
    present[xid_dev, xa + 1:xb] = False
    faults.append(Fault("xid", place["xid"], float(t[xa]), float(t[xb]), (xb - xa - 1) * cadence / HOUR,
                        device=uuids[xid_dev], devices=(uuids[xid_dev],), params={"xid": 79}))
    oa, ob = win["collector_outage"]
    on = dev_of_node[place["collector_outage"]]
    present[on, oa:ob] = False
    faults.append(Fault("collector_outage", place["collector_outage"], float(t[oa]), float(t[ob]),
                        float(alloc[on, oa:ob].sum()) * cadence / HOUR, devices=tuple(uuids[d] for d in on)))

    for nd in cool_nodes:   # what was observed of it: a sample the collector lost is unknown, not cooling
        wmask = np.zeros((n, steps), dtype=bool)
        wmask[dev_of_node[nd], sl(win["cooling"])] = True
        faults.append(Fault("cooling", nd, float(t[win["cooling"][0]]), float(t[win["cooling"][1]]),
                            lost(wmask & hot & present, f), devices=tuple(uuids[d] for d in dev_of_node[nd]),
                            params={"inlet_rise_c": round(d_in, 1), "thermal_resistance_factor": round(d_r, 2),
                                    "nodes_hit": len(cool_nodes)}))
    if harder:
        fm = np.zeros((n, steps), dtype=bool)
        fm[fan_dev, sl(win["fan"])] = True
        faults.append(Fault("fan", node_of[fan_dev], float(t[win["fan"][0]]), float(t[win["fan"][1]]),
                            lost(fm & hot & present, f), device=uuids[fan_dev], devices=(uuids[fan_dev],)))
        hd = np.nonzero((job == hot_job).any(axis=1))[0]
        cols = np.nonzero(job[hd[0]] == hot_job)[0]
        faults.append(Fault("hot_working", hot_node, float(t[cols[0]]), float(t[cols[-1]] + cadence),
                            lost((job == hot_job) & hot & present, f), job=job_names[hot_job],
                            devices=tuple(uuids[d] for d in hd), params={"level": round(float(job_level[hot_job]), 3)}))
        bm = braked & present & ~hot
        if bm.any():   # a brake that met no running GPU left nothing to see (the bits are set under load only)
            faults.append(Fault("power_brake", brake_node, float(t[win["power_brake"][0]]),
                                float(t[win["power_brake"][1]]), lost(bm, f),
                                devices=tuple(uuids[d] for d in dev_of_node[brake_node]),
                                params={"per_gpu_h": round(lost(bm, f) / gpus, 3)}))
    arrays = {"act": act, "clock": clock, "power": power, "temp": temp, "reasons": reasons.astype(float),
              "fb": fb, "ecc": ecc, "xid": xid}
    sc = Scenario(seed, t, cadence, node_names, uuids, node_of, arrays, job, job_names, present, faults, jobs)
    if lens:
        busy = {f.job for f in faults if f.job} | {job_names[j] for j in np.unique(job[xid_dev]) if j >= 0}
        _add_pipes(sc, np.random.default_rng([seed, 29]), job_level, f / 1.0, busy)
        sc.amd = _amd_nodes(sc, np.random.default_rng([seed, 29, 1]), gpus)
    return sc


# --- issue 29: what the pipes did (the effective-compute lens) -------------------------------------------------

PEAK_MI300X_FP16 = 1307.4e12   # MI300X dense FP16/BF16 (AMD's data sheet), operations a second


def _add_pipes(sc: Scenario, lr: np.random.Generator, job_level: np.ndarray, f: np.ndarray, busy: set) -> None:
    """The pipe activities of every job, a memory-bound inference job and a spin-waiting job (its fault): arrays
    ``tensor``, ``fp32``, ``fp16``, ``fp64``, ``dram`` beside SM activity, which none of this changes.

    Training (most jobs): a share of the SMs' busy time on the tensor cores (0.35-0.8), the rest of it partly on
    the FP32 pipe (element-wise work, x0.3), a little FP16 (x0.02), no FP64; DRAM at 0.3-0.45 x activity.
    Inference (one job not touched by a fault): SMs busy on memory-bound decode, DRAM 0.5-0.7, tensor and FP32
    at 1-4 %. Spin-waiting (one job at level >= 0.7, 5 h or longer, untouched by a fault, for 3-6 h of it): the
    ranks poll a flag, the SMs as busy as before, every pipe and DRAM under 2 %. Truth: the delivered time of
    those samples, Σ activity x clock fraction x dt."""
    n, steps = sc.job.shape
    nj = max(1, len(sc.job_names))
    share, dram_k = lr.uniform(0.35, 0.8, nj), lr.uniform(0.3, 0.45, nj)
    j = np.maximum(sc.job, 0)
    act = sc.arrays["act"]
    tensor = act * share[j]
    fp32 = act * (1 - share[j]) * 0.3
    fp16 = act * 0.02
    fp64 = np.zeros((n, steps))
    dram = act * dram_k[j]
    per_h = HOUR / sc.cadence
    length = {k: int((sc.job == k).any(axis=0).sum()) for k in range(len(sc.job_names))}
    free = [k for k in range(len(sc.job_names)) if sc.job_names[k] not in busy]
    spin_jobs = [k for k in free if job_level[k] >= 0.7 and length[k] >= 5 * per_h]
    spin_j = int(lr.choice(spin_jobs)) if spin_jobs else None
    inf = [k for k in free if k != spin_j and length[k] >= 2 * per_h]
    if inf:
        k = int(lr.choice(inf))
        m = sc.job == k
        dram = np.where(m, lr.uniform(0.5, 0.7, (n, steps)), dram)
        tensor = np.where(m, act * lr.uniform(0.01, 0.04, (n, steps)), tensor)
        fp32 = np.where(m, act * lr.uniform(0.01, 0.04, (n, steps)), fp32)
        fp16 = np.where(m, 0.0, fp16)
    if spin_j is not None:
        cols = np.nonzero((sc.job == spin_j).any(axis=0))[0]
        dur = int(lr.uniform(3, min(6, (len(cols) - per_h) / per_h)) * per_h)
        a = int(cols[0] + lr.uniform(0.3 * per_h, len(cols) - dur - 0.3 * per_h))
        m = np.zeros((n, steps), dtype=bool)
        m[:, a:a + dur] = sc.job[:, a:a + dur] == spin_j
        tensor = np.where(m, lr.uniform(0.0, 0.01, (n, steps)), tensor)
        fp32 = np.where(m, lr.uniform(0.0, 0.015, (n, steps)), fp32)
        fp16 = np.where(m, 0.0, fp16)
        dram = np.where(m, lr.uniform(0.005, 0.02, (n, steps)), dram)
        name = sc.job_names[spin_j]
        seen = m & sc.present
        devs = np.nonzero(m.any(axis=1))[0]
        sc.faults.append(Fault("spin_wait", sc.node_of[devs[0]], float(sc.t[a]), float(sc.t[a + dur - 1] + sc.cadence),
                               float((np.clip(act, 0, 1) * f * seen).sum()) * sc.cadence / HOUR, job=name,
                               devices=sc.jobs[name], params={"hours": round(dur / per_h, 2)}))
    sc.arrays.update(tensor=np.clip(tensor, 0, 1), fp32=np.clip(fp32, 0, 1), fp16=np.clip(fp16, 0, 1), fp64=fp64,
                     dram=np.clip(dram, 0, 1))


def _amd_nodes(sc: Scenario, lr: np.random.Generator, gpus: int) -> AmdNodes:
    """Two MI300X nodes under jobs of 4 or 8 GPUs (no fault but the slow part): SM activity at the job's level,
    MFMA (tensor) activity a share of it, power P = 150 + 600 x activity, temperature inlet + 0.085 W; each GPU
    completes ``tensor x peak x efficiency`` operations a second (efficiency 0.45-0.6 per job, each GPU within
    +-1.5 % of it, +-1 % a sample). The slow part: one GPU of a job, 80-90 % of that from a random time for 4-9 h
    (the same MFMA activity, no clock change). Truth: the tensor time it fell short, Σ tensor x (1 - factor) x dt."""
    steps = len(sc.t)
    nodes = [f"mi300x-{lr.integers(100, 999)}-{k:02d}" for k in range(2)]
    n = len(nodes) * gpus
    keys = [f"{nd}/gpu{i}" for nd in nodes for i in range(gpus)]
    node_of = [nd for nd in nodes for _ in range(gpus)]
    job = np.full((n, steps), -1, dtype=np.int32)
    names: list[str] = []
    jobs: dict[str, tuple[str, ...]] = {}
    for k, nd in enumerate(nodes):
        base = k * gpus
        lanes = [list(range(base, base + gpus))] if lr.random() < 0.5 else \
            [list(range(base, base + gpus // 2)), list(range(base + gpus // 2, base + gpus))]
        for lane in lanes:
            for a, b in _lanes(lr, steps, sc.cadence, []):
                jj = len(names)
                names.append(str(700000 + sc.seed * 1000 + jj))
                jobs[names[-1]] = tuple(keys[d] for d in lane)
                job[lane, a:b] = jj
    on = job >= 0
    level = lr.uniform(0.6, 0.92, max(1, len(names)))
    share = lr.uniform(0.4, 0.8, max(1, len(names)))
    eff = lr.uniform(0.45, 0.6, max(1, len(names)))
    jj = np.maximum(job, 0)
    sm = np.where(on, np.clip(level[jj] + lr.normal(0, 0.03, (n, steps)), 0.3, 1.0), 0.0)
    tensor = sm * share[jj]
    rate = tensor * PEAK_MI300X_FP16 * eff[jj] * lr.normal(1.0, 0.015, n)[:, None] * lr.normal(1.0, 0.01, (n, steps))
    per_h = HOUR / sc.cadence
    # the slow part: one GPU of a job of 4 or more GPUs lasting 5 h or longer
    cands = [(jn, d) for jn, devs in jobs.items() if len(devs) >= 4 and int((job == names.index(jn)).any(axis=0).sum())
             >= 5 * per_h for d in devs] or [(jn, d) for jn, devs in jobs.items() for d in devs]
    jn, dev = cands[int(lr.integers(0, len(cands)))]
    di, ji = keys.index(dev), names.index(jn)
    cols = np.nonzero(job[di] == ji)[0]
    dur = int(min(lr.uniform(4, 9) * per_h, len(cols) - 0.5 * per_h))
    a = int(cols[0] + lr.uniform(0, len(cols) - dur))
    factor = lr.uniform(0.8, 0.9)
    rate[di, a:a + dur] *= factor
    sc.faults.append(Fault("slow_part", node_of[di], float(sc.t[a]), float(sc.t[a + dur - 1] + sc.cadence),
                           float((tensor[di, a:a + dur] * (1 - factor)).sum()) * sc.cadence / HOUR, device=dev,
                           job=jn, devices=(dev,), params={"ops_factor": round(factor, 3)}))
    power = np.where(on, 150.0 + 600.0 * sm, 140.0) + lr.normal(0, 6, (n, steps))
    temp = 24.0 + 0.085 * power + lr.normal(0, 0.5, (n, steps))
    ops = np.mod(np.cumsum(rate * sc.cadence, axis=1) - rate * sc.cadence, 2.0 ** 64)   # a uint64 counter
    arrays = {"sm": sm, "tensor": tensor, "gfx": np.clip(sm * 1.04, 0, 1), "power": power, "temp": temp, "ops": ops}
    return AmdNodes(nodes, keys, node_of, arrays, job, names, jobs)


METRICS = (("DCGM_FI_PROF_SM_ACTIVE", "act", "{:.4f}"), ("DCGM_FI_DEV_SM_CLOCK", "clock", "{:.0f}"),
           ("DCGM_FI_DEV_POWER_USAGE", "power", "{:.2f}"), ("DCGM_FI_DEV_GPU_TEMP", "temp", "{:.0f}"),
           ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "reasons", "{:.0f}"), ("DCGM_FI_DEV_FB_USED", "fb", "{:.0f}"),
           ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc", "{:.0f}"), ("DCGM_FI_DEV_XID_ERRORS", "xid", "{:.0f}"))
PIPE_METRICS = (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor", "{:.4f}"), ("DCGM_FI_PROF_DRAM_ACTIVE", "dram", "{:.4f}"),
                ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64", "{:.4f}"), ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32", "{:.4f}"),
                ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16", "{:.4f}"))
# ROCm device-metrics-exporter names (lower case behind amd_, as its published queries use them); percent scales
AMD_METRICS = (("amd_gpu_prof_sm_active", "sm", 100.0, "{:.1f}"),
               ("amd_gpu_prof_tensor_active_percent", "tensor", 100.0, "{:.1f}"),
               ("amd_gpu_gfx_activity", "gfx", 100.0, "{:.0f}"), ("amd_gpu_package_power", "power", 1.0, "{:.0f}"),
               ("amd_gpu_junction_temperature", "temp", 1.0, "{:.0f}"), ("amd_gpu_prof_total_16_ops", "ops", 1.0, "{!r}"))


def write_export(sc: Scenario, path: Path) -> Path:
    """A Prometheus ``/api/v1/query_range`` matrix as dcgm-exporter with ``hpc_job`` labels would give it: one
    series per device, metric and job (and one for the device's unallocated time)."""
    result = []
    for i, uuid in enumerate(sc.uuids):
        base = {"gpu": str(i % 8), "UUID": uuid, "device": f"nvidia{i % 8}", "modelName": MODEL,
                "Hostname": sc.node_of[i], "job": "dcgm-exporter", "instance": f"{sc.node_of[i]}:9400"}
        jrow = sc.job[i]
        for jid in np.unique(jrow):
            sel = (jrow == jid) & sc.present[i]
            if not sel.any():
                continue
            labels = dict(base, hpc_job=sc.job_names[jid]) if jid >= 0 else base
            ts = sc.t[sel].tolist()
            for name, key, fmt in METRICS + (PIPE_METRICS if "tensor" in sc.arrays else ()):
                vals = sc.arrays[key][i, sel].tolist()
                result.append({"metric": {"__name__": name, **labels},
                               "values": [[tt, fmt.format(v)] for tt, v in zip(ts, vals)]})
    am = sc.amd
    for i, key in enumerate(am.keys if am is not None else []):
        node, gpu = key.split("/gpu")
        base = {"gpu_id": gpu, "hostname": node, "card_model": "AMD Instinct MI300X",
                "serial_number": f"6923{i:08d}", "job": "amd-device-metrics-exporter", "instance": f"{node}:5000"}
        for jid in np.unique(am.job[i]):
            sel = am.job[i] == jid
            labels = dict(base, job_id=am.job_names[jid]) if jid >= 0 else base
            ts = sc.t[sel].tolist()
            for name, k, scale, fmt in AMD_METRICS:
                vals = (am.arrays[k][i, sel] * scale).tolist()
                result.append({"metric": {"__name__": name, **labels},
                               "values": [[tt, fmt.format(float(v))] for tt, v in zip(ts, vals)]})
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}},
                               separators=(",", ":")) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="directory for export.json and truth.json")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    sc = generate(a.seed)
    write_export(sc, a.out / "export.json")
    (a.out / "truth.json").write_text(json.dumps(sc.truth(), indent=1) + "\n")
    print(f"{a.out / 'export.json'}: {len(sc.uuids)} GPUs, {len(sc.faults)} faults")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
