"""Real servers for the integration tests (no mocks of the real parts): started here, as root, on 127.0.0.1 only.

In CI (``CI=true``) a server that cannot start is a test *failure*; elsewhere the tests that need it skip
with the reason. Each starter returns a handle with ``stop()``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: a missing real part is never silently ignored in CI."""
    if IN_CI:
        pytest.fail(f"real service unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user: str, argv: list[str]) -> list[str]:
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *argv]
    return argv


@dataclass
class Postgres:
    datadir: Path
    port: int
    bindir: Path

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_db(self, dbname: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
            conn.execute(f'CREATE DATABASE "{dbname}"')
        return self.url(dbname)

    def pg_ctl(self, action: str) -> None:
        argv = [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "60", action]
        if action in ("start", "restart"):
            argv[1:1] = ["-o", f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"]
            argv += ["-l", str(self.datadir / "server.log")]
        if action == "stop":
            argv += ["-m", "fast"]
        subprocess.run(as_user("postgres", argv), check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        try:
            self.pg_ctl("stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.datadir, ignore_errors=True)


def find_pg_bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def start_postgres() -> Postgres:
    bindir = find_pg_bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries not installed (Debian package `postgresql`; `make test` installs it)")
    datadir = Path(tempfile.mkdtemp(prefix="ipledger-pg-"))
    if os.geteuid() == 0:
        shutil.chown(datadir, "postgres", "postgres")
    init = subprocess.run(as_user("postgres", [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres",
                                               "-A", "trust", "-E", "UTF8", "--no-sync"]),
                          capture_output=True, text=True, timeout=180)
    if init.returncode != 0:
        unavailable(f"initdb failed: {init.stderr.strip()[-300:]}")
    pg = Postgres(datadir=datadir, port=free_port(), bindir=bindir)
    try:
        pg.pg_ctl("start")
    except subprocess.CalledProcessError as exc:
        log = (datadir / "server.log").read_text(errors="replace")[-500:] if (datadir / "server.log").exists() else ""
        unavailable(f"PostgreSQL did not start: {exc.stderr!r} {log}")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", pg.port), timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    return pg
