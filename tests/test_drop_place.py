"""The drop place as the job's user would abuse it (issue 31): fill it, fill its filesystem, bury it in files,
plant text no encoder takes. The real installed hooks, run as slurmd runs them (root, a separate process, no
PATH); the user's part runs as ``nobody``; drop places on their own small tmpfs (docs/slurm.md), mounted here
(root; under CI=true a mount that fails fails the test). Each test fails on the main before issue 31.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from ledger.chain import db as db_mod, store
from ledger.cli.main import cli
from ledger.cli.install_hooks import install, mark_path
from ledger.capture.hooks.records import escape_text
from tests.standins import make_site
from tests.test_marks import GROUP, SYSTEM_PY, USER, as_user, job_env, mount_tmpfs, passable_root, unmount

OTHER = 1  # daemon: the next tenant

FILL = r"""
import os, sys
d, n = sys.argv[1], 0
for i in range(int(sys.argv[2])):            # subdirectories, then files in each until the inodes run out
    sub = os.path.join(d, f"d{i}")
    try:
        os.mkdir(sub)
    except OSError:
        break
    try:
        for j in range(int(sys.argv[3])):
            open(os.path.join(sub, f"f{j}"), "w").close(); n += 1
    except OSError:
        break
try:                                         # then the blocks, unless told not to
    with open(os.path.join(d, "big"), "wb") as f:
        while sys.argv[4:] != ["files-only"]:
            f.write(b"x" * 65536)
except OSError:
    pass
print(n)
"""


@pytest.fixture()
def node():
    """A node: site root passable by the job's users, spool on the root filesystem, ``drop`` a mount point."""
    root = passable_root("ipledger-drop-")
    yield root
    for m in (root / "drop", root / "fs"):
        unmount(m)
    shutil.rmtree(root, ignore_errors=True)


def _site(root: Path, timeout: float = 3.0, tools=("dcgmi", "nvidia-smi"), **hooks):
    s = make_site(root, tools=tools, timeout=timeout, hooks={"drop_dir": str(root / "drop"),
                                                             "drop_dir_shared_fs": False, **hooks})
    return s, install(root / "hooks", str(s.config), python=SYSTEM_PY)


