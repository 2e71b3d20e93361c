"""Issue 31, keys and tree shape, each attack played through the public interface as the attacker.

- the operator (or whoever holds the ledger host) rebuilds the ledger with a credit raised from 0.05 h to
  5,000 h and re-signs it with a **new** key: `verify` checks heads only against the key each head's entry
  recorded, so only a pinned key (`verify --pubkey`, config `trusted_keys`) catches it;
- the database's writer role inserts a `merkle_nodes` row outside the tree (plain SQL): `verify` names it at its
  level and index, and `ship` refuses in one line instead of an IntegrityError traceback;
- a careless operator leaves the signing key, a pinned public key or the site config writable (or readable,
  the private key) by other users, or symlinked, or owned by a non-root user that root reads: refused;
- a forged empty head (size 0, zero root), and a head whose timestamp is not a date: the offline verifier
  refuses both, and a consistency proof from the real empty head is reported as the trivial case it is.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

import ledger.proofcheck as pc
from ledger.chain import db as db_mod
from ledger.capture import spool
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.receipts.auto import verify_checks
from ledger.receipts.example import KEY, load_example
from tests import services
from ledger.chain.verify import verify

JOB = KEY["job_id"]
NOBODY = 65534
PROOFCHECK = Path(pc.__file__)


def _cli(runner, cli, *args: str, env: dict | None = None):  # noqa: ANN001, ANN202
    return runner.invoke(cli, list(args), env={"IPLEDGER_CONFIG": "", **(env or {})})


def _example(tmp_path: Path, name: str) -> str:
    url = f"sqlite:///{tmp_path / (name + '.db')}"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    load_example(engine)
    engine.dispose()
    return url


def _checkpoint(runner, cli, url: str, key: Path) -> None:  # noqa: ANN001
    assert _cli(runner, cli, "--db", url, "keygen", "--out", str(key)).exit_code == 0
    r = _cli(runner, cli, "--db", url, "checkpoint", "--key", str(key))
    assert r.exit_code == 0, r.output


def _site_ledger(runner, cli, tmp_path: Path, name: str) -> tuple[str, Path]:  # noqa: ANN001
    """The worked example with a 0.05 h credit, the site's signing key and a checkpoint: (url, private key)."""
    url = _example(tmp_path, name)
    assert _cli(runner, cli, "--db", url, "adjust", JOB, "--credit", "0.05h", "--reason", "cooling",
                "--by", "ops").exit_code == 0
    key = tmp_path / f"{name}.key"
    _checkpoint(runner, cli, url, key)
    return url, key


def _rebuilt(runner, cli, tmp_path: Path, honest_url: str) -> str:  # noqa: ANN001
    """The attacker's ledger: the same facts, the credit raised to 5,000 h (written behind the CLI, which would
    refuse it), a fresh chain and tree, signed with a new key."""
    from ledger.chain.entries import entry_from_record

    engine = db_mod.make_engine(honest_url)
    credit = next(store.iter_entries(engine, kinds=[Kind.ADJUSTMENT])).entry
    engine.dispose()
    assert credit.data["hours"] == "0.05"
    url = _example(tmp_path, "rebuilt")
    engine = db_mod.make_engine(url)
    store.append(engine, [entry_from_record({**credit.to_record(), "payload": {**credit.data, "hours": "5000"}})])
    engine.dispose()
    _checkpoint(runner, cli, url, tmp_path / "new.key")
    return url


# --- keys pinned ------------------------------------------------------------------------------------------

