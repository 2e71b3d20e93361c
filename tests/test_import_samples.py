"""Every real telemetry sample (tests/fixtures/pathb, copied from the shared samples with their sources) parses,
with the device count and values spot-checked against the file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ledger.importers import amdsmi, dmon, nvidia_smi, prometheus
from ledger.importers.common import InputError

F = Path(__file__).parent / "fixtures" / "pathb"
T0 = 1_767_225_600.0


def values(c, device, field):
    ts, vs = c.series[device][field]
    return [None if math.isnan(v) else v for v in vs]


def test_every_sample_file_has_its_source_note():
    data = [p for p in F.rglob("*") if p.is_file() and not p.name.endswith((".source.txt", ".md"))
            and p.name != "SOURCE.txt"]
    assert len(data) >= 9
    for p in data:
        notes = list(p.parent.glob("*.source.txt")) + list(p.parent.glob("SOURCE.txt"))
        assert notes, p


def test_dcgm_exporter_quickstart_with_sentinel():
    c = prometheus.read(F / "metrics_scrape_readme_quickstart_sentinel_nvidia_docs.prom", default_ts=T0)
    dev = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    assert list(c.devices) == [dev]
    assert values(c, dev, "sm_clock_mhz") == [139.0]
    assert values(c, dev, "mem_clock_mhz") == [405.0]
    assert values(c, dev, "mem_temp_c") == [None]                    # 9223372036854775794 = NOT_SUPPORTED
    assert c.reasons[dev][(T0, "mem_temp_c")] == "dcgm_blank"


def test_dcgm_exporter_scrape_needs_a_time_when_it_has_none():
    with pytest.raises(InputError, match="no timestamp"):
        prometheus.read(F / "metrics_scrape_readme_quickstart_sentinel_nvidia_docs.prom")


def test_dcgm_exporter_t4_pod_labels():
    c = prometheus.read(F / "metrics_scrape_t4_prof_pod_labels_dcgm_issue191.prom", default_ts=T0)
    assert sorted(c.devices) == ["GPU-4812b59b-1f1a-430f-d8a4-69d2ee8c18bb", "GPU-84412445-5790-0b3f-f714-da8aa3b2c0b0"]
    g0 = c.devices["GPU-84412445-5790-0b3f-f714-da8aa3b2c0b0"]
    assert (g0.index, g0.sku, g0.node) == (0, "Tesla T4", "gke-test-dcgm-default-pool-fed1e979-tt7p")
    for f in ("sm_active", "sm_occupancy", "tensor_active"):
        assert values(c, g0.device, f) == [0.0]
    # GPU 0 is held by a pod (tenant = namespace); GPU 1 has empty pod labels: no allocation context.
    ctxs = {(d, ctx.kind, ctx.job_id, ctx.tenant) for (d, ctx) in c.contexts}
    assert ctxs == {(g0.device, "k8s", "default/triton-84d57987c9-kks4k", "default")}


def test_query_range_docs_sample_structure():
    text = (F / "api_v1_query_range_matrix_format_prometheus_docs.json").read_text()
    c = prometheus.parse(text, "docs.json")
    assert c.points == 0 and not c.devices                      # metric "up" is not telemetry we map
    # The same document with a DCGM metric name: both series, their 3 points each, parsed as written.
    doc = json.loads(text)
    for s in doc["data"]["result"]:
        s["metric"]["__name__"] = "DCGM_FI_DEV_GPU_UTIL"
    c = prometheus.parse(json.dumps(doc), "docs.json")
    assert sorted(c.devices) == ["localhost:9090/gpu?", "localhost:9091/gpu?"]   # no UUID: keyed by instance
    assert c.points == 6
    devs = sorted(c.series)
    got = sorted(values(c, d, "gpu_util") for d in devs)
    assert got == [[0.0, 0.0, 0.01], [0.01, 0.01, 0.01]]
    ts = c.series[devs[0]]["gpu_util"][0]
    assert list(ts) == [1435781430.781, 1435781445.781, 1435781460.781]


def test_dcgmi_dmon_issue244():
    p = F / "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"
    with pytest.raises(InputError, match="no timestamps"):
        dmon.read(p)
    c = dmon.read(p, start=T0, interval=1.0, node="n1")
    assert len(c.devices) == 8
    g0, g1 = "n1/gpu0", "n1/gpu1"
    assert values(c, g0, "gr_engine_active") == [None, 0.888]          # tick 0 all N/A, tick 1 GRACT 0.888
    assert values(c, g0, "tensor_active") == [None, 0.178]
    assert values(c, g1, "sm_active") == [None, 0.777]
    assert list(c.series[g0]["sm_active"][0]) == [T0, T0 + 1]
    assert c.reasons[g0][(T0, "sm_active")] == "not_available"


def test_nvidia_smi_query_csv_h100():
    p = F / "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt"
    with pytest.raises(InputError, match="no timestamp column"):
        nvidia_smi.read(p)
    c = nvidia_smi.read(p, start=T0, interval=1.0, node="n1")
    (dev,) = c.devices
    assert values(c, dev, "gpu_util") == [1.0]          # "100 %"
    assert values(c, dev, "mem_copy_util") == [0.0]     # "0 %"
    assert values(c, dev, "power_w") == [290.28]        # "290.28 W"


def test_amd_smi_metric_throttle():
    c = amdsmi.read(F / "amd_smi" / "L0034_amd_smi_metric_throttle.txt", start=T0, interval=1.0, node="mi")
    assert len(c.devices) >= 2 and all(i.vendor == "amd" for i in c.devices.values())
    assert values(c, "mi/gpu0", "clock_reasons") == [0.0]   # every *_VIOLATION_STATUS is NOT ACTIVE


def test_amd_smi_monitor_violation_16_gpus():
    c = amdsmi.read(F / "amd_smi" / "L0079_amd_smi_monitor_violation.txt", start=T0, interval=1.0, node="mi")
    assert len(c.devices) == 16
    assert values(c, "mi/gpu15", "clock_reasons") == [0.0]


def test_amd_smi_metric_usage_with_wrapped_lists():
    c = amdsmi.read(F / "amd_smi" / "L0107_amd_smi_metric_usage.txt", start=T0, interval=1.0, node="mi")
    assert len(c.devices) >= 2
    assert values(c, "mi/gpu0", "gpu_util") == [0.0]        # GFX_ACTIVITY: 0 %
    assert values(c, "mi/gpu0", "mem_copy_util") == [0.0]   # UMC_ACTIVITY: 0 %
    assert "sm_active" not in c.series["mi/gpu0"]           # per-XCP lists are skipped, not mis-mapped


def test_amd_smi_metric_power_json():
    c = amdsmi.read(F / "amd_smi" / "L1635_amd_smi_metric_p_json.txt", start=T0, interval=1.0, node="mi")
    assert list(c.devices) == ["mi/gpu0"]
    assert values(c, "mi/gpu0", "power_w") == [10.0]        # socket_power {"value": 10, "unit": "W"}


def test_amd_smi_plain_wrapped_unit_and_energy_units():
    text = ("GPU: 0\n    ENERGY:\n        TOTAL_ENERGY_CONSUMPTION: 1500.5\n            J\n"
            "    TEMPERATURE:\n        EDGE: 40 \u00b0C\n        HOTSPOT: 55 \u00b0C\n        MEM: N/A\n")
    c = amdsmi.parse(text, "x", start=T0, interval=1.0, node="mi")
    assert values(c, "mi/gpu0", "energy_j") == [1500.5]
    assert values(c, "mi/gpu0", "gpu_temp_c") == [55.0]
    assert values(c, "mi/gpu0", "mem_temp_c") == [None]


def test_nvidia_smi_xml_snapshot():
    xml = """<?xml version="1.0" ?>
