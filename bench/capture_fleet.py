"""A second independent fault generator, written apart from :mod:`bench.scenario`: a mixed A100 / H100 / MI300X
fleet sent as a Path B *capture set* (one ``dcgmi dmon`` file per NVIDIA node, one ``amd-smi metric --csv -w``
loop per AMD node), with its own fault physics and capture restarts, and the truth computed from the injected
parameters (``python -m bench.capture_fleet --seed 3 --out DIR``).

It is the *report-on* set of ``bench.accuracy``: no threshold of the agents was ever set on it. It imports
nothing from ``ledger`` (method, agents, importers, simulator) nor from ``bench.scenario`` (a test checks this),
so its formats are written from the tools' own output (tests/fixtures/real/dcgmi_dmon, tests/fixtures/amd_smi)
and DCGM's field table, and its physics from datasheet-level models:

- the fleet: ``NV_NODES`` NVIDIA nodes (half DGX A100 80GB, half HGX H100 SXM) and ``AMD_NODES`` MI300X nodes,
  8 GPUs each, every node running a sequence of whole-node or half-node jobs with gaps (no process: the GPUs are
  unallocated there) and a start-up phase per job (loading / compiling: 2-6 min at low activity while the
  framebuffer fills; normal life, not a stall);
- power follows a DVFS curve: NVIDIA ``P = P_idle + P_dyn * a * f * V(f)**2`` with ``V(f) = 0.6 + 0.4 f``,
  MI300X ``P = P_idle + P_dyn * a * f**2.4``; a power limit lowers ``f`` until ``P`` meets it;
- temperature is a first-order thermal RC (``T -> inlet + R * P`` with a 45 s time constant); the driver's thermal
  governor is a controller on a clock ceiling (down by 2 % per degree above the slowdown temperature each tick, back
  up by 3 % a tick below it), so throttling is dynamic, not solved;
- the dmon fields are those ``ipledger pathb-command --format dmon`` asks for (field ids in ``DMON_FIELDS``, short
  names and widths from DCGM's ``dcgm_fields.c``), the header pair again every 14 ticks, 3-decimal doubles, ``N/A``
  for a GPU that does not answer; amd-smi: the watch banner, CRLF, the CSV header before every iteration, a
  ``timestamp`` column, the violation statuses ``ACTIVE`` / ``NOT ACTIVE``. Every (re)start of a capture writes
  the wall-clock anchor line the printed commands write (``# ipledger-start TIME node=N interval_ms=MS``).

Faults, placed per seed (each on its own node): a failing fan on one NVIDIA GPU (its thermal resistance ramps to
2.5-3.2x: hot at the same power as its siblings); a CRAC failure on one NVIDIA node (its inlet rises 24-32 C with a
15 min time constant); a sagging PSU (HW power brake bursts on every GPU of a node: bits 0x8 | 0x80); a sync-boost
group held to its slowest member (bit 0x10 on the others); a data pipeline that stalls at random (Poisson arrivals,
log-normal lengths); an A100 whose *volatile* correctable-ECC count grows with a quadratic rate; an XID 79 on an
H100 (the GPU prints N/A until the node is rebooted 20-45 min later; the reboot restarts dmon, appended to its
file); a dmon stopped by an operator and started again into a second file; a 4-GPU job at full tensor
load in a chassis with less airflow by design, all day (thermal slowdown at high power, inlet normal: hot
because working); an MI300X under a
lowered power cap (PPT violation); an amd-smi loop stopped and restarted in the same file; an MI300X whose
sustainable clock slides 7-11 %.

Truth (:meth:`Fleet.truth`): clock losses are ``sum(activity * (1 - f)) * dt`` over the samples the fault's
mechanism limits; stalls and silences are device-time; a capture hole is every GPU of the node over the hole.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

T0 = 1_796_256_000.0          # 2026-12-03 00:00 UTC
HOUR = 3600.0
NV_NODES, AMD_NODES, GPUS = 8, 4, 8
TAU_THERMAL_S = 45.0


@dataclass(frozen=True)
class Sku:
    """A GPU model's datasheet-level constants."""

    name: str
    vendor: str
    f_max_mhz: float
    f_idle_mhz: float
    mem_clock_mhz: float
    p_idle_w: float
    p_dyn_w: float            # P at full activity and clock = p_idle + p_dyn
    slowdown_c: float         # GPU (NVIDIA) / hotspot (MI300X) slowdown temperature
    r_c_per_w: float          # typical junction-to-inlet thermal resistance
    fb_total_mib: float


A100 = Sku("A100-SXM4-80GB", "nvidia", 1410, 210, 1593, 55, 345, 87, 0.095, 81920)
H100 = Sku("H100-SXM5-80GB", "nvidia", 1980, 345, 2619, 70, 630, 87, 0.062, 81559)
MI300X = Sku("MI300X", "amd", 2100, 132, 1300, 150, 600, 105, 0.085, 196592)

# dcgmi dmon fields in the order `ipledger pathb-command --format dmon` asks for them:
# (field id, dmon short name, unit printed under it, column width, kind)
DMON_FIELDS = (
    (1001, "GRACT", "", 7, "d"), (1002, "SMACT", "", 7, "d"), (1003, "SMOCC", "", 7, "d"),
    (1004, "TENSO", "", 7, "d"), (1005, "DRAMA", "", 7, "d"), (203, "GPUTL", "", 5, "i"),
    (204, "MCUTL", "", 5, "i"), (100, "SMCLK", "", 5, "i"), (101, "MMCLK", "", 5, "i"),
    (112, "DVCCTR", "", 20, "i"), (155, "POWER", "W", 10, "d"), (156, "TOTEC", "mJ", 16, "i"),
    (150, "TMPTR", "C", 5, "i"), (140, "MMTMP", "C", 5, "i"), (252, "FBUSD", "", 5, "i"),
    (230, "XIDER", "", 5, "i"), (310, "ESVTL", "", 5, "i"), (311, "EDVTL", "", 5, "i"),
    (312, "ESATL", "", 5, "i"), (313, "EDATL", "", 5, "i"), (395, "RRF", "", 5, "i"),
    (396, "RRP", "", 5, "i"), (202, "RPCTR", "#", 5, "i"),
    (1006, "FP64A", "", 7, "d"), (1007, "FP32A", "", 7, "d"), (1008, "FP16A", "", 7, "d"))
