"""Export files as a sender hands them over, read bounded and inert: tar/zip archives within caps, directories
without following a symbolic link.

Whoever sends an export controls every byte of it, so nothing in it may make the importer read what the
operator did not name, or exhaust the machine:

* **Archives** (:func:`archive_members`): a member is read in chunks and refused, naming the archive and the
  member, once it passes the per-member inflated size, once the members together pass the total, once a
  member's inflated size passes ``ratio`` × its compressed size (beyond :data:`RATIO_FLOOR`, so small, very
  regular files pass), or once the archive holds more than ``members`` files. The declared sizes are checked
  before a byte is inflated; the counted bytes are checked as they come (a header that lies is caught too).
  An archive inside an archive (by name or by its first bytes) is refused, never opened. Links and device
  members are not files and are skipped; a member name that is absolute or has a ``..`` part (path traversal)
  is refused. Members are read into memory, never extracted, and no path is ever built from a member name.
  :func:`archive_entries` reports each unreadable member and goes on with the rest (a capture set quarantines
  it); a cap of the whole archive (:class:`ArchiveRefused`) refuses the archive.
* **Directories** (:func:`directory_files`, :func:`open_file`): the tree is walked through directory
  descriptors, each name opened with ``O_NOFOLLOW`` relative to its directory's descriptor, so a symbolic link
  (to ``/etc/shadow``, or a directory outside) is never followed, even one swapped in after the walk. Links
  found are counted and named in a warning.

:class:`ArchiveLimits` are settings passed in by the caller, with defaults.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from ..base.textsafe import excerpt
from .common import InputError

CHUNK = 1 << 20
RATIO_FLOOR = 16 << 20          # below this many inflated bytes a member's compression ratio is not held against it
NESTED_SUFFIXES = (".zip", ".tar", ".tgz", ".tar.gz", ".gz", ".bz2", ".tbz2", ".xz", ".txz", ".zst", ".7z", ".rar",
                   ".jar", ".lz4", ".lzma")
_MAGIC = ((b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"),
          (b"\xfd7zXZ\x00", "xz"), (b"7z\xbc\xaf\x27\x1c", "7z"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"Rar!\x1a\x07", "rar"), (b"\x04\x22\x4d\x18", "lz4"), (b"\x5d\x00\x00", "lzma"))


def archive_kind(head: bytes) -> str | None:
    """'zip', 'gzip', 'tar', ... when these first bytes (at least 262 for a tar) start an archive or a
    compressed file; None otherwise."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[257:262] == b"ustar":
        return "tar"
    return None


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """Caps on what one archive may inflate to (docs/telemetry.md, "Bad input")."""

    member_bytes: int = 2 << 30       # one member, inflated
    total_bytes: int = 16 << 30       # every member together, inflated
    ratio: float = 200.0              # inflated / compressed, per member (zip) or for the whole archive (tar)
    members: int = 10_000             # files in the archive


DEFAULT_LIMITS = ArchiveLimits()


def _name(archive: Path, member: str) -> str:
    return f"{archive}:{excerpt(member, 120)}"


def _nested(name: str, head: bytes) -> bool:
    return name.lower().endswith(NESTED_SUFFIXES) or archive_kind(head) is not None


class ArchiveRefused(InputError):
    """A cap of the whole archive (its member count, its total inflated size, a tar's ratio or a tar member past
    the per-member cap, which a stream cannot skip without inflating): the archive is refused, not one member."""


class _Budget:
    """The caps of one archive, counted as its members are read."""

    def __init__(self, archive: Path, limits: ArchiveLimits) -> None:
        self.archive, self.limits, self.total, self.count = archive, limits, 0, 0

    def refuse(self, member: str, why: str, whole: bool = False) -> InputError:
        return (ArchiveRefused if whole else InputError)(str(self.archive), f"member {excerpt(member, 120)}", why)

    def admit(self, member: str, size: int, compressed: int | None) -> None:
        """A member about to be read, by its declared sizes."""
        lim = self.limits
        self.count += 1
        if self.count > lim.members:
            raise self.refuse(member, f"more than {lim.members} members (archive member cap)", whole=True)
        self.check(member, size, compressed, self.total + size)

    def check(self, member: str, inflated: int, compressed: int | None, total: int) -> None:
        lim = self.limits
        if inflated > lim.member_bytes:
            raise self.refuse(member, f"inflates past {lim.member_bytes} bytes (per-member cap); refused unread")
        if total > lim.total_bytes:
            raise self.refuse(member, f"the archive inflates past {lim.total_bytes} bytes (total cap); refused",
                              whole=True)
        if compressed is not None and inflated > RATIO_FLOOR and inflated > lim.ratio * max(compressed, 1):
            raise self.refuse(member, f"inflates more than {lim.ratio:g} times its compressed size "
                                      f"(ratio cap): an archive bomb?")

    def read(self, member: str, f: BinaryIO, compressed: int | None) -> bytes:
        """The member's bytes, counted chunk by chunk against the caps (whatever its header said)."""
        parts, n = [], 0
        while chunk := f.read(CHUNK):
            if not parts and _nested(member, chunk):
                raise self.refuse(member, "an archive inside the archive; nested archives are not read")
            n += len(chunk)
            self.check(member, n, compressed, self.total + n)
            parts.append(chunk)
        self.total += n
        return b"".join(parts)