def _hook(script: Path, env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p


def _shipped(tmp: Path, spool: Path) -> list:
    db = f"sqlite:///{tmp / 'ledger.db'}"
    runner = CliRunner()
    for argv in (["--db", db, "init"], ["--db", db, "ship", "--spool", str(spool)]):
        r = runner.invoke(cli, argv)
        assert r.exit_code == 0, r.output
    eng = db_mod.make_engine(db)
    try:
        return [c.entry for c in store.iter_entries(eng)]
    finally:
        eng.dispose()


def _of(entries: list, job: str, kind: str) -> list:
    return [e for e in entries if e.job_id == job and e.kind == kind]


def _run_complete(entries: list, job: str, telemetry: bool = True) -> None:
    """Every record a clean run of two GPUs has: start, both bindings, the DCGM report, the end."""
    assert len(_of(entries, job, "allocation_started")) == 1, job
    assert len(_of(entries, job, "device_bound")) == 2, job
    assert len(_of(entries, job, "allocation_ended")) == 1, job
    assert len(_of(entries, job, "telemetry_summary")) == (2 if telemetry else 0), job
    assert not _of(entries, job, "unknown_interval"), job


def _errors(entries: list, job: str) -> list[dict]:
    return [e.data for e in _of(entries, job, "hook_error")]


def test_a_full_drop_place_and_filesystem_lose_no_record_of_this_run_or_the_next(node, tmp_path):
    """The user marks once, then fills the drop place's tmpfs: more than 10,000 entries, every inode and every
    block. The epilog still spools the whole run, keeps the mark, empties the tree and says who filled it; the
    next tenant's prolog finds room for its own drop place and marks; both runs ship complete."""
    mount_tmpfs(node / "drop", size="2m", inodes=12_000)
    s, (prolog, epilog, *_rest) = _site(node)
    r = CliRunner().invoke(cli, ["hooks", "install", "--dir", str(node / "hooks-cli"), "--config", str(s.config)])
    assert r.exit_code == 0 and r.stderr == "", r.stderr  # the drop places have their own filesystem
    mark = mark_path(node / "hooks")
    _hook(prolog, job_env("601"))
    assert as_user(USER, [str(mark), "checkpoint", "--step", "7", "--strict"], job_env("601")).returncode == 0
    fill = as_user(USER, [SYSTEM_PY, "-c", FILL, str(node / "drop" / "601"), "40", "1000"], {})
    assert fill.returncode == 0 and int(fill.stdout) > 10_000, fill.stderr
    assert os.statvfs(node / "drop").f_ffree == 0
    _hook(epilog, job_env("601"))
    assert not os.path.lexists(node / "drop" / "601"), "emptied within the deadline"

    _hook(prolog, job_env("602", uid=OTHER))
    r = as_user(OTHER, [str(mark), "output", "--note", "eval ok", "--strict"], job_env("602"))
    assert r.returncode == 0, r.stderr
    _hook(epilog, job_env("602", uid=OTHER))

    got = _shipped(tmp_path, s.spool)
    for job in ("601", "602"):
        _run_complete(got, job)
    assert [p.data["step"] for p in _of(got, "601", "progress")] == [7]
    assert [p.data["note"] for p in _of(got, "602", "progress")] == ["eval ok"]
    (quota,) = [e for e in _errors(got, "601") if e.get("cause") == "drop_place_over_quota"]
    assert quota["controlled_by"] == "job_user" and quota["stage"] == "drop_place"
    assert not [e for e in _errors(got, "601") if e.get("cause") == "drop_place_unclean"]
    assert _errors(got, "602") == []


def test_a_drop_place_on_the_spools_filesystem_is_refused_so_filling_it_costs_no_record(node, tmp_path):
    """One small filesystem for the spool and the drop places (the old default beside the spool): the user
    who could fill it would make the epilog's spool write fail (epilog_missing: a receipt all unknown). The
    prolog refuses to make the drop place there; the user's fill reaches nothing; the run ships complete."""
    mount_tmpfs(node / "fs", size="4m", inodes=2_000)
    s, (prolog, epilog, *_rest) = _site(node, drop_dir=str(node / "fs" / "drop"))
    spool = node / "fs" / "spool"
    s.config.write_text(s.config.read_text().replace(f'spool = "{s.spool}"', f'spool = "{spool}"'))
    r = CliRunner().invoke(cli, ["hooks", "install", "--dir", str(node / "hooks-cli"), "--config", str(s.config)])
    assert r.exit_code == 0 and "warning: " in r.stderr and "is on the spool's filesystem" in r.stderr, r.output
    _hook(prolog, job_env("611"))
    assert not os.path.lexists(node / "fs" / "drop" / "611")
    fill = as_user(USER, [SYSTEM_PY, "-c", FILL, str(node / "fs" / "drop" / "611"), "10", "1000"], {})
    assert fill.returncode == 0 and fill.stdout.strip() == "0"
    r = as_user(USER, [str(mark_path(node / "hooks")), "checkpoint", "--strict"], job_env("611"))
    assert r.returncode == 1 and "NOT recorded" in r.stderr
    _hook(epilog, job_env("611"))
    got = _shipped(tmp_path, spool)
    _run_complete(got, "611")
    (refused,) = [e for e in _errors(got, "611") if e["stage"] == "marks"]
    assert "is on the spool's filesystem" in refused["error"] and "drop_dir_shared_fs" in refused["error"]


def test_a_buried_drop_place_costs_the_epilog_its_deadline_at_most_and_is_swept(node, tmp_path):
    """20 directories of 10,000 files, a chain of 40 nested directories and a symlink to a root file: the
    epilog (hook_timeout_s 0.3; no GPU tools, whose stand-ins would not answer that fast) spools the run, removes
    what it can in time, sets the rest aside and says so (200,000 entries: more than a quiet machine removes from
    a tmpfs within the deadline; 40,000 were not always);
    `ipledger hooks sweep` removes the rest by descriptor, and the symlink's target survives."""
    mount_tmpfs(node / "drop", size="64m", inodes=250_000)
    s, (prolog, epilog, *_rest) = _site(node, timeout=0.3, tools=())
    secret = node / "secret"
    secret.write_text("root's\n")
    _hook(prolog, job_env("621"))
    run_dir = node / "drop" / "621"
    fill = as_user(USER, [SYSTEM_PY, "-c", FILL, str(run_dir), "20", "10000", "files-only"], {})
    assert int(fill.stdout) == 200_000, fill.stderr
    chain = "/".join(f"n{i}" for i in range(40))
    assert as_user(USER, ["/bin/sh", "-c", f"mkdir -p {run_dir}/{chain} && ln -s {secret} {run_dir}/{chain}/s "
                                           f"&& ln -s {secret} {run_dir}/link"], {}).returncode == 0
    t0 = time.monotonic()
    _hook(epilog, job_env("621"))
    assert time.monotonic() - t0 < 5, "bounded by the hook's deadline, not by the user's tree"
    got = _shipped(tmp_path, s.spool)
    _run_complete(got, "621", telemetry=False)
    (unclean,) = [e for e in _errors(got, "621") if e.get("cause") == "drop_place_unclean"]
    assert unclean["controlled_by"] == "job_user" and "ipledger hooks sweep" in unclean["error"]
    aside = [p for p in (node / "drop").iterdir() if p.name.startswith(".unclean-621-")]
    assert len(aside) == 1 and not os.path.lexists(run_dir)

    r = CliRunner().invoke(cli, ["--config", str(s.config), "hooks", "sweep", "--json"])
    assert r.exit_code == 0, r.output
    (swept,) = [d for d in json.loads(r.output)["entries"] if d["name"] == aside[0].name]
    assert swept["action"] == "removed" and swept["entries"] > 0
    assert list((node / "drop").iterdir()) == [] and secret.read_text() == "root's\n"


def test_unencodable_mark_text_is_escaped_and_the_epilog_still_cleans_up(node, tmp_path):
    """A lone surrogate (a JSON \\ud800), a byte that is not UTF-8, a terminal escape and a backslash in mark
    notes: each kept, escaped losslessly; the run's records, DCGM's release, the hook state and the drop
    place's removal all happen (before: UnicodeEncodeError, marks and errors lost, DCGM's group leaked)."""
    mount_tmpfs(node / "drop")
    s, (prolog, epilog, *_rest) = _site(node)
    _hook(prolog, job_env("631"))
    t = time.time()
    lines = (json.dumps({"kind": "checkpoint", "t": t, "note": "\ud800 lone"}).encode() + b"\n"
             + b'{"kind":"output","t":%f,"note":"bad \xff byte \\u001b[31m red \\\\ back"}\n' % t
             + b'{"kind":"output","t":%f,"note":"a raw \x1b is no JSON"}\n' % t)
    p = subprocess.run(["/bin/sh", "-c", f"cat >> {node}/drop/631/marks.jsonl"], input=lines, user=USER,
                       group=GROUP[USER], extra_groups=[], timeout=30)
    assert p.returncode == 0
    mark = str(mark_path(node / "hooks"))
    p = subprocess.run([mark.encode(), b"step", b"--note", b"argv \xfe"], env=job_env("631", PATH="/usr/bin"),
                       capture_output=True, user=USER, group=GROUP[USER], extra_groups=[], timeout=30)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    _hook(epilog, job_env("631"))
    got = _shipped(tmp_path, s.spool)
    _run_complete(got, "631")
    notes = [m.data["note"] for m in _of(got, "631", "progress")]
    assert notes == ["\\ud800 lone", "bad \\xff byte \\x1b[31m red \\\\ back", "argv \\xfe"]
    assert [e["error"] for e in _errors(got, "631")] == ["3 marks accepted, 1 refused: not a JSON line x1"]
    dcgm = json.loads((s.state / "dcgm.json").read_text())
    assert dcgm["jobs"] == {} and dcgm["groups"] == {}, "DCGM's job record and group released"
    assert not any(s.spool.glob("hook-state/*.json")) and not os.path.lexists(node / "drop" / "631")


def _unescape(text: str, bytes_escaped: bool) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        k = text[i + 1]
        if k == "\\":
            out.append("\\")
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}[k]
        code = int(text[i + 2:i + 2 + width], 16)
        out.append(chr(0xDC00 + code if k == "x" and code >= 0x80 and bytes_escaped else code))
        i += 2 + width
    return "".join(out)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)), st.booleans())
