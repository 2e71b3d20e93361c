"""Pseudonymisation: hosts and users become keyed-HMAC aliases, stable within a key, different across keys;
names never appear in any export written with a key."""

from __future__ import annotations

import datetime as dt
import json

from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger import db as db_mod
from ledger import store
from reports import synthetic
from reports.alias import Aliaser, read_key
from tests.test_export_monthly import NOV, issue_entry


@given(name=hs.text(min_size=1, max_size=40), other=hs.text(min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_aliases_are_stable_per_key_and_distinct(name, other):
    a, a2, b = Aliaser(b"k" * 32), Aliaser(b"k" * 32), Aliaser(b"z" * 32)
    assert a.host(name) == a2.host(name)
    assert a.host(name) != b.host(name)
    assert a.host(name) != a.user(name)  # the kind is part of the MAC
    if name != other:
        assert a.host(name) != a.host(other)
    assert Aliaser(None).host(name) == name


def test_key_file_errors_are_one_line(tmp_path):
    short = tmp_path / "short.key"
    short.write_bytes(b"abc\n")
    for p in (short, tmp_path / "missing.key"):
        try:
            read_key(p)
        except ValueError as exc:
            assert str(p) in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError("expected an error")


def test_exports_with_a_key_carry_no_host_or_user_names(sqlite_url, runner, cli, tmp_path):
    rs = [synthetic.receipt(i, tenant="astro", start=NOV + i * 3600, hours=2, user="carol-secret",
                            node="node-secret-7", shares={"unknown": 0.1}) for i in range(1, 6)]
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 20 * 86400) for r in rs])
    eng.dispose()
    key = tmp_path / "alias.key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    outs = {}
    for fmt in ("csv", "focus", "json", "pdf"):
        out = tmp_path / f"a.{fmt}"
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", fmt,
                                  "--out", str(out), "--alias-key", str(key), "--quiet"])
        assert res.exit_code == 0, res.output
        outs[fmt] = out
    for fmt in ("csv", "focus", "json"):
        text = outs[fmt].read_text()
        assert "carol-secret" not in text and "node-secret-7" not in text, fmt
    alias = Aliaser(read_key(key))
    assert alias.host("node-secret-7") in outs["csv"].read_text()
    assert alias.user("carol-secret") in outs["focus"].read_text()
    # the same key gives the same file: aliases are stable
    again = tmp_path / "b.json"
    runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "json",
                        "--out", str(again), "--alias-key", str(key), "--quiet"])
    assert json.loads(again.read_text()) == json.loads(outs["json"].read_text())
    # without a key the names are there (site-internal export)
    res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "csv",
                              "--out", "-", "--quiet"])
    assert "node-secret-7" in res.output
    # job names, commands and paths are not in receipts, so no column can carry them
    assert not any(k in outs["json"].read_text() for k in ("job_name", "command", "workdir"))
