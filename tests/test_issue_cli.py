"""`ipledger issue`: bulk issuing of closed runs' receipts (idempotent, per month, open runs on request),
receipts issued by an import for the runs it closes, and the import path a new user takes: a 24-hour
Prometheus export of a 4-node fleet with ``namespace`` and ``hpc_job`` labels -> ``issue --all`` -> the
November statement."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from ledger.importers import synth

NOV30 = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc).timestamp()
METRICS = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED",
           "DCGM_FI_DEV_POWER_USAGE")
TENANT_OF_JOB = {"1000": "astro", "1001": "bio"}


def write_export(d: Path) -> Path:
    """8 GPUs on 4 nodes (2 each) over [2026-11-30T00:00Z, 2026-12-01T00:00Z) at 5 minutes; jobs 1000 and
    1001 (``hpc_job``) in namespaces astro and bio, as one query_range response per metric."""
    d.mkdir(parents=True, exist_ok=True)
    by_metric: dict[str, list] = {}
    for labels, pts in synth.series(n_gpus=8, hours=24, cadence=300, start=NOV30, jobs="slurm", node_gpus=2,
                                    metrics=METRICS):
        metric = dict(labels, namespace=TENANT_OF_JOB[labels["hpc_job"]], pod=f"job-{labels['hpc_job']}")
        by_metric.setdefault(labels["__name__"], []).append(
            {"metric": metric, "values": [[t, v] for t, v in pts]})
    for name, result in by_metric.items():
        (d / f"{name}.json").write_text(json.dumps(
            {"status": "success", "data": {"resultType": "matrix", "result": result}}))
    return d


def _invoke(runner, cli, *args):
    res = runner.invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture()
def imported(tmp_path, runner, cli, monkeypatch):
    """A SQLite ledger holding the telemetry import (automatic receipts off, so `issue` does the issuing)."""
    monkeypatch.setenv("IPLEDGER_AUTO_RECEIPTS", "0")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _invoke(runner, cli, "--db", url, "init")
    _invoke(runner, cli, "--db", url, "import", "prometheus", str(write_export(tmp_path / "export")), "--quiet",
            "--cluster", "lab")
    return url


def test_issue_all_is_idempotent_and_the_november_statement_has_the_gpu_hours(imported, runner, cli):
    url = imported
    first = json.loads(_invoke(runner, cli, "--db", url, "issue", "--all", "--json", "--quiet").output)
    assert first["runs"] == 2 and first["issued"] == 2 and first["failed"] == []
    again = json.loads(_invoke(runner, cli, "--db", url, "issue", "--all", "--json", "--quiet").output)
    assert again == {**first, "issued": 0, "unchanged": 2}
    # every run of the export lies in November (its window ends at the instant December begins)
    dec = json.loads(_invoke(runner, cli, "--db", url, "issue", "--month", "2026-12", "--json").output)
    assert dec["runs"] == 0
    nov = json.loads(_invoke(runner, cli, "--db", url, "export", "monthly", "--month", "2026-11", "--format",
                             "json", "--out", "-", "--quiet").output)
    assert nov["totals"]["runs"] == 2
    # 2 jobs x 4 GPUs x 24 h, give or take the first and last sample's edges
    assert nov["totals"]["paid"] == pytest.approx(8 * 24, rel=0.01)
    empty = json.loads(_invoke(runner, cli, "--db", url, "export", "monthly", "--month", "2026-12", "--format",
                               "json", "--out", "-", "--quiet").output)
    assert empty["empty"] and empty["totals"]["runs"] == 0


def test_november_statement_has_each_namespace_as_a_tenant(imported, runner, cli):
    """Tenants come from the ``namespace`` label on ``hpc_job`` runs."""
    url = imported
    _invoke(runner, cli, "--db", url, "issue", "--all", "--quiet")
    nov = json.loads(_invoke(runner, cli, "--db", url, "export", "monthly", "--month", "2026-11", "--format",
                             "json", "--out", "-", "--quiet").output)
    by_tenant = {t["tenant"]: t for t in nov["tenants"]}
    assert set(by_tenant) == {"astro", "bio"}
    for t in by_tenant.values():
        assert t["runs"] == 1 and t["paid"] == pytest.approx(4 * 24, rel=0.01)
        assert t["paid"] >= t["delivered"] > 0


def test_import_issues_the_receipts_of_the_runs_it_closes(tmp_path, runner, cli, monkeypatch):
    monkeypatch.delenv("IPLEDGER_AUTO_RECEIPTS", raising=False)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _invoke(runner, cli, "--db", url, "init")
    out = json.loads(_invoke(runner, cli, "--db", url, "import", "prometheus",
                             str(write_export(tmp_path / "export")), "--quiet", "--json").output)
    assert out["receipts"]["issued"] == out["runs"] == 2
    again = json.loads(_invoke(runner, cli, "--db", url, "issue", "--all", "--json").output)
    assert again["unchanged"] == 2 and again["issued"] == again["reissued"] == 0


@pytest.mark.parametrize("args,why", [((), "exactly one of"), (("--all", "--month", "2026-11"), "exactly one of"),
                                      (("--month", "9999-12"), "out of range"),
                                      (("--month", "2026-13"), "expected YYYY-MM")])
def test_issue_refuses_bad_arguments_in_one_line(args, why, runner, cli, sqlite_url):
    res = runner.invoke(cli, ["--db", sqlite_url, "issue", *args])
    assert res.exit_code != 0 and why in res.output and res.output.strip().count("\n") == 0, res.output


def test_issue_help_has_an_example(runner, cli):
    res = _invoke(runner, cli, "issue", "--help")
    assert "ipledger issue --all" in res.output


def test_open_run_is_issued_as_accrued_usage_then_corrected_when_it_closes(sqlite_url, runner, cli):
    """A run open across the month end: `issue --open` bills its usage so far in both months; its close
    re-issues it, and the statements correct the months whose parts changed."""
    from ledger.chain import db as db_mod
    from ledger.chain import store
    from ledger.chain.entries import Kind, make_entry
    from ledger.telemetry.model import Sample
    from ledger.telemetry.sealed import segment_entry, write_segment

    eng = db_mod.make_engine(sqlite_url)
    key = dict(cluster="hpc1", job_id="77", run=0)
    t0 = NOV30 + 22 * 3600  # Nov 30 22:00
    store.append(eng, [make_entry(Kind.ALLOCATION_STARTED, t0, {"account": "astro"}, node="n1", **key),
                       make_entry(Kind.DEVICE_BOUND, t0, {"index": 0, "sku": "NVIDIA H100 80GB HBM3"},
                                  device="GPU-77", node="n1", **key)])

    def telemetry(a: float, b: float) -> None:
        s = [Sample(device="GPU-77", t=t, dt=60.0, clock_reasons=0, sm_active=0.8, gpu_util=0.9,
                    sm_clock_mhz=1980.0, compute_procs=1.0, fb_used_mib=4e4) for t in range(int(a), int(b), 60)]
        write_segment(eng, s, segment_entry(s, node="n1", source="test"))

    telemetry(t0, t0 + 4 * 3600)  # telemetry through Dec 1 02:00, the run still open
    db = ["--db", sqlite_url]
    assert json.loads(_invoke(runner, cli, *db, "issue", "--all", "--json").output)["runs"] == 0
    first = json.loads(_invoke(runner, cli, *db, "issue", "--month", "2026-11", "--open", "--json").output)
    assert first["issued"] == 1

    def paid(month: str) -> tuple[float, int]:
        """(astro's paid GPU-hours, correction rows) of the month's statement."""
        j = json.loads(_invoke(runner, cli, *db, "export", "monthly", "--month", month, "--format", "json",
                               "--out", "-", "--quiet").output)
        return sum(r["paid"] for r in j["tenants"] if r["tenant"] == "astro"), j["totals"]["corrections"]

    assert paid("2026-11")[0] == pytest.approx(2.0, abs=0.02)  # accrued: Nov 30 22:00-24:00
    assert paid("2026-12")[0] == pytest.approx(2.0, abs=0.02)  # Dec 1 00:00-02:00 so far
    telemetry(t0 + 4 * 3600, t0 + 6 * 3600)
    store.append(eng, [make_entry(Kind.ALLOCATION_ENDED, t0 + 6 * 3600, {"exit_code": 0}, node="n1", **key)])
    again = json.loads(_invoke(runner, cli, *db, "issue", "--all", "--json").output)
    assert again["reissued"] == 1
    # November had closed when the run ended: it keeps its accrued part; the parts of both months changed,
    # so December carries December's new part and a correction of November's
    (nov, _), (dec, dec_corrections) = paid("2026-11"), paid("2026-12")
    assert nov == pytest.approx(2.0, abs=0.02) and dec_corrections >= 1
    assert nov + dec == pytest.approx(6.0, abs=0.02)
    eng.dispose()


def test_a_broken_site_config_skips_the_imports_receipts_with_a_warning(tmp_path, runner, cli, monkeypatch):
    bad = tmp_path / "config.toml"
    bad.write_text("auto_receipts = [\n")
    monkeypatch.setenv("IPLEDGER_CONFIG", str(bad))
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    _invoke(runner, cli, "--db", url, "init")
    res = _invoke(runner, cli, "--db", url, "import", "prometheus", str(write_export(tmp_path / "export")),
                  "--quiet")
    assert "warning: receipts not issued" in res.output and str(bad) in res.output
    monkeypatch.delenv("IPLEDGER_CONFIG")
    assert json.loads(_invoke(runner, cli, "--db", url, "issue", "--all", "--json").output)["issued"] == 2
