"""Terminal escapes from the fleet never reach the operator's terminal raw: a Prometheus label (the node name of
an imported export) and a job's progress-mark notes carry ESC/OSC sequences, BEL and a bidi override, and
every command that prints them (log, explain, ask, findings, receipts, JSON output) prints them escaped, through
the one function that prints a line (``ledger.base.textsafe.echo``; JSON through ``json_text``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.canonical import ts_to_epoch
from ledger.chain.entries import Kind, make_entry
from ledger.importers import synth
from ledger.base.textsafe import json_text, printable

EVIL = "\x1b[2J\x1b]0;owned\x07\u202e\x9b31m"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


@pytest.fixture(scope="module")
def ledger_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("escapes")
    files = synth.write_query_range(root / "x", n_gpus=2, hours=1, cadence=15, jobs="slurm",
                                    metrics=synth.DEFAULT_METRICS[:3])
    for f in files:
        d = json.loads(f.read_text())
        for r in d["data"]["result"]:
            r["metric"]["Hostname"] = "node-" + EVIL + "-" + r["metric"]["Hostname"]
        f.write_text(json.dumps(d))
    url = f"sqlite:///{root / 'ledger.db'}"
    assert _run(url, "init").returncode == 0
    r = _run(url, "import", "prometheus", str(root / "x"), "--quiet")
    assert r.returncode == 0, r.stderr
    eng = db_mod.make_engine(url)
    start = next(ce.entry for ce in store.iter_entries(eng, job_id="1000") if ce.entry.kind == "allocation_started")
    t0 = ts_to_epoch(start.ts)
    store.append(eng, [make_entry(Kind.PROGRESS, t0 + 60 * i, {"kind": "checkpoint", "step": i, "note": f"ep{EVIL}{i}"},
                                  cluster=start.cluster, job_id="1000", run=0, node=start.node) for i in (1, 2)])
    eng.dispose()
    return url


class _Out:
    def __init__(self, result) -> None:  # noqa: ANN001 - a click Result
        self.returncode, self.stdout, self.stderr = result.exit_code, result.stdout, result.stderr


def _run(url: str, *argv: str) -> _Out:
    """The CLI as a terminal runs it: every byte it writes to standard output and error."""
    from ledger.cli.main import cli

    return _Out(CliRunner().invoke(cli, ["--db", url, *argv], env={"IPLEDGER_CONFIG": None}))


@pytest.mark.parametrize("argv", [
    ("log",), ("log", "--job", "1000", "--kind", "progress"), ("explain", "--job", "1000"),
    ("ask", "which node lost the most"), ("findings",), ("receipt", "1000"), ("receipt", "1000", "--format", "json"),
    ("log", "--json", "--limit", "5"),
], ids=lambda a: " ".join(a))
def test_fleet_text_reaches_the_terminal_escaped(ledger_url, argv):
    r = _run(ledger_url, *argv)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    raw = [c for c in RAW if c in out]
    assert not raw, f"{' '.join(argv)} printed raw {raw!r}: {out[:400]!r}"
    if argv[0] in ("log", "ask"):
        assert "node-" in out and "\\x1b" in out or "\\u001b" in out  # the name is shown, escaped


def test_json_output_is_the_same_document_escaped(ledger_url):
    r = _run(ledger_url, "log", "--json", "--job", "1000", "--kind", "progress")
    assert r.returncode == 0 and not any(c in r.stdout for c in RAW)
    notes = [e["payload"]["note"] for e in json.loads(r.stdout)]
    assert notes == [f"ep{EVIL}1", f"ep{EVIL}2"]   # lossless: the JSON reads back to the very note


@given(hs.text(hs.characters(blacklist_categories=()), max_size=60))
@settings(max_examples=80, deadline=None)
def test_printable_leaves_nothing_a_terminal_acts_on_and_always_encodes(text):
    out = printable(text)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c in RAW or 0xD800 <= ord(c) <= 0xDFFF for c in out)
    out.encode("utf-8")   # a lone surrogate cannot make the print raise
    doc = json.dumps({"v": text}, ensure_ascii=False)
    assert json.loads(json_text(doc)) == {"v": text}


def test_standalone_verifier_escapes_what_a_bundle_or_its_name_carries(tmp_path, capsys):
    """ipledger-verify (the tenant's standalone checker) prints a failure naming the file and the cause; a crafted
    file name or bundle field must not reach the terminal as escape sequences."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ledger import proofcheck

    pub = tmp_path / "site.pub"
    pub.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    bundle = tmp_path / "b\x1b]0;owned\x07\x1b[2J.json"
    bundle.write_text(json.dumps({"format": "\x1b[31mred\u202e"}))
    assert proofcheck.main([str(bundle), "--pubkey", str(pub)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("FAILED: ") and err == printable(err.rstrip("\n")) + "\n"
    assert "\x1b" not in err and "\u202e" not in err and "\\x1b" in err