def is_archive(path: Path) -> bool:
    return tarfile.is_tarfile(path) or zipfile.is_zipfile(path)


def unsafe_name(name: str) -> str | None:
    """Why a member name could escape a directory if it were ever extracted (absolute, a drive, a ``..``
    part, a NUL or control character); None for a plain relative name. Members are never extracted: a name
    like this is refused all the same, as no honest capture tool writes one."""
    if not name or any(ord(ch) < 32 for ch in name):
        return "member name holds a control character; not read"
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute member name (path traversal); not read"
    if ".." in parts:
        return "member name with a '..' part (path traversal); not read"
    return None


@dataclass(frozen=True, slots=True)
class Member:
    """One member of an archive: its bytes, or why it was not read (``problem``; ``link``: a link, device or
    other non-file member, skipped rather than quarantined)."""

    label: str                 # "archive:member" as shown in messages (an excerpt of the name)
    name: str                  # the member's own name: text only, never made into a path
    data: bytes | None = None
    problem: str | None = None
    link: bool = False


_NOT_A_FILE = "a link, device or other non-file member; not followed, not read"


def archive_entries(path: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> Iterator[Member]:
    """Every member of a tar or zip in name order, read into memory one at a time, never extracted. A member
    that cannot be read (a link or device, a traversal name, past the per-member or ratio cap, an archive in
    the archive, a corrupt zip member) comes with its ``problem`` and no bytes, and the rest are still read;
    :class:`ArchiveRefused` for a cap of the whole archive (member count, total inflated bytes; a tar's ratio
    or a tar member past the per-member cap, as a stream cannot skip a member without inflating it)."""
    budget = _Budget(path, limits)
    if tarfile.is_tarfile(path):
        try:
            yield from _tar_entries(path, limits, budget)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise ArchiveRefused(str(path), "", f"unreadable tar archive ({excerpt(str(exc), 80)})") from None
    elif zipfile.is_zipfile(path):
        try:
            zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise ArchiveRefused(str(path), "", f"unreadable zip archive ({excerpt(str(exc), 80)})") from None
        with zf:
            yield from _zip_entries(path, zf, limits, budget)
    else:
        raise ArchiveRefused(str(path), "", "not a tar or zip archive")


def _tar_entries(path: Path, limits: ArchiveLimits, budget: _Budget) -> Iterator[Member]:
    with tarfile.open(path) as tf:
        heads: list[tuple[tarfile.TarInfo, str | None, bool]] = []
        declared, on_disk, count = 0, max(path.stat().st_size, 1), 0
        while (m := tf.next()) is not None:   # headers checked as they come: a bomb is never skipped over
            if m.isdir():
                continue
            count += 1
            if count > limits.members:
                raise budget.refuse(m.name, f"more than {limits.members} members (archive member cap)", whole=True)
            if not m.isfile():
                heads.append((m, _NOT_A_FILE, True))
                continue
            if m.size > limits.member_bytes:   # skipping it in a compressed stream would inflate it
                raise budget.refuse(m.name, f"inflates past {limits.member_bytes} bytes (per-member cap); "
                                            f"refused unread", whole=True)
            declared += m.size
            budget.check(m.name, m.size, None, declared)
            if declared > RATIO_FLOOR and declared > limits.ratio * on_disk:
                raise budget.refuse(m.name, f"the archive inflates more than {limits.ratio:g} times its size "
                                            f"on disk (ratio cap): an archive bomb?", whole=True)
            heads.append((m, unsafe_name(m.name), False))
        for m, why, link in sorted(heads, key=lambda h: h[0].name):
            label = _name(path, m.name)
            if why is not None:
                yield Member(label, m.name, problem=why, link=link)
                continue
            f = tf.extractfile(m)
            if f is None:
                yield Member(label, m.name, problem=_NOT_A_FILE, link=True)
                continue
            try:
                yield Member(label, m.name, budget.read(m.name, f, None))
            except ArchiveRefused:
                raise
            except InputError as exc:
                yield Member(label, m.name, problem=exc.message)


def _zip_entries(path: Path, zf: zipfile.ZipFile, limits: ArchiveLimits, budget: _Budget) -> Iterator[Member]:
    infos = sorted((i for i in zf.infolist() if not i.is_dir()), key=lambda i: i.filename)
    if len(infos) > limits.members:
        raise budget.refuse(infos[limits.members].filename,
                            f"more than {limits.members} members (archive member cap)", whole=True)
    plan: list[tuple[zipfile.ZipInfo, str | None, bool]] = []
    declared = 0
    for i in infos:   # every declared size before any member is inflated
        if stat.S_IFMT(i.external_attr >> 16) not in (0, stat.S_IFREG):
            plan.append((i, _NOT_A_FILE, True))
            continue
        why = unsafe_name(i.filename)
        if why is None:
            try:
                budget.check(i.filename, i.file_size, i.compress_size, declared + i.file_size)
                declared += i.file_size
            except ArchiveRefused:
                raise
            except InputError as exc:
                why = exc.message
        plan.append((i, why, False))
    for i, why, link in plan:
        label = _name(path, i.filename)
        if why is not None:
            yield Member(label, i.filename, problem=why, link=link)
            continue
        try:
            budget.admit(i.filename, i.file_size, i.compress_size)
            with zf.open(i) as f:
                data = budget.read(i.filename, f, i.compress_size)
        except ArchiveRefused:
            raise
        except InputError as exc:
            yield Member(label, i.filename, problem=exc.message)
            continue
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, EOFError, OSError) as exc:
            yield Member(label, i.filename, problem=f"unreadable member ({excerpt(str(exc), 80)})")
            continue
        yield Member(label, i.filename, data)