def test_escape_text_is_lossless_printable_and_always_encodes(text, bytes_escaped):
    got = escape_text(text, bytes_escaped=bytes_escaped)
    got.encode("utf-8")
    assert got.isprintable()
    assert _unescape(got, bytes_escaped) == text


def test_an_epilog_that_never_ran_leaves_nothing_the_next_prolog_walks_and_the_sweep_keeps_live_runs(node):
    """Job 641's epilog never ran and left 20,000 entries; its requeued run's prolog sets them aside at once
    (no walk: the user's tree cannot eat the prolog's DCGM time) and makes a fresh drop place the user can
    mark. `ipledger hooks sweep` keeps the drop place of the run that is live (hook state), removes the
    orphan of job 642 (no hook state), and refuses a DROP_DIR others may write (one line, non-zero)."""
    mount_tmpfs(node / "drop", size="8m", inodes=30_000)
    s, (prolog, _epilog, *_rest) = _site(node, tools=())
    _hook(prolog, job_env("641"))
    fill = as_user(USER, [SYSTEM_PY, "-c", FILL, str(node / "drop" / "641"), "10", "2000", "files-only"], {})
    assert int(fill.stdout) == 20_000, fill.stderr
    t0 = time.monotonic()
    p = _hook(prolog, job_env("641", SLURM_JOB_RESTART_COUNT="1"))
    assert time.monotonic() - t0 < 3 and "moved to .unclean-641-" in p.stderr, p.stderr
    assert [x.name for x in (node / "drop" / "641").iterdir()] == []
    r = as_user(USER, [str(mark_path(node / "hooks")), "checkpoint", "--strict"], job_env("641"))
    assert r.returncode == 0, r.stderr
    _hook(prolog, job_env("642"))
    (s.spool / "hook-state" / "642.json").unlink()  # its node lost the run: no epilog will come

    runner = CliRunner()
    r = runner.invoke(cli, ["--config", str(s.config), "hooks", "sweep", "--settle", "0"])
    assert r.exit_code == 0, r.output
    assert sorted(x.name for x in (node / "drop").iterdir()) == ["641"]
    assert (node / "drop" / "641" / "marks.jsonl").exists(), "a live run's drop place is kept"
    lines = r.output.splitlines()
    assert any(x.startswith(f"removed {node}/drop/.unclean-641-") and x.endswith(": 20011 entries") for x in lines)
    assert f"removed {node}/drop/642: 0 entries" in lines and lines[-1] == "2 removed, 0 left, 1 kept"

    os.chmod(node / "drop", 0o733)
    r = runner.invoke(cli, ["--config", str(s.config), "hooks", "sweep"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1 and "writable" in r.output, r.output
    assert "Traceback" not in r.output


def test_root_marks_with_unencodable_notes_reach_the_spool_escaped(tmp_path):
    """Root's marks skip the drop place; a note with argv's undecodable byte, a lone surrogate and a backslash
    is escaped losslessly before the spool encodes it, and ships (before: each became a space, or was kept
    raw, so the note could not be read back)."""
    from ledger.capture import marks

    s = make_site(tmp_path, tools=())
    where = marks.mark("checkpoint", step=1, note="a\udcffb\ud800c\\", job="651", environ={"SLURMD_NODENAME": "n1"},
                       config_path=str(s.config))
    assert where and where.startswith(str(s.spool))
    (rec,) = _of(_shipped(tmp_path, s.spool), "651", "progress")
    assert rec.data["note"] == "a\\xffb\\ud800c\\\\"


def test_a_limit_that_is_no_number_costs_the_prolog_nothing(tmp_path):
    """`max_marks = "many"`: the defaults stand in and the prolog still starts DCGM and saves its state."""
    s = make_site(tmp_path, tools=("dcgmi", "nvidia-smi"), hooks={"max_marks": "many"})
    from ledger.capture import hooks

    hooks.run("prolog", job_env("661"), str(s.config))
    assert "661.0" in json.loads((s.state / "dcgm.json").read_text())["jobs"]
    assert (s.spool / "hook-state" / "661.json").exists()
