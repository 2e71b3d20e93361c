"""Who sees what: the `[serve]` settings (user header, trusted proxies, users and their roles) and the user a
request is made by. Pure: the settings come in as the parsed config's tables, the request as its headers and
peer address."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Mapping

OPERATOR, TENANT = "operator", "tenant"
DEFAULT_HEADER = "X-Remote-User"


class AccessError(ValueError):
    """A `[serve]` setting that cannot be used (one line: the config file and the field)."""


@dataclass(frozen=True)
class User:
    name: str
    role: str
    accounts: frozenset[str] = frozenset()

    @property
    def operator(self) -> bool:
        return self.role == OPERATOR

    def sees(self, account: str | None) -> bool:
        """Whether this user may see what belongs to ``account`` (a tenant: only their own accounts)."""
        return self.operator or (account is not None and str(account) in self.accounts)


@dataclass(frozen=True)
class Access:
    user_header: str
    trusted_proxies: tuple  # ipaddress networks
    users: Mapping[str, User]
    local_user: User | None = None   # `serve --local-operator`: loopback requests without the header

    def user(self, headers: Mapping[str, str], peer: str | None) -> User | None:
        """The user a request is made by: the header's name, only from a trusted proxy and only when the config
        names that user; else None (the caller answers 401)."""
        if not peer or not self.trusted(peer):
            return None
        name = headers.get(self.user_header.lower()) or headers.get(self.user_header)
        if not name:
            if self.local_user is not None and ipaddress.ip_address(peer).is_loopback:
                return self.local_user
            return None
        return self.users.get(name.strip())

    def trusted(self, peer: str) -> bool:
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(addr in net for net in self.trusted_proxies)


def local_operator(access: Access, host: str) -> Access:
    """``access`` where a request from this machine with no user header is the operator ``local`` (for the
    demo and a single-user workstation); refused unless the server listens on a loopback address only."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise AccessError(f"--local-operator: only with a loopback --host (127.0.0.1), not {host!r}")
    nets = access.trusted_proxies + tuple(ipaddress.ip_network(a) for a in ("127.0.0.0/8", "::1/128"))
    return Access(access.user_header, nets, access.users, User("local", OPERATOR))


def from_config(extra: Mapping[str, object], where: str = "config") -> Access:
    """The `[serve]` table of a parsed config (``Config.extra``) as :class:`Access`; :class:`AccessError` names
    the file and field of a bad value."""
    serve = extra.get("serve", {})
    if not isinstance(serve, Mapping):
        raise AccessError(f"{where}: [serve] must be a table")
    header = serve.get("user_header", DEFAULT_HEADER)
    if not isinstance(header, str) or not header.strip():
        raise AccessError(f"{where}: serve.user_header must be a header name")
    proxies = serve.get("trusted_proxies", ["127.0.0.1", "::1"])
    if not isinstance(proxies, list):
        raise AccessError(f"{where}: serve.trusted_proxies must be a list of addresses or networks")
    nets = []
    for p in proxies:
        try:
            nets.append(ipaddress.ip_network(str(p), strict=False))
        except ValueError:
            raise AccessError(f"{where}: serve.trusted_proxies: {p!r} is not an address or network") from None
    users_t = serve.get("users", {})
    if not isinstance(users_t, Mapping):
        raise AccessError(f"{where}: [serve.users] must be a table of user tables")
    users = {}
    for name, u in users_t.items():
        if not isinstance(u, Mapping):
            raise AccessError(f"{where}: serve.users.{name} must be a table")
        role = u.get("role")
        if role not in (OPERATOR, TENANT):
            raise AccessError(f"{where}: serve.users.{name}.role must be \"operator\" or \"tenant\", got {role!r}")
        accounts = u.get("accounts", [])
        if not isinstance(accounts, list) or not all(isinstance(a, str) and a for a in accounts):
            raise AccessError(f"{where}: serve.users.{name}.accounts must be a list of account names")
        if role == TENANT and not accounts:
            raise AccessError(f"{where}: serve.users.{name}: a tenant needs accounts = [...]")
        users[str(name)] = User(str(name), role, frozenset(accounts))
    return Access(header.strip(), tuple(nets), users)
