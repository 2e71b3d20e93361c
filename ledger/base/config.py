"""Site configuration: one TOML file (``/etc/ipledger/config.toml`` or ``$IPLEDGER_CONFIG``), env overrides.

A config file another user could have written is refused (ledger.base.fsmodes.strict_problem): it names the
programs the root prolog runs. Standard library only, and no I/O until :func:`load` is called: the hooks read it on their fast path, through
:func:`load_values` (no dataclasses) and a snapshot of the parsed TOML (no tomllib) that is re-made whenever
the TOML file changes.
"""

from __future__ import annotations

import os

from .frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hook's import path
    from typing import Mapping

DEFAULT_CONFIG_PATH = "/etc/ipledger/config.toml"
DEFAULT_DB_PATH = "/var/lib/ipledger/ledger.db"
DEFAULT_SPOOL = "/var/spool/ipledger"
# A snapshot of the parsed TOML is made only once the file's mtime is this old: an edit within the same
# timestamp tick as our read could otherwise leave an identical (mtime, size) key over different bytes; any
# later write sets a new mtime. ctime is in the key too (mtime set back by hand, e.g. touch -d, still shows).
SNAPSHOT_SETTLE_S = 2.0


class ConfigError(ValueError):
    """A configuration problem, phrased as one line naming the file and the field."""


# Frozen, not a dataclass: the Slurm hooks import this module and must not pay for dataclasses (and inspect),
# ≈ 9 ms under python -I -S.
class Config(Frozen):
    __slots__ = ("db", "spool", "cluster", "commands", "receipts_dir", "hook_timeout_s", "path", "extra",
                 "trusted_keys")
    _defaults = {"db": f"sqlite:///{DEFAULT_DB_PATH}", "spool": DEFAULT_SPOOL, "cluster": None, "commands": dict,
                 "receipts_dir": None, "hook_timeout_s": 5.0, "path": None, "extra": dict, "trusted_keys": tuple}
    db: str
    spool: str
    cluster: str | None
    commands: Mapping[str, str]
    receipts_dir: str | None
    hook_timeout_s: float
    path: str | None
    extra: Mapping[str, object]
    trusted_keys: tuple[str, ...]   # public keys (PEM files) that must have signed every tree head (verify)


