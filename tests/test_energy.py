"""Energy from counter deltas (ledger.method.energy): invariants drawn by hypothesis against a known truth.

Each case draws a run's readings and the energy each span truly drew, then writes the counter the way a
device would: random resets (the counter restarts from zero), wraps at the counter's modulus and unit changes
(a DCGM / dcgm-exporter upgrade from mJ to J mid-run). The energy read back equals the truth to 1e-6 kWh.
A reset is drawn only where the counter visibly falls (one that lands above the last reading cannot be told
from counting, in any reader), and not within 2 kW x span of the modulus (there it reads as a wrap).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.method.energy import (AMD_MI300_UNIT, J_PER_KWH, MJ, CounterReading, EnergyUnitError, PowerSample,
                                  by_bucket, device_energy, joules_per_count)

TOL_KWH = 1e-6


@st.composite
def counter_cases(draw):
    n = draw(st.integers(2, 40))
    gaps = draw(st.lists(st.floats(1.0, 120.0), min_size=n - 1, max_size=n - 1))
    watts = draw(st.lists(st.floats(0.0, 1000.0), min_size=n - 1, max_size=n - 1))
    mode = draw(st.sampled_from(["units", "wrap"]))
    ts = [1_700_000_000.0]
    for g in gaps:
        ts.append(ts[-1] + g)
    truth = [w * g for w, g in zip(watts, gaps)]
    unit = draw(st.sampled_from([MJ, 1.0, AMD_MI300_UNIT]))
    # at most one wrap per span (more cannot be seen in any reader): 2^32 counts of 15.259 uJ are only 65 kJ
    modulus = float(2 ** 32 if unit >= MJ else 2 ** 48) if mode == "wrap" else None
    count = draw(st.floats(0.0, (modulus or 1e12) - 1)) if mode == "wrap" else draw(st.floats(0.0, 1e12))
    if mode == "units":
        count = count * MJ / unit   # keep the since-boot joules in a realistic range whatever the unit
    readings = [CounterReading(ts[0], count, unit, modulus)]
    for i, e in enumerate(truth):
        event = draw(st.sampled_from(["none", "none", "reset", "unit"]))
        # a reset shows only where the counter falls, and one near the modulus reads as a wrap: drawn elsewhere
        if event == "reset" and e / unit < count and not (modulus and count > modulus - 2000 * gaps[i] / unit):
            count = e / unit     # restarted at zero just after the last reading, then counted this span
        elif event == "unit" and mode == "units":
            new_unit = draw(st.sampled_from([MJ, 1.0, AMD_MI300_UNIT]))
            count = (count * unit + e) / new_unit
            unit = new_unit
        else:
            count = count + e / unit
            if modulus:
                count = count % modulus
        readings.append(CounterReading(ts[i + 1], count, unit, modulus))
    return readings, truth


def test_a_unit_change_that_rounds_the_count_down_is_not_a_reset() -> None:
    # 243.0019... J read in J, then the same joules in mJ: 243001.911... x 0.001 is a few ulps less. Read as a
    # fall, the whole counter (243 J) was counted again as used after a reset (hypothesis found it).
    readings = [CounterReading(1_700_000_000.0, 0.0, MJ), CounterReading(1_700_000_001.0, 243.0019112037084, 1.0),
                CounterReading(1_700_000_002.0, 243001.91120370838, MJ)]
    assert readings[2].count * MJ < readings[1].count   # the rounding this is about
    de = device_energy("GPU-0", readings, readings[0].t, readings[-1].t)
    assert abs(de.kwh - 243.0019112037084 / J_PER_KWH) <= TOL_KWH
    assert [s.cause for s in de.spans] == ["", ""]


@settings(max_examples=150, deadline=None)
@given(counter_cases())
def test_counter_deltas_equal_the_truth(case) -> None:
    readings, truth = case
    de = device_energy("GPU-0", readings, readings[0].t, readings[-1].t)
    assert abs(de.kwh - sum(truth) / J_PER_KWH) <= TOL_KWH
    assert de.unknown_seconds == 0
    assert all(s.source == "counter" for s in de.spans)
    for span, e in zip(de.spans, truth):
        assert span.joules is not None and abs(span.joules - e) / J_PER_KWH <= TOL_KWH


@settings(max_examples=100, deadline=None)
@given(st.integers(3, 30), st.floats(10.0, 900.0), st.sets(st.integers(0, 28), min_size=1))
def test_a_frozen_counter_falls_back_to_the_power_integral(n, watts, frozen) -> None:
    ts = [1_000.0 + 30.0 * i for i in range(n)]
    frozen = {i % (n - 1) for i in frozen}
    count, readings = 5e9, [CounterReading(ts[0], 5e9, MJ)]
    for i in range(n - 1):
        if i not in frozen:
            count += watts * 30.0 / MJ
        readings.append(CounterReading(ts[i + 1], count, MJ))
    power = [PowerSample(t, watts) for t in ts]
    de = device_energy("GPU-0", readings, ts[0], ts[-1], power)
    assert abs(de.kwh - watts * 30.0 * (n - 1) / J_PER_KWH) <= TOL_KWH
    flagged = [s for s in de.spans if s.source == "power_integral"]
    assert len(flagged) == len(frozen) and all(s.cause == "frozen_counter" for s in flagged)
    assert {round((s.start - ts[0]) / 30.0) for s in flagged} == frozen
    assert de.source == ("power_integral" if len(frozen) == n - 1 else "mixed")


def test_a_still_counter_with_no_power_is_idle_not_frozen() -> None:
    rs = [CounterReading(0.0, 7.0, 1.0), CounterReading(60.0, 7.0, 1.0)]
    de = device_energy("GPU-0", rs, 0.0, 60.0, [PowerSample(0.0, 0.0), PowerSample(60.0, 0.0)])
    assert de.spans[0].source == "counter" and de.joules == 0.0


@given(st.floats(1.0, 1e6))
def test_nothing_measured_is_unknown_never_zero_or_tdp(length) -> None:
    de = device_energy("GPU-0", [], 0.0, length, [])
    assert [(s.joules, s.source, s.cause) for s in de.spans] == [(None, "unknown", "no_counter+no_power")]
    assert de.unknown_seconds == length and de.source == "unknown"


def test_edges_outside_the_readings_use_power_or_are_unknown() -> None:
    rs = [CounterReading(100.0, 0.0, 1.0), CounterReading(200.0, 30_000.0, 1.0)]
    de = device_energy("GPU-0", rs, 0.0, 300.0, [PowerSample(0.0, 200.0), PowerSample(100.0, 200.0)])
    assert [(s.source, s.cause) for s in de.spans] == [
        ("power_integral", "before_first_reading"), ("counter", ""), ("unknown", "after_last_reading+no_power")]
    assert de.joules == 200.0 * 100 + 30_000.0 and de.unknown_seconds == 100.0


@settings(max_examples=100, deadline=None)
@given(counter_cases(), st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["delivered", "idle", "suspended"])),
                                 max_size=6))
def test_buckets_add_up_to_the_device(case, cuts) -> None:
    readings, _ = case
    t0, t1 = readings[0].t, readings[-1].t
    edges = sorted({t0 + f * (t1 - t0) for f, _ in cuts} | {t0, t1})
    buckets = [(a, b, name) for (a, b), (_, name) in zip(zip(edges, edges[1:]), cuts)]
    de = device_energy("GPU-0", readings, t0, t1)
    be = by_bucket(de.spans, buckets)
    assert abs(sum(be.kwh.values()) - de.kwh) <= TOL_KWH
    assert all(v >= 0 for v in be.kwh.values())


def test_units_follow_the_field_id_never_a_version() -> None:
    # field 156 is mJ in every DCGM / dcgm-exporter version; DCGM 4.7's joule counter is its own field, 1611
    for source in ("dcgm", "dmon", "dcgm-exporter"):
        assert joules_per_count(source, 156) == MJ and joules_per_count(source) == MJ
        assert joules_per_count(source, 1611) == 1.0
    assert joules_per_count("nvml") == MJ and joules_per_count("nvidia-smi") == MJ
    assert joules_per_count("amd-smi") == AMD_MI300_UNIT
    assert joules_per_count("amd-smi", resolution_uj=15.3) == pytest.approx(15.3e-6)
    with pytest.raises(EnergyUnitError, match="field 155 is not an energy counter"):
        joules_per_count("dcgm", 155)
    with pytest.raises(EnergyUnitError, match="no known"):
        joules_per_count("ipmi")


# --- contract terms: energy_basis, energy_price_per_kwh and pue (ledger.chain.contracts) ---------------------------

from decimal import Decimal  # noqa: E402

from ledger.chain.contracts import ContractError, parse_contract  # noqa: E402


def _contract(**sku):
    return parse_contract({"id": "c", "version": "1", "skus": {"H100": sku}}, "c.toml")


def test_measured_energy_is_its_own_line_with_tdp_beside_it() -> None:
    c = _contract(capex_price="24000", capex_years=4, energy_price_per_kwh="0.20", pue=1.5, energy_basis="measured")
    b = c.basis_for("H100")
    assert b.hourly(700.0) == Decimal(24000) / (4 * 8760)      # the rate holds no energy
    line = b.energy_cost(Decimal("2.0"), 700.0, Decimal(10))
    assert line == {"basis": "measured", "charged": Decimal("0.600"), "measured": Decimal("0.600"),
                    "tdp": Decimal("2.1000")}
    assert b.energy_cost(None, 700.0, Decimal(10))["basis"] == "tdp_fallback"
    assert parse_contract(c.to_payload(), "payload") == c        # the payload carries the basis


def test_contracts_without_the_option_keep_their_payload_and_price() -> None:
    old = _contract(capex_price="24000", capex_years=4, energy_price_per_kwh="0.11", pue=1.3)
    assert "energy_basis" not in old.to_payload()["skus"]["H100"]
    b = old.basis_for("H100")
    assert b.hourly(700.0) == Decimal(24000) / (4 * 8760) + Decimal("0.7") * Decimal("1.3") * Decimal("0.11")
    rental = _contract(rate_per_gpu_hour="2.50", energy_price_per_kwh="0.11")   # ignored without a basis
    assert rental.to_payload()["skus"]["H100"] == {"rate_per_gpu_hour": "2.50"}
    beside = _contract(rate_per_gpu_hour="2.50", energy_price_per_kwh="0.11", energy_basis="measured")
    assert beside.to_payload()["skus"]["H100"] == {"rate_per_gpu_hour": "2.50", "energy_price_per_kwh": "0.11",
                                                   "energy_basis": "measured"}


def test_a_bad_energy_basis_is_a_one_line_error() -> None:
    with pytest.raises(ContractError, match=r"c.toml: skus.H100.energy_basis must be one of measured, tdp"):
        _contract(rate_per_gpu_hour="1", energy_basis="guess")


def test_a_dcgm_job_record_of_zero_joules_with_power_is_the_power_integral() -> None:
    """The real `dcgmi stats -v -j` of tests/fixtures/dcgmi_stats (DCGM 2.x, V100): Energy Consumed 0 J
    while Power Usage averages 37.9 W over the 48-second job."""
    from pathlib import Path

    from ledger.method.energy import summary_energy
    from ledger.capture.sources.dcgm import parse_stats

    text = (Path(__file__).parent / "fixtures" / "dcgmi_stats" / "dcgmi_stats_x_then_v_j_1gpu_uberprof.txt")
    report = parse_stats(text.read_text(encoding="utf-8"))
    gpu = next(b for b in report.blocks if b.gpu_id == 0)
    assert gpu.values["energy_j"] == 0
    de = summary_energy("gpu0", gpu.values["energy_j"], gpu.values.get("power_w_avg"), gpu.start, gpu.end)
    (span,) = de.spans
    assert (span.source, span.cause) == ("power_integral", "job_record_zero")
    assert span.joules == pytest.approx(37.8985 * (gpu.end - gpu.start))
    assert summary_energy("g", 1234.0, 40.0, 0.0, 60.0).spans[0].source == "job_record"
    assert summary_energy("g", None, None, 0.0, 60.0).spans[0].joules is None
