"""The Starlette application of `ipledger serve`: routes, who may see each, and the pages' figures from the
same library calls the CLI's `account`, `explain`, `receipt`, `findings` and `export monthly` make."""

from __future__ import annotations

import re
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..chain.canonical import format_ts, ts_to_epoch
from .access import Access, User
from .figures import THROTTLE_FILL, FiguresError, NotAnswerable, device_chart, device_id
from .views import LedgerView, Snapshot, receipt_account, visible_findings

TEMPLATES = Path(__file__).with_name("templates")


class HTTPError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))
    return env


def figures(view: LedgerView, snap: Snapshot, question: tuple):  # noqa: ANN201
    """The answer to a figures question (ledger.web.figures: the same calls as `ipledger account`/`explain`)."""
    try:
        return view.figures(snap, question)
    except NotAnswerable as exc:
        raise HTTPError(exc.code, str(exc.message).strip("'\"")) from None
    except FiguresError as exc:   # the child could not read the ledger: say so, the next request tries again
        raise HTTPError(503, str(exc)) from None


def answer_alone(view: LedgerView, snap: Snapshot, question: tuple) -> dict:
    """The answer to a receipt or statement question (ledger.web.figures: the CLI's own calls, in a child that
    reads no agents' dataset); its refusal (an unknown receipt, a month with nothing issued) as the HTTP error."""
    try:
        got = view.alone(snap, question)
    except FiguresError as exc:
        raise HTTPError(503, str(exc)) from None
    if "error" in got:
        raise HTTPError(*got["error"])
    return got


def _legend() -> str:
    """What the device charts' shading means."""
    items = "".join(f'<span class="key"><svg width="12" height="10"><rect width="12" height="10" fill="{c}"/></svg> '
                    f'throttled: {r}</span> ' for r, c in THROTTLE_FILL.items())
    return (f'<p class="legend"><small>{items}<span class="key">grey: unknown telemetry (the line breaks where the '
            'hour has none)</span> <span class="key">dashed red: a finding\'s evidence window</span></small></p>')


