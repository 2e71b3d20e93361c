"""The hooks' lean fast path is the same as the library it stands in for: records, ids, parsers, config.

The hook builds spool records without ledger.chain.entries but with the ledger's one canonical encoding
(ledger.chain.canonical, which loads neither json nor datetime), parses Slurm's environment without re, and reads
the site config through a snapshot; each is checked here against the library version it must equal.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ledger.chain import canonical, entries
from ledger.base import config
from ledger.capture.hooks import core, records, slurm

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


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                                     st.text(max_size=10)),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=12)


def _same(a, b) -> bool:
    """Equality that counts NaN equal to NaN (json round-trips NaN, == does not)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_lean_json_is_the_json_module(value):
    spool_line = canonical.json_encoder(ensure_ascii=False, allow_nan=True, item_sep=",", key_sep=":")
    assert spool_line(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    state_json = canonical.json_encoder(ensure_ascii=True, allow_nan=True, item_sep=", ", key_sep=": ")
    assert state_json(value) == json.dumps(value, sort_keys=True)
    reference = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    try:
        expected = reference(value)
    except ValueError:  # NaN/Infinity are refused alike
        try:
            canonical.canonical_json(value)
        except ValueError:
            pass
        else:
            raise AssertionError("canonical_json must refuse what the json module refuses")
    else:
        assert canonical.canonical_json(value) == expected
    text = json.dumps(value)
    for t in (text, f" \n{text}\t "):
        assert _same(canonical.loads(t), json.loads(t))


@given(st.text(max_size=12))
@example('"a\x01b"')
@example('{"a":"\x00"}')
@example('["\x1f"]')
def test_lean_loads_refuses_what_json_refuses(text):
    try:
        expected = json.loads(text)
    except ValueError:
        try:
            canonical.loads(text)
        except ValueError:
            return
        raise AssertionError(f"json.loads refuses {text!r}, canonical.loads accepted it")
    assert _same(canonical.loads(text), expected)


def test_lean_json_refuses_what_json_refuses():
    spool_line = canonical.json_encoder(ensure_ascii=False, allow_nan=True, item_sep=",", key_sep=":")
    for bad in ({"a": object()}, [1, {2, 3}]):
        for lean in (spool_line, canonical.canonical_json):
            try:
                lean(bad)
            except TypeError as exc:
                assert "is not JSON serializable" in str(exc)
            else:
                raise AssertionError("must refuse")
    cyc: list = []
    cyc.append(cyc)
    try:
        spool_line(cyc)
    except ValueError:
        pass
    else:
        raise AssertionError("circular reference must be refused")


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.floats(0, 253402300798), st.integers(0, 253402300798),
                 st.floats(1.7e9, 1.8e9), st.floats(-1e3, 3e11), st.sampled_from([math.nan, math.inf, -0.0, 253402300798.9999995]),
                 st.integers(-10, 10).map(lambda k: 1796018000 + k / 1e6 + 5e-7), st.booleans()))
def test_lean_format_ts_is_datetimes(value):
    """canonical.format_ts formats epoch numbers without datetime, exactly as datetime.fromtimestamp would."""
    import datetime

    try:
        if value is None or isinstance(value, bool):
            raise TypeError
        d = datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
        expected = d.strftime("%Y-%m-%dT%H:%M:%S") + (f".{d.microsecond:06d}".rstrip("0") if d.microsecond else "") + "Z"
    except (ValueError, OverflowError, OSError, TypeError) as exc:
        try:
            canonical.format_ts(value)
        except (ValueError, OverflowError, OSError, TypeError, AttributeError):
            return
        if isinstance(value, bool):
            return  # bool is an int to datetime's caller, not an epoch: no claim either way
        raise AssertionError(f"{value!r}: datetime raises {exc!r}, canonical.format_ts does not")
    assert canonical.format_ts(value) == expected


def test_hook_vocabulary_is_the_ledgers():
    assert canonical.ID_DOMAIN == entries.ID_DOMAIN
    assert records.HOOK_KINDS <= entries.ALL_KINDS
    assert core.Kind is entries.Kind  # one vocabulary, from ledger.chain.kinds (no import cost on the hook path)


