"""The local spool: durable JSON-lines files written before anything else, shipped to the ledger later.

Writers (hooks, collector, importers) call :func:`write`; each call makes one new file, written under a
``.tmp`` name, fsynced, then renamed to ``.jsonl`` and the directory fsynced, so a reader never sees a file
being written. A writer that crashed leaves a ``.tmp`` file; :func:`pending_files` offers it once stale, and
its torn last line (if any) is reported, kept aside, and skipped. Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from ..base.frozen import Frozen
from ..base.fsmodes import SPOOL_DIR, SPOOL_FILE, UnsafePath, create_file, make_dirs, open_subdir, write_beside

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (strings here): typing stays off the hook's import path
    from pathlib import Path
    from typing import Callable, Iterable, Mapping

# The Slurm hooks only call write_records(): pathlib, dataclasses and json (≈ 20 ms to import under
# python -I -S, with what they pull in) are imported by the functions that need them; SpoolRead is Frozen, not a dataclass.

SHIPPED_DIR = "shipped"
TORN_DIR = "torn"
QUARANTINE_DIR = "quarantine"   # refused lines (their reasons) and files refused unread
STALE_TMP_SECONDS = 300.0


def _fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(spool_dir: str | os.PathLike, records: Iterable[Mapping], prefix: str = "entries") -> Path:
    """Write records as one new spool file, durably; returns its path."""
    from pathlib import Path

    return Path(write_records(spool_dir, records, prefix))


def write_records(spool_dir: str | os.PathLike, records: Iterable[Mapping], prefix: str = "entries",
                  encode: Callable[[Mapping], str] | None = None) -> str:
    """:func:`write` returning the path as a string, without importing pathlib (the hooks' fast path).

    ``encode``: a function giving exactly ``json.dumps(record, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)`` (the hooks pass one that does not import json; a test proves them equal).
    """
    directory = os.fspath(spool_dir)
    if not os.path.isdir(directory):
        make_dirs(directory, SPOOL_DIR)
    # os.uname().nodename is what socket.gethostname() returns, and os.urandom(4).hex() what
    # secrets.token_hex(4) does, without importing socket and secrets (hmac, random...) on the hook path.
    name = f"{prefix}-{time.time_ns():020d}-{os.uname().nodename}-{os.getpid()}-{os.urandom(4).hex()}"
    tmp = os.path.join(directory, f"{name}.jsonl.tmp")
    final = os.path.join(directory, f"{name}.jsonl")
    if encode is None:
        import json

        def encode(r: Mapping) -> str:
            return json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    data = "".join(encode(r) + "\n" for r in records)
    fd = create_file(tmp, SPOOL_FILE)
    try:
        view = memoryview(data.encode("utf-8"))
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except OSError:
        # A write that failed (disk full, file-size limit) is known here, unlike a crash: leave no partial
        # file for a later ship to half-deliver; the caller reports the whole batch as not written.
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(directory)
    return final


_HELD_LOCKS: set[int] = set()   # descriptors of the spool locks this process holds (see forget_inherited_locks)


def shipping_lock(spool_dir: str | os.PathLike):
    """A context holding an exclusive lock on the spool directory (flock), so shippers of one spool take
    turns: a second one waits instead of re-reading files the first has committed but not yet moved aside.
    Writers never take it. A missing directory is not locked (there is nothing to ship)."""
    import contextlib
    import fcntl

    @contextlib.contextmanager
    def held():  # noqa: ANN202
        try:
            fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)   # released by the kernel when the last copy of fd is closed
            _HELD_LOCKS.add(fd)
            yield
        finally:
            _HELD_LOCKS.discard(fd)
            os.close(fd)

    return held()


def forget_inherited_locks() -> None:
    """In a process forked by a shipper (its reading workers): close the inherited copies of the spool lock.
    An flock lives as long as any copy of its descriptor, so a worker outliving a killed shipper would
    otherwise keep every later shipper of that spool waiting."""
    for fd in list(_HELD_LOCKS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


def check_spool_dir(spool_dir: str | os.PathLike) -> None:
    """Refuse a spool directory anyone may write to (``o+w``): its files could then come from any local user,
    and the shipper (often root) would chain them as observations. Raises :class:`UnsafeSpool`."""
    try:
        st = os.stat(spool_dir)
    except FileNotFoundError:
        return
    if st.st_mode & 0o002 and not st.st_mode & 0o1000:
        raise UnsafeSpool(f"{os.fspath(spool_dir)}: the spool directory is writable by every user "
                          f"(mode {st.st_mode & 0o7777:o}); refusing to ship from it (chmod o-w)")


UnsafeSpool = UnsafePath  # the spool (or one of its subdirectories) is not what ipledger made: nothing shipped


class UnsafeFile(ValueError):
    """A spool entry that is not a plain file of an expected writer; it is quarantined unread."""


def pending_files(spool_dir: str | os.PathLike, stale_tmp_seconds: float = STALE_TMP_SECONDS) -> list[Path]:
    """Files ready to ship, oldest first: every ``.jsonl`` and every ``.tmp`` abandoned by a crashed writer.

    Names come from the directory listing (never from record content); symbolic links and other non-files
    are offered too, so that the shipper quarantines them instead of leaving them to be tried forever."""
    from pathlib import Path

    directory = Path(spool_dir)
    if not directory.is_dir():
        return []
    now = time.time()
    files = []
    for p in directory.iterdir():
        try:
            st = p.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if p.name.endswith(".jsonl"):
            files.append(p)
        elif p.name.endswith(".jsonl.tmp") and now - st.st_mtime > stale_tmp_seconds:
            files.append(p)
    return sorted(files, key=lambda p: p.name)


class SpoolRead(Frozen):
    __slots__ = ("path", "records", "torn", "errors", "lines", "refused")
    _defaults = {"lines": list, "refused": list}
    path: Path
    records: list[dict]
    torn: str | None  # the undecodable tail, if the file ended mid-record
    errors: list[str]  # "file:line: reason" for undecodable lines that are not the tail
    lines: list[int]  # the line number of each record
    refused: list[tuple[int, str, str]]  # (line, reason, the line as text, escaped) for each refused line


def parse(text: str, path: Path) -> SpoolRead:
    """Split a spool file into records; a bad *last* line is torn (a crash mid-write), a bad inner line an error."""
    return parse_bytes(text.encode("utf-8", "surrogatepass"), path)


def parse_bytes(data: bytes, path: Path) -> SpoolRead:
    """:func:`parse` over the file's bytes: each line must be strict UTF-8 (a line that is not is refused
    as it stands, never decoded with replacement characters into something the writer did not write)."""
    import json

    lines = data.split(b"\n")
    ends_cleanly = data.endswith(b"\n") or data == b""
    if ends_cleanly:
        lines = lines[:-1]
    records: list[dict] = []
    numbers: list[int] = []
    errors: list[str] = []
    refused: list[tuple[int, str, str]] = []
    torn: str | None = None
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = i == len(lines)
        try:
            line = raw.decode("utf-8")
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 at byte {exc.start}"
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            reason = f"undecodable spool line ({str(exc)[:120]})"
        else:
            records.append(rec)
            numbers.append(i)
            continue
        if last and not ends_cleanly:
            torn = raw.decode("utf-8", "backslashreplace")  # a writer died mid-line: kept aside, escaped
        else:
            errors.append(f"{path}:{i}: {reason}")
            refused.append((i, reason, raw[:MAX_QUARANTINED_LINE].decode("utf-8", "backslashreplace")))
    return SpoolRead(path=path, records=records, torn=torn, errors=errors, lines=numbers, refused=refused)


MAX_FILE_BYTES = 1 << 30   # a spool file larger than this is quarantined unread (writers make files of MBs)
MAX_QUARANTINED_LINE = 1 << 16   # bytes of a refused line kept in its quarantine note (the file keeps them all)


def read(path: Path) -> SpoolRead:
    """Read one spool file safely: opened relative to its directory without following a symbolic link,
    without blocking on a FIFO, and refused (:class:`UnsafeFile`) unless it is a plain file with one link,
    not writable by every user, owned by this user, root or the spool directory's owner, and bounded in size."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFile(f"{path}: a symbolic link; not followed") from None
            if exc.errno in (errno.ENXIO, errno.EACCES, errno.EPERM):
                raise UnsafeFile(f"{path}: cannot be opened as a file ({exc.strerror})") from None
            raise
        try:
            st = os.fstat(fd)
            owners = {0, os.geteuid(), os.fstat(dfd).st_uid}
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeFile(f"{path}: not a regular file")
            if st.st_nlink != 1:
                raise UnsafeFile(f"{path}: has {st.st_nlink} hard links; a spool file has one")
            if st.st_uid not in owners:
                raise UnsafeFile(f"{path}: owned by uid {st.st_uid}, not by a spool writer")
            if st.st_mode & 0o002:
                raise UnsafeFile(f"{path}: writable by every user (mode {st.st_mode & 0o7777:o})")
            if st.st_size > MAX_FILE_BYTES:
                raise UnsafeFile(f"{path}: {st.st_size} bytes, more than the {MAX_FILE_BYTES} a spool file may hold")
            chunks, left = [], MAX_FILE_BYTES + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 24))):
                chunks.append(chunk)
                left -= len(chunk)
            if left <= 0:
                raise UnsafeFile(f"{path}: grew past {MAX_FILE_BYTES} bytes while read")
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return parse_bytes(b"".join(chunks), path)


