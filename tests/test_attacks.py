"""The write path under attack (issue 13; docs/security.md): one test per attack class, through the CLI.

The attacker can write to the spool, as the node collector's user can; the tests play that user by dropping to
``nobody`` in a child process (the spool directory is then owned by ``nobody``, as a collector's would be),
and run ``ipledger ship`` as the test's own user (root in CI, as docs/slurm.md recommends for the shipper).
Each asserts the safe outcome: nothing written outside the spool, operator-only kinds refused, honest lines
and files beside bad ones shipped, ``verify`` green on the honest ledger, receipts computable. A hypothesis
property then damages a small ledger at random (a byte of a row's value, of a sample block, an index entry)
and requires ``verify`` to name the first bad seq (``--deep`` for the index) and never to raise.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.receipts import receipt_for
from ledger.receipts.auto import verify_checks
from ledger.receipts.example import KEY, UUID, load_example
from ledger.telemetry import blocks
from ledger.chain.verify import verify

IS_ROOT = os.geteuid() == 0
NOBODY = 65534


def _as_writer(spool_dir: Path, script: str) -> None:
    """Run ``script`` (Python; ``SPOOL`` is the spool's path) as the unprivileged spool writer: a forked
    child that drops to ``nobody`` (root in CI), or as this user when the tests do not run as root."""
    if IS_ROOT:
        os.chown(spool_dir, NOBODY, NOBODY)
    code = f"import os, json, time\nSPOOL = {str(spool_dir)!r}\n" + script
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            if IS_ROOT:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            exec(compile(code, "<writer>", "exec"), {})
            status = 0
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"writer failed: {exc!r}\n".encode())
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the writer's script failed"


@pytest.fixture
def writer_spool():
    """A spool directory the unprivileged writer can reach (pytest's own tmp tree is private to root)."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="ipledger-attack-"))
    top.chmod(0o755)
    sp = top / "spool"
    sp.mkdir(mode=0o750)
    yield sp
    shutil.rmtree(top, ignore_errors=True)


def _ship(runner, cli, url: str, sp: Path, *extra: str):
    r = runner.invoke(cli, ["--db", url, "ship", "--json", "--no-receipts", *extra],
                      env={"IPLEDGER_CONFIG": "", "IPLEDGER_SPOOL": str(sp)})
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def _example(url: str) -> tuple:
    eng = db_mod.make_engine(url)
    load_example(eng, with_adjustment=False)
    body = receipt_for(eng, KEY["job_id"]).body
    return eng, body


def _line(kind: str, **fields) -> str:
    rec = {"kind": kind, "ts": "2026-11-02T09:00:00Z", "payload": {}, **KEY, **fields}
    return json.dumps(rec)


# --- 1. root writes through symbolic links --------------------------------------------------------------

def test_planted_links_and_odd_files_never_redirect_a_root_shipper(runner, cli, tmp_path, sqlite_url, writer_spool):
    """A link at torn/NAME.torn, a link in place of shipped/, a hard link and a FIFO among the spool files:
    the shipper writes nothing outside the spool, reads neither the linked file nor the FIFO (no hang), and
    ships the honest file beside them."""
    secret = tmp_path / "root-only"
    secret.write_text("root:secret-line\n")
    secret.chmod(0o600)
    cron = tmp_path / "cron-line"
    cron.write_text("# untouched\n")
    cron.chmod(0o600)
    if IS_ROOT:
        os.chown(tmp_path / "cron-line", 0, 0)
    sp = writer_spool
    honest = make_entry(Kind.PROGRESS, 1_790_000_000, {"step": 1}, **KEY).to_record()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _as_writer(sp, f"""
name = "entries-0001-crashed.jsonl.tmp"
os.mkdir(os.path.join(SPOOL, "torn"))
os.symlink({str(cron)!r}, os.path.join(SPOOL, "torn", name + ".torn"))
os.symlink({str(outside)!r}, os.path.join(SPOOL, "shipped"))
with open(os.path.join(SPOOL, name), "w") as f:
    f.write({json.dumps(honest)!r} + "\\n" + '{{"kind": "progress", "ts": "* * * * * root evil')
old = time.time() - 3600
os.utime(os.path.join(SPOOL, name), (old, old))
os.symlink({str(secret)!r}, os.path.join(SPOOL, "entries-0002-link.jsonl"))
os.mkfifo(os.path.join(SPOOL, "entries-0003-fifo.jsonl"))
""")
    if IS_ROOT:  # a hard link to a root-only file (same file system); nobody cannot make one (protected_hardlinks)
        os.link(secret, sp / "entries-0004-hard.jsonl")
    r = _ship(runner, cli, sqlite_url, sp)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert cron.read_text() == "# untouched\n" and secret.read_text() == "root:secret-line\n"
    assert list(outside.iterdir()) == [], "nothing written through the planted shipped/ link"
    assert rep["appended"] >= 1 and any("symbolic link" in q for q in rep["quarantined"])
    assert any("not a regular file" in q for q in rep["quarantined"])
    if IS_ROOT:
        assert any("hard links" in q for q in rep["quarantined"])
    assert (sp / "torn" / "entries-0001-crashed.jsonl.tmp.torn").read_text().startswith('{"kind": "progress"')
    ino = secret.stat().st_ino  # the hard link itself (moved to quarantine/, same inode and mode) aside
    every = b"".join(p.read_bytes() for p in sp.rglob("*")
                     if p.is_file() and not p.is_symlink() and p.stat().st_ino != ino)
    assert b"secret-line" not in every, "the linked file's content was never copied into the spool"
    eng = db_mod.make_engine(sqlite_url)
    assert verify(eng).ok
    kinds = [c.kind for c in store.iter_entries(eng)]
    assert kinds.count(Kind.PROGRESS) == 1 and kinds.count(Kind.EVIDENCE_REFUSED) == 2 + IS_ROOT


def test_receipt_files_stay_inside_receipts_dir(tmp_path):
    """An account named ``..`` (Slurm passes account names as they are) and a link planted in the receipts
    directory cannot move an automatic receipt outside it."""
    from ledger.receipts.issue import write_receipt_files

    rd = tmp_path / "receipts"
    rd.mkdir()
    victim = tmp_path / "victim.json"
    victim.write_text("keep")
    (rd / "_.").mkdir()  # what ".." becomes
    os.symlink(victim, rd / "_." / "hpc1-7001-0.json")

    class R:
        body = {"job": {"account": "..", "cluster": "hpc1", "job_id": "7001", "run": 0}}

    path = write_receipt_files(R(), rd)
    assert path.parent.parent == rd and victim.read_text() == "keep"
    assert json.loads(path.read_text())["job"]["account"] == ".."


# --- 2. operator-only kinds from a spool ----------------------------------------------------------------

def test_operator_only_kinds_from_a_spool_are_refused(runner, cli, sqlite_url, writer_spool):
    eng, before = _example(sqlite_url)
    sp = writer_spool
    forged = [
        _line(Kind.ADJUSTMENT, source="cli", payload={"direction": "credit", "hours": "100", "reason": "x", "by": "y"}),
        _line(Kind.CONTRACT_VERSION, source="ipledger.contract", payload={"id": "x"}),
        _line(Kind.RECEIPT_ISSUED, source="ipledger.receipt", payload={"receipt_hash": "sha256:0"}),
        _line(Kind.GAP_RESOLUTION, payload={"gap_id": "e0", "resolution": "credit"}),
        _line(Kind.FINDING_CONFIRMED, payload={"finding": "f"}),
        _line(Kind.EVIDENCE_REFUSED, payload={"reason": "forged"}),
        _line(Kind.TREE_HEAD, source="ipledger.checkpoint", payload={"tree_size": 1, "root_hash": "00"}),
        _line(Kind.PROGRESS, source="ipledger.adjust"),   # an observation claiming the CLI's source
        # a final state claiming the accounting database's authority (which outranks every hook's view)
        _line(Kind.ALLOCATION_ENDED, source="sacct", payload={"state": "NODE_FAIL"}),
    ]
    honest = make_entry(Kind.PROGRESS, "2026-11-02T09:30:00Z", {"step": 2}, **KEY).to_record()
    text = "\n".join([*forged, json.dumps(honest)]) + "\n"
    _as_writer(sp, f"""
with open(os.path.join(SPOOL, "hook-0001.jsonl"), "w") as f:
    f.write({text!r})
""")
    r = _ship(runner, cli, sqlite_url, sp)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert len(rep["refused"]) == len(forged)
    assert sum("recorded only through the ipledger CLI" in x for x in rep["refused"]) == 7
    kinds = [c.kind for c in store.iter_entries(eng)]
    for k in (Kind.ADJUSTMENT, Kind.CONTRACT_VERSION, Kind.RECEIPT_ISSUED, Kind.GAP_RESOLUTION,
              Kind.FINDING_CONFIRMED):
        assert kinds.count(k) == (1 if k == Kind.CONTRACT_VERSION else 0), k  # the example's own contract
    assert kinds.count(Kind.EVIDENCE_REFUSED) == len(forged)
    after = receipt_for(eng, KEY["job_id"]).body
    assert after["cost"] == before["cost"] and after["adjustments"] == [] and after["contract"] == before["contract"]
    assert verify(eng).ok
    notes = (sp / "quarantine" / "hook-0001.jsonl.refused").read_text().splitlines()
    assert [json.loads(n)["line"] for n in notes] == list(range(1, len(forged) + 1))


# --- 3. one bad line ------------------------------------------------------------------------------------

BAD_LINES = [
    # an unknown interval without a cause (beside the run's other gaps it once made the receipt fail)
    _line(Kind.UNKNOWN_INTERVAL, ts_end="2026-11-02T09:10:00Z", payload={"cause": None, "scope": "run"}),
    _line(Kind.PROGRESS, source=123),
    _line(Kind.PROGRESS, node=5),
    _line(Kind.PROGRESS, cluster=True),
    _line(Kind.PROGRESS, device=1.5),
    _line(Kind.PROGRESS, node=["a"]),
    _line(Kind.PROGRESS, run=1e20),
    _line(Kind.PROGRESS, run=-1),
    '{"kind": "progress", "ts": 1e400, "job_id": "7001", "cluster": "hpc1", "run": 0}',
    _line(Kind.PROGRESS, ts="2026-13-45T00:00:00Z"),
    _line(Kind.PROGRESS, ts="9999-12-31T23:59:59Z"),
    _line(Kind.PROGRESS, ts="1970-01-01T00:00:00Z"),
    _line(Kind.PROGRESS, ts_end="2026-11-01T00:00:00Z"),
    _line(Kind.PROGRESS, payload={"hours": float("nan")}),
    _line(Kind.PROGRESS, payload='{"x": Infinity}'),
    _line(Kind.PROGRESS, payload=[1, 2]),
    _line(Kind.PROGRESS, node="\udc80bad"),
    _line(Kind.PROGRESS, node="n\x00ul"),
    _line(Kind.DEVICE_BOUND, device="GPU-x", payload={"index": "zero", "uuid": "GPU-x"}),
    _line(Kind.TELEMETRY_SEGMENT, payload={"samples_sha256": "0" * 64, "rows": 1, "devices": ["d"]},
          samples=[["d", 1.79e9, 1.0, 0] + [None] * 21]),
    _line(Kind.TELEMETRY_SEGMENT, payload={"samples_sha256": "0" * 64, "rows": 5, "devices": ["d"]}),
    '{"kind": "progress", "ts": "2026-11-02T09:00:00Z", "node": "n\xff"}',   # made non-UTF-8 below
    "[1, 2, 3]",
    "not json at all",
]


def test_bad_lines_are_refused_and_never_block_shipping_verify_or_receipts(runner, cli, sqlite_url, writer_spool):
    eng, before = _example(sqlite_url)
    sp = writer_spool
    good = [make_entry(Kind.PROGRESS, "2026-11-02T09:10:00Z", {"step": i}, **KEY).to_record() for i in range(3)]
    lines = [json.dumps(good[0]), *BAD_LINES, json.dumps(good[1])]
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape").replace("n\xff".encode(), b"n\xff")
    _as_writer(sp, f"""
with open(os.path.join(SPOOL, "collector-0001.jsonl"), "wb") as f:
    f.write({data!r})
with open(os.path.join(SPOOL, "collector-0002.jsonl"), "w") as f:
    f.write({json.dumps(good[2])!r} + "\\n")
""")
    r = _ship(runner, cli, sqlite_url, sp)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert len(rep["refused"]) == rep["refused_total"] == len(BAD_LINES), rep["refused"]
    assert rep["files"] == 2 and not rep["errors"] and not list(sp.glob("*.jsonl"))
    assert any("not UTF-8" in x for x in rep["refused"])
    steps = sorted(c.entry.data["step"] for c in store.iter_entries(eng, kinds=[Kind.PROGRESS]))
    assert steps == [0, 1, 2], "every honest line shipped, beside and after the bad ones"
    assert verify(eng).ok
    after = receipt_for(eng, KEY["job_id"]).body
    assert after["gpu_hours"]["paid"] == before["gpu_hours"]["paid"]
    refused_gaps = [g for g in after["unknown_intervals"] if g["cause"] == "evidence_refused"]
    assert refused_gaps, "a refused observation of the run is shown on its receipt as unknown, with its cause"
    # Nothing is left to block the next shipment: it finds no file and no error.
    r2 = _ship(runner, cli, sqlite_url, sp)
    assert r2.exit_code == 0 and json.loads(r2.output)["files"] == 0


def test_a_world_writable_spool_is_refused_in_one_line(runner, cli, tmp_path, sqlite_url):
    _example(sqlite_url)
    sp = tmp_path / "spool"
    sp.mkdir()
    sp.chmod(0o777)
    r = runner.invoke(cli, ["--db", sqlite_url, "ship"], env={"IPLEDGER_CONFIG": "", "IPLEDGER_SPOOL": str(sp)})
    assert r.exit_code == 1 and "writable by every user" in r.output and len(r.output.splitlines()) == 1


# --- 4. evidence outside the chain ----------------------------------------------------------------------

def _tamperable(db: Path) -> sqlite3.Connection:
    con = sqlite3.connect(db)
    for t in ("entries", "sample_blocks"):
        for action in ("update", "delete"):
            con.execute(f"DROP TRIGGER IF EXISTS {t}_no_{action}")
    return con


def _relabel(data: bytes, new_label: str) -> bytes:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    reader = ipc.open_file(pa.py_buffer(data))
    layout = json.loads(reader.schema.metadata[b"ipledger.layout"])
    layout[0][0] = new_label
    schema = reader.schema.with_metadata({b"ipledger.layout": json.dumps(layout)})
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema, options=ipc.IpcWriteOptions(compression="lz4")) as w:
        for i in range(reader.num_record_batches):
            w.write_batch(reader.get_batch(i))
    return sink.getvalue().to_pybytes()


def _segment_seq(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT seq FROM entries WHERE kind = 'telemetry_segment'").fetchone()[0]


def test_a_relabelled_or_damaged_block_and_a_hidden_index_row_are_reported(runner, cli, sqlite_url):
    import hashlib

    eng, before = _example(sqlite_url)
    eng.dispose()
    base = Path(sqlite_url.removeprefix("sqlite:///"))
    seg = _segment_seq(base)
    with sqlite3.connect(base) as con:
        data, = con.execute("SELECT data FROM sample_blocks").fetchone()

    def copy(name: str) -> Path:  # a fresh file per attack (never a copy over a file SQLite still has open)
        db = base.with_name(name)
        shutil.copy(base, db)
        return db

    def run_verify(db: Path, *extra):
        r = runner.invoke(cli, ["--db", f"sqlite:///{db}", "verify", "--json", *extra], env={"IPLEDGER_CONFIG": ""})
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        return r.exit_code, json.loads(r.stdout)

    def reseal(db: Path, new: bytes) -> None:
        con = _tamperable(db)
        con.execute("UPDATE sample_blocks SET data = ?, sha256 = ?", (new, hashlib.sha256(new).hexdigest()))
        con.commit()
        con.close()

    # a label changed, the stored sha256 recomputed: the layout no longer says whose rows these are
    db = copy("relabelled.db")
    reseal(db, _relabel(data, "GPU-someone-else"))
    code, out = run_verify(db)
    assert code == 1 and out["problems"][0]["seq"] == seg and "labels" in out["problems"][0]["reason"]

    # one byte flipped inside the compressed buffers, sha256 recomputed: a named problem, not an LZ4 traceback
    db = copy("flipped.db")
    reseal(db, bytes(_undecodable_flip(data)))
    code, out = run_verify(db)
    assert code == 1 and out["problems"][0]["seq"] == seg

    # an index rebuilt without one row: the chain (read from the table) is intact, a receipt loses the row
    db = copy("index.db")
    hidden = _hide_from_index(db, "ix_entries_job_seq", lambda con: con.execute(
        "SELECT max(seq) FROM entries WHERE job_id = '7001'").fetchone()[0])
    code, out = run_verify(db)
    assert code == 0
    code, out = run_verify(db, "--deep")
    assert code == 1 and any(p["seq"] == hidden for p in out["problems"])


def _undecodable_flip(data: bytes) -> bytearray:
    """``data`` with the first single-byte flip (from the end: the buffers come last) that stops it decoding."""
    for i in range(len(data) - 1, 0, -1):
        out = bytearray(data)
        out[i] ^= 0xFF
        try:
            blocks.decode(blocks.FORMAT, bytes(out))
        except blocks.BlockError:
            return out
    raise AssertionError("no single flip breaks this block")


def _hide_from_index(db: Path, index: str, pick) -> int:
    """Rebuild ``index`` without the row ``pick`` chooses, leaving its schema text as ipledger made it."""
    con = sqlite3.connect(db)
    seq = pick(con)
    sql = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
    con.execute(f"DROP INDEX {index}")
    con.execute(f"{sql} WHERE seq != {int(seq)}")
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql, index))
    con.commit()
    con.close()
    return seq


