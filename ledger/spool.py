"""The local spool: durable JSON-lines files written before anything else, shipped to the ledger later.

Writers (hooks, collector, importers) call :func:`write`; each call makes one new file, written under a
``.tmp`` name, fsynced, then renamed to ``.jsonl`` and the directory fsynced, so a reader never sees a file
being written. A writer that crashed leaves a ``.tmp`` file; :func:`pending_files` offers it once stale, and
its torn last line (if any) is reported, kept aside, and skipped. Standard library only.
"""

from __future__ import annotations

import os
import time

from .frozen import Frozen
from .fsmodes import SPOOL_DIR, SPOOL_FILE, create_file, make_dirs

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (strings here): typing stays off the hook's import path
    from pathlib import Path
    from typing import Callable, Iterable, Mapping

# The Slurm hooks only call write_records(): pathlib, dataclasses and json (≈ 20 ms to import under
# python -I -S, with what they pull in) are imported by the functions that need them; SpoolRead is Frozen, not a dataclass.

SHIPPED_DIR = "shipped"
TORN_DIR = "torn"
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


def pending_files(spool_dir: str | os.PathLike, stale_tmp_seconds: float = STALE_TMP_SECONDS) -> list[Path]:
    """Files ready to ship, oldest first: every ``.jsonl`` and every ``.tmp`` abandoned by a crashed writer."""
    from pathlib import Path

    directory = Path(spool_dir)
    if not directory.is_dir():
        return []
    now = time.time()
    files = []
    for p in directory.iterdir():
        if not p.is_file():
            continue
        if p.name.endswith(".jsonl"):
            files.append(p)
        elif p.name.endswith(".jsonl.tmp") and now - p.stat().st_mtime > stale_tmp_seconds:
            files.append(p)
    return sorted(files, key=lambda p: p.name)


class SpoolRead(Frozen):
    __slots__ = ("path", "records", "torn", "errors")
    path: Path
    records: list[dict]
    torn: str | None  # the undecodable tail, if the file ended mid-record
    errors: list[str]  # "file:line: reason" for undecodable lines that are not the tail


def parse(text: str, path: Path) -> SpoolRead:
    """Split a spool file into records; a bad *last* line is torn (a crash mid-write), a bad inner line an error."""
    lines = text.split("\n")
    ends_cleanly = text.endswith("\n") or text == ""
    if ends_cleanly:
        lines = lines[:-1]
    records: list[dict] = []
    errors: list[str] = []
    torn: str | None = None
    import json

    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = i == len(lines)
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
            if last:
                torn = line
            else:
                errors.append(f"{path}:{i}: undecodable spool line ({exc})")
            continue
        if last and not ends_cleanly:
            # A complete JSON object without its newline: the writer died right after it. Keep it.
            pass
        records.append(rec)
    return SpoolRead(path=path, records=records, torn=torn, errors=errors)


def read(path: Path) -> SpoolRead:
    return parse(path.read_bytes().decode("utf-8", errors="replace"), path)


def mark_shipped(spool_dir: str | os.PathLike, read_result: SpoolRead) -> None:
    """Move a shipped file aside (only ever called after the ledger committed its entries)."""
    mark_shipped_many(spool_dir, [read_result])


def mark_shipped_many(spool_dir: str | os.PathLike, reads: Iterable[SpoolRead]) -> None:
    """Move many shipped files aside, with one directory fsync for the lot instead of one per file."""
    from pathlib import Path

    directory = Path(spool_dir)
    done = directory / SHIPPED_DIR
    make_dirs(done, SPOOL_DIR)
    any_torn = False
    for read_result in reads:
        if read_result.torn is not None:
            torn_dir = directory / TORN_DIR
            make_dirs(torn_dir, SPOOL_DIR)
            fd = create_file(torn_dir / (read_result.path.name + ".torn"), SPOOL_FILE,
                             os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8") as torn_file:
                torn_file.write(read_result.torn + "\n")
            any_torn = True
        target_name = read_result.path.name
        if target_name.endswith(".tmp"):
            target_name = target_name[: -len(".tmp")]
        try:
            os.replace(read_result.path, done / target_name)
        except FileNotFoundError:  # a concurrent shipper committed and moved it first: nothing left to do
            pass
    _fsync_dir(directory)
    _fsync_dir(done)
    if any_torn:
        _fsync_dir(directory / TORN_DIR)