def test_a_rebuilt_ledger_resigned_with_a_new_key_fails_verify_pubkey(runner, cli, tmp_path):
    """Was: the rebuilt ledger passed `ipledger verify`, each head checked against the key in its own entry."""
    honest_url, site_key = _site_ledger(runner, cli, tmp_path, "honest")
    forged_url = _rebuilt(runner, cli, tmp_path, honest_url)
    site_pub = f"{site_key}.pub"
    # Unpinned, the forgery is as good as the real ledger, and verify says so: "unpinned".
    r = _cli(runner, cli, "--db", forged_url, "verify")
    assert r.exit_code == 0 and "unpinned" in r.output
    # Pinned to the site's key: the head signed by another key is a named problem.
    r = _cli(runner, cli, "--db", forged_url, "verify", "--pubkey", site_pub)
    assert r.exit_code == 1, r.output
    assert "not a pinned key" in r.output and "tree_head entry" in r.output and "Traceback" not in r.output
    # The same pin from the site config.
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'trusted_keys = ["{Path(site_pub).name}"]\n')  # relative to the config's directory
    r = runner.invoke(cli, ["--config", str(cfg), "--db", forged_url, "verify", "--json"])
    assert r.exit_code == 1 and "not a pinned key" in json.dumps(json.loads(r.stdout)["problems"])
    # `consistency` with trusted_keys takes the pinned key, not the one the forged ledger recorded.
    head = tmp_path / "forged-head.json"
    assert _cli(runner, cli, "--db", forged_url, "checkpoint", "--key", str(tmp_path / "new.key"),
                "--out", str(head)).exit_code == 0
    assert _cli(runner, cli, "--db", forged_url, "consistency", str(head), str(head)).exit_code == 0
    r = runner.invoke(cli, ["--config", str(cfg), "--db", forged_url, "consistency", str(head), str(head)])
    assert r.exit_code == 1 and "not of a trusted key" in r.output, r.output
    # The honest ledger passes the same pins, and is no longer "unpinned".
    for args in (["--db", honest_url, "verify", "--pubkey", site_pub],
                 ["--config", str(cfg), "--db", honest_url, "verify"]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 0 and "unpinned" not in r.output, r.output


def test_a_pinned_key_another_user_could_write_is_refused(runner, cli, tmp_path):
    url, key = _site_ledger(runner, cli, tmp_path, "site")
    pub = Path(f"{key}.pub")
    pub.chmod(0o666)
    r = _cli(runner, cli, "--db", url, "verify", "--pubkey", str(pub))
    assert r.exit_code == 1 and len(r.output.splitlines()) == 1
    assert str(pub) in r.output and "lets group and other users write it" in r.output


# --- modes of the private key and the config ----------------------------------------------------------------

@pytest.mark.parametrize("attack", ["mode 0666", "mode 0640", "mode 0604", "symlink", "owned by nobody"])
def test_checkpoint_refuses_a_private_key_others_could_read_or_write(runner, cli, tmp_path, sqlite_url, attack):
    """Was: `checkpoint --key` signed with a 0666 key (any user could have replaced it, or copied it)."""
    if attack == "owned by nobody" and os.geteuid() != 0:
        services.unavailable("a root reader is what this case is about (CI runs the tests as root)")
    key = tmp_path / "log.key"
    assert _cli(runner, cli, "--db", sqlite_url, "keygen", "--out", str(key)).exit_code == 0
    use = key
    if attack.startswith("mode"):
        key.chmod(int(attack.split()[1], 8))
    elif attack == "symlink":
        use = tmp_path / "link.key"
        use.symlink_to(key)
    else:
        os.chown(key, NOBODY, NOBODY)
    r = _cli(runner, cli, "--db", sqlite_url, "checkpoint", "--key", str(use))
    assert r.exit_code == 1 and len(r.output.splitlines()) == 1 and "Traceback" not in r.output, r.output
    assert str(use) in r.output and "refusing" in r.output
    engine = db_mod.make_engine(sqlite_url)
    assert not list(store.iter_entries(engine, kinds=[Kind.TREE_HEAD]))  # nothing was signed
    engine.dispose()
    key.chmod(0o600)
    if attack == "owned by nobody":
        os.chown(key, 0, 0)
    assert _cli(runner, cli, "--db", sqlite_url, "checkpoint", "--key", str(key)).exit_code == 0


@pytest.mark.parametrize("attack", ["mode 0666", "mode 0620", "directory 0777", "owned by nobody"])
def test_a_config_another_user_could_write_is_refused(runner, cli, tmp_path, attack):
    """Was: a world-writable config let any user set `[commands] nvidia-smi` for the root prolog to run."""
    if attack == "owned by nobody" and os.geteuid() != 0:
        services.unavailable("a root reader is what this case is about (CI runs the tests as root)")
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o755)
    cfg = etc / "config.toml"
    cfg.write_text(f'spool = "{tmp_path / "spool"}"\ndb = "sqlite:///{tmp_path / "l.db"}"\n'
                   f'[commands]\nnvidia-smi = "/tmp/evil"\n')
    cfg.chmod(0o644)
    if attack.startswith("mode"):
        cfg.chmod(int(attack.split()[1], 8))
    elif attack.startswith("directory"):
        etc.chmod(0o777)
    else:
        os.chown(cfg, NOBODY, NOBODY)
    r = runner.invoke(cli, ["--config", str(cfg), "init"])
    assert r.exit_code == 1 and len(r.output.splitlines()) == 1 and "Traceback" not in r.output, r.output
    assert str(cfg) in r.output and "another user could have written" in r.output
    # The root prolog reads the config through the same loader: it records nothing and runs nothing.
    from ledger.base import config

    with pytest.raises(config.ConfigError, match="another user could have written"):
        config.load_values(str(cfg), {}, snapshot=str(tmp_path / "snap"))
    etc.chmod(0o755)
    cfg.chmod(0o644)
    os.chown(cfg, os.geteuid(), os.getegid())
    assert config.load(str(cfg), {}).commands == {"nvidia-smi": "/tmp/evil"}  # the site's own config is read


