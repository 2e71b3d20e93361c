"""Energy in the formats no capture of ours covers: DCGM 4.7's joule counter beside field 156 in a dcgm-exporter
scrape, and amd-smi ``metric --json`` energy in both JSON envelopes (issue 34, "a real-format fixture per source").

The fixtures under tests/fixtures/real/ named ``*dcgm47*`` and ``metric_json_energy_*`` are assembled from the
published formats (their ``.source.txt`` says from what, and that they are not captures). Each test goes through
the real importer, and the receipts' ones through ``ipledger import`` and ``ipledger receipt --json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.importers import amdsmi, prometheus
from ledger.importers.common import Collected
from ledger.method.energy import J_PER_KWH
from ledger.telemetry.energy import device_energy_of

R = Path(__file__).parent / "fixtures" / "real"
EXP = R / "dcgm_exporter"
AMD = R / "amd_smi"
SCRAPES = [EXP / f"h100_dcgm47_fields_156_and_1611_scrape{k}.prom" for k in (0, 1)]
T0 = 1_767_225_600.0
STEP = 30.0                                   # dcgm-exporter's default collection interval (30000 ms)
ENV = {"IPLEDGER_CONFIG": ""}
GPU0, GPU1 = "GPU-4d1c7a2e-9b0f-4e3a-8c61-2f5b7e9a0d13", "GPU-a87f03c5-61d2-4b9e-9e7a-c40b18f2d65e"
TERMS = ('id = "e"\nversion = "1"\ncurrency = "EUR"\neffective_from = "2020-01-01"\n[skus.default]\n'
         'rate_per_gpu_hour = "2.00"\nenergy_price_per_kwh = "0.25"\npue = 1.2\nenergy_basis = "measured"\n')


def vals(c, device, field):
    return [None if math.isnan(v) else v for v in c.series[device][field][1]]


def sample_values(path: Path, metric: str) -> dict[str, float]:
    """UUID -> the value of ``metric`` in an exposition file, read with a plain split (not the importer)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(metric + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('UUID="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def without(path: Path, metric: str, tmp_path: Path) -> Path:
    """A copy of a scrape without one metric's HELP/TYPE/sample lines (an exporter whose CSV leaves it out)."""
    kept = [ln for ln in path.read_text(encoding="utf-8").splitlines()
            if not (ln.startswith(metric + "{") or ln.startswith(f"# HELP {metric} ") or ln.startswith(f"# TYPE {metric} "))]
    out = tmp_path / f"{path.stem}_without_{metric}.prom"
    out.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return out


def both_scrapes(files=SCRAPES):
    c = prometheus.read(files[0], default_ts=T0)
    c.merge(prometheus.read(files[1], default_ts=T0 + STEP))
    return c


def counter_truth(metric: str, scale: float) -> dict[str, float]:
    a, b = (sample_values(p, metric) for p in SCRAPES)
    return {u: (b[u] - a[u]) * scale for u in a}


# --- dcgm-exporter with DCGM 4.7's field names ------------------------------------------------------------------

def test_the_dcgm47_scrape_maps_156_as_mj_and_1611_as_j_and_reports_the_new_base_unit_fields():
    c = prometheus.read(SCRAPES[0], default_ts=T0)
    assert sorted(c.devices) == [GPU0, GPU1] and c.devices[GPU0].sku == "NVIDIA H100 80GB HBM3"
    e156 = sample_values(SCRAPES[0], "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    e1611 = sample_values(SCRAPES[0], "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL")
    for dev in (GPU0, GPU1):
        assert vals(c, dev, "energy_j") == [e156[dev] / 1000]            # field 156: mJ -> J
        assert vals(c, dev, "energy_j_whole") == [e1611[dev]]           # field 1611: whole J, as is
        assert math.floor(e156[dev] / 1000) == e1611[dev]                # one counter in two units
    assert c.mapped["DCGM_FI_DEV_BOARD_POWER_WATTS"] == "power_w"
    assert c.mapped["DCGM_FI_DEV_GPU_TEMP_CELSIUS"] == "gpu_temp_c"
    assert vals(c, GPU0, "power_w") == [690.123]
    # the base-unit twins of fields the table reads in MHz / MiB are reported, never read in the wrong unit
    assert {"DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_FB_USED_BYTES"} <= set(c.unmapped)
    assert "sm_clock_mhz" not in c.series[GPU0] and "fb_used_mib" not in c.series[GPU0]


def test_both_energy_counters_in_one_scrape_are_counted_once_from_156():
    c = both_scrapes()
    truth = counter_truth("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3)
    for dev in (GPU0, GPU1):
        e = device_energy_of(dev, c.device_arrays(dev), T0, T0 + STEP)
        assert e.source == "counter" and abs(e.joules - truth[dev]) <= 1e-6
        assert "energy_j_whole" not in c.device_series_names(dev)
    notes = c.energy_notes()
    assert len(notes) == 2 and all("field 1611 (whole J) of the same GPU not read" in n for n in notes)
    assert set(notes) <= set(c.report()["warnings"])                       # the import report says so


def test_1611_alone_is_read_in_joules(tmp_path):
    files = [without(p, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", tmp_path) for p in SCRAPES]
    c = both_scrapes(files)
    truth = counter_truth("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0)
    finer = counter_truth("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3)
    assert all(abs(truth[d] - finer[d]) < 1.0 for d in truth) and c.energy_notes() == []   # whole-J rounding only
    for dev in (GPU0, GPU1):
        e = device_energy_of(dev, c.device_arrays(dev), T0, T0 + STEP)
        assert e.source == "counter" and e.joules == truth[dev]       # whole joules, not x 1000 or / 1000


def _receipt(runner, cli, url, files, tmp_path, *extra):
    for k, f in enumerate(files):
        r = runner.invoke(cli, ["--db", url, "import", "prometheus", str(f), "--at", str(T0 + k * STEP),
                                "--quiet", *extra], env=ENV)
        assert r.exit_code == 0, r.output
    terms = tmp_path / "c.toml"
    terms.write_text(TERMS, encoding="utf-8")
    assert runner.invoke(cli, ["--db", url, "contract", "set", str(terms)], env=ENV).exit_code == 0
    r = runner.invoke(cli, ["--db", url, "receipt", "node:gpu-node-07", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    return json.loads(r.output), r


def test_dcgm47_scrapes_through_the_cli_give_the_156_counters_kwh_on_the_receipt(runner, cli, tmp_path, sqlite_url):
    body, r = _receipt(runner, cli, sqlite_url, SCRAPES, tmp_path)
    joules = sum(counter_truth("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3).values())
    e = body["energy"]
    assert e["kwh"] == round(joules / J_PER_KWH, 6) and e["kwh"] > 0
    # the window runs one collection interval past the second scrape, where nothing was read: unknown, not 0
    assert e["source"] == "mixed" and e["unknown_gpu_hours"] == round(2 * STEP / 3600, 6)
    assert e["cost"]["basis"] == "measured" and "tdp" in e["cost"]


def test_156_alone_1611_alone_and_both_give_one_energy_and_a_version_rescales_nothing(runner, cli, tmp_path):
    from ledger.chain import db as db_mod

    def url(name):
        u = f"sqlite:///{tmp_path / (name + '.db')}"
        eng = db_mod.make_engine(u)
        db_mod.upgrade(eng)
        eng.dispose()
        return u

    for name in "abcd":
        (tmp_path / name).mkdir()
    only156 = [without(p, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", tmp_path / "a") for p in SCRAPES]
    only1611 = [without(p, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", tmp_path / "b") for p in SCRAPES]
    both, _ = _receipt(runner, cli, url("both"), SCRAPES, tmp_path / "c")
    versioned, r = _receipt(runner, cli, url("versioned"), SCRAPES, tmp_path / "d", "--dcgm-exporter-version", "4.9.0")
    e156, _ = _receipt(runner, cli, url("e156"), only156, tmp_path / "a")
    e1611, _ = _receipt(runner, cli, url("e1611"), only1611, tmp_path / "b")
    assert both["energy"] == e156["energy"] == versioned["energy"]          # counted once, never x 1000
    whole = sum(counter_truth("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0).values())
    assert e1611["energy"]["kwh"] == round(whole / J_PER_KWH, 6)            # 1611 read as J
    assert abs(e1611["energy"]["kwh"] - both["energy"]["kwh"]) <= 2 / J_PER_KWH + 1e-6   # whole-J rounding


# --- amd-smi metric --json energy, both envelopes -----------------------------------------------------------------

CSV = AMD / "metric_csv_watch_energy_mi210_amdsmi38.csv"
BARE = AMD / "metric_json_energy_watch_bare_list_mi210_amdsmi38.json"
ENVELOPE = AMD / "metric_json_energy_gpu_data_envelope_mi210_amdsmi38.json"


def csv_readings() -> dict[str, list[tuple[float, float]]]:
    """gpu -> [(timestamp, joules)] as the real CSV capture prints them, read with a plain split."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ln in CSV.read_text(encoding="utf-8").splitlines():
        if ln[:1].isdigit():
            ts, gpu, joules = ln.split(",")
            out.setdefault(gpu, []).append((float(ts), float(joules)))
    return out


def test_amd_smi_json_energy_in_the_bare_list_and_the_gpu_data_envelope_equal_the_real_csv():
    truth = csv_readings()
    t0 = min(t for rs in truth.values() for t, _ in rs)
    bare = amdsmi.read(BARE, node="mi210")                                     # watch mode: timestamps in the records
    env = amdsmi.read(ENVELOPE, node="mi210", start=t0, interval=1.0)          # one invocation a second, no timestamps
    csv = amdsmi.read(CSV, node="mi210")
    for c in (bare, env, csv):
        assert sorted(c.devices) == ["mi210/gpu0", "mi210/gpu1"] and c.unmapped == {} and c.warnings == []
        for gpu, rs in truth.items():
            dev = f"mi210/gpu{gpu}"
            assert list(c.series[dev]["energy_j"][0]) == [t for t, _ in rs]
            assert vals(c, dev, "energy_j") == [j for _, j in rs]                 # value/unit "J": joules as is
            e = device_energy_of(dev, c.device_arrays(dev), rs[0][0], rs[-1][0])
            assert e.source == "counter" and abs(e.joules - (rs[-1][1] - rs[0][1])) < 1e-6
    assert bare.mapped == env.mapped == {"energy.total_energy_consumption": "energy_j"}


def test_amd_smi_json_energy_units_and_what_the_envelope_holds_besides_gpus(tmp_path):
    doc = json.loads(ENVELOPE.read_text(encoding="utf-8").split("\n}\n", 1)[0] + "\n}")
    doc["cpu_data"] = [{"cpu": 0, "power": {"socket_power": {"value": 180, "unit": "W"}}}]
    for rec, unit in zip(doc["gpu_data"], ("mJ", "Wh")):
        rec["energy"]["total_energy_consumption"] = {"value": 5000, "unit": unit}
    src = tmp_path / "one.json"
    src.write_text(json.dumps(doc), encoding="utf-8")
    c = amdsmi.read(src, node="n", start=T0, interval=1.0)
    assert vals(c, "n/gpu0", "energy_j") == [5.0]                                # mJ -> J
    assert "energy_j" not in c.series.get("n/gpu1", {})                          # no energy unit: not guessed
    assert c.unmapped == {"energy.total_energy_consumption [Wh]": 1, "cpu_data": 1}
    assert any("unit 'Wh' is no energy unit" in w for w in c.warnings)


def test_amd_smi_json_envelope_through_the_cli_gives_the_counters_kwh_on_the_receipt(runner, cli, tmp_path, sqlite_url):
    truth = csv_readings()
    t0 = min(t for rs in truth.values() for t, _ in rs)
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "amd-smi", str(ENVELOPE), "--node", "mi210", "--start",
                            str(t0), "--interval", "1s", "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["mapped_fields"] == {"energy.total_energy_consumption": "energy_j"} and out["unmapped_fields"] == {}
    terms = tmp_path / "c.toml"
    terms.write_text(TERMS, encoding="utf-8")
    assert runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(terms)], env=ENV).exit_code == 0
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "node:mi210", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    e = json.loads(r.output)["energy"]
    joules = sum(rs[-1][1] - rs[0][1] for rs in truth.values())
    assert e["kwh"] == round(joules / J_PER_KWH, 6) and e["kwh"] > 0
    # the window runs one interval past the last reading of each GPU: unknown there, never 0 and never TDP
    assert e["source"] == "mixed" and e["unknown_gpu_hours"] == round(2 * 1.0 / 3600, 6)


# --- amd-smi plain text: keys it does not map are reported ------------------------------------------------------

def test_amd_smi_text_metric_reports_the_keys_it_does_not_map(runner, cli, tmp_path, sqlite_url):
    src = AMD / "metric_text_radeon_rocm63_powerjoular67.txt"
    c = amdsmi.read(src, node="n", start=T0, interval=1.0)
    assert vals(c, "n/gpu0", "power_w") == [20.0] and vals(c, "n/gpu0", "gpu_util") == [0.0]
    # read from the capture but no Sample field: each named (they were silently dropped before)
    assert {"USAGE.MM_ACTIVITY", "USAGE.VCN_ACTIVITY", "USAGE.JPEG_ACTIVITY", "POWER.GFX_VOLTAGE",
            "POWER.SOC_VOLTAGE", "POWER.MEM_VOLTAGE", "POWER.POWER_MANAGEMENT", "CLOCK.GFX_0.MIN_CLK",
            "CLOCK.GFX_0.MAX_CLK"} <= set(c.unmapped)
    # read and mapped: never reported as unmapped
    assert not {"USAGE.GFX_ACTIVITY", "POWER.SOCKET_POWER", "POWER.THROTTLE_STATUS", "CLOCK.GFX_0.CLK"} & set(c.unmapped)
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "amd-smi", str(src), "--node", "n", "--start", str(T0),
                            "--interval", "1s"], env=ENV)
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.strip().startswith("not mapped:"))
    assert "POWER.GFX_VOLTAGE x1" in line and "USAGE.VCN_ACTIVITY x1" in line


# --- a name whose field id (and unit) changed between DCGM versions ---------------------------------------------

def test_gpu_util_ratio_name_is_reported_not_read_in_either_versions_unit(tmp_path):
    # DCGM 4.6 named field 203 (percent) DCGM_FI_DEV_GPU_UTIL_RATIO; DCGM 4.7 gives that name to field 1613 (a 0..1
    # ratio). Read as 203, a 4.7 exporter's 0.87 would be 0.87 % busy; read as 1613, a 4.6 exporter's 87 would fail.
    line = [ln for ln in SCRAPES[0].read_text(encoding="utf-8").splitlines()
            if ln.startswith("DCGM_FI_DEV_BOARD_POWER_WATTS{")][0]
    labels = line.split("{", 1)[1].rsplit("}", 1)[0]
    src = tmp_path / "util.prom"
    src.write_text(f"# HELP DCGM_FI_DEV_GPU_UTIL_RATIO GPU utilization.\n# TYPE DCGM_FI_DEV_GPU_UTIL_RATIO gauge\n"
                   f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{labels}}} 0.87\n{line}\n", encoding="utf-8")
    c = prometheus.read(src, default_ts=T0)
    assert "gpu_util" not in c.series[GPU0] and c.unmapped == {"DCGM_FI_DEV_GPU_UTIL_RATIO": 1}
    assert len(c.warnings) == 1 and "field 203 (percent) in DCGM 4.6, field 1613 (0..1 ratio) in DCGM 4.7" in c.warnings[0]
    assert vals(c, GPU0, "power_w") == [690.123]


# --- the counted-once rule as an invariant ----------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(start_mj=st.integers(0, 10**13), steps=st.lists(st.integers(0, 60_000_000), min_size=1, max_size=30),
       order_1611_first=st.booleans(), with_156=st.booleans())
def test_energy_of_a_gpu_carrying_156_and_1611_is_156s_and_1611_alone_is_within_a_joule(start_mj, steps,
                                                                                       order_1611_first, with_156):
    """Whatever the readings and the order the two series arrive in, a GPU with field 156 gets 156's delta
    (mJ -> J) and never that plus 1611's; with 1611 alone the delta is the whole-joule counter's, within 1 J."""
    mj = [start_mj]
    for s in steps:
        mj.append(mj[-1] + s)
    ts = [T0 + STEP * i for i in range(len(mj))]
    c = Collected("prometheus")

    def add_1611():
        for t, v in zip(ts, mj):
            c.add_raw("g", "energy_j_whole", t, str(v // 1000), 1.0)

    def add_156():
        for t, v in zip(ts, mj):
            c.add_raw("g", "energy_j", t, str(v), 0.001)

    for add in ((add_1611, add_156) if order_1611_first else (add_156, add_1611)):
        if add is add_156 and not with_156:
            continue
        add()
    e = device_energy_of("g", c.device_arrays("g"), ts[0], ts[-1])
    assert e.unknown_seconds == 0 and e.source == "counter"
    if with_156:
        assert abs(e.joules - (mj[-1] - mj[0]) / 1000) <= 1e-6 * max(1.0, mj[-1] / 1000)
        assert len(c.energy_notes()) == 1
    else:
        assert e.joules == mj[-1] // 1000 - mj[0] // 1000 and abs(e.joules - (mj[-1] - mj[0]) / 1000) < 1.0
        assert c.energy_notes() == []


# --- dcgm-exporter's 1.x-compatibility names: the same scrape under the old lower-case names ---------------------

def test_the_1x_compatibility_names_read_as_the_classic_fields_of_the_same_real_scrape():
    classic = prometheus.read(EXP / "l4_exporter4x_pci_bus_id_driver580_kops_conformance.prom", default_ts=T0)
    old = prometheus.read(EXP / "l4_1x_compatibility_names_from_kops_conformance_scrape.prom", default_ts=T0)
    d = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
    assert old.devices[d] == classic.devices[d]
    assert old.mapped["dcgm_total_energy_consumption"] == "energy_j" and old.mapped["dcgm_power_usage"] == "power_w"
    # every field the classic names gave, but the row-remap flag the 1.x profile has no row for
    assert set(old.series[d]) == set(classic.series[d]) - {"row_remap_failure"}
    for name in old.series[d]:
        assert vals(old, d, name) == vals(classic, d, name), name
    assert old.reasons[d] == {k: v for k, v in classic.reasons[d].items() if k[1] in old.series[d]}   # mem temp 0
    assert vals(old, d, "energy_j") == [sample_values(EXP / "l4_1x_compatibility_names_from_kops_conformance_scrape.prom",
                                                      "dcgm_total_energy_consumption")[d] / 1000]   # mJ -> J
    assert {"dcgm_pcie_replay_counter", "dcgm_enc_utilization", "dcgm_fb_free"} <= set(old.unmapped)


def test_the_hooks_amd_smi_snapshot_reads_the_energy_of_both_envelopes():
    # the prolog/epilog snapshot (ledger.capture.sources.amd_snapshots.parse_metric_json) cut the envelope at its first inner
    # list ("cpu_data": []) and failed ("Extra data"): an AMD job on a newer amd-smi had no energy counters
    from ledger.capture.sources.amd_snapshots import counters, parse_metric_json

    first_env = ENVELOPE.read_text(encoding="utf-8").split("\n}\n", 1)[0] + "\n}"
    first_bare = BARE.read_text(encoding="utf-8").split("\n]\n", 1)[0] + "\n]"      # the banner line, then a list
    truth = csv_readings()
    for text in (first_env, first_bare):
        snap = parse_metric_json(text)
        for gpu, rs in truth.items():
            vals_, missing = counters(snap, int(gpu))
            assert vals_ == {"energy.total_energy_consumption": rs[0][1]} and missing == {}
