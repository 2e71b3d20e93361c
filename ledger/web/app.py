"""The Starlette application of `ipledger serve`: routes, who may see each, and the pages' figures from the
same library calls the CLI's `account`, `explain`, `receipt`, `findings` and `export monthly` make."""

from __future__ import annotations

import json
import re
from html import escape
import tempfile
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..canonical import format_ts
from .access import Access, User
from .views import LedgerView, Snapshot, receipt_account, visible_findings

TEMPLATES = Path(__file__).with_name("templates")


class HTTPError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(["html"]))
    return env


def _period(snap: Snapshot, text: str | None) -> tuple[float, float, str]:
    from ..agents.ask import BadPeriod, parse_period

    ds = snap.ds
    try:
        start, end, label = parse_period(text or "all", ds.start, ds.end)
    except BadPeriod as exc:
        raise HTTPError(400, str(exc)) from None
    if end <= ds.start or start >= ds.end:
        raise HTTPError(404, f"the ledger has no data in {label}")
    return start, end, label


def fleet_figures(view: LedgerView, snap: Snapshot, period: str | None) -> dict:
    """`ipledger account --period P --json`'s figures (the same call)."""
    from ..agents import query

    start, end, label = _period(snap, period)
    return snap.memo(("fleet", start, end), lambda: query.period(snap.ds, snap.found, start, end, label,
                                                                 query.billed_rows(view.engine, start, end)))


def scope_figures(view: LedgerView, snap: Snapshot, kind: str, name: str, period: str | None) -> dict:
    """`ipledger explain --KIND NAME --period P --json`'s figures (the same call)."""
    from ..agents import query
    from ..agents.accounting import ExplainError, scope_masks

    start, end, _ = _period(snap, period)
    try:
        scope_masks(snap.ds, kind, name)
        return snap.memo((kind, name, start, end), lambda: query.scope(
            snap.ds, snap.found, kind, name, start, end, query.billed_rows(view.engine, start, end)))
    except ExplainError as exc:
        raise HTTPError(404, str(exc).strip("'\"")) from None


