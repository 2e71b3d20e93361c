"""A shared device's energy is its share of the GPU's (receipt 1.5), not the whole GPU's once per sharer.

dcgm-exporter writes the physical GPU's power and energy counter on every MIG instance's series and on every pod
of a time-sliced or MPS GPU (tests/fixtures/real/dcgm_exporter/a30_mig_power_energy_per_slice_issue317.prom), so
before 1.5 three slices of one A100 held for an hour were each billed that GPU's whole kWh: 3x what it drew. Who
controls it: the exporter's labels (node root) and which slices or pods a tenant holds (the billed party) — a
tenant must not pay for energy its neighbours' slices drew. The run bears its slice's compute share (3g of 7 =
3/7) times its pods' share; the tenant's verifier (ledger/proofcheck.py) computes the same block from a proof
bundle; a receipt issued as 1.4 still replays as 1.4 billed it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

ENV = {"IPLEDGER_CONFIG": ""}
T0 = 1_767_225_600
PARENT = "GPU-265c9814-6156-355b-e589-ff2064894f16"
WATTS = 280.0
MEASURED = ('id = "e"\nversion = "1"\ncurrency = "EUR"\neffective_from = "2020-01-01"\n'
            '[skus.default]\nrate_per_gpu_hour = "2.00"\nenergy_price_per_kwh = "0.25"\npue = 1.0\n'
            'energy_basis = "measured"\n')


def _series(name: str, labels: str, t: int, v: float) -> str:
    return f"{name}{{{labels}}} {v:g} {t}"


def _mig_export(path: Path, minutes: int = 60) -> None:
    """One A100 80GB as 3g + 2g + 1g held by three pods for an hour at 60 s; every instance's series carry the
    GPU's power (280 W) and its energy counter (mJ), as dcgm-exporter writes them."""
    base = f'gpu="0",UUID="{PARENT}",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="mig-node-1"'
    slices = {"1": ("3g.40gb", 'container="trainer",namespace="team-a",pod="train-3g"'),
              "5": ("2g.20gb", 'container="infer",namespace="team-b",pod="infer-2g"'),
              "13": ("1g.10gb", 'container="nb",namespace="team-c",pod="notebook-1g"')}
    lines = []
    for k in range(minutes + 1):
        t = T0 + 60 * k
        for gi, (profile, pod) in slices.items():
            labels = f'{base},GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}",{pod}'
            lines += [_series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, t, 0.6),
                      _series("DCGM_FI_DEV_POWER_USAGE", labels, t, WATTS),
                      _series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, t, 5_000_000_000 + int(WATTS * 60 * k * 1000))]
    path.write_text("\n".join(lines) + "\n# EOF\n", encoding="utf-8")


def _receipt(runner, cli, url, job, *extra):  # noqa: ANN001, ANN202
    r = runner.invoke(cli, ["--db", url, "receipt", job, "--cluster", "pathb", "--json", *extra], env=ENV)
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{"):])


@pytest.fixture
def mig_ledger(runner, cli, tmp_path, sqlite_url):  # noqa: ANN001, ANN201
    src = tmp_path / "mig.om"
    _mig_export(src)
    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", str(src), "--json", "--quiet"], env=ENV)
    assert r.exit_code == 0, r.output
    (tmp_path / "c.toml").write_text(MEASURED)
    assert runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(tmp_path / "c.toml")],
                         env=ENV).exit_code == 0
    return sqlite_url


JOBS = {"team-a/train-3g": Fraction(3, 7), "team-b/infer-2g": Fraction(2, 7), "team-c/notebook-1g": Fraction(1, 7)}


def test_each_slice_bears_its_share_of_the_gpus_energy_and_the_slices_add_to_what_they_hold(runner, cli,
                                                                                          mig_ledger):
    whole_kwh = WATTS * 3600 / 3.6e6                      # the GPU drew 0.28 kWh in the hour
    total = 0.0
    for job, share in JOBS.items():
        body = _receipt(runner, cli, mig_ledger, job)
        e = body["energy"]
        (dev,) = body["devices"]
        assert body["receipt_version"] == "1.5" and dev["mig"]["share"] == f"{share.numerator}/{share.denominator}"
        # the counter's rise over the window x the slice's share (the last minute has no later reading: unknown)
        assert e["kwh"] == pytest.approx(whole_kwh * float(share), abs=2e-3 * float(share) + 1e-6)
        assert e["kwh"] < whole_kwh * float(share) + 1e-9
        assert abs(sum(e["by_bucket"].values()) - e["kwh"]) <= 1e-5
        assert float(e["cost"]["measured"]) == pytest.approx(e["kwh"] * 0.25, abs=0.006)
        # TDP pricing beside it: the slice's share of the GPU's 400 W over its hours, not the whole GPU's
        paid = dev["gpu_hours"]["paid"]
        assert float(e["cost"]["tdp"]) == pytest.approx(0.4 * paid * float(share) * 0.25, abs=0.006)
        total += e["kwh"]
    assert total == pytest.approx(whole_kwh * 6 / 7, abs=2e-3)   # 6 of 7 slices held: never more than the GPU drew


