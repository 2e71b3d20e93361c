"""Whoever sends an export controls its bytes: archives are read within caps and never nested, a directory's
symbolic links are never followed, and an error quotes at most a short, escaped excerpt of the input.

Each attack goes through the command an operator runs on what was sent (``ipledger import prometheus``) or
the importer it calls, with the caps lowered where a small file must stand for a large one."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from ledger.importers import bounded, prometheus, synth
from ledger.importers.bounded import ArchiveLimits, DirFile, directory_files, open_file
from ledger.importers.common import InputError

MiB = 1 << 20
SECRET = "root:$y$j9T$secret-hash-do-not-print$AbCdEf:19000:0:99999:7:::"


def _export(tmp_path: Path) -> list[Path]:
    return synth.write_query_range(tmp_path / "x", n_gpus=1, hours=0.1, cadence=15, jobs="slurm",
                                   metrics=synth.DEFAULT_METRICS[:1])


def _cli(url: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real console script, as an operator runs it on a file someone sent."""
    exe = Path(sys.executable).with_name("ipledger")
    return subprocess.run([str(exe), "--db", url, *argv], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, "IPLEDGER_CONFIG": "/nonexistent"})


def _deflate_of_zeros(mib: int) -> bytes:
    """A raw deflate stream that inflates to ``mib`` MiB of zeros, built in milliseconds: after a full flush
    the compressor starts afresh, so every further MiB compresses to the same bytes."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    return first + again * (mib - 1) + c.flush(zlib.Z_FINISH)


def _zip_of(name: str, deflated: bytes, size: int, crc: int = 0) -> bytes:
    """A one-member zip (the member stored deflated) as a sender writes one."""
    n = name.encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0x21, crc, len(deflated), size, len(n), 0) + n
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, crc, len(deflated), size, len(n),
                          0, 0, 0, 0, 0, 0) + n
    offset = len(local) + len(deflated)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), offset, 0)
    return local + deflated + central + end


def test_a_zip_bomb_with_the_default_caps_is_refused_in_one_line_before_it_inflates(tmp_path, sqlite_url):
    bomb = tmp_path / "dcgm-export.zip"
    bomb.write_bytes(_zip_of("metrics.json", _deflate_of_zeros(3 * 1024), 3 * 1024 * MiB))  # 3 GiB, ~3 MB on disk
    assert zipfile.is_zipfile(bomb) and bomb.stat().st_size < 8 * MiB
    t0 = time.monotonic()
    r = _cli(sqlite_url, "import", "prometheus", str(bomb), "--quiet", cwd=tmp_path)
    took = time.monotonic() - t0
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout, r.stderr
    line = (r.stderr + r.stdout).strip()
    assert "\n" not in line and str(bomb) in line and "metrics.json" in line and "cap" in line, line
    assert took < 30, took   # refused from the declared sizes, not after inflating 3 GiB


def test_a_tar_gz_bomb_with_the_default_caps_is_refused_at_its_header(tmp_path):
    info = tarfile.TarInfo("metrics.json")
    info.size = 3 * 1024 * MiB
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH) + _deflate_of_zeros(3 * 1024)
    bomb = tmp_path / "export.tar.gz"
    bomb.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + body + struct.pack("<2L", 0, info.size & 0xffffffff))
    t0 = time.monotonic()
    with pytest.raises(InputError) as exc:
        prometheus.read(bomb, workers=0)
    assert time.monotonic() - t0 < 10
    assert str(bomb) in str(exc.value) and "metrics.json" in str(exc.value) and "per-member cap" in str(exc.value)


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_each_cap_names_the_archive_and_the_member(tmp_path, kind):
    files = _export(tmp_path)
    good = files[0].read_bytes()

    def archive(members: dict[str, bytes]) -> Path:
        p = tmp_path / f"a-{len(list(tmp_path.iterdir()))}.{kind}"
        if kind == "zip":
            with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
                for n, data in members.items():
                    zf.writestr(n, data)
        else:
            with tarfile.open(p, "w:gz") as tf:
                for n, data in members.items():
                    ti = tarfile.TarInfo(n)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        return p

    ok = archive({"a.json": good, "b.json": good})
    assert prometheus.read(ok, workers=0).points > 0   # within the caps: read as before
    cases = [
        (ArchiveLimits(member_bytes=len(good) - 1), {"a.json": good}, "a.json", "per-member cap"),
        (ArchiveLimits(total_bytes=len(good) + 10), {"a.json": good, "b.json": good}, "b.json", "total cap"),
        (ArchiveLimits(members=2), {"a.json": good, "b.json": good, "c.json": good}, "c.json", "member cap"),
        (ArchiveLimits(), {"a.json": good, "inner.zip": b"PK\x03\x04" + b"\0" * 64}, "inner.zip", "nested"),
        (ArchiveLimits(), {"a.json": good, "z.json": b"\x1f\x8b\x08" + b"\0" * 64}, "z.json", "nested"),
    ]
    for limits, members, member, why in cases:
        p = archive(members)
        with pytest.raises(InputError) as exc:
            prometheus.read(p, workers=0, limits=limits)
        msg = str(exc.value)
        assert str(p) in msg and member in msg and why in msg and "\n" not in msg, (limits, msg)


def test_the_ratio_cap_refuses_a_small_bomb(tmp_path, monkeypatch):
    monkeypatch.setattr(bounded, "RATIO_FLOOR", MiB)
    bomb = tmp_path / "small-bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m.json", b"{" + b" " * (4 * MiB) + b"}")
    with pytest.raises(InputError) as exc:
        prometheus.read(bomb, workers=0, limits=ArchiveLimits(ratio=100))
    assert "m.json" in str(exc.value) and "ratio cap" in str(exc.value)


def test_a_directory_import_never_follows_a_symlink_nor_prints_what_it_points_to(tmp_path, sqlite_url):
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    export = tmp_path / "export"
    export.mkdir()
    for f in _export(tmp_path):
        f.rename(export / f.name)
    (export / "zz-metrics.prom").symlink_to(secret)
    (export / "sub").symlink_to(tmp_path, target_is_directory=True)  # a way out of the tree
    r = _cli(sqlite_url, "import", "prometheus", str(export), "--json", "--quiet", cwd=tmp_path)
    out = r.stdout + r.stderr
    assert "secret-hash" not in out and "root:" not in out, out
    assert r.returncode == 0, out
    assert "zz-metrics.prom" in out and "not followed" in out   # the operator is told what was left out


def test_a_file_swapped_for_a_symlink_after_the_walk_is_not_opened(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "m.prom").write_text("x 1\n")
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    files, skipped = directory_files(tmp_path / "d")
    assert [f.parts for f in files] == [("m.prom",)] and skipped == []
    (tmp_path / "d" / "m.prom").unlink()
    (tmp_path / "d" / "m.prom").symlink_to(secret)
    with pytest.raises(InputError) as exc:
        open_file(files[0])
    assert "symbolic link" in str(exc.value) and "secret" not in str(exc.value).replace(str(tmp_path), "")
    # a directory on the way swapped for a link is refused the same way
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "in").mkdir()
    (tmp_path / "e" / "in" / "m.prom").write_text("x 1\n")
    files, _ = directory_files(tmp_path / "e")
    os.rename(tmp_path / "e" / "in", tmp_path / "moved")
    (tmp_path / "e" / "in").symlink_to(tmp_path / "moved")
    with pytest.raises(InputError):
        open_file(DirFile(tmp_path / "e", files[0].parts))


def test_an_error_quotes_only_a_short_escaped_excerpt_of_the_input(tmp_path, sqlite_url):
    export = tmp_path / "export"
    export.mkdir()
    (export / "bad.prom").write_text("\x1b]0;x\x07" + SECRET + "\n")
    r = _cli(sqlite_url, "import", "prometheus", str(export), "--quiet", cwd=tmp_path)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode != 0 and "Traceback" not in out and "\n" not in out, out
    assert "\x1b" not in out and "\x07" not in out
    assert "secret-hash" not in out, out   # at most a short excerpt of the line
