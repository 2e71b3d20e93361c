"""A receipt's energy and carbon blocks (ledger.receipts.energy): they add up and replay byte for byte."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.chain.contracts import parse_contract
from ledger.method.carbon import constant_intensity, parse_intensity
from ledger.method.energy import CounterReading, PowerSample, device_energy
from ledger.receipts.energy import DeviceEnergyInput, carbon_block, energy_block, energy_lines

T0 = 1_764_547_200.0   # 2025-12-01 00:00 UTC
BASIS = parse_contract({"id": "c", "version": "1", "skus": {"H100": {
    "rate_per_gpu_hour": "2.00", "energy_price_per_kwh": "0.25", "pue": 1.2, "energy_basis": "measured"}}},
    "c.toml").basis_for("H100")


def _device(watts: float, hours: float, counter: bool = True) -> DeviceEnergyInput:
    ts = [T0 + 60.0 * i for i in range(int(hours * 60) + 1)]
    rs = [CounterReading(t, 1e9 + watts * (t - T0) / 1e-3, 1e-3) for t in ts] if counter else []
    de = device_energy("GPU", rs, ts[0], ts[-1], [PowerSample(t, watts) for t in ts] if not counter else [])
    half = T0 + (ts[-1] - T0) / 2
    return DeviceEnergyInput(de, ((T0, half, "delivered"), (half, ts[-1], "idle")), 700.0,
                             Decimal(str(hours)), BASIS)


def test_measured_and_tdp_side_by_side() -> None:
    block = energy_block([_device(350.0, 2.0), _device(200.0, 2.0)], "EUR")
    assert block["kwh"] == 1.1 and block["source"] == "counter"
    assert block["cost"] == {"currency": "EUR", "basis": "measured", "charged": "0.33", "measured": "0.33",
                             "tdp": "0.84"}
    assert abs(sum(block["by_bucket"].values()) - block["kwh"]) < 1e-6
    lines = energy_lines(block)
    assert "1.100 kWh" in lines[0] and "measured 0.33" in lines[1] and "TDP pricing 0.84" in lines[1]


def test_nothing_measured_falls_back_to_tdp_by_name() -> None:
    empty = DeviceEnergyInput(device_energy("GPU", [], T0, T0 + 3600), ((T0, T0 + 3600, "delivered"),), 700.0,
                              Decimal(1), BASIS)
    block = energy_block([empty], "EUR")
    assert block["source"] == "unknown" and block["unknown_gpu_hours"] == 1.0
    assert block["cost"]["basis"] == "tdp_fallback" and block["cost"]["measured"] is None
    assert block["cost"]["charged"] == block["cost"]["tdp"] == "0.21"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(50, 700), st.integers(1, 3)), min_size=1, max_size=4), st.floats(0, 800))
def test_blocks_replay_byte_identically_and_add_up(devs, g) -> None:
    inputs = [_device(w, h) for w, h in devs]
    a = json.dumps([energy_block(inputs, "EUR"), carbon_block([(constant_intensity("DE", g, "site"), d) for d in inputs])],
                   sort_keys=True)
    b = json.dumps([energy_block(inputs, "EUR"), carbon_block([(constant_intensity("DE", g, "site"), d) for d in inputs])],
                   sort_keys=True)
    assert a == b
    e, c = json.loads(a)
    assert abs(e["kwh"] - sum(w * h / 1000 for w, h in devs)) <= 1e-5
    assert abs(c["kg_co2e"] - e["kwh"] * 1.2 * g / 1000) <= 1e-5


def test_carbon_names_zone_source_and_version() -> None:
    text = (Path(__file__).parent / "fixtures" / "carbon" / "electricitymaps_DE_hourly.csv").read_text("utf-8")
    table = parse_intensity(text, "DE")
    first = min(table.hourly)
    d = DeviceEnergyInput(device_energy("GPU", [CounterReading(first, 0.0, 1.0),
                                                 CounterReading(first + 3600, 3_600_000.0, 1.0)],
                                        first, first + 3600), ((first, first + 3600, "delivered"),), 700.0,
                          Decimal(1), BASIS)
    c = carbon_block([(table, d)])
    assert c == {"kg_co2e": round(1.0 * 1.2 * 418.9 / 1000, 6), "zone": "DE",
                 "intensity_source": "electricitymaps:lca", "intensity_version": table.version, "pue": 1.2,
                 "hours_without_intensity": 0}
    assert "zone DE" in energy_lines(energy_block([d], "EUR"), c)[-1]


# --- end to end: a dcgm-exporter export, imported, read back as energy -------------------------------------

def test_imported_export_energy_equals_the_exporters_counter(tmp_path) -> None:
    from ledger.importers import prometheus, synth
    from ledger.telemetry.energy import device_energy_of

    kw = dict(n_gpus=2, hours=2, cadence=60, holes=[(1, 1800, 1200)])   # GPU 1 is silent for 20 minutes
    truth = {}
    for labels, pts in synth.series(**kw):
        if labels["__name__"] == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
            truth[labels["UUID"]] = (pts[0][0], pts[-1][0], (int(pts[-1][1]) - int(pts[0][1])) / 1000.0,
                                     labels["gpu"] == "1")
    c = prometheus.read(synth.write_query_range(tmp_path, **kw))
    assert set(c.series) == set(truth)
    for dev, (t0, t1, joules, holed) in truth.items():
        de = device_energy_of(dev, c.series[dev], t0, t1)
        assert abs(de.joules - joules) / 3.6e6 <= 1e-6          # bridged across the hole by the counter
        assert de.source == "counter" and de.unknown_seconds == 0
        no_counter = device_energy_of(dev, {"power_w": c.series[dev]["power_w"]}, t0, t1)
        # power alone cannot cross the 20-minute hole (more than 300 s between samples): that time is unknown
        assert no_counter.unknown_seconds == (1200.0 + 60.0 if holed else 0.0)
        assert no_counter.source == ("mixed" if holed else "power_integral")


# --- through the CLI: a contract with energy_basis gives receipt 1.4 with the energy block; verify replays ---

MEASURED_TERMS = ('id = "e"\nversion = "1"\ncurrency = "EUR"\n'
                  'effective_from = "2020-01-01"\n[skus.default]\nrate_per_gpu_hour = "2.00"\n'
                  'energy_price_per_kwh = "0.25"\npue = 1.2\nenergy_basis = "measured"\n')


def _imported_ledger(tmp_path, **synth_kw):  # noqa: ANN001, ANN202
    """A new SQLite ledger holding a synthetic Prometheus export imported through the CLI: (url, runner, env)."""
    from click.testing import CliRunner

    from ledger.chain import db as db_mod
    from ledger.cli.main import cli
    from ledger.importers import synth

    env = {"IPLEDGER_CONFIG": ""}
    url = f"sqlite:///{tmp_path / 'l.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    run = CliRunner()
    synth.write_query_range(tmp_path / "qr", **synth_kw)
    r = run.invoke(cli, ["--db", url, "import", "prometheus", str(tmp_path / "qr")], env=env)
    assert r.exit_code == 0, r.output
    return url, run, env


def _set_measured_terms(tmp_path, url: str, run, env: dict):  # noqa: ANN001, ANN202
    from ledger.cli.main import cli

    (tmp_path / "c.toml").write_text(MEASURED_TERMS)
    return run.invoke(cli, ["--db", url, "contract", "set", str(tmp_path / "c.toml")], env=env)


def test_receipt_under_measured_energy_terms_replays(tmp_path) -> None:
    import json as _json

    from ledger.cli.main import cli
    from ledger.importers import synth

    kw = dict(n_gpus=4, hours=2, cadence=60, jobs="slurm")
    url, run, env = _imported_ledger(tmp_path, **kw)
    before = run.invoke(cli, ["--db", url, "receipt", "1000", "--json"], env=env)
    assert before.exit_code == 0, before.output
    assert _json.loads(before.output)["receipt_version"] == "1.2" and "energy" not in _json.loads(before.output)
    r = _set_measured_terms(tmp_path, url, run, env)
    assert r.exit_code == 0, r.output
    r = run.invoke(cli, ["--db", url, "receipt", "1000", "--json", "--issue"], env=env)
    assert r.exit_code == 0, r.output
    body = _json.loads(r.output[r.output.index("{"):])   # after the line saying it was re-issued
    assert body["receipt_version"] == "1.4"
    e = body["energy"]
    truth_j = 0.0
    for labels, pts in synth.series(**kw):
        if labels["__name__"] == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" and labels["gpu"] in "0123":
            truth_j += (int(pts[-1][1]) - int(pts[0][1])) / 1000.0
    # the counter's energy from first to last reading, exactly; the last sample's minute (after the last
    # reading, no later power sample) is unknown, not zero and not TDP
    assert abs(e["kwh"] - truth_j / 3.6e6) <= 1e-6
    assert e["source"] == "mixed" and e["unknown_gpu_hours"] == round(4 * 60 / 3600, 6)
    assert e["cost"]["basis"] == "measured" and e["cost"]["tdp"] is not None
    assert abs(sum(e["by_bucket"].values()) - e["kwh"]) <= 1e-5
    gpu_h = body["totals"]["before_adjustments"]["gpu_hours"]
    assert body["totals"]["before_adjustments"]["amount"] == round(gpu_h * 2.00 + float(e["cost"]["charged"]), 2)
    assert body["cost"]["energy"] == e["cost"]["charged"]
    text = run.invoke(cli, ["--db", url, "receipt", "1000"], env=env).output
    assert f"Energy cost (measured): {e['cost']['charged']} EUR" in text and "TDP pricing" in text
    assert f"Energy: {e['kwh']:.3f} kWh measured (mixed)" in text
    v = run.invoke(cli, ["--db", url, "verify"], env=env)
    assert v.exit_code == 0, v.output


# --- the tenant's offline checker recomputes receipt 1.4 (energy block included) from a proof bundle --------

def test_proof_bundle_of_a_14_receipt_passes_ipledger_verify(tmp_path) -> None:
    import json as _json
    import subprocess
    import sys

    import ledger.proofcheck as pc
    from ledger.cli.main import cli

    url, run, env = _imported_ledger(tmp_path, n_gpus=2, hours=1, cadence=60, jobs="slurm",
                                     holes=[(1, 1200, 900)])   # GPU 1 silent 15 minutes: the counter bridges it
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    key = tmp_path / "site.key"
    assert run.invoke(cli, ["--db", url, "keygen", "--out", str(key)], env=env).exit_code == 0
    head = tmp_path / "head.json"
    r = run.invoke(cli, ["--db", url, "checkpoint", "--key", str(key), "--out", str(head)], env=env)
    assert r.exit_code == 0, r.output
    bundle = tmp_path / "bundle.json"
    r = run.invoke(cli, ["--db", url, "receipt", "1000", "--proof", "--head", str(head), "--out", str(bundle)],
                   env=env)
    assert r.exit_code == 0, r.output
    body = _json.loads(run.invoke(cli, ["--db", url, "receipt", "1000", "--json"], env=env).output)
    assert body["receipt_version"] == "1.4" and body["energy"]["kwh"] > 0
    raw = bundle.read_bytes()
    assert _json.loads(raw)["method"]["receipt_version"] == "1.4"
    pub = pc.load_public_key(Path(str(key) + ".pub").read_bytes())
    assert pc.verify_bundle(raw, pub)["receipt_hash"] == body["receipt_hash"]
    exe = Path(sys.executable).with_name("ipledger-verify")
    res = subprocess.run([str(exe), str(bundle), "--pubkey", str(key) + ".pub"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == body["receipt_hash"]
    # an energy figure changed in the bundled receipt is named, not accepted
    doc = _json.loads(raw)
    doc["receipt"]["energy"]["kwh"] = round(doc["receipt"]["energy"]["kwh"] + 0.001, 6)
    bad = (pc.canonical_json(doc) + "\n").encode("utf-8")
    try:
        pc.verify_bundle(bad, pub)
    except pc.Failure as exc:
        assert "energy" in str(exc) or "receipt" in str(exc)
    else:
        raise AssertionError("a changed energy figure passed")


def test_a_real_amd_smi_energy_csv_gives_the_counters_joules(tmp_path) -> None:
    """The real `amd-smi metric -E -w 1 --csv` loop of tests/fixtures/real/amd_smi (two MI210s; banner, a header
    per iteration): each device's energy over its readings is its counter's rise in joules, from the counter; and
    through the CLI, an import priced on measured terms gives a 1.4 receipt with that energy."""
    import json

    from ledger.cli.main import cli
    from ledger.importers import amdsmi
    from ledger.telemetry.energy import device_energy_of

    path = Path(__file__).parent / "fixtures" / "real" / "amd_smi" / "metric_csv_watch_energy_mi210_amdsmi38.csv"
    rows = [ln.split(",") for ln in path.read_text("utf-8").splitlines() if ln[:1].isdigit()]
    first, last = {}, {}
    for ts, gpu, joules in rows:
        first.setdefault(gpu, (float(ts), float(joules)))
        last[gpu] = (float(ts), float(joules))
    c = amdsmi.read(path, node="mi210")
    assert len(c.series) == 2
    for dev, series in c.series.items():
        gpu = dev.rsplit("gpu", 1)[1]
        (t0, j0), (t1, j1) = first[gpu], last[gpu]
        de = device_energy_of(dev, series, t0, t1)
        assert de.source == "counter" and de.unknown_seconds == 0
        assert abs(de.joules - (j1 - j0)) < 1e-6
    from click.testing import CliRunner

    from ledger.chain import db as db_mod

    env, url, run = {"IPLEDGER_CONFIG": ""}, f"sqlite:///{tmp_path / 'l.db'}", CliRunner()
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    r = run.invoke(cli, ["--db", url, "import", "amd-smi", str(path), "--node", "mi210", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mapped_fields"] == {"total_energy_consumption": "energy_j"}
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    log = run.invoke(cli, ["--db", url, "log", "--json"], env=env)
    job = next(e["job_id"] for e in json.loads(log.output) if e["kind"] == "allocation_started")
    r = run.invoke(cli, ["--db", url, "receipt", job, "--json"], env=env)
    assert r.exit_code == 0, r.output
    body = json.loads(r.output)
    assert body["receipt_version"] == "1.4" and body["energy"]["kwh"] > 0
    assert body["energy"]["source"] in ("counter", "mixed")


def test_energy_columns_read_in_the_attributions_pass_equal_the_plain_second_pass(tmp_path) -> None:
    """The receipt reads energy_j/power_w in the same pass over the sample blocks as the attribution's columns
    (load_sample_arrays(energy_out=...), LazySamples' batches); load_energy_columns is the plain second pass it
    replaced, kept as the reference: the same columns, bit for bit, by either path (engine: lazy batches of 1
    device; connection: one read)."""
    import numpy as np

    from ledger.chain.db import make_engine
    from ledger.receipts import gather as g

    url, run, env = _imported_ledger(tmp_path, n_gpus=3, hours=1, cadence=60, jobs="slurm", holes=[(1, 1200, 900)])
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    engine = make_engine(url, read_only=True)
    lazy = g.gather(engine, "1000")
    with engine.connect() as conn:
        eager = g.gather(conn, "1000")
        segs = [s.entry.entry_id for s in eager.segments]
        devices = sorted(eager.samples)
        w0, w1 = min(float(a.t[0]) for a in eager.samples.values()), 2e12
        plain = g.load_energy_columns(conn, segs, devices, w0, w1)
        out: dict = {}
        g.load_sample_arrays(conn, segs, devices, w0, w1, energy_out=out)
    small = g.LazySamples(engine, {d: segs for d in devices}, w0, w1, batch=1, energy=True)
    batched = g.LazyEnergy(small)          # no device attributed here (as where worker processes did it)
    attributed = g.LazySamples(engine, {d: segs for d in devices}, w0, w1, batch=1, energy=True)
    for d in devices:
        assert len(attributed[d])          # the attribution's read, energy columns in the same pass
    assert devices and sorted(plain) == devices
    for d in devices:
        for col in ("energy_j", "power_w"):
            for got in (out[d][col], batched[d][col], g.LazyEnergy(attributed)[d][col]):
                assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(got, plain[d][col]))
        assert np.isfinite(plain[d]["energy_j"][1]).any()
    assert not small._loaded    # the unattributed devices' energy came without reading the attribution's columns
    assert set(lazy.energy_columns) == set(eager.energy_columns) == set(devices)
    for d in devices:
        for col in ("energy_j", "power_w"):
            assert all(np.array_equal(a, b, equal_nan=True)
                       for a, b in zip(lazy.energy_columns[d][col], eager.energy_columns[d][col]))
    assert batched.get("no-such-device", {}) == {}


def test_worker_processes_give_the_same_energy_receipt(tmp_path, monkeypatch) -> None:
    """Where worker processes (and the parent, taking batches too) attribute the devices, each hands back the
    energy columns its own read gave, so none is read twice: the receipt, energy block included, is the
    in-process one byte for byte."""
    import importlib

    from ledger.chain.db import make_engine
    from ledger.receipts import receipt_for
    from tests.test_receipt_replay import spy_attribute_all

    gmod = importlib.import_module("ledger.receipts.gather")
    url, run, env = _imported_ledger(tmp_path, n_gpus=3, hours=1, cadence=60, jobs="slurm", holes=[(1, 1200, 900)])
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    engine = make_engine(url, read_only=True)
    here = receipt_for(engine, "1000")
    monkeypatch.setattr(gmod, "PARALLEL_MIN_DEVICES", 2)
    results = spy_attribute_all(monkeypatch, gmod)
    second_reads = []
    original = gmod.LazySamples.read_energy

    def spy(self, device):  # noqa: ANN001, ANN202
        second_reads.append(device)
        return original(self, device)

    monkeypatch.setattr(gmod.LazySamples, "read_energy", spy)
    there = receipt_for(engine, "1000", workers=2)
    engine.dispose()
    assert results and results[0] is not None and len(results[0]) == 3   # the worker path did the devices
    assert second_reads == []
    assert there.body["energy"]["kwh"] > 0
    assert there.canonical() == here.canonical()