<nvidia_smi_log><timestamp>Thu Jan  1 00:00:00 2026</timestamp><driver_version>550.54.15</driver_version>
<gpu id="00000000:18:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>GPU-abc</uuid>
<minor_number>0</minor_number><fb_memory_usage><used>1024 MiB</used></fb_memory_usage>
<utilization><gpu_util>87 %</gpu_util><memory_util>40 %</memory_util></utilization>
<temperature><gpu_temp>61 C</gpu_temp><memory_temp>N/A</memory_temp></temperature>
<gpu_power_readings><power_draw>512.34 W</power_draw></gpu_power_readings>
<clocks><sm_clock>1755 MHz</sm_clock><mem_clock>2619 MHz</mem_clock></clocks>
<clocks_event_reasons><clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>
<clocks_event_reason_sw_power_cap>Active</clocks_event_reason_sw_power_cap></clocks_event_reasons>
<processes><process_info><pid>1</pid></process_info></processes></gpu></nvidia_smi_log>
"""
    c = nvidia_smi.parse(xml + xml.replace("00:00:00", "00:00:05"), "smi.xml", node="n1")
    assert list(c.devices) == ["GPU-abc"]
    assert values(c, "GPU-abc", "gpu_util") == [0.87, 0.87]
    assert values(c, "GPU-abc", "power_w") == [512.34, 512.34]
    assert values(c, "GPU-abc", "clock_reasons") == [4.0, 4.0]
    assert values(c, "GPU-abc", "mem_temp_c") == [None, None]
    assert list(c.series["GPU-abc"]["gpu_util"][0]) == [T0, T0 + 5]
