"""Path B captures as prospects send them (issue 28): a set of per-node dmon / amd-smi files in one `analyze`,
amd-smi's watch banner and violation columns, wall-clock anchors (a restart is a capture_restarted gap), and the
capture commands `pathb-command` prints (every field the agents read; their output is what the importers read)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import tarfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ledger.importers import amdsmi, dmon
from ledger.importers.captures import node_from_name, read_set
from ledger.sim import FleetSpec, simulate
from ledger.sim.captures import write_amdsmi_set, write_dmon_set
from tests.conftest import FIXTURES

T0 = 1793577600.0   # 2026-11-02T00:00:00Z


def _vals(c, dev, name):
    return list(c.series[dev][name][1])


@pytest.fixture(scope="module")
def hall():
    """The small hall (seed 7), and the day holding rack R3's cooling incident (as tests/test_analyze.py)."""
    sim = simulate(FleetSpec.small(), 7)
    cool = next(f for f in sim.truth["faults"] if f["cause"] == "cooling")
    start = int((cool["start"] - sim.t[0]) // sim.spec.cadence_s) - 36
    nodes = sorted({d.node for d in sim.devices if d.rack in ("R2", "R3")})
    return sim, start, nodes


@pytest.fixture(scope="module")
def amd_hall():
    sim = simulate(replace(FleetSpec.small(), amd_nodes=2), 3)
    return sim, sorted({d.node for d in sim.devices if d.vendor == "AMD"})


# --- amd-smi: the watch banner, CRLF, repeated headers, violation statuses --------------------------------------

def test_amd_metric_watch_csv_with_banner_crlf_and_throttle_columns():
    """The fixture starts with amd-smi's own watch banner (refused on main: 'line 1: not amd-smi ... output');
    GPU 1's ppt_violation_status ACTIVE is NVML's SW power cap bit 0x4, GPU 0's NOT ACTIVE statuses are 0."""
    c = amdsmi.read(FIXTURES / "amd_smi" / "metric_csv_watch_throttle_mi300x_banner_crlf.csv", node="mi300-01")
    assert c.skipped == {"tool_banner": 1}
    assert _vals(c, "mi300-01/gpu1", "clock_reasons") == [4.0, 4.0, 4.0]
    assert _vals(c, "mi300-01/gpu0", "clock_reasons") == [0.0, 0.0, 0.0]
    assert _vals(c, "mi300-01/gpu1", "power_w") == [421.0] * 3           # three iterations, headers skipped
    assert not any("violation" in k or k == "accumulation_counter" for k in c.unmapped)


@pytest.mark.parametrize("cols,row,bits", [
    ("gpu,power_usage,pviol,tviol,tviol_active,phot_tviol,vr_tviol,hbm_tviol", "0,420,100,0,False,0,0,0", 0x4),
    ("gpu,power_usage,pviol,tviol,tviol_active,phot_tviol,vr_tviol,hbm_tviol", "0,700,0,0,True,0,0,0", 0x20),
    ("gpu,socket_power,prochot_violation_status,hbm_thermal_violation_status", "0,700,ACTIVE,ACTIVE", 0x48),
    ("gpu,socket_power,throttle_status", "0,700,THROTTLED", 0x8),                # no reason named: HW slowdown
    ("gpu,socket_power,throttle_status,ppt_violation_status", "0,700,THROTTLED,ACTIVE", 0x4),   # the named one
])
def test_amd_violation_columns_map_to_nvml_reasons(cols, row, bits):
    text = f"'CTRL' + 'C' to stop watching output:\r\n{cols}\r\n{row}\r\n{cols}\r\n{row}\r\n"
    c = amdsmi.parse(text, "v.csv", start=T0, interval=15.0, node="n")
    assert _vals(c, "n/gpu0", "clock_reasons") == [float(bits)] * 2


def _mi300x_capture(path: Path, capped: int, hours: float = 6, with_violation: bool = True) -> Path:
    """`amd-smi monitor --csv` of 8 MI300X at one load for ``hours``, GPU ``capped`` held at a 420 W cap from the
    end of the first hour (the monitor names no SKU: a device's rated clock is its own loaded p99)."""
    cols = "gpu,power_usage,hotspot_temperature,gfx,gfx_clock,vram_used" + (
        ",pviol,tviol,tviol_active,phot_tviol,vr_tviol,hbm_tviol" if with_violation else "")
    lines = ["# ipledger-start 2026-11-02T00:00:00Z node=mi300-01 interval_ms=60000",
             "'CTRL' + 'C' to stop watching output:"]
    for k in range(int(hours * 60)):
        lines.append(cols)
        for g in range(8):
            cap = g == capped and k >= 60
            row = f"{g},{420 if cap else 700 - (k + g) % 7},{72 if cap else 84},95,{1420 if cap else 2100},150000"
            lines.append(row + ((",100" if cap else ",0") + ",0,False,0,0,0" if with_violation else ""))
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return path


def test_power_cap_on_one_mi300x_is_power_cap_not_sibling_divergence(runner, cli, tmp_path):
    """One MI300X held at a power cap, its PVIOL column saying so: a power_cap finding on that GPU, and no
    sibling_divergence / drain-or-RMA (which is what its low clock alone, read without the violation column,
    looks like)."""
    src = _mi300x_capture(tmp_path / "amdsmi-mi300-01.csv", capped=3)
    r = runner.invoke(cli, ["analyze", str(src), "--json"])
    assert r.exit_code == 0, r.output
    found = json.loads(r.output)["findings"]
    on_gpu3 = [f for f in found if f["scope"].get("device_uuid") == "mi300-01/gpu3"]
    kinds = {f["kind"] for f in on_gpu3}
    assert "power_cap" in kinds, [(f["kind"], f["scope"]) for f in found]
    assert "sibling_divergence" not in kinds and "reseat_or_rma_device" not in kinds
    # the same capture without the violation columns (the monitor command printed before): only a slow sibling
    bare = _mi300x_capture(tmp_path / "amdsmi-mi300-02.csv", capped=3, with_violation=False)
    r = runner.invoke(cli, ["analyze", str(bare), "--json"])
    assert {f["kind"] for f in json.loads(r.output)["findings"]
            if f["scope"].get("device_uuid") == "mi300-01/gpu3"} >= {"sibling_divergence"}


# --- restarts ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("restart_file", ["same", "new"])
def test_a_restarted_dmon_capture_is_a_capture_restarted_gap(hall, tmp_path, restart_file):
    """Node B1's dmon stops for 40 minutes (8 ticks of 5 min) and starts again, appended to its file or in a
    second file: the hole is an unknown interval caused by capture_restarted, exactly where the capture was
    down, and the ticks after it keep their own times (main: no gap, later ticks shifted 40 minutes earlier)."""
    sim, start, nodes = hall
    stop, resume = start + 100, start + 108
    write_dmon_set(sim, tmp_path, nodes[:2], start, 200, restart=(nodes[0], stop, resume), restart_file=restart_file)
    assert len(list(tmp_path.iterdir())) == (2 if restart_file == "same" else 3)
    c = read_set([str(tmp_path)])
    from ledger.importers.pipeline import ImportOptions, timeline_for

    dev = f"{nodes[0]}/gpu0"
    tl = timeline_for(c, dev, ImportOptions())
    restarted = [g for g in tl.gaps if g.cause == "capture_restarted"]
    assert [(g.start, g.end) for g in restarted] == [(float(sim.t[stop]), float(sim.t[resume]))]
    pts = sorted(zip(*c.series[dev]["power_w"]))           # files are read in name order, not time order
    i = next(k for k, d in enumerate(sim.devices) if d.node == nodes[0] and d.index == 0)
    assert pts[100][0] == float(sim.t[resume])              # the first tick after the restart, at its own time
    assert pts[100][1] == pytest.approx(float(sim.arrays["power_w"][i, resume]), abs=0.01)
    other = timeline_for(c, f"{nodes[1]}/gpu0", ImportOptions())
    assert not other.gaps                                  # the other node ran through


# --- capture sets in one analyze ------------------------------------------------------------------------------

def test_a_dmon_set_is_one_analysis_with_rack_and_sibling_comparisons(hall, runner, cli, tmp_path):
    """Six nodes' dmon files (a directory) in one command: all 48 GPUs in one analysis, rack R3's cooling found
    on its nodes (C1..C3, as on the Prometheus export of the same day) and node B3's XIDs."""
    sim, start, nodes = hall
    write_dmon_set(sim, tmp_path / "captures", nodes, start, 288)
    r = runner.invoke(cli, ["analyze", str(tmp_path / "captures"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["meta"]["devices"] == 48 and {d["node"] for d in out["devices"]} == set(nodes)
    hot = [f for f in out["findings"] if f["kind"] == "hot_because_cooling"]
    assert hot and {f["scope"]["node"] for f in hot} <= {"C1", "C2", "C3"}
    assert any(f["kind"] == "xid" for f in out["findings"])
    assert {s["kind"] for s in out["sources"]} == {"dmon"}


def test_an_amd_smi_set_with_banner_crlf_and_repeated_headers_is_one_analysis(amd_hall, runner, cli, tmp_path):
    sim, nodes = amd_hall
    paths = write_amdsmi_set(sim, tmp_path / "captures", nodes, 0, 288)
    raw = paths[0].read_bytes()
    assert b"\r\n" in raw and raw.count(b"gpu,power_usage") == 288 and b"stop watching output" in raw
    r = runner.invoke(cli, ["analyze", *map(str, paths), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["meta"]["devices"] == 16 and {d["node"] for d in out["devices"]} == set(nodes)
    assert out["import"]["devices"] == 16
    acct = out["account"]
    assert abs(acct["paid"] - acct["delivered"] - acct["lost"]) < 1e-3 and acct["delivered"] > 0


def test_a_mixed_set_of_dmon_and_amd_smi_files_is_one_analysis(hall, amd_hall, tmp_path):
    sim, start, nodes = hall
    write_dmon_set(sim, tmp_path, nodes[:2], start, 60)
    asim, anodes = amd_hall
    write_amdsmi_set(asim, tmp_path, anodes[:1], 0, 60)
    from ledger.agents.export_analysis import analyze_collected

    c = read_set([str(tmp_path)])
    assert c.source == "capture_set" and len(c.devices) == 24
    out = analyze_collected(c, sources=[str(tmp_path)]).to_json()
    assert out["meta"]["devices"] == 24


def _tar(path: Path, members: list[tuple[str, bytes | None, str | None]]) -> Path:
    """A tar.gz written member by member: (name, bytes) a file, (name, None, target) a symbolic link."""
    with tarfile.open(path, "w:gz") as tf:
        for name, data, target in members:
            ti = tarfile.TarInfo(name)
            if target is not None:
                ti.type, ti.linkname = tarfile.SYMTYPE, target
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return path


def test_a_tarball_of_a_mixed_set_is_one_analysis(hall, amd_hall, runner, cli, tmp_path):
    """dmon and amd-smi files of three nodes in one .tgz (main: 'an archive of captures: unpack it'; before
    that, read as Prometheus CSV): one analysis, each node from its member's file name, with --format too."""
    sim, start, nodes = hall
    d = tmp_path / "captures"
    write_dmon_set(sim, d, nodes[:2], start, 60)
    asim, anodes = amd_hall
    write_amdsmi_set(asim, d, anodes[:1], 0, 60)
    tgz = tmp_path / "captures.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(d, arcname="captures")
    r = runner.invoke(cli, ["analyze", str(tgz), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["meta"]["devices"] == 24 and {d_["node"] for d_ in out["devices"]} == {*nodes[:2], anodes[0]}
    direct = json.loads(runner.invoke(cli, ["analyze", str(d), "--json"]).output)
    assert json.dumps(out["findings"], sort_keys=True) == json.dumps(direct["findings"], sort_keys=True)
    only_dmon = tmp_path / "dmon.tar"
    with tarfile.open(only_dmon, "w") as tf:
        for p in sorted(d.glob("dmon-*")):
            tf.add(p, arcname=p.name)
    r = runner.invoke(cli, ["analyze", "--format", "dmon", str(only_dmon), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["meta"]["devices"] == 16, r.output


def _dmon_text(node: str, power: int = 300) -> bytes:
    return (f"# ipledger-start 2026-11-02T00:00:00Z node={node} interval_ms=60000\n#Entity POWER SMACT\nID W\n"
            + "".join(f"GPU 0 {power} 0.9\nGPU 1 {power} 0.9\n" for _ in range(30))).encode()


def test_a_hostile_archive_quarantines_what_fails_and_analyses_the_rest(runner, cli, tmp_path):
    """A traversal name, a symbolic link to a secret, a member that is not UTF-8 and a zip bomb (3 GiB declared,
    ~3 MB on disk) beside two good captures: the good nodes are analysed, each bad member is named with its
    reason (one line each), nothing is extracted or followed, and the secret is never read."""
    secret = tmp_path / "shadow"
    secret.write_text("root:secret-hash-do-not-print\n")
    good = [("set/dmon-n1.txt", _dmon_text("n1"), None), ("set/dmon-n2.txt", _dmon_text("n2"), None)]
    tgz = _tar(tmp_path / "hostile.tar.gz", [
        *good, ("../../tmp/dmon-evil.txt", _dmon_text("evil"), None), ("/etc/dmon-abs.txt", _dmon_text("abs"), None),
        ("set/dmon-link.txt", None, str(secret)), ("set/dmon-bin.txt", b"\xff\xfe GPU 0 1\n", None)])
    r = runner.invoke(cli, ["analyze", str(tgz), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert {d["node"] for d in out["devices"]} == {"n1", "n2"}
    q = out["import"]["quarantined"]
    assert len(q) == 3 and all("\n" not in x and str(tgz) in x for x in q), q
    assert sum("path traversal" in x for x in q) == 2 and any("dmon-bin.txt" in x and "UTF-8" in x for x in q)
    assert "secret-hash" not in r.output and not (tmp_path / "tmp").exists() and not Path("/etc/dmon-abs.txt").exists()
    r = runner.invoke(cli, ["analyze", str(tgz)])             # the text output names them on stderr
    assert r.exit_code == 0 and r.output.count("warning: quarantined, not analysed:") == 3, r.output
    # a zip: a bomb refused from its declared sizes before it inflates, and a symlink member never followed
    from tests.test_bounded_inputs import MiB, _deflate_of_zeros
    import zipfile

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, _ in good:
            zf.writestr(name, data)
        link = zipfile.ZipInfo("set/dmon-link.txt")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, str(secret))
    big = _deflate_of_zeros(3 * 1024)
    _append_zip_member(bomb, "set/dmon-zeros.txt", big, 3 * 1024 * MiB)
    assert bomb.stat().st_size < 8 * MiB
    r = runner.invoke(cli, ["analyze", str(bomb), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert {d["node"] for d in out["devices"]} == {"n1", "n2"}
    assert [x for x in out["import"]["quarantined"] if "dmon-zeros.txt" in x and "per-member cap" in x], out["import"]
    assert len(out["import"]["quarantined"]) == 1 and "secret-hash" not in r.output


def _append_zip_member(path: Path, name: str, deflated: bytes, size: int) -> None:
    """Add a member whose raw deflate stream and declared size are given (a bomb: the sizes are honest, the
    ratio is not) by rewriting the archive with it appended."""
    import struct
    import zipfile
    import zlib

    with zipfile.ZipFile(path) as zf:
        old = [(i, zf.read(i)) for i in zf.infolist()]
    n = name.encode()
    body, central = b"", b""
    for info, data in old:
        fn = info.filename.encode()
        crc = zlib.crc32(data)
        local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(fn), 0) + fn
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 0x0314, 20, 0, 0, 0, 0x21, crc, len(data), len(data),
                               len(fn), 0, 0, 0, 0, info.external_attr, len(body)) + fn
        body += local + data
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0x21, 0, len(deflated), size, len(n), 0) + n
    central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, 0, len(deflated), size, len(n),
                           0, 0, 0, 0, 0, len(body)) + n
    body += local + deflated
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(old) + 1, len(old) + 1, len(central), len(body), 0)
    path.write_bytes(body + central + end)


def test_an_archive_past_a_whole_archive_cap_or_with_nothing_readable_is_refused_in_one_line(runner, cli, tmp_path):
    from ledger.importers.bounded import ArchiveLimits
    from ledger.importers.common import InputError

    many = _tar(tmp_path / "many.tar.gz", [(f"dmon-n{k}.txt", _dmon_text(f"n{k}"), None) for k in range(3)])
    assert len(read_set([str(many)]).devices) == 6
    with pytest.raises(InputError, match="member cap"):
        read_set([str(many)], limits=ArchiveLimits(members=2))
    with pytest.raises(InputError, match="total cap"):
        read_set([str(many)], limits=ArchiveLimits(total_bytes=2 * len(_dmon_text("n0"))))
    bad = _tar(tmp_path / "bad.tar.gz", [("../dmon-x.txt", _dmon_text("x"), None), ("dmon-l.txt", None, "/etc/passwd")])
    r = runner.invoke(cli, ["analyze", str(bad), "--json"])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and "no readable member" in r.output, r.output
    assert "path traversal" in r.output and "Traceback" not in r.output


def test_node_names_from_file_names_and_refusals(runner, cli, tmp_path):
    assert node_from_name("dmon-gpu-07.txt") == "gpu-07"
    assert node_from_name("amdsmi-mi300-01.csv") == "mi300-01"
    assert node_from_name("nvsmi-gpu07-20261102T000000Z.csv") == "gpu07"
    assert node_from_name("capture.txt") is None
    body = "#Entity  POWER\nID  W\nGPU 0  300\nGPU 0  301\n"
    (tmp_path / "a.txt").write_text(body)
    (tmp_path / "b.txt").write_text(body)
    base = ["analyze", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--start", "2026-11-02T00:00:00Z",
            "--step", "15s"]
    r = runner.invoke(cli, [*base, "--json"])            # two captures, no node named: refused, naming the file
    assert r.exit_code == 1 and "a.txt" in r.output and "no node name" in r.output, r.output
    r = runner.invoke(cli, [*base, "--node-from", r"^(?P<node>[ab])\.txt$", "--json"])
    assert r.exit_code == 0, r.output
    assert {d["node"] for d in json.loads(r.output)["devices"]} == {"a", "b"}
    r = runner.invoke(cli, [*base, "--node-from", r"^(?P<node>\w)\w*\.(txt)$", "--node", "x", "--json"])
    assert r.exit_code == 1 and "--node" in r.output
    (tmp_path / "b.txt").rename(tmp_path / "dmon-a.txt")  # two files of node "a" over the same minutes
    r = runner.invoke(cli, ["analyze", str(tmp_path / "a.txt"), str(tmp_path / "dmon-a.txt"), "--start",
                            "2026-11-02T00:00:00Z", "--step", "15s", "--node-from", r"(?:dmon-)?(?P<node>a)\.txt",
                            "--json"])
    assert r.exit_code == 1 and "overlaps" in r.output and len(r.output.strip().splitlines()) == 1


# --- the capture commands we hand out -------------------------------------------------------------------------

def test_dmon_capture_command_asks_for_every_field_the_agents_read(runner, cli):
    from ledger.importers.dcgm_fields import BY_DMON, BY_ID, CARRIED_FIELD_IDS

    r = runner.invoke(cli, ["pathb-command", "--format", "dmon", "--nodes", "8"])
    assert r.exit_code == 0, r.output
    ids = [int(x) for x in re.search(r"dcgmi dmon -e ([\d,]+)", r.output).group(1).split(",")]
    assert set(ids) <= set(BY_ID) | set(CARRIED_FIELD_IDS)
    # every field the dmon importer maps, ECC and row remaps included (1611, the joule twin of 156, has no
    # published dmon column: 156 is asked for instead)
    assert {s.field_id for s in BY_DMON.values()} <= set(ids) and 1611 not in ids
    assert {310, 311, 312, 313, 395, 396, 112, 155, 156, 150, 140, 230, 202} <= set(ids)
    assert ">> ipledger-capture/dmon-$NODE.txt" in r.output and "# ipledger-start" in r.output
    r = runner.invoke(cli, ["pathb-command", "--format", "dmon", "--nodes", "a,b;rm -rf /"])
    assert r.exit_code == 1 and "--nodes" in r.output


def _tool(bindir: Path, name: str, script: str) -> None:
    p = bindir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("fmt", ["dmon", "amd-smi"])
def test_the_printed_capture_line_run_twice_gives_a_set_analyze_reads(runner, cli, tmp_path, fmt):
    """The per-node line `pathb-command --nodes a,b` prints, run by a shell on each "node" (twice on node a: a
    restart, appended), with stand-ins for dcgmi / amd-smi that print what the real tools print for those
    arguments (dmon's header and rows; amd-smi's watch banner, its CSV, and the violation columns only when
    --violation is asked for): the files are one set, one node each, two segments on node a."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "dcgmi", 'echo "#Entity   SMACT  POWER  DVCCTR"; echo "ID"\n'
                           'for i in 1 2 3; do echo "GPU 0     0.900  640.0  0"; echo "GPU 1     0.900  420.0  4"; done\n')
    _tool(bindir, "amd-smi", """echo "'CTRL' + 'C' to stop watching output:"
viol=""; vals=""; case "$*" in *--violation*) viol=",pviol,tviol,tviol_active,phot_tviol,vr_tviol,hbm_tviol";; esac
for i in 1 2 3; do echo "gpu,power_usage,gfx,gfx_clock$viol"
  if [ -n "$viol" ]; then echo "0,700,95,2100,0,0,False,0,0,0"; echo "1,420,95,1420,100,0,False,0,0,0"
  else echo "0,700,95,2100"; echo "1,420,95,1420"; fi; done
""")
    r = runner.invoke(cli, ["pathb-command", "--format", fmt, "--nodes", "a,b", "--hours", "1"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("ssh ")]
    assert len(lines) == 2
    # the clock of each run: node a's capture is started again an hour after its first start
    _tool(bindir, "date", 'exec /bin/date -u -d "@$STANDIN_NOW" "$2"\n')
    for ln, starts in zip(lines, ((T0, T0 + 3600), (T0,))):
        inner = ln.split(" ", 2)[2].rstrip(" &")[1:-1]       # the quoted command ssh would run on the node
        for now in starts:
            env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "STANDIN_NOW": str(int(now))}
            subprocess.run(["sh", "-c", inner], cwd=tmp_path, env=env, check=True)
    files = sorted((tmp_path / "ipledger-capture").iterdir())
    assert [f.name for f in files] == ([f"dmon-{n}.txt" for n in "ab"] if fmt == "dmon"
                                       else [f"amdsmi-{n}.csv" for n in "ab"])
    c = read_set([str(tmp_path / "ipledger-capture")])
    assert {i.node for i in c.devices.values()} == {"a", "b"}
    assert sorted(c.capture_segments) == [("a", T0, T0 + 45), ("a", T0 + 3600, T0 + 3645), ("b", T0, T0 + 45)]
    from ledger.importers.pipeline import ImportOptions, timeline_for

    gaps = timeline_for(c, "a/gpu0", ImportOptions()).gaps
    assert [(g.cause, g.start, g.end) for g in gaps] == [("capture_restarted", T0 + 45, T0 + 3600)]
    assert _vals(c, "a/gpu1", "clock_reasons")[:3] == [4.0] * 3      # the power cap, from dmon or --violation


def test_a_node_name_that_is_no_host_name_is_refused_in_one_line(runner, cli, tmp_path):
    """A capture's anchor line names the node shown in every finding: terminal escapes there are refused."""
    src = tmp_path / "dmon-x.txt"
    src.write_text("# ipledger-start 2026-11-02T00:00:00Z node=gpu\x1b[2J interval_ms=1000\n#Entity POWER\nID\n"
                   "GPU 0 300\n")
    r = runner.invoke(cli, ["analyze", str(src), "--json"])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and "\x1b" not in r.output, r.output
    assert "not a host name" in r.output and "line 1" in r.output


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 12)), min_size=1, max_size=5),
       st.booleans())
def test_every_anchor_is_a_segment_and_every_hole_a_capture_restarted_gap(segments, split):
    """Any run of (re)starts: (idle ticks before the start, ticks captured). Each row lands at its own anchor's
    time + its tick; every hole longer than the tolerance (3 ticks) is exactly one capture_restarted gap; the
    timeline's covered + unknown time is the whole span. ``split``: each restart in its own file."""
    from ledger.importers.pipeline import ImportOptions, timeline_for

    iv, t, expect, files = 10, T0, [], [[]]
    holes = []
    for k, (idle, n) in enumerate(segments):
        if k:
            holes.append((t, t + idle * iv))
            if split:
                files.append([])
        t += idle * iv if k else 0
        stamp = datetime.fromtimestamp(t, timezone.utc)
        files[-1] += [f"# ipledger-start {stamp:%Y-%m-%dT%H:%M:%SZ} node=n1 interval_ms={iv * 1000}",
                      "#Entity  POWER", "ID  W"]
        for j in range(n):
            files[-1].append(f"GPU 0  {100 + len(expect)}")
            expect.append(t + j * iv)
        t += n * iv
    parts = [dmon.parse("\n".join(f) + "\n", f"dmon-n1-{i}.txt") for i, f in enumerate(files)]
    c = parts[0]
    for p in parts[1:]:
        c.merge(p)
    pts = sorted(zip(*c.series["n1/gpu0"]["power_w"]))
    assert [p[0] for p in pts] == expect and [p[1] for p in pts] == [100.0 + i for i in range(len(expect))]
    tl = timeline_for(c, "n1/gpu0", ImportOptions())
    want = [(a, b) for a, b in holes if b - a > 2 * iv]     # a hole + one tick beyond the tolerance
    assert [(g.start, g.end) for g in tl.gaps] == want
    assert all(g.cause == "capture_restarted" for g in tl.gaps)
    assert tl.covered_s + tl.unknown_s == pytest.approx(expect[-1] + iv - expect[0])


def test_a_restarted_set_analyses_the_same_through_a_ledger(hall, tmp_path):
    """The capture_restarted gaps are entries like any other: the analysis read back from a ledger equals the
    direct one, and names the restart as an unknown_gap finding with that cause."""
    from ledger.agents.export_analysis import analyze_collected

    sim, start, nodes = hall
    write_dmon_set(sim, tmp_path / "set", nodes[:2], start, 120, restart=(nodes[0], start + 40, start + 48))
    direct = analyze_collected(read_set([str(tmp_path / "set")]), sources=[]).to_json()
    kept = analyze_collected(read_set([str(tmp_path / "set")]), keep=tmp_path / "kept.db", sources=[]).to_json()
    assert json.dumps(direct, sort_keys=True) == json.dumps(kept, sort_keys=True)
    gaps = [f for f in direct["findings"] if f["kind"] == "unknown_gap"]
    assert any(f.get("cause") == "capture_restarted" and f["scope"]["node"] == nodes[0] for f in gaps), gaps
    assert direct["account"]["by_cause"].get("capture_restarted", 0) > 0


def test_a_start_line_before_the_previous_ticks_end_is_a_warning():
    """Two starts 20 s apart in one file, the first followed by 3 ticks of 10 s: the ticks ran slower than
    interval_ms said (or the clock moved back). Said in the import report, not hidden."""
    text = ("# ipledger-start 2026-11-02T00:00:00Z node=n1 interval_ms=10000\n#Entity POWER\nID\n"
            "GPU 0 1\nGPU 0 2\nGPU 0 3\n# ipledger-start 2026-11-02T00:00:20Z node=n1 interval_ms=10000\nGPU 0 4\n")
    c = dmon.parse(text, "dmon-n1.txt")
    assert c.capture_segments == [("n1", T0, T0 + 30), ("n1", T0 + 20, T0 + 30)]
    assert any("10 s before the previous one's ticks end" in w for w in c.warnings), c.warnings


def test_a_symlink_inside_a_capture_directory_is_not_followed(tmp_path):
    """A directory handed to analyze may hold a link to a file elsewhere (as root: any file): never read."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dmon-secret.txt").write_text("#Entity POWER\nID\nGPU 0 300\n")
    d = tmp_path / "captures"
    d.mkdir()
    (d / "dmon-n1.txt").write_text("# ipledger-start 2026-11-02T00:00:00Z node=n1 interval_ms=1000\n"
                                   "#Entity POWER\nID\nGPU 0 300\n")
    (d / "dmon-secret.txt").symlink_to(outside / "dmon-secret.txt")
    (d / "more").symlink_to(outside, target_is_directory=True)
    c = read_set([str(d)])
    assert {i.node for i in c.devices.values()} == {"n1"}


def test_capture_files_parsed_in_workers_equal_the_files_parsed_here(hall, amd_hall, tmp_path):
    """The worker processes that parse a set's files (captures.parsed_in_workers) give the collection parsed in
    this process, and the same first error (a bad file in the middle of the set)."""
    from tests.test_columnar import _snapshot

    sim, start, nodes = hall
    write_dmon_set(sim, tmp_path, nodes[:3], start, 40, restart=(nodes[0], start + 10, start + 14))
    asim, anodes = amd_hall
    write_amdsmi_set(asim, tmp_path, anodes[:2], 0, 40)
    here, there = read_set([str(tmp_path)], workers=0), read_set([str(tmp_path)], workers=2)
    assert _snapshot(here) == _snapshot(there) and len(here.devices) == 40
    (tmp_path / "dmon-zz-bad.txt").write_text("# ipledger-start 1990-11-02T00:00:00Z node=zz interval_ms=1000\n"
                                              "#Entity POWER\nID\nGPU 0 1\n")
    errors = []
    for w in (0, 2):
        with pytest.raises(Exception) as exc:
            read_set([str(tmp_path)], workers=w)
        errors.append((type(exc.value), str(exc.value)))
    assert errors[0] == errors[1] and "dmon-zz-bad.txt" in errors[0][1]
