"""Writing a command's ``--out`` file without ever damaging what stood there.

Every ``--out`` goes through :func:`output_file`: the writer writes a new temporary file beside the target
(same directory, so the final rename is atomic), it is fsynced and renamed over the target only when the
writer succeeded. A failed write (disk full, a renderer's error) removes the temporary file and leaves the
target exactly as it was. A target that exists and is not a regular file (a device node, a FIFO, a
directory, a symbolic link) is refused before anything is written; ``-`` (standard output) is the caller's.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator


class OutputError(ValueError):
    """The output cannot be written; one line naming the file."""


def check_target(target: str | os.PathLike) -> Path:
    """The target as a Path, refused (:class:`OutputError`) unless it is absent or a regular file."""
    path = Path(target)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
            else "not a regular file"
        raise OutputError(f"{path}: {what}; --out writes regular files only (use - for standard output)")
    return path


@contextlib.contextmanager
def output_file(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``target`` to write to; renamed over ``target`` when the block succeeds.

    The new file gets the mode the target had, or the umask's default for a new file.
    """
    path = check_target(target)
    directory = path.parent if str(path.parent) else Path(".")
    tmp = directory / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        os.close(fd)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror})") from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
            try:
                os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))
            except FileNotFoundError:
                pass
        check_target(path)   # still absent or a regular file: it may have changed while we wrote
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise


def write_output(target: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``target`` through :func:`output_file`; returns the path."""
    with output_file(target) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(target)