def load(path: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the config file (if any) and apply ``IPLEDGER_DB``, ``IPLEDGER_SPOOL``, ``IPLEDGER_CLUSTER``."""
    return Config(**load_values(path, environ))


def _path_text(path: str) -> str:
    """``str(pathlib.Path(path))`` without importing pathlib when the path is already in that form."""
    parts = path.split("/")
    if path and "" not in parts[1:] and "." not in parts:
        return path
    from pathlib import Path

    return str(Path(path))


def _parse_toml(cfg_path: str) -> dict:
    import tomllib

    try:
        with open(cfg_path, encoding="utf-8") as f:  # text mode, as Path.read_text: newlines translated
            return tomllib.loads(f.read())
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, and int()'s digit limit inside tomllib
        raise ConfigError(f"{cfg_path}: not valid TOML: {exc}") from None


def _read_toml(cfg_path: str, st: os.stat_result, snapshot: str | None) -> dict:
    """The parsed TOML; with ``snapshot`` (a file path) through a copy keyed by the file's identity.

    The key is (path, inode, size, mtime_ns, ctime_ns, Python version): any change to the file re-parses it,
    so the snapshot is never stale. The copy is in :mod:`marshal` (builtin: no import cost, exact for str,
    int, float incl. inf/nan, bool, None, lists and tables); values it cannot hold (TOML dates) are simply
    not snapshotted.
    """
    import marshal
    import sys

    key = (os.path.abspath(cfg_path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sys.hexversion)
    if snapshot is not None:
        try:
            with open(snapshot, "rb") as f:
                snap_st = os.fstat(f.fileno())  # a copy someone else could have written is not used
                trusted = not snap_st.st_mode & 0o022 and snap_st.st_uid in (0, os.geteuid())
                snap_key, snap_data = marshal.loads(f.read()) if trusted else (None, None)
            if snap_key == key and type(snap_data) is dict:
                return snap_data
        except (OSError, ValueError, EOFError, TypeError):
            pass
    data = _parse_toml(cfg_path)
    if snapshot is not None and _now() - st.st_mtime > SNAPSHOT_SETTLE_S:
        try:
            blob = marshal.dumps((key, data))
            tmp = f"{snapshot}.{os.getpid()}.tmp"
            # The copy is exactly as readable as the file it copies (a 0600 config may hold the db password),
            # whatever the umask; `ipledger mark` run by a job's user reads it only where the config allows.
            mode = st.st_mode & 0o644
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(fd, mode)
                f.write(blob)
            os.replace(tmp, snapshot)
        except (OSError, ValueError):  # unwritable directory, or a value marshal cannot hold
            pass
    return data


def _refuse_loose(cfg_path: str, st: os.stat_result) -> None:
    """The config names the programs the root prolog runs: one another user could have written is refused
    (ledger.base.fsmodes.strict_problem, as OpenSSH's StrictModes), whoever reads it."""
    from .fsmodes import strict_problem

    try:
        dir_st = os.stat(os.path.dirname(os.path.abspath(cfg_path)))
    except OSError:
        dir_st = None
    problem = strict_problem(st, secret=False, euid=os.geteuid(), dir_st=dir_st)
    if problem:
        raise ConfigError(f"{cfg_path}: {problem}; refusing to read a config another user could have written")


def _now() -> float:
    import time

    return time.time()


def load_values(path: str | None = None, environ: Mapping[str, str] | None = None, *,
                snapshot: str | None = None) -> dict:
    """What :func:`load` puts into :class:`Config`, as a dict of its fields (same checks, same errors).

    ``snapshot``: a file where a JSON copy of the parsed TOML may be kept (the Slurm hooks pass one beside the
    installed scripts); it is used only while the TOML file's inode, size, mtime and ctime are unchanged.
    """
    env = os.environ if environ is None else environ
    cfg_path = path or env.get("IPLEDGER_CONFIG") or DEFAULT_CONFIG_PATH
    data: dict = {}
    try:
        st = os.stat(cfg_path)
    except (OSError, ValueError):
        st = None
    is_file = st is not None and (st.st_mode & 0o170000) == 0o100000  # stat.S_ISREG, as Path.is_file()
    if is_file:
        _refuse_loose(cfg_path, st)  # type: ignore[arg-type]
        data = _read_toml(cfg_path, st, snapshot)  # type: ignore[arg-type]
    elif path or env.get("IPLEDGER_CONFIG"):
        raise ConfigError(f"{cfg_path}: config file not found")
    commands = data.get("commands", {})
    if not isinstance(commands, dict):
        raise ConfigError(f"{cfg_path}: [commands] must be a table of program = absolute path")
    for name, prog in commands.items():
        if not isinstance(prog, str) or not os.path.isabs(prog):
            raise ConfigError(f"{cfg_path}: commands.{name} must be an absolute path, got {prog!r}")
    trusted = data.get("trusted_keys", [])
    if not isinstance(trusted, list) or not all(isinstance(k, str) and k for k in trusted):
        raise ConfigError(f"{cfg_path}: trusted_keys must be a list of paths to the site's public keys (PEM)")
    here = os.path.dirname(os.path.abspath(cfg_path))
    known = {"db", "spool", "cluster", "commands", "receipts_dir", "hook_timeout_s", "trusted_keys"}
    try:
        timeout = float(data.get("hook_timeout_s", 5.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{cfg_path}: hook_timeout_s must be a number") from None
    return dict(
        db=env.get("IPLEDGER_DB") or data.get("db") or f"sqlite:///{DEFAULT_DB_PATH}",
        spool=env.get("IPLEDGER_SPOOL") or data.get("spool") or DEFAULT_SPOOL,
        cluster=env.get("IPLEDGER_CLUSTER") or data.get("cluster"),
        commands=dict(commands),
        receipts_dir=env.get("IPLEDGER_RECEIPTS_DIR") or data.get("receipts_dir"),
        hook_timeout_s=timeout,
        path=_path_text(cfg_path) if is_file else None,
        extra={k: v for k, v in data.items() if k not in known},
        trusted_keys=tuple(os.path.join(here, k) for k in trusted),  # relative to the config's directory
    )


def normalise_db_url(value: str) -> str:
    """Accept a bare file path as shorthand for an SQLite URL."""
    if "://" in value:
        return value
    return f"sqlite:///{os.path.abspath(value)}"
