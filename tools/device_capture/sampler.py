"""Samples NVML (and, on Hopper or later, GPM profiling metrics) once a second into a CSV until killed.

Run on the GPU machine beside the load (tools/device_capture/run.sh). Every field that cannot be read is left
empty and its NVML error is written once to the sidecar ``<out>.errors``; nothing is set or reset on the device.
"""
import csv
import signal
import sys
import time

import pynvml as N

out_path = sys.argv[1]
period = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
N.nvmlInit()
handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
errors: dict[str, str] = {}

GPM = {"gpm_graphics_util": N.NVML_GPM_METRIC_GRAPHICS_UTIL, "gpm_sm_util": N.NVML_GPM_METRIC_SM_UTIL,
       "gpm_sm_occupancy": N.NVML_GPM_METRIC_SM_OCCUPANCY, "gpm_integer_util": N.NVML_GPM_METRIC_INTEGER_UTIL,
       "gpm_any_tensor_util": N.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "gpm_dfma_tensor_util": N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL,
       "gpm_hmma_tensor_util": N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "gpm_imma_tensor_util": N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL,
       "gpm_dram_bw_util": N.NVML_GPM_METRIC_DRAM_BW_UTIL, "gpm_fp64_util": N.NVML_GPM_METRIC_FP64_UTIL,
       "gpm_fp32_util": N.NVML_GPM_METRIC_FP32_UTIL, "gpm_fp16_util": N.NVML_GPM_METRIC_FP16_UTIL,
       "gpm_pcie_tx_mib_s": N.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "gpm_pcie_rx_mib_s": N.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
       "gpm_nvlink_rx_mib_s": N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
       "gpm_nvlink_tx_mib_s": N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC}
VIOLATIONS = {"viol_power_ns": N.NVML_PERF_POLICY_POWER, "viol_thermal_ns": N.NVML_PERF_POLICY_THERMAL,
              "viol_sync_boost_ns": N.NVML_PERF_POLICY_SYNC_BOOST, "viol_board_limit_ns": N.NVML_PERF_POLICY_BOARD_LIMIT,
              "viol_low_util_ns": N.NVML_PERF_POLICY_LOW_UTILIZATION, "viol_reliability_ns": N.NVML_PERF_POLICY_RELIABILITY}
FIELDS = {"fi_memory_temp_c": N.NVML_FI_DEV_MEMORY_TEMP, "fi_power_instant_mw": N.NVML_FI_DEV_POWER_INSTANT,
          "fi_energy_mj": N.NVML_FI_DEV_ENERGY, "fi_pcie_replay": N.NVML_FI_DEV_PCIE_REPLAY_COUNTER}