def test_issued_shared_energy_receipts_replay_and_verify(runner, cli, mig_ledger):
    for job in JOBS:
        assert _receipt(runner, cli, mig_ledger, job, "--issue")["receipt_version"] == "1.5"
        v = runner.invoke(cli, ["--db", mig_ledger, "receipt", job, "--cluster", "pathb", "--verify"], env=ENV)
        assert v.exit_code == 0 and v.output.startswith("OK"), v.output
    v = runner.invoke(cli, ["--db", mig_ledger, "verify"], env=ENV)
    assert v.exit_code == 0, v.output


def test_a_receipt_issued_as_14_replays_with_the_whole_gpus_energy(runner, cli, mig_ledger):
    """Receipts keep their bytes under the rules they were issued by: an entry that says 1.4 is recomputed as 1.4
    computed a shared device's energy (the whole GPU's), and so is distinguishable from a 1.5 one."""
    from ledger.chain.db import make_engine
    from ledger.receipts import RunKey
    from ledger.receipts.issue import issued_entries, replay

    body = _receipt(runner, cli, mig_ledger, "team-a/train-3g", "--issue")
    engine = make_engine(mig_ledger, read_only=True)
    issued = issued_entries(engine, RunKey("pathb", "team-a/train-3g", 0))[-1]   # (the import issued one too)
    now = replay(engine, issued)
    assert now.body == body
    from ledger.chain.canonical import canonical_json

    payload = canonical_json({**issued.entry.data, "receipt_version": "1.4"})
    old = replace(issued, entry=replace(issued.entry, payload=payload))
    then = replay(engine, old).body
    assert then["receipt_version"] == "1.4"
    assert then["energy"]["kwh"] == pytest.approx(body["energy"]["kwh"] * 7 / 3, abs=1e-6)


def test_the_tenants_verifier_computes_the_shared_energy_block(runner, cli, mig_ledger, tmp_path):
    import ledger.proofcheck as pc

    key = tmp_path / "site.key"
    assert runner.invoke(cli, ["--db", mig_ledger, "keygen", "--out", str(key)], env=ENV).exit_code == 0
    head = tmp_path / "head.json"
    assert runner.invoke(cli, ["--db", mig_ledger, "checkpoint", "--key", str(key), "--out", str(head)],
                         env=ENV).exit_code == 0
    bundle = tmp_path / "b.json"
    r = runner.invoke(cli, ["--db", mig_ledger, "receipt", "team-b/infer-2g", "--cluster", "pathb", "--proof",
                            "--head", str(head), "--out", str(bundle)], env=ENV)
    assert r.exit_code == 0, r.output
    raw = bundle.read_bytes()
    doc = json.loads(raw)
    assert doc["method"]["receipt_version"] == "1.5"
    pub = pc.load_public_key(Path(str(key) + ".pub").read_bytes())
    assert pc.verify_bundle(raw, pub)["receipt_hash"] == doc["receipt"]["receipt_hash"]
    # the operator bills the slice the whole GPU's energy under the same version: named, not accepted
    doc["receipt"]["energy"]["kwh"] = round(doc["receipt"]["energy"]["kwh"] * 7 / 2, 6)
    with pytest.raises(pc.Failure, match="receipt"):
        pc.verify_bundle((pc.canonical_json(doc) + "\n").encode("utf-8"), pub)


def test_energy_parts_of_whole_shared_segmented_and_mig_devices():
    from ledger.proofcheck import energy_parts

    half = ("equal", Fraction(1, 2))
    assert energy_parts({"shared": None}, 0.0, 10.0) == ()                           # whole GPU, held alone
    assert energy_parts({"shared": half}, 0.0, 10.0) == ((0.0, 10.0, Fraction(1, 2)),)
    assert energy_parts({"shared": None, "mig_profile": "3g.40gb", "sku": "NVIDIA A100-SXM4-80GB"}, 0, 10) == (
        (0, 10, Fraction(3, 7)),)
    assert energy_parts({"shared": half, "mig_profile": "1g.10gb", "sku": "NVIDIA H100 80GB HBM3"}, 0, 10) == (
        (0, 10, Fraction(1, 14)),)
    seg = {"segments": ((0.0, None), (4.0, half), (8.0, ("equal", Fraction(1, 3)))), "shared": ("segments", None)}
    assert energy_parts(seg, 2.0, 10.0) == ((2.0, 4.0, Fraction(1)), (4.0, 8.0, Fraction(1, 2)),
                                            (8.0, 10.0, Fraction(1, 3)))
    # a profile the MIG table does not know bears the whole GPU's energy, as its rate does
    assert energy_parts({"shared": None, "mig_profile": "big", "sku": "NVIDIA A100"}, 0, 10) == ()
