"""The monthly statement's energy and carbon columns (reports/energy_columns.py): every format carries kWh, the
energy cost charged with the measured and TDP figures beside it, kg CO2e and the GPU-hours whose energy is
unknown; a tenant's figures are the sum of its receipts', the tenants sum to the fleet, and every command that
prints kWh for the same runs prints the same figure."""

from __future__ import annotations

import csv
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger.sim import synthetic_receipts as synthetic
from reports.energy_columns import ENERGY_COLUMNS, ENERGY_FOCUS, energy_values
from reports.focus import focus_table, read_focus, validate
from reports.export import to_json
from reports.issued import IssuedSet, Issue
from tests.focus_validator import Unavailable
from tests.focus_validator import validate as focus_validator
from tests.services import unavailable
from tests.test_receipt_energy import MEASURED_TERMS

MONTH = "2026-01"   # ledger.importers.synth.DEFAULT_START


def _ledger(tmp_path):  # noqa: ANN001, ANN202
    """Two namespaces (team-0, team-1), four pods of 4 GPUs for an hour, imported through the CLI and issued
    under measured-energy terms at a site with a constant carbon intensity: (invoke, site env)."""
    from click.testing import CliRunner

    from ledger.cli.main import cli
    from ledger.importers import synth

    url = f"sqlite:///{tmp_path / 'l.db'}"
    cfg = tmp_path / "site.toml"
    cfg.write_text('[carbon]\nzone = "DE"\nintensity_constant = 350\n', encoding="utf-8")
    env = {"IPLEDGER_CONFIG": str(cfg)}
    run = CliRunner()

    def invoke(*args: str) -> str:
        r = run.invoke(cli, ["--db", url, *args], env=env)
        assert r.exit_code == 0, r.output
        return r.output

    invoke("init")
    synth.write_query_range(tmp_path / "qr", n_gpus=16, hours=1, cadence=60, jobs="k8s")
    invoke("import", "prometheus", str(tmp_path / "qr"), "--quiet")
    (tmp_path / "c.toml").write_text(MEASURED_TERMS, encoding="utf-8")
    invoke("contract", "set", str(tmp_path / "c.toml"))
    invoke("issue", "--all", "--quiet")
    return invoke


def test_statement_energy_adds_up_and_agrees_with_the_receipts(tmp_path) -> None:  # noqa: PLR0915
    invoke = _ledger(tmp_path)
    out = {fmt: tmp_path / f"s.{fmt}" for fmt in ("json", "csv", "parquet", "focus.csv")}
    out["focus"] = out.pop("focus.csv")
    for fmt, p in out.items():
        invoke("export", "monthly", "--month", MONTH, "--format", fmt, "--out", str(p), "--quiet")
    st = json.loads(out["json"].read_text())
    tot = st["totals"]
    assert tot["kwh"] > 0 and tot["kg_co2e"] > 0 and tot["energy_cost"] > 0
    assert tot["energy_cost_tdp"] > tot["energy_cost_measured"] > 0    # synth draws below its 700 W TDP

    # the receipts, one by one (JSON and text), against the statement
    rows = list(csv.DictReader(out["csv"].open(encoding="utf-8")))
    runs = [r for r in rows if r["level"] == "run"]
    assert len(runs) == 4 and {r["tenant"] for r in runs} == {"team-0", "team-1"}
    by_tenant: dict[str, float] = {}
    for r in runs:
        body = json.loads(invoke("receipt", r["job_id"], "--json"))
        assert body["receipt_version"] == "1.4" and body["receipt_hash"] == r["receipt_hash"]
        e, c = body["energy"], body["carbon"]
        assert float(r["kwh"]) == pytest.approx(e["kwh"], abs=1e-6)
        assert float(r["kg_co2e"]) == pytest.approx(c["kg_co2e"], abs=1e-6)
        assert float(r["energy_cost"]) == float(e["cost"]["charged"])
        assert float(r["energy_cost_measured"]) == float(e["cost"]["measured"])
        assert float(r["energy_cost_tdp"]) == float(e["cost"]["tdp"])
        assert float(r["energy_unmeasured_gpu_hours"]) == pytest.approx(e["unknown_gpu_hours"], abs=1e-6)
        text = invoke("receipt", r["job_id"])
        assert re.search(rf"^Energy: {e['kwh']:.3f} kWh measured", text, re.M), text
        assert f"Carbon: {c['kg_co2e']:.3f} kg CO2e" in text
        by_tenant[r["tenant"]] = by_tenant.get(r["tenant"], 0.0) + e["kwh"]

    # tenants sum to the fleet, in the JSON, the CSV's tenant rows, the per-tenant statements and FOCUS
    tenants = {t["tenant"]: t for t in st["tenants"]}
    assert set(tenants) == set(by_tenant)
    for t, kwh in by_tenant.items():
        assert tenants[t]["kwh"] == pytest.approx(kwh, abs=1e-6)
        one = tmp_path / f"{t}.json"
        invoke("export", "monthly", "--month", MONTH, "--tenant", t, "--format", "json", "--out", str(one),
               "--quiet")
        assert json.loads(one.read_text())["totals"]["kwh"] == pytest.approx(kwh, abs=1e-6)
    for col in ENERGY_COLUMNS:
        assert sum(t[col] for t in tenants.values()) == pytest.approx(tot[col], abs=1e-5), col
        tenant_rows = [float(r[col]) for r in rows if r["level"] == "tenant"]
        total_row = [float(r[col]) for r in rows if r["level"] == "total"]
        assert sum(tenant_rows) == pytest.approx(total_row[0], abs=1e-5), col
    import pandas as pd

    pq = pd.read_parquet(out["parquet"])
    runs_pq = pq[pq["level"] == "run"] if "level" in pq.columns else pq
    for col in ENERGY_COLUMNS:
        assert runs_pq[col].astype(float).sum() == pytest.approx(tot[col], abs=1e-5), col
    df = read_focus(out["focus"])
    for xc, col in ENERGY_FOCUS:
        assert df[xc].astype(float).sum() == pytest.approx(tot[col], abs=1e-4), xc
    assert validate(df) == []
    try:
        v = focus_validator(out["focus"])
    except Unavailable as exc:
        unavailable(str(exc))
    assert v.failed == [], v.summary()


