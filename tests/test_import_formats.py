"""Importer details: dcgm-exporter label sets across versions, counter resets and truncated exports through the
pipeline, nvidia-smi / amd-smi loop forms, and a receipt computed from imported imported data."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from ledger.chain import db as db_mod
from ledger.chain.entries import Kind
from ledger.importers import amdsmi, nvidia_smi, pipeline, prometheus, synth
from ledger.importers.common import InputError
from ledger.chain.store import iter_entries
from ledger.telemetry.sealed import load_samples

T0 = synth.DEFAULT_START


def _om(lines):
    return "\n".join(lines) + "\n# EOF\n"


def test_label_sets_across_exporter_versions():
    text = _om([
        # 3.x: Hostname, no pci_bus_id, legacy k8s labels
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",device="nvidia0",modelName="A100",Hostname="h1",'
        f'pod_namespace="ns1",pod_name="p1",container_name="c"}} 50 {T0:.0f}',
        # 4.x (after #655): lowercase hostname, pci_bus_id, driver label, hpc_job
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-b",pci_bus_id="00000000:19:00.0",device="nvidia1",'
        f'modelName="H100",hostname="h2",DCGM_FI_DRIVER_VERSION="550.54.15",hpc_job="4242"}} 75 {T0:.0f}',
        # MIG instance: parent UUID + GPU_I_ID / GPU_I_PROFILE
        f'DCGM_FI_PROF_SM_ACTIVE{{gpu="2",UUID="GPU-c",device="nvidia2",modelName="A100",Hostname="h1",'
        f'GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"}} 0.25 {T0:.0f}',
        # no UUID: keyed by the instance
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",instance="10.0.0.5:9400"}} 123.5 {T0:.0f}',
    ])
    c = prometheus.parse(text, "labels.om")
    a, b, mig, noid = (c.devices[k] for k in ("GPU-a", "GPU-b", "GPU-c/gi7", "10.0.0.5:9400/gpu0"))
    assert (a.node, a.sku, a.index) == ("h1", "A100", 0)
    assert (b.node, b.pci_bus_id, b.driver) == ("h2", "00000000:19:00.0", "550.54.15")
    assert (mig.uuid, mig.mig_profile, mig.mig_instance) == ("GPU-c", "1g.10gb", "7")
    assert noid.node == "10.0.0.5"
    ctx = {d: (x.kind, x.job_id, x.tenant) for (d, x) in c.contexts}
    assert ctx == {"GPU-a": ("k8s", "ns1/p1", "ns1"), "GPU-b": ("slurm", "4242", None)}


def test_mig_device_bound_uuid_is_the_sample_key(sqlite_url):
    text = _om([f'DCGM_FI_PROF_SM_ACTIVE{{gpu="0",UUID="GPU-c",GPU_I_ID="3",Hostname="h",hpc_job="9"}} 0.5 {T0 + 60 * k:.0f}'
                for k in range(5)])
    eng = db_mod.make_engine(sqlite_url)
    pipeline.write(eng, prometheus.parse(text, "mig.om"))
    (bound,) = [ce.entry for ce in iter_entries(eng, kinds=[Kind.DEVICE_BOUND])]
    assert bound.data["uuid"] == "GPU-c/gi3" and bound.data["gpu_uuid"] == "GPU-c"
    assert len(load_samples(eng, [bound.data["uuid"]])) == 5
    eng.dispose()


def test_counter_reset_and_truncated_export_become_unknown_intervals(sqlite_url):
    energy = [10_000_000, 10_600_000, 100, 600_100, 1_200_100]     # mJ; driver reload after the 2nd sample
    text = _om([f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-e",Hostname="h"}} {v} {T0 + 60 * k:.0f}'
                for k, v in enumerate(energy)])
    eng = db_mod.make_engine(sqlite_url)
    res = pipeline.write(eng, prometheus.parse(text, "e.om"),
                         pipeline.ImportOptions(span=(T0, T0 + 3600), synthetic_runs=False))
    gaps = sorted((ce.entry for ce in iter_entries(eng, kinds=[Kind.UNKNOWN_INTERVAL])), key=lambda e: e.ts)
    assert res.counter_resets == 1 and res.unknown_intervals == 1
    reset, trunc = gaps
    assert reset.data["cause"] == "counter_reset" and reset.data["field"] == "energy_j"
    assert (reset.data["before"], reset.data["after"]) == (10_600.0, 0.1)
    assert trunc.data["cause"] == "export_truncated" and trunc.data["scope"] == "device"
    assert [s.energy_j for s in load_samples(eng, ["GPU-e"])] == [10_000.0, 10_600.0, 0.1, 600.1, 1200.1]
    eng.dispose()


def test_nvidia_smi_csv_loop_with_timestamps_and_repeated_header():
    hdr = "timestamp, index, uuid, name, utilization.gpu [%], power.draw [W], clocks.sm [MHz], " \
          "clocks_event_reasons.active, temperature.memory"
    rows = [hdr,
            "2026/01/01 00:00:00.000, 0, GPU-x, NVIDIA H100, 97 %, 650.12 W, 1980 MHz, 0x0000000000000000, [N/A]",
            "2026/01/01 00:00:00.000, 1, GPU-y, NVIDIA H100, 0 %, 70.00 W, 345 MHz, 0x0000000000000001, 41",
            hdr,
            "2026/01/01 00:00:01.000, 0, GPU-x, NVIDIA H100, 95 %, 640.00 W, 1755 MHz, 0x0000000000000004, [N/A]"]
    c = nvidia_smi.parse("\n".join(rows), "smi.csv", node="n1")
    assert sorted(c.devices) == ["GPU-x", "GPU-y"] and c.devices["GPU-x"].sku == "NVIDIA H100"
    ts, vs = c.series["GPU-x"]["clock_reasons"]
    assert list(ts) == [T0, T0 + 1] and list(vs) == [0.0, 4.0]
    assert list(c.series["GPU-x"]["gpu_util"][1]) == [0.97, 0.95]
    assert c.reasons["GPU-x"][(T0, "mem_temp_c")] == "not_available"
    # an unreadable value is missing with its cause and a warning naming the place, never zero, never fatal
    bad = nvidia_smi.parse(hdr + "\n" + rows[1] + "\n" + rows[2].replace("70.00 W", "lots"), "smi.csv")
    assert bad.reasons["GPU-y"][(T0, "power_w")] == "unreadable"
    assert any("smi.csv: line 3 column power.draw: power_w: not a number: 'lots'" in w for w in bad.warnings)


def test_amd_smi_csv_and_monitor_table_with_units():
    csv_text = ("gpu,power_usage,hotspot_temperature,memory_temperature,gfx_util,gfx_clock,mem_util,vram_used\n"
                "0,512,71,65,88,2100,40,150000\n1,N/A,40,38,0,132,0,512\n"
                "gpu,power_usage,hotspot_temperature,memory_temperature,gfx_util,gfx_clock,mem_util,vram_used\n"
                "0,500,72,66,90,2100,41,150000\n")
    c = amdsmi.parse("# ipledger: start=1767225600 interval_ms=10000 node=mi1\n" + csv_text, "m.csv")
    ts, vs = c.series["mi1/gpu0"]["gpu_util"]
    assert list(ts) == [T0, T0 + 10] and list(vs) == [0.88, 0.9]
    assert c.reasons["mi1/gpu1"][(T0, "power_w")] == "not_available"
    table = ("GPU  POWER  GPU_TEMP  MEM_TEMP  GFX_UTIL  GFX_CLOCK  MEM_UTIL  MEM_CLOCK  VRAM_USED\n"
             "  0  500 W     70 \u00b0C     60 \u00b0C      93 %   2100 MHz      30 %   1300 MHz   1024 MB\n")
    c = amdsmi.parse(table, "mon.txt", start=T0, interval=1.0, node="mi2")
    s = {k: list(v[1]) for k, v in c.series["mi2/gpu0"].items()}
    assert s["power_w"] == [500.0] and s["gpu_temp_c"] == [70.0] and s["gpu_util"] == [0.93]
    assert s["sm_clock_mhz"] == [2100.0] and s["mem_clock_mhz"] == [1300.0] and s["fb_used_mib"] == [1024.0]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), holes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 30)),
                                           max_size=3), seed=st.integers(0, 5))
def test_synth_roundtrip_every_shape_same_values(n, holes, seed):
    kw = dict(n_gpus=n, hours=1, cadence=60, seed=seed, holes=[(g, o * 60, d * 60) for g, o, d in holes],
              metrics=synth.DEFAULT_METRICS[:3])
    expected = {(lab["UUID"], lab["__name__"]): [(t, float(v)) for t, v in pts] for lab, pts in synth.series(**kw)}
    lines = []
    for lab, pts in synth.series(**kw):
        inner = ",".join(f'{k}="{v}"' for k, v in lab.items() if k != "__name__")
        lines += [f'{lab["__name__"]}{{{inner}}} {v} {t:.0f}' for t, v in pts]
    c = prometheus.parse(_om(lines), "x.om")
    from ledger.importers.dcgm_fields import BY_NAME
    for (uuid, metric), pts in expected.items():
        if not pts:
            assert uuid not in c.series or BY_NAME[metric].target not in c.series[uuid]
            continue
        ts, vs = c.series[uuid][BY_NAME[metric].target]
        assert list(zip(ts, vs)) == [(t, v / round(1 / BY_NAME[metric].scale)) for t, v in pts]


def test_receipt_from_imported_telemetry(runner, cli, tmp_path, sqlite_url):
    """Cross-check with the receipts: an hpc_job run imported from Prometheus data gets a receipt whose
    unknown bucket carries the 20-minute hole."""
    synth.write_query_range(tmp_path / "qr", n_gpus=4, hours=2, cadence=60, start=T0, jobs="slurm",
                            holes=[(2, 1800, 1200)])
    env = {"IPLEDGER_CONFIG": ""}
    assert runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(tmp_path / "qr")], env=env).exit_code == 0
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "1000", "--format", "json"], env=env)
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["job"]["cluster"] == "pathb" and len(rec["job"]["devices"]) == 4
    assert rec["gpu_hours"]["paid"] == pytest.approx(8.0, abs=0.1)
    assert rec["gpu_hours"]["unknown"] == pytest.approx(1200 / 3600, abs=0.02)
    (gap,) = rec["unknown_intervals"]
    assert gap["cause"] == "scrape_missing" and gap["device"] == synth.gpu_uuid(0, 2)


_RAW = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.integers(-10, 10**19).map(str),
    st.sampled_from(["9223372036854775794", "2147483632", "2147483635", "140737488355328.0", "NaN", "+Inf", "-Inf",
                     "-0", "95", "100", "0.000001", "1.0000005", "250.5"]),
    st.integers(2147483630, 2147483640),
)


@settings(max_examples=200, deadline=None)
@given(raws=st.lists(_RAW, min_size=1, max_size=30),
       name=st.sampled_from(["gpu_util", "energy_j", "sm_active", "power_w", "mem_temp_c"]),
       scale=st.sampled_from([1.0, 0.01, 0.001]))
def test_vectorised_cleaning_equals_the_per_value_rules(raws, name, scale):
    from ledger.importers.common import Collected

    fast, slow = Collected("x"), Collected("x")
    ts = [T0 + i for i in range(len(raws))]
    assert fast.add_raw_many("d", name, ts, raws, scale) is not None
    for t, r in zip(ts, raws):
        slow.add_raw("d", name, t, r, scale)
    (ft, fv), (st_, sv) = fast.series["d"][name], slow.series["d"][name]
    assert list(ft) == list(st_)
    assert [None if x != x else x for x in fv] == [None if x != x else x for x in sv]
    assert fast.reasons.get("d", {}) == slow.reasons.get("d", {})


_row = st.tuples(st.sampled_from(["GPU-a", "GPU-b", "x,[y", "\u00fc\"q]"]), st.floats(0, 2e9), st.just(15.0),
                 st.sampled_from([None, 0, 4, 0x40]),
                 *[st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)) for _ in range(21)])


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(_row, min_size=1, max_size=25))
def test_segment_digest_one_shot_encoding_equals_row_by_row(rows):
    import hashlib
    import operator

    from ledger.chain.canonical import canonical_json
    from ledger.telemetry import sealed as store

    h = hashlib.sha256()
    for r in sorted(rows, key=operator.itemgetter(0, 1)):
        h.update(canonical_json(list(r)).encode("utf-8"))
        h.update(b"\n")
    assert store.digest_normalised(rows) == h.hexdigest()


def test_amd_smi_csv_with_its_own_timestamp_column_needs_no_start():
    text = ("timestamp,gpu,power_usage,gfx,mem,single_bit_ecc\n"
            "1767225600,0,300,50,10,0\n1767225610,0,310,60,11,0\n")
    c = amdsmi.parse(text, "ts.csv", node="mi")
    ts, vs = c.series["mi/gpu0"]["gpu_util"]
    assert list(ts) == [T0, T0 + 10] and list(vs) == [0.5, 0.6]
    with pytest.raises(InputError, match="ts.csv: line 2 column timestamp"):
        amdsmi.parse(text.replace("1767225600", "yesterday"), "ts.csv", node="mi")


@given(st.lists(st.tuples(st.sampled_from(["a/p1", "b/p2", "c/p3"]), st.integers(0, 20)), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_shared_devices_names_exactly_the_workloads_whose_spans_on_a_gpu_overlap(held):
    # Each sample says which pod held GPU-x at minute m; a pod's span is [first, last] of its minutes.
    t0 = 1_767_225_600
    text = "\n".join(
        f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-x",gpu="0",Hostname="n",namespace="{w[0]}",pod="{w[2:]}",container="c"}} '
        f"5 {(t0 + 60 * m) * 1000}" for w, m in held)
    c = prometheus.parse(text + "\n")
    spans = {d: (0.0, 0.0, 0.0) for d in c.devices}
    got = pipeline.shared_devices(c, spans)
    span = {}
    for w, m in held:
        a, b = span.get(w, (m, m))
        span[w] = (min(a, m), max(b, m))
    want = sorted(w for w in span if any(v != w and span[v][0] <= span[w][1] and span[w][0] <= span[v][1]
                                         for v in span))
    assert got == ({"GPU-x": want} if want else {})
