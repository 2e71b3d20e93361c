"""The conformance corpus (tests/fixtures/real/): every real capture imports, with concrete values read from it.

One test per capture; each defect of issue 14 reproduced on a capture of the same shape. Captures come from
public repositories' fixtures, issue threads and vendor documentation; each has a ``.source.txt`` saying where
it came from, which version, and what was trimmed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ledger.importers import amdsmi, dmon, nvidia_smi, prometheus
from ledger.importers.common import InputError, noise_reason
from ledger.importers.dcgm_fields import GR_ENGINE_ACTIVE as GRACT

R = Path(__file__).parent / "fixtures" / "real"
T0 = 1_767_225_600.0


def vals(c, device, field):
    return [None if math.isnan(v) else v for v in c.series[device][field][1]]


def text(*parts):
    return (R.joinpath(*parts)).read_text(encoding="utf-8")


def test_the_corpus_has_thirty_captures_each_with_its_source():
    data = [p for p in R.rglob("*") if p.is_file() and not p.name.endswith("source.txt")
            and not p.name.endswith("SOURCE.txt")]
    assert len(data) >= 30, len(data)
    for p in data:
        assert p.with_name(p.name + ".source.txt").exists(), p


# --- nvidia-smi -q -x, four driver generations ---------------------------------------------------------------

def test_xml_a100_mig_driver510_instances_are_devices_and_parent_is_partitioned():
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "a100_sxm4_mig_driver510.xml")
    parent = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
    assert sorted(c.devices) == [parent, parent + "/gi1", parent + "/gi2"]
    assert c.devices[parent].partitioned and c.source_version == "driver 510.47.03"
    assert [c.devices[f"{parent}/gi{g}"].mig_profile for g in (1, 2)] == ["3g.20gb", "3g.20gb"]   # 42 SMs, 19968 MiB
    assert vals(c, parent, "power_w") == [66.92] and vals(c, parent, "mem_temp_c") == [44.0]
    assert vals(c, parent, "gpu_util") == [None]               # N/A under MIG: missing, not 0
    assert vals(c, parent, "clock_reasons") == [0.0]           # "Not Active\n   " with a line break inside
    assert vals(c, parent + "/gi1", "fb_used_mib") == [19.0]
    assert "row_remap_pending" not in c.series[parent]         # <remapped_rows>N/A</remapped_rows>: no children


def test_xml_a100_80gb_driver535_four_1g_instances_event_reasons_and_gpu_power_readings():
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "a100_sxm4_80gb_4x1g_driver535.xml")
    parent = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert [c.devices[f"{parent}/gi{g}"].mig_profile for g in (3, 4, 5, 6)] == ["1g.20gb"] * 4
    assert vals(c, parent, "power_w") == [67.03]               # gpu_power_readings/power_draw (v12)
    assert vals(c, parent, "ecc_dbe_aggregate") == [0.0]        # dram_uncorrectable (v11+)
    assert c.reasons[parent][(c.series[parent]["gpu_util"][0][0], "gpu_util")] == "not_available"


def test_xml_driver575_yes_no_deprecated_and_instant_power_only():
    # Defect 1: 'row_remap_pending: not a number: No' refused the whole file.
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "rtx4070_laptop_driver575.xml")
    d = "GPU-529b3263-c96d-b557-bc75-697f04917eda"
    assert vals(c, d, "row_remap_pending") == [0.0] and vals(c, d, "row_remap_failure") == [0.0]
    assert vals(c, d, "power_w") == [11.26]                   # instant_power_draw; no <power_draw> at all
    assert vals(c, d, "gpu_util") == [0.3] and vals(c, d, "sm_clock_mhz") == [675.0]
    assert vals(c, d, "clock_reasons") == [1.0]               # gpu_idle Active
    assert vals(c, d, "compute_procs") == [0.0]               # two graphics (type G) processes, no compute
    assert vals(c, d, "mem_temp_c") == [None] and c.warnings == []


def test_xml_driver580_without_timestamp_needs_start_and_reads_instant_power():
    with pytest.raises(InputError, match=r"document 1: no <timestamp>: give --start"):
        nvidia_smi.read(R / "nvidia_smi_xml" / "rtx_pro_6000_blackwell_driver580.xml")
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "rtx_pro_6000_blackwell_driver580.xml", start=T0)
    d = "GPU-11111111-2222-3333-4444-555555555555"
    assert vals(c, d, "power_w") == [66.84] and vals(c, d, "gpu_temp_c") == [37.0]   # " 66.84 W ", " 37 C "
    assert vals(c, d, "mem_temp_c") == [None] and c.reasons[d][(T0, "mem_temp_c")] == "not_available"


def test_xml_yes_no_on_a_pending_remap_reads_as_one():
    xml = text("nvidia_smi_xml", "rtx4070_laptop_driver575.xml").replace(
        "<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>")
    c = nvidia_smi.parse(xml, "x.xml")
    assert vals(c, "GPU-529b3263-c96d-b557-bc75-697f04917eda", "row_remap_pending") == [1.0]


# --- terminal noise ------------------------------------------------------------------------------------------

def test_dmon_issue244_capture_with_prompt_stop_message_and_ctrl_c():
    # Defect 2: a saved dmon capture ends with ^C and "dmon was stopped ..." (this one also starts with it).
    raw = text("dcgmi_dmon", "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt") + "^C\ndmon was stopped due to receiving a signal\n"
    c = dmon.parse(raw, "dmon.txt", start=T0, interval=1.0, node="n1")
    assert len(c.devices) == 8
    assert vals(c, "n1/gpu0", GRACT)[:2] == [None, 0.888]      # GRACT, N/A on the first tick
    assert c.skipped["interrupt"] == 1 and c.skipped["tool_stopped"] == 2 and c.skipped["shell_prompt"] >= 1
    assert c.mapped["GRACT"] == GRACT and c.mapped["SMACT"] == "sm_active"


def test_a_capture_pasted_behind_a_shell_prompt_is_read_as_what_it_is(runner, cli):
    """The issue-244 capture begins with dmon's stop message and a pasted prompt ("[root@host dir]# dcgmi dmon ...").
    The format reader took the prompt's "[" for JSON and gave up, so `analyze FILE` read the dmon capture as a
    Prometheus export ("expected an exposition line ... got 'ID'"). Every real capture of a format `analyze` reads
    is now named as that format, and the dmon one is analysed given its start and interval (dmon writes none)."""
    from ledger.importers.captures import classify

    wants = {"dcgmi_dmon": "dmon", "amd_smi": "amd-smi", "nvidia_smi_xml": "nvidia-smi"}
    for folder, want in wants.items():
        for p in sorted(R.joinpath(folder).iterdir()):
            if p.name.endswith((".source.txt", ".md")) or "SOURCE" in p.name or "rocm_smi" in p.name:
                continue
            assert classify(p, None) == want, p.name
    path = R / "dcgmi_dmon" / "dcgmi_dmon_e1001-1008_8gpu_dcgm4.2.3_issue244.txt"
    told = runner.invoke(cli, ["analyze", str(path), "--json"])
    assert told.exit_code != 0 and "dmon output has no timestamps: give --start and --interval" in told.output
    res = runner.invoke(cli, ["analyze", str(path), "--json", "--start", "2026-11-03T00:00:00Z", "--interval", "1s",
                              "--node", "n1"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["import"]["devices"] == 8 and got["sources"][0]["kind"] == "dmon"


def test_dmon_with_nothing_readable_is_refused_naming_the_line():
    with pytest.raises(InputError, match=r"d.txt: line 2: expected a dmon row"):
        dmon.parse("#Entity GRACT\nhello world\n", "d.txt", start=T0, interval=1.0)


def test_scrape_behind_kubectl_port_forward_imports_and_counts_the_noise():
    raw = ("Forwarding from 127.0.0.1:9400 -> 9400\nHandling connection for 9400\n"
           + text("dcgm_exporter", "l40s_pods_openshift_dcgm226.prom"))
    c = prometheus.parse(raw, "scrape.prom", default_ts=T0)
    assert c.skipped == {"kubectl_port_forward": 2}
    assert vals(c, "GPU-585834da-79ca-0599-5140-4ffdb131ae93", GRACT) == [0.0]


def test_scrape_without_timestamps_names_the_option_that_works():
    # Defect 7a: the hint said --start, but only --at works for a scrape.
    with pytest.raises(InputError, match=r"--at"):
        prometheus.parse(text("dcgm_exporter", "l40s_pods_openshift_dcgm226.prom"), "s.prom")


@pytest.mark.parametrize("line,why", [("^C", "interrupt"), ("Handling connection for 9400", "kubectl_port_forward"),
                                      ("Forwarding from 127.0.0.1:9400 -> 9400", "kubectl_port_forward"),
                                      ("dmon was stopped due to receiving a signal", "tool_stopped"),
                                      ("Terminated", "tool_stopped"), ("...", "elision"),
                                      ("$ curl -s localhost:9400/metrics", "shell_prompt"),
                                      ("[root@b76d14397 sanmu]# dcgmi dmon -e 1001", "shell_prompt"),
                                      ("AMDSMI Tool: 24.6.2+2b02a07 | AMDSMI Library version: 24.6.2.0", "tool_banner"),
                                      ("GPU 0      0.888        N/A", None), ("  0  126 W     40 °C", None),
                                      ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 5', None)])
def test_noise_is_recognised_and_data_never_is(line, why):
    assert noise_reason(line) == why
    if why is not None:     # the exposition reader asks only about lines without the shape of a sample
        assert prometheus._LINE.match(line) is None


# --- zeros that mean "no sensor" -------------------------------------------------------------------------------

def test_exporter_zero_memory_temperature_is_missing_not_zero_degrees():
    # Defect 7b: memory temperature 0 on a part without an HBM sensor was stored as 0 °C.
    raw = text("dcgm_exporter", "v100_no_labels_gpumontools189.prom").replace(
        'DCGM_FI_DEV_MEMORY_TEMP{gpu="1",UUID="GPU-08abd178-8a91-05c5-6a52-1ab4a05bcdaf",device="nvidia1"} 54',
        'DCGM_FI_DEV_MEMORY_TEMP{gpu="1",UUID="GPU-08abd178-8a91-05c5-6a52-1ab4a05bcdaf",device="nvidia1"} 0')
    c = prometheus.parse(raw, "s.prom", default_ts=T0)
    d = "GPU-08abd178-8a91-05c5-6a52-1ab4a05bcdaf"
    assert vals(c, d, "mem_temp_c") == [None] and c.reasons[d][(T0, "mem_temp_c")] == "zero_unsupported"
    assert vals(c, d, "gpu_temp_c") == [56.0] and vals(c, d, "power_w") == [167.362]


# --- MIG accounting -------------------------------------------------------------------------------------------

PARENT = "GPU-265c9814-6156-355b-e589-ff2064894f16"
ENV = {"IPLEDGER_CONFIG": ""}


def _mig_node_export(path: Path, hours: float = 1.0, cadence: int = 60) -> None:
    """One A100 80GB partitioned 3g + 2g + 1g + 1g, label sets as dcgm-exporter writes them (issue 317/512
    captures): three slices held by pods, one 1g idle; the parent's own series carry a pod's labels too (the
    worst case: they must still never bill)."""
    base = ('gpu="0",UUID="%s",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="mig-node-1"' % PARENT)
    slices = {"1": ("3g.40gb", 'container="trainer",namespace="team-a",pod="train-3g"'),
              "5": ("2g.20gb", 'container="infer",namespace="team-b",pod="infer-2g"'),
              "13": ("1g.10gb", 'container="nb",namespace="team-a",pod="notebook-1g"'),
              "14": ("1g.10gb", None)}
    lines = []
    for k in range(int(hours * 3600 / cadence) + 1):
        t = T0 + k * cadence
        lines.append(f'DCGM_FI_DEV_POWER_USAGE{{{base},container="trainer",namespace="team-a",pod="train-3g"}} 250 {t:.0f}')
        for gi, (profile, pod) in slices.items():
            labels = f'{base},GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"' + (f",{pod}" if pod else "")
            lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.5 {t:.0f}")
    path.write_text("\n".join(lines) + "\n# EOF\n", encoding="utf-8")


def test_mig_node_bills_exactly_the_slices_in_use_and_never_the_parent(runner, cli, tmp_path, sqlite_url):
    src = tmp_path / "mig.om"
    _mig_node_export(src)
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["runs"] == 3 and out["devices"] == 5          # parent + 4 slices stored; 3 runs (idle 1g has none)
    contract = tmp_path / "c.toml"
    contract.write_text('id = "mig"\neffective_from = 2000-01-01\nversion = "1"\ncurrency = "EUR"\n'
                        '[skus.A100-SXM4-80GB]\n'
                        'rate_per_gpu_hour = "7.00"\n', encoding="utf-8")
    assert runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(contract)], env=ENV).exit_code == 0
    costs, bound = {}, set()
    for job, share in (("team-a/train-3g", "3/7"), ("team-b/infer-2g", "2/7"), ("team-a/notebook-1g", "1/7")):
        r = runner.invoke(cli, ["--db", sqlite_url, "receipt", job, "--cluster", "pathb", "--format", "json"], env=ENV)
        assert r.exit_code == 0, r.output
        rc = json.loads(r.output)
        (dev,) = rc["devices"]
        bound.add(dev["uuid"])
        assert dev["mig"]["gpu_uuid"] == PARENT and dev["mig"]["share"] == share
        gh = rc["gpu_hours"]                                   # the identity, exact
        parts = (gh["delivered"] + gh["underutilized"] + gh["starved"] + gh["idle_held"] + gh["unknown"]
                 + sum(gh["throttled"].values()))
        assert abs(gh["paid"] - parts) < 1e-9
        n, d = map(int, share.split("/"))
        assert rc["cost"]["paid"] == pytest.approx(round(gh["paid"] * 7.0 * n / d, 2), abs=0.011)
        costs[job] = rc["cost"]["paid"]
        assert rc["job"]["account"] == job.split("/")[0]
    assert PARENT not in bound and f"{PARENT}/gi14" not in bound
    assert bound == {f"{PARENT}/gi1", f"{PARENT}/gi5", f"{PARENT}/gi13"}
    # 6 of 7 slices held for the same window: 6/7 of the whole GPU's price, the parent adds nothing
    paid_h = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "team-a/train-3g", "--cluster", "pathb",
                                            "--format", "json"], env=ENV).output)["gpu_hours"]["paid"]
    assert sum(costs.values()) == pytest.approx(6.0 * paid_h, abs=0.03)


@pytest.mark.parametrize("profile,sku,share", [("1g.10gb", "NVIDIA A100-SXM4-80GB", "1/7"),
                                               ("7g.80gb", "NVIDIA H100 80GB HBM3", "1"),
                                               ("3g.71gb", "NVIDIA H200", "3/7"), ("1g.6gb", "NVIDIA A30", "1/4"),
                                               ("1g.10gb+me", "NVIDIA H100 80GB HBM3", "1/7"),
                                               ("2g.20gb", "Tesla T4", None), ("big", "NVIDIA A100", None)])
def test_mig_share_table(profile, sku, share):
    from ledger.method.mig import mig_share

    got = mig_share(profile, sku)
    assert (None if got is None else str(got)) == share


# --- workload identity from Prometheus labels -------------------------------------------------------------------

def _runs(sqlite_url: str) -> dict[str, dict]:
    import sqlite3

    con = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    rows = con.execute("SELECT job_id, payload FROM entries WHERE kind = 'allocation_started'").fetchall()
    bound = con.execute("SELECT job_id, device FROM entries WHERE kind = 'device_bound'").fetchall()
    con.close()
    out = {job: {**json.loads(p), "devices": set()} for job, p in rows}
    for job, dev in bound:
        out[job]["devices"].add(dev)
    return out


def test_path_b_multi_namespace_response_gives_runs_for_workloads_only(runner, cli, tmp_path, sqlite_url):
    # Defect 3: the exporter's own namespace/pod became the tenant (idle GPUs billed to gpu-operator), and the
    # workload's exported_* labels were ignored.
    src = R / "prometheus" / "query_vector_multi_namespace_gpu_operator.json"
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--json", "--quiet",
                            "--tenant", "redacted=vision-team"], env=ENV)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["devices"] == 6
    runs = _runs(sqlite_url)
    assert sorted(runs) == ["model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl",
                            "model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl",
                            "redacted/tensorflow-0"]
    assert all("gpu-operator" not in j and "dcgm-exporter" not in j for j in runs)
    assert runs["redacted/tensorflow-0"]["account"] == "vision-team"          # the site mapping
    assert runs["redacted/tensorflow-0"]["devices"] == {"GPU-585834da-79ca-0599-5140-4ffdb131ae93",
                                                        "GPU-8f8001ff-73ba-2e83-3cdc-4156ae4f3912"}
    tts = runs["model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl"]
    assert tts["account"] == "model-playground-stg" and tts["labels"] == {"container": "kserve-container"}
    assert tts["devices"] == {"GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77/gi9"}


def _labels(line: str) -> dict[str, str]:
    body = line.strip()
    name, _, rest = body.partition("{")
    return {"__name__": name, **prometheus._labels(rest.rsplit("}", 1)[0], "x", "line 1")}


EXP = 'namespace="gpu-operator",pod="nvidia-dcgm-exporter-x8k2p",container="nvidia-dcgm-exporter"'
# label set (besides UUID/gpu) -> (run job id, tenant) or None; the same rows are docs/telemetry.md's table
IDENTITY_TABLE = [
    ('namespace="ml",pod="train-0",container="c"', ("ml/train-0", "ml")),
    ('namespace="",pod="",container=""', None),
    (EXP, None),
    (EXP + ',exported_namespace="ml",exported_pod="train-0",exported_container="c"', ("ml/train-0", "ml")),
    ('pod_namespace="ml",pod_name="train-0",container_name="c"', ("ml/train-0", "ml")),
    ('hpc_job="4242"', ("4242", None)),
    ('hpc_job="4242",namespace="physics",pod="slurm-4242",container="c"', ("4242", "physics")),
    ('hpc_job="4242",' + EXP + ',exported_namespace="physics",exported_pod="p",exported_container="c"',
     ("4242", "physics")),
    ('hpc_job="4242",' + EXP, ("4242", None)),
    ('hpc_job="4242",account="astro",namespace="physics",pod="p"', ("4242", "astro")),
    ('instance="nvidia-dcgm-exporter.gpu-operator:9400",job="dcgm-nvidia-gpu-operator"', None),
]


@pytest.mark.parametrize("extra,expected", IDENTITY_TABLE)
def test_identity_table_row(extra, expected):
    labels = _labels('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",' + extra + "}")
    ctx = prometheus.context_from_labels(labels)
    assert (None if ctx is None else (ctx.job_id, ctx.tenant)) == expected


def test_identity_from_real_stored_series_target_labels_only_and_exporter_hostname():
    c = prometheus.Collected("prometheus")
    only_target = _labels(text("prometheus", "target_labels_only_dcgm277.txt"))
    assert prometheus.context_from_labels(only_target) is None
    dev = prometheus.device_from_labels(only_target, c)
    assert c.devices[dev].node == "node-1" and c.devices[dev].sku == "Quadro RTX 6000"
    aks = _labels(text("prometheus", "exporter_pod_hostname_gpuoperator472.txt"))
    dev = prometheus.device_from_labels(aks, c)            # Hostname is the exporter pod: the node label wins
    assert c.devices[dev].node == "aks-gpunp-66230965-vmss000000"
    assert prometheus.context_from_labels(aks) is None


def test_empty_vector_response_is_refused_truthfully(runner, cli, tmp_path, sqlite_url):
    src = R / "prometheus" / "empty_vector_eks_gpuoperator983.json"
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src)], env=ENV)
    assert r.exit_code == 1 and "no telemetry this importer maps" in r.output and str(src) in r.output


# --- AMD: amd-smi across ROCm 6.x --------------------------------------------------------------------------------

def amd(name, **kw):
    return amdsmi.read(R / "amd_smi" / name, start=T0, interval=1.0, node="n", **kw)


def test_amd_metric_text_radeon_rocm63():
    c = amd("metric_text_radeon_rocm63_powerjoular67.txt")
    assert vals(c, "n/gpu0", "gpu_util") == [0.0] and vals(c, "n/gpu0", "mem_copy_util") == [0.01]
    assert vals(c, "n/gpu0", "power_w") == [20.0] and vals(c, "n/gpu0", "sm_clock_mhz") == [14.0]   # GFX_0 CLK
    assert c.skipped == {"shell_prompt": 1}


def test_amd_metric_json_value_unit_objects_w7700():
    c = amd("metric_json_w7700_usage_beszel737.json")
    assert vals(c, "n/gpu0", "gpu_util") == [0.42] and vals(c, "n/gpu0", "mem_copy_util") == [0.01]


def test_amd_monitor_putm_8gpu():
    c = amd("monitor_putm_8gpu_mi300x_rocmblog.txt")
    assert len(c.devices) == 8
    assert vals(c, "n/gpu1", "power_w") == [143.0] and vals(c, "n/gpu1", "gpu_util") == [0.13]
    assert vals(c, "n/gpu3", "mem_clock_mhz") == [913.0] and vals(c, "n/gpu7", "mem_temp_c") == [37.0]


def test_amd_monitor_behind_a_version_banner_in_kubectl_logs():
    c = amd("monitor_ptum_kubectl_logs_banner_rocm622.txt")
    assert c.skipped == {"tool_banner": 1}
    assert vals(c, "n/gpu0", "power_w") == [126.0] and vals(c, "n/gpu0", "sm_clock_mhz") == [182.0]


def test_amd_monitor_all_columns_with_throttle_word_and_na_bandwidth():
    c = amd("monitor_full_columns_throttle_rocm64.txt")
    assert vals(c, "n/gpu0", "gpu_util") == [0.84] and vals(c, "n/gpu0", "fb_used_mib") == [227.0]
    assert vals(c, "n/gpu0", "ecc_dbe_aggregate") == [0.0]
    assert {"throttle", "pcie_bw", "enc_util"} <= set(c.unmapped)     # reported, not fatal


def test_amd_monitor_cpx_partitions_are_sixteen_devices():
    c = amd("monitor_ptv_cpx_partitions_changelog.txt")
    assert len(c.devices) == 16 and vals(c, "n/gpu15", "power_w") == [219.0]
    assert c.unmapped == {"vram_total": 1}


def test_amd_changelog_blocks_throttle_violation_usage_power():
    thr = amd("changelog_L0034_amd_smi_metric_throttle.txt")
    assert vals(thr, "n/gpu1", "clock_reasons") == [0.0] and thr.skipped == {"shell_prompt": 1, "elision": 1}
    vio = amd("changelog_L0079_amd_smi_monitor_violation.txt")
    assert len(vio.devices) == 16
    usage = amd("changelog_L0107_amd_smi_metric_usage.txt")      # per-XCP lists skipped, GFX_ACTIVITY read
    assert vals(usage, "n/gpu1", "gpu_util") == [0.0]
    power = amd("changelog_L1635_amd_smi_metric_p_json.txt")
    assert vals(power, "n/gpu0", "power_w") == [10.0]


def test_amd_metric_csv_names_of_rocm6_and_per_xcd_clocks():
    # Defect 5: gfx_activity, umc_activity, gfx_N_clk, mem_0_clk were silently dropped (only power landed).
    header = text("amd_smi", "metric_csv_watch_header_mi355x_amdsmi26.csv").strip()     # the real header
    row = "1767225600,0,95,80,N/A,\"['N/A', 'N/A']\",\"['N/A', 'N/A']\",\"[95, 94]\",\"[0, 0]\",\"[0, 0]\",700,N/A,N/A,N/A,N/A,ENABLED,2100,1300,N/A,78,60"
    c = amdsmi.parse(header + "\n" + row + "\n", "m.csv", node="n")
    d = "n/gpu0"
    assert vals(c, d, "gpu_util") == [0.95] and vals(c, d, "mem_copy_util") == [0.8]
    assert vals(c, d, "sm_clock_mhz") == [2100.0] and vals(c, d, "mem_clock_mhz") == [1300.0]
    assert vals(c, d, "gpu_temp_c") == [78.0] and vals(c, d, "mem_temp_c") == [60.0]   # "mem" is a temperature here
    assert vals(c, d, "power_w") == [700.0]
    assert {"gfx_busy_inst_xcp_0", "edge"} <= set(c.unmapped)
    assert "throttle_status" not in c.unmapped and "clock_reasons" not in c.series[d]   # read; N/A here: unknown
    # several XCD clocks (MI300: gfx_0_clk .. gfx_7_clk): the mean of the readable ones
    xcd = amdsmi.parse("gpu,gfx_0_clk,gfx_1_clk,gfx_2_clk,gfx_3_clk\n0,2100,2090,N/A,2110\n", "x.csv", start=T0,
                       interval=1.0, node="n")
    assert vals(xcd, d, "sm_clock_mhz") == [2100.0]


def test_amd_ecc_blocks_are_summed_for_the_drift_agent():
    # the shape of `amd-smi metric --json` ECC blocks (no real capture found; counts may be strings)
    doc = json.dumps([{"gpu": 0, "ecc_blocks": {"UMC": {"correctable_count": "3", "uncorrectable_count": 0,
                                                        "deferred_count": 0},
                                                "SDMA": {"correctable_count": 1, "uncorrectable_count": 1,
                                                         "deferred_count": 0}}}])
    c = amdsmi.parse(doc, "ecc.json", start=T0, interval=1.0, node="n")
    assert vals(c, "n/gpu0", "ecc_sbe_aggregate") == [4.0] and vals(c, "n/gpu0", "ecc_dbe_aggregate") == [1.0]


def test_amd_monitor_q_with_its_process_table_rocm620():
    # Defect 5: `amd-smi monitor -q` (with its appended process table) was refused.
    c = amd("monitor_q_process_table_rocm620_changelog.txt")
    assert vals(c, "n/gpu0", "power_w") == [199.0] and vals(c, "n/gpu0", "gpu_temp_c") == [103.0]
    assert vals(c, "n/gpu0", "gpu_util") == [0.99] and vals(c, "n/gpu0", "fb_used_mib") == [1235.0]
    assert vals(c, "n/gpu0", "compute_procs") == [1.0]                  # rvs, PID 1564865
    assert c.skipped == {"shell_prompt": 1, "not_a_table_row": 1, "process_table": 1}   # "PROCESS INFO:" line
    # a second GPU with no process row has 0 processes, not "unknown"
    raw = text("amd_smi", "monitor_q_process_table_rocm620_changelog.txt").splitlines()
    two = amdsmi.parse("\n".join(raw[:3] + [raw[2].replace("  0  199 W", "  1  120 W", 1)] + raw[3:]), "q.txt",
                       start=T0, interval=1.0, node="n")
    assert vals(two, "n/gpu1", "compute_procs") == [0.0] and vals(two, "n/gpu0", "compute_procs") == [1.0]


# --- dcgmi stats -------------------------------------------------------------------------------------------------

def test_dcgmi_stats_verbose_one_gpu_uberprof():
    from ledger.capture.sources import dcgm

    rep = dcgm.parse_stats(text("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt"))
    assert rep.job_id == "232" and rep.verbose
    (gpu,) = rep.blocks
    assert gpu.gpu_id == 0 and gpu.values["execution_time_s"] == 47.57
    assert gpu.missing["slowdown_reliability_pct"] == "not_supported"


def test_dcgmi_stats_summary_on_mig_a100():
    from ledger.capture.sources import dcgm

    rep = dcgm.parse_stats(text("dcgmi_stats", "dcgmi_stats_j_summary_mig_a100_dcgm_issue93.txt"))
    assert rep.job_id == "952404" and not rep.verbose
    assert rep.blocks[0].values["execution_time_s"] == 6391.9
    assert rep.blocks[0].missing["energy_j"] == "not_specified"


def test_dcgmi_stats_file_with_two_jobs_is_split_by_job():
    # Defect 6a: two reports in one file were merged under the first job id.
    from ledger.capture.sources import dcgm

    both = (text("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt") + "\n"
            + text("dcgmi_stats", "dcgmi_stats_j_summary_mig_a100_dcgm_issue93.txt"))
    reps = dcgm.parse_stats_reports(both)
    assert [(r.job_id, len(r.blocks), r.blocks[0].gpu_id) for r in reps] == [("232", 1, 0), ("952404", 1, None)]
    with pytest.raises(dcgm.DcgmParseError, match=r"2 job reports \(232, 952404\)"):
        dcgm.parse_stats(both)


def test_dcgmi_stats_table_without_its_header_line_is_refused_truthfully():
    # Defect 6b: the error message was a data row ("| Single Bit ECC Errors | 0 |").
    from ledger.capture.sources import dcgm

    headless = "\n".join(ln for ln in text("dcgmi_stats", "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt").splitlines()
                         if "Successfully retrieved" not in ln)
    with pytest.raises(dcgm.DcgmParseError, match=r"without its 'Successfully retrieved statistics for job") as exc:
        dcgm.parse_stats(headless)
    assert "|" not in str(exc.value)
    assert dcgm.parse_stats("Error: Unable to get job statistics. Return: No data is available.\n").cause == "no_data"


# --- nvidia-smi CSV and -L ----------------------------------------------------------------------------------------

def test_nvidia_smi_csv_one_line_from_kubectl_exec():
    c = nvidia_smi.read(R / "nvidia_smi_csv" / "nvidia_smi_query_gpu_csv_1line_h100_aicr.txt", start=T0,
                        interval=1.0, node="n")
    (d,) = c.devices
    assert vals(c, d, "gpu_util") == [1.0] and vals(c, d, "power_w") == [290.28] and vals(c, d, "mem_copy_util") == [0.0]


def test_nvidia_smi_list_of_h100_with_a_mig_device():
    from ledger.capture.sources import nvml

    gpus = nvml.parse_list(text("nvidia_smi_csv", "nvidia_smi_L_4xh100_mig_dcgm_issue229.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3] and gpus[3].uuid == "GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874"
    migs = nvml.parse_mig_list(text("nvidia_smi_csv", "nvidia_smi_L_4xh100_mig_dcgm_issue229.txt"))
    assert [(m.parent_uuid, m.profile, m.device, m.uuid) for m in migs] == [
        ("GPU-5ea04b20-4cc3-4d84-0bb2-e4143be8e874", "2g.20gb", 0, "MIG-55d07ceb-ef71-58e0-87c2-0477d96fa03f")]


# --- prometheus docs matrix, scrapes of several exporter generations ----------------------------------------------

def test_dcgm_exporter_scrapes_of_several_generations():
    t4 = prometheus.read(R / "dcgm_exporter" / "metrics_scrape_t4_prof_pod_labels_dcgm_issue191.prom", default_ts=T0)
    assert len(t4.devices) == 2 and vals(t4, "GPU-84412445-5790-0b3f-f714-da8aa3b2c0b0", "sm_occupancy") == [0.0]
    assert [ctx.job_id for _d, ctx in t4.contexts] == ["default/triton-84d57987c9-kks4k"]
    docs = prometheus.read(R / "dcgm_exporter" / "metrics_scrape_readme_quickstart_sentinel_nvidia_docs.prom",
                           default_ts=T0)
    q = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    assert vals(docs, q, "sm_clock_mhz") == [139.0] and docs.reasons[q][(T0, "mem_temp_c")] == "dcgm_blank"
    assert docs.skipped == {"elision": 2}
    v100 = prometheus.parse(text("dcgm_exporter", "v100_no_labels_gpumontools189.prom"), "v.prom", default_ts=T0)
    d = "GPU-08abd178-8a91-05c5-6a52-1ab4a05bcdaf"
    assert vals(v100, d, "sm_clock_mhz") == [1380.0] and vals(v100, d, "energy_j") == [129931554.972]
    assert v100.devices[d].sku is None and "DCGM_FI_PROF_PCIE_TX_BYTES" in v100.unmapped
    empty = prometheus.parse(text("dcgm_exporter", "empty_pod_labels_gpumontools138.prom"), "e.prom", default_ts=T0)
    assert empty.contexts == {}                               # namespace="" pod="": no workload, no tenant
    assert vals(empty, "GPU-6bf47ca9-ad3e-15db-beed-1079a7d74116", "gpu_util") == [0.44]
    a30 = prometheus.parse(text("dcgm_exporter", "a30_mig_1g6gb_issue317.prom"), "a.prom", default_ts=T0)
    assert sorted(a30.devices)[:2] == ["GPU-265c9814-6156-355b-e589-ff2064894f16/gi3",
                                       "GPU-265c9814-6156-355b-e589-ff2064894f16/gi4"]
    assert {i.mig_profile for i in a30.devices.values()} == {"1g.6gb"}
    h100 = prometheus.parse(text("dcgm_exporter", "h100_mig_1g10gb_pods_issue512.prom"), "h.prom", default_ts=T0)
    assert sorted(ctx.job_id for _d, ctx in h100.contexts) == [
        "model-playground-stg/text-embedding-predictor-00008-deployment-57946f6c67-vdtjl",
        "model-playground-stg/tts-predictor-00011-deployment-5554f75554-8j8pl"]
    doc = prometheus.read(R / "prometheus" / "api_v1_query_range_matrix_format_prometheus_docs.json")
    assert doc.points == 0 and doc.unmapped                   # the docs' example metric is not a GPU metric


def test_import_json_report_names_mapped_unmapped_skipped_and_warnings(runner, cli, tmp_path, sqlite_url):
    src = tmp_path / "scrape.prom"
    src.write_text("Handling connection for 9400\n" + text("dcgm_exporter", "v100_no_labels_gpumontools189.prom")
                   .replace("} 1380", "} 13x0"), encoding="utf-8")
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--at", str(T0), "--json",
                            "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["skipped_lines"] == {"kubectl_port_forward": 1}
    assert out["mapped_fields"]["DCGM_FI_DEV_POWER_USAGE"] == "power_w"
    assert out["unmapped_fields"]["DCGM_FI_PROF_PCIE_RX_BYTES"] == 1
    assert out["missing"]["sm_clock_mhz"] == {"unreadable": 1}
    assert any("not a number: '13x0'" in w for w in out["warnings"])


def test_docs_quirk_and_identity_tables_name_tests_that_exist():
    import re

    doc = (Path(__file__).parent.parent / "docs" / "telemetry.md").read_text(encoding="utf-8")
    here = Path(__file__).read_text(encoding="utf-8") + (Path(__file__).parent / "test_capture_sets.py").read_text(
        encoding="utf-8")
    quirks = doc[doc.index("### 5.4"):doc.index("## 6.")]
    named = set(re.findall(r"`(test_[a-z0-9_]+?)(?:_…)?`", quirks))
    assert len(named) >= 25
    for name in named:
        assert re.search(rf"def {name}\w*\(", here), name
    identity = doc[doc.index("### 5.2"):doc.index("### 5.3")]
    rows = [ln for ln in identity.splitlines() if ln.startswith("| `") or ln.startswith("| `EXP`")]
    assert len(rows) == len(IDENTITY_TABLE)


def test_dmon_mig_capture_of_the_dcgm_user_guide_old_header_and_gpu_instances():
    c = dmon.read(R / "dcgmi_dmon" / "dmon_mig_a100_2x3g_gract_tenso_dcgm_userguide.txt", start=T0, interval=1.0,
                  node="n")
    assert sorted(c.devices) == ["n/gpu-i0", "n/gpu-i1", "n/gpu0"]        # "# Entity" with a space, "Id"
    assert c.devices["n/gpu0"].partitioned and c.devices["n/gpu-i1"].mig_instance == "1"
    assert vals(c, "n/gpu0", GRACT)[3] == 0.845 and vals(c, "n/gpu-i0", GRACT)[3] == 0.986
    assert len(vals(c, "n/gpu-i1", "tensor_active")) == 10
    assert any("does not name MIG profiles" in w for w in c.warnings)


def test_dmon_mig_capture_root_prompt_and_indented_header():
    c = dmon.read(R / "dcgmi_dmon" / "dmon_mig_gract_smact_zhihu.txt", start=T0, interval=1.0, node="n")
    assert vals(c, "n/gpu-i1", "sm_active") == [0.75] and vals(c, "n/gpu-i1", "dram_active") == [0.8]
    assert vals(c, "n/gpu0", "sm_occupancy") == [0.364] and c.skipped == {"shell_prompt": 1}


def test_nvidia_smi_noheader_loop_is_refused_truthfully():
    with pytest.raises(InputError, match=r"line 1: no header line \(run nvidia-smi without 'noheader'\)"):
        nvidia_smi.read(R / "nvidia_smi_csv" / "gpu_usage_noheader_a100_driver545_omniopt.csv")
    header = ("timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, "
              "temperature.gpu, utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], "
              "memory.used [MiB]\n")
    c = nvidia_smi.parse(header + text("nvidia_smi_csv", "gpu_usage_noheader_a100_driver545_omniopt.csv"), "g.csv",
                         node="slurm-n1")
    assert sorted(c.devices) == ["slurm-n1/00000000:0B:00.0", "slurm-n1/00000000:3B:00.0", "slurm-n1/00000000:8B:00.0"]
    assert c.devices["slurm-n1/00000000:3B:00.0"].sku == "NVIDIA A100-SXM4-40GB"   # no index/uuid: the bus id
    assert vals(c, "slurm-n1/00000000:8B:00.0", "fb_used_mib") == [4.0]


def test_one_scrape_of_a_partitioned_a100_bills_the_slice_not_the_gpu(runner, cli, tmp_path, sqlite_url):
    # Defect 4: parent and 1g.5gb instance bound as whole GPUs in one run (0.0167 GPU-hours for one 30 s scrape).
    base = 'gpu="0",UUID="%s",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",Hostname="n1",' % PARENT
    pod = 'container="c",namespace="ml",pod="p"'
    src = tmp_path / "one.prom"
    src.write_text(f"DCGM_FI_DEV_POWER_USAGE{{{base}{pod}}} 250.5\n"
                   f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{base}GPU_I_PROFILE="1g.5gb",GPU_I_ID="7",{pod}}} 0.9\n',
                   encoding="utf-8")
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--at", str(T0), "--json",
                            "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    runs = _runs(sqlite_url)
    assert runs["ml/p"]["devices"] == {f"{PARENT}/gi7"}
    rc = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "ml/p", "--cluster", "pathb", "--format",
                                        "json"], env=ENV).output)
    assert rc["gpu_hours"]["paid"] == pytest.approx(30 / 3600)               # one slice, one 30 s scrape
    assert rc["devices"][0]["mig"]["share"] == "1/7"


def test_path_b_hpc_job_runs_carry_the_namespace_as_account(runner, cli, tmp_path, sqlite_url):
    # Issue 16 depends on it: imported runs of Slurm jobs must carry the tenant.
    base = 'gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3",Hostname="n1",'
    src = tmp_path / "hpc.prom"
    src.write_text(f'DCGM_FI_DEV_GPU_UTIL{{{base}hpc_job="4242",{EXP},exported_namespace="physics",'
                   f'exported_pod="slurm-4242",exported_container="c"}} 77\n', encoding="utf-8")
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--at", str(T0), "--quiet",
                            "--tenant", "physics=dept-physics"], env=ENV)
    assert r.exit_code == 0, r.output
    runs = _runs(sqlite_url)
    assert list(runs) == ["4242"] and runs["4242"]["account"] == "dept-physics" and runs["4242"]["basis"] == "slurm"


def test_xml_tesla_t4_driver515_power_readings_and_throttle_reasons_of_schema_v11():
    c = nvidia_smi.read(R / "nvidia_smi_xml" / "tesla_t4_driver515.xml")
    d = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert c.devices[d].sku == "Tesla T4" and not c.devices[d].partitioned
    assert vals(c, d, "power_w") == [26.78] and vals(c, d, "sm_clock_mhz") == [585.0]
    assert vals(c, d, "fb_used_mib") == [1032.0] and vals(c, d, "clock_reasons") == [0.0]
    assert vals(c, d, "mem_temp_c") == [None] and "compute_procs" not in c.series[d]   # no <processes> element


def test_nvml_mig_devices_map_like_dcgm_exporter_and_nvidia_smi():
    """NVML's MIG enumeration (a stand-in following pynvml's API) gives the same instance keys and profiles."""
    from types import SimpleNamespace

    from ledger.capture.sources import nvml

    class NVMLError(Exception):
        pass

    parent = SimpleNamespace(uuid=PARENT, mig=(1, 1), slots={0: ("MIG-a", 1, 3, 40192), 2: ("MIG-b", 13, 1, 9856)})
    plain = SimpleNamespace(uuid="GPU-plain", mig=None, slots={})
    fake = SimpleNamespace(
        NVMLError=NVMLError, NVML_DEVICE_MIG_ENABLE=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: (parent, plain)[i],
        nvmlDeviceGetMigMode=lambda h: h.mig if h.mig else (_ for _ in ()).throw(NVMLError("Not Supported")),
        nvmlDeviceGetUUID=lambda h: h.uuid.encode() if hasattr(h, "uuid") else h[0],
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=lambda h, k: h.slots[k] if k in h.slots else (_ for _ in ()).throw(
            NVMLError("Not Found")),
        nvmlDeviceGetGpuInstanceId=lambda m: m[1],
        nvmlDeviceGetAttributes=lambda m: SimpleNamespace(gpuInstanceSliceCount=m[2], memorySizeMB=m[3]))
    migs = nvml.nvml_mig_devices(fake)
    assert [(m.parent_uuid, m.gpu_instance, m.profile, m.uuid) for m in migs] == [
        (PARENT, 1, "3g.40gb", "MIG-a"), (PARENT, 13, "1g.10gb", "MIG-b")]
    from ledger.method.mig import mig_share

    assert [str(mig_share(m.profile, "NVIDIA A100-SXM4-80GB")) for m in migs] == ["3/7", "1/7"]


def test_a_contract_may_price_a_mig_profile_directly(runner, cli, tmp_path, sqlite_url):
    src = tmp_path / "mig.om"
    _mig_node_export(src, hours=0.5)
    assert runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--quiet"], env=ENV).exit_code == 0
    contract = tmp_path / "c.toml"
    contract.write_text('id = "mig"\neffective_from = 2000-01-01\nversion = "2"\n[skus.A100-SXM4-80GB]\n'
                        'rate_per_gpu_hour = "7.00"\n'
                        '[skus."A100-SXM4-80GB/1g.10gb"]\nrate_per_gpu_hour = "1.50"\n', encoding="utf-8")
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(contract)], env=ENV)
    assert r.exit_code == 0, r.output
    one = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "team-a/notebook-1g", "--cluster", "pathb",
                                         "--format", "json"], env=ENV).output)
    (dev,) = one["devices"]
    assert dev["rate"] == "1.50" and dev["mig"]["priced_as"] == "contract profile"
    three = json.loads(runner.invoke(cli, ["--db", sqlite_url, "receipt", "team-a/train-3g", "--cluster", "pathb",
                                           "--format", "json"], env=ENV).output)
    assert three["devices"][0]["rate"] == "3.000000000000" and three["devices"][0]["mig"]["share"] == "3/7"


def test_query_response_saved_behind_kubectl_port_forward_reads_from_a_file(tmp_path):
    src = tmp_path / "q.json"
    src.write_text("Forwarding from 127.0.0.1:9090 -> 9090\nHandling connection for 9090\n"
                   + text("prometheus", "query_vector_multi_namespace_gpu_operator.json"), encoding="utf-8")
    c = prometheus.read(src)
    assert c.skipped == {"kubectl_port_forward": 2} and len(c.devices) == 6


def test_path_b_real_2x8_h100_response_bills_the_workload_namespace_never_the_exporters(
        runner, cli, sqlite_url):
    # Defect 3 on the whole real response it was found on: 15 idle GPUs labelled only with the exporter pods'
    # own namespace/pod/container (gpu-operator) and one GPU held by a pod of namespace dynamo-workload.
    src = R / "prometheus" / "query_vector_h100_2x8_gpu_util_aicr.json"
    doc = json.loads(src.read_text(encoding="utf-8"))["data"]["result"]
    assert {s["metric"]["namespace"] for s in doc} == {"gpu-operator", "dynamo-workload"}
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["devices"] == 16
    assert {d["node"] for d in report["per_device"].values()} == {"gpu-node-1", "gpu-node-2"}
    runs = _runs(sqlite_url)
    assert list(runs) == ["dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5"]
    run = runs["dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5"]
    assert run["tenant"] == run["account"] == "dynamo-workload"
    assert run["labels"] == {"container": "main"} and run["nodes"] == ["gpu-node-1"]
    assert run["devices"] == {"GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"}
    held = {k: v for k, v in run.items() if k != "devices"}
    assert "gpu-operator" not in json.dumps(held) and "dcgm-exporter" not in json.dumps(held)


def test_path_b_real_mps_scrape_two_namespaces_on_one_gpu_gives_one_run_each_and_warns(runner, cli, sqlite_url):
    # A real multi-namespace capture: two pods of two namespaces share one A100 (MPS, dcgm-exporter's vgpu label).
    # Each namespace gets its run; the shared GPU is bound to both, which the import report says in a warning.
    src = R / "dcgm_exporter" / "a100_mps_two_namespaces_pr432.prom"
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--at", "2025-08-15T00:00:00Z",
                            "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    gpu = "GPU-3bc239e1-4cc8-97e4-e817-5a36dfd2885e"
    assert report["devices"] == 1 and report["mapped_fields"] == {"DCGM_FI_DEV_FB_USED": "fb_used_mib"}
    runs = _runs(sqlite_url)
    assert {j: (v["tenant"], v["labels"]["container"]) for j, v in runs.items()} == {
        "default/gpu-burn-deployment-1-85dc8ff699-clvh5": ("default", "gpu-burn-container-1"),
        "vllm-inference/vllm-medgemma-4b-it-d599b4c99-f95nk": ("vllm-inference", "vllm")}
    assert all(v["devices"] == {gpu} for v in runs.values())
    assert [w for w in report["warnings"] if w.startswith(gpu)] == [
        f"{gpu}: held by 2 workloads at once (default/gpu-burn-deployment-1-85dc8ff699-clvh5, "
        "vllm-inference/vllm-medgemma-4b-it-d599b4c99-f95nk; time-slicing or MPS); "
        "each run pays an equal share (1/2) of the GPU (ledger.method.shares)"]
    for job in runs:   # each receipt names the physical GPU and pays half of it
        r = runner.invoke(cli, ["--db", sqlite_url, "receipt", job, "--format", "json"], env=ENV)
        assert r.exit_code == 0, r.output
        (line,) = json.loads(r.output)["devices"]
        assert line["uuid"] == gpu and line["share"]["rule"] == "equal" and line["share"]["ratio"] == "1/2"
        assert round(line["gpu_hours"]["paid"] * 1e9) == round(line["share"]["device_paid_gpu_hours"] * 1e9) // 2


# --- energy counters: one real capture per source (issue 34) -------------------------------------------------------

def _energy(c, device, start, end):
    from ledger.telemetry.energy import device_energy_of

    return device_energy_of(device, c.series[device], start, end)


def test_dmon_power_and_energy_counter_of_two_gpus_itu_hpc():
    # dcgmi dmon -e 155,156,...: TOTEC is field 156 in mJ, stored in J; GPU 1 is listed first in every tick
    c = dmon.read(R / "dcgmi_dmon" / "dmon_e155_156_power_totec_2gpu_itu_hpc.txt", start=T0, interval=1.0, node="n")
    assert sorted(c.devices) == ["n/gpu0", "n/gpu1"] and c.mapped["TOTEC"] == "energy_j"
    assert c.mapped["POWER"] == "power_w" and c.skipped == {} and c.warnings == []
    g0, g1 = vals(c, "n/gpu0", "energy_j"), vals(c, "n/gpu1", "energy_j")
    assert len(g0) == len(g1) == 17                           # 15 ticks, the repeated header, 2 more
    assert g0[0] == 22351345.411 and g0[-1] == 22352180.494 and g1[0] == 20848390.074
    assert vals(c, "n/gpu0", "power_w")[:3] == [28.696, 33.653, 56.167]
    assert round(g0[-1] - g0[0], 3) == 835.083 and round(g1[-1] - g1[0], 3) == 419.28   # the counters' rise, J
    # one tick on each GPU repeats its reading while power reads 56 W / 27 W: that span is priced by the power
    # integral and says so; every other span is the counter's own delta
    e0 = _energy(c, "n/gpu0", T0, T0 + 16)
    odd = [(s.start - T0, s.end - T0, s.source, s.cause, round(s.joules, 4)) for s in e0.spans if s.source != "counter"]
    assert odd == [(12.0, 13.0, "power_integral", "frozen_counter", 56.6385)]       # (56.834 + 56.443) / 2
    assert e0.source == "mixed" and e0.unknown_seconds == 0
    assert abs(e0.joules - (835.083 + 56.6385)) < 1e-6
    e1 = _energy(c, "n/gpu1", T0, T0 + 16)
    assert [(s.start - T0, s.cause) for s in e1.spans if s.source != "counter"] == [(10.0, "frozen_counter")]
    assert abs(e1.joules - (419.28 + 27.493)) < 1e-6


def test_dmon_energy_capture_imported_prices_its_measured_kwh(runner, cli, tmp_path, sqlite_url):
    # the same capture through `ipledger import dmon`: the run's receipt under measured terms reports the kWh the
    # counters (and the one power-priced tick per GPU) give over the run's window
    src = R / "dcgmi_dmon" / "dmon_e155_156_power_totec_2gpu_itu_hpc.txt"
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "dmon", str(src), "--start", str(T0), "--interval", "1s",
                            "--node", "itu", "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mapped_fields"]["TOTEC"] == "energy_j"
    terms = tmp_path / "c.toml"
    terms.write_text('id = "e"\nversion = "1"\ncurrency = "EUR"\neffective_from = "2020-01-01"\n[skus.default]\n'
                     'rate_per_gpu_hour = "2.00"\nenergy_price_per_kwh = "0.25"\npue = 1.2\n'
                     'energy_basis = "measured"\n', encoding="utf-8")
    assert runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(terms)], env=ENV).exit_code == 0
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "node:itu", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    body = json.loads(r.output)
    joules = (835.083 + 56.6385) + (419.28 + 27.493)         # the two devices of the test above, ticks 0..16
    assert body["energy"]["kwh"] == round(joules / 3.6e6, 6) and body["energy"]["source"] == "mixed"
    # the window runs one interval past the last tick, where neither counter nor power was read: unknown, not 0
    assert body["energy"]["unknown_gpu_hours"] == round(2 / 3600, 6)


def test_exporter_4x_scrape_of_an_l4_with_pci_bus_id_and_driver_labels():
    c = prometheus.read(R / "dcgm_exporter" / "l4_exporter4x_pci_bus_id_driver580_kops_conformance.prom", default_ts=T0)
    d = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    info = c.devices[d]
    assert (info.sku, info.node, info.pci_bus_id, info.driver) == ("NVIDIA L4", "i-030791dc5a37cd257",
                                                                   "00000000:31:00.0", "580.105.08")
    assert vals(c, d, "energy_j") == [4742.776] and vals(c, d, "power_w") == [16.365]     # field 156: mJ -> J
    assert c.reasons[d][(T0, "mem_temp_c")] == "zero_unsupported" and vals(c, d, GRACT) == [0.0]
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" in c.unmapped and c.warnings == []
    # one scrape is one counter reading: no energy over the scrape's interval, and it says so (never 0 J)
    e = _energy(c, d, T0 - 30, T0)
    assert e.joules == 0 and e.unknown_seconds == 30 and e.source == "unknown"


def test_amd_metric_energy_text_of_two_gpus_ten_seconds_apart_rocm630():
    c = amdsmi.read(R / "amd_smi" / "metric_energy_text_2gpu_rocm630_amdsmi38.txt", start=T0, interval=10.0,
                    node="n")
    assert sorted(c.devices) == ["n/gpu0", "n/gpu1"] and c.skipped == {} and c.unmapped == {}
    assert vals(c, "n/gpu0", "energy_j") == [1.004, 1.01] and vals(c, "n/gpu1", "energy_j") == [0.906, 0.912]
    # the accumulator too slow by orders of magnitude (ROCm/amdsmi#38): with no power in the output nothing can
    # tell it from an idle GPU, so the counter's own 0.006 J is what the span holds
    for dev in c.devices:
        e = _energy(c, dev, T0, T0 + 10)
        assert e.source == "counter" and abs(e.joules - 0.006) < 1e-9


def test_amd_metric_pE_frozen_counter_is_replaced_by_the_power_integral():
    c = amd("metric_pE_text_frozen_counter_mi100_amdsmi38.txt")
    assert c.skipped == {"elision": 2} and sorted(c.devices) == ["n/gpu0"]
    assert vals(c, "n/gpu0", "energy_j") == [16.43, 16.43] and vals(c, "n/gpu0", "power_w") == [35.0, 35.0]
    e = _energy(c, "n/gpu0", T0, T0 + 1)
    assert [(s.source, s.cause, s.joules) for s in e.spans] == [("power_integral", "frozen_counter", 35.0)]


def test_rocm_smi_energy_counter_is_refused_and_agrees_with_amd_smi():
    import re

    import numpy as np

    src = R / "amd_smi" / "rocm_smi_showenergycount_2gpu_rocm630_amdsmi38.txt"
    with pytest.raises(InputError, match=r"line 1: not amd-smi metric/monitor output"):
        amdsmi.read(src, start=T0, interval=10.0, node="n")
    # the fallback's figures: Accumulated Energy (uJ) = Energy counter x the counter resolution (15.3 uJ as the
    # library's float32, rocm-smi rounds to 0.01 uJ), and equal to what amd-smi printed for the same GPUs then
    got = re.findall(r"GPU\[(\d)\]\s+: Energy counter: (\d+)\nGPU\[\d\]\s+: Accumulated Energy \(uJ\): ([\d.]+)",
                     src.read_text(encoding="utf-8"))
    amd_j = {"0": [1.004, 1.01], "1": [0.906, 0.912]}
    assert len(got) == 4
    for gpu, count, uj in got:
        assert round(int(count) * float(np.float32(15.3)), 2) == float(uj)
        assert round(float(uj) / 1e6, 3) in amd_j[gpu]


def test_exporter_mig_slices_each_carry_the_whole_gpus_power_and_energy_counter():
    # dcgm-exporter prints field 155/156 once per GPU instance with the parent's reading (issue 317's A30 node):
    # the slice devices' energy_j is the physical GPU's counter, not a share of it
    c = prometheus.read(R / "dcgm_exporter" / "a30_mig_power_energy_per_slice_issue317.prom", default_ts=T0)
    gpu0 = "GPU-265c9814-6156-355b-e589-ff2064894f16"
    assert sorted(c.devices)[:4] == [f"{gpu0}/gi{g}" for g in (3, 4, 5, 6)]
    energy = {g: vals(c, f"{gpu0}/gi{g}", "energy_j") for g in (3, 4, 5, 6)}
    assert energy == {3: [126272101.025], 4: [126272101.025], 5: [126272106.318], 6: [126272101.025]}
    assert [vals(c, f"{gpu0}/gi{g}", "power_w") for g in (3, 4, 5, 6)] == [[52.636], [52.636], [52.746], [52.746]]
    gpu1 = "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49"
    assert vals(c, f"{gpu1}/gi3", "energy_j") == [134473486.744] and "energy_j" not in c.series[f"{gpu1}/gi4"]
    assert c.warnings == [] and c.unmapped == {}


def test_amd_metric_pE_of_rocm602_reads_current_power_beside_the_frozen_counter():
    # amd-smi 6.0 text: sections in column 0 and power as CURRENT_POWER (dropped silently before, so a frozen
    # counter had no power beside it to be found out by); the same 131.426 J on four MI100s (ROCm/amdsmi#22)
    c = amd("metric_pE_text_rocm602_4x_mi100_same_energy_amdsmi22.txt")
    assert sorted(c.devices) == [f"n/gpu{g}" for g in range(4)] and c.skipped == {} and c.warnings == []
    assert [vals(c, f"n/gpu{g}", "power_w") for g in range(4)] == [[33.0], [34.0], [34.0], [34.0]]
    assert {vals(c, f"n/gpu{g}", "energy_j")[0] for g in range(4)} == {131.426}
    assert vals(c, "n/gpu0", "clock_reasons") == [0.0]                 # THROTTLE_STATUS: UNTHROTTLED
    # two refreshes of this screen (the reporter: the numbers "never change") are a frozen counter under 33 W
    two = amdsmi.parse(text("amd_smi", "metric_pE_text_rocm602_4x_mi100_same_energy_amdsmi22.txt") * 2, "w.txt",
                       start=T0, interval=0.1, node="n")
    e = _energy(two, "n/gpu0", T0, T0 + 0.1)
    assert [(s.source, s.cause) for s in e.spans] == [("power_integral", "frozen_counter")]
    assert abs(e.joules - 3.3) < 1e-5           # 33 W x 0.1 s (epoch-second floats hold 0.1 s to ~1e-7)
