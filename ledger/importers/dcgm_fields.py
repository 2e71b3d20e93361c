"""DCGM field identities: field id, dcgm-exporter metric names (old and 4.6 names), dmon short name -> Sample field.

Units are converted by ``scale`` (applied after sentinel checks): percent -> fraction (0.01), mJ -> J (0.001).
docs/telemetry.md prints this table. ``gr_engine_active`` is not a Sample column: it stands in for
``gpu_util`` on devices that export no DCGM_FI_DEV_GPU_UTIL (dcgm-exporter 4.x enables GR_ENGINE_ACTIVE by
default, GPU_UTIL in 3.x).

Energy (:data:`ENERGY_SPECS`): field 156 ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is millijoules in every DCGM
and dcgm-exporter version; DCGM 4.7 adds field 1611 ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL``, the same counter in
whole joules, under its own id (NVIDIA keeps a unit change on a new id, never on the old one). The unit therefore
comes from the field, never from a version. 1611 is stored as ``energy_j_whole``, which stands in for ``energy_j``
only on a device that has no field 156 series, so a scrape carrying both is counted once.
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
ENERGY_WHOLE_J = "energy_j_whole"

SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(100, ("DCGM_FI_DEV_SM_CLOCK",), "SMCLK", "sm_clock_mhz", 1.0, "MHz"),
    FieldSpec(101, ("DCGM_FI_DEV_MEM_CLOCK",), "MMCLK", "mem_clock_mhz", 1.0, "MHz"),
    FieldSpec(112, ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), "DVCCTR",
              "clock_reasons", 1.0, "bitmask"),
    FieldSpec(140, ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS"), "MMTMP", "mem_temp_c", 1.0, "C"),
    FieldSpec(150, ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"), "TMPTR", "gpu_temp_c", 1.0, "C"),
    FieldSpec(155, ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"), "POWER", "power_w", 1.0, "W"),
    FieldSpec(156, ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), "TOTEC", "energy_j", 0.001, "mJ"),
    FieldSpec(203, ("DCGM_FI_DEV_GPU_UTIL",), "GPUTL", "gpu_util", 0.01, "%"),
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

# --- energy (kept in its own block) ---------------------------------------------------------------------------
# 1611: DCGM 4.7's base-unit energy counter (NVIDIA/go-dcgm pkg/dcgm/base_unit_fields_test.go pairs it with the
# legacy 156, "different units must retain different field IDs"). Its dcgmi dmon short name is not published in
# any material we have, so no dmon column maps to it (a dmon capture of it is reported unmapped, not guessed).
ENERGY_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(1611, ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",), "", ENERGY_WHOLE_J, 1.0, "J"),
)
SPECS = SPECS + ENERGY_SPECS

# Metric names that meant different fields, in different units, in different DCGM versions: not read (a reading
# could be off by 100x), reported unmapped with this reason. DCGM_FI_DEV_GPU_UTIL_RATIO was field 203's name in
# DCGM 4.6 (integer percent; NVIDIA/DCGM testing/python3/dcgm_fields.py, go-dcgm pkg/dcgm/legacy_fields.csv) and is
# field 1613, a 0..1 ratio, in DCGM 4.7 (NVIDIA's field-identifier reference), where 203 is DCGM_FI_DEV_GPU_UTIL.
AMBIGUOUS_NAMES = {
    "DCGM_FI_DEV_GPU_UTIL_RATIO": "field 203 (percent) in DCGM 4.6, field 1613 (0..1 ratio) in DCGM 4.7: not read; "
                                  "export DCGM_FI_DEV_GPU_UTIL (203) for gpu_util",
}

BY_NAME = {n: s for s in SPECS for n in s.names}
# --- dcgm-exporter's 1.x-compatibility metric names (kept in its own block) ----------------------------------
# etc/1.x-compatibility-metrics.csv ships lower-case names (dcgm_total_energy_consumption ...) that the exporter
# exports as written; go-dcgm pkg/dcgm/legacy_fields.csv resolves each to its field id, whose unit is the field's.
LEGACY_1X_NAMES = {
    "dcgm_sm_clock": 100, "dcgm_memory_clock": 101, "dcgm_memory_temp": 140, "dcgm_gpu_temp": 150,
    "dcgm_power_usage": 155, "dcgm_total_energy_consumption": 156, "dcgm_gpu_utilization": 203,
    "dcgm_mem_copy_utilization": 204, "dcgm_xid_errors": 230, "dcgm_fb_used": 252,
    "dcgm_ecc_sbe_volatile_total": 310, "dcgm_ecc_dbe_volatile_total": 311, "dcgm_ecc_sbe_aggregate_total": 312,
    "dcgm_ecc_dbe_aggregate_total": 313, "dcgm_fi_prof_gr_engine_active": 1001, "dcgm_fi_prof_sm_active": 1002,
    "dcgm_fi_prof_sm_occupancy": 1003, "dcgm_fi_prof_pipe_tensor_active": 1004, "dcgm_fi_prof_dram_active": 1005,
}
BY_DMON = {s.dmon: s for s in SPECS if s.dmon}
BY_ID = {s.field_id: s for s in SPECS}
BY_NAME.update({name: BY_ID[fid] for name, fid in LEGACY_1X_NAMES.items()})
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
