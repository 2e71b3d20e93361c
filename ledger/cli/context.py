"""What every command shares: the site config, the database URL and a lazily opened engine."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click

from .. import config as config_mod
from ..db import LedgerError, make_engine, require_schema
from ..method.skus import SkuError
from ..site import Site, site_from_config
from ..textsafe import echo, json_text


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
            try:
                # the CLI is a main program, so big receipts may start worker processes
                self._site = site_from_config(self.config, db=self.db_option, main_program=True)
            except SkuError as exc:
                raise UserError(str(exc)) from None
        return self._site

    @property
    def db_url(self) -> str:
        return config_mod.normalise_db_url(self.db_option or self.config.db)

    def engine(self, require: bool = True):  # noqa: ANN201
        if self._engine is None:
            self._engine = make_engine(self.db_url)
        if require and not self._checked:
            try:
                require_schema(self._engine)
            except LedgerError as exc:
                raise UserError(str(exc)) from None
            self._checked = True
        return self._engine


pass_app = click.make_pass_decorator(AppContext)

# Bounds of the integers the ledger stores (a seq is a 64-bit integer in both databases, a run a restart
# count): a value outside them is a one-line usage error, not an overflow deep in the database driver.
SEQ = click.IntRange(0, 2**63 - 1)
RUN = click.IntRange(0, 2**31 - 1)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False)) + "\n")
