"""DCGM field identities: field id, dcgm-exporter metric names (old and 4.6 names), dmon short name -> Sample field.

Units are converted by ``scale`` (applied after sentinel checks): percent -> fraction (0.01), mJ -> J (0.001).
docs/telemetry.md prints this table. ``gr_engine_active`` is not a Sample column: it stands in for
``gpu_util`` on devices that export no DCGM_FI_DEV_GPU_UTIL (dcgm-exporter 4.x enables GR_ENGINE_ACTIVE by
default, GPU_UTIL in 3.x).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldSpec:
    field_id: int
    names: tuple[str, ...]     # dcgm-exporter metric names / DCGM macros, first = the classic name
    dmon: str                  # dcgmi dmon column header
    target: str                # Sample field (or "gr_engine_active")
    scale: float = 1.0
    unit: str = ""


GR_ENGINE_ACTIVE = "gr_engine_active"

SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(100, ("DCGM_FI_DEV_SM_CLOCK",), "SMCLK", "sm_clock_mhz", 1.0, "MHz"),
    FieldSpec(101, ("DCGM_FI_DEV_MEM_CLOCK",), "MMCLK", "mem_clock_mhz", 1.0, "MHz"),
    FieldSpec(112, ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), "DVCCTR",
              "clock_reasons", 1.0, "bitmask"),
    FieldSpec(140, ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"), "MMTMP", "mem_temp_c", 1.0, "C"),
    FieldSpec(150, ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"), "TMPTR", "gpu_temp_c", 1.0, "C"),
    FieldSpec(155, ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"), "POWER", "power_w", 1.0, "W"),
    FieldSpec(156, ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), "TOTEC", "energy_j", 0.001, "mJ"),
    FieldSpec(203, ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"), "GPUTL", "gpu_util", 0.01, "%"),
    FieldSpec(204, ("DCGM_FI_DEV_MEM_COPY_UTIL",), "MCUTL", "mem_copy_util", 0.01, "%"),
    FieldSpec(230, ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"), "XIDER", "xid", 1.0, "last xid"),
    FieldSpec(252, ("DCGM_FI_DEV_FB_USED",), "FBUSD", "fb_used_mib", 1.0, "MiB"),
    FieldSpec(310, ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",), "ESVTL", "ecc_sbe_volatile", 1.0, "count"),
    FieldSpec(311, ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "EDVTL", "ecc_dbe_volatile", 1.0, "count"),
    FieldSpec(312, ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",), "ESATL", "ecc_sbe_aggregate", 1.0, "count"),
    FieldSpec(313, ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",), "EDATL", "ecc_dbe_aggregate", 1.0, "count"),
    FieldSpec(395, ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"), "RRF", "row_remap_failure", 1.0, "flag"),
    FieldSpec(396, ("DCGM_FI_DEV_ROW_REMAP_PENDING",), "RRP", "row_remap_pending", 1.0, "flag"),
    FieldSpec(1001, ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"), "GRACT",
              GR_ENGINE_ACTIVE, 1.0, "ratio"),
    FieldSpec(1002, ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"), "SMACT", "sm_active", 1.0, "ratio"),
    FieldSpec(1003, ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"), "SMOCC", "sm_occupancy", 1.0, "ratio"),
    FieldSpec(1004, ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"), "TENSO", "tensor_active",
              1.0, "ratio"),
    FieldSpec(1005, ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"), "DRAMA", "dram_active", 1.0, "ratio"),
)

# FP pipe activity (sample block format 2; carried where measured, read by the effective-compute lens)
PIPE_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(1006, ("DCGM_FI_PROF_PIPE_FP64_ACTIVE",), "FP64A", "fp64_active", 1.0, "ratio"),
    FieldSpec(1007, ("DCGM_FI_PROF_PIPE_FP32_ACTIVE",), "FP32A", "fp32_active", 1.0, "ratio"),
    FieldSpec(1008, ("DCGM_FI_PROF_PIPE_FP16_ACTIVE",), "FP16A", "fp16_active", 1.0, "ratio"),
)
SPECS = (*SPECS, *PIPE_SPECS)

BY_NAME = {n: s for s in SPECS for n in s.names}
BY_DMON = {s.dmon: s for s in SPECS}
BY_ID = {s.field_id: s for s in SPECS}
# The fields the collector asks dcgmi dmon for (-e), in this order.
COLLECT_FIELD_IDS = (1001, 1002, 1003, 1004, 1005, 203, 204, 100, 101, 112, 155, 150, 140, 156, 252, 230,
                     1006, 1007, 1008)
# The fields `ipledger pathb-command --format dmon` asks dcgmi dmon for: every field above the agents read
# (profiling, utilisation, clocks, clock-event reasons, power, energy, temperatures, framebuffer, XID, ECC
# volatile and aggregate, row remaps), plus CARRIED_FIELD_IDS.
PATHB_FIELD_IDS = (1001, 1002, 1003, 1004, 1005, 203, 204, 100, 101, 112, 155, 156, 150, 140, 252, 230,
                   310, 311, 312, 313, 395, 396, 202, 1006, 1007, 1008)
# Asked for so the capture holds them, not (yet) a Sample field: the import reports them as not mapped.
CARRIED_FIELD_IDS = {202: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"}
