"""proofcheck.py runs alone: copied by itself into an empty folder and run by a clean interpreter (``python -I``),
it verifies a real bundle made through the CLI, loading nothing but the standard library and ``cryptography``.

The package imports its plain logic from proofcheck (never the other way round), so this is the test that the
direction holds: the file names no project module, and at run time no other module is loaded.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import ledger.proofcheck as pc
from tests.test_proofs import example  # noqa: F401  (the fixture: the worked example's bundle via the CLI)

# cryptography and its compiled bindings (``_openssl``, cffi) are the one allowed non-standard dependency
ALLOWED_TOP = set(sys.stdlib_module_names) | {"cryptography", "_openssl", "cffi", "_cffi_backend"}

RUN_ALONE = r"""
import runpy, sys, json
before = set(sys.modules)  # the interpreter's own start-up (site, the environment's path hooks)
sys.argv = ["proofcheck.py", *sys.argv[1:]]
try:
    runpy.run_path("proofcheck.py", run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in set(sys.modules) - before})}), file=sys.stderr)
"""


def test_the_file_imports_only_the_standard_library_and_cryptography() -> None:
    tree = ast.parse(Path(pc.__file__).read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"a relative import in proofcheck.py (line {node.lineno})"
            names.add((node.module or "").split(".")[0])
    names.discard("__future__")
    assert names - set(sys.stdlib_module_names) == {"cryptography"}, names


def test_a_real_bundle_verifies_with_the_file_alone_in_a_clean_interpreter(example, tmp_path):  # noqa: F811
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(pc.__file__, alone / "proofcheck.py")
    shutil.copy(example["bundle"], alone / "bundle.json")
    shutil.copy(example["pub"], alone / "site.pub")
    res = subprocess.run([sys.executable, "-I", "-c", RUN_ALONE, "bundle.json", "--pubkey", "site.pub"],
                         cwd=alone, capture_output=True, text=True, timeout=120)
    report = json.loads(res.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), res.stdout + res.stderr
    assert res.stdout.strip() == example["receipt_hash"]
    assert set(report["modules"]) <= ALLOWED_TOP, sorted(set(report["modules"]) - ALLOWED_TOP)
    assert "cryptography" in report["modules"]  # the head's signature was checked, not skipped
    # the same file refuses a changed receipt figure (it recomputes the method, it does not trust the bundle)
    bundle = json.loads((alone / "bundle.json").read_text())
    bundle["receipt"]["receipt_hash"] = "0" * 64
    (alone / "bundle.json").write_text(pc.canonical_json(bundle) + "\n")
    res = subprocess.run([sys.executable, "-I", "-c", RUN_ALONE, "bundle.json", "--pubkey", "site.pub"],
                         cwd=alone, capture_output=True, text=True, timeout=120)
    assert json.loads(res.stderr.strip().splitlines()[-1])["code"] == 1, res.stdout + res.stderr


def test_a_bundle_with_format_2_columns_verifies_alone_and_any_changed_pipe_value_fails(tmp_path, runner, cli):
    """The worked example with FP32 pipe activity and op counts stored (sample block format 2): its segment
    lists the columns it carries, the bundle's rows are those columns, and proofcheck.py alone verifies it and
    refuses a bundle whose pipe value was changed (the digest covers the new columns)."""
    import dataclasses

    from ledger.chain import db as db_mod
    from ledger.receipts import example as ex
    from ledger.chain.store import append
    from ledger.telemetry.sealed import segment_entry, write_segment

    url = f"sqlite:///{tmp_path / 'f2.db'}"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    entries, samples, _spans = ex.example_entries()
    samples = [dataclasses.replace(s, fp32_active=0.25 + (i % 3) / 10, fp_ops=None if i % 2 else 1e12 + i)
               for i, s in enumerate(samples)]
    append(engine, entries[:2])
    seg = segment_entry(samples, node="gpu-a01", source="example")
    write_segment(engine, samples, seg)
    append(engine, entries[2:])
    engine.dispose()
    assert seg.data["columns"][len(pc.BASE_SAMPLE_COLUMNS):] == ["fp32_active", "fp_ops"]
    key, head, bundle = tmp_path / "site.key", tmp_path / "head.json", tmp_path / "bundle.json"
    for args in (["keygen", "--out", str(key)], ["checkpoint", "--key", str(key), "--out", str(head)],
                 ["receipt", ex.KEY["job_id"], "--proof", "--head", str(head), "--out", str(bundle)]):
        res = runner.invoke(cli, ["--db", url, *args])
        assert res.exit_code == 0, res.output
    receipt = json.loads(runner.invoke(cli, ["--db", url, "receipt", ex.KEY["job_id"], "--json"]).output)
    doc = json.loads(bundle.read_text())
    rows = doc["samples"][seg.entry_id]
    assert {len(r) for r in rows} == {len(pc.BASE_SAMPLE_COLUMNS) + 2} and rows[0][-2] == 0.25
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(pc.__file__, alone / "proofcheck.py")
    shutil.copy(bundle, alone / "bundle.json")
    shutil.copy(str(key) + ".pub", alone / "site.pub")

    def run() -> tuple[dict, str]:
        res = subprocess.run([sys.executable, "-I", "-c", RUN_ALONE, "bundle.json", "--pubkey", "site.pub"],
                             cwd=alone, capture_output=True, text=True, timeout=120)
        return json.loads(res.stderr.strip().splitlines()[-1]), res.stdout + res.stderr

    report, out = run()
    assert report["code"] in (0, None), out
    assert out.splitlines()[0].strip() == receipt["receipt_hash"]
    assert set(report["modules"]) <= ALLOWED_TOP, sorted(set(report["modules"]) - ALLOWED_TOP)
    rows[3][-2] = 0.99   # one FP32 pipe value changed
    (alone / "bundle.json").write_text(pc.canonical_json(doc) + "\n")
    report, out = run()
    assert report["code"] == 1 and "do not hash to the digest" in out, out