# --- 6. the CLI -----------------------------------------------------------------------------------------

def test_cli_bad_values_are_one_line_errors_and_out_never_damages_its_target(runner, cli, tmp_path, sqlite_url,
                                                                            monkeypatch):
    eng, _ = _example(sqlite_url)
    env = {"IPLEDGER_CONFIG": ""}

    def one_line_error(args, code=None):
        r = runner.invoke(cli, ["--db", sqlite_url, *args], env=env)
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        assert r.exit_code != 0 and "Traceback" not in r.output
        assert code is None or r.exit_code == code
        return r.output

    one_line_error(["receipt", "7001", "--as-of", str(2**63)], 2)
    one_line_error(["receipt", "7001", "--run", str(2**40)], 2)
    one_line_error(["log", "--since-seq", str(2**64)], 2)
    out = one_line_error(["adjust", "7001", "--credit", "99999999999999999999999999h", "--reason", "r", "--by", "b"])
    assert len(out.strip().splitlines()) == 1
    out = one_line_error(["adjust", "7001", "--credit", "50h", "--reason", "r", "--by", "b"])
    assert "max_adjustment_factor" in out
    # --out on a full device: one line, and nothing of the device touched
    if os.path.exists("/dev/full"):
        out = one_line_error(["receipt", "7001", "--format", "json", "--out", "/dev/full"])
        assert "not a regular file" in out
    # a write that fails half-way leaves the existing target as it was (it used to be deleted)
    target = tmp_path / "statement.parquet"
    target.write_bytes(b"last month's statement")
    import reports.export as export_mod

    def failing(st, fmt, path, **_kw):  # noqa: ANN001, ANN003
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_mod, "write", failing)
    out = one_line_error(["export", "monthly", "--month", "2026-11", "--format", "parquet", "--out", str(target)])
    assert "No space left" in out and target.read_bytes() == b"last month's statement"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".statement")] == []
    # a receipt written over an existing file replaces it whole
    good = tmp_path / "r.json"
    good.write_text("old")
    r = runner.invoke(cli, ["--db", sqlite_url, "receipt", "7001", "--format", "json", "--out", str(good)], env=env)
    assert r.exit_code == 0 and json.loads(good.read_text())["job"]["job_id"] == "7001"


