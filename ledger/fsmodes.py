"""Modes of the files and directories ipledger creates, set exactly whatever the process umask (docs/ledger.md,
"Permissions"). Standard library only: the hooks' spool writes use it.

The ledger and the spool hold user, account, host and job names, so nothing ipledger creates is readable by
every local user. Directories and files that already exist keep the modes the site gave them.
"""

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
