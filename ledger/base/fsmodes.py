"""Modes of the files ipledger creates, set exactly whatever the process umask, and of the files it trusts
(docs/ledger.md, "Permissions"). Standard library only: the hooks' spool writes and config read use it.

The ledger and the spool hold user, account, host and job names, so nothing ipledger creates is readable by
every local user. Directories and files that already exist keep the modes the site gave them.

What ipledger *reads and acts on* — the site config (it names the programs the root prolog runs) and signing
keys — is refused, like OpenSSH's StrictModes, when someone other than its owner could have written it
(:func:`strict_problem`, :func:`read_strict`).
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


# --- files ipledger trusts: the site config, signing keys, pinned public keys --------------------------------

class UnsafeMode(ValueError):
    """A file ipledger would trust that another user could have written (or, a private key, read): one line."""


def strict_problem(st: os.stat_result, *, secret: bool, euid: int,
                   dir_st: "os.stat_result | None" = None) -> "str | None":
    """Why a file with this ``st`` (and containing directory ``dir_st``) must not be trusted by a process of
    effective uid ``euid``, or None. Refused: not a regular file; writable by group or other (``secret``: a
    private key, also readable by them); read by root but not owned by root; in a directory that group or
    other may write without the sticky bit (anyone could replace the file), or, for root, one not owned by
    root. The owner may be anyone for a non-root reader (a job's user reads root's config)."""
    if (st.st_mode & 0o170000) != 0o100000:
        return "not a regular file"
    loose = st.st_mode & (0o077 if secret else 0o022)
    if loose:
        who = "group and other" if loose & 0o7 and loose & 0o70 else "other" if loose & 0o7 else "group"
        what, fix = ("read or write", "600") if secret else ("write", "go-w")
        return f"mode {st.st_mode & 0o7777:04o} lets {who} users {what} it (chmod {fix} it)"
    if euid == 0 and st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not by root, and read by a root process"
    if dir_st is not None:
        if dir_st.st_mode & 0o022 and not dir_st.st_mode & 0o1000:
            return f"its directory (mode {dir_st.st_mode & 0o7777:04o}) lets other users replace it"
        if euid == 0 and dir_st.st_uid != 0:
            return f"its directory is owned by uid {dir_st.st_uid}, not by root, and read by a root process"
    return None


def read_strict(path: "str | os.PathLike", *, secret: bool, euid: int, follow: bool = False,
                limit: int = 1 << 20) -> bytes:
    """The bytes of a file ipledger trusts, once :func:`strict_problem` finds nothing wrong with the file
    actually opened (``fstat`` of the descriptor, so it cannot be swapped between the check and the read).
    A symbolic link is refused unless ``follow``. Raises :class:`UnsafeMode` or OSError (one line each)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise UnsafeMode(f"{p}: a symbolic link; refusing to read a key through it") from None
        raise
    try:
        try:
            dir_st = os.stat(os.path.dirname(os.path.abspath(p)))
        except OSError:
            dir_st = None
        problem = strict_problem(os.fstat(fd), secret=secret, euid=euid, dir_st=dir_st)
        if problem:
            raise UnsafeMode(f"{p}: {problem}; refusing to use it")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnsafeMode(f"{p}: larger than {limit} bytes; not a key")
        return b"".join(chunks)
    finally:
        os.close(fd)
