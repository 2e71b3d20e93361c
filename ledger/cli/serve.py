"""`ipledger serve`: the read-only web view and /metrics (ledger.web; docs/web.md)."""

from __future__ import annotations

import click

from ..base.textsafe import echo, printable
from .context import AppContext, UserError, pass_app, reads_only


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8787, show_default=True, type=int, help="Port to listen on.")
@click.option("--metrics-only", is_flag=True, help="Serve /metrics alone (for Prometheus; no pages).")
@click.option("--local-operator", is_flag=True,
              help="Requests from this machine without the user header are the operator `local` (loopback --host "
                   "only; for the demo and a workstation).")
@pass_app
@reads_only()
def serve_cmd(app: AppContext, host: str, port: int, metrics_only: bool, local_operator: bool) -> None:
    """Serve the read-only web view of the ledger (fleet, racks, nodes, devices, tenants, receipts, findings,
    statements) and /metrics, behind the site's authenticating proxy ([serve] in the config).

    \b
    Example:
      ipledger --db sqlite:////tmp/demo/ledger.db --config site.toml serve --port 8787
      ipledger serve --metrics-only --host 0.0.0.0 --port 9787
      ipledger --db sqlite:///demo-out/ledger.db serve --local-operator   # the demo, on this machine
    """
    try:
        import uvicorn

        from ..web.access import AccessError, from_config, local_operator as local_op
        from ..web.app import create_app
        from ..web.metrics import verify_status_setting
        from ..web.views import LedgerView
        from ..chain.verify_status import VerifyStatusError
    except ImportError as exc:
        raise UserError(f"ipledger serve needs the web extra (pip install 'ipledger[web]'): {exc}") from None
    try:
        access = from_config(app.config.extra, app.config.path or "config")
        if local_operator:
            access = local_op(access, host)
        verify_status = verify_status_setting(app.config.extra, app.config.path or "config")
    except (AccessError, VerifyStatusError) as exc:
        raise UserError(str(exc)) from None
    view = LedgerView(app.engine(), app.site, log=lambda line: echo(line, err=True))
    echo(f"ipledger serve: http://{printable(host)}:{port}/" + (" (metrics only)" if metrics_only else ""), err=True)
    uvicorn.run(create_app(view, access, metrics_only=metrics_only, verify_status=verify_status), host=host, port=port, log_level="warning")


def register(cli: click.Group) -> None:
    cli.add_command(serve_cmd)
