"""Entry point of the `ipledger` command: the group, its global options, and the command modules it loads."""

from __future__ import annotations

import importlib

import click

from .. import __version__
from .context import AppContext

# Each module defines register(cli). Kept as names so a broken optional area cannot hide the core commands.
COMMAND_MODULES = [
    "ledger.cli.core",
    "ledger.cli.hooks",
    "ledger.cli.receipt",
    "ledger.cli.contract",
    "ledger.cli.adjust",
    "ledger.cli.demo",
    "ledger.cli.agents",
    "ledger.cli.importers",
    "ledger.cli.collect",
    "ledger.cli.export",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--db", "db", metavar="URL", envvar="IPLEDGER_DB",
              help="Ledger database (SQLAlchemy URL or a file path). Default: config file, then "
                   "sqlite:////var/lib/ipledger/ledger.db.")
@click.option("--config", "config_path", metavar="PATH", envvar="IPLEDGER_CONFIG",
              help="Site config TOML (default /etc/ipledger/config.toml).")
@click.version_option(__version__, prog_name="ipledger")
@click.pass_context
def cli(ctx: click.Context, db: str | None, config_path: str | None) -> None:
    """ipledger: an append-only ledger of GPU allocations, and receipts of paid vs delivered GPU-hours.

    \b
    Quick start:
      ipledger --db ./ledger.db init
      IPLEDGER_SPOOL=./spool ipledger --db ./ledger.db ship
      ipledger --db ./ledger.db verify
      ipledger --db ./ledger.db receipt 1234 --format json
    """
    ctx.obj = AppContext(db_option=db, config_path=config_path)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(cli)


def main() -> None:
    cli(prog_name="ipledger")


if __name__ == "__main__":
    main()
