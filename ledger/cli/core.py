"""Core commands: init, ship, verify, log (the ledger itself)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ..chain import db as db_mod
from ..chain import store
from ..base.processes import workers_for
from ..base.progressbar import Progress
from ..base.textsafe import echo, printable
from .context import SEQ, AppContext, UserError, emit_json, pass_app, reads_only

# verify's default --workers at most: its receipt replays shared with forked workers, one per idle core (measured
# on the demo ledger, docs/ledger.md); more than a few only wait on the segment check
DEFAULT_VERIFY_WORKERS = 4


@click.command("init")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--grant-reader", "reader", metavar="ROLE", default=None,
              help="PostgreSQL: also create ROLE (LOGIN) that can read the ledger and never write it (for ipledger "
                   "serve).")
@pass_app
def init_cmd(app: AppContext, as_json: bool, reader: str | None) -> None:
    """Create the ledger schema, or upgrade it (alembic upgrade head).

    \b
    Example:
      ipledger --db sqlite:///ledger.db init
      ipledger --db postgresql+psycopg://ipledger@dbhost/ipledger init
      ipledger --db postgresql+psycopg://ipledger@dbhost/ipledger init --grant-reader ipledger_web
    """
    from ..telemetry import derived

    engine = app.engine(require=False)
    try:
        rev = db_mod.upgrade(engine)
        with db_mod.write_tx(engine) as conn:   # device-hours of segments sealed before migration 0006
            derived.backfill(conn)
    except Exception as exc:  # noqa: BLE001 - any driver error becomes one line
        raise UserError(f"cannot initialise {app.db_url}: {str(exc).splitlines()[0]}") from None
    if reader is not None:
        try:
            db_mod.grant_reader(engine, reader)
        except db_mod.LedgerError as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - any driver error becomes one line
            raise UserError(f"--grant-reader {reader}: {str(exc).splitlines()[0]}") from None
    if as_json:
        emit_json({"db": engine.url.render_as_string(hide_password=True), "revision": rev,
                   **({"reader": reader} if reader else {})})
    else:
        echo(f"ledger ready at {engine.url.render_as_string(hide_password=True)} (schema {rev})"
             + (f"; role {reader} reads it (SELECT only)" if reader else ""))


@click.command("ship")
@click.option("--spool", "spool_dir", metavar="DIR", help="Spool directory (default: $IPLEDGER_SPOOL or config).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--no-receipts", is_flag=True,
              help="Only move entries; do not issue receipts for runs that ended (also IPLEDGER_AUTO_RECEIPTS=0).")
@pass_app
def ship_cmd(app: AppContext, spool_dir: str | None, as_json: bool, quiet: bool, no_receipts: bool) -> None:
    """Move spooled entries into the ledger (idempotent; safe to run twice or concurrently).

    Files are moved to SPOOL/shipped/ only after their entries are committed. Where the site config names
    `sacct`, runs that ended get their accounting record (QOS, TRES, suspensions, final state) in one sacct call
    per batch of runs; if the accounting database is down they stay pending and are asked again next time.
    Runs whose end was shipped get their receipt issued right after (automatic receipts), unless --no-receipts.
    A line that fails its checks (or an operator-only kind) is refused, noted in SPOOL/quarantine/ and
    recorded as evidence_refused; the rest ships (docs/security.md).

    \b
    Example:
      IPLEDGER_SPOOL=/var/spool/ipledger ipledger ship --json
    """
    from .. import api
    from ..capture.spool import UnsafeSpool

    site = app.site
    directory = spool_dir or site.spool
    engine = app.engine()
    if not Path(directory).is_dir():  # nothing to ship from: said, not "shipped 0" (and no directory is made)
        raise UserError(f"{printable(str(directory))}: no spool directory here (--spool, $IPLEDGER_SPOOL or the config's spool)")
    try:
        with Progress("shipping spool files", quiet=quiet or as_json) as bar:
            report = api.ship(site, engine, spool_dir=directory, receipts=not no_receipts, progress=bar)
    except UnsafeSpool as exc:
        raise UserError(str(exc)) from None
    if as_json:
        emit_json(report.to_json())
    else:
        echo(f"shipped {report.records} records from {report.files} files: {report.appended} new, "
                   f"{report.duplicates} already in the ledger")
        for t in report.torn:
            echo(f"warning: {t}: torn last line set aside in {directory}/torn/", err=True)
        for r in report.refused:
            echo(f"warning: refused {printable(r)} (noted in {directory}/quarantine/)", err=True)
        for q in report.quarantined:
            echo(f"warning: quarantined unread: {printable(q)}", err=True)
        more = report.refused_total - len(report.refused) + report.quarantined_total - len(report.quarantined)
        if more:
            echo(f"warning: {more} more refusals, noted in {directory}/quarantine/", err=True)
    acc = report.accounting
    if acc and acc["error"]:  # shipping itself succeeded; these runs are asked again at the next shipment
        echo(f"ipledger: accounting pending for {acc['still_pending_count']} runs (retried at the next "
                   f"ship): {acc['error']}", err=True)
    for err in report.errors + report.after_errors:
        echo(f"ipledger: {err}", err=True)
    if report.errors or report.after_errors:
        sys.exit(1)


@click.command("verify")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--chain-only", is_flag=True, help="Check the hash chain only, not evidence or issued receipts.")
@click.option("--anchor", "anchors", multiple=True, metavar="SEQ:HASH",
              help="An entry's hash kept outside the ledger (a receipt's through_seq:head_hash, an earlier "
                   "verify's head); the ledger must still hold it. Repeatable.")
@click.option("--deep", is_flag=True,
              help="Also check the database's indexes against its tables (SQLite integrity_check, PostgreSQL "
                   "amcheck): finds an index edited to hide rows from receipts; and re-derive every telemetry "
                   "segment's canonical samples_sha256, also where its entry seals the cheaper values_sha256. "
                   "Slower.")
@click.option("--pubkey", "pubkeys", multiple=True, metavar="KEY.pub", type=click.Path(dir_okay=False),
              help="The site's public key: every signed tree head must be signed by it (repeatable, for rotated "
                   "keys; default: the config's trusted_keys). Without a pinned key heads are checked unpinned.")
@click.option("--record", "record", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Also write the outcome (ok, time, head verified) to FILE, a small JSON file outside the ledger "
                   "that `ipledger serve` exports on /metrics ([serve] verify_status; docs/web.md).")
@click.option("--workers", type=click.IntRange(1, 64), default=None, metavar="N",
              help="Processes that replay the issued receipts, this one included (the workers start before the "
                   "segment check; the report is the same). Default: one per idle core (the cores "
                   "other processes leave free), up to "
                   f"{DEFAULT_VERIFY_WORKERS}; 1 replays them all in this process.")
@pass_app
@reads_only("deep")   # --deep may create PostgreSQL's amcheck extension
def verify_cmd(app: AppContext, as_json: bool, chain_only: bool, anchors: tuple[str, ...], deep: bool,
               pubkeys: tuple[str, ...], record: str | None, workers: int | None) -> None:
    """Walk the hash chain (and replay issued receipts); exit 1 naming the first entry that does not match.

    \b
    Example:
      ipledger verify --pubkey /etc/ipledger/log.key.pub
      ipledger verify --json --anchor 1200:3f5e...c1
      ipledger verify --deep
      ipledger verify --workers 1          # every receipt replayed in this one process
      ipledger verify --record /var/lib/ipledger/verify-status.json   # from cron; /metrics shows it
    """
    from ..chain.heads import HeadError, read_pinned_keys
    from ..receipts.auto import verify_site
    from ..chain.verify import Anchor

    try:
        parsed = [Anchor.parse(a) for a in anchors]
        pinned = read_pinned_keys(pubkeys or app.site.trusted_keys)
    except (ValueError, HeadError) as exc:
        raise UserError(str(exc)) from None
    engine = app.reader()
    if workers is None:
        workers = workers_for(DEFAULT_VERIFY_WORKERS)
    with Progress("verify", quiet=as_json) as bar:
        report = verify_site(engine, app.site, pinned=pinned, workers=workers, deep=deep, chain_only=chain_only,
                             anchors=parsed, progress=bar)
    if record is not None:
        from ..base.safeout import OutputError, write_output
        from ..chain.verify_status import render, status_of

        try:
            write_output(record, render(status_of(report, time.time())))
        except OutputError as exc:
            raise UserError(str(exc)) from None
    if as_json:
        emit_json(report.to_json())
    elif report.ok:
        echo(f"ok: {report.entries} entries, head seq {report.head_seq} hash {report.head_hash}")
    for n in report.notes:
        echo(f"warning: {printable(n)}", err=True)
    for p in report.problems:
        echo(f"ipledger: verify failed: {printable(str(p))}", err=True)
    if not report.ok:
        sys.exit(1)


@click.command("log")
@click.option("--job", "job_id", help="Only this job's entries.")
@click.option("--kind", "kinds", multiple=True, help="Only entries of this kind (repeatable).")
@click.option("--since-seq", type=SEQ, default=0, help="Only entries after this sequence number.")
@click.option("--limit", type=click.IntRange(0, 2**31 - 1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@pass_app
@reads_only()
def log_cmd(app: AppContext, job_id: str | None, kinds: tuple[str, ...], since_seq: int, limit: int,
            as_json: bool) -> None:
    """List ledger entries in sequence order.

    \b
    Example:
      ipledger log --job 4242 --kind unknown_interval
    """
    rows = []
    engine = app.reader()
    for ce in store.iter_entries(engine, job_id=job_id, kinds=list(kinds) or None, after_seq=since_seq):
        rows.append(ce)
        if len(rows) >= limit:
            break
    if job_id is not None and not rows and not _has_entries(engine, job_id):
        raise UserError(f"job {printable(job_id)}: no entries in the ledger")
    if as_json:
        emit_json([{"seq": c.seq, "hash": c.hash, **c.entry.to_record(), "payload": c.entry.data} for c in rows])
        return
    for c in rows:
        e = c.entry
        echo(f"{c.seq:>8} {e.ts} {e.kind:<22} job={e.job_id or '-'} run={e.run if e.run is not None else '-'}"
                   f" node={e.node or '-'} device={e.device or '-'} {e.payload[:80]}")


def _has_entries(engine, job_id: str) -> bool:  # noqa: ANN001
    entries = store.iter_entries(engine, job_id=job_id)
    try:
        return next(entries, None) is not None
    finally:
        entries.close()


def register(cli: click.Group) -> None:
    for cmd in (init_cmd, ship_cmd, verify_cmd, log_cmd):
        cli.add_command(cmd)