def _target_name(name: str) -> str:
    return name[: -len(".tmp")] if name.endswith(".tmp") else name


class _Subdirs:
    """The spool directory and its subdirectories as descriptors, opened once, never through a link."""

    def __init__(self, spool_dir: str | os.PathLike) -> None:
        self.fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.subs: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name not in self.subs:
            try:
                self.subs[name] = open_subdir(self.fd, name, SPOOL_DIR)
            except UnsafePath:
                # Something planted in its place (a symbolic link to elsewhere): renamed aside within the
                # spool (a rename never follows it), and a fresh directory made, so shipping goes on.
                os.rename(name, f"{name}.unsafe-{time.time_ns()}", src_dir_fd=self.fd, dst_dir_fd=self.fd)
                self.subs[name] = open_subdir(self.fd, name, SPOOL_DIR)
        return self.subs[name]

    def sync_and_close(self, sync: bool = True) -> None:
        try:
            if sync:
                os.fsync(self.fd)
                for fd in self.subs.values():
                    os.fsync(fd)
        finally:
            for fd in self.subs.values():
                os.close(fd)
            os.close(self.fd)


def quarantine(spool_dir: str | os.PathLike, reads: Iterable[SpoolRead],
               files: Iterable[tuple[str, str]] = ()) -> None:
    """Note refused lines in ``quarantine/NAME.refused`` (one JSON object per line: line, reason, the text
    escaped), and move ``files`` ((name, reason): refused unread) into ``quarantine/`` beside a
    ``NAME.reason`` note. Names come from the directory listing, never from record content."""
    import json

    reads = [r for r in reads if r.refused]
    files = list(files)
    if not reads and not files:
        return
    d = _Subdirs(spool_dir)
    ok = False
    try:
        q = d(QUARANTINE_DIR)
        for r in reads:
            name = r.path.name
            lines = "".join(json.dumps({"file": name, "line": n, "reason": why, "text": raw}, sort_keys=True,
                                       ensure_ascii=True) + "\n" for n, why, raw in r.refused)
            write_beside(q, name + ".refused", lines.encode("utf-8"), SPOOL_FILE)
        for name, reason in files:
            write_beside(q, name + ".reason", (json.dumps({"reason": reason}, ensure_ascii=True) + "\n").encode(),
                         SPOOL_FILE)
            try:
                os.rename(name, name, src_dir_fd=d.fd, dst_dir_fd=q)
            except FileNotFoundError:
                pass
        ok = True
    finally:
        d.sync_and_close(ok)


def mark_shipped_many(spool_dir: str | os.PathLike, reads: Iterable[SpoolRead]) -> None:
    """Move many shipped files aside, with one directory fsync for the lot instead of one per file.

    Every open and rename is relative to a directory descriptor without following links: a symbolic link
    planted at ``torn/NAME.torn`` or in place of ``shipped/`` cannot redirect a root shipper's write."""
    d = _Subdirs(spool_dir)
    ok = False
    try:
        for read_result in reads:
            name = read_result.path.name
            if read_result.torn is not None:
                write_beside(d(TORN_DIR), name + ".torn", (read_result.torn + "\n").encode("utf-8", "surrogatepass"),
                             SPOOL_FILE)
            try:
                os.rename(name, _target_name(name), src_dir_fd=d.fd, dst_dir_fd=d(SHIPPED_DIR))
            except FileNotFoundError:  # a concurrent shipper committed and moved it first: nothing left to do
                pass
        ok = True
    finally:
        d.sync_and_close(ok)
