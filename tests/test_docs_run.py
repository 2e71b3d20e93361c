"""The README and the docs run as written: every ```sh block of README.md, and every ```sh block of docs/*.md
marked ``<!-- runnable -->`` on the line before it, runs in a fresh directory holding the small demo
(``demo-out/``, the session's demo copied) and a ``spool/`` with one ended job (4242), each block in its own
``bash -e`` through the real console script; a non-zero exit or a traceback fails the test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.capture import spool
from tests.test_cli_core import _job_records

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- runnable -->"
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def sh_blocks(text: str, marked_only: bool) -> list[str]:
    """The bodies of the ```sh blocks of a Markdown text (only those whose previous line is the marker)."""
    out = []
    for m in _FENCE.finditer(text):
        if m.group(1) != "sh":
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if marked_only and before != MARK:
            continue
        out.append(m.group(2))
    return out


def runnable_blocks() -> list[tuple[str, str]]:
    """(where, script) of every block the docs promise to run."""
    found = [(f"README.md block {i + 1}", b) for i, b in enumerate(sh_blocks((ROOT / "README.md").read_text(),
                                                                             False))]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        found += [(f"docs/{doc.name} block {i + 1}", b) for i, b in enumerate(sh_blocks(doc.read_text(), True))]
    return found


@pytest.fixture(scope="module")
def site_dir(demo, tmp_path_factory) -> Path:
    """A fresh directory: demo-out/ (a copy of the session's demo) and spool/ (job 4242)."""
    out, _ = demo
    d = tmp_path_factory.mktemp("docs-run")
    shutil.copytree(out, d / "demo-out")
    spool.write(d / "spool", _job_records("4242"))
    return d


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPLEDGER_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's ipledger
    env["IPLEDGER_CONFIG"] = ""   # no site config: the defaults the README describes
    return env


def test_the_readme_and_marked_docs_have_blocks_to_run():
    where = [w for w, _ in runnable_blocks()]
    assert sum(w.startswith("README.md") for w in where) >= 3
    assert any(w.startswith("docs/") for w in where)
    readme = (ROOT / "README.md").read_text()
    # the README says which blocks are run, and every block it does not run is a text block, not a silent skip
    assert "tests/test_docs_run.py" in readme and "`text` blocks are not run" in readme
    assert set(re.findall(r"^```(\w*)\n", readme, re.M)) <= {"sh", "text", ""}


@pytest.mark.parametrize("where,script", runnable_blocks(), ids=lambda v: v if " block " in str(v) else "")
def test_block_runs_as_written(where, script, site_dir, tmp_path):
    work = tmp_path / "site"   # each block in its own fresh copy of the directory
    shutil.copytree(site_dir, work)
    full = "trap 'echo \"failed: $BASH_COMMAND\" >&2' ERR\n" + script
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", full], cwd=work, env=_env(), capture_output=True,
                       text=True, timeout=600)
    output = r.stdout + r.stderr
    assert r.returncode == 0, f"{where} exited {r.returncode}:\n{script}\n--- output ---\n{output[-4000:]}"
    assert "Traceback" not in output, f"{where} printed a traceback:\n{output[-4000:]}"
