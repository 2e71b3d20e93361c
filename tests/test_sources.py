"""The DCGM, nvidia-smi and amd-smi parsers on the real captured outputs in tests/fixtures (quirks included)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.capture.sources import amd_snapshots as amdsmi, dcgm, nvml

FIX = Path(__file__).parent / "fixtures"


def read(area: str, name: str) -> str:
    return (FIX / area / name).read_text(encoding="utf-8")


# --- DCGM -------------------------------------------------------------------------------------------------------

def test_verbose_report_after_stop_one_gpu():
    r = dcgm.parse_stats(read("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt"))
    assert isinstance(r, dcgm.JobStatsReport) and r.job_id == "232" and r.verbose
    (b,) = r.blocks
    assert b.gpu_id == 0
    assert b.end - b.start == 48  # 19:40:36 .. 19:41:24, local ctime
    assert time.strftime("%H:%M:%S", time.localtime(b.start)) == "19:40:36"
    v = b.values
    assert v["power_w_avg"] == 37.8985 and v["power_w_max"] == 45.874 and v["power_w_min"] == 22.999
    assert v["max_memory_bytes"] == 2628780032 and v["sm_clock_mhz_avg"] == 1312 and v["execution_time_s"] == 47.57
    assert v["energy_j"] == 0  # printed as a number: a (poor) measurement, kept as such
    # "Avg: N/A, ..." and "Not Supported" are missing with their cause, never zeros.
    assert b.missing["pcie_rx_mb_avg"] == "not_available" and "pcie_rx_mb_avg" not in v
    assert b.missing["slowdown_reliability_pct"] == "not_supported"
    assert v["slowdown_power_pct"] == 0.0 and v["health"] == "Healthy"
    assert b.processes == ({"pid": 10140, "sm_util_pct": 6.0, "memory_util_pct": 1.0},)
    assert not b.measured_nothing


def test_mig_summary_measured_nothing():
    r = dcgm.parse_stats(read("dcgmi_stats", "dcgmi_stats_j_summary_mig_a100_dcgm_issue93.txt"))
    assert isinstance(r, dcgm.JobStatsReport) and r.job_id == "952404" and not r.verbose
    (b,) = r.blocks
    assert b.gpu_id is None  # the Summary block
    assert b.missing["energy_j"] == "not_specified" and b.missing["power_w_avg"] == "not_available"
    assert b.missing["slowdown_sync_boost_pct"] == "not_specified"
    assert b.measured_nothing  # MIG: stats unsupported, its zeros are not measurements
    assert b.end - b.start == 6392  # 16:35:00 .. 18:21:32


def test_truncated_values_are_missing_not_numbers():
    # The cut form dcgmi prints for long values (NOTES: "Avg: 247.541, Max: 247.541, Min: 247...").
    text = read("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt").replace(
        "| Power Usage (Watts)                | Avg: 37.8985, Max: 45.874, Min: 22.999  |",
        "| Power Usage (Watts)                | Avg: 247.541, Max: 247.541, Min: 247... |")
    (b,) = dcgm.parse_stats(text).blocks
    assert b.values["power_w_avg"] == 247.541 and b.values["power_w_max"] == 247.541
    assert b.missing["power_w_min"] == "truncated" and "power_w_min" not in b.values


@pytest.mark.parametrize("text,cause", [
    ("Error: Job 1234.0 was not found.", "not_found"),
    ("Error: Unable to retrieve job statistics. Return: No data is available.", "no_data"),
    ("Error: unable to establish a connection to the specified host: localhost", "connection"),
    ("Error: Unable to retrieve job statistics. Return: Job ID too long.", "error"),
])
def test_errors_are_classified(text, cause):
    r = dcgm.parse_stats(text)
    assert isinstance(r, dcgm.DcgmError) and r.cause == cause and r.message


def test_discovery_with_null_names():
    gpus = dcgm.parse_discovery(read("dcgmi_stats", "dcgmi_discovery_l_4xh100_null_names_dcgm_issue229.txt"))
    assert [g.gpu_id for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].uuid == "GPU-d6a2c177-4cd8-8d01-0310-79f2720f37de" and gpus[3].pci_bus_id == "00000000:DC:00.0"
    assert all(g.name is None and g.missing["name"] == "null" for g in gpus)  # "<<<NULL>>>" is not a SKU


def test_group_create_message():
    assert dcgm.parse_group_create('Successfully created group "test_group" with a group ID of 2') == 2
    assert dcgm.parse_group_create("Error: Cannot create group") is None


# --- nvidia-smi -------------------------------------------------------------------------------------------------

def test_query_csv_with_units_and_prompt_line():
    t = nvml.parse_query_csv(read("nvidia_smi", "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt"))
    assert t.columns == ("utilization.gpu", "utilization.memory", "power.draw")
    assert t.units == {"utilization.gpu": "%", "utilization.memory": "%", "power.draw": "W"}
    assert t.rows == ({"utilization.gpu": 100, "utilization.memory": 0, "power.draw": 290.28},)


def test_query_csv_placeholders_are_missing():
    t = nvml.parse_query_csv("0, GPU-abc, [N/A], [Not Supported]\n",
                             ("index", "uuid", "power.draw", "clocks_event_reasons.active"))
    assert t.rows[0]["power.draw"] is None
    assert t.missing[0] == {"power.draw": "not_available", "clocks_event_reasons.active": "not_supported"}


def test_list_skips_mig_rows():
    gpus = nvml.parse_list(read("nvidia_smi", "nvidia_smi_L_4xh100_mig_dcgm_issue229.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3] and gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert gpus[3].uuid == "GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874"


def test_list_and_discovery_agree_on_uuids():
    a = {g.index: g.uuid for g in nvml.parse_list(read("nvidia_smi", "nvidia_smi_L_4xh100_mig_dcgm_issue229.txt"))}
    b = {g.gpu_id: g.uuid for g in dcgm.parse_discovery(
        read("dcgmi_stats", "dcgmi_discovery_l_4xh100_null_names_dcgm_issue229.txt"))}
    assert a == b


def test_clock_event_reasons_old_naming():
    (g,) = nvml.parse_clock_event_reasons(read("nvidia_smi", "nvidia_smi_q_d_PERFORMANCE_driver495_mangohud636.txt"))
    assert g["pci_bus_id"] == "00000000:0E:00.0"
    assert g["reasons"]["Idle"] is True and g["reasons"]["SW Power Cap"] is False
    assert len(g["reasons"]) == 9 and g["reasons"]["HW Power Brake Slowdown"] is False


def test_clock_event_reasons_na_line():
    text = "GPU 00000000:01:00.0\n    Clocks Event Reasons                  : N/A\n"
    (g,) = nvml.parse_clock_event_reasons(text)
    assert g["reasons"] == {} and g["missing"] == {"clock_event_reasons": "not_available"}


# --- amd-smi ----------------------------------------------------------------------------------------------------

def test_throttle_text_counters():
    s = amdsmi.parse_metric_text(read("amd_smi", "changelog_blocks/L0034_amd_smi_metric_throttle.txt"))
    c0, m0 = amdsmi.counters(s, 0)
    assert c0 == {"throttle.accumulation_counter": 3808991, "throttle.prochot_accumulated": 0,
                  "throttle.ppt_accumulated": 585613, "throttle.socket_thermal_accumulated": 2190,
                  "throttle.vr_thermal_accumulated": 0, "throttle.hbm_thermal_accumulated": 0}
    assert m0 == {}
    c1, _ = amdsmi.counters(s, 1)
    assert c1["throttle.socket_thermal_accumulated"] == 18010
    assert s.values[0]["throttle.ppt_violation_activity"] == 0  # "0 %": a gauge, not a counter


def test_usage_text_na_and_wrapped_lists():
    s = amdsmi.parse_metric_text(read("amd_smi", "changelog_blocks/L0107_amd_smi_metric_usage.txt"))
    assert s.values[0]["usage.gfx_activity"] == 0 and s.missing[0]["usage.mm_activity"] == "not_available"
    assert set(s.values) == {0, 1}


def test_power_json_value_unit_objects():
    s = amdsmi.parse_metric_json(read("amd_smi", "changelog_blocks/L1635_amd_smi_metric_p_json.txt"))
    assert s.values[0] == {"power.socket_power": 10, "power.gfx_voltage": 6, "power.soc_voltage": 918,
                           "power.mem_voltage": 1250}


def test_counter_delta_reset_and_na():
    before = {"energy.total_energy_consumption": 100.0, "ecc.total_correctable_count": 5.0}
    after = {"energy.total_energy_consumption": 160.0, "ecc.total_correctable_count": 2.0}
    d, m = amdsmi.counter_delta(before, after, {"ecc.total_deferred_count": "not_available"}, {})
    assert d == {"energy.total_energy_consumption": 60.0}
    assert m == {"ecc.total_correctable_count": "counter_reset", "ecc.total_deferred_count": "not_available"}


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.floats(0, 1e12)),
       st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.floats(0, 1e12)))
def test_counter_delta_partitions_keys_and_never_negative(before, after):
    d, m = amdsmi.counter_delta(before, after)
    assert set(d) | set(m) == set(before) | set(after) and not set(d) & set(m)
    assert all(v >= 0 for v in d.values())


def test_list_json():
    text = ('[{"gpu": 0, "bdf": "0000:0c:00.0", "uuid": "00ff74a1-0000-1000-80e8-000000000000", "kfd_id": 1},'
            ' {"gpu": 1, "bdf": "0000:22:00.0", "uuid": "N/A"}]')
    g = amdsmi.parse_list_json(text)
    assert g[0].uuid.startswith("00ff74a1") and g[1].uuid is None and g[1].missing == {"uuid": "not_available"}
