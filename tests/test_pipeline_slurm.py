"""The real pipeline, end to end, on a real Slurm: what the tenant is finally handed comes out of what the real
hooks wrote, with nothing built by hand in between.

Jobs run through the installed prolog/epilog (the job's user ``nobody`` marks a checkpoint through its drop
place, with a terminal escape in the note) → ``ship`` (no accounting configured: the runs' windows are the
hooks' own times, with microseconds, which the monthly CSV once failed on) → ``issue
--all`` → every export format of the month (csv, parquet, focus, json, pdf, plain and with ``--alias-key``) →
``checkpoint`` → ``verify`` → a receipt's proof bundle, checked by ``ledger/proofcheck.py`` alone in a
``python -I`` subprocess. Hooks, the mark script and the verifier run on the system Python, as a site runs them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli.main import cli as ipledger
from tests import services, slurm_service
from tests.test_progress_slurm import _trace, _wait, hooked_cluster

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent
FORMATS = ("csv", "parquet", "focus", "json", "pdf")
CONTRACT = """id = "acme-gpu"
version = "2026-12"
currency = "EUR"
unknown_policy = "charge"
[skus.default]
rate_per_gpu_hour = "2.00"
"""


def _text_of(path: Path, fmt: str) -> str:
    """What a reader of the file sees: parquet read back, the PDF through pdftotext, the rest as text."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pandas().to_csv()
    if fmt == "pdf":
        if shutil.which("pdftotext") is None:
            services.unavailable("pdftotext (poppler-utils) is not installed")
        return subprocess.run(["pdftotext", "-layout", str(path), "-"], check=True, capture_output=True,
                              text=True, timeout=60).stdout
    return path.read_text()


@pytest.fixture(scope="module")
def cluster():
    yield from hooked_cluster("ipledger-pipeline-", accounting=False)


def _sbatch_as_nobody(s, script: Path, *args: str) -> str:
    sub = subprocess.run(["runuser", "-u", "nobody", "--", slurm_service._which("sbatch"), "--parsable",
                          "--no-requeue", *args, "--chdir=/tmp", "-o", "/dev/null", "-e", "/dev/null", str(script)],
                         env=s.env, capture_output=True, text=True, timeout=30)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip().split(";")[0]


def test_real_hooks_to_statements_verify_and_an_offline_proof(cluster, tmp_path):
    s, site, mark = cluster
    script = site.root / "job.sh"
    script.write_text(f"#!/bin/sh\n{mark} checkpoint --step 100 --note \"$(printf 'ep\\033[2Joch')\" --strict "
                      f"|| exit 3\nsleep 2\n")
    script.chmod(0o755)
    jobs = [_sbatch_as_nobody(s, script, "--gres=gpu:2", "-A", "tenant"),
            _sbatch_as_nobody(s, script, "--gres=gpu:1", "-A", "other")]
    for jid in jobs:
        s.wait(jid, timeout=60)
    _wait(lambda: {t["job_id"] for t in _trace(site) if t["hook"] == "epilog"} >= set(jobs), 60, "both epilogs")

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    runner = CliRunner()
    env = {"SLURM_CONF": str(s.conf)}

    def ok(*argv: str) -> str:
        r = runner.invoke(ipledger, ["--db", db, *argv], env=env)
        assert r.exit_code == 0, (argv, r.output, r.exception)
        return r.output

    contract = tmp_path / "acme.toml"
    contract.write_text(CONTRACT)
    ok("init")
    ok("contract", "set", str(contract))
    ship = ["--config", str(site.config), "ship", "--spool", str(site.spool), "--json"]
    ok(*ship)
    issued = json.loads(ok("issue", "--all", "--json"))
    assert issued, "issue --all issued nothing"
    receipt = json.loads(ok("receipt", jobs[0], "--format", "json"))
    assert receipt["progress"]["marks"]["checkpoint"] == 1
    assert "\x1b" not in ok("log", "--job", jobs[0])  # the user's note reaches the terminal escaped
    month = receipt["window"]["start"][:7]

    key = tmp_path / "alias.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    secrets = (s.node, "nobody")
    for fmt in FORMATS:
        plain, aliased = tmp_path / f"m.{fmt}", tmp_path / f"m-aliased.{fmt}"
        ok("export", "monthly", "--month", month, "--format", fmt, "--out", str(plain), "--quiet")
        ok("export", "monthly", "--month", month, "--format", fmt, "--out", str(aliased), "--quiet",
           "--alias-key", str(key))
        text = _text_of(plain, fmt)
        assert text.strip(), fmt
        if fmt in ("csv", "parquet", "focus"):
            assert jobs[0] in text and s.node in text, fmt  # per-run rows: the names are there without a key
        leaked = [n for n in secrets if n in _text_of(aliased, fmt)]
        assert not leaked, f"{fmt} export with --alias-key names {leaked}"

    ok("keygen", "--out", str(tmp_path / "log.key"))
    ok("checkpoint", "--key", str(tmp_path / "log.key"), "--out", str(tmp_path / "head.json"))
    verified = json.loads(ok("verify", "--json", "--pubkey", str(tmp_path / "log.key.pub")))  # the site's key pinned
    assert verified["ok"] is True and verified["problems"] == [], verified
    bundle = tmp_path / "bundle.json"
    ok("receipt", jobs[0], "--proof", "--head", str(tmp_path / "head.json"), "--out", str(bundle))
    # the tenant's check: the one file, isolated from this checkout's packages and environment
    check = subprocess.run([sys.executable, "-I", str(REPO / "ledger" / "proofcheck.py"), str(bundle),
                            "--pubkey", str(tmp_path / "log.key.pub")], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
