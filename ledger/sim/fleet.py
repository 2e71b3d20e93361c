"""The demo hall's fleet simulator: racks of GPU nodes, a week of Slurm-like jobs, telemetry, injected faults.

Everything is generated with numpy arrays of shape (devices, steps) so a week of 5-minute samples for a few
hundred GPUs takes seconds. The simulator knows what it injected; :func:`simulate` returns that ground truth
beside the data, computed over the samples the ledger will actually hold (a sample lost to a collector outage
cannot be attributed by anyone, so it is not counted in another fault's truth).

Physical model (deliberately simple, documented in docs/demo.md):
  power  = idle + (work_power - idle) * activity            (per-device efficiency factor)
  temp   = rack inlet + device offset + k * power           (k = 0.065 degC/W)
  thermal slowdown above 85 degC (clock-event bit 0x20); a power cap lowers the clock until power fits (0x4).
"""

from __future__ import annotations

import uuid as uuid_mod
from dataclasses import dataclass, field

import numpy as np

CADENCE_S = 300
T0 = 1793577600  # 2026-11-02T00:00:00Z, a Monday: the demo week is ISO week 2026-W45
K_TEMP = 0.065
THERMAL_LIMIT_C = 85.0

SKUS = {
    "NVIDIA": {"sku": "H100-SXM5-80GB", "rated_mhz": 1980.0, "idle_mhz": 345.0, "idle_w": 70.0, "work_w": 640.0,
               "tdp_w": 700.0, "fb_mib": 81559.0},
    "AMD": {"sku": "MI300X", "rated_mhz": 2100.0, "idle_mhz": 132.0, "idle_w": 140.0, "work_w": 680.0,
            "tdp_w": 750.0, "fb_mib": 196592.0},
}

# (account, partition, qos, share of jobs)
TENANTS = [
    ("astro", "gpu", "normal", 0.25),
    ("climate", "gpu-long", "normal", 0.2),
    ("nlp", "gpu", "high", 0.25),
    ("bio", "gpu", "normal", 0.2),
    ("vision", "interactive", "normal", 0.1),
]

BIT_IDLE, BIT_PCAP, BIT_HWSLOW, BIT_THERM = 0x1, 0x4, 0x8, 0x20


@dataclass(frozen=True)
class FleetSpec:
    """Size and shape of the simulated hall. Defaults fit `make demo` in well under 3 minutes on 2 cores."""

    nvidia_racks: int = 4
    nodes_per_rack: int = 4
    gpus_per_node: int = 8
    amd_nodes: int = 1
    days: int = 7
    cadence_s: int = CADENCE_S
    cluster: str = "demo"

    @classmethod
    def small(cls) -> "FleetSpec":
        return cls(nvidia_racks=3, nodes_per_rack=3, days=5)


@dataclass
class Device:
    uuid: str
    node: str
    rack: str
    index: int
    vendor: str
    sku: str


@dataclass
class Job:
    job_id: str
    run: int
    tenant: str
    partition: str
    qos: str
    node: str
    devs: list[int]          # indices into the device table
    start: int               # step (inclusive)
    end: int                 # step (exclusive)
    level: float
    tensor: float
    ckpt_every: int
    state: str = "COMPLETED"
    exit_code: int = 0
    tags: set = field(default_factory=set)
    progress: list[int] = field(default_factory=list)   # steps at which a checkpoint completed


@dataclass
class Simulation:
    spec: FleetSpec
    seed: int
    devices: list[Device]
    jobs: list[Job]
    t: np.ndarray                     # (T,) epoch seconds of each step
    arrays: dict[str, np.ndarray]     # metric -> (D, T)
    present: np.ndarray               # (D, T) bool: a sample exists
    alloc: np.ndarray                 # (D, T) int: index into jobs, -1 unallocated
    gaps: list[dict]                  # unknown intervals the collector itself recorded (entries)
    truth: dict


def _uuid(rng: np.random.Generator, vendor: str) -> str:
    u = str(uuid_mod.UUID(bytes=rng.bytes(16)))
    return ("GPU-" + u) if vendor == "NVIDIA" else u