@given(st.text(alphabet="0123456789-:,٣ x", max_size=12))
def test_env_parsers_match_the_regular_expressions(text):
    m = re.fullmatch(r"(\d+):(\d+)", text)
    assert slurm.two_ints(text) == ((int(m.group(1)), int(m.group(2))) if m else None)
    spans = []
    for part in text.split(","):
        m2 = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m2:
            lo = int(m2.group(1))
            hi = int(m2.group(2)) if m2.group(2) else lo
            if hi <= slurm.MAX_GPU_INDEX:  # a larger index is corrupt input, skipped (tests/test_fuzz_parsers.py)
                spans.append((lo, hi))
    want = sorted({i for lo, hi in spans for i in range(lo, hi + 1)})  # distinct GPUs, at most MAX_GPUS
    assert slurm.parse_index_list(text)[0] == want[:slurm.MAX_GPUS]


# The dcgmi parsers the hooks call read their lines with str methods (no ``re`` on the hook path); each must
# accept exactly what the regular expression it replaced accepted, and capture the same text.
_DCGM_PIECES = ["|", " ", "  ", "\t", "\u3000", "GPU ID:", "Summary", "0", "7", "12", "1234567890", "\u0663", "\u00b2",
                "Name:", "PCI Bus ID:", "Device UUID:", "NVIDIA H100", ".", "_", "x", "-",
                "Successfully retrieved statistics for job:", "with a group ID of"]
dcgm_lines = st.one_of(st.lists(st.sampled_from(_DCGM_PIECES), max_size=10).map("".join),
                       st.text(max_size=20)).filter(lambda s: s.splitlines() in ([s], []))


@settings(max_examples=600, deadline=None)
@given(dcgm_lines)
def test_dcgm_line_parsers_match_the_regular_expressions(line):
    from ledger.capture.sources import dcgm

    m = re.match(r"\|\s*(GPU ID:\s*\d{1,9}|Summary)\s*\|\s*$", line)
    want = None if m is None else (None,) if m.group(1) == "Summary" else (int(m.group(1)[7:].strip()),)
    assert dcgm.block_header(line) == want
    m = re.match(r"\s*Successfully retrieved statistics for job:\s*(.*?)\.\s*$", line)
    assert dcgm.stats_job_id(line) == (m.group(1) if m else None)
    m = re.match(r"\|\s*(\d{1,9})\s*\|\s*Name:\s*(.*?)\s*\|\s*$", line)
    assert dcgm.discovery_gpu_row(line) == ((int(m.group(1)), m.group(2)) if m else None)
    m = re.match(r"\|\s*\|\s*(PCI Bus ID|Device UUID):\s*(.*?)\s*\|\s*$", line)
    assert dcgm.discovery_detail_row(line) == (
        ("pci_bus_id" if m.group(1).startswith("PCI") else "uuid", m.group(2)) if m else None)
    m = re.fullmatch(r"[\d.]+", line)
    try:
        want_f = float(line) if m else None
    except ValueError:
        want_f = None  # "1.2.3": digits and dots, yet no number (the regex version raised here)
    assert dcgm._plain_float(line) == want_f


@settings(max_examples=300, deadline=None)
@given(st.lists(dcgm_lines, max_size=4).map("\n".join))
def test_dcgm_group_id_matches_the_regular_expression(text):
    from ledger.capture.sources import dcgm

    m = re.search(r"with a group ID of\s+(\d{1,18})\b", text)
    assert dcgm.parse_group_create(text) == (int(m.group(1)) if m else None)


@given(st.text(alphabet="-+0123456789\u0663\u00b2 .x", max_size=8))
def test_nvidia_smi_integer_cells_match_the_regular_expression(text):
    from ledger.capture.sources import nvml

    assert nvml.is_integer_text(text) == bool(re.fullmatch(r"-?\d+", text))


def _outcome(fn, *args):
    try:
        return fn(*args)
    except (ValueError, OverflowError) as exc:
        return type(exc)


