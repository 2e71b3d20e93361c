"""The demo hall: a simulated fleet with known faults, end to end (docs/demo.md).

``run_demo(out, seed)`` simulates a week of a GPU hall (ledger.sim), writes it as the real parts would (hooks'
entries through the spool and ``ship``; the collector's sealed sample segments), records a contract, issues
receipts, runs the four agents, records their findings, writes the ground truth beside them, a Prometheus
``query_range`` export of one day of two racks (for ``ipledger analyze``), and whatever reports exist.
Deterministic for a seed: same seed, same ledger entries, findings and truth.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..chain import db as db_mod
from ..chain.contracts import contract_entry, parse_contract
from . import FleetSpec, simulate
from .write import write_ledger, write_prometheus_export

# Energy is its own line, priced from the devices' counters (energy_basis = "measured"; TDP pricing beside it)
_ENERGY_TERMS = {"energy_price_per_kwh": "0.18", "pue": 1.25, "energy_basis": "measured"}
DEMO_CONTRACT = {
    "id": "demo-hall", "version": "2026-11", "currency": "USD",
    "skus": {"H100-SXM5-80GB": {"rate_per_gpu_hour": "2.50", **_ENERGY_TERMS},
             "MI300X": {"rate_per_gpu_hour": "2.20", **_ENERGY_TERMS},
             "default": {"rate_per_gpu_hour": "2.00", **_ENERGY_TERMS}},
    "unknown_policy": "hold", "effective_from": "2026-11-01T00:00:00Z",
}
# The demo site's grid zone and its carbon intensity: an ILLUSTRATIVE hourly file in Electricity Maps' export
# shape, shipped beside the simulator (its .source.txt says how it was written). Copied into the output with a
# site.toml naming it, so `ipledger --config demo-out/site.toml ...` replays the receipts' carbon blocks.
DEMO_INTENSITY = Path(__file__).with_name("carbon-intensity-DE-2026-11.csv")
DEMO_SITE_TOML = ('# the demo site: its grid zone and an illustrative carbon-intensity file (not real grid data)\n'
                  '[carbon]\nzone = "DE"\nintensity_file = "carbon-intensity-DE-2026-11.csv"\n')


def write_demo_site(out: Path):  # noqa: ANN201 - a ledger.ingest.site.Site
    """Write ``out/site.toml`` and the intensity file beside it; the site they describe (its ``[carbon]``)."""
    import shutil

    from ..base.config import load
    from ..ingest.site import site_from_config

    shutil.copyfile(DEMO_INTENSITY, out / DEMO_INTENSITY.name)
    (out / "site.toml").write_text(DEMO_SITE_TOML, encoding="utf-8")
    return site_from_config(load(str(out / "site.toml"), environ={}), db=f"sqlite:///{out / 'ledger.db'}",
                            environ={})


def _contract_entries() -> list:
    return [contract_entry(parse_contract(DEMO_CONTRACT, "demo contract"), "2026-11-01T00:00:00Z")]


def _receipts(engine, out: Path, sim, carbon=None, files: int = 12) -> tuple[int, list[str]]:  # noqa: ANN001
    """Issue every run's receipt (receipt_issued entries) under the site's ``carbon`` settings; write those of
    faulty and a few healthy jobs as files."""
    from ..receipts import issue_receipt

    show = {(j.job_id, j.run) for j in ([j for j in sim.jobs if j.tags][:files // 2] +
                                        [j for j in sim.jobs if not j.tags][:files // 2])}
    issued, written = 0, []
    rdir = out / "receipts"
    rdir.mkdir(exist_ok=True)
    for j in sim.jobs:
        try:
            body = issue_receipt(engine, j.job_id, run=j.run, cluster=sim.spec.cluster, carbon=carbon).receipt.body
        except Exception as exc:  # a receipt failure must not stop the demo; it is reported  # noqa: BLE001
            written.append(f"receipt {j.job_id}/{j.run} failed: {exc}")
            continue
        issued += 1
        if (j.job_id, j.run) in show:
            p = rdir / f"receipt-{j.job_id}-run{j.run}.json"
            p.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
            written.append(str(p))
    return issued, written


def _reports(engine, out: Path, analysis) -> list[str]:  # noqa: ANN001
    """The analysis PDF and the month's statement; each failure is reported, not fatal."""
    from reports import analysis_pdf
    from reports.export import build_statement, default_name, write

    done = []
    try:
        p = out / "analysis.pdf"
        analysis_pdf.render(analysis.to_json(), p)
        done.append(str(p))
    except Exception as exc:  # noqa: BLE001
        done.append(f"analysis.pdf failed: {exc}")
    try:
        st = build_statement(engine, "2026-11")
        for fmt in ("csv", "focus", "pdf"):
            done.append(str(write(st, fmt, out / default_name("2026-11", fmt, None))))
    except Exception as exc:  # noqa: BLE001
        done.append(f"monthly statement failed: {exc}")
    return done