def read(name, fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a capture records what it cannot read
        errors.setdefault(name, repr(e))
        return ""


gpm_ok = {}
prev = {}
for i, h in enumerate(handles):
    try:
        gpm_ok[i] = bool(N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except Exception as e:  # noqa: BLE001
        errors["gpm_support"] = repr(e)
        gpm_ok[i] = False
    if gpm_ok[i]:
        prev[i] = N.nvmlGpmSampleGet(h, N.nvmlGpmSampleAlloc())

cols = ["t_unix", "index", "uuid", "name", "gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz",
        "max_sm_clock_mhz", "clock_event_reasons", "power_mw", "power_limit_mw", "total_energy_mj", "gpu_temp_c",
        "fb_used_mib", "fb_total_mib", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
        "pstate", "pcie_tx_kib_s", "pcie_rx_kib_s", *FIELDS, *VIOLATIONS, *GPM]
stop = False


def _stop(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)
with open(out_path, "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(cols)
    next_t = time.time()
    while not stop:
        next_t += period
        time.sleep(max(0.0, next_t - time.time()))
        for i, h in enumerate(handles):
            row = {"t_unix": f"{time.time():.6f}", "index": i,
                   "uuid": read("uuid", lambda: N.nvmlDeviceGetUUID(h)), "name": read("name", lambda: N.nvmlDeviceGetName(h))}
            u = read("util", lambda: N.nvmlDeviceGetUtilizationRates(h))
            row["gpu_util_pct"], row["mem_util_pct"] = (u.gpu, u.memory) if u != "" else ("", "")
            row["sm_clock_mhz"] = read("sm_clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM))
            row["mem_clock_mhz"] = read("mem_clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM))
            row["max_sm_clock_mhz"] = read("max_sm_clock", lambda: N.nvmlDeviceGetMaxClockInfo(h, N.NVML_CLOCK_SM))
            row["clock_event_reasons"] = read("reasons", lambda: f"0x{N.nvmlDeviceGetCurrentClocksEventReasons(h):016x}")
            row["power_mw"] = read("power", lambda: N.nvmlDeviceGetPowerUsage(h))
            row["power_limit_mw"] = read("power_limit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h))
            row["total_energy_mj"] = read("energy", lambda: N.nvmlDeviceGetTotalEnergyConsumption(h))
            row["gpu_temp_c"] = read("temp", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))
            m = read("mem", lambda: N.nvmlDeviceGetMemoryInfo(h))
            row["fb_used_mib"], row["fb_total_mib"] = (m.used >> 20, m.total >> 20) if m != "" else ("", "")
            for col, et, ct in (("ecc_sbe_volatile", N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_VOLATILE_ECC),
                                ("ecc_dbe_volatile", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_VOLATILE_ECC),
                                ("ecc_sbe_aggregate", N.NVML_MEMORY_ERROR_TYPE_CORRECTED, N.NVML_AGGREGATE_ECC),
                                ("ecc_dbe_aggregate", N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_AGGREGATE_ECC)):
                row[col] = read(col, lambda: N.nvmlDeviceGetTotalEccErrors(h, et, ct))
            row["pstate"] = read("pstate", lambda: N.nvmlDeviceGetPerformanceState(h))
            row["pcie_tx_kib_s"] = read("pcie_tx", lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES))
            row["pcie_rx_kib_s"] = read("pcie_rx", lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES))
            fv = read("field_values", lambda: N.nvmlDeviceGetFieldValues(h, list(FIELDS.values())))
            for k, v in zip(FIELDS, fv if fv != "" else [None] * len(FIELDS)):
                if v is None or v.nvmlReturn != 0:
                    row[k] = ""
                    if v is not None:
                        errors.setdefault(k, f"nvmlReturn {v.nvmlReturn}")
                    continue
                vt = v.valueType
                row[k] = {0: v.value.dVal, 1: v.value.uiVal, 2: v.value.ulVal, 3: v.value.ullVal,
                          4: v.value.sllVal, 5: v.value.siVal}.get(vt, v.value.ullVal)
            for k, pol in VIOLATIONS.items():
                vs = read(k, lambda: N.nvmlDeviceGetViolationStatus(h, pol))
                row[k] = vs.violationTime if vs != "" else ""
            if gpm_ok.get(i):
                cur = read("gpm_sample", lambda: N.nvmlGpmSampleGet(h, N.nvmlGpmSampleAlloc()))
                if cur != "":
                    mg = N.c_nvmlGpmMetricsGet_t()
                    mg.version = N.NVML_GPM_METRICS_GET_VERSION
                    mg.numMetrics = len(GPM)
                    mg.sample1, mg.sample2 = prev[i], cur
                    for j, mid in enumerate(GPM.values()):
                        mg.metrics[j].metricId = mid
                    got = read("gpm_metrics", lambda: N.nvmlGpmMetricsGet(mg))
                    for j, k in enumerate(GPM):
                        ok = got != "" and mg.metrics[j].nvmlReturn == 0
                        row[k] = f"{mg.metrics[j].value:.3f}" if ok else ""
                    N.nvmlGpmSampleFree(prev[i])
                    prev[i] = cur
            w.writerow([row.get(c, "") for c in cols])
        fh.flush()
with open(out_path + ".errors", "w") as fh:
    for k, v in sorted(errors.items()):
        fh.write(f"{k}\t{v}\n")