def archive_members(path: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> Iterator[tuple[str, bytes]]:
    """``(archive:member, bytes)`` of every file member, in name order, one member in memory at a time; an
    :class:`~ledger.importers.common.InputError` naming the archive and the member that cannot be read (a cap,
    a nested archive, a traversal name). Links and devices are skipped."""
    for m in archive_entries(path, limits):
        if m.link:
            continue
        if m.problem is not None:
            raise InputError(str(path), f"member {excerpt(m.name, 120)}", m.problem)
        yield m.label, m.data


# --- directories ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DirFile:
    """A regular file found under a directory the operator named: opened only through :func:`open_file`."""

    root: Path
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return str(self.root.joinpath(*self.parts))

    @property
    def name(self) -> str:
        return self.parts[-1]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NONBLOCK", 0)


def directory_files(root: Path) -> tuple[list[DirFile], list[str]]:
    """Every regular file under ``root`` (sorted by path), and the symbolic links and other non-files met
    (never followed, never opened)."""
    files: list[DirFile] = []
    skipped: list[str] = []
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(str(root), "", f"cannot open directory ({exc.strerror})") from None
    try:
        _walk(top, root, (), files, skipped)
    finally:
        os.close(top)
    files.sort(key=lambda f: f.parts)
    return files, skipped


def _walk(fd: int, root: Path, prefix: tuple[str, ...], files: list, skipped: list) -> None:
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        parts = (*prefix, e.name)
        if e.is_symlink():
            skipped.append(excerpt(str(root.joinpath(*parts)), 160))
        elif e.is_dir(follow_symlinks=False):
            try:
                sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:   # swapped for a link since the listing, or unreadable: not followed
                skipped.append(excerpt(str(root.joinpath(*parts)), 160))
                continue
            try:
                _walk(sub, root, parts, files, skipped)
            finally:
                os.close(sub)
        elif e.is_file(follow_symlinks=False):
            files.append(DirFile(root, parts))
        else:
            skipped.append(excerpt(str(root.joinpath(*parts)), 160))


def open_file(f: DirFile | Path) -> BinaryIO:
    """A file for reading in binary; a :class:`DirFile` through its directories' descriptors, every name
    ``O_NOFOLLOW``, refused (InputError) when any of them is now a symbolic link or the file is no regular
    file. A plain path (one the operator named) opens as named."""
    if not isinstance(f, DirFile):
        return open(f, "rb")  # noqa: SIM115 - the caller closes it
    fd = os.open(f.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in f.parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(f.parts[-1], _FILE_FLAGS, dir_fd=fd)
    except OSError as exc:
        os.close(fd)
        why = "a symbolic link; not followed" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else f"cannot open ({exc.strerror})"
        raise InputError(str(f), "", why) from None
    os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise InputError(str(f), "", "not a regular file; not read")
    os.set_blocking(leaf, True)
    return os.fdopen(leaf, "rb")
