"""`ipledger contract set|show`: record a contract version from a TOML file, show what receipts will use."""

from __future__ import annotations

import click

from ..chain import store
from ..chain.contracts import (
    DEFAULT_CONTRACT, ContractError, bound_sku_names, check_contract, read_contract, record_contract,
    select_contract
)
from ..chain.entries import Kind
from ..base.textsafe import echo, printable
from .context import AS_OF, SEQ, AppContext, UserError, emit_json, pass_app, reads_only


@click.group("contract")
def contract_group() -> None:
    """Contracts: the versioned terms receipts are priced under.

    \b
    Example:
      ipledger contract set acme-2026.toml
      ipledger contract show --account physics --json
    """


@contract_group.command("set")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--allow-zero", "allow_zero", is_flag=True, help="Accept a rate of 0 (a SKU given away free).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def set_cmd(app: AppContext, file: str, allow_zero: bool, as_json: bool) -> None:
    """Record the contract in FILE (TOML) as a new contract_version entry.

    Refused, naming the field: a [skus.KEY] the SKU table does not know (with the nearest name), a SKU bound
    in the ledger that the contract gives no price, a rate of 0 without --allow-zero. The terms take effect
    at effective_from (default: now) and apply to runs that start from then (until effective_to).

    \b
    Example:
      ipledger contract set acme-2026.toml
    """
    from ..method.skus import match_sku

    table = app.site.sku_table
    try:
        contract = read_contract(file)
        engine = app.engine()
        in_use = {n: (r.key if (r := match_sku(n, table)) else None)
                  for n in bound_sku_names(engine, contract.accounts)}
        check_contract(contract, file, table.keys(), {str(n): k for n, k in in_use.items()}, allow_zero)
        entry, seq, recorded = record_contract(engine, contract)
    except ContractError as exc:
        raise UserError(printable(str(exc))) from None
    out = {"id": contract.id, "version": contract.version, "entry_id": entry.entry_id, "seq": seq,
           "recorded": recorded, "effective_from": entry.ts, "effective_to": contract.effective_to}
    if as_json:
        emit_json(out)
    else:
        echo(f"contract {contract.id} v{contract.version} " +
                   ("recorded" if recorded else "already recorded") + f" at seq {seq} ({entry.entry_id}); "
                   f"in effect from {entry.ts}" + (f" to {contract.effective_to}" if contract.effective_to else ""))


@contract_group.command("show")
@click.option("--account", default=None, help="The contract that applies to this Slurm account.")
@click.option("--id", "contract_id", default=None, help="The latest version of this contract id.")
@click.option("--as-of", "as_of", type=AS_OF, default=None, metavar="SEQ|TIME",
              help="As the ledger stood at SEQ, or at an RFC 3339 time.")
@click.option("--json", "as_json", is_flag=True, help="Print the contract as JSON.")
@pass_app
@reads_only()
def show_cmd(app: AppContext, account: str | None, contract_id: str | None, as_of: int | None,
             as_json: bool) -> None:
    """Show the contract a receipt would use (the built-in default when none is recorded).

    \b
    Example:
      ipledger contract show --account physics
    """
    entries = list(store.iter_entries(app.engine(), kinds=[Kind.CONTRACT_VERSION], through_seq=as_of))
    contract, ce = select_contract(entries, account, contract_id)
    payload = contract.to_payload()
    payload["entry_id"] = contract.entry_id
    payload["seq"] = ce.seq if ce else None
    payload["default"] = contract is DEFAULT_CONTRACT
    payload["effective_from"] = contract.effective_from
    if as_json:
        emit_json(payload)
        return
    echo(f"contract {contract.id} v{contract.version}" + (" (built-in default)" if ce is None else
                                                               f" (seq {ce.seq}, {ce.entry.entry_id})"))
    echo(f"currency {contract.currency}; unknown policy {contract.unknown_policy}; "
               f"suspended {'charged' if contract.charge_suspended else 'not charged'}; "
               f"granularity {contract.billing_granularity_s} s; minimum {contract.billing_minimum_s} s")
    if ce is not None:
        echo(f"in effect from {contract.effective_from}" +
                   (f" to {contract.effective_to}" if contract.effective_to else ""))
    if contract.accounts:
        echo("accounts " + ", ".join(contract.accounts))
    for sku, basis in sorted(contract.skus.items()):
        echo(f"  {sku}: " + ", ".join(f"{k}={v}" for k, v in basis.to_json().items()))


def register(cli: click.Group) -> None:
    cli.add_command(contract_group)
