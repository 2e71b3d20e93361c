"""Contracts: parsing and pricing, selection by account and sequence, and the unknown-interval policies —
each policy and each resolution changes the billed totals exactly as the contract says, and never the
measured lines."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.adjustments import resolution_entry
from ledger.chain.contracts import DEFAULT_CONTRACT, ContractError, contract_entry, parse_contract, read_contract
from ledger.chain.entries import Kind
from ledger.receipts import receipt_for
from ledger.receipts.example import EXPECTED_HOURS, load_example

RATE = Decimal("2.00")
GAP_H = 0.1
PAID_H = 0.9


def _ledger(url, policy: str, **extra):
    eng = db_mod.make_engine(url)
    info = load_example(eng, with_contract=False, with_adjustment=False)
    store.append(eng, [contract_entry(parse_contract({"id": "p", "version": policy, "unknown_policy": policy,
                                                      "skus": {"H100-SXM5-80GB": {"rate_per_gpu_hour": "2.00"}},
                                                      **extra}), ts="2026-11-01T00:00:00Z")])
    return eng, info


def _measured(body):
    return (body["gpu_hours"], body["cost"]["by_bucket"], body["cost"]["paid"], body["cost"]["delivered"],
            body["cost"]["lost"])


@pytest.mark.parametrize("policy,billed_h", [("charge", PAID_H), ("credit", PAID_H - GAP_H),
                                             ("estimate", PAID_H), ("hold", PAID_H - GAP_H)])
def test_contract_policy_bills_the_gap_as_agreed(sqlite_url, policy, billed_h):
    eng, _ = _ledger(sqlite_url, policy)
    b = receipt_for(eng, "7001").body
    eng.dispose()
    assert b["gpu_hours"] == EXPECTED_HOURS
    assert b["billing"]["unknown_gpu_hours_by_policy"][policy] == GAP_H
    assert b["totals"]["before_adjustments"]["gpu_hours"] == pytest.approx(billed_h, abs=1e-12)
    assert Decimal(str(b["totals"]["before_adjustments"]["amount"])) == \
        (Decimal(str(billed_h)) * RATE).quantize(Decimal("0.01"))
    [gap] = b["unknown_intervals"]
    assert gap["policy"] == policy and gap["resolution"] is None
    if policy == "estimate":  # flagged with what the run's measured delivered share suggests
        assert b["billing"]["estimated_delivered_in_unknown"] == pytest.approx(0.1 * 0.405 / 0.8, abs=1e-9)


@pytest.mark.parametrize("resolution,billed_h", [("charge", PAID_H), ("credit", PAID_H - GAP_H),
                                                 ("estimate", PAID_H)])
def test_resolution_overrides_the_policy_and_leaves_measured_lines(sqlite_url, resolution, billed_h):
    eng, info = _ledger(sqlite_url, "hold")
    held = receipt_for(eng, "7001").body
    gap = next(c for c in store.iter_entries(eng, kinds=[Kind.UNKNOWN_INTERVAL]) if c.entry.entry_id == info["gap_id"])
    store.append(eng, [resolution_entry(gap, resolution=resolution, reason="agreed", by="am",
                                        ts="2026-12-02T00:00:00Z")])
    b = receipt_for(eng, "7001").body
    eng.dispose()
    assert _measured(b) == _measured(held)  # raw usage untouched
    [g] = b["unknown_intervals"]
    assert g["resolution"]["as"] == resolution and g["resolution"]["by"] == "am" and g["policy"] == resolution
    assert b["billing"]["unknown_gpu_hours_by_policy"] == {p: (GAP_H if p == resolution else 0.0)
                                                           for p in ("charge", "credit", "estimate", "hold")}
    assert b["totals"]["before_adjustments"]["gpu_hours"] == pytest.approx(billed_h, abs=1e-12)
    delta = Decimal(str(b["totals"]["before_adjustments"]["amount"])) - \
        Decimal(str(held["totals"]["before_adjustments"]["amount"]))
    assert delta == (Decimal(str(billed_h - (PAID_H - GAP_H))) * RATE).quantize(Decimal("0.01"))


def test_granularity_minimum_and_suspended_charging(sqlite_url):
    eng, _ = _ledger(sqlite_url, "charge", billing_granularity_s=3600, charge_suspended=True)
    b = receipt_for(eng, "7001").body
    eng.dispose()
    # 0.9 paid + 0.1 suspended = 1.0 h, already a whole hour
    assert b["totals"]["before_adjustments"]["gpu_hours"] == 1.0 and b["cost"]["billed_before_adjustments"] == 2.0
    assert b["gpu_hours"] == EXPECTED_HOURS


def test_granularity_rounds_up(tmp_path):
    url = f"sqlite:///{tmp_path / 'g.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    eng, _ = _ledger(url, "credit", billing_granularity_s=1800, billing_minimum_s=0)
    b = receipt_for(eng, "7001").body
    eng.dispose()
    assert b["totals"]["before_adjustments"]["gpu_hours"] == 1.0  # 0.8 h -> two half hours up -> 1.0


def test_capex_rate_is_amortisation_plus_energy():
    c = parse_contract({"id": "x", "version": "1", "skus": {"H100-SXM5-80GB": {
        "capex_price": "24000", "capex_years": 4, "capex_residual": "2000", "energy_price_per_kwh": "0.11",
        "pue": 1.3}}})
    rate = c.basis_for("H100-SXM5-80GB").hourly(700)
    assert rate == Decimal(22000) / Decimal(4 * 8760) + Decimal("0.7") * Decimal("1.3") * Decimal("0.11")
    assert c.basis_for("unlisted").hourly(700) == 0  # no default row: priced at zero, never guessed


@pytest.mark.parametrize("text,needle", [
    ('version = "1"', "field 'id' is required"),
    ('id = "a"\nversion = "1"\nunknown_policy = "maybe"', "unknown_policy must be one of"),
    ('id = "a"\nversion = "1"\n[skus.H100]\nrate_per_gpu_hour = -1', "skus.H100.rate_per_gpu_hour must be non-negative"),
    ('id = "a"\nversion = "1"\n[skus.H100]\ncapex_price = 10', "skus.H100.capex_years is required"),
    ('id = "a"\nversion = "1"\nbilling_granularity_s = 0', "billing_granularity_s must be a whole number"),
    ('id = "a"\nversion = "1"\ncurrency = "euros"', "currency must be an ISO 4217 code"),
    ('id = "a"\nversion = ', "not valid TOML"),
])
def test_contract_errors_name_the_file_and_field(tmp_path, text, needle):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ContractError) as exc:
        read_contract(f)
    assert needle in str(exc.value) and str(f) in str(exc.value) and "\n" not in str(exc.value)


def test_contract_cli_set_show_and_selection_by_account(runner, cli, sqlite_url, tmp_path):
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "show", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["default"] is True
    assert json.loads(r.output)["id"] == DEFAULT_CONTRACT.id
    general = tmp_path / "general.toml"
    # in effect before the example's run (2026-11-30): a contract set without effective_from starts now
    general.write_text('id = "general"\nversion = "1"\ncurrency = "EUR"\neffective_from = 2026-11-01\n'
                       '[skus.default]\nrate_per_gpu_hour = "1.5"\n')
    physics = tmp_path / "physics.toml"
    physics.write_text('id = "phys"\nversion = "3"\naccounts = ["physics"]\nunknown_policy = "credit"\n'
                       'effective_from = "2026-11-01T00:00:00Z"\n[skus.H100-SXM5-80GB]\nrate_per_gpu_hour = "2.00"\n')
    for f in (general, physics):
        r = runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(f), "--json"])
        assert r.exit_code == 0 and json.loads(r.output)["recorded"] is True, r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(physics)])
    assert "already recorded" in r.output
    physics.write_text(physics.read_text().replace('"2.00"', '"2.50"'))
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(physics)])
    assert r.exit_code == 1 and "already recorded" in r.output and "new version" in r.output
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "show", "--account", "chem", "--json"])
    assert json.loads(r.output)["id"] == "general"
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "show", "--account", "physics"])
    assert r.exit_code == 0 and "contract phys v3" in r.output and "unknown policy credit" in r.output
    eng = db_mod.make_engine(sqlite_url)
    load_example(eng, with_contract=False, with_adjustment=False)
    b = receipt_for(eng, "7001").body  # account physics -> the physics contract
    eng.dispose()
    assert (b["contract"]["id"], b["contract"]["version"], b["cost"]["currency"]) == ("phys", "3", "USD")
    r = runner.invoke(cli, ["--db", sqlite_url, "contract", "set", str(tmp_path / "missing.toml")])
    assert r.exit_code == 1 and "missing.toml: cannot read" in r.output
