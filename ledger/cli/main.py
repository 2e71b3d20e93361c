"""Entry point of the `ipledger` command: the group, its global options, and the command modules it loads."""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__
from .context import AppContext, UserError

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
    "ledger.cli.mark",
    "ledger.cli.proofs",
    "ledger.cli.serve",
]

# Which module provides each top-level command, so that `ipledger verify` does not pay for importing pandas,
# reportlab and the agents before it starts (tests/test_cli_core.py checks this table against the modules).
COMMAND_HOMES = {
    "init": "ledger.cli.core", "ship": "ledger.cli.core", "verify": "ledger.cli.core", "log": "ledger.cli.core",
    "hook": "ledger.cli.hooks", "hooks": "ledger.cli.hooks", "reconcile": "ledger.cli.hooks",
    "receipt": "ledger.cli.receipt", "issue": "ledger.cli.receipt", "contract": "ledger.cli.contract",
    "adjust": "ledger.cli.adjust", "resolve": "ledger.cli.adjust",
    "demo": "ledger.cli.demo",
    "findings": "ledger.cli.agents", "finding": "ledger.cli.agents", "explain": "ledger.cli.agents",
    "ask": "ledger.cli.agents", "account": "ledger.cli.agents", "daily": "ledger.cli.agents",
    "analyze": "ledger.cli.agents",
    "report": "ledger.cli.agents",
    "import": "ledger.cli.importers", "pathb-command": "ledger.cli.importers",
    "collect": "ledger.cli.collect",
    "export": "ledger.cli.export",
    "mark": "ledger.cli.mark",
    "keygen": "ledger.cli.proofs", "checkpoint": "ledger.cli.proofs", "consistency": "ledger.cli.proofs",
    "serve": "ledger.cli.serve",
}


def commands_of(module_name: str) -> dict[str, click.Command]:
    """The commands a module registers (imports it)."""
    scratch = click.Group()
    importlib.import_module(module_name).register(scratch)
    return dict(scratch.commands)


class LazyGroup(click.Group):
    """A group that imports a command's module only when that command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_HOMES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            home = COMMAND_HOMES.get(cmd_name)
            if home is None:
                return None
            for name, cmd in commands_of(home).items():
                self.commands.setdefault(name, cmd)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context):  # noqa: ANN201
        """A stored Merkle row outside the tree stops every append (ledger.merkle.PlantedNode): whichever
        command appended, it is one line and exit 1, not a traceback."""
        try:
            return super().invoke(ctx)
        except RuntimeError as exc:
            merkle = sys.modules.get("ledger.merkle")
            if merkle is not None and isinstance(exc, merkle.PlantedNode):
                raise UserError(str(exc)) from None
            raise


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


def main() -> None:
    cli(prog_name="ipledger")


if __name__ == "__main__":
    main()
