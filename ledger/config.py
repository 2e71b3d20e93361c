"""Site configuration: one TOML file (``/etc/ipledger/config.toml`` or ``$IPLEDGER_CONFIG``), env overrides.

Standard library only, and no I/O until :func:`load` is called: the hooks read it on their fast path.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

DEFAULT_CONFIG_PATH = "/etc/ipledger/config.toml"
DEFAULT_DB_PATH = "/var/lib/ipledger/ledger.db"
DEFAULT_SPOOL = "/var/spool/ipledger"


class ConfigError(ValueError):
    """A configuration problem, phrased as one line naming the file and the field."""


@dataclass(frozen=True)
class Config:
    db: str = f"sqlite:///{DEFAULT_DB_PATH}"
    spool: str = DEFAULT_SPOOL
    cluster: str | None = None
    commands: Mapping[str, str] = field(default_factory=dict)
    receipts_dir: str | None = None
    hook_timeout_s: float = 5.0
    path: str | None = None
    extra: Mapping[str, object] = field(default_factory=dict)


def load(path: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the config file (if any) and apply ``IPLEDGER_DB``, ``IPLEDGER_SPOOL``, ``IPLEDGER_CLUSTER``."""
    env = os.environ if environ is None else environ
    cfg_path = path or env.get("IPLEDGER_CONFIG") or DEFAULT_CONFIG_PATH
    data: dict = {}
    p = Path(cfg_path)
    if p.is_file():
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{cfg_path}: not valid TOML: {exc}") from None
    elif path or env.get("IPLEDGER_CONFIG"):
        raise ConfigError(f"{cfg_path}: config file not found")
    commands = data.get("commands", {})
    if not isinstance(commands, dict):
        raise ConfigError(f"{cfg_path}: [commands] must be a table of program = absolute path")
    for name, prog in commands.items():
        if not isinstance(prog, str) or not os.path.isabs(prog):
            raise ConfigError(f"{cfg_path}: commands.{name} must be an absolute path, got {prog!r}")
    known = {"db", "spool", "cluster", "commands", "receipts_dir", "hook_timeout_s"}
    try:
        timeout = float(data.get("hook_timeout_s", 5.0))
    except (TypeError, ValueError):
        raise ConfigError(f"{cfg_path}: hook_timeout_s must be a number") from None
    return Config(
        db=env.get("IPLEDGER_DB") or data.get("db") or f"sqlite:///{DEFAULT_DB_PATH}",
        spool=env.get("IPLEDGER_SPOOL") or data.get("spool") or DEFAULT_SPOOL,
        cluster=env.get("IPLEDGER_CLUSTER") or data.get("cluster"),
        commands=dict(commands),
        receipts_dir=env.get("IPLEDGER_RECEIPTS_DIR") or data.get("receipts_dir"),
        hook_timeout_s=timeout,
        path=str(p) if p.is_file() else None,
        extra={k: v for k, v in data.items() if k not in known},
    )


def normalise_db_url(value: str) -> str:
    """Accept a bare file path as shorthand for an SQLite URL."""
    if "://" in value:
        return value
    return f"sqlite:///{os.path.abspath(value)}"
