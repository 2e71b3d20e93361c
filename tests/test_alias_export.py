"""Pseudonymisation: hosts and users become keyed-HMAC aliases, stable within a key, different across keys;
names never appear in any export written with a key (csv, parquet read back, FOCUS, JSON, the PDF through
pdftotext), and the key file must not be open to every user. `export monthly` is the only command that takes a
key; receipts and analyses are site-internal and carry no alias option."""

from __future__ import annotations

import json
import shutil
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as hs

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.sim import synthetic_receipts as synthetic
from reports.alias import Aliaser, read_key
from tests.services import unavailable
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
    short.chmod(0o600)
    for p in (short, tmp_path / "missing.key"):
        try:
            read_key(p)
        except ValueError as exc:
            assert str(p) in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError("expected an error")


SECRET_USER, SECRET_NODES, SECRET_JOB_NAME = "carol-secret", ("node-secret-7", "node-secret-12"), "jobname-secret-x"
FORMATS = ("csv", "parquet", "focus", "json", "pdf")


def _key(tmp_path, mode: int = 0o600):
    key = tmp_path / "alias.key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    key.chmod(mode)
    return key


def _export_text(path, fmt: str) -> str:
    """What a reader of the file sees: text files as text, parquet read back, the PDF through pdftotext."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pandas().to_csv()
    if fmt == "pdf":
        if shutil.which("pdftotext") is None:
            unavailable("pdftotext (poppler-utils) is not installed")
        return subprocess.run(["pdftotext", "-layout", str(path), "-"], check=True, capture_output=True,
                              text=True, timeout=60).stdout
    return path.read_text()


def _export(runner, cli, url: str, fmt: str, out, key=None) -> str:
    argv = ["--db", url, "export", "monthly", "--month", "2026-11", "--format", fmt, "--out", str(out), "--quiet"]
    res = runner.invoke(cli, argv + (["--alias-key", str(key)] if key else []))
    assert res.exit_code == 0, res.output
    return _export_text(out, fmt)



def _issued_with_key(sqlite_url, receipts, tmp_path):
    """The receipts issued into the ledger, and an alias key for its exports: (key path, its Aliaser)."""
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, [issue_entry(r, NOV + 20 * 86400) for r in receipts])
    eng.dispose()
    key = _key(tmp_path)
    return key, Aliaser(read_key(key))

def test_exports_with_a_key_carry_no_host_user_or_job_name(sqlite_url, runner, cli, tmp_path):
    rs = []
    for i in range(1, 6):
        r = synthetic.receipt(i, tenant="astro", start=NOV + i * 3600, hours=2, user=SECRET_USER,
                              node=SECRET_NODES[i % 2], shares={"unknown": 0.1})
        r["job"]["name"] = SECRET_JOB_NAME  # were a receipt ever to carry the job name, no export may pass it on
        rs.append(r)
    key, alias = _issued_with_key(sqlite_url, rs, tmp_path)
    secrets = (SECRET_USER, *SECRET_NODES, SECRET_JOB_NAME)
    for fmt in FORMATS:
        plain = _export(runner, cli, sqlite_url, fmt, tmp_path / f"plain.{fmt}")
        aliased = _export(runner, cli, sqlite_url, fmt, tmp_path / f"aliased.{fmt}", key)
        assert plain.strip() and aliased.strip(), fmt
        leaked = [s for s in secrets if s in aliased]
        assert not leaked, f"{fmt} export with --alias-key contains {leaked}"
        assert SECRET_JOB_NAME not in plain, fmt
        if fmt in ("csv", "parquet", "focus"):
            # the per-run formats name users and nodes: without a key the names are there (site-internal),
            # with it exactly their aliases are, so the grep above is looking where the names would be
            assert SECRET_USER in plain and all(n in plain for n in SECRET_NODES), fmt
            assert alias.user(SECRET_USER) in aliased, fmt
            assert all(alias.host(n) in aliased for n in SECRET_NODES), fmt
        else:
            # json and the PDF statement are sums per tenant, class and hour: no per-run names at all
            assert SECRET_USER not in plain and not any(n in plain for n in SECRET_NODES), fmt
    # the same key gives the same file: aliases are stable
    again = _export(runner, cli, sqlite_url, "json", tmp_path / "again.json", key)
    assert json.loads(again) == json.loads((tmp_path / "aliased.json").read_text())
    # job names, commands and paths are not in receipts, so no column can carry them
    assert not any(k in (tmp_path / "aliased.json").read_text() for k in ("job_name", "command", "workdir"))


def test_a_key_file_every_user_can_read_is_refused(sqlite_url, runner, cli, tmp_path):
    """Whoever holds the key can undo the aliases (hash a list of hostnames), so it is kept like an ssh key."""
    for mode, ok in ((0o644, False), (0o606, False), (0o602, False), (0o600, True), (0o640, True), (0o400, True)):
        key = _key(tmp_path, mode)
        res = runner.invoke(cli, ["--db", sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "csv",
                                  "--out", str(tmp_path / "x.csv"), "--alias-key", str(key), "--quiet"])
        if ok:
            assert res.exit_code == 0, (oct(mode), res.output)
        else:
            assert res.exit_code != 0 and str(key) in res.output and f"{mode:04o}" in res.output, oct(mode)


def test_every_device_key_form_is_aliased_in_every_format(sqlite_url, runner, cli, tmp_path):
    """A GPU whose UUID could not be read is keyed ``index:HOST:N`` by the hooks, an importer's GPU without a
    UUID ``instance/gpuN``: with a key, no format names the host or the user through a device key either."""
    host_a, host_b, user = "gpu-secret-node-a", "gpu-secret-node-b", "dave-secret"
    keys = (f"index:{host_a}:0", f"{host_b}:9400/gpu3", "GPU-1234abcd-0000-1111-2222-333344445555")
    rs = []
    for i, device in enumerate(keys, start=1):
        r = synthetic.receipt(i, tenant="astro", start=NOV + i * 3600, hours=2, user=user,
                              node=(host_a, host_b)[i % 2], shares={"unknown": 0.2})
        r["job"]["devices"][0]["uuid"] = device
        r["unknown_intervals"][0].update(device=device, node=(host_a, host_b)[i % 2])
        rs.append(r)
    key, alias = _issued_with_key(sqlite_url, rs, tmp_path)
    for fmt in FORMATS:
        plain = _export(runner, cli, sqlite_url, fmt, tmp_path / f"plain.{fmt}")
        aliased = _export(runner, cli, sqlite_url, fmt, tmp_path / f"aliased.{fmt}", key)
        if fmt == "pdf":  # the statement's table of unknown intervals shows each device key (the start of it)
            assert keys[0][:12] in plain, plain
        leaked = [s for s in (host_a, host_b, user, "secret") if s in aliased]
        assert not leaked, f"{fmt} export with --alias-key contains {leaked}"
    assert alias.device(keys[0]) == f"index:{alias.host(host_a)}:0" and alias.device(keys[2]) == keys[2]