def hourly_svg(samples, width: int = 600, height: int = 80) -> str:  # noqa: ANN001 - a samples frame
    """Delivered share per hour as an inline SVG polyline; hours with no telemetry are gaps (the line breaks)."""
    if samples is None or not len(samples):
        return ""
    s = samples[samples["ai"] >= 0]
    if not len(s):
        return ""
    hour = (s["t"] // 3600).astype("int64")
    g = s.groupby(hour)[["h", "h_del", "h_missing"]].sum()
    lo, hi = int(g.index.min()), int(g.index.max())
    span = max(hi - lo, 1)
    segs, cur = [], []
    for hr in range(lo, hi + 1):
        row = g.loc[hr] if hr in g.index else None
        known = row is not None and float(row["h"] - row["h_missing"]) > 0
        if not known:
            if cur:
                segs.append(cur)
            cur = []
            continue
        share = float(row["h_del"]) / float(row["h"]) if float(row["h"]) else 0.0
        cur.append(f"{(hr - lo) / span * (width - 10) + 5:.1f},{height - 5 - share * (height - 10):.1f}")
    if cur:
        segs.append(cur)
    lines = "".join(f'<polyline fill="none" stroke="#4a7" stroke-width="1.5" points="{" ".join(p)}"/>'
                    for p in segs)
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>{lines}</svg>')


def heatmap_svg(samples, start: float, end: float, cell: int = 4, row: int = 12) -> str:  # noqa: ANN001
    """Delivered share by node x hour as an inline SVG heat map (green: delivered, red: lost); an hour a node
    ran nothing is blank, an hour with no telemetry grey."""
    s = samples[(samples["ai"] >= 0) & (samples["t"] >= start) & (samples["t"] < end)]
    if not len(s):
        return ""
    hour = ((s["t"] - start) // 3600).astype("int64")
    g = s.assign(hour=hour).groupby(["node", "hour"])[["h", "h_del", "h_missing"]].sum()
    nodes = sorted({str(n) for n in g.index.get_level_values(0)})
    hours = int(hour.max()) + 1
    out = [f'<svg class="chart heatmap" xmlns="http://www.w3.org/2000/svg" width="{50 + hours * cell}" '
           f'height="{len(nodes) * row + 4}" role="img">']
    for i, n in enumerate(nodes):
        out.append(f'<text x="0" y="{i * row + 10}" font-size="10">{escape(n)}</text>')
    for (n, hr), r in g.iterrows():
        i = nodes.index(str(n))
        h, known = float(r["h"]), float(r["h"] - r["h_missing"])
        if h <= 0:
            continue
        share = float(r["h_del"]) / h
        fill = "#bbb" if known <= 0 else f"rgb({int(200 * (1 - share)) + 30},{int(170 * share) + 40},70)"
        out.append(f'<rect x="{50 + int(hr) * cell}" y="{i * row + 1}" width="{cell}" height="{row - 2}" '
                   f'fill="{fill}"><title>{escape(str(n))} +{int(hr)} h: {share:.0%} delivered</title></rect>')
    out.append("</svg>")
    return "".join(out)


def _cents(x: float) -> float:
    from reports.monthly import cents

    return cents(x)


def create_app(view: LedgerView, access: Access, metrics_only: bool = False) -> Starlette:
    """The application over ``view``'s ledger; ``metrics_only``: /metrics alone (no user header needed)."""
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
        res = fleet_figures(view, snap, period)
        from ..agents import query

        start, end, _ = _period(snap, period)
        nodes = snap.memo(("nodes", start, end), lambda: sorted(
            query.ranking(snap.ds, "node", "paid", start, end, n=10_000), key=lambda r: r["node"]))
        heat = snap.memo(("heat", start, end), lambda: heatmap_svg(snap.ds.samples, start, end))
        openf = [f for f in snap.recorded if f["status"]["status"] == "open"]
        newest = format_ts(snap.last_ts) if snap.last_ts else "-"
        return page("fleet.html", request, user, snap, title=f"Fleet: {res['period']['label']}", res=res,
                    period=period, nodes=nodes, findings=openf, newest=newest, heat=heat)

    def _scope_page(request: Request, user: User, kind: str, name: str) -> Response:
        snap = view.snapshot()
        period = request.query_params.get("period", "all")
        res = scope_figures(view, snap, kind, name, period)
        ds = snap.ds
        devices, chart = [], ""
        if kind in ("node", "rack"):
            col = "node" if kind == "node" else "rack"

            def compute():  # noqa: ANN202 - once per scope at this head
                sel = ds.samples[ds.samples[col].astype(str) == name]
                return sorted({str(d) for d in sel["device"].unique()}), hourly_svg(sel)

            devices, chart = snap.memo((kind, name, "devices"), compute)
        findings = [f for f in visible_findings(user, snap) if str(f["scope"].get(kind) or "") == name
                    or (kind == "node" and name in (f.get("nodes") or []))]
        return page("scope.html", request, user, snap, title=f"{kind.capitalize()} {name}", res=res, period=period,
                    currency=ds.currency, devices=devices, chart=chart, receipts=None, months=[],
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
        ds = snap.ds

        def compute():  # noqa: ANN202 - once per device at this head
            sel = ds.samples[ds.samples["device"].astype(str).isin({uuid, uuid.removeprefix("GPU-")})]
            if not len(sel):
                return None
            charts = {"delivered share": hourly_svg(sel)}
            for col, lab in (("clk", "SM clock (MHz)"), ("power", "power (W)"), ("temp", "temperature (degC)")):
                charts[lab] = _line_svg(sel, col)
            nodes = set(sel["node"].astype(str))
            findings = [f for f in snap.recorded
                        if str(f["scope"].get("device_uuid") or "") in (uuid, uuid.removeprefix("GPU-"))
                        or str(f["scope"].get("node") or "") in nodes]
            receipts = [b for b in snap.receipts.values()
                        if any(d.get("uuid") in (uuid, "GPU-" + uuid) for d in b.get("job", {}).get("devices", []))]
            return charts, findings, receipts, _device_res(sel, ds.currency)

        got = snap.memo(("device", uuid), compute)
        if got is None:
            raise HTTPError(404, f"no device {uuid} in the ledger")
        charts, findings, receipts, res = got
        html = "".join(f"<h3>{k}</h3>{v}" for k, v in charts.items())
        return page("scope.html", request, user, snap, title=f"Device {uuid}",
                    res=res, period=None, currency=None, devices=[], chart=html,
                    receipts=receipts, months=[], findings=findings, name=uuid)

    def tenant(request: Request, user: User) -> Response:
        name = request.path_params["name"]
        if not user.sees(name):
            raise HTTPError(404, "not found")
        snap = view.snapshot()
        period = request.query_params.get("period", "all")
        res = scope_figures(view, snap, "tenant", name, period)
        receipts = sorted((b for b in snap.receipts.values() if receipt_account(b) == name),
                          key=lambda b: (b["window"]["start"], str(b["job"]["job_id"])))
        findings = [f for f in visible_findings(user, snap) if f["scope"].get("tenant") == name
                    or any(receipt_account(b) == name for (c, j, r), b in snap.receipts.items()
                           if j == str(f["scope"].get("job_id")))]
        return page("scope.html", request, user, snap, title=f"Tenant {name}", res=res, period=period,
                    currency=snap.ds.currency, devices=[], chart="", receipts=receipts, months=snap.months,
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
        from ..receipts import ReceiptError, issue_receipt, render_pdf, render_text

        job, run, suffix = _receipt_key(request, user)
        snap = view.snapshot(with_agents=False)
        if suffix == ".bundle.json":
            return _bundle(job, run)
        try:  # at the head, the terms an issue would use: what `ipledger receipt JOB` prints
            r = issue_receipt(view.engine, job, run, sku_table=view.site.sku_table, dry_run=True).receipt
        except ReceiptError as exc:
            raise HTTPError(404, str(exc)) from None
        if suffix == ".json":
            return Response(json.dumps(r.body, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                            media_type="application/json")
        if suffix == ".pdf":
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "receipt.pdf"
                render_pdf([r], p)
                return Response(p.read_bytes(), media_type="application/pdf",
                                headers={"Content-Disposition": f'attachment; filename="receipt-{job}.pdf"'})
        base = f"/receipts/{job}" + (f"/{run}" if run is not None else "")
        return page("receipt.html", request, user, snap, title=f"Receipt of job {job}", text=render_text(r), base=base)

    def _bundle(job: str, run: int | None) -> Response:
        from ..heads import latest_head
        from ..proofs import build_bundle

        with view.engine.connect() as conn:
            h = latest_head(conn)
        if h is None:
            raise HTTPError(404, "the ledger has no signed tree head yet (ipledger checkpoint makes one)")
        from ..heads import HeadError
        from ..merkle import TreeError
        from ..proofcheck import Failure
        from ..receipts import ReceiptError

        try:
            b = build_bundle(view.engine, job, run, h, sku_table=view.site.sku_table)
        except ReceiptError as exc:
            raise HTTPError(404, str(exc)) from None
        except (HeadError, Failure, TreeError) as exc:
            raise HTTPError(500, f"the proof bundle cannot be made: {exc}") from None
        from ..proofs import write_bundle

        with tempfile.TemporaryDirectory() as d:   # the bytes `ipledger receipt JOB --proof --out` writes
            p = Path(d) / "bundle.json"
            write_bundle(b, str(p))
            return Response(p.read_bytes(), media_type="application/json")

    def finding(request: Request, user: User) -> Response:
        snap = view.snapshot(with_agents=False)
        fid = request.path_params["fid"]
        f = next((f for f in visible_findings(user, snap) if f["id"] == fid), None)
        if f is None:
            raise HTTPError(404, "not found")
        return page("finding.html", request, user, snap, title=f"Finding {fid}", f=f)

    def statement(request: Request, user: User) -> Response:
        from reports.export import ExportError, build_statement, to_json

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
        try:
            st = snap.memo(("statement", month, tenant_q), lambda: build_statement(view.engine, month, tenant=tenant_q))
        except ExportError as exc:
            raise HTTPError(404, str(exc)) from None
        if as_json:
            return JSONResponse(json.loads(json.dumps(to_json(st), default=str)))
        t = st.totals
        return page("statement.html", request, user, snap, title=f"Statement {month}" + (f" — {tenant_q}" if tenant_q else ""),
                    st=st, t=t, month=month, tenant=tenant_q, billed=_cents(t["billed"]),
                    currency=",".join(t["currencies"]))

    async def metrics(request: Request) -> Response:
        return await run_in_threadpool(metrics_response, view, request.headers.get("accept", ""))

    routes = [Route("/metrics", metrics)]
    if not metrics_only:
        routes += [Route("/", guarded(start)), Route("/fleet", guarded(fleet)), Route("/racks/{name}", guarded(rack)),
                   Route("/nodes/{name}", guarded(node)), Route("/devices/{uuid}", guarded(device)),
                   Route("/tenants/{name}", guarded(tenant)), Route("/receipts/{job}", guarded(receipt)),
                   Route("/receipts/{job}/{run}", guarded(receipt)), Route("/findings/{fid}", guarded(finding)),
                   Route("/statements/{month}", guarded(statement))]
    return Starlette(routes=routes)


def _line_svg(sel, col: str, width: int = 600, height: int = 60) -> str:  # noqa: ANN001
    """One sample column per hour (mean) as an inline SVG polyline, broken where the hour has no samples."""
    hour = (sel["t"] // 3600).astype("int64")
    g = sel.groupby(hour)[col].mean()
    if not len(g):
        return ""
    lo, hi = int(g.index.min()), int(g.index.max())
    vmax = float(g.max()) or 1.0
    span = max(hi - lo, 1)
    segs, cur = [], []
    for hr in range(lo, hi + 1):
        if hr not in g.index:
            if cur:
                segs.append(cur)
            cur = []
            continue
        cur.append(f"{(hr - lo) / span * (width - 10) + 5:.1f},{height - 5 - float(g.loc[hr]) / vmax * (height - 10):.1f}")
    if cur:
        segs.append(cur)
    lines = "".join(f'<polyline fill="none" stroke="#57a" points="{" ".join(p)}"/>' for p in segs)
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>{lines}</svg>')


def _device_res(sel, currency: str) -> dict:  # noqa: ANN001
    """A device's sealed device-hours in the ledger (its samples' sums), in the scope page's shape."""
    s = sel[sel["ai"] >= 0]
    paid, deliv = float(s["h"].sum()), float(s["h_del"].sum())
    return {"answer": f"device: {paid:,.2f} GPU-hours in runs, {deliv:,.2f} delivered (priced on its runs' receipts)",
            "account": {"paid": paid, "delivered": deliv, "cost": {"paid": 0.0, "delivered": 0.0, "lost": 0.0}},
            "table": {"lines": []}, "basis": "device_hours"}