# --- the chain covers what receipts read: random damage ---------------------------------------------------

@pytest.fixture(scope="module")
def small_ledger(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("attacks")
    db = d / "ledger.db"
    eng = db_mod.make_engine(f"sqlite:///{db}")
    db_mod.upgrade(eng)
    load_example(eng)
    store.append(eng, [make_entry(Kind.PROGRESS, 1_790_000_000 + i, {"step": i, "note": "é"}, node="n1", **KEY)
                       for i in range(5)])
    eng.dispose()
    return db


TEXT_COLUMNS = ("entry_id", "kind", "ts", "payload", "source", "hash", "prev_hash", "cluster", "job_id", "node",
                "device", "recorded_at", "ts_end", "source_version")


def _verify_never_raises(db: Path, deep: bool = False):
    eng = db_mod.make_engine(f"sqlite:///{db}")
    try:
        return verify(eng, deep=deep, checks=verify_checks())
    finally:
        eng.dispose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_damage_is_named_at_its_first_bad_seq(small_ledger, tmp_path_factory, data):
    work = tmp_path_factory.mktemp("damage") / "ledger.db"
    shutil.copy(small_ledger, work)
    con = _tamperable(work)
    n = con.execute("SELECT max(seq) FROM entries").fetchone()[0]
    target = data.draw(st.sampled_from(["row", "block", "block_resealed", "index"]))
    if target == "row":
        seq = data.draw(st.integers(1, n))
        cols = [c for c in TEXT_COLUMNS if con.execute(f"SELECT {c} IS NOT NULL AND length(CAST({c} AS BLOB)) > 0 "
                                                       f"FROM entries WHERE seq = ?", (seq,)).fetchone()[0]]
        col = data.draw(st.sampled_from(cols))
        raw = bytearray(con.execute(f"SELECT CAST({col} AS BLOB) FROM entries WHERE seq = ?", (seq,)).fetchone()[0])
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
        con.execute(f"UPDATE entries SET {col} = CAST(? AS TEXT) WHERE seq = ?", (bytes(raw), seq))
        con.commit()
        con.close()
        report = _verify_never_raises(work)
        assert not report.ok and report.problems[0].seq == seq, (col, report.problems)
        return
    if target.startswith("block"):
        import hashlib

        sid, data_bytes = con.execute("SELECT segment_id, data FROM sample_blocks").fetchone()
        seq = con.execute("SELECT seq FROM entries WHERE entry_id = ?", (sid,)).fetchone()[0]
        raw = bytearray(data_bytes)
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
        sha = hashlib.sha256(raw).hexdigest() if target == "block_resealed" else None
        con.execute("UPDATE sample_blocks SET data = ?, sha256 = COALESCE(?, sha256)", (bytes(raw), sha))
        con.commit()
        con.close()
        report = _verify_never_raises(work)
        if report.ok:
            # Only a byte no reader interprets may pass: every device's rows decode exactly as sealed.
            assert target == "block_resealed"
            assert _decoded(bytes(raw)) == _decoded(data_bytes)
        else:
            assert report.problems[0].seq == seq, report.problems
        return
    con.close()
    index = data.draw(st.sampled_from(["ix_entries_job_seq", "ix_entries_kind_seq", "ix_entries_kind_ts"]))
    seq = data.draw(st.integers(1, n))
    _hide_from_index(work, index, lambda _con: seq)
    assert _verify_never_raises(work).ok, "the rows themselves are intact"
    report = _verify_never_raises(work, deep=True)
    assert not report.ok and any(p.seq == seq for p in report.problems), report.problems


def _decoded(data: bytes) -> list:
    return [(d, blocks.table_rows(t)) for d, t in blocks.decode(blocks.FORMAT, data)]


def test_deep_verify_passes_an_honest_ledger_on_both_backends(engine):
    """``--deep`` on an honest ledger: ok, and on PostgreSQL amcheck really ran (no "unavailable" note)."""
    load_example(engine)
    report = verify(engine, deep=True, checks=verify_checks())
    assert report.ok and report.notes == (), (report.problems, report.notes)


def test_out_refuses_what_is_not_a_regular_file_and_replaces_whole(tmp_path):
    """The one --out helper: links, FIFOs and directories refused before anything is written (the link's
    target untouched); a writer that fails leaves the old file and no temporary; success replaces it whole."""
    from ledger.base.safeout import OutputError, output_file, write_output

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("link", "fifo", "dir"):
        with pytest.raises(OutputError, match=name):
            write_output(tmp_path / name, "x")
    assert victim.read_text() == "keep"
    with pytest.raises(RuntimeError):
        with output_file(victim) as tmp:
            tmp.write_text("half")
            raise RuntimeError("renderer failed")
    assert victim.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo", "link",
                                                                                          "victim"]
    victim.chmod(0o600)
    write_output(victim, "new")
    assert victim.read_text() == "new" and (victim.stat().st_mode & 0o777) == 0o600


_TXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_ANY = st.recursive(st.none() | st.booleans() | st.integers(-2**62, 2**62) | _TXT
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TXT, inner, max_size=3),
                    max_leaves=6)


@st.composite
def _observation(draw) -> dict:
    from ledger.receipts.example import _at

    kind = draw(st.sampled_from([Kind.ALLOCATION_STARTED, Kind.DEVICE_BOUND, Kind.TELEMETRY_SUMMARY,
                                 Kind.ALLOCATION_SUSPENDED, Kind.ALLOCATION_RESUMED, Kind.UNKNOWN_INTERVAL,
                                 Kind.PROGRESS, Kind.HOOK_ERROR, Kind.ALLOCATION_REQUEUED]))
    a = draw(st.integers(-600, 4200))
    b = draw(st.none() | st.integers(a, 4200))
    payload = draw(st.dictionaries(st.sampled_from(["account", "partition", "qos", "index", "uuid", "sku", "cause",
                                                    "scope", "values", "seconds", "sm_util_pct", "x"]) | _TXT,
                                   _ANY, max_size=5))
    device = draw(st.sampled_from([UUID, None, "GPU-other"]))
    return make_entry(kind, _at(a), {}, ts_end=None if b is None else _at(b), device=device, node="gpu-a01",
                      source="hook.slurm", **KEY).to_record() | {"payload": payload}


@pytest.fixture(scope="module")
def example_ledger(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("example") / "ledger.db"
    eng = db_mod.make_engine(f"sqlite:///{db}")
    db_mod.upgrade(eng)
    load_example(eng)
    eng.dispose()
    return db


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_observation(), min_size=1, max_size=6))
def test_whatever_a_spool_writer_ships_the_receipt_still_computes(example_ledger, tmp_path_factory, records):
    """Observations a spool writer may send, with payloads of any JSON shape: each is accepted or refused,
    and the run's receipt is computed all the same (the accounting identity holds; nothing raises)."""
    from ledger.ingest.ship import ship

    work = tmp_path_factory.mktemp("obs")
    shutil.copy(example_ledger, work / "ledger.db")
    spool.write(work / "spool", records)
    eng = db_mod.make_engine(f"sqlite:///{work / 'ledger.db'}")
    try:
        rep = ship(eng, work / "spool")
        assert rep.files == 1 and not rep.errors
        body = receipt_for(eng, KEY["job_id"], cluster=KEY["cluster"]).body
        assert body["gpu_hours"]["paid"] >= 0
        assert verify(eng).ok
    finally:
        eng.dispose()
