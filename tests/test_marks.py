"""Progress marks end to end without Slurm: the real prolog and epilog, `mark` run as the job's user (not root).

The prolog makes the run's drop place for the job's uid; `DIR/mark` (the installed script, system Python,
standard library only) run as that user appends to it; the epilog validates what it finds and spools
``progress`` entries for that run alone. Another user cannot mark the job; a flood is bounded; a hostile drop
file (symlink, oversized, forged keys) yields nothing it should not. Needs root (to act as other users).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.capture import hooks, marks
from ledger.cli.main import cli
from ledger.cli.install_hooks import install, mark_path
from tests import services
from tests.standins import make_site

SYSTEM_PY = "/usr/bin/python3"  # the job's user cannot run the venv's interpreter (under /root here)
USER, OTHER = 65534, 1           # nobody, daemon
GROUP = {USER: 65534, OTHER: 1}


def mount_tmpfs(path: Path, size: str = "4m", inodes: int = 4096) -> None:
    """A small tmpfs at ``path`` (root's, 0711): the drop places' own filesystem, as docs/slurm.md installs it.
    Needs root and mount(8); under CI=true a mount that fails fails the test."""
    path.mkdir(exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={inodes},mode=0711", "tmpfs",
                        str(path)], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        services.unavailable(f"cannot mount a tmpfs at {path}: {p.stderr.strip()}")


def unmount(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def passable_root(prefix: str) -> Path:
    """A fresh site root the job's users may pass through (root only: the tests act as other users)."""
    if os.geteuid() != 0 or not os.path.exists(SYSTEM_PY):
        services.unavailable("acting as the job's user needs root and /usr/bin/python3")
    # The drop places' parents must be passable by the job's user: not pytest's 0700 tmp_path.
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o711)
    return root


@pytest.fixture()
def site():
    root = passable_root("ipledger-marks-")
    mount_tmpfs(root / "drop")  # the drop places' own filesystem, never the spool's
    s = make_site(root, tools=(), hooks={"drop_dir": str(root / "drop"), "max_marks": 50})
    install(root / "hooks", str(s.config), python=SYSTEM_PY)
    yield s, mark_path(root / "hooks"), root / "drop"
    unmount(root / "drop")
    shutil.rmtree(root, ignore_errors=True)


def job_env(job: str, uid: int = USER, **extra) -> dict:
    return {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(uid), "SLURM_JOB_USER": "nobody",
            "SLURMD_NODENAME": "node1", "SLURM_JOB_ACCOUNT": "acct", "SLURM_JOB_GPUS": "0,1", **extra}


def as_user(uid: int, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30,
                          user=uid, group=GROUP[uid], extra_groups=[])


def progress_records(spool: Path) -> list[dict]:
    out = []
    for f in sorted(spool.glob("*.jsonl")):
        out += [r for r in map(json.loads, f.read_text().splitlines()) if r["kind"] in ("progress", "hook_error")]
    return out


def test_user_marks_own_run_through_drop_place(site):
    s, mark, drop = site
    hooks.run("prolog", job_env("501"), str(s.config))
    st = os.lstat(drop / "501")
    assert (st.st_uid, st.st_mode & 0o777) == (USER, 0o700)
    assert os.lstat(drop).st_mode & 0o777 == 0o711
    for step in (100, 200):
        r = as_user(USER, [str(mark), "checkpoint", "--step", str(step), "--note", "epoch\n1"],
                    job_env("501", SLURM_RESTART_COUNT="0"))
        assert r.returncode == 0 and r.stderr == "", r.stderr
    r = as_user(USER, [str(mark), "output", "--note", "eval accepted", "--strict"], job_env("501"))
    assert r.returncode == 0, r.stderr
    assert not list(s.spool.glob("mark-*")), "the job's user must not reach the spool"
    hooks.run("epilog", job_env("501"), str(s.config))
    recs = [r for r in progress_records(s.spool) if r["job_id"] == "501"]
    got = [json.loads(r["payload"]) for r in recs if r["kind"] == "progress"]
    assert [(g["kind"], g["step"], g["via"], g["uid"]) for g in got] == [
        ("checkpoint", 100, "drop", USER), ("checkpoint", 200, "drop", USER), ("output", None, "drop", USER)]
    assert got[0]["note"] == "epoch\\x0a1"  # escaped, losslessly: the newline is still there to read
    assert {(r["run"], r["node"]) for r in recs} == {(0, "node1")}
    assert not [r for r in recs if r["kind"] == "hook_error"]
    assert not os.path.lexists(drop / "501"), "the epilog removes the drop place"