DMON_FIELD_IDS = tuple(f[0] for f in DMON_FIELDS)
HEADER_EVERY = 14
AMD_BANNER = "'CTRL' + 'C' to stop watching output:"
AMD_COLUMNS = ("timestamp", "gpu", "gfx_activity", "umc_activity", "socket_power",
               *(f"gfx_{k}_clk" for k in range(8)), "mem_0_clk", "hotspot", "mem", "used_vram",
               "total_correctable_count", "total_uncorrectable_count", "accumulation_counter",
               "prochot_violation_status", "ppt_violation_status", "socket_thermal_violation_status",
               "vr_thermal_violation_status", "hbm_thermal_violation_status")
BIT_IDLE, BIT_POWER, BIT_HW, BIT_SYNC, BIT_THERMAL, BIT_BRAKE = 0x1, 0x4, 0x8, 0x10, 0x20, 0x80


@dataclass
class Fault:
    """One injected fault: the cause, the devices it touches, its window and its true GPU-hours (None: none)."""

    cause: str
    node: str
    devices: tuple[str, ...]
    start: float
    end: float
    gpu_hours: float | None
    params: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"cause": self.cause, "node": self.node, "devices": list(self.devices), "start": self.start,
                "end": self.end, "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 4),
                "params": self.params}


@dataclass
class Segment:
    """One run of a node's capture: ticks [first, end) written to ``file``; ``stopped_by`` the line it ends with."""

    first: int
    end: int
    file: str
    banner: bool = True
    stopped_by: str | None = None


@dataclass
class Fleet:
    """The generated fleet: per-device arrays (devices x ticks), answer masks, capture segments, faults."""

    seed: int
    t: np.ndarray
    cadence: float
    nodes: list[str]
    sku_of_node: dict[str, Sku]
    keys: list[str]                 # "<node>/gpu<i>": what the capture names each GPU
    node_of: list[str]
    arrays: dict[str, np.ndarray]
    answers: np.ndarray             # bool (device, tick): the GPU answered (else N/A)
    unallocated: np.ndarray         # bool (device, tick): no process on the GPU
    segments: dict[str, list[Segment]]
    faults: list[Fault]
    exporter: "ExporterNode | None" = None   # issue 29: an MI300X node scraped by ROCm's device-metrics-exporter

    def truth(self) -> dict:
        keys, node_of, unalloc = self._all()
        return {"seed": self.seed, "start": float(self.t[0]), "end": float(self.t[-1] + self.cadence),
                "cadence": self.cadence, "devices": dict(zip(keys, node_of)),
                "unallocated_hours": {k: round(float(unalloc[i].sum()) * self.cadence / HOUR, 4)
                                      for i, k in enumerate(keys)},
                "faults": [f.to_json() for f in self.faults]}

    def _all(self) -> tuple[list[str], list[str], np.ndarray]:
        if self.exporter is None:
            return self.keys, self.node_of, self.unallocated
        ex = self.exporter
        return (self.keys + ex.keys, self.node_of + [ex.node] * len(ex.keys),
                np.concatenate([self.unallocated, ex.job < 0]))

    def unallocated_between(self, device: str, start: float, end: float) -> float:
        """Hours this GPU had no process between start and end."""
        keys, _, unalloc = self._all()
        i = keys.index(device)
        m = (self.t >= start) & (self.t < end)
        return float((unalloc[i] & m).sum()) * self.cadence / HOUR


@dataclass
class ExporterNode:
    """One MI300X node as ROCm's device-metrics-exporter shows it (``amd_*`` series, one scrape a tick)."""

    node: str
    keys: list[str]              # "<hostname>/gpu<gpu_id>"
    job: np.ndarray              # job index per (GPU, tick), -1: no job
    job_names: list[str]
    series: dict[str, np.ndarray]   # exporter metric -> values (GPU, tick), in the exporter's units


def _fill(rng: np.random.Generator, lo: int, hi: int, per_h: float, min_h: float, max_h: float) -> list[tuple[int, int]]:
    """Jobs (first, end ticks) between lo and hi with idle gaps of 5-40 min; none shorter than 30 min."""
    out, k = [], lo + int(rng.uniform(5, 40) * 60 / per_h)
    while k < hi - int(1800 / per_h):
        end = min(hi, k + int(rng.uniform(min_h, max_h) * HOUR / per_h))
        out.append((k, end))
        k = end + int(rng.uniform(5, 40) * 60 / per_h)
    return out


def _draw_window(rng: np.random.Generator, steps: int, cadence: float, lo_h: float, hi_h: float,
                 earliest_h: float = 1.5) -> tuple[int, int]:
    """[first, end) ticks: lo_h..hi_h hours long, placed uniformly from earliest_h to 1.5 h before the end."""
    per_h = HOUR / cadence
    length = rng.uniform(lo_h, hi_h) * per_h
    room = max(0.0, steps - (1.5 + earliest_h) * per_h - length)
    first = earliest_h * per_h + rng.random() * room
    return int(first), int(first + length)