def test_the_root_prolog_runs_no_command_a_world_writable_config_names(tmp_path):
    """Was: any user could edit a 0666 config's `[commands] nvidia-smi` and the root prolog ran it."""
    from ledger.cli.install_hooks import install
    from tests.standins import make_site

    site = make_site(tmp_path, tools=("nvidia-smi",))
    marker = tmp_path / "ran"
    tool = site.bin / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho ran >> '{marker}'\n")
    tool.chmod(0o755)
    prolog = install(tmp_path / "hooks", str(site.config))[0]
    env = {"SLURM_JOB_ID": "61", "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_ACCOUNT": "tenant",
           "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1",
           "SLURM_JOB_GPUS": "0"}
    site.config.chmod(0o666)
    p = subprocess.run([str(prolog)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not marker.exists()          # a hook always exits 0; it ran nothing
    assert "another user could have written" in p.stderr, p.stderr
    site.config.chmod(0o644)
    p = subprocess.run([str(prolog)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and marker.exists(), p.stderr     # the site's own config: the tool runs


def test_a_snapshot_another_user_could_write_is_not_used(tmp_path):
    """The hooks' parsed-config snapshot stands in for the config: a copy others could write is ignored."""
    import marshal

    from ledger.base import config

    cfg = tmp_path / "c.toml"
    cfg.write_text('spool = "/honest"\n')
    old = os.stat(cfg).st_mtime - 60
    os.utime(cfg, (old, old))
    snap = tmp_path / "snap"
    assert config.load_values(str(cfg), {}, snapshot=str(snap))["spool"] == "/honest"
    key, _data = marshal.loads(snap.read_bytes())
    snap.write_bytes(marshal.dumps((key, {"spool": "/forged"})))
    snap.chmod(0o600)
    assert config.load_values(str(cfg), {}, snapshot=str(snap))["spool"] == "/forged"  # a trusted copy is used
    snap.chmod(0o666)
    assert config.load_values(str(cfg), {}, snapshot=str(snap))["spool"] == "/honest"


# --- the Merkle tree's shape is exact ------------------------------------------------------------------------

def _entries(n: int, start: int = 0) -> list:
    return [make_entry(Kind.PROGRESS, 1_780_000_000 + i, {"i": i}, job_id="7") for i in range(start, start + n)]


def _plant(engine, level: int, idx: int) -> None:  # noqa: ANN001
    """INSERT one row into merkle_nodes as the writer role may (PostgreSQL: SET ROLE ipledger_writer)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL ROLE ipledger_writer"))
        conn.execute(text("INSERT INTO merkle_nodes (level, idx, hash) VALUES (:l, :i, :h)"),
                     {"l": level, "i": idx, "h": b"\x07" * 32})


def test_a_row_planted_above_the_tree_is_named_and_ship_refuses_in_one_line(ledger_url, tmp_path, runner, cli):
    """Was: `verify` passed, then the shipment that completed that subtree died on an IntegrityError."""
    engine = db_mod.make_engine(ledger_url)
    store.append(engine, _entries(40))          # stored levels 4 and 5; the tree's top is level 5
    _plant(engine, 6, 0)                        # the subtree of entries 1..64, which do not exist yet
    report = verify(engine, checks=verify_checks())
    assert not report.ok and "(level 6, index 0)" in report.problems[0].reason, report
    sp = tmp_path / "spool"
    spool.write(sp, [e.to_record() for e in _entries(30, start=40)])   # would complete entries 1..64
    r = runner.invoke(cli, ["--db", ledger_url, "ship", "--spool", str(sp), "--no-receipts"],
                      env={"IPLEDGER_CONFIG": ""})
    assert r.exit_code == 1 and "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output
    assert len(r.output.splitlines()) == 1 and "(level 6, index 0)" in r.output and "verify" in r.output
    assert store.count(engine) == 40 and len(list(sp.glob("*.jsonl"))) == 1   # nothing lost: still spooled
    # Every command that appends says the same in one line (here: signing a head).
    key = tmp_path / "log.key"
    assert runner.invoke(cli, ["keygen", "--out", str(key)]).exit_code == 0
    r = runner.invoke(cli, ["--db", ledger_url, "checkpoint", "--key", str(key)], env={"IPLEDGER_CONFIG": ""})
    assert r.exit_code == 1 and len(r.output.splitlines()) == 1 and "(level 6, index 0)" in r.output, r.output
    assert store.count(engine) == 40
    engine.dispose()


@pytest.mark.parametrize("level,idx", [(3, 0), (4, -1), (4, 2), (5, 1), (6, 0), (40, 0), (-1, 5)])
def test_every_row_outside_the_tree_is_named_at_its_level_and_index(sqlite_url, level, idx):
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, _entries(40))           # rows: (4, 0), (4, 1), (5, 0)
    _plant(engine, level, idx)
    reasons = [p.reason for p in verify(engine, checks=verify_checks()).problems]
    assert any(f"(level {level}, index {idx}) lies outside the tree of 40 entries" in r for r in reasons), reasons
    with pytest.raises(Exception, match=rf"\(level {level}, index {idx}\)"):
        store.append(engine, _entries(1, start=40))
    assert store.count(engine) == 40
    engine.dispose()


def test_no_row_of_an_honest_tree_is_outside_it(sqlite_url):
    """The shape check's other side: after appends of every size, nothing is named and appends go on."""
    from ledger.chain import merkle

    engine = db_mod.make_engine(sqlite_url)
    for n in (1, 15, 1, 16, 31, 64, 3, 129):
        store.append(engine, _entries(n, start=store.count(engine)))
        with engine.connect() as conn:
            assert merkle.outside_nodes(conn, store.count(engine)) == []
            n_now = store.count(engine)
            smaller = max(0, n_now - 16) >> 4 << 4   # a smaller tree lacks the newest rows: they are outside it
            assert bool(merkle.outside_nodes(conn, smaller)) == (n_now >= 16 + smaller and n_now >= 16)
    assert verify(engine, checks=verify_checks()).ok
    engine.dispose()


# --- the offline verifier: empty heads and timestamps --------------------------------------------------------

def _signed(key, size: int, root: bytes, timestamp: str) -> dict:  # noqa: ANN001
    fields = {"log_id": pc.log_id_of(key.public_key()), "tree_size": size, "root_hash": root.hex(),
              "timestamp": timestamp}
    return {"format": pc.HEAD_FORMAT, "algorithm": "ed25519", **fields,
            "signature": base64.b64encode(key.sign(pc.head_message(fields))).decode()}


def _run_proofcheck(tmp_path: Path, doc: dict, pub: Path) -> subprocess.CompletedProcess:
    """proofcheck.py copied alone and run as a tenant runs it, on a consistency document."""
    alone = tmp_path / "alone"
    alone.mkdir(exist_ok=True)
    (alone / "proofcheck.py").write_bytes(PROOFCHECK.read_bytes())
    c = alone / "c.json"
    c.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, "-I", str(alone / "proofcheck.py"), "--consistency", str(c),
                           "--pubkey", str(pub)], capture_output=True, text=True, timeout=60, cwd=alone)


@pytest.fixture
def site_key(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pub = tmp_path / "site.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return key, pub


def test_a_consistency_from_a_forged_empty_head_fails(tmp_path, site_key):
    """Was: a head of size 0 with a zero root "extended" to any head, and proofcheck said OK."""
    key, pub = site_key
    new = _signed(key, 5, hashlib.sha256(b"some root").digest(), "2026-12-01T00:00:00Z")
    forged = _signed(key, 0, b"\x00" * 32, "2026-11-01T00:00:00Z")
    p = _run_proofcheck(tmp_path, {"format": pc.CONSISTENCY_FORMAT, "old_head": forged, "new_head": new,
                                   "proof": []}, pub)
    assert p.returncode == 1 and "old_head: tree_size 0 with a root other than the empty tree's" in p.stderr
    # The real empty head: accepted, but said to be the trivial case, proving nothing of this log.
    empty = _signed(key, 0, hashlib.sha256(b"").digest(), "2026-11-01T00:00:00Z")
    doc = {"format": pc.CONSISTENCY_FORMAT, "old_head": empty, "new_head": new, "proof": []}
    p = _run_proofcheck(tmp_path, doc, pub)
    assert p.returncode == 0 and "OK (trivial)" in p.stdout and "proves nothing" in p.stdout, p.stdout + p.stderr
    assert pc.verify_consistency(json.dumps(doc).encode(), key.public_key())["trivial"] is True
    # ... and a "proof" from it that carries hashes is not a proof of anything.
    p = _run_proofcheck(tmp_path, {**doc, "proof": ["ab" * 32]}, pub)
    assert p.returncode == 1 and "from the empty tree has no hashes" in p.stderr


@pytest.mark.parametrize("timestamp", ["yesterday", "2026-12-01 14:42:55Z", "2026-12-01T14:42:55",
                                       "2026-02-30T00:00:00Z", "2026-12-01T25:00:00Z", "2026-12-01T14:42:55+24:00",
                                       "\u0662\u0660\u0662\u0666-12-01T00:00:00Z", ""])
def test_a_head_whose_timestamp_is_not_rfc3339_fails(tmp_path, site_key, timestamp):
    """Was: a head's timestamp was only required to be text; a signed head dated "yesterday" verified."""
    key, pub = site_key
    root = hashlib.sha256(b"r").digest()
    doc = {"format": pc.CONSISTENCY_FORMAT, "old_head": _signed(key, 5, root, timestamp),
           "new_head": _signed(key, 5, root, "2026-12-01T14:42:55.381413Z"), "proof": []}
    p = _run_proofcheck(tmp_path, doc, pub)
    assert p.returncode == 1 and "old_head.timestamp" in p.stderr and "RFC 3339" in p.stderr, p.stderr


@pytest.mark.parametrize("timestamp", ["2026-12-01T14:42:55Z", "2026-12-01T14:42:55.381413Z",
                                       "2026-12-01t14:42:55.5+05:30", "2026-12-31T23:59:59-00:00"])
def test_rfc3339_timestamps_are_accepted(site_key, timestamp):
    key, _pub = site_key
    root = hashlib.sha256(b"r").digest()
    assert pc.check_head(_signed(key, 5, root, timestamp), key.public_key()) == (5, root)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 300), level=st.one_of(st.integers(2, 9), st.integers(-3, 70)),
       idx=st.one_of(st.integers(-2, 20), st.integers(-(2**40), 2**40)))
def test_a_row_is_named_exactly_when_the_entries_do_not_make_it(tmp_path_factory, size, level, idx):
    """The shape rule as arithmetic: a row (level, idx) belongs to the tree of ``size`` entries iff
    level >= 4 and 0 <= idx < size >> level; outside_nodes names it iff it does not."""
    from ledger.chain import merkle

    path = tmp_path_factory.getbasetemp() / "shape.db"
    engine = db_mod.make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS merkle_nodes (level INTEGER, idx INTEGER, hash BLOB, "
                          "PRIMARY KEY (level, idx)) WITHOUT ROWID"))
        conn.execute(text("DELETE FROM merkle_nodes"))
        conn.execute(text("INSERT INTO merkle_nodes VALUES (:l, :i, x'00')"), {"l": level, "i": idx})
        inside = level >= merkle.STORED_LEVEL and 0 <= idx < size >> level
        assert merkle.outside_nodes(conn, size) == ([] if inside else [(level, idx)])
    engine.dispose()