def test_other_user_cannot_mark_the_job(site):
    s, mark, drop = site
    hooks.run("prolog", job_env("502"), str(s.config))
    # Without --strict the job is never failed; the refusal is said on stderr.
    r = as_user(OTHER, [str(mark), "checkpoint", "--job", "502"], {"SLURM_JOB_ID": "999"})
    assert r.returncode == 0 and "NOT recorded" in r.stderr and "Permission denied" in r.stderr
    r = as_user(OTHER, [str(mark), "checkpoint", "--job", "502", "--strict"], {})
    assert r.returncode == 1 and "NOT recorded" in r.stderr
    # Nor can the user of another job forge lines for this one from their own drop place.
    hooks.run("prolog", job_env("503", uid=OTHER), str(s.config))
    forged = json.dumps({"kind": "checkpoint", "t": time.time(), "job_id": "502"})
    as_user(OTHER, ["/bin/sh", "-c", f"echo '{forged}' >> {drop}/503/marks.jsonl"], {})
    hooks.run("epilog", job_env("502"), str(s.config))
    hooks.run("epilog", job_env("503", uid=OTHER), str(s.config))
    recs = progress_records(s.spool)
    assert [r for r in recs if r["kind"] == "progress"] == []
    errs = [json.loads(r["payload"])["error"] for r in recs if r["kind"] == "hook_error" and r["job_id"] == "503"]
    assert errs == ["0 marks accepted, 1 refused: another job's mark x1"]


def test_flood_of_marks_is_bounded(site):
    s, mark, drop = site
    hooks.run("prolog", job_env("504"), str(s.config))
    t = time.time()
    lines = "".join(json.dumps({"kind": "step", "t": t, "step": i}) + "\n" for i in range(400))
    # plus garbage, an oversized note and a run that is not this one
    lines += "not json\n" + json.dumps({"kind": "output", "t": t, "note": "x" * 5000}) + "\n"
    lines += json.dumps({"kind": "checkpoint", "t": t, "run": 7}) + "\n" + "{" * 300_000 + "\n"
    p = subprocess.run(["/bin/sh", "-c", f"cat >> {drop}/504/marks.jsonl"], input=lines, text=True, user=USER,
                       group=GROUP[USER], extra_groups=[])
    assert p.returncode == 0
    # The file is now beyond what the epilog reads: mark refuses to grow it (and says so, exit 0).
    r = as_user(USER, [str(mark), "checkpoint"], job_env("504"))
    assert r.returncode == 0 and "drop place full" in r.stderr
    t0 = time.time()
    hooks.run("epilog", job_env("504"), str(s.config))
    assert time.time() - t0 < 5
    recs = [r for r in progress_records(s.spool) if r["job_id"] == "504"]
    assert sum(1 for r in recs if r["kind"] == "progress") == 50  # [hooks] max_marks
    (err,) = [json.loads(r["payload"])["error"] for r in recs if r["kind"] == "hook_error"]
    assert err.startswith("50 marks accepted,") and "over 50 marks per run x350" in err
    assert f"file beyond {marks.MAX_DROP_BYTES} bytes not read x1" in err
    assert "bad note x1" in err and "another run's mark x1" in err and "not a JSON line" in err


def test_hostile_drop_file_is_not_followed(site):
    s, mark, drop = site
    secret = s.root / "secret.jsonl"
    secret.write_text(json.dumps({"kind": "checkpoint", "t": time.time()}) + "\n")
    hooks.run("prolog", job_env("505"), str(s.config))
    as_user(USER, ["ln", "-s", str(secret), str(drop / "505" / "marks.jsonl")], {}).check_returncode()
    hooks.run("epilog", job_env("505"), str(s.config))
    recs = [r for r in progress_records(s.spool) if r["job_id"] == "505"]
    assert [r["kind"] for r in recs] == ["hook_error"]
    assert "not opened" in json.loads(recs[0]["payload"])["error"]
    assert secret.exists() and not os.path.lexists(drop / "505")