@dataclass
class Hall:
    """A built demo hall: its simulation (with ground truth), ledger engine and the agents' analysis."""

    sim: object
    engine: object
    analysis: object
    counts: dict
    db_path: Path


def build_hall(out: Path, seed: int = 0, spec: FleetSpec | None = None) -> Hall:
    """Simulate and fill a fresh SQLite ledger in ``out``; run the agents and record their findings."""
    from .. import agents

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    db_path = out / "ledger.db"
    for p in (db_path, out / "ledger.db-wal", out / "ledger.db-shm"):
        if p.exists():
            p.unlink()
    spool_dir = out / "spool"
    if spool_dir.exists():
        import shutil
        shutil.rmtree(spool_dir)
    spec = spec or FleetSpec()
    sim = simulate(spec, seed)
    engine = db_mod.make_engine(f"sqlite:///{db_path}")
    db_mod.upgrade(engine)
    counts = write_ledger(engine, sim, spool_dir, extra_entries=_contract_entries())
    analysis = agents.analyze(engine)
    agents.record(engine, analysis.findings)
    return Hall(sim, engine, analysis, counts, db_path)


def write_imported_export(sim, path: Path) -> dict:  # noqa: ANN001 - a Simulation
    """telemetry-export material: one day of two racks (R2, R3; the cooling incident starts 6 h in) as a Prometheus export."""
    spec = sim.spec
    steps_day = 86400 // spec.cadence_s
    cool = next(f for f in sim.truth["faults"] if f["id"] == "F-cooling")
    start_step = max(0, int((cool["start"] - sim.t[0]) // spec.cadence_s) - steps_day // 4)
    start_step = min(start_step, len(sim.t) - steps_day)
    nodes = sorted({d.node for d in sim.devices if d.rack in ("R2", "R3")})
    return write_prometheus_export(sim, path, nodes, start_step, steps_day)


DEMO_STEPS = ("simulate the hall and fill its ledger", "write the Prometheus export", "issue the receipts",
              "verify the ledger", "write the reports")


def run_demo(out: Path, seed: int = 0, spec: FleetSpec | None = None,
             step: Callable[[str], None] | None = None) -> dict:
    """The demo end to end; ``step`` is told each of :data:`DEMO_STEPS` as it starts (a progress bar)."""
    t0 = time.monotonic()
    out = Path(out)
    spec = spec or FleetSpec()
    tell = step or (lambda _what: None)
    tell(DEMO_STEPS[0])
    hall = build_hall(out, seed, spec)
    sim, engine, analysis = hall.sim, hall.engine, hall.analysis
    tell(DEMO_STEPS[1])
    prom = write_imported_export(sim, out / "prometheus-export.json")
    tell(DEMO_STEPS[2])
    site = write_demo_site(out)
    issued, receipts = _receipts(engine, out, sim, carbon=site.carbon)
    from ..receipts.auto import verify_checks
    from ..chain.verify import verify
    tell(DEMO_STEPS[3])
    report = verify(engine, checks=verify_checks(site))
    (out / "ground-truth.json").write_text(json.dumps(sim.truth, indent=2, sort_keys=True) + "\n")
    (out / "findings.json").write_text(json.dumps(analysis.to_json(), indent=2, sort_keys=True) + "\n")
    tell(DEMO_STEPS[4])
    reports = _reports(engine, out, analysis)
    with engine.connect() as conn:
        n_entries = conn.exec_driver_sql("SELECT count(*) FROM entries").scalar()
    engine.dispose()
    found = {f.kind for f in analysis.findings}
    return {"out": str(out), "ledger": str(hall.db_path), "seed": seed, "devices": len(sim.devices),
            "jobs": len(sim.jobs), "entries": int(n_entries), "samples": hall.counts["samples"],
            "faults_injected": len(sim.truth["faults"]), "findings": len(analysis.findings),
            "finding_kinds": sorted(found), "verified": report.ok, "ground_truth": str(out / "ground-truth.json"),
            "findings_json": str(out / "findings.json"), "prometheus_export": prom["path"],
            "receipts_issued": issued, "receipt_files": str(out / "receipts"), "site_config": str(out / "site.toml"),
            "receipt_errors": [r for r in receipts if not r.endswith(".json")][:3], "reports": reports,
            "paid_gpu_hours": analysis.account["paid"], "delivered_gpu_hours": analysis.account["delivered"],
            "seconds": round(time.monotonic() - t0, 1)}