def create_app(view: LedgerView, access: Access, metrics_only: bool = False,
               verify_status: str | None = None) -> Starlette:
    """The application over ``view``'s ledger; ``metrics_only``: /metrics alone (no user header needed);
    ``verify_status``: the file `ipledger verify --record` writes, exported on /metrics."""
    from .metrics import metrics_response

    env = _env()

    def user_of(request: Request) -> User:
        peer = request.client.host if request.client else None
        u = access.user(request.headers, peer)
        if u is None:
            raise HTTPError(401, "no trusted user: the site's proxy must authenticate and send "
                                 f"{access.user_header} (docs/web.md)")
        return u

    def page(template: str, request: Request, user: User, snap: Snapshot, **kw) -> HTMLResponse:  # noqa: ANN003
        return HTMLResponse(env.get_template(template).render(user=user, snap=snap, **kw))

    def guarded(fn):  # noqa: ANN001, ANN202
        async def endpoint(request: Request) -> Response:
            try:
                user = user_of(request)
                return await run_in_threadpool(fn, request, user)   # pandas work off the event loop
            except HTTPError as exc:
                return HTMLResponse(env.get_template("error.html").render(code=exc.code, message=exc.message),
                                    status_code=exc.code)
        return endpoint

    def operator_only(user: User) -> None:
        if not user.operator:
            raise HTTPError(404, "not found")

    def start(request: Request, user: User) -> Response:
        snap = view.snapshot(with_agents=False)
        return page("start.html", request, user, snap, title="ipledger")

    def fleet(request: Request, user: User) -> Response:
        operator_only(user)
        snap = view.snapshot()
        period = request.query_params.get("period", "all")
        got = figures(view, snap, ("fleet", period))
        res, nodes, heat = got["res"], got["nodes"], got["heat"]
        openf = [f for f in snap.recorded if f["status"]["status"] == "open"]
        newest = format_ts(snap.last_ts) if snap.last_ts else "-"
        return page("fleet.html", request, user, snap, title=f"Fleet: {res['period']['label']}", res=res,
                    period=period, nodes=nodes, findings=openf, newest=newest, heat=heat)

    def _scope_page(request: Request, user: User, kind: str, name: str) -> Response:
        snap = view.snapshot()
        period = request.query_params.get("period", "all")
        got = figures(view, snap, ("scope", kind, name, period))
        res, devices, chart = got["res"], got["devices"], got["chart"]
        findings = [f for f in visible_findings(user, snap) if str(f["scope"].get(kind) or "") == name
                    or (kind == "node" and name in (f.get("nodes") or []))]
        return page("scope.html", request, user, snap, title=f"{kind.capitalize()} {name}", res=res, period=period,
                    currency=snap.bounds.currency, devices=devices, chart=chart, receipts=None, months=[],
                    findings=findings, name=name)

    def rack(request: Request, user: User) -> Response:
        operator_only(user)
        return _scope_page(request, user, "rack", request.path_params["name"])

    def node(request: Request, user: User) -> Response:
        operator_only(user)
        return _scope_page(request, user, "node", request.path_params["name"])

    def device(request: Request, user: User) -> Response:
        operator_only(user)
        snap = view.snapshot()
        uuid = request.path_params["uuid"]
        got = figures(view, snap, ("device", uuid))
        res, nodes = got["res"], set(got["nodes"])
        findings = [f for f in snap.recorded if device_id(str(f["scope"].get("device_uuid") or "")) == device_id(uuid)
                    or str(f["scope"].get("node") or "") in nodes]
        receipts = [b for b in snap.receipts.values()
                    if any(device_id(str(d.get("uuid"))) == device_id(uuid) for d in b.get("job", {}).get("devices", []))]
        windows = [(ts_to_epoch(f["start"]), ts_to_epoch(f["end"]), f"{f['id']} {f['kind']}") for f in findings
                   if f.get("start") and f.get("end")]
        html = "".join(f"<h3>{k}</h3>{device_chart(part, got['axis'], windows)}" for k, part in got["charts"].items())
        html += _legend()
        return page("scope.html", request, user, snap, title=f"Device {uuid}",
                    res=res, period=None, currency=None, devices=[], chart=html,
                    receipts=receipts, months=[], findings=findings, name=uuid)

    def tenant(request: Request, user: User) -> Response:
        name = request.path_params["name"]
        if not user.sees(name):
            raise HTTPError(404, "not found")
        snap = view.snapshot()
        period = request.query_params.get("period", "all")
        res = figures(view, snap, ("scope", "tenant", name, period))["res"]
        receipts = sorted((b for b in snap.receipts.values() if receipt_account(b) == name),
                          key=lambda b: (b["window"]["start"], str(b["job"]["job_id"])))
        findings = [f for f in visible_findings(user, snap) if f["scope"].get("tenant") == name
                    or any(receipt_account(b) == name for (c, j, r), b in snap.receipts.items()
                           if j == str(f["scope"].get("job_id")))]
        return page("scope.html", request, user, snap, title=f"Tenant {name}", res=res, period=period,
                    currency=snap.bounds.currency, devices=[], chart="", receipts=receipts, months=snap.months,
                    findings=findings, name=name)

    def _receipt_key(request: Request, user: User) -> tuple[str, int | None, str]:
        job = request.path_params["job"]
        run = request.path_params.get("run")
        m = re.fullmatch(r"(.+?)(\.json|\.pdf|\.bundle\.json)?", run if run is not None else job)
        base, suffix = m.group(1), m.group(2) or ""
        if run is None:
            job, run_n = base, None
        else:
            if not base.isdigit():
                raise HTTPError(404, "not found")
            run_n = int(base)
        snap = view.snapshot(with_agents=False)
        runs = [(k, b) for k, b in snap.receipts.items() if k[1] == job and (run_n is None or k[2] == run_n)]
        if not runs or not all(user.sees(receipt_account(b)) for _, b in runs):
            raise HTTPError(404, "not found")   # another tenant's receipt is not there at all
        return job, run_n, suffix

    def receipt(request: Request, user: User) -> Response:
        job, run, suffix = _receipt_key(request, user)
        snap = view.snapshot(with_agents=False)
        # at the head, the terms an issue would use: what `ipledger receipt JOB` prints (a figures child makes it)
        got = answer_alone(view, snap, ("receipt", job, run, suffix))
        if suffix in (".json", ".bundle.json"):
            return Response(got["content"], media_type="application/json")
        if suffix == ".pdf":
            return Response(got["content"], media_type="application/pdf",
                            headers={"Content-Disposition": f'attachment; filename="receipt-{job}.pdf"'})
        base = f"/receipts/{job}" + (f"/{run}" if run is not None else "")
        return page("receipt.html", request, user, snap, title=f"Receipt of job {job}", text=got["content"], base=base)

    def finding(request: Request, user: User) -> Response:
        snap = view.snapshot(with_agents=False)
        fid = request.path_params["fid"]
        f = next((f for f in visible_findings(user, snap) if f["id"] == fid), None)
        if f is None:
            raise HTTPError(404, "not found")
        return page("finding.html", request, user, snap, title=f"Finding {fid}", f=f)

    def statement(request: Request, user: User) -> Response:
        month = request.path_params["month"]
        as_json = month.endswith(".json")
        month = month.removesuffix(".json")
        if not re.fullmatch(r"\d{4}-\d{2}", month):
            raise HTTPError(404, "not found")
        tenant_q = request.query_params.get("tenant")
        if not user.operator:
            if tenant_q is None and len(user.accounts) == 1:
                tenant_q = next(iter(user.accounts))
            if tenant_q is None or not user.sees(tenant_q):
                raise HTTPError(404, "not found")
        snap = view.snapshot(with_agents=False)
        st = answer_alone(view, snap, ("statement", month, tenant_q))   # `ipledger export monthly`'s statement
        if as_json:
            return JSONResponse(st["json"])
        return page("statement.html", request, user, snap, title=f"Statement {month}" + (f" — {tenant_q}" if tenant_q else ""),
                    st=st, t=st["totals"], month=month, tenant=tenant_q, billed=st["billed"], currency=st["currency"])

    async def metrics(request: Request) -> Response:
        return await run_in_threadpool(metrics_response, view, request.headers.get("accept", ""), verify_status)

    routes = [Route("/metrics", metrics)]
    if not metrics_only:
        routes += [Route("/", guarded(start)), Route("/fleet", guarded(fleet)), Route("/racks/{name}", guarded(rack)),
                   Route("/nodes/{name}", guarded(node)), Route("/devices/{uuid}", guarded(device)),
                   Route("/tenants/{name}", guarded(tenant)), Route("/receipts/{job}", guarded(receipt)),
                   Route("/receipts/{job}/{run}", guarded(receipt)), Route("/findings/{fid}", guarded(finding)),
                   Route("/statements/{month}", guarded(statement))]
    return Starlette(routes=routes)
