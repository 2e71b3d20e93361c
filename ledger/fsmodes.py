"""Modes of the files and directories ipledger creates, set exactly whatever the process umask (docs/ledger.md,
"Permissions"). Standard library only: the hooks' spool writes use it.

The ledger and the spool hold user, account, host and job names, so nothing ipledger creates is readable by
every local user. Directories and files that already exist keep the modes the site gave them.
"""

import errno
import os

LEDGER_DIR, LEDGER_FILE = 0o700, 0o600      # the SQLite ledger (its -wal/-shm take the file's mode)
SPOOL_DIR, SPOOL_FILE = 0o750, 0o640        # hooks and collector write, the site's ipledger group may read
RECEIPTS_DIR, RECEIPTS_FILE = 0o750, 0o640  # automatic receipt files, one directory per account


def make_dirs(path: "str | os.PathLike", mode: int) -> None:
    """Create the directory and its missing parents with exactly ``mode``; existing ones are left alone."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_dirs(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:  # another writer made it first: its creator set the mode
        return
    os.chmod(path, mode)  # mkdir's mode passed through the umask; chmod does not


def create_file(path: "str | os.PathLike", mode: int, flags: int = os.O_WRONLY | os.O_CREAT | os.O_EXCL) -> int:
    """Open a new file with exactly ``mode`` (not ``mode & ~umask``); returns the descriptor."""
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


class UnsafePath(RuntimeError):
    """Something other than the directory ipledger made stands where it writes (a planted symbolic link)."""


def open_subdir(dir_fd: int, name: str, mode: int) -> int:
    """A subdirectory (the spool's shipped, torn, quarantine; an account's receipts) as a descriptor, made
    with ``mode`` if missing; a symbolic link or anything else in its place is refused (:class:`UnsafePath`),
    never followed."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        pass
    except NotImplementedError:  # chmod without following links is not offered everywhere: set it by fd below
        pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"subdirectory {name!r} is not a directory (a symbolic link?); refusing "
                              f"to write through it") from None
        raise
    return fd


def write_beside(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``name`` in the directory ``dir_fd`` as a new file (a unique temporary name, O_EXCL|O_NOFOLLOW,
    fsynced, then renamed over ``name``): whatever stood at ``name`` (a planted symbolic link) is replaced,
    never opened."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