_two = st.one_of(st.integers(0, 99).map(str), st.integers(0, 9).map(lambda i: f"0{i}"), st.sampled_from(["", "x", "\u0663"]))


@settings(max_examples=600, deadline=None)
@given(wd=st.sampled_from(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun", "fri", "Friday", "Xyz"]),
       mon=st.sampled_from(["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
                            "feb", "February", "Foo"]),
       day=_two, hh=_two, mm=_two, ss=_two,
       year=st.one_of(st.integers(1900, 2100).map(str), st.sampled_from(["0999", "99", "20x1", "2000", "1900"])),
       sep=st.sampled_from([" ", "  ", "\t"]))
def test_dcgm_ctime_matches_strptime(wd, mon, day, hh, mm, ss, year, sep):
    from ledger.capture.sources import dcgm

    text = sep.join([wd, mon, day, f"{hh}:{mm}:{ss}", year])
    reference = _outcome(lambda t: time.mktime(time.strptime(" ".join(t.split()), "%a %b %d %H:%M:%S %Y")), text)
    assert _outcome(dcgm.parse_ctime, text) == reference


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
    from ledger.cli import install_hooks as install

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
    assert "ledger.capture.hooks.core" in imported
    assert not imported & {"dataclasses", "inspect", "typing", "pathlib", "tomllib", "ledger.chain.entries",
                           "subprocess", "json", "re", "hashlib", "datetime", "ledger.capture.sources"}, sorted(imported)
    assert list((tmp_path / "spool").glob("hook-*.jsonl"))


def test_installed_hooks_with_vendor_tools_import_no_heavy_stdlib(tmp_path):
    """With DCGM and nvidia-smi configured the hooks run five and four tools: still none of subprocess (signal,
    threading, selectors), dataclasses, typing, re, _strptime or the ship-time parsers on their imports (the
    epilog not even the hooks' own parsers, ledger.capture.hooks.vendor), and what they record is complete
    (devices mapped to UUIDs, DCGM's raw report, and its summaries once derived, no hook_error)."""
    from ledger.cli import install_hooks as install
    from tests.standins import make_site

    site = make_site(tmp_path / "site", tools=("dcgmi", "nvidia-smi"))
    d = tmp_path / "hooks"
    old = time.time() - 60  # a site's config is old: the hooks read its snapshot, not the TOML (tomllib -> re)
    os.utime(site.config, (old, old))
    install.install(d, str(site.config))
    env = {"SLURM_JOB_ID": "91", "SLURM_JOB_GPUS": "0,1", "SLURMD_NODENAME": "node1", "SLURM_JOB_UID": "0"}
    for kind in ("prolog", "epilog"):  # an earlier job on the node made the snapshot
        subprocess.run([str(d / kind)], env={**env, "SLURM_JOB_ID": "90"}, check=True, timeout=60)
    heavy = {"subprocess", "signal", "threading", "selectors", "dataclasses", "inspect", "typing", "re", "enum",
             "_strptime", "datetime", "json"}
    for kind in ("prolog", "epilog"):
        p = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", str(d / kind)], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "ipledger-hook" not in p.stderr, p.stderr[-2000:]
        imported = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
        assert "ledger.base.commands" in imported
        # the prolog parses the inventory and DCGM's answers; the epilog records raw and parses nothing
        assert ("ledger.capture.hooks.vendor" in imported) == (kind == "prolog"), sorted(imported)
        assert not imported & heavy and not any(m.startswith("ledger.capture.sources") for m in imported), sorted(imported)
    from tests.standins import with_derived

    recs = with_derived([json.loads(ln) for f in sorted(Path(site.spool).glob("*.jsonl"))
                         for ln in f.read_text().splitlines()])
    mine = [r for r in recs if r["job_id"] == "91"]
    kinds = [r["kind"] for r in mine]
    assert "hook_error" not in kinds and kinds.count("device_bound") == 2 and kinds.count("telemetry_summary") == 2
    assert all(json.loads(r["payload"])["uuid"] for r in mine if r["kind"] == "device_bound")


def _gone(pid: int, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:  # a zombie (Z) is dead, waiting for its new parent to reap it
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    raise AssertionError(f"process {pid} outlived the deadline")


def test_commands_spawn_keeps_what_subprocess_gave(tmp_path):
    """ledger.base.commands without subprocess: exit codes, both streams, universal newlines, a deadline that holds
    even when a grandchild keeps the pipe open (the program itself is killed and reaped), failures as values."""
    from ledger.base import commands

    sh = "/bin/sh"
    assert commands.spawn_and_wait([sh, "-c", "printf 'a\\r\\nb'; echo err >&2; exit 3"], timeout=5) == \
        (3, "a\nb", "err\n", False, False)
    assert commands.spawn_and_wait([sh, "-c", "cat; echo $X"], timeout=5, env={"X": "y"}) == \
        (0, "y\n", "", False, False)
    t0 = time.monotonic()
    code, out, _err, timed_out, _cut = commands.spawn_and_wait(
        [sh, "-c", f"echo started; sleep 30 & echo $! > {tmp_path / 'pid'}; wait"], timeout=0.5)
    assert (code, out, timed_out) == (124, "started\n", True) and time.monotonic() - t0 < 5
    _gone(int((tmp_path / "pid").read_text()))  # the grandchild went with its process group
    big = commands.spawn_and_wait([sh, "-c", "head -c 300000 /dev/zero | tr '\\0' x"], timeout=5)[1]
    assert big == "x" * 300_000  # more than a pipe buffer: both pipes are drained while waiting
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text("#!/bin/sh\necho \"$@\"\n")
    dcgmi.chmod(0o755)
    r = commands.run("dcgmi", ["discovery", "-l"], commands={"dcgmi": str(dcgmi)}, timeout=5)
    assert r.ok and r.stdout == "discovery -l\n" and r == commands.CommandResult(
        (str(dcgmi), "discovery", "-l"), 0, "discovery -l\n", "")
    dcgmi.write_text("not a script\n")
    r2 = commands.run("dcgmi", ["discovery", "-l"], commands={"dcgmi": str(dcgmi)}, timeout=5)
    assert (r2.returncode, r2.ok) == (126, False) and "Exec format error" in r2.stderr  # as subprocess raised
    assert commands.run("dcgmi", ["discovery", "-l"], commands={"dcgmi": str(tmp_path / "absent")}).returncode == 127
    try:
        r.returncode = 1  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("CommandResult must be immutable")


def test_programs_started_together_are_each_bounded_as_one_alone(tmp_path):
    """ledger.base.commands.spawn_all_and_wait: each program keeps spawn_and_wait's bounds while the others run —
    its own streams, exit status and output cap, the one deadline (a hung one and its grandchild are killed,
    the others' answers kept), a program that cannot start is an OSError in its place; and their waits
    overlap (two that each sleep 0.6 s take about 0.6 s together, not 1.2 s)."""
    from ledger.base import commands

    sh = "/bin/sh"
    quick = [sh, "-c", "printf 'a\\r\\nb'; echo err >&2; exit 3"]
    chatty = [sh, "-c", "head -c 300000 /dev/zero | tr '\\0' x; echo done >&2"]
    hung = [sh, "-c", f"echo started; sleep 30 & echo $! > {tmp_path / 'pid'}; wait"]
    absent = [str(tmp_path / "absent")]
    t0 = time.monotonic()
    got = commands.spawn_all_and_wait([quick, hung, chatty, absent, quick], timeout=1.0, max_output=100_000)
    assert time.monotonic() - t0 < 5
    assert got[0] == got[4] == (3, "a\nb", "err\n", False, False) == commands.spawn_and_wait(quick, timeout=5)
    assert got[1] == (124, "started\n", "", True, False)
    _gone(int((tmp_path / "pid").read_text()))  # the grandchild went with its process group
    assert got[2] == commands.spawn_and_wait(chatty, timeout=5, max_output=100_000) == \
        (125, "x" * 100_000, "output exceeded 100000 bytes; killed", False, True)
    assert isinstance(got[3], FileNotFoundError)
    assert commands.spawn_all_and_wait([chatty, quick], timeout=5)[0] == (0, "x" * 300_000, "done\n", False, False)
    # past its cap a program's group is killed at once, not when the others are done
    pid = tmp_path / "pid2"
    over = [sh, "-c", f"sleep 30 & echo $! > {pid}; head -c 300000 /dev/zero; wait"]
    check = [sh, "-c", f"sleep 1; s=$(cut -d' ' -f3 /proc/$(cat {pid})/stat 2>/dev/null); "  # a zombie (Z) is dead
                       'case "$s" in ""|Z|X) echo gone;; *) echo alive;; esac']
    cut, checked = commands.spawn_all_and_wait([over, check], timeout=10, max_output=1000)
    assert cut[4] and checked == (0, "gone\n", "", False, False)
    t0 = time.monotonic()
    both = commands.spawn_all_and_wait([[sh, "-c", "sleep 0.6; echo one"], [sh, "-c", "sleep 0.6; echo two"]],
                                       timeout=10)
    assert [b[1] for b in both] == ["one\n", "two\n"] and time.monotonic() - t0 < 1.1
    assert commands.spawn_all_and_wait([], timeout=1) == []


def test_run_all_answers_as_run_does_one_by_one(tmp_path):
    """ledger.base.commands.run_all: one CommandResult per call, in order, each what run() gives for it alone
    (a missing program 127, one that cannot execute 126, a hung one timed out under the same deadline)."""
    from ledger.base import commands

    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text("#!/bin/sh\ncase \"$1\" in stats) sleep 30;; esac\necho \"$@\"\n")
    dcgmi.chmod(0o755)
    broken = tmp_path / "nvidia-smi"
    broken.write_text("not a script\n")
    cmds = {"dcgmi": str(dcgmi), "nvidia-smi": str(broken), "amd-smi": str(tmp_path / "absent")}
    calls = [("dcgmi", ["discovery", "-l"]), ("nvidia-smi", ["-L"]), ("amd-smi", ["list"]),
             ("dcgmi", ["stats", "-r", "7.0"]), ("dcgmi", ["group", "-d", "3"])]
    together = commands.run_all(calls, commands=cmds, timeout=0.5)
    alone = [commands.run(p, a, commands=cmds, timeout=0.5) for p, a in calls]
    assert together == alone
    assert [r.returncode for r in together] == [0, 126, 127, 124, 0] and together[3].timed_out


def test_frozen_records_pickle_and_copy_like_frozen_dataclasses(tmp_path):
    """Config and SpoolRead are Frozen (no dataclasses on the hook path); ship's workers pickle SpoolRead."""
    import copy
    import pickle
    from pathlib import Path

    import pytest

    from ledger.base import config
    from ledger.capture import spool

    cfg = config.Config(db="sqlite:///x.db", commands={"dcgmi": "/usr/bin/dcgmi"})
    read = spool.SpoolRead(path=Path(tmp_path / "a.jsonl"), records=[{"k": 1}], torn=None, errors=[])
    for value in (cfg, read):
        assert pickle.loads(pickle.dumps(value)) == value
        assert copy.deepcopy(value) == value and copy.copy(value) == value
    assert cfg.spool == config.DEFAULT_SPOOL and cfg.extra == {} and cfg.hook_timeout_s == 5.0
    with pytest.raises(AttributeError):
        cfg.db = "other"


def test_lean_loads_refuses_raw_control_characters_without_json_imported():
    """The hooks read with json never imported: CPython's scanner then cannot raise its own error for a raw
    control character inside a string (it returned NULL and the hook saw SystemError, not ValueError)."""
    import subprocess
    import sys as _sys

    code = (
        "import sys; from ledger.chain import canonical\n"
        "assert 'json.decoder' not in sys.modules\n"
        "for t in ['\"a\\x01b\"', '{\"k\":\"\\x00\"}', '[1,\"\\x1f\"]']:\n"
        "    try:\n"
        "        canonical.loads(t)\n"
        "    except ValueError:\n"
        "        continue\n"
        "    raise SystemExit('accepted ' + repr(t))\n"
        "print('ok')\n"
    )
    done = subprocess.run([_sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
