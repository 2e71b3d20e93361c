"""The hook records what it saw; ship derives what it means (ledger.capture.sources.observed).

The spool holds the vendor tools' raw answers (``tool_output``) and no measurement the hook parsed; shipping
adds the derived summaries and gaps beside the evidence; and the receipt of the run is the one the same
observations gave when the hook parsed them itself (the entries the former hook wrote, shipped instead).
"""

from __future__ import annotations

import json

from ledger.chain.entries import entry_from_record, make_entry
from ledger.capture.hooks import run
from ledger.capture.hooks.records import entry_record, spool_line
from ledger.capture.sources import observed
from tests.standins import make_site
from tests.test_hooks import env


def _records(spool) -> list[dict]:
    return [json.loads(ln) for f in sorted(spool.glob("*.jsonl")) for ln in f.read_text().splitlines()]


def _job(site, job: str) -> None:
    assert run("prolog", env(job), str(site.config)) == 0
    assert run("epilog", env(job, SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_EXIT_CODE2="0:0"),
               str(site.config)) == 0


def _receipt(runner, cli, spool, db: str, job: str) -> dict:
    assert runner.invoke(cli, ["--db", db, "init"]).exit_code == 0
    shipped = runner.invoke(cli, ["--db", db, "ship", "--spool", str(spool), "--no-receipts", "--json"])
    assert shipped.exit_code == 0, shipped.output
    r = runner.invoke(cli, ["--db", db, "receipt", job, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _figures(receipt: dict) -> dict:
    """A receipt without what names ledger positions and entry ids (the two ledgers hold different entries)."""
    out = {k: v for k, v in receipt.items() if k not in ("ledger", "receipt_hash", "unknown_intervals")}
    out["unknown_intervals"] = [{k: v for k, v in iv.items() if k != "id"} for iv in receipt["unknown_intervals"]]
    return out


def test_the_hook_spools_raw_tool_output_and_ship_derives_the_same_receipt(tmp_path, runner, cli):
    site = make_site(tmp_path / "site", hooks={"gap_tolerance_s": 15.0}, timeout=3.0)
    _job(site, "81")
    site.control(restart=True)  # DCGM forgets the next job: its gaps come from the evidence too
    assert run("prolog", env("82"), str(site.config)) == 0
    site.control(restart=True)
    assert run("epilog", env("82", SLURM_SCRIPT_CONTEXT="epilog_slurmd", SLURM_JOB_EXIT_CODE2="0:0"),
               str(site.config)) == 0
    recs = _records(site.spool)
    kinds = {r["kind"] for r in recs}
    assert "tool_output" in kinds and "telemetry_summary" not in kinds, "the hook parses no measurement"
    (obs,) = [r for r in recs if r["kind"] == "tool_output" and r["job_id"] == "81"]
    calls = json.loads(obs["payload"])["calls"]
    assert [c["args"][:2] for c in calls] == [["stats", "-x"], ["stats", "-v"]]
    assert calls[1]["exit_code"] == 0 and "Successfully retrieved statistics" in calls[1]["stdout"]
    assert all(isinstance(c["elapsed_s"], float) for c in calls)

    # The same observations as the former hook spooled them: its parsed entries, under its own source.
    old = tmp_path / "old-spool"
    old.mkdir()
    lines = []
    for r in recs:
        if r["kind"] != "tool_output":
            lines.append(r)
            continue
        for e in observed.derive(entry_from_record(r)):
            lines.append(make_entry(e.kind, e.ts, e.data, ts_end=e.ts_end, recorded_at=e.recorded_at,
                                    cluster=e.cluster, job_id=e.job_id, run=e.run, node=e.node, device=e.device,
                                    source=r["source"], source_version=r["source_version"]).to_record())
    (old / "hook-0.jsonl").write_text("".join(spool_line(x) + "\n" for x in lines))

    for job in ("81", "82"):
        new_r = _receipt(runner, cli, site.spool, f"sqlite:///{tmp_path / 'new.db'}", job)
        old_r = _receipt(runner, cli, old, f"sqlite:///{tmp_path / 'old.db'}", job)
        assert _figures(new_r) == _figures(old_r)
        assert new_r["gpu_hours"]["paid"] > 0
    assert "dcgm_host_engine_restart" in new_r["unknown_by_cause"]


def test_the_derived_entries_sit_beside_the_evidence_and_a_spool_cannot_forge_them(tmp_path, runner, cli):
    site = make_site(tmp_path / "site", hooks={"gap_tolerance_s": 15.0}, timeout=3.0)
    _job(site, "83")
    forged = entry_record("hook_error", 1.8e9, {"stage": "x"}, job_id="83", source=observed.SOURCE)
    (site.spool / "hook-forged.jsonl").write_text(spool_line(forged) + "\n")
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert runner.invoke(cli, ["--db", db, "init"]).exit_code == 0
    out = runner.invoke(cli, ["--db", db, "ship", "--spool", str(site.spool), "--no-receipts", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["refused_total"] == 1 and "reserved" in report["refused"][0]
    from ledger.chain import db as db_mod, store

    eng = db_mod.make_engine(db)
    es = list(store.iter_entries(eng, job_id="83"))
    derived = [c for c in es if c.source == observed.SOURCE]
    assert {c.kind for c in derived} == {"telemetry_summary"} and len(derived) == 2
    assert all(c.source_version == f"dcgm_job_stats/{observed.VERSION}" for c in derived)
    (evidence,) = [c for c in es if c.kind == "tool_output"]
    assert all(c.seq > evidence.seq for c in derived), "derived right after the evidence they come from"
    assert [e.entry_id for e in observed.derive(evidence.entry)] == [c.entry_id for c in derived]


def test_a_malformed_observation_is_an_error_entry_never_a_crash():
    bad = entry_from_record(entry_record("tool_output", 1.8e9, {"step": "dcgm_job_stats", "calls": [{}],
                                                               "context": {"end": 1.8e9 + 60}}, job_id="9"))
    (err,) = observed.derive(bad)
    assert err.kind == "hook_error" and err.data["stage"] == "tool_output" and err.source == observed.SOURCE
