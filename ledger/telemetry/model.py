"""The normalised telemetry sample: one device, one instant, the fields attribution needs (docs/telemetry.md).

Units: fractions in [0, 1] for activities and utilisation; MHz; watts; °C; joules; counts. ``None`` always
means *not measured* (N/A, Not Supported, a DCGM blank sentinel, a missing column) — never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# Order matters: it is the column order of sample blocks, of the legacy `samples` table and of the segment digest.
METRICS = (
    "sm_active", "sm_occupancy", "tensor_active", "dram_active", "gpu_util", "mem_copy_util",
    "sm_clock_mhz", "mem_clock_mhz", "power_w", "gpu_temp_c", "mem_temp_c", "energy_j",
    "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
    "row_remap_pending", "row_remap_failure", "xid", "fb_used_mib", "compute_procs",
)
# Carried where measured (sample block format 2, docs/ledger.md "Sample blocks"): DCGM 1006/1007/1008 FP64/FP32/
# FP16 pipe active (fractions), and ``fp_ops``, the floating-point operations AMD's total FP16/FP32/FP64 op
# counters counted in the sample's dt (a count, not a rate). A segment that measured none of them is sealed
# over the columns above alone, as every segment before them was.
EXTENSION_METRICS = ("fp64_active", "fp32_active", "fp16_active", "fp_ops")


@dataclass(frozen=True, slots=True)
class Sample:
    device: str           # GPU UUID (or a stable alias when the source has none)
    t: float              # epoch seconds, start of the span this sample stands for
    dt: float             # seconds the sample covers (the source's cadence, cut at gaps)
    clock_reasons: int | None = None   # NVML clock-event reason bitmask (AMD: mapped to the same bits)
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    gpu_util: float | None = None
    mem_copy_util: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    gpu_temp_c: float | None = None
    mem_temp_c: float | None = None
    energy_j: float | None = None
    ecc_sbe_volatile: float | None = None
    ecc_dbe_volatile: float | None = None
    ecc_sbe_aggregate: float | None = None
    ecc_dbe_aggregate: float | None = None
    row_remap_pending: float | None = None
    row_remap_failure: float | None = None
    xid: float | None = None
    fb_used_mib: float | None = None
    compute_procs: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    fp_ops: float | None = None


BASE_COLUMNS = ("device", "t", "dt", "clock_reasons", *METRICS)   # every segment's (format 1: these only)
SAMPLE_COLUMNS = (*BASE_COLUMNS, *EXTENSION_METRICS)
assert tuple(f.name for f in fields(Sample)) == SAMPLE_COLUMNS
