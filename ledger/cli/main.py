"""Entry point of the `ipledger` command: the group, its global options, and the command modules it loads."""

from __future__ import annotations

import importlib
import os
import sys

# One BLAS thread unless the user says otherwise, set before anything imports numpy (its OpenBLAS reads it once,
# at load): ipledger's array work is element-wise passes and sums, never large matrix products, and where it runs
# in parallel it forks worker processes, so BLAS's own pool of one thread per core only starts threads that
# spin beside them. Starting that pool cost every command that imports numpy ≈ 45 ms of CPU and, on a busy
# 2-core machine, as much wall time (a one-GPU `receipt`: 0.27 → 0.22 s; bench/latency.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402 - after the BLAS setting, as is everything below

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

# Each top-level command's one-line help, as click derives it from the command's own help: `ipledger --help`
# lists the commands from this table without importing a command module (tests/test_cli_core.py holds the
# table to the commands and the listing to the one click would print with every module imported).
COMMAND_HELP = {
    'account': "The account of a period (`daily` is the same command): paid, delivered and lost GPU-hours per tenant and per day, totals, the loss by cause, and on a billed month the receipts' figures with the lines between them.",
    'adjust': 'Credit or debit a job run by GPU-hours or an amount (an adjustment entry; usage is never edited).',
    'analyze': 'an export analysed in one shot: run every agent over a telemetry export or a capture set (several files, a directory or a .tar/.tar.gz/.zip of per-node dmon / amd-smi / nvidia-smi / Prometheus files, mixed is fine: all nodes in one analysis; an archive member that fails is quarantined and named, the rest analysed).',
    'ask': 'Answer a question about where GPU-hours went (a small grammar, docs/agents.md); refuses anything else.',
    'checkpoint': "Sign the ledger's Merkle tree head and record it in the ledger (a tree_head entry).",
    'collect': 'Sample GPU telemetry into the spool at a cadence; record gaps when the source fails.',
    'consistency': "Prove that NEW_HEAD's tree extends OLD_HEAD's: nothing before the old head was removed or rewritten.",
    'contract': 'Contracts: the versioned terms receipts are priced under.',
    'daily': "The account of a period (`daily` is the same command): paid, delivered and lost GPU-hours per tenant and per day, totals, the loss by cause, and on a billed month the receipts' figures with the lines between them.",
    'demo': 'Run the demo hall: simulate a week of a GPU hall with known faults, fill a ledger, issue receipts, run the agents, and write findings beside the ground truth (docs/demo.md).',
    'explain': 'Where the GPU-hours of a node, rack, tenant or job went in a period, by cause, with evidence.',
    'export': 'Exports for finance: the monthly tenant statement.',
    'finding': "Confirm or dismiss a recorded finding (an operator's verdict, recorded as a ledger entry).",
    'findings': "List the agents' findings over the ledger, with operators' verdicts.",
    'hook': "Run a Slurm hook (node prolog/epilog, or the controller's) for the job in the environment (exits 0).",
    'hooks': 'Install the Slurm prolog/epilog hooks; sweep the drop places epilogs could not empty.',
    'import': 'Import telemetry exports into the ledger (samples, gaps, synthetic runs).',
    'init': 'Create the ledger schema, or upgrade it (alembic upgrade head).',
    'issue': 'Issue (or re-issue where changed) the receipt of every closed run, so statements can sum them.',
    'keygen': "Create the site's Ed25519 signing key for tree heads.",
    'log': 'List ledger entries in sequence order.',
    'mark': 'Record a progress mark (checkpoint, output or step) for the run in the environment.',
    'pathb-command': "Print the exact commands that produce a capture set `ipledger analyze DIR` reads: one file per node, the node's name in the file name, a wall-clock start line at each (re)start (appended: restart-safe).",
    'receipt': 'Print the receipt of one job run: where every paid GPU-hour went, priced under the contract.',
    'reconcile': 'Close runs whose epilog never ran: allocation_ended + unknown interval (cause epilog_missing).',
    'report': 'Written reports built from the ledger.',
    'resolve': 'Resolve an unknown interval as charge, credit or estimate.',
    'serve': "Serve the read-only web view of the ledger (fleet, racks, nodes, devices, tenants, receipts, findings, statements) and /metrics, behind the site's authenticating proxy ([serve] in the config).",
    'ship': 'Move spooled entries into the ledger (idempotent; safe to run twice or concurrently).',
    'verify': 'Walk the hash chain (and replay issued receipts); exit 1 naming the first entry that does not match.',
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help`` from :data:`COMMAND_HELP`, cut to the width as click cuts it."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, click.Command(n, help=COMMAND_HELP[n]).get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            home = COMMAND_HOMES.get(cmd_name)
            if home is None:
                return None
            for name, cmd in commands_of(home).items():
                self.commands.setdefault(name, cmd)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context):  # noqa: ANN201
        """A stored Merkle row outside the tree stops every append (ledger.chain.merkle.PlantedNode): whichever
        command appended, it is one line and exit 1, not a traceback."""
        try:
            return super().invoke(ctx)
        except RuntimeError as exc:
            merkle = sys.modules.get("ledger.chain.merkle")
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
