"""The site's ``[carbon]`` settings (ledger.ingest.site.site_carbon) and the receipt's ``carbon`` block they produce.

Who controls the intensity file: the site's operator. Bending it (a lower intensity after the fact) would lower
every tenant's reported carbon; the receipt names the file's version hash, so a changed file makes ``verify``
report the issued receipt as changed, naming the intensity, instead of silently reporting other figures.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ledger.method.skus import SkuError
from ledger.ingest.site import site_carbon

HEAD = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
        "Carbon Intensity gCO₂eq/kWh (LCA),Data Source\n")


def _em_csv(path: Path, start: float, hours: int, g: float, zone: str = "DE") -> Path:
    rows = [f"{datetime.fromtimestamp(start + 3600 * h, timezone.utc):%Y-%m-%d %H:%M:%S},X,X,{zone},"
            f"{g * 0.9},{g},test\n" for h in range(hours)]
    path.write_text(HEAD + "".join(rows), encoding="utf-8")
    return path


def test_zone_of_a_node_before_its_cluster_before_the_default(tmp_path) -> None:
    f = _em_csv(tmp_path / "i.csv", 1767225600.0, 3, 300.0)   # one file, two zones' rows
    f.write_text(f.read_text() + "".join(r.replace(",DE,", ",FR,") for r in f.read_text().splitlines(True)[1:]),
                 encoding="utf-8")
    c = site_carbon({"carbon": {"zone": "DE", "zones": {"hall-b": "FR", "n7": "DE"}, "intensity_file": "i.csv"}},
                    str(tmp_path))
    assert c.zone_for("hall-a", "n1") == "DE" and c.zone_for("hall-b", "n1") == "FR"
    assert c.zone_for("hall-b", "n7") == "DE"
    assert c.table_for("hall-b", None).zone == "FR" and c.tables["DE"].intensity_source == "electricitymaps:lca"
    assert site_carbon({}) is None


@pytest.mark.parametrize("sec, msg", [
    ({"zone": "DE"}, "exactly one of"),
    ({"zone": "DE", "intensity_file": "i.csv", "intensity_constant": 300}, "exactly one of"),
    ({"intensity_constant": 300}, "names no zone"),
    ({"zone": "DE", "intensity_constant": "300"}, "intensity_constant must be a number"),
    ({"zone": "DE", "intensity_constant": -1}, "must be >= 0"),
    ({"zone": "DE", "intensity_file": "missing.csv"}, "missing.csv: carbon.intensity_file cannot be read"),
    ({"zone": "PL", "intensity_file": "i.csv"}, "no intensity for zone 'PL'"),
    ({"zone": "DE", "intensity_file": "i.csv", "column": "best"}, "column must be one of"),
    ({"zone": "DE", "zones": {"a": 3}, "intensity_constant": 1}, "carbon.zones must map"),
])
def test_bad_carbon_settings_are_one_line_errors(tmp_path, sec, msg) -> None:
    _em_csv(tmp_path / "i.csv", 1767225600.0, 3, 300.0)
    with pytest.raises(SkuError, match=msg) as exc:
        site_carbon({"carbon": sec}, str(tmp_path))
    assert "\n" not in str(exc.value)


def test_an_oversized_intensity_file_is_refused(tmp_path, monkeypatch) -> None:
    import ledger.ingest.site as site_mod

    _em_csv(tmp_path / "i.csv", 1767225600.0, 30, 300.0)
    monkeypatch.setattr(site_mod, "INTENSITY_FILE_MAX_BYTES", 100)
    with pytest.raises(SkuError, match="over 100 bytes"):
        site_carbon({"carbon": {"zone": "DE", "intensity_file": "i.csv"}}, str(tmp_path))


# --- end to end: a site with a zone and an intensity file issues receipt 1.4 with the carbon block ---------

def test_receipt_carries_carbon_replays_and_a_changed_file_is_named(tmp_path) -> None:
    from ledger.importers.synth import DEFAULT_START
    from tests.test_receipt_energy import _imported_ledger, _set_measured_terms

    from ledger.cli.main import cli

    url, run, env = _imported_ledger(tmp_path, n_gpus=2, hours=2, cadence=60, jobs="slurm")
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    _em_csv(tmp_path / "intensity.csv", DEFAULT_START - 3600, 6, 400.0)
    cfg = tmp_path / "site.toml"
    cfg.write_text('[carbon]\nzone = "DE"\nintensity_file = "intensity.csv"\n', encoding="utf-8")
    env = {**env, "IPLEDGER_CONFIG": str(cfg)}
    r = run.invoke(cli, ["--db", url, "receipt", "1000", "--json", "--issue"], env=env)
    assert r.exit_code == 0, r.output
    body = json.loads(r.output[r.output.index("{"):])
    c, e = body["carbon"], body["energy"]
    assert body["receipt_version"] == "1.4"
    assert {k: c[k] for k in ("zone", "intensity_source", "pue")} == {
        "zone": "DE", "intensity_source": "electricitymaps:lca", "pue": 1.2}
    assert len(c["intensity_version"]) == 16 and c["hours_without_intensity"] == 0
    # one intensity every hour: kg = kWh x PUE x g / 1000 (the block sums it hour by hour)
    assert c["kg_co2e"] > 0 and abs(c["kg_co2e"] - e["kwh"] * 1.2 * 400.0 / 1000) <= 1e-5
    text = run.invoke(cli, ["--db", url, "receipt", "1000"], env=env).output
    assert f"Carbon: {c['kg_co2e']:.3f} kg CO2e (zone DE, electricitymaps:lca {c['intensity_version']}" in text
    assert run.invoke(cli, ["--db", url, "verify"], env=env).exit_code == 0
    v = run.invoke(cli, ["--db", url, "receipt", "1000", "--verify"], env=env)
    assert v.exit_code == 0 and v.output.startswith("OK"), v.output
    # the operator lowers the intensity afterwards: verify names the change, it does not pass silently
    _em_csv(tmp_path / "intensity.csv", DEFAULT_START - 3600, 6, 100.0)
    v = run.invoke(cli, ["--db", url, "verify"], env=env)
    assert v.exit_code != 0 and f"the carbon intensity changed (issued under DE {c['intensity_version']}" in v.output
    # without a [carbon] section the same run's energy receipt has no carbon block (and the replay names that)
    bare = run.invoke(cli, ["--db", url, "receipt", "1000", "--json"], env={**env, "IPLEDGER_CONFIG": ""})
    assert "carbon" not in json.loads(bare.output) and "energy" in json.loads(bare.output)


def test_pdf_receipt_prints_the_same_energy_and_carbon_lines_as_the_text(tmp_path) -> None:
    import shutil
    import subprocess

    from ledger.cli.main import cli
    from ledger.importers.synth import DEFAULT_START
    from tests.test_receipt_energy import _imported_ledger, _set_measured_terms

    assert shutil.which("pdftotext"), "pdftotext (poppler-utils) is needed to read the PDF back"
    url, run, env = _imported_ledger(tmp_path, n_gpus=1, hours=1, cadence=60, jobs="slurm")
    assert _set_measured_terms(tmp_path, url, run, env).exit_code == 0
    cfg = tmp_path / "site.toml"
    cfg.write_text('[carbon]\nzone = "DE"\nintensity_constant = 350\n', encoding="utf-8")
    env = {**env, "IPLEDGER_CONFIG": str(cfg)}
    text = run.invoke(cli, ["--db", url, "receipt", "1000"], env=env).output
    pdf = tmp_path / "r.pdf"
    r = run.invoke(cli, ["--db", url, "receipt", "1000", "--format", "pdf", "--out", str(pdf)], env=env)
    assert r.exit_code == 0, r.output
    got = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    squash = " ".join(got.split())
    lines = [ln for ln in text.splitlines() if ln.startswith(("Energy:", "Energy cost", "Carbon:"))]
    assert len(lines) == 3, text
    for line in lines:
        assert " ".join(line.split()) in squash, line
    assert "constant: site constant" in squash
