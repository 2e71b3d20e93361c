"""Carbon from energy (ledger.method.carbon): the intensity files sites have, and kg CO2e by the hour."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.method.carbon import (LBS_PER_MWH_TO_G_PER_KWH, IntensityError, carbon, constant_intensity,
                                  hourly_kwh, parse_intensity)
from ledger.method.energy import J_PER_KWH, EnergySpan

FIX = Path(__file__).parent / "fixtures" / "carbon"


def _em() -> str:
    return (FIX / "electricitymaps_DE_hourly.csv").read_text(encoding="utf-8")


def test_electricity_maps_export_lca_and_direct() -> None:
    lca, direct = parse_intensity(_em(), "DE"), parse_intensity(_em(), "DE", column="direct")
    assert lca.intensity_source == "electricitymaps:lca" and direct.intensity_source == "electricitymaps:direct"
    assert len(lca.hourly) == 5          # the blank hour is no figure, not zero
    first = min(lca.hourly)
    assert first % 3600 == 0 and lca.hourly[first] == 418.9 and direct.hourly[first] == 371.2
    assert lca.version == direct.version and len(lca.version) == 16
    assert parse_intensity(_em().replace("418.9", "418.8"), "DE").version != lca.version


def test_watttime_moer_in_lbs_per_mwh() -> None:
    t = parse_intensity((FIX / "watttime_CAISO_NORTH.csv").read_text(encoding="utf-8"), "CAISO_NORTH")
    hours = sorted(t.hourly)
    assert t.intensity_source == "watttime:moer" and len(hours) == 2
    assert t.hourly[hours[0]] == pytest.approx(910.0 * LBS_PER_MWH_TO_G_PER_KWH)


@pytest.mark.parametrize("text, msg", [
    ("a,b\n1,2\n", "neither an Electricity Maps"),
    ("Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (LCA)\nnot a time,DE,3\n", "row 2: time"),
    ("Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (LCA)\n2026-01-01 00:00:00,DE,-3\n", "must be >= 0"),
    ("Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (LCA)\n2026-01-01 00:00:00,FR,3\n", "no intensity for zone"),
])
def test_bad_files_are_one_line_errors(text, msg) -> None:
    with pytest.raises(IntensityError, match=msg) as e:
        parse_intensity(text, "DE", origin="site.toml intensity_file")
    assert "\n" not in str(e.value) and str(e.value).startswith("site.toml intensity_file")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 7200), st.floats(0, 1e7)), min_size=1, max_size=20),
       st.floats(1.0, 2.0), st.floats(0, 900))
def test_kg_is_hourly_kwh_times_pue_times_intensity(parts, pue, g) -> None:
    t, spans = 1_700_000_123.0, []
    for length, joules in parts:
        spans.append(EnergySpan(t, t + length, joules, "counter"))
        t += length
    by_hour = hourly_kwh(spans)
    assert sum(by_hour.values()) == pytest.approx(sum(j for _, j in parts) / J_PER_KWH, rel=1e-9, abs=1e-12)
    c = carbon(by_hour, constant_intensity("DE", g, "site figure"), pue)
    assert c.kg_co2e == pytest.approx(sum(j for _, j in parts) / J_PER_KWH * pue * g / 1000, rel=1e-9, abs=1e-12)
    assert c.intensity_source == "constant: site figure" and c.hours_without_intensity == 0


def test_hours_without_a_figure_are_counted_not_guessed() -> None:
    table = parse_intensity(_em(), "DE")
    first = min(table.hourly)
    blank = first + 4 * 3600
    assert blank not in table.hourly
    c = carbon({first: 2.0, blank: 5.0}, table, 1.25)
    assert c.kg_co2e == pytest.approx(2.0 * 1.25 * 418.9 / 1000) and c.hours_without_intensity == 1
    assert (c.zone, c.intensity_version, c.pue) == ("DE", table.version, 1.25)