def test_root_marks_go_straight_to_the_spool(site, monkeypatch):
    s, _mark, _drop = site
    where = marks.mark("checkpoint", step=7, job="506", run=1, at="2026-12-01T14:00:00Z",
                       environ={"SLURMD_NODENAME": "n9"}, config_path=str(s.config))
    (rec,) = [json.loads(x) for x in Path(where).read_text().splitlines()]
    assert (rec["kind"], rec["job_id"], rec["run"], rec["node"], rec["ts"]) == \
        ("progress", "506", 1, "n9", "2026-12-01T14:00:00Z")
    assert json.loads(rec["payload"]) == {"kind": "checkpoint", "note": None, "step": 7, "via": "spool"}


@pytest.mark.parametrize("argv, message", [
    (["mark", "save"], "'save' is not one of"),
    (["mark", "checkpoint", "--step", "-3", "--job", "1"], "--step '-3': not a whole number"),
    (["mark", "checkpoint", "--job", "../1"], "not a Slurm job id"),
    (["mark", "checkpoint", "--job", "1", "--at", "yesterday"], "not an RFC 3339 time"),
])
def test_misuse_is_one_line_and_nonzero(argv, message):
    r = CliRunner().invoke(cli, argv, env={"SLURM_JOB_ID": ""})
    errors = [ln for ln in r.output.splitlines() if ln.startswith(("Error:", "ipledger:"))]
    assert r.exit_code != 0 and len(errors) == 1 and message in errors[0], r.output


def test_fast_path_misuse_and_unavailable_spool(tmp_path):
    # the console script's path (no click): misuse exits 2 with one line; an unwritable spool exits 0, logged
    assert marks.main(["checkpoint", "--bogus"]) == 2
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{tmp_path / "file"}/spool"\n')
    (tmp_path / "file").write_text("")
    assert marks.main(["checkpoint", "--job", "9", "--config", str(cfg)]) == 0
    assert marks.main(["checkpoint", "--job", "9", "--config", str(cfg), "--strict"]) == 1
    # a broken site config is the site's problem, not the job's
    bad = tmp_path / "bad.toml"
    bad.write_text("spool = [unclosed\n")
    assert marks.main(["checkpoint", "--job", "9", "--config", str(bad)]) == 0
    assert marks.main(["checkpoint", "--job", "9", "--config", str(bad), "--strict"]) == 1


def test_mark_help_has_an_example():
    r = CliRunner().invoke(cli, ["mark", "--help"])
    assert r.exit_code == 0 and "Example:" in r.output and "ipledger mark checkpoint" in r.output


def test_installed_mark_imports_only_light_stdlib(tmp_path):
    """The installed script's path: no click, database, json, re, typing or dataclasses (bench/mark.py times it)."""
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{tmp_path / "spool"}"\n')
    old = time.time() - 60
    os.utime(cfg, (old, old))
    install(tmp_path / "hooks", str(cfg))
    mark = mark_path(tmp_path / "hooks")
    env = {"SLURM_JOB_ID": "12", "PATH": "/usr/bin:/bin"}
    subprocess.run([str(mark), "step", "--step", "1"], env=env, check=True)  # makes the config snapshot
    p = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(mark), "checkpoint", "--note", "n"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    assert "ledger.capture.marks" in imported
    heavy = {"click", "sqlalchemy", "json", "re", "typing", "dataclasses", "datetime", "pathlib", "subprocess",
             "tomllib", "ledger.chain.entries", "hashlib"}  # ledger.chain.canonical is light: it loads none of these
    assert not imported & heavy, sorted(imported & heavy)
    assert len(list((tmp_path / "spool").glob("mark-*.jsonl"))) == 2


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_config_snapshot_is_no_more_readable_than_the_config(tmp_path, mode):
    """The hooks' parsed-config snapshot (which the mark script also reads) copies a config that may hold the
    database password: it must not be readable by anyone the config itself is not readable by."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'spool = "{tmp_path / "spool"}"\ndb = "postgresql+psycopg://u:secret@h/db"\n')
    os.chmod(cfg, mode)
    old = time.time() - 60
    os.utime(cfg, (old, old))
    install(tmp_path / "hooks", str(cfg))
    subprocess.run([str(mark_path(tmp_path / "hooks")), "step", "--job", "3"], env={"PATH": "/usr/bin:/bin"},
                   check=True)
    snap = tmp_path / "hooks" / ".ipledger-config-snapshot"
    assert snap.exists() and snap.stat().st_mode & 0o777 == mode & 0o644
