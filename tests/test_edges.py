"""Edges answered the same way by every command (issue 27), each with its exact one-line message: reading never
creates or writes a ledger; an unknown scheme or a missing driver names the extra; a period without data, an
unknown job, a missing spool and an ``--as-of`` past the end are one line and exit 1; ``--as-of`` takes a time;
the one progress bar is drawn on a terminal (a real pseudo-terminal) and nowhere else."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.canonical import format_ts, ts_to_epoch
from ledger.chain.entries import Kind, make_entry
from tests.test_cli_core import _job_records

ENV = {"IPLEDGER_CONFIG": "", "IPLEDGER_DB": None, "IPLEDGER_SPOOL": None}
IPLEDGER = str(Path(sys.executable).parent / "ipledger")


@pytest.fixture
def shipped(runner, cli, tmp_path, sqlite_url) -> str:
    """An SQLite ledger holding job 55 (3 entries) and its automatic receipt (seq 4)."""
    sp = tmp_path / "spool"
    spool.write(sp, _job_records())
    r = runner.invoke(cli, ["--db", sqlite_url, "ship", "--spool", str(sp)], env=ENV)
    assert r.exit_code == 0, r.output
    return sqlite_url


def one_line(runner, cli, args, code=1) -> str:
    r = runner.invoke(cli, args, env=ENV)
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output and r.output.count("\n") == 1, r.output
    return r.output.rstrip("\n")


# --- reading never writes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["verify"], ["receipt", "55"], ["log", "--job", "55"], ["findings"],
                                  ["explain", "--rack", "R3"], ["ask", "why did rack R3 lose GPU-hours this week?"],
                                  ["account", "--day", "2026-11-04"], ["export", "monthly", "--month", "2026-11"],
                                  ["ship", "--spool", "."]])
def test_a_missing_ledger_is_one_line_and_nothing_is_created(runner, cli, tmp_path, args):
    where = tmp_path / "var" / "lib" / "ipledger" / "ledger.db"
    out = one_line(runner, cli, ["--db", f"sqlite:///{where}", *args])
    assert out == f"ipledger: no ledger at {where}"
    assert list(tmp_path.iterdir()) == []   # no directory, no database


def test_a_reading_engine_cannot_write(shipped):
    path = db_mod.sqlite_path(shipped)
    before = path.read_bytes()
    eng = db_mod.make_engine(shipped, read_only=True)
    with eng.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM entries")).scalar_one() == 4
    with pytest.raises(OperationalError, match="readonly"):
        with eng.begin() as conn:
            conn.execute(text("CREATE TABLE scratch (x INTEGER)"))
    eng.dispose()
    assert path.read_bytes() == before


def test_a_reading_engine_cannot_write_on_either_backend(ledger_url):
    eng = db_mod.make_engine(ledger_url, read_only=True)
    assert db_mod.current_revision(eng)   # it reads
    with pytest.raises(DBAPIError, match="(?i)read-?only"):
        with eng.begin() as conn:
            conn.execute(text("CREATE TABLE scratch (x INTEGER)"))
    eng.dispose()


def test_reading_commands_leave_the_ledger_as_it_was(runner, cli, shipped, tmp_path):
    path = db_mod.sqlite_path(shipped)
    eng = db_mod.make_engine(shipped)
    with eng.connect() as conn:  # the ledger's content, not its pages: a WAL file may hold them
        before = conn.execute(text("SELECT seq, hash FROM entries ORDER BY seq")).all()
    eng.dispose()
    names = sorted(p.name for p in path.parent.iterdir())
    for args in (["verify"], ["receipt", "55", "--json"], ["log", "--job", "55"], ["contract", "show"],
                 ["receipt", "55", "--as-of", "2026-11-01T12:00:00Z", "--json"]):
        r = runner.invoke(cli, ["--db", shipped, *args], env=ENV)
        assert r.exit_code == 0, (args, r.output)
    eng = db_mod.make_engine(shipped, read_only=True)
    with eng.connect() as conn:
        assert conn.execute(text("SELECT seq, hash FROM entries ORDER BY seq")).all() == before
    eng.dispose()
    sqlite_own = {path.name + "-wal", path.name + "-shm"}
    assert set(sorted(p.name for p in path.parent.iterdir())) - sqlite_own <= set(names)


def test_an_unknown_scheme_names_the_databases_and_the_extra(runner, cli):
    out = one_line(runner, cli, ["--db", "mysql://u@dbhost/ipledger", "verify"])
    assert out == ("ipledger: mysql://u@dbhost/ipledger: ipledger keeps its ledger in SQLite (sqlite:///PATH) or "
                   "PostgreSQL (postgresql+psycopg://USER@HOST/DB, after pip install 'ipledger[postgres]'), not mysql")


def test_a_missing_driver_names_the_extra(runner, cli):
    out = one_line(runner, cli, ["--db", "postgresql+pg8000://u:secret@dbhost/ipledger", "log"])
    assert out == ("ipledger: postgresql+pg8000://u:***@dbhost/ipledger: no driver for postgresql+pg8000 (No module "
                   "named 'pg8000'); ipledger reaches PostgreSQL through psycopg: pip install 'ipledger[postgres]' "
                   "and use postgresql+psycopg://")


# --- edges: no data, unknown job, missing spool, --as-of ----------------------------------------------------------

@pytest.mark.parametrize("args", [["explain", "--rack", "R3", "--period", "2026-10"],
                                  ["account", "--day", "2026-10-01"],
                                  ["report", "analysis", "--period", "2026-10", "--out", "never.pdf"]])
def test_a_period_without_data_is_one_line_from_every_reading_command(runner, cli, demo, args, tmp_path):
    out_dir, summary = demo
    label = args[args.index("--period") + 1] if "--period" in args else "2026-10-01"
    args = [str(tmp_path / a) if a == "never.pdf" else a for a in args]
    out = one_line(runner, cli, ["--db", f"sqlite:///{summary['ledger']}", *args])
    assert out == f"ipledger: the ledger has no data in {label}"
    assert not (tmp_path / "never.pdf").exists()


def test_log_of_an_unknown_job_says_so(runner, cli, shipped):
    assert one_line(runner, cli, ["--db", shipped, "log", "--job", "40003"]) == \
        "ipledger: job 40003: no entries in the ledger"
    r = runner.invoke(cli, ["--db", shipped, "log", "--job", "55", "--kind", "progress"], env=ENV)
    assert r.exit_code == 0 and r.output == ""   # a known job with no entry of that kind is not an error


def test_ship_of_a_missing_spool_is_an_error_and_makes_no_directory(runner, cli, shipped, tmp_path):
    gone = tmp_path / "no-such-spool"
    assert one_line(runner, cli, ["--db", shipped, "ship", "--spool", str(gone)]) == \
        f"ipledger: {gone}: no spool directory here (--spool, $IPLEDGER_SPOOL or the config's spool)"
    assert not gone.exists()


def test_as_of_past_the_end_is_an_error_everywhere(runner, cli, shipped):
    for cmd in (["receipt", "55"], ["export", "monthly", "--month", "2026-11", "--out", "-"], ["contract", "show"]):
        assert one_line(runner, cli, ["--db", shipped, *cmd, "--as-of", "5"]) == \
            "ipledger: --as-of 5: past the ledger's end (its last entry is seq 4)"
        assert one_line(runner, cli, ["--db", shipped, *cmd, "--as-of", "2999-01-01T00:00:00Z"]) == \
            "ipledger: --as-of 2999-01-01T00:00:00Z: past the ledger's end (that time is still to come)"
    assert one_line(runner, cli, ["--db", shipped, "receipt", "55", "--as-of", "2026-10-01"]) == \
        "ipledger: --as-of 2026-10-01: before the ledger's first entry"
    r = runner.invoke(cli, ["--db", shipped, "receipt", "55", "--as-of", "yesterday-ish"], env=ENV)
    assert r.exit_code == 2 and "neither a sequence number nor an RFC 3339 time" in r.output


def test_as_of_a_time_is_the_receipt_as_of_the_seq_standing_then(runner, cli, shipped):
    def receipt(as_of: str) -> dict:
        r = runner.invoke(cli, ["--db", shipped, "receipt", "55", "--json", "--as-of", as_of], env=ENV)
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    # entries 1-2 are stamped 10:00, 3 (the end) 12:00: at 11:00 the ledger stood at seq 2, at 12:00 at seq 3
    assert receipt("2026-11-01T11:00:00Z") == receipt("2") != receipt("3")
    assert receipt("2026-11-01T12:00:00Z") == receipt("3")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offsets=st.lists(st.integers(0, 20), min_size=1, max_size=12), at=st.integers(-1, 21))
def test_seq_standing_at_is_the_prefix_before_the_first_later_entry(offsets, at):
    t0 = ts_to_epoch("2026-11-01T00:00:00Z")
    with tempfile.TemporaryDirectory() as d:
        eng = db_mod.make_engine(f"sqlite:///{d}/l.db")
        db_mod.upgrade(eng)
        # half-second stamps too, so the text comparison within a second is exercised
        store.append(eng, [make_entry(Kind.PROGRESS, t0 + o / 2, {"kind": "step", "step": i}, cluster="c",
                                      job_id="1", run=0) for i, o in enumerate(offsets)])
        t = t0 + at / 2
        n = db_mod.seq_standing_at(eng, t)
        eng.dispose()
    times = [t0 + o / 2 for o in offsets]
    assert all(x <= t for x in times[:n])
    assert n == len(times) or times[n] > t
    assert format_ts(t)  # the instant is representable


# --- progress on a terminal, and only there ------------------------------------------------------------------------

def _on_pty(args: list[str]) -> tuple[int, str, str]:
    """Run the console script with stderr on a pseudo-terminal: (exit status, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    env = {**os.environ, "IPLEDGER_CONFIG": ""}
    env.pop("IPLEDGER_DB", None)
    p = subprocess.Popen([IPLEDGER, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    out = p.stdout.read().decode()
    p.wait(timeout=120)
    os.close(master)
    return p.returncode, out, shown.decode(errors="replace")


def test_verify_and_issue_draw_a_bar_with_counts_on_a_terminal(shipped):
    rc, out, shown = _on_pty(["--db", shipped, "verify"])
    assert rc == 0 and out.startswith("ok: 4 entries")
    assert "verify: hash chain" in shown and "5/5" in shown and "[####" in shown
    rc, out, shown = _on_pty(["--db", shipped, "issue", "--all"])
    assert rc == 0 and "1/1" in shown and "issue all" in shown


def test_no_bar_with_json_or_when_stderr_is_not_a_terminal(shipped):
    rc, out, shown = _on_pty(["--db", shipped, "verify", "--json"])
    assert rc == 0 and json.loads(out)["ok"] is True and shown == ""
    r = subprocess.run([IPLEDGER, "--db", shipped, "verify"], capture_output=True, text=True,
                       env={**os.environ, "IPLEDGER_CONFIG": ""}, timeout=120)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("ok: 4 entries")


def test_an_agents_command_draws_its_steps_on_a_terminal(demo):
    _, summary = demo
    rc, out, shown = _on_pty(["--db", f"sqlite:///{summary['ledger']}", "account", "--day", "2026-11-04"])
    assert rc == 0 and "tenant" in out
    assert "account: read the ledger" in shown and "account: run the agents" in shown and "3/3" in shown
    assert "3/3" not in out and "[#" not in out   # never on stdout


def test_a_read_only_engine_s_url_reopens_the_same_ledger_and_creates_nothing(tmp_path, monkeypatch):
    """The receipt workers reopen the ledger from ``engine.url``: a read-only engine's URL must name the same
    file (it used to render as ``sqlite:///file%3A/...``, a relative path a worker created as a new, empty ledger
    under the current directory)."""
    from sqlalchemy import text

    from ledger.chain import db as db_mod

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db_mod.upgrade(db_mod.make_engine(url))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    ro = db_mod.make_engine(url, create=False, read_only=True)
    again = db_mod.make_engine(ro.url.render_as_string(hide_password=False))
    with again.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    with ro.connect() as conn, pytest.raises(Exception, match="readonly"):
        conn.execute(text("CREATE TABLE t (x)"))
    assert list(cwd.iterdir()) == []
