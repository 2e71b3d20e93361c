"""`ipledger resolve` takes an unknown_gap finding's id as well as an unknown_interval entry's: what the agents
show as unknown can be settled by the id the operator sees."""

from __future__ import annotations

import json
import os
import shutil

from tests.test_agents import small_hall


def test_resolve_by_finding_id_resolves_each_interval_it_stands_for(tmp_path, runner, cli):
    hall, found = small_hall()
    db = tmp_path / "ledger.db"
    # the shared hall stays untouched; its newest pages may still be in the write-ahead log
    for suffix in ("", "-wal"):
        src = f"{hall.db_path}{suffix}"
        if os.path.exists(src):
            shutil.copy(src, f"{db}{suffix}")
    url = f"sqlite:///{db}"
    gap = next(f for f in found if f["kind"] == "unknown_gap" and (f.get("gap_ids") or f.get("gap_id")))
    want = set(gap.get("gap_ids") or [gap["gap_id"]])
    r = runner.invoke(cli, ["--db", url, "resolve", gap["id"], "--as", "credit", "--reason", "collector outage",
                            "--by", "ops", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert {x["gap_id"] for x in out["resolved"]} == want
    r = runner.invoke(cli, ["--db", url, "resolve", "Fdoesnotexist000", "--as", "credit", "--reason", "x",
                            "--by", "ops"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1
    other = next(f for f in found if f["kind"] != "unknown_gap" and f["agent"] != "recommendation")
    r = runner.invoke(cli, ["--db", url, "resolve", other["id"], "--as", "credit", "--reason", "x", "--by", "ops"])
    assert r.exit_code != 0 and "names no unknown_interval entry" in r.output
