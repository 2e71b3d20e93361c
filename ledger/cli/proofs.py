"""`ipledger keygen`, `checkpoint` and `consistency`: the site's signing key, signed tree heads, and proofs
that a later head extends an earlier one (docs/proofs.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..chain.heads import HeadError, checkpoint, consistency, keygen, load_private_key, read_head
from ..chain.merkle import TreeError
from ..proofcheck import Failure
from ..base.textsafe import echo
from .context import AppContext, UserError, pass_app


def _write_json(doc: dict, out: str | None) -> None:
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if out:
        Path(out).write_text(text, encoding="utf-8")
        echo(f"wrote {out}")
    else:
        echo(text, nl=False)


@click.command("keygen")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Private key file to create (mode 0600); the public key goes to OUT.pub.")
def keygen_cmd(out: str) -> None:
    """Create the site's Ed25519 signing key for tree heads.

    \b
    Example:
      ipledger keygen --out /etc/ipledger/log.key     # then publish /etc/ipledger/log.key.pub
    """
    try:
        priv, pub, log_id = keygen(out)
    except HeadError as exc:
        raise UserError(str(exc)) from None
    echo(f"wrote {priv} (private, 0600) and {pub} (public); log id {log_id}")


@click.command("checkpoint")
@click.option("--key", "key_path", required=True, type=click.Path(dir_okay=False), help="The site's private key.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the signed head here (default: print it).")
@pass_app
def checkpoint_cmd(app: AppContext, key_path: str, out: str | None) -> None:
    """Sign the ledger's Merkle tree head and record it in the ledger (a tree_head entry).

    \b
    Example:
      ipledger checkpoint --key /etc/ipledger/log.key --out heads/$(date +%F).json
    """
    try:
        key = load_private_key(key_path)
    except HeadError as exc:
        raise UserError(str(exc)) from None
    _write_json(checkpoint(app.engine(), key), out)


@click.command("consistency")
@click.argument("old_head", type=click.Path(dir_okay=False, exists=True))
@click.argument("new_head", type=click.Path(dir_okay=False, exists=True))
@click.option("--pubkey", "pubkey", type=click.Path(dir_okay=False), default=None,
              help="The site's public key (default: the config's trusted_keys, else the one recorded with the "
                   "heads' checkpoints).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None, help="Write the proof here.")
@pass_app
def consistency_cmd(app: AppContext, old_head: str, new_head: str, pubkey: str | None, out: str | None) -> None:
    """Prove that NEW_HEAD's tree extends OLD_HEAD's: nothing before the old head was removed or rewritten.

    \b
    Example:
      ipledger consistency heads/2026-11-01.json heads/2026-12-01.json --out c.json
      ipledger-verify --consistency c.json --pubkey log.key.pub
    """
    from ..chain.heads import read_pinned_keys, read_public_key
    from ..proofcheck import log_id_of
    from ..receipts.bundle import recorded_public_key

    engine = app.engine()
    try:
        old, new = read_head(old_head), read_head(new_head)
        if pubkey:
            key = read_public_key(pubkey)
        elif app.site.trusted_keys:  # a pinned key, never one the ledger itself recorded
            pinned = {log_id_of(k): k for k in read_pinned_keys(app.site.trusted_keys)}
            key = pinned.get(str(new.get("log_id")))
            if key is None:
                raise HeadError(f"{new_head}: a head of log {str(new.get('log_id'))[:64]}, not of a trusted key")
        else:
            with engine.connect() as conn:
                key = recorded_public_key(conn, str(new.get("log_id")))
        doc = consistency(engine, old, new, key)
    except (HeadError, Failure, TreeError) as exc:
        raise UserError(str(exc)) from None
    _write_json(doc, out)


def register(cli: click.Group) -> None:
    for cmd in (keygen_cmd, checkpoint_cmd, consistency_cmd):
        cli.add_command(cmd)