def _energy_receipt(r: dict, rng: random.Random) -> dict:
    """A synthetic receipt given energy and carbon blocks of random figures (one in four left without)."""
    if rng.random() < 0.25:
        return r
    kwh = round(rng.uniform(0, 50), 6)
    measured = None if rng.random() < 0.2 else f"{kwh * 0.25:.2f}"
    r["receipt_version"] = "1.4"
    r["energy"] = {"kwh": kwh, "source": "counter", "by_bucket": {"delivered": kwh},
                   "unknown_gpu_hours": round(rng.uniform(0, 2), 6),
                   "cost": {"currency": "EUR", "basis": "measured", "charged": measured or f"{kwh * 0.3:.2f}",
                            "measured": measured, "tdp": f"{kwh * 0.4:.2f}"}}
    if rng.random() < 0.7:
        r["carbon"] = {"kg_co2e": round(kwh * 0.35, 6), "zone": "DE", "intensity_source": "constant",
                       "intensity_version": "v", "pue": 1.2, "hours_without_intensity": 0}
    return r


@settings(max_examples=15, deadline=None)
@given(hs.integers(min_value=0, max_value=100_000), hs.integers(min_value=1, max_value=60))
def test_tenant_energy_sums_to_the_fleet(seed, n) -> None:  # noqa: ANN001
    rng = random.Random(seed)
    receipts = [_energy_receipt(r, rng) for r in synthetic.receipts(n, "2026-11", seed=seed)]
    issues = [Issue(seq=k + 1, issued_at=float('nan'), receipt=r) for k, r in enumerate(receipts)]
    st = build_statement_of(issues)
    doc = to_json(st)
    tot = doc["totals"]
    want = [energy_values(r, float(r["gpu_hours"]["paid"])) for r in receipts]
    for i, col in enumerate(ENERGY_COLUMNS):
        assert tot[col] == pytest.approx(sum(w[i] for w in want), abs=1e-5), col
        assert sum(t[col] for t in doc["tenants"]) == pytest.approx(tot[col], abs=1e-5), col
    # a receipt without the block counts all its paid time as energy-unmeasured, never as 0 kWh measured
    bare = sum(float(r["gpu_hours"]["paid"]) for r in receipts if "energy" not in r)
    told = sum(r["energy"]["unknown_gpu_hours"] for r in receipts if "energy" in r)
    assert tot["energy_unmeasured_gpu_hours"] == pytest.approx(bare + told, abs=1e-5)
    f = focus_table(st)
    assert validate(f) == []
    usage = f[f.ChargeCategory == "Usage"]
    assert usage["x_EnergyKwh"].astype(float).sum() == pytest.approx(tot["kwh"], abs=1e-4)


def build_statement_of(issues: list) -> object:
    from reports.export import statement_from_issues

    return statement_from_issues(IssuedSet(issues=issues, through_seq=len(issues), head_hash="0" * 64), "2026-11")