def generate(seed: int, hours: float = 24.0, cadence: float = 30.0, nv_nodes: int = NV_NODES,
             amd_nodes: int = AMD_NODES) -> Fleet:
    rng = np.random.default_rng(10_000 + seed)
    steps = int(hours * HOUR / cadence)
    t = T0 + np.arange(steps) * cadence
    tick = lambda minutes: max(1, int(minutes * 60 / cadence))  # noqa: E731
    half = nv_nodes // 2
    rack = int(rng.integers(10, 60))
    nodes = ([f"a100-r{rack}n{k:02d}" for k in range(half)] + [f"h100-r{rack + 1}n{k:02d}" for k in range(nv_nodes - half)]
             + [f"mi300x-r{rack + 2}n{k:02d}" for k in range(amd_nodes)])
    sku_of = {nd: (A100 if nd.startswith("a100") else H100 if nd.startswith("h100") else MI300X) for nd in nodes}
    n = len(nodes) * GPUS
    keys = [f"{nd}/gpu{i}" for nd in nodes for i in range(GPUS)]
    node_of = [nd for nd in nodes for _ in range(GPUS)]
    devs_of = {nd: list(range(k * GPUS, (k + 1) * GPUS)) for k, nd in enumerate(nodes)}
    a100s, h100s, amds = nodes[:half], nodes[half:nv_nodes], nodes[nv_nodes:]

    # --- placement: each fault on its own node --------------------------------------------------------------
    nv_order = [str(x) for x in rng.permutation(nodes[:nv_nodes])]
    h_first = sorted(nv_order, key=lambda x: 0 if x in h100s else 1)
    place: dict[str, str] = {}
    for cause in ("xid", "sync_boost", "hot_working"):        # H100 nodes
        place[cause] = next(x for x in h_first if x not in place.values())
    place["ecc"] = next(x for x in nv_order if x in a100s and x not in place.values())
    for cause in ("fan", "crac", "power_brake", "starved"):
        free = [x for x in nv_order if x not in place.values()]
        place[cause] = free[0] if free else next(x for x in nv_order if x != place["xid"])
    # the operator's restart shares a node with another fault (never the XID node, whose reboot restarts dmon)
    place["operator_restart"] = next(x for x in nv_order if x not in place.values()) \
        if len(set(place.values())) < nv_nodes else str(rng.choice([x for x in nv_order if x != place["xid"]]))
    amd_order = [str(x) for x in rng.permutation(amds)]
    place["ppt_cap"], place["amd_restart"], place["amd_drift"] = (amd_order[i % len(amd_order)] for i in range(3))
    win = {"fan": _draw_window(rng, steps, cadence, 5, 9), "crac": _draw_window(rng, steps, cadence, 4, 7),
           "power_brake": _draw_window(rng, steps, cadence, 3, 6), "sync_boost": _draw_window(rng, steps, cadence, 6, 10),
           "starved": _draw_window(rng, steps, cadence, 5, 9), "hot_working": _draw_window(rng, steps, cadence, 4, 7),
           "ppt_cap": _draw_window(rng, steps, cadence, 6, 10), "amd_drift": _draw_window(rng, steps, cadence, 8, 11, 6.0),
           "ecc": _draw_window(rng, steps, cadence, 6, 9, 6.0)}
    x_tick = int(rng.uniform(6, hours - 8) * HOUR / cadence)
    reboot_at = x_tick + tick(rng.uniform(20, 45))
    boot_end = reboot_at + tick(rng.uniform(6, 12))
    op_stop = int(rng.uniform(3, hours - 4) * HOUR / cadence)
    op_resume = op_stop + tick(rng.uniform(30, 60))
    amd_stop = int(rng.uniform(3, hours - 4) * HOUR / cadence)
    amd_resume = amd_stop + tick(rng.uniform(25, 50))
    holes = ((place["xid"], reboot_at, boot_end), (place["operator_restart"], op_stop, op_resume),
             (place["amd_restart"], amd_stop, amd_resume))
    in_hole = np.zeros((n, steps), dtype=bool)     # no capture ran: nothing observed
    for nd, a, b in holes:
        in_hole[devs_of[nd], a:b] = True

    # --- schedule: per node one 8-GPU lane or two 4-GPU lanes; a fault's job spans its window ---------------
    job = np.full((n, steps), -1, dtype=np.int32)
    level, startup_end = [], []
    jobs: list[tuple[str, tuple[int, ...], int, int]] = []
    protect_cause = {"sync_boost", "starved", "hot_working", "fan", "ppt_cap", "amd_drift", "ecc", "crac",
                     "power_brake"}
    for nd in nodes:
        two = nd == place["hot_working"] or (nd not in (place["xid"], place["sync_boost"], place["starved"])
                                            and rng.random() < 0.4)
        lanes = [devs_of[nd][:4], devs_of[nd][4:]] if two else [devs_of[nd]]
        for li, lane in enumerate(lanes):
            prot = [win[c] for c in protect_cause if place.get(c) == nd]
            if nd == place["hot_working"] and li == 1:
                prot = []
            if nd == place["xid"]:
                pre = x_tick - tick(rng.uniform(90, 180))
                ivs = _fill(rng, 0, pre, cadence, 2, 6) + [(pre, x_tick + 1)]
                ivs += _fill(rng, boot_end + tick(10), steps, cadence, 3, 8)
            elif prot:
                a = min(p[0] for p in prot) - tick(rng.uniform(30, 90))
                b = min(steps, max(p[1] for p in prot) + tick(rng.uniform(30, 90)))
                ivs = _fill(rng, 0, a - tick(20), cadence, 2, 6) + [(max(0, a), b)] + _fill(rng, b, steps, cadence, 2, 6)
            else:
                ivs = _fill(rng, 0, steps, cadence, 2, 8)
            for a, b in ivs:
                j = len(jobs)
                jobs.append((nd, tuple(lane), a, b))
                job[lane, a:b] = j
                hot = nd == place["hot_working"] and li == 0 and a <= win["hot_working"][0] < b
                level.append(rng.uniform(0.95, 0.99) if hot else rng.uniform(0.55, 0.93))
                startup_end.append(a + tick(rng.uniform(2, 6)))
    level_a = np.array(level or [0.0])
    running = job >= 0

    # --- workload: activity, tensor share, framebuffer, start-up ---------------------------------------------
    noise = np.full(n, 0.025)
    noise[rng.choice(n, size=4, replace=False)] = 0.10
    act = np.where(running, level_a[np.maximum(job, 0)][:, :] + rng.normal(0, 1, (n, steps)) * noise[:, None], 0.0)
    act = np.clip(act, 0.0, 1.0) * running
    tensor_share = rng.uniform(0.3, 0.8, len(level_a))
    fb_target = np.array([rng.uniform(0.35, 0.9) for _ in level_a])
    fb = np.zeros((n, steps))
    startup = np.zeros((n, steps), dtype=bool)
    for j, (nd, lane, a, b) in enumerate(jobs):
        cap = sku_of[nd].fb_total_mib * fb_target[j]
        su = min(startup_end[j], b)
        lane_i = list(lane)
        ramp = np.linspace(1500.0, cap, max(1, su - a))
        fb[np.ix_(lane_i, range(a, su))] = ramp[None, :]
        fb[lane_i, su:b] = cap + rng.normal(0, 150, (len(lane_i), b - su))
        act[lane_i, a:su] = rng.uniform(0.0, 0.08, (len(lane_i), su - a))
        startup[lane_i, a:su] = True
        if nd == place["hot_working"] and level_a[j] > 0.94:
            tensor_share[j] = rng.uniform(0.85, 0.95)
    tensor = act * tensor_share[np.maximum(job, 0)]
    faults: list[Fault] = []

    # stalls: a data pipeline that starves at random (Poisson arrivals, log-normal lengths)
    stall = np.zeros((n, steps), dtype=bool)
    sv_nd = place["starved"]
    a, b = win["starved"]
    rate_h = rng.uniform(4, 8)
    k = a
    while True:
        k += tick(rng.exponential(60 / rate_h))
        if k >= b:
            break
        ln = tick(float(np.clip(rng.lognormal(math.log(rng.uniform(2, 5)), 0.4), 1, 15)))
        stall[devs_of[sv_nd], k:min(k + ln, b)] = True
        k += ln
    stall &= running & ~startup
    act = np.where(stall, rng.uniform(0.0, 0.04, (n, steps)), act)
    tensor = np.where(stall, 0.0, tensor)
    faults.append(Fault("starved", sv_nd, tuple(keys[d] for d in devs_of[sv_nd]), float(t[a]), float(t[b]),
                        float((stall & ~in_hole).sum()) * cadence / HOUR, {"stalls_per_h": round(rate_h, 1)}))

    # issue 29, from a stream of its own: the pipes dmon reports beside SM activity (DRAM and the FP32 pipe as
    # every job drives them), a memory-bound inference job, and a job whose ranks spin on a barrier
    zr = np.random.default_rng([10_000 + seed, 29])
    dram = act * 0.38
    fp32 = np.maximum(act - tensor, 0.0) * 0.5
    a_pow = act.copy()                  # the activity that switches (what the power curve reads)
    spin = np.zeros((n, steps), dtype=bool)
    long_jobs = [j for j, (nd, _l, a0, b0) in enumerate(jobs) if nd == place["ecc"] and b0 - a0 >= 5 * HOUR / cadence]
    if long_jobs:
        # the ranks of one job poll a flag in a spin loop (a barrier no peer reaches) for 3-6 h: every SM keeps a
        # spinning warp resident (SM active 0.85-0.98), no MMA or FP instruction issues (tensor 0, FP32 under
        # 1 %), loads hit in L2 (DRAM 1-3 % of it); integer compare-and-branch switches about a quarter of the
        # transistors a GEMM does, so the power curve sees 0.25 x the activity
        j = long_jobs[int(zr.integers(0, len(long_jobs)))]
        nd, lane, a0, b0 = jobs[j]
        per_h = HOUR / cadence
        ln = int(zr.uniform(3, min(6, (b0 - a0) / per_h - 1)) * per_h)
        s0 = int(a0 + per_h / 3 + zr.random() * (b0 - a0 - ln - 2 * per_h / 3))
        spin[list(lane), s0:s0 + ln] = True
        spin &= running & ~startup & ~stall
        act = np.where(spin, zr.uniform(0.85, 0.98, (n, steps)), act)
        tensor = np.where(spin, 0.0, tensor)
        fp32 = np.where(spin, zr.uniform(0.001, 0.008, (n, steps)), fp32)
        dram = np.where(spin, act * zr.uniform(0.01, 0.03, (n, steps)), dram)
        a_pow = np.where(spin, 0.25 * act, a_pow)
        spin_job = (nd, tuple(lane), s0, s0 + ln)
    # one job serves a model: decode is bound by HBM bandwidth (DRAM 0.55-0.75), the MMA and FP32 pipes nearly idle
    inf_jobs = [j for j, (nd, _l, a0, b0) in enumerate(jobs) if nd not in (place["ecc"], place["hot_working"],
                                                                         place["starved"]) and b0 - a0 >= HOUR / cadence]
    if inf_jobs:
        nd, lane, a0, b0 = jobs[inf_jobs[int(zr.integers(0, len(inf_jobs)))]]
        m = np.zeros((n, steps), dtype=bool)
        m[list(lane), a0:b0] = True
        tensor = np.where(m, act * 0.02, tensor)
        fp32 = np.where(m, act * 0.02, fp32)
        dram = np.where(m, zr.uniform(0.55, 0.75, (n, steps)) * (act > 0.1), dram)

    # --- physics per tick ----------------------------------------------------------------------------------------
    inlet = np.repeat(np.array([rng.normal(23.5, 0.8) for _ in nodes]), GPUS)[:, None] + \
        0.9 * np.sin(2 * np.pi * (t - T0) / 86400.0 - 1.0)[None, :]
    r_th = np.array([sku_of[node_of[i]].r_c_per_w * rng.normal(1.0, 0.04) for i in range(n)])
    r_t = np.repeat(r_th[:, None], steps, axis=1)
    # the hot-working node: a chassis with less airflow by design (R x1.55-1.65 on all its GPUs, the same all day,
    # the inlet as everywhere): its heavy job reaches the slowdown temperature at full power, its light ones do not
    hw_rows = devs_of[place["hot_working"]]
    r_th[hw_rows] *= rng.uniform(1.55, 1.65)
    r_t = np.repeat(r_th[:, None], steps, axis=1)
    f_cap = np.ones((n, steps))
    p_lim = np.array([sku_of[node_of[i]].p_idle_w + sku_of[node_of[i]].p_dyn_w for i in range(n)])[:, None] \
        * np.ones((1, steps))
    brake = np.zeros((n, steps), dtype=bool)
    brake_f = np.ones((n, steps))

    fan_dev = devs_of[place["fan"]][int(rng.integers(0, GPUS))]
    fa, fb_ = win["fan"]
    fan_factor = rng.uniform(2.5, 3.2)
    ramp = np.clip((np.arange(steps) - fa) / (HOUR / cadence), 0, 1)
    r_t[fan_dev, fa:fb_] *= 1 + (fan_factor - 1) * ramp[fa:fb_]
    ca, cb = win["crac"]
    rise = rng.uniform(24, 32)
    tau = 15 * 60 / cadence
    kk = np.arange(steps)
    crac = np.where(kk < ca, 0.0, np.where(kk < cb, 1 - np.exp(-(kk - ca) / tau),
                                           (1 - np.exp(-(cb - ca) / tau)) * np.exp(-(kk - cb) / tau)))
    inlet[devs_of[place["crac"]], :] += rise * crac[None, :]
    crac_end = min(steps - 1, cb + int(4 * tau))
    pa, pb = win["power_brake"]
    k = pa
    while True:
        k += tick(rng.exponential(60 / rng.uniform(2, 4)))
        if k >= pb:
            break
        ln = tick(float(np.clip(rng.exponential(3), 0.5, 10)))
        brake[devs_of[place["power_brake"]], k:min(k + ln, pb)] = True
        brake_f[devs_of[place["power_brake"]], k:min(k + ln, pb)] = rng.uniform(0.3, 0.45)
        k += ln
    sb_devs = devs_of[place["sync_boost"]]
    slow_dev = sb_devs[int(rng.integers(0, GPUS))]
    slow_f = rng.uniform(0.86, 0.92)
    sa, sb = win["sync_boost"]
    sync = np.zeros((n, steps), dtype=bool)
    sync[[d for d in sb_devs if d != slow_dev], sa:sb] = True
    f_cap[slow_dev, sa:sb] = slow_f
    pc_dev = devs_of[place["ppt_cap"]][int(rng.integers(0, GPUS))]
    pca, pcb = win["ppt_cap"]
    cap_w = rng.uniform(380, 460)
    p_lim[pc_dev, pca:pcb] = cap_w
    dr_dev = devs_of[place["amd_drift"]][int(rng.integers(0, GPUS))]
    while dr_dev == pc_dev:
        dr_dev = devs_of[place["amd_drift"]][int(rng.integers(0, GPUS))]
    da, _ = win["amd_drift"]
    d_loss = rng.uniform(0.07, 0.11)
    f_cap[dr_dev, da:] = 1 - d_loss * np.clip((np.arange(steps - da)) / (3 * HOUR / cadence), 0, 1)
    xid_dev = devs_of[place["xid"]][int(rng.integers(0, GPUS))]
    answers = np.ones((n, steps), dtype=bool)
    answers[xid_dev, x_tick + 1:reboot_at] = False

    is_amd = np.array([sku_of[node_of[i]].vendor == "amd" for i in range(n)])
    sku_rows = [sku_of[node_of[i]] for i in range(n)]
    f_out = np.zeros((n, steps))
    temp = np.zeros((n, steps))
    power = np.zeros((n, steps))
    reasons = np.zeros((n, steps), dtype=np.int64)
    governor = np.ones(n)
    temp_now = inlet[:, 0] + r_th * np.array([s.p_idle_w for s in sku_rows])
    alpha = 1 - math.exp(-cadence / TAU_THERMAL_S)
    p_idle = np.array([s.p_idle_w for s in sku_rows])
    p_dyn = np.array([s.p_dyn_w for s in sku_rows])
    slowdown = np.array([s.slowdown_c for s in sku_rows])

    def pw(a_: np.ndarray, f_: np.ndarray) -> np.ndarray:
        nv = p_idle + p_dyn * a_ * f_ * (0.6 + 0.4 * f_) ** 2
        amd = p_idle + p_dyn * a_ * np.power(np.clip(f_, 0, 1), 2.4)
        return np.where(is_amd, amd, nv)

    for s in range(steps):
        a_ = a_pow[:, s]
        f = f_cap[:, s].copy()
        sync_now = sync[:, s]
        if sync_now.any():                       # held to the slowest member's clock
            f = np.where(sync_now, slow_f, f)
        lo, hi = np.zeros(n), f.copy()
        over = pw(a_, f) > p_lim[:, s]
        if over.any():
            for _ in range(20):
                mid = (lo + hi) / 2
                ok = pw(a_, mid) <= p_lim[:, s]
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
            f = np.where(over, lo, f)
        br = brake[:, s]
        f = np.where(br, np.minimum(f, brake_f[:, s]), f)
        hot_gov = governor < f - 1e-3
        f_final = np.minimum(f, governor)
        on = running[:, s]
        p_now = np.where(on, pw(a_, f_final), p_idle * 0.95)
        temp_now = temp_now + (inlet[:, s] + r_t[:, s] * p_now - temp_now) * alpha
        governor = np.where(temp_now > slowdown, np.maximum(0.3, governor - 0.02 * (temp_now - slowdown)),
                            np.minimum(1.0, governor + 0.03))
        r = np.where(~on, BIT_IDLE, 0)
        r |= np.where(on & over, BIT_POWER, 0)
        r |= np.where(on & br, BIT_HW | BIT_BRAKE, 0)
        r |= np.where(on & sync_now, BIT_SYNC, 0)
        r |= np.where(on & hot_gov, BIT_THERMAL, 0)
        reasons[:, s] = r
        f_out[:, s] = np.where(on, f_final, 0.0)
        power[:, s] = p_now
        temp[:, s] = temp_now
    thermal = (reasons & BIT_THERMAL) > 0
    f_max = np.array([s.f_max_mhz for s in sku_rows])
    f_idle = np.array([s.f_idle_mhz for s in sku_rows])
    clock = np.where(running, f_out * f_max[:, None] - np.abs(rng.normal(0, 5, (n, steps))), f_idle[:, None])
    power_obs = power * (1 + rng.normal(0, 0.012, (n, steps)))
    temp_obs = temp + rng.normal(0, 0.4, (n, steps))
    dt_h = cadence / HOUR

    def lost(mask: np.ndarray) -> float:
        return float((act * (1 - f_out) * (mask & running & answers & ~in_hole)).sum() * dt_h)

    def window_mask(devs: list[int], a: int, b: int) -> np.ndarray:
        m = np.zeros((n, steps), dtype=bool)
        m[devs, a:b] = True
        return m

    # --- the faults' truth ------------------------------------------------------------------------------------
    fan_m = window_mask([fan_dev], fa, fb_) & thermal
    faults.append(Fault("fan_failure", place["fan"], (keys[fan_dev],), float(t[fa]), float(t[fb_ - 1] + cadence),
                        lost(fan_m), {"thermal_resistance_factor": round(fan_factor, 2)}))
    crac_m = window_mask(devs_of[place["crac"]], ca, crac_end) & thermal
    faults.append(Fault("crac_failure", place["crac"], tuple(keys[d] for d in devs_of[place["crac"]]), float(t[ca]),
                        float(t[crac_end]), lost(crac_m), {"inlet_rise_c": round(rise, 1)}))
    brake_m = brake & running
    faults.append(Fault("power_brake", place["power_brake"], tuple(keys[d] for d in devs_of[place["power_brake"]]),
                        float(t[pa]), float(t[pb]), lost(brake_m & ~thermal), {}))
    sync_m = sync & running
    faults.append(Fault("sync_boost", place["sync_boost"], tuple(keys[d] for d in sb_devs), float(t[sa]),
                        float(t[sb]), lost(sync_m & ~thermal),
                        {"slowest": keys[slow_dev], "slowest_clock": round(slow_f, 3)}))
    pc_m = window_mask([pc_dev], pca, pcb) & ((reasons & BIT_POWER) > 0) & ~thermal
    faults.append(Fault("ppt_cap", place["ppt_cap"], (keys[pc_dev],), float(t[pca]), float(t[pcb]), lost(pc_m),
                        {"cap_w": round(cap_w)}))
    dr_m = window_mask([dr_dev], da, steps) & (reasons == 0)
    faults.append(Fault("amd_drift", place["amd_drift"], (keys[dr_dev],), float(t[da]), float(t[-1] + cadence),
                        float((act * (1 - f_cap) * (dr_m & ~in_hole)).sum() * dt_h), {"clock_loss": round(d_loss, 3)}))
    hw_devs = devs_of[place["hot_working"]][:4]
    ha, hb = win["hot_working"]
    hot_j = {int(job[hw_devs[0], ha])}
    hw_m = np.isin(job, list(hot_j)) & thermal
    hw_m[[d for d in range(n) if d not in hw_devs]] = False
    hj = int(job[hw_devs[0], ha])
    faults.append(Fault("hot_working", place["hot_working"], tuple(keys[d] for d in hw_devs),
                        float(t[jobs[hj][2]]), float(t[jobs[hj][3] - 1] + cadence), lost(hw_m),
                        {"tensor_share": round(float(tensor_share[hj]), 2)}))

    if spin.any():   # the delivered time the spinning did no math in: activity x clock fraction, observed samples
        nd, lane, s0, s1 = spin_job
        faults.append(Fault("spin_wait", nd, tuple(keys[d] for d in lane), float(t[s0]), float(t[s1 - 1] + cadence),
                            float((act * f_out * (spin & answers & ~in_hole)).sum() * dt_h), {"hours": round((s1 - s0) * dt_h, 2)}))

    # counters: volatile and aggregate ECC, energy, PCIe replay, XID
    base_agg = rng.integers(0, 40, n).astype(float)
    trickle = np.where(rng.random(n) < 0.3, rng.uniform(0.3, 1.5, n), rng.uniform(0.0, 0.1, n))
    lam = np.repeat(trickle[:, None] * dt_h, steps, axis=1)
    ecc_dev = devs_of[place["ecc"]][int(rng.integers(0, GPUS))]
    ea, _ = win["ecc"]
    lam0 = rng.uniform(2.0, 4.0)
    lam[ecc_dev, ea:] += lam0 * ((t[ea:] - t[ea]) / HOUR) ** 2 * dt_h
    lam = np.minimum(lam, 600 * dt_h)
    new_sbe = rng.poisson(lam)
    boot = np.zeros((n, steps), dtype=bool)
    boot[devs_of[place["xid"]], boot_end] = True                   # the volatile counters reset at the reboot
    vol = np.zeros((n, steps))
    acc = rng.integers(0, 5, n).astype(float)
    for s in range(steps):
        acc = np.where(boot[:, s], 0.0, acc + new_sbe[:, s])
        vol[:, s] = acc
    agg = base_agg[:, None] + np.cumsum(new_sbe, axis=1)
    faults.append(Fault("ecc_volatile", place["ecc"], (keys[ecc_dev],), float(t[ea]), float(t[-1] + cadence), None,
                        {"rate_per_h_after_1h": round(lam0, 2), "law": "rate = r * (hours since onset)**2"}))
    energy = rng.uniform(1e9, 5e10, n)[:, None] + np.cumsum(power * cadence * 1000.0, axis=1)
    xid = np.zeros((n, steps))
    xid[xid_dev, x_tick] = 79
    faults.append(Fault("xid", place["xid"], (keys[xid_dev],), float(t[x_tick]), float(t[reboot_at]),
                        (reboot_at - x_tick - 1) * dt_h, {"xid": 79}))
    arrays = {"act": act, "tensor": tensor, "dram": dram, "fp32": fp32, "clock": clock, "power": power_obs, "temp": temp_obs,
              "reasons": reasons.astype(float), "fb": fb, "xid": xid, "ecc_vol": vol, "ecc_agg": agg,
              "energy_mj": energy, "mem_clock": np.array([s.mem_clock_mhz for s in sku_rows])[:, None] * np.ones((1, steps)),
              "mem_temp": temp_obs - rng.uniform(3, 8, n)[:, None]}
    unalloc = ~running & answers & ~in_hole      # no process on a GPU that answered

    # --- capture segments: the reboot (appended), the operator (second file), the amd-smi loop (appended) -------
    segments: dict[str, list[Segment]] = {}
    for nd in nodes:
        name = f"dmon-{nd}.txt" if sku_of[nd].vendor == "nvidia" else f"amdsmi-{nd}.csv"
        if nd == place["xid"]:
            segments[nd] = [Segment(0, reboot_at, name), Segment(boot_end, steps, name)]
        elif nd == place["operator_restart"]:
            stamp = datetime.fromtimestamp(float(t[op_resume]), tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            segments[nd] = [Segment(0, op_stop, name, stopped_by="dmon was stopped due to receiving a signal"),
                            Segment(op_resume, steps, f"dmon-{nd}-{stamp}.txt")]
        elif nd == place["amd_restart"]:
            segments[nd] = [Segment(0, amd_stop, name), Segment(amd_resume, steps, name)]
        else:
            segments[nd] = [Segment(0, steps, name)]
    for how, (nd, a, b) in zip(("dmon restarted by the reboot after the XID, appended",
                                "dmon restarted by an operator, second file", "amd-smi loop restarted, appended"), holes):
        faults.append(Fault("capture_restarted", nd, tuple(keys[d] for d in devs_of[nd]), float(t[a]), float(t[b]),
                            GPUS * (b - a) * dt_h, {"how": how}))
    fl = Fleet(seed, t, cadence, nodes, sku_of, keys, node_of, arrays, answers, unalloc, segments, faults)
    fl.exporter = _exporter_node(fl, rack + 3)
    return fl


MI300X_PEAK_BF16 = 1307.4e12   # dense BF16 operations a second (AMD Instinct MI300X data sheet)
XCDS = 8                        # accelerator complex dies per MI300X, each an eighth of its matrix cores


def _exporter_node(fl: Fleet, rack: int) -> ExporterNode:
    """An MI300X node sent as device-metrics-exporter text (issue 29's slow part; its own stream). Jobs of 8
    GPUs (unlabelled: the node's run); a job's kernels keep a share of the busy time on the matrix cores (MFMA busy = activity x 0.45-0.85)
    and retire ``MFMA busy x peak x efficiency`` operations a second (0.5-0.62 per job; each GPU within +-1 %
    of it, +-0.8 % a tick), the eight XCDs sharing the work. The fault: from a random tick of a job lasting 5 h
    or more, one or two XCDs of one GPU retire only 20-50 % of their share while the exporter still counts them
    busy (a degraded die: the busy percentage and the clock unchanged), to the end of the capture. Truth: the
    matrix-core time short, Σ MFMA busy x (1 - the GPU's remaining rate) x dt over its running ticks since."""
    er = np.random.default_rng([fl.seed, 2929])
    steps, cadence = len(fl.t), fl.cadence
    node = f"mi300x-r{rack}x00"
    keys = [f"{node}/gpu{g}" for g in range(GPUS)]
    job = np.full((GPUS, steps), -1, dtype=np.int32)
    spans: list[tuple[tuple[int, ...], int, int]] = []
    # whole-node jobs and no job label, as the rest of the set (a labelled file in a set makes every unlabelled
    # node's time unallocated: the importer gives a run per node only to a set with no labels at all)
    for lane in [tuple(range(GPUS))]:
        for a, b in _fill(er, 0, steps, cadence, 3, 9):
            job[list(lane), a:b] = len(spans)
            spans.append((lane, a, b))
    names = [str(880000 + 100 * fl.seed + j) for j in range(len(spans))]
    on = job >= 0
    jj = np.maximum(job, 0)
    level, mfma_share, eff = (er.uniform(lo, hi, max(1, len(spans))) for lo, hi in ((0.6, 0.93), (0.45, 0.85),
                                                                                     (0.5, 0.62)))
    act = np.where(on, np.clip(level[jj] + er.normal(0, 0.02, (GPUS, steps)), 0.0, 1.0), 0.0)
    mfma = act * mfma_share[jj]
    rate = mfma * MI300X_PEAK_BF16 * eff[jj] * er.normal(1.0, 0.01, GPUS)[:, None] * er.normal(1.0, 0.008, (GPUS, steps))
    per_h = HOUR / cadence
    long_jobs = [j for j, (_l, a, b) in enumerate(spans) if b - a >= 5 * per_h] or list(range(len(spans)))
    lane, a, b = spans[long_jobs[int(er.integers(0, len(long_jobs)))]]
    gpu = lane[int(er.integers(0, len(lane)))]
    onset = int(a + er.uniform(0.5, 0.5 + max(0.0, (b - a) / per_h - 4.5)) * per_h)
    dies = int(er.integers(1, 3))
    kept = er.uniform(0.2, 0.5)
    remaining = 1.0 - dies * (1.0 - kept) / XCDS
    rate[gpu, onset:] *= remaining
    slow = on[gpu].copy()
    slow[:onset] = False
    fl.faults.append(Fault("slow_part", node, (keys[gpu],), float(fl.t[onset]), float(fl.t[-1] + cadence),
                           float((mfma[gpu] * (1.0 - remaining) * slow).sum()) * cadence / HOUR,
                           {"xcds_degraded": dies, "their_rate": round(float(kept), 2),
                            "device_rate": round(float(remaining), 3)}))
    power = np.where(on, 150.0 + 600.0 * act, 142.0) * er.normal(1.0, 0.01, (GPUS, steps))
    hotspot = 24.0 + 0.085 * power + er.normal(0, 0.4, (GPUS, steps))
    counter = np.mod(er.uniform(0, 1e15, GPUS)[:, None] + np.cumsum(rate * cadence, axis=1) - rate * cadence, 2.0 ** 64)
    series = {"amd_gpu_gfx_activity": np.round(act * 100), "amd_gpu_prof_sm_active": act * 100,
              "amd_gpu_prof_tensor_active_percent": mfma * 100, "amd_gpu_package_power": power,
              "amd_gpu_junction_temperature": hotspot, "amd_gpu_prof_total_16_ops": counter}
    return ExporterNode(node, keys, job, names, series)


def write_exporter(fl: Fleet, out: Path) -> Path | None:
    """The exporter node's scrapes as Prometheus text with timestamps (what a federate endpoint returns): HELP and
    TYPE per metric, the exporter's device labels (no job label: the set has none)."""
    ex = fl.exporter
    if ex is None:
        return None
    lines = []
    for metric, vals in ex.series.items():
        lines += [f"# HELP {metric} (device-metrics-exporter)", f"# TYPE {metric} gauge"]
        for g, key in enumerate(ex.keys):
            base = f'card_model="AMD Instinct MI300X",gpu_id="{g}",hostname="{ex.node}",serial_number="69231200{g:04d}"'
            for s in range(len(fl.t)):
                lab = base
                v = vals[g, s]
                text = repr(float(v)) if metric.endswith("_ops") else f"{v:.1f}"
                lines.append(f"{metric}{{{lab}}} {text} {int(fl.t[s] * 1000)}")
    p = out / f"exporter-{ex.node}.prom"
    p.write_text("\n".join(lines) + "\n")
    return p


# --- writers ---------------------------------------------------------------------------------------------------

def _stamp(t: float) -> str:
    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _anchor(t: float, node: str, cadence: float) -> str:
    return f"# ipledger-start {_stamp(t)} node={node} interval_ms={int(cadence * 1000)}"


def _dmon_header() -> list[str]:
    names = "#Entity    " + "".join(name.ljust(max(w, len(name)) + 1) for _, name, _, w, _ in DMON_FIELDS)
    units = "ID         " + "".join(unit.ljust(max(w, len(name)) + 1) for _, name, unit, w, _ in DMON_FIELDS)
    return [names.rstrip() + " ", units]


def _dmon_rows(fl: Fleet, devs: list[int], s: int) -> list[str]:
    A = fl.arrays
    out = []
    for i in devs:
        if not fl.answers[i, s]:
            vals = ["N/A"] * len(DMON_FIELDS)
        else:
            a = A["act"][i, s]
            v = {1001: min(1.0, a * 1.02), 1002: a, 1003: a * 0.45, 1004: A["tensor"][i, s], 1005: A["dram"][i, s],
                 203: min(100.0, a * 130), 204: a * 42, 100: A["clock"][i, s], 101: A["mem_clock"][i, s],
                 112: A["reasons"][i, s], 155: A["power"][i, s], 156: A["energy_mj"][i, s], 150: A["temp"][i, s],
                 140: A["mem_temp"][i, s], 252: A["fb"][i, s], 230: A["xid"][i, s], 310: A["ecc_vol"][i, s],
                 311: 0, 312: A["ecc_agg"][i, s], 313: 0, 395: 0, 396: 0, 202: 0,
                 # the pipes: training in bf16 on the tensor cores, its element-wise work on the FP32 pipe
                 1006: 0.0, 1007: A["fp32"][i, s], 1008: 0.0}
            vals = [f"{v[fid]:.3f}" if kind == "d" else f"{int(round(v[fid]))}" for fid, _, _, _, kind in DMON_FIELDS]
        cells = "".join(x.ljust(max(w, len(name)) + 1) for x, (_, name, _, w, _) in zip(vals, DMON_FIELDS))
        out.append(f"GPU {i % GPUS}".ljust(11) + cells.rstrip())
    return out


def _amd_rows(fl: Fleet, devs: list[int], s: int, rng_clk: np.ndarray) -> list[str]:
    A = fl.arrays
    out = []
    for i in devs:
        g = str(i % GPUS)
        if not fl.answers[i, s]:
            out.append(",".join([str(int(fl.t[s])), g] + ["N/A"] * (len(AMD_COLUMNS) - 2)))
            continue
        r = int(A["reasons"][i, s])
        st = lambda bit: "ACTIVE" if r & bit else "NOT ACTIVE"  # noqa: E731
        clk = A["clock"][i, s]
        xcd = [f"{clk + d:.0f}" for d in rng_clk[i]]
        out.append(",".join([str(int(fl.t[s])), g, f"{A['act'][i, s] * 100:.0f}", f"{A['act'][i, s] * 35:.0f}",
                             f"{A['power'][i, s]:.0f}", *xcd, f"{A['mem_clock'][i, s]:.0f}", f"{A['temp'][i, s]:.0f}",
                             f"{A['mem_temp'][i, s]:.0f}", f"{A['fb'][i, s]:.0f}", f"{A['ecc_agg'][i, s]:.0f}", "0",
                             str(int(s * fl.cadence * 100)), st(BIT_HW), st(BIT_POWER), st(BIT_THERMAL), "NOT ACTIVE",
                             "NOT ACTIVE"]))
    return out


def write_captures(fl: Fleet, out: Path, vendors: tuple[str, ...] = ("nvidia", "amd"),
                   exporter: bool = True) -> list[Path]:
    """The capture set: one file per node (and a second file where a capture was restarted into one); with
    ``exporter`` and AMD among ``vendors``, the exporter-scraped node's Prometheus text too (not a dmon or amd-smi
    capture: the capture-set bench and the capture parsers' tests leave it out)."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    rng_clk = np.random.default_rng(fl.seed).normal(0, 4, (len(fl.keys), 8)).round()
    for k, nd in enumerate(fl.nodes):
        sku = fl.sku_of_node[nd]
        if sku.vendor not in vendors:
            continue
        devs = list(range(k * GPUS, (k + 1) * GPUS))
        for seg in fl.segments[nd]:
            p = out / seg.file
            lines = [_anchor(fl.t[seg.first], nd, fl.cadence)]
            if sku.vendor == "nvidia":
                for j, s in enumerate(range(seg.first, seg.end)):
                    if j % HEADER_EVERY == 0:
                        lines += _dmon_header()
                    lines += _dmon_rows(fl, devs, s)
                if seg.stopped_by:
                    lines += ["", seg.stopped_by]
                newline = "\n"
            else:
                lines.append(AMD_BANNER)
                for s in range(seg.first, seg.end):
                    lines.append(",".join(AMD_COLUMNS))
                    lines += _amd_rows(fl, devs, s, rng_clk)
                newline = "\r\n"
            with p.open("a", encoding="utf-8", newline="") as f:
                f.write(newline.join(lines) + newline)
            if p not in paths:
                paths.append(p)
    if exporter and "amd" in vendors:
        p = write_exporter(fl, out)
        if p is not None:
            paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--out", type=Path, required=True, help="directory for the capture files and truth.json")
    a = ap.parse_args(argv)
    fl = generate(a.seed, hours=a.hours)
    paths = write_captures(fl, a.out / "captures")
    (a.out / "truth.json").write_text(json.dumps(fl.truth(), indent=1) + "\n")
    print(f"{a.out / 'captures'}: {len(paths)} files, {len(fl.keys)} GPUs, {len(fl.faults)} faults")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
