"""What every command shares: the site config, the database URL and a lazily opened engine (read-only for the
commands that only read, :func:`reads_only`), and the ``--as-of`` option's type (a sequence number or a time)."""

from __future__ import annotations

import functools
import json
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from ..base import config as config_mod
from ..base.textsafe import echo, json_text

if TYPE_CHECKING:
    from ..ingest.site import Site

# The database layer (SQLAlchemy), the SKU table and the method (numpy) are imported when a command first needs
# them, not here: `ipledger --help` and every command's --help load none of them (tests/test_cli_core.py).


class UserError(click.ClickException):
    """Bad input or an unusable environment: printed as one line, exit status 1."""

    def show(self, file: Any = None) -> None:  # one line, no "Error: " banner noise beyond the reason
        echo(f"ipledger: {self.format_message()}", err=True)


@dataclass
class AppContext:
    db_option: str | None = None
    config_path: str | None = None
    _config: config_mod.Config | None = None
    _site: Site | None = None
    _engine: Any = None
    _checked: bool = False
    read_only: bool = False   # set by @reads_only before the command opens the ledger
    extras: dict = field(default_factory=dict)

    @property
    def config(self) -> config_mod.Config:
        if self._config is None:
            try:
                self._config = config_mod.load(self.config_path)
            except config_mod.ConfigError as exc:
                raise UserError(str(exc)) from None
        return self._config

    @property
    def site(self) -> Site:
        """The site this command works for, built once from --config (and --db): every command passes it on."""
        if self._site is None:
            from ..method.skus import SkuError
            from ..ingest.site import SiteError, site_from_config

            try:
                # the CLI is a main program, so big receipts may start worker processes
                self._site = site_from_config(self.config, db=self.db_option, main_program=True)
            except (SkuError, SiteError) as exc:
                raise UserError(str(exc)) from None
        return self._site

    @property
    def db_url(self) -> str:
        return config_mod.normalise_db_url(self.db_option or self.config.db)

    def engine(self, require: bool = True):  # noqa: ANN201
        """The ledger's engine. ``require``: the ledger must exist and carry this ipledger's schema (every command
        but ``init``, the one that may create a database); a missing SQLite file is "no ledger at PATH" and
        nothing is created. Opened read-only for a command marked :func:`reads_only`."""
        from ..chain.db import LedgerError, make_engine, require_schema

        if self._engine is None:
            try:
                self._engine = make_engine(self.db_url, create=not require, read_only=require and self.read_only)
            except LedgerError as exc:
                raise UserError(str(exc)) from None
        if require and not self._checked:
            try:
                require_schema(self._engine)
            except LedgerError as exc:
                raise UserError(str(exc)) from None
            self._checked = True
        return self._engine

    def reader(self):  # noqa: ANN201
        """The ledger of a command that only reads it through the chain's read path (receipt, verify, log): an
        SQLite file through the standard library's sqlite3 (:mod:`ledger.chain.lite`: no SQLAlchemy import);
        otherwise, or when the command was given a flag that writes, :meth:`engine`."""
        from ..chain.db import LedgerError, make_reader, require_schema

        if self._engine is None and self.read_only:
            try:
                reader = make_reader(self.db_url)
                if reader is not None:
                    require_schema(reader)
            except LedgerError as exc:
                raise UserError(str(exc)) from None
            if reader is not None:
                self._engine, self._checked = reader, True
        return self.engine()

    def as_of_seq(self, value: "AsOf | int | None") -> int | None:
        """The sequence number an ``--as-of`` names: a seq at or below the ledger's head, or the last seq of the
        ledger as it stood at a time (:func:`ledger.chain.db.seq_standing_at`); past the end is a one-line error."""
        if value is None or isinstance(value, int):
            return value
        from ..chain import store

        head = store.get_head(self.engine())[0]
        if value.seq is not None:
            if value.seq > head:
                raise UserError(f"--as-of {value.text}: past the ledger's end (its last entry is seq {head})")
            return value.seq
        import time

        if value.epoch > time.time():
            raise UserError(f"--as-of {value.text}: past the ledger's end (that time is still to come)")
        from ..chain.db import seq_standing_at

        seq = seq_standing_at(self.engine(), value.epoch)
        if seq == 0:
            raise UserError(f"--as-of {value.text}: before the ledger's first entry")
        return seq


@dataclass(frozen=True)
class AsOf:
    """What ``--as-of`` was given: a sequence number, or a time (epoch seconds) resolved against the ledger."""

    text: str
    seq: int | None = None
    epoch: float | None = None


class AsOfType(click.ParamType):
    """``--as-of``: a sequence number (1200) or an RFC 3339 time (2026-11-30T00:00:00Z; a bare date is its
    00:00 UTC)."""

    name = "SEQ|TIME"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201
        if isinstance(value, AsOf):
            return value
        from ..chain.canonical import ts_to_epoch
        from ..base.textsafe import printable

        v = str(value).strip()
        if re.fullmatch(r"\d+", v):
            n = int(v)
            if n > 2**63 - 1:
                self.fail(f"{printable(v)} is past any sequence number", param, ctx)
            return AsOf(v, seq=n)
        t = v + "T00:00:00Z" if re.fullmatch(r"\d{4}-\d{2}-\d{2}", v) else v
        try:
            return AsOf(v, epoch=ts_to_epoch(t))
        except ValueError:
            self.fail(f"{printable(v)!r} is neither a sequence number nor an RFC 3339 time with a zone "
                      "(e.g. 1200 or 2026-11-30T00:00:00Z)", param, ctx)


AS_OF = AsOfType()


def reads_only(*writing_flags: str, writes_unless: str | None = None):  # noqa: ANN201
    """Mark a command that only reads the ledger (unless one of ``writing_flags`` is given, e.g. ``issue``;
    or, with ``writes_unless``, only when that option is given: ``export monthly`` records the statement's
    export unless it reproduces one ``--as-of``): its SQLite ledger is opened read-only, and its ``as_of``
    argument arrives as a resolved sequence number. Put it right above the function, under ``@pass_app``."""

    def wrap(f):  # noqa: ANN001, ANN202
        @functools.wraps(f)
        def command(app: "AppContext", *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if writes_unless is not None:
                app.read_only = kwargs.get(writes_unless) is not None
            else:
                app.read_only = not any(kwargs.get(flag) for flag in writing_flags)
            if isinstance(kwargs.get("as_of"), AsOf):
                kwargs["as_of"] = app.as_of_seq(kwargs["as_of"])
            return f(app, *args, **kwargs)

        return command

    return wrap


pass_app = click.make_pass_decorator(AppContext)

# Bounds of the integers the ledger stores (a seq is a 64-bit integer in both databases, a run a restart
# count): a value outside them is a one-line usage error, not an overflow deep in the database driver.
SEQ = click.IntRange(0, 2**63 - 1)
RUN = click.IntRange(0, 2**31 - 1)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False)) + "\n")