def _fleet(spec: FleetSpec, rng: np.random.Generator) -> list[Device]:
    devs = []
    for r in range(spec.nvidia_racks):
        for n in range(spec.nodes_per_rack):
            node = f"{chr(ord('A') + r)}{n + 1}"
            for i in range(spec.gpus_per_node):
                devs.append(Device(_uuid(rng, "NVIDIA"), node, f"R{r + 1}", i, "NVIDIA", SKUS["NVIDIA"]["sku"]))
    for m in range(spec.amd_nodes):
        rack = f"R{spec.nvidia_racks + 1}"
        for i in range(spec.gpus_per_node):
            devs.append(Device(_uuid(rng, "AMD"), f"M{m + 1}", rack, i, "AMD", SKUS["AMD"]["sku"]))
    return devs


def _schedule(spec: FleetSpec, devices: list[Device], T: int, rng: np.random.Generator) -> list[Job]:
    """Per half-node slot (4 GPUs), a sequence of jobs with short gaps between them."""
    nodes: dict[str, list[int]] = {}
    for i, d in enumerate(devices):
        nodes.setdefault(d.node, []).append(i)
    shares = np.array([s for *_, s in TENANTS])
    raw = []
    half = spec.gpus_per_node // 2
    for node, idx in nodes.items():
        for slot in (idx[:half], idx[half:]):
            t = int(rng.integers(0, 12))
            while t < T - 6:
                length = int(rng.integers(24, 168))            # 2 h .. 14 h
                end = min(T, t + length)
                ten = TENANTS[int(rng.choice(len(TENANTS), p=shares / shares.sum()))]
                raw.append((t, node, slot, end, ten))
                t = end + int(rng.integers(1, 8))
    raw.sort(key=lambda r: (r[0], r[1], r[2][0]))
    jobs = []
    for k, (start, node, slot, end, ten) in enumerate(raw):
        jobs.append(Job(job_id=str(400000 + k), run=0, tenant=ten[0], partition=ten[1], qos=ten[2], node=node,
                        devs=list(slot), start=start, end=end, level=float(rng.uniform(0.55, 0.92)),
                        tensor=float(rng.uniform(0.3, 0.7)), ckpt_every=int(rng.integers(18, 30))))
    return jobs


def _win(day: float, hour: float, spec: FleetSpec) -> int:
    return int(round((day * 86400 + hour * 3600) / spec.cadence_s))


