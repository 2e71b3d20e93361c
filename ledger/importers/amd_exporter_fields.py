"""ROCm device-metrics-exporter metric names -> Sample fields, as a Prometheus scrape or query shows them.

The exporter (ROCm/device-metrics-exporter, pkg/amdgpu/gpuagent/gpuagent_metrics.go) declares every series a
gauge and names it in lower case behind the ``amd_`` prefix every published query uses (``amd_gpu_gfx_activity``).
Only names whose unit the exporter's own help text states are read; the rest are reported unmapped.
docs/telemetry.md ("ROCm device-metrics-exporter") prints this table.

Op counters: ``amd_gpu_prof_total_16_ops`` / ``_32_ops`` / ``_64_ops`` ("The number of 16/32/64 bits OPS
executed") are read as cumulative counts (the published dashboards take ``rate()`` of them) and stored as
``ops_16``/``ops_32``/``ops_64``; they are no Sample field: :mod:`ledger.importers.op_counters` turns their
deltas into each sample's ``fp_ops``.
"""

from __future__ import annotations

from .dcgm_fields import FieldSpec

OP_COUNTERS = ("ops_16", "ops_32", "ops_64")
PCT = 0.01

# (exporter metric, Sample field, scale, the unit the exporter's help text states)
_TABLE = (
    ("amd_gpu_gfx_activity", "gpu_util", PCT, "% (0-100)"),           # "Graphics engine usage in Percentage"
    ("amd_gpu_umc_activity", "mem_copy_util", PCT, "% (0-100)"),      # "Memory engine usage in Percentage"
    ("amd_gpu_package_power", "power_w", 1.0, "W"),                   # "Current socket power in Watts" (MI3xx)
    ("amd_gpu_junction_temperature", "gpu_temp_c", 1.0, "C"),         # "Current junction/hotspot temperature"
    ("amd_gpu_memory_temperature", "mem_temp_c", 1.0, "C"),           # "Current memory temperature in Celsius"
    ("amd_gpu_energy_consumed", "energy_j", 1e-6, "uJ"),              # "Accumulated energy consumed ... in uJ"
    ("amd_gpu_prof_tensor_active_percent", "tensor_active", PCT, "%"),   # "MFMA Utililization Unit: percent"
    ("amd_gpu_prof_sm_active", "sm_active", PCT, "% (0-100)"),        # "percentage of GPUTime vector ALU ..."
    ("amd_gpu_prof_occupancy_percent", "sm_occupancy", PCT, "%"),     # "GPU Occupancy as % of maximum"
    ("amd_gpu_prof_total_16_ops", "ops_16", 1.0, "ops"),              # "The number of 16 bits OPS executed"
    ("amd_gpu_prof_total_32_ops", "ops_32", 1.0, "ops"),
    ("amd_gpu_prof_total_64_ops", "ops_64", 1.0, "ops"),
)

AMD_SPECS: tuple[FieldSpec, ...] = tuple(FieldSpec(0, (name,), "", target, scale, unit)
                                          for name, target, scale, unit in _TABLE)
AMD_BY_NAME = {s.names[0]: s for s in AMD_SPECS}
