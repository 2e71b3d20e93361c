"""Proof bundles and consistency proofs end to end, through the CLI and the offline verifier.

- a bundle verifies with proofcheck.py copied alone into a fresh virtual environment holding only
  `cryptography`, printing the receipt hash `ipledger receipt JOB --json` prints;
- any byte changed in a bundle (an entry, a proof node, the head, the signature, anywhere) fails;
- consistency proofs verify across appends; a truncated tail or a rewritten old entry, even re-signed with
  the site's own key, is caught against an earlier signed head.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger.proofcheck as pc
from ledger.chain import db as db_mod
from ledger.chain import heads, merkle
from ledger.chain.entries import Kind, make_entry
from ledger.receipts.example import KEY, load_example
from ledger.chain.store import append
from tests import services

JOB = KEY["job_id"]


def invoke(runner, cli, url: str, *args: str):  # noqa: ANN001, ANN201
    result = runner.invoke(cli, ["--db", url, *args], catch_exceptions=False)
    return result


@pytest.fixture
def example(tmp_path, sqlite_url, runner, cli) -> dict:  # noqa: ANN001
    """The worked example in a ledger, a site key, a checkpoint and a bundle made through the CLI."""
    engine = db_mod.make_engine(sqlite_url)
    load_example(engine)
    engine.dispose()
    os.environ.pop("IPLEDGER_CONFIG", None)
    key = tmp_path / "site.key"
    assert invoke(runner, cli, sqlite_url, "keygen", "--out", str(key)).exit_code == 0
    head = tmp_path / "head.json"
    assert invoke(runner, cli, sqlite_url, "checkpoint", "--key", str(key), "--out", str(head)).exit_code == 0
    bundle = tmp_path / "bundle.json"
    res = invoke(runner, cli, sqlite_url, "receipt", JOB, "--proof", "--head", str(head), "--out", str(bundle))
    assert res.exit_code == 0, res.output
    receipt = json.loads(invoke(runner, cli, sqlite_url, "receipt", JOB, "--json").output)
    return {"url": sqlite_url, "key": key, "pub": Path(str(key) + ".pub"), "head": head, "bundle": bundle,
            "receipt_hash": receipt["receipt_hash"]}


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path, runner, cli):
    key = tmp_path / "k"
    res = runner.invoke(cli, ["keygen", "--out", str(key)])
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"PUBLIC KEY" in Path(str(key) + ".pub").read_bytes()
    again = runner.invoke(cli, ["keygen", "--out", str(key)])
    assert again.exit_code != 0 and "never overwritten" in again.output


def test_checkpoint_records_the_head_and_verify_checks_it(example):
    engine = db_mod.make_engine(example["url"])
    head = json.loads(example["head"].read_text())
    recorded = [d for _s, d in heads.recorded_heads(engine)]
    assert [{k: v for k, v in d.items() if k != "public_key"} for d in recorded] == [head]
    assert merkle.current_root(engine)[0] == head["tree_size"] + 1  # the head's own entry came after it
    from ledger.chain.verify import verify

    assert verify(engine).ok
    engine.dispose()


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with nothing installed but `cryptography` (and what it needs)."""
    d = tmp_path_factory.mktemp("tenant") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        subprocess.run([base, "-m", "venv", str(d)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(d / "bin" / "python"), "-m", "pip", "install", "-q", "cryptography"], check=True,
                       capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        services.unavailable(f"cannot make a virtual environment with cryptography: {exc}")
    return d


def test_bundle_verifies_with_proofcheck_alone_in_a_bare_venv(example, bare_venv, tmp_path):
    tenant = tmp_path / "tenant"
    tenant.mkdir()
    for name in ("bundle", "pub"):
        shutil.copy(example[name], tenant / example[name].name)
    shutil.copy(pc.__file__, tenant / "proofcheck.py")
    py = str(bare_venv / "bin" / "python")
    # the tenant's machine: no PYTHONPATH pointing at a checkout, whatever the caller's shell has
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # nothing of ipledger (or numpy, sqlalchemy...) is importable there
    probe = subprocess.run([py, "-c", "import ledger"], cwd=tenant, capture_output=True, env=env)
    assert probe.returncode != 0
    res = subprocess.run([py, "proofcheck.py", example["bundle"].name, "--pubkey", example["pub"].name],
                         cwd=tenant, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == example["receipt_hash"]
    # and a bundle for another key's log is refused, naming the key
    other = tmp_path / "other"
    heads.keygen(other)
    res = subprocess.run([py, "proofcheck.py", example["bundle"].name, "--pubkey", str(other) + ".pub"],
                         cwd=tenant, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1 and "head.log_id" in res.stderr


def test_installed_ipledger_verify(example):
    exe = Path(sys.executable).with_name("ipledger-verify")
    res = subprocess.run([str(exe), str(example["bundle"]), "--pubkey", str(example["pub"])], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == example["receipt_hash"]


def _regions(raw: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges of the parts a tamperer would aim at (inside the canonical JSON text)."""
    bundle = json.loads(raw)
    text = raw.decode("utf-8")

    def span(value: str) -> tuple[int, int]:
        enc = json.dumps(value, ensure_ascii=False)[1:-1]
        start = text.index(enc)
        return len(text[:start].encode()), len(text[:start + len(enc)].encode())

    return {"entry": span(bundle["entries"][2]["leaf"]), "proof node": span(bundle["entries"][0]["proof"][0]),
            "head": span(bundle["head"]["root_hash"]), "signature": span(bundle["head"]["signature"]),
            "anywhere": (0, len(raw))}


@given(region=st.sampled_from(["entry", "proof node", "head", "signature", "anywhere"]), data=st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_byte_changed_fails(example, region, data):
    raw = example["bundle"].read_bytes()
    key = pc.load_public_key(example["pub"].read_bytes())
    assert pc.verify_bundle(raw, key)["receipt_hash"] == example["receipt_hash"]
    lo, hi = _regions(raw)[region]
    pos = data.draw(st.integers(lo, hi - 1), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[pos]), label="byte")
    changed = raw[:pos] + bytes([new]) + raw[pos + 1:]
    with pytest.raises(pc.Failure):
        pc.verify_bundle(changed, key)


def test_a_failure_is_named_with_exit_status_1(example, tmp_path, capsys):
    bundle = json.loads(example["bundle"].read_text())
    bundle["entries"][1]["proof"][0] = "00" * 32
    bad = tmp_path / "bad.json"
    bad.write_text(pc.canonical_json(bundle) + "\n")
    assert pc.main([str(bad), "--pubkey", str(example["pub"])]) == 1
    assert "is not included in the signed tree" in capsys.readouterr().err


def test_a_dropped_entry_is_named(example, tmp_path):
    """Leaving out an entry the receipt depends on (the credit adjustment) cannot pass either."""
    bundle = json.loads(example["bundle"].read_text())
    bundle["entries"] = [e for e in bundle["entries"] if '"adjustment"' not in e["leaf"]]
    with pytest.raises(pc.Failure, match="receipt"):
        pc.verify_bundle((pc.canonical_json(bundle) + "\n").encode(),
                         pc.load_public_key(example["pub"].read_bytes()))


# --- consistency ------------------------------------------------------------------------------------------------

def _progress(n: int, start: int = 0, tag: str = "") -> list:
    return [make_entry(Kind.PROGRESS, 1_780_000_000 + i, {"step": i, "tag": tag}, job_id="1") for i in
            range(start, start + n)]


def _ledger(tmp_path: Path, name: str, batches: list[list]) -> tuple[str, object]:
    url = f"sqlite:///{tmp_path / name}.db"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    for b in batches:
        append(engine, b)
    return url, engine


def test_consistency_proofs_verify_across_appends(tmp_path, runner, cli):
    url, engine = _ledger(tmp_path, "l", [_progress(3)])
    key = tmp_path / "k"
    heads.keygen(key)
    files = []
    for i, n in enumerate((1, 4, 9, 1, 30)):
        append(engine, _progress(n, start=100 * (i + 1)))
        out = tmp_path / f"h{i}.json"
        assert invoke(runner, cli, url, "checkpoint", "--key", str(key), "--out", str(out)).exit_code == 0
        files.append(out)
    for i, old in enumerate(files):
        for new in files[i:]:
            c = tmp_path / "c.json"
            res = invoke(runner, cli, url, "consistency", str(old), str(new), "--out", str(c))
            assert res.exit_code == 0, res.output
            assert pc.main(["--consistency", str(c), "--pubkey", str(key) + ".pub"]) == 0
    engine.dispose()


@pytest.mark.parametrize("attack", ["truncate tail", "truncate and regrow", "rewrite old entry"])
def test_rewritten_history_is_caught_against_an_earlier_head(tmp_path, runner, cli, attack):
    """The operator keeps the key and rebuilds the ledger (chain and tree recomputed, fresh checkpoint): no
    consistency proof from the rebuilt ledger verifies against the head the tenant kept."""
    key_path = tmp_path / "k"
    heads.keygen(key_path)
    key = heads.load_private_key(key_path)
    pub = pc.load_public_key(Path(str(key_path) + ".pub").read_bytes())
    honest = _progress(10)
    _url, engine = _ledger(tmp_path, "honest", [honest])
    old = heads.checkpoint(engine, key)  # the tenant keeps this head
    batches = {"truncate tail": [honest[:7]],
               "truncate and regrow": [honest[:7], _progress(6, start=50, tag="new")],
               "rewrite old entry": [honest[:4], _progress(1, start=4, tag="rewritten"), honest[5:]]}[attack]
    url2, forged = _ledger(tmp_path, "forged", batches)
    new = heads.checkpoint(forged, key)
    # the operator's own tool refuses: the old head is not a head of this ledger
    with open(tmp_path / "old.json", "w") as f:
        json.dump(old, f)
    with open(tmp_path / "new.json", "w") as f:
        json.dump(new, f)
    res = invoke(runner, cli, url2, "consistency", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                 "--pubkey", str(key_path) + ".pub")
    assert res.exit_code != 0 and ("removed" in res.output or "rewritten" in res.output)
    # and a proof computed from the forged tree anyway does not verify offline
    with forged.connect() as conn:
        proof = merkle.consistency_proof(conn, min(old["tree_size"], new["tree_size"]), new["tree_size"])
    doc = {"format": pc.CONSISTENCY_FORMAT, "old_head": old, "new_head": new, "proof": [p.hex() for p in proof]}
    with pytest.raises(pc.Failure):
        pc.verify_consistency(json.dumps(doc).encode(), pub)
    engine.dispose()
    forged.dispose()


def test_cli_help_has_examples(runner, cli):
    for cmd in ("keygen", "checkpoint", "consistency"):
        res = runner.invoke(cli, [cmd, "--help"])
        assert res.exit_code == 0 and "Example" in res.output
    assert "--proof" in runner.invoke(cli, ["receipt", "--help"]).output


def test_an_issued_receipt_names_its_tree_head(example, runner, cli):
    assert invoke(runner, cli, example["url"], "receipt", JOB, "--issue").exit_code == 0
    engine = db_mod.make_engine(example["url"])
    from ledger.chain.store import iter_entries

    issued = [c for c in iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED])][-1].entry.data
    named = issued["tree_head"]
    assert named["signed"] == json.loads(example["head"].read_text())
    assert named["tree_size"] == issued["through_seq"]
    with engine.connect() as conn:
        assert named["root_hash"] == merkle.root_at(conn, issued["through_seq"]).hex()
    engine.dispose()


def test_malformed_content_is_a_named_failure_not_a_traceback(example):
    key = pc.load_public_key(example["pub"].read_bytes())
    bundle = json.loads(example["bundle"].read_text())
    sid = next(iter(bundle["samples"]))
    bundle["samples"][sid][0][1] = "not a time"
    with pytest.raises(pc.Failure):
        pc.verify_bundle((pc.canonical_json(bundle) + "\n").encode(), key)
    with pytest.raises(pc.Failure):
        pc.verify_consistency(b'{"format": "ipledger-consistency/1", "old_head": 1, "new_head": 2, "proof": []}', key)


def test_bundles_and_heads_on_each_backend(engine, tmp_path):
    """The same bundle checks on SQLite and PostgreSQL (the tree's reads and writes differ per backend)."""
    from ledger.receipts.bundle import build_bundle, bundle_bytes
    from ledger.receipts import receipt_for

    load_example(engine)
    append(engine, _progress(40))  # enough entries for stored subtrees, not only hashed-from-entries ones
    heads.keygen(tmp_path / "k")
    key = heads.load_private_key(tmp_path / "k")
    head = heads.checkpoint(engine, key)
    bundle = build_bundle(engine, JOB, None, head)
    raw = bundle_bytes(bundle)
    assert pc.verify_bundle(raw, key.public_key())["receipt_hash"] == receipt_for(engine, JOB).hash
    from ledger.chain.verify import verify

    assert verify(engine).ok
