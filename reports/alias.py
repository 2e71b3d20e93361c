"""Pseudonymisation for exports: hostnames and users replaced by keyed-HMAC (SHA-256) aliases.

The same key gives the same alias for the same name in every export (so months can be joined), a different
key gives unrelated aliases, and without the key an alias cannot be turned back into a name by guessing
a list of hostnames. The key file's bytes are the key (a trailing newline is ignored).

Device keys are aliased too (:meth:`Aliaser.device`), in every form they take: a GPU or MIG UUID names no
host and stays; a GPU whose UUID could not be read is keyed ``index:HOST:N`` by the hooks and keeps its form
with the host aliased; any other key (an importer's ``instance/gpuN``, whatever a label held) becomes a
``device-`` alias as a whole.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

_UUID = re.compile(r"(?:(?:GPU|MIG)-)?[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]+)+(?:/gi\d+)?|(?:GPU|MIG)-[0-9A-Fa-f-]+(?:/gi\d+)?")
_INDEX = re.compile(r"index:(.*):(\d+)")
ALIAS_HEX = 12  # 48 bits: collision-free for any realistic fleet, short enough to read in a table


class AliasError(ValueError):
    pass


def read_key(path: str | Path) -> bytes:
    """The key's bytes; a missing, empty or world-accessible key file is a one-line error.

    Anyone holding the key can re-identify every alias by hashing a list of hostnames and users, so a key
    file every local user may read (or replace) is refused, as ssh refuses such a private key.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode & 0o777
        key = p.read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise AliasError(f"{p}: cannot read alias key ({exc.strerror})") from None
    if mode & 0o007:
        raise AliasError(f"{p}: alias key is open to every user (mode {mode:04o}); chmod 600 (or 640 for a group)")
    if len(key) < 16:
        raise AliasError(f"{p}: alias key too short ({len(key)} bytes; use at least 16 random bytes)")
    return key


class Aliaser:
    """Maps names to stable aliases; ``Aliaser(None)`` leaves names as they are (site-internal exports)."""

    def __init__(self, key: bytes | None) -> None:
        self.key = key
        self._cache: dict[tuple[str, str], str] = {}

    @property
    def active(self) -> bool:
        return self.key is not None

    def alias(self, kind: str, name: str | None) -> str | None:
        """``kind`` (``host``/``user``) is part of the MAC input, so a user and a host of the same name differ."""
        if name is None or self.key is None:
            return name
        k = (kind, name)
        out = self._cache.get(k)
        if out is None:
            mac = hmac.new(self.key, f"{kind}\x00{name}".encode("utf-8"), hashlib.sha256).hexdigest()
            out = self._cache[k] = f"{kind}-{mac[:ALIAS_HEX]}"
        return out

    def host(self, name: str | None) -> str | None:
        return self.alias("host", name)

    def user(self, name: str | None) -> str | None:
        return self.alias("user", name)

    def device(self, key: str | None) -> str | None:
        """A device key with every host in it aliased (see the module doc)."""
        if not key or self.key is None:
            return key
        if _UUID.fullmatch(key):
            return key
        m = _INDEX.fullmatch(key)
        if m:
            return f"index:{self.host(m.group(1))}:{m.group(2)}"
        return self.alias("device", key)

    def hosts(self, joined: str | None, sep: str = ",") -> str | None:
        """A separator-joined list of hosts, each aliased."""
        if not joined or self.key is None:
            return joined
        return sep.join(self.host(h) or "" for h in joined.split(sep))