def simulate(spec: FleetSpec = FleetSpec(), seed: int = 0) -> Simulation:
    rng = np.random.default_rng(seed)
    devices = _fleet(spec, rng)
    D, T = len(devices), spec.days * 86400 // spec.cadence_s
    dt = float(spec.cadence_s)
    t = T0 + np.arange(T, dtype=float) * dt
    jobs = _schedule(spec, devices, T, rng)
    racks = sorted({d.rack for d in devices})
    rack_of = np.array([racks.index(d.rack) for d in devices])
    node_names = sorted({d.node for d in devices}, key=lambda n: (n[0], int(n[1:])))
    node_of = np.array([node_names.index(d.node) for d in devices])
    is_amd = np.array([d.vendor == "AMD" for d in devices])
    sku = [SKUS[d.vendor] for d in devices]
    rated = np.array([s["rated_mhz"] for s in sku])[:, None]
    idle_mhz = np.array([s["idle_mhz"] for s in sku])[:, None]
    idle_w = np.array([s["idle_w"] for s in sku])[:, None]
    work_w = np.array([s["work_w"] for s in sku])[:, None]
    fb_max = np.array([s["fb_mib"] for s in sku])[:, None]

    # --- choose where the faults go (fixed roles, so every seed has every fault) --------------------------
    R = spec.nvidia_racks
    npr = spec.nodes_per_rack
    assert R >= 3 and npr >= 3, "the demo hall needs at least 3 NVIDIA racks of 3 nodes"

    def node_dev(r: int, n: int) -> list[int]:
        name = f"{chr(ord('A') + r)}{n + 1}"
        return [i for i, d in enumerate(devices) if d.node == name]

    cool_rack = 2                                  # rack R3
    pcap_node = node_dev(0, 1)                     # node A2
    drift_dev = node_dev(1, 1)[5]                  # a GPU in node B2
    xid_dev = node_dev(1, npr - 1)[2]              # a GPU in the last node of rack R2
    restart_node = node_dev(0, npr - 1)            # last node of R1: DCGM host engine restart
    outage_node = node_dev(1, 0)                   # node B1: collector down
    hot_node = node_dev(0, 0)                      # node A1: its own cooling fails (a rear-door / fan fault)
    healthy_noisy = [node_dev(0, npr - 1)[4], node_dev(1, 2)[6], node_dev(0, npr - 1)[1]]
    days = spec.days
    cool_w = (_win(min(2, days - 2), 10, spec), _win(min(3, days - 1), 16, spec))
    pcap_w = (_win(1, 6, spec), _win(min(4, days - 1), 18, spec))
    drift_start = _win(1.5, 0, spec)
    storage_w = (_win(days - 3, 0, spec), _win(days - 2, 12, spec))
    restart_w = (_win(days - 2, 14, spec), _win(days - 2, 14, spec) + 4)
    outage_w = (_win(days - 1, 3, spec), _win(days - 1, 6, spec))

    # tenant roles: some interactive jobs left idle; one nlp job requeued after a node failure
    alloc = np.full((D, T), -1, dtype=np.int64)
    for k, j in enumerate(jobs):
        alloc[j.devs, j.start:j.end] = k
    vision = [j for j in jobs if j.tenant == "vision" and j.end - j.start >= 60 and
              not set(j.devs) & {xid_dev, drift_dev, *outage_node, *restart_node}]
    for j in vision[:3]:
        j.tags.add("idle_held")
    # --- per-device traits -----------------------------------------------------------------------------------
    noise = np.ones((D, 1))
    noise[healthy_noisy] = 4.0
    eff = rng.normal(1.0, 0.03, (D, 1))
    toff = rng.normal(0.0, 1.5, (D, 1))
    inlet = 22.0 + rng.normal(0, 0.6, (len(racks), 1)) + 1.5 * np.sin(2 * np.pi * (t[None, :] - T0) / 86400.0)
    inlet = inlet + rng.normal(0, 0.3, inlet.shape)
    cool_extra = np.zeros(T)
    a, b = cool_w
    ramp = 12
    cool_extra[a:b] = 26.0
    cool_extra[a:a + ramp] = np.linspace(0, 26.0, ramp)
    cool_extra[b - ramp:b] = np.linspace(26.0, 0, ramp)
    inlet_dev = inlet[rack_of]                                      # (D, T)
    inlet_fault = inlet_dev + np.where(rack_of[:, None] == cool_rack, cool_extra[None, :], 0.0)
    node_w = (_win(days - 2, 8, spec), _win(days - 2, 20, spec))
    node_extra = np.zeros(T)
    node_extra[node_w[0]:node_w[1]] = 22.0
    node_extra[node_w[0]:node_w[0] + 6] = np.linspace(0, 22.0, 6)
    inlet_fault[hot_node] += node_extra[None, :]

    # --- activity and process presence -------------------------------------------------------------------
    act = np.zeros((D, T))
    procs = np.zeros((D, T))
    starved = np.zeros((D, T), dtype=bool)
    xid = np.zeros((D, T))
    tensor = np.zeros((D, T))
    for k, j in enumerate(jobs):
        L = j.end - j.start
        lvl = np.full((len(j.devs), L), j.level)
        lvl[:, 0] = j.level * 0.4                      # start-up
        on = np.ones((len(j.devs), L))
        # checkpoints: short dips normally; long stalls while checkpoint storage is slow (climate writes big ones)
        for c in range(j.ckpt_every, L, j.ckpt_every):
            s = j.start + c
            n = int(rng.integers(4, 7))
            if j.tenant == "climate" and storage_w[0] <= s < storage_w[1] and c + n < L:
                lvl[:, c:c + n] = 0.01
                starved[np.ix_(j.devs, range(s, min(j.end, s + n)))] = True
                j.tags.add("starved")
                j.progress.append(min(j.end, s + n))
            else:
                lvl[:, c] *= 0.5
                j.progress.append(s + 1)
        if "idle_held" in j.tags:
            cut = int(rng.integers(6, 18))
            on[:, cut:] = 0.0
        act[j.devs, j.start:j.end] = lvl * on
        tensor[j.devs, j.start:j.end] = j.tensor
        procs[j.devs, j.start:j.end] = on
    act = np.clip(act + rng.normal(0, 0.025, (D, T)) * noise * (act > 0.05), 0.0, 1.0)
    # XID 119 (GSP RPC timeout) on one device: each event kills the process on it for 30-60 minutes
    xid_alloc = np.flatnonzero(alloc[xid_dev] >= 0)
    xid_events = sorted(rng.choice(xid_alloc[(xid_alloc > 12) & (xid_alloc < T - 24)], size=5, replace=False))
    xid_stall = np.zeros(T, dtype=bool)
    for s in xid_events:
        xid[xid_dev, s] = 119.0
        n = int(rng.integers(6, 13))
        xid_stall[s:s + n] = True
    xid_stall &= alloc[xid_dev] >= 0
    act[xid_dev, xid_stall] = 0.0
    procs[xid_dev, xid_stall] = 0.0
    starved &= procs > 0          # a stalled (XID) sample is idle, not starved
    running = procs > 0

    # --- power, temperature, clocks -------------------------------------------------------------------------
    demand = idle_w + (work_w * eff - idle_w) * act
    demand = np.where(running, demand + 25.0, idle_w)
    clk = np.where(running, rated + rng.normal(0, 6.0, (D, T)) * noise, idle_mhz)
    clk = np.minimum(clk, rated * 1.0)
    reasons = np.where(running, 0, BIT_IDLE).astype(np.int64)
    # power cap on one node: 420 W limit left behind by a maintenance script
    pcap = np.zeros((D, T), dtype=bool)
    pcap[np.ix_(pcap_node, range(*pcap_w))] = True
    cap = 420.0
    capped = pcap & running & (demand > cap)
    ratio_cap = np.where(capped, np.clip((cap - idle_w) / np.maximum(demand - idle_w, 1.0), 0.3, 1.0), 1.0)
    power = np.where(capped, cap + rng.normal(0, 3.0, (D, T)), demand + rng.normal(0, 6.0, (D, T)) * noise)
    clk = clk * ratio_cap
    reasons = np.where(capped, reasons | BIT_PCAP, reasons)

    def thermal(inl: np.ndarray, pw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raw = inl + 18.0 + toff + K_TEMP * pw
        over = np.maximum(raw - THERMAL_LIMIT_C, 0.0)
        ratio = np.where(running & (over > 0), np.clip(1.0 - 0.025 * over, 0.45, 1.0), 1.0)
        return raw, ratio

    raw_base, ratio_base = thermal(inlet_dev, power)
    raw_fault, ratio_th = thermal(inlet_fault, power)
    throttled_th = ratio_th < 1.0
    temp = np.where(throttled_th, THERMAL_LIMIT_C + 0.15 * (raw_fault - THERMAL_LIMIT_C), raw_fault)
    temp = temp + rng.normal(0, 0.7, (D, T)) * noise
    power = np.where(throttled_th, idle_w + (power - idle_w) * (0.35 + 0.65 * ratio_th), power)
    clk = clk * ratio_th
    reasons = np.where(throttled_th, reasons | BIT_THERM, reasons)
    # the slow drifter: clocks sag with no clock-event reason, correctable ECC errors accelerate
    drift = np.zeros(T)
    span = T - drift_start
    drift[drift_start:] = 0.2 * (np.arange(span) / span) ** 1.2
    clk[drift_dev] = np.where(running[drift_dev], clk[drift_dev] * (1.0 - drift), clk[drift_dev])
    ecc_rate = np.full((D, T), 0.6 / (86400 / dt))
    ecc_rate[drift_dev] += 400.0 * drift ** 2 / (86400 / dt)
    ecc = np.cumsum(rng.poisson(ecc_rate), axis=1) + rng.integers(0, 40, (D, 1))
    fb = np.where(running, fb_max * np.clip(0.55 + 0.4 * act, 0, 0.97), 0.0)
    fb = np.where(running & (act < 0.05), fb_max * 0.6, fb)

    # --- requeue: one nlp job's node fails, Slurm requeues it (run 1) --------------------------------------
    cand = [j for j in jobs if j.tenant == "nlp" and j.end - j.start > 100 and not j.tags
            and not set(j.devs) & {xid_dev, drift_dev} and cool_w[1] < j.start]
    req_truth = None
    if cand:
        j = cand[0]
        mid = j.start + int((j.end - j.start) * 0.45)
        fail = max([p for p in j.progress if p <= mid], default=j.start) + max(2, j.ckpt_every // 2)
        last_ck = max([p for p in j.progress if p <= fail], default=j.start)
        k = jobs.index(j)
        run1 = Job(job_id=j.job_id, run=1, tenant=j.tenant, partition=j.partition, qos=j.qos, node=j.node,
                   devs=j.devs, start=fail + 6, end=j.end, level=j.level, tensor=j.tensor, ckpt_every=j.ckpt_every,
                   progress=[p for p in j.progress if p > fail + 6])
        j.progress = [p for p in j.progress if p <= fail]
        j.end, j.state, j.exit_code = fail, "NODE_FAIL", 1
        j.tags.add("requeued")
        jobs.append(run1)
        alloc[j.devs, fail:fail + 6] = -1
        alloc[j.devs, fail + 6:run1.end] = len(jobs) - 1
        for arr, v in ((act, 0.0), (procs, 0.0), (fb, 0.0)):
            arr[np.ix_(j.devs, range(fail, fail + 6))] = v
        req_truth = dict(job=j, lost_steps=fail - last_ck, k=k)
    running = procs > 0

    # --- what the collector recorded ---------------------------------------------------------------------------
    present = rng.random((D, T)) >= 0.002          # an occasional missed scrape (0.2 %), as real collectors have
    present[np.ix_(restart_node, range(*restart_w))] = False
    present[np.ix_(outage_node, range(*outage_w))] = False
    arrays = {
        "sm_active": np.round(act, 4), "tensor_active": np.round(act * tensor, 4),
        "sm_clock_mhz": np.round(clk), "power_w": np.round(np.maximum(power, idle_w * 0.9), 3),
        "gpu_temp_c": np.round(temp), "ecc_sbe_aggregate": ecc.astype(float), "xid": xid,
        "fb_used_mib": np.round(fb), "compute_procs": procs, "clock_reasons": reasons,
        "gpu_util": np.round(np.minimum(1.0, act * 1.15 + 0.02 * running), 2),
    }
    # each device's cumulative energy counter (NVML / amd-smi, as the collector stores it: joules), from a reading
    # at the week's start as if the driver had loaded before it: at each step what the device drew in the steps
    # before, at the power it reported. Drawn from no random number, so every other array stays as it was.
    pw = arrays["power_w"] * dt
    arrays["energy_j"] = np.round(1e6 * (1.0 + np.arange(D))[:, None] + np.cumsum(pw, axis=1) - pw, 3)
    gaps = [{"node": devices[restart_node[0]].node, "start": float(t[restart_w[0]]),
             "end": float(t[restart_w[0]] + (restart_w[1] - restart_w[0]) * dt),
             "cause": "dcgm_host_engine_restart",
             "detail": "nv-hostengine restarted; DCGM job stats and field watches were lost for this span"}]

    # --- ground truth ------------------------------------------------------------------------------------------
    h = dt / 3600.0
    rated_b = np.broadcast_to(rated, (D, T))
    allocated = alloc >= 0
    seen = present & allocated
    faults = []

    def span_of(mask_t: np.ndarray) -> tuple[float, float]:
        idx = np.flatnonzero(mask_t)
        return float(t[idx[0]]), float(t[idx[-1]] + dt)

    def add(fid, cause, kind, level, hours, start, end, **scope):
        faults.append({"id": fid, "cause": cause, "kind": kind, "scope": {"level": level, **scope},
                       "start": start, "end": end, "gpu_hours": round(float(hours), 4)})

    in_node = np.zeros(D, dtype=bool)
    in_node[hot_node] = True
    loss_node = np.where(seen & in_node[:, None], act * (ratio_base - ratio_th), 0.0)
    add("F-cooling-node", "cooling", "hot_because_cooling", "node", loss_node.sum() * h, float(t[node_w[0]]),
        float(t[node_w[1] - 1] + dt), node=devices[hot_node[0]].node, rack=devices[hot_node[0]].rack)
    in_rack = rack_of == cool_rack
    loss_cool = np.where(seen & in_rack[:, None], act * (ratio_base - ratio_th), 0.0)
    add("F-cooling", "cooling", "hot_because_cooling", "rack", loss_cool.sum() * h,
        float(t[cool_w[0]]), float(t[cool_w[1] - 1] + dt), rack=racks[cool_rack])
    loss_pcap = np.where(seen & pcap, act * (1.0 - ratio_cap), 0.0)
    add("F-power-cap", "power_cap", "power_cap", "node", loss_pcap.sum() * h, float(t[pcap_w[0]]),
        float(t[pcap_w[1] - 1] + dt), node=devices[pcap_node[0]].node, rack=devices[pcap_node[0]].rack)
    dmask = seen[drift_dev] & running[drift_dev]
    loss_drift = np.where(dmask, act[drift_dev] * ratio_th[drift_dev] * ratio_cap[drift_dev] * drift, 0.0)
    dd = devices[drift_dev]
    add("F-drift", "drift", "ecc_drift", "device", loss_drift.sum() * h, float(t[drift_start]), float(t[-1] + dt),
        device_uuid=dd.uuid, node=dd.node, rack=dd.rack)
    xd = devices[xid_dev]
    xs = xid_stall & present[xid_dev]
    add("F-xid", "xid", "xid", "device", xs.sum() * h, float(t[xid_events[0]]),
        float(t[np.flatnonzero(xid_stall)[-1]] + dt), device_uuid=xd.uuid, node=xd.node, rack=xd.rack,
        xid=119, events=len(xid_events))
    for k, j in enumerate(jobs):
        if "starved" in j.tags:
            m = starved[j.devs, j.start:j.end] & present[j.devs, j.start:j.end]
            cols = np.flatnonzero(m.any(axis=0)) + j.start
            add(f"F-starved-{j.job_id}", "checkpoint_starved", "starved", "job", m.sum() * h,
                float(t[cols[0]]), float(t[cols[-1]] + dt), job_id=j.job_id, tenant=j.tenant, node=j.node)
        if "idle_held" in j.tags:
            m = (~running[j.devs, j.start:j.end]) & present[j.devs, j.start:j.end]
            cols = np.flatnonzero(m.any(axis=0)) + j.start
            add(f"F-idle-{j.job_id}", "idle_held", "idle_held", "job", m.sum() * h, float(t[cols[0]]),
                float(t[cols[-1]] + dt), job_id=j.job_id, tenant=j.tenant, node=j.node)
    g = gaps[0]
    m = allocated[restart_node][:, restart_w[0]:restart_w[1]]
    add("F-dcgm-restart", "dcgm_host_engine_restart", "unknown_gap", "node", m.sum() * h, g["start"], g["end"],
        node=g["node"], rack=devices[restart_node[0]].rack)
    m = allocated[outage_node][:, outage_w[0]:outage_w[1]]
    add("F-collector", "collector_down", "unknown_gap", "node", m.sum() * h, float(t[outage_w[0]]),
        float(t[outage_w[1] - 1] + dt), node=devices[outage_node[0]].node, rack=devices[outage_node[0]].rack)
    if req_truth:
        j = req_truth["job"]
        add("F-requeue", "requeue", "requeue_loss", "job", req_truth["lost_steps"] * h * len(j.devs),
            float(t[j.start]), float(t[j.end - 1] + dt), job_id=j.job_id, tenant=j.tenant, node=j.node)
    healthy = sorted({d.uuid for i, d in enumerate(devices)} - {devices[i].uuid for i in
                     (drift_dev, xid_dev, *pcap_node, *hot_node)} - {d.uuid for d in devices
                                                                      if d.rack == racks[cool_rack]})
    truth = {"seed": seed, "spec": spec.__dict__, "cadence_s": spec.cadence_s, "faults": faults,
             "healthy_devices": healthy,
             "noisy_healthy_devices": [devices[i].uuid for i in healthy_noisy],
             "week": {"start": float(t[0]), "end": float(t[-1] + dt)}}
    return Simulation(spec, seed, devices, jobs, t, arrays, present, alloc, gaps, truth)
