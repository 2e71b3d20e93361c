"""The hooks' lean fast path is the same as the library it stands in for: records, ids, parsers, config.

The hook builds spool records without ledger.entries, parses Slurm's environment without re, and reads the
site config through a snapshot; each is checked here against the library version it must equal.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import config, entries
from ledger.hooks import core, records, slurm

ROOT = Path(__file__).resolve().parent.parent

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.text(max_size=12),
                    st.floats(allow_nan=False, allow_infinity=False))
payloads = st.dictionaries(st.text(max_size=8), st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                                                             | st.dictionaries(st.text(max_size=5), c, max_size=3),
                                                             max_leaves=8), max_size=5)
instants = st.one_of(st.none(), st.floats(0, 4e9), st.integers(0, 4_000_000_000),
                     st.sampled_from(["2026-11-30T04:28:29Z", "2026-11-30T04:28:29.5Z"]))
opt_text = st.one_of(st.none(), st.text(max_size=10))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(records.HOOK_KINDS)), ts=instants.filter(lambda v: v is not None),
       payload=st.one_of(st.none(), payloads), ts_end=instants, recorded_at=instants, cluster=opt_text,
       job_id=st.one_of(st.none(), st.text(max_size=6), st.integers(0, 10**9)),
       run=st.one_of(st.none(), st.integers(0, 100)), node=opt_text, device=opt_text,
       source=st.text(min_size=1, max_size=10), source_version=st.text(max_size=5))
def test_entry_record_is_make_entry_to_record(kind, ts, payload, ts_end, recorded_at, cluster, job_id, run, node,
                                              device, source, source_version):
    kw = dict(ts_end=ts_end, recorded_at=recorded_at, cluster=cluster, job_id=job_id, run=run, node=node,
              device=device, source=source, source_version=source_version)
    rec = records.entry_record(kind, ts, payload, **kw)
    e = entries.make_entry(kind, ts, payload, **kw)
    assert rec == e.to_record()
    assert list(rec) == list(e.to_record())
    assert rec["entry_id"] == entries.compute_entry_id(e) == entries.entry_from_record(rec).entry_id


def test_hook_vocabulary_is_the_ledgers():
    assert records.ID_DOMAIN == entries.ID_DOMAIN
    assert records.HOOK_KINDS <= entries.ALL_KINDS
    hook_kinds = {v for k, v in vars(core.Kind).items() if k.isupper()}
    assert hook_kinds == set(records.HOOK_KINDS)
    assert all(getattr(entries.Kind, k) == v for k, v in vars(core.Kind).items() if k.isupper())


@given(st.text(alphabet="0123456789-:,٣ x", max_size=12))
def test_env_parsers_match_the_regular_expressions(text):
    m = re.fullmatch(r"(\d+):(\d+)", text)
    assert slurm._two_ints(text) == ((int(m.group(1)), int(m.group(2))) if m else None)
    spans = []
    for part in text.split(","):
        m2 = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m2:
            lo = int(m2.group(1))
            spans.append((lo, int(m2.group(2)) if m2.group(2) else lo))
    if sum(max(0, hi - lo + 1) for lo, hi in spans) < 10_000:  # (a huge range is expanded by both alike)
        assert slurm.parse_index_list(text) == [i for lo, hi in spans for i in range(lo, hi + 1)]


def test_job_records_are_frozen_values():
    e = slurm.job_env({"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0-1"})
    assert e == slurm.job_env({"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0-1"}) and e.gpus == (0, 1)
    assert "job_id='5'" in repr(e)
    try:
        e.job_id = "6"  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("JobEnv must be frozen")
    assert slurm.job_record({}).raw == {}


def _write(p: Path, text: str, age: float = 10.0) -> None:
    p.write_text(text)
    t = time.time() - age
    os.utime(p, (t, t))


def test_config_snapshot_is_never_stale(tmp_path):
    cfg, snap = tmp_path / "c.toml", str(tmp_path / "snap")
    _write(cfg, 'spool = "/a"\nhook_timeout_s = 2.5\n[commands]\nscontrol = "/usr/bin/scontrol"\n')
    first = config.load_values(str(cfg), {}, snapshot=snap)
    assert os.path.exists(snap), "a settled config is snapshotted"
    assert config.load_values(str(cfg), {}, snapshot=snap) == first == config.load_values(str(cfg), {})
    assert config.load(str(cfg), {}) == config.Config(**first)
    _write(cfg, 'spool = "/b"\nhook_timeout_s = 2.5\n[commands]\nscontrol = "/usr/bin/scontrol"\n')  # same size
    assert config.load_values(str(cfg), {}, snapshot=snap)["spool"] == "/b"
    _write(cfg, 'spool = "/c"\n', age=0.0)  # just written: read, not snapshotted (same-tick edits)
    assert config.load_values(str(cfg), {}, snapshot=snap)["spool"] == "/c"
    _write(cfg, 'spool = "/d"\n', age=0.0)
    assert config.load_values(str(cfg), {}, snapshot=snap)["spool"] == "/d"
    _write(cfg, 'spool = "/e"\nwhen = 2026-01-01\n')  # a TOML date: parsed each time, never snapshotted wrongly
    assert config.load_values(str(cfg), {}, snapshot=snap) == config.load_values(str(cfg), {})
    _write(cfg, 'spool = "/f"\n')
    Path(snap).write_text("garbage")
    assert config.load_values(str(cfg), {}, snapshot=snap)["spool"] == "/f"


def test_installed_hook_imports_no_heavy_stdlib(tmp_path):
    """What the installed prolog imports: none of the modules the profile found dominant (docs/performance.md)."""
    from ledger.hooks import install

    cfg = tmp_path / "c.toml"
    _write(cfg, f'spool = "{tmp_path / "spool"}"\n')
    d = tmp_path / "hooks"
    install.install(d, str(cfg))
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "n"}
    for _ in range(2):  # the second run reads the config snapshot the first one wrote
        p = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(d / "prolog")], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    imported = {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "ledger.hooks.core" in imported
    assert not imported & {"dataclasses", "inspect", "typing", "pathlib", "tomllib", "ledger.entries",
                           "subprocess"}, sorted(imported)
    assert list((tmp_path / "spool").glob("hook-*.jsonl"))
