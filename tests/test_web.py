"""`ipledger serve` (ledger.web): who sees what on every route, and the pages' figures equal the CLI's JSON on the
demo ledger (Starlette TestClient over the real app)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

# starlette, httpx and uvicorn are in the dev extra `make test` installs: a missing one fails collection, never skips
from starlette.testclient import TestClient

from ledger.base import config
from ledger.chain.db import make_engine
from ledger.ingest.site import site_from_config
from ledger.web.access import AccessError, from_config
from ledger.web.app import create_app
from ledger.web.metrics import FAMILIES
from ledger.web.views import LedgerView

SERVE = {"serve": {"user_header": "X-Remote-User", "trusted_proxies": ["127.0.0.1"],
                   "users": {"op": {"role": "operator"}, "ast": {"role": "tenant", "accounts": ["astro"]}}}}


@pytest.fixture(scope="module")
def web(demo):
    out, _ = demo
    url = f"sqlite:///{out / 'ledger.db'}"
    site = site_from_config(config.load(None, environ={}), db=url)
    view = LedgerView(make_engine(url, read_only=True), site)
    app = create_app(view, from_config(SERVE))
    return url, view, TestClient(app, client=("127.0.0.1", 40000)), TestClient(app, client=("10.9.9.9", 40000))


def _cli_json(cli, runner, url, *args):
    r = runner.invoke(cli, ["--db", url, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout if hasattr(r, "stdout") else r.output)


def _figures(html: str) -> dict[str, float]:
    return {k: float(v.replace(",", "")) for k, v in re.findall(r'data-figure="([^"]+)">([-0-9.,]+)<', html)}


def _routes(view) -> dict[str, str]:
    """One path per route, with the owner account of what it shows (None: operators only)."""
    snap = view.snapshot()
    other = next(b for b in snap.receipts.values() if b["job"]["account"] != "astro")
    mine = next(b for b in snap.receipts.values() if b["job"]["account"] == "astro")
    rack_f = next(f for f in snap.recorded if f["scope"].get("rack") and not f["scope"].get("tenant"))
    other_f = next(f for f in snap.recorded if f["scope"].get("tenant") not in (None, "astro"))
    dev = other["job"]["devices"][0]
    routes = {"/fleet": None, "/fleet?period=2026-11": None, f"/racks/{rack_f['scope']['rack']}": None,
              f"/nodes/{dev['node']}": None, f"/devices/{dev['uuid']}": None, "/tenants/astro": "astro",
              f"/tenants/{other['job']['account']}": other["job"]["account"],
              f"/findings/{rack_f['id']}": None, f"/findings/{other_f['id']}": other_f["scope"]["tenant"],
              "/statements/2026-11?tenant=astro": "astro",
              f"/statements/2026-11?tenant={other['job']['account']}": other["job"]["account"],
              "/statements/2026-11.json?tenant=astro": "astro"}
    for b in (mine, other):
        j = b["job"]
        for suffix in ("", ".json", ".pdf"):
            routes[f"/receipts/{j['job_id']}{suffix}"] = j["account"]
            routes[f"/receipts/{j['job_id']}/{j['run']}{suffix}"] = j["account"]
        routes[f"/receipts/{j['job_id']}.bundle.json"] = j["account"]
    return routes


def test_every_route_is_401_without_a_trusted_user(web):
    _, view, local, remote = web
    for path in ["/", *_routes(view)]:
        assert local.get(path).status_code == 401, path                        # no header
        assert local.get(path, headers={"X-Remote-User": "nobody"}).status_code == 401, path   # not configured
        assert remote.get(path, headers={"X-Remote-User": "op"}).status_code == 401, path      # untrusted peer


def test_a_tenant_sees_only_their_own(web):
    _, view, local, _ = web
    for path, owner in _routes(view).items():
        op = local.get(path, headers={"X-Remote-User": "op"})
        ten = local.get(path, headers={"X-Remote-User": "ast"})
        if path.endswith(".bundle.json"):
            assert op.status_code == 404 and "signed tree head" in op.text   # the demo signs no head
        else:
            assert op.status_code == 200, (path, op.text[:300])
        if owner == "astro":
            assert ten.status_code == op.status_code, path
        else:
            assert ten.status_code == 404, path
            assert "signed tree head" not in ten.text     # the same answer as a receipt that does not exist


def test_a_tenant_listing_names_no_other_tenants_runs(web):
    _, view, local, _ = web
    snap = view.snapshot()
    html = local.get("/tenants/astro", headers={"X-Remote-User": "ast"}).text
    listed = set(re.findall(r'href="/receipts/([^/"]+)/\d+"', html))
    mine = {b["job"]["job_id"] for b in snap.receipts.values() if b["job"]["account"] == "astro"}
    assert listed == mine and listed
    shown_f = set(re.findall(r'href="/findings/([^"]+)"', html))
    for fid in shown_f:
        assert local.get(f"/findings/{fid}", headers={"X-Remote-User": "ast"}).status_code == 200
    start = local.get("/", headers={"X-Remote-User": "ast"}).text
    assert "/fleet" not in start and "/tenants/astro" in start


def test_fleet_figures_equal_ipledger_account(web, cli, runner):
    url, _, local, _ = web
    for period in ("all", "2026-11", "2026-W45"):
        want = _cli_json(cli, runner, url, "account", "--period", period, "--json")
        got = _figures(local.get(f"/fleet?period={period}", headers={"X-Remote-User": "op"}).text)
        acct = want["account"]
        assert got["paid"] == round(acct["paid"], 4) and got["delivered"] == round(acct["delivered"], 4)
        assert got["cost.paid"] == acct["cost"]["paid"] and got["cost.delivered"] == acct["cost"]["delivered"]
        for k in ("paid", "delivered", "lost"):
            assert got[f"total.{k}"] == want["total"][k]


def test_tenant_figures_equal_explain_and_receipts(web, cli, runner):
    url, view, local, _ = web
    want = _cli_json(cli, runner, url, "explain", "--tenant", "astro", "--period", "2026-11", "--json")
    got = _figures(local.get("/tenants/astro?period=2026-11", headers={"X-Remote-User": "ast"}).text)
    assert got["paid"] == round(want["account"]["paid"], 4)
    assert got["cost.lost"] == want["account"]["cost"]["lost"]
    if want["basis"] == "receipts":
        assert got["billed.paid"] == want["billed"]["paid"]
    job = next(b for b in view.snapshot().receipts.values() if b["job"]["account"] == "astro")["job"]["job_id"]
    r = local.get(f"/receipts/{job}.json", headers={"X-Remote-User": "ast"})
    assert r.json() == _cli_json(cli, runner, url, "receipt", job, "--format", "json")


def test_metrics_are_openmetrics_with_bounded_labels(web):
    _, view, local, _ = web
    r = local.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200 and r.text.rstrip().endswith("# EOF")
    names = set(re.findall(r"^([a-z_]+)(?:\{|\s)", r.text, re.M))
    for fam in FAMILIES:
        assert any(n == fam or n.startswith(fam + "_") for n in names), fam
    labels = set(re.findall(r"([a-z_]+)=\"", r.text))
    assert labels <= {"tenant", "cluster", "cause", "kind"}
    paid = sum(float(v) for v in re.findall(r'^ipledger_paid_gpu_hours\{[^}]*\} (\S+)', r.text, re.M))
    assert paid == pytest.approx(sum(b["gpu_hours"]["paid"] for b in view.snapshot().receipts.values()))


def test_bad_serve_settings_are_one_line_errors():
    for bad, field in (({"serve": {"trusted_proxies": ["not-an-ip"]}}, "trusted_proxies"),
                       ({"serve": {"users": {"x": {"role": "admin"}}}}, "serve.users.x.role"),
                       ({"serve": {"users": {"x": {"role": "tenant"}}}}, "serve.users.x")):
        with pytest.raises(AccessError, match=re.escape(field)) as e:
            from_config(bad, "site.toml")
        assert str(e.value).startswith("site.toml: ") and "\n" not in str(e.value)


def test_dashboard_queries_name_served_metrics():
    from pathlib import Path

    dash = json.loads((Path(__file__).parents[1] / "dashboards" / "ipledger.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert exprs
    for e in exprs:
        ours = [n for n in re.findall(r"\b(ipledger_[a-z_]+)", e)]
        for n in ours:
            assert n in FAMILIES, (n, e)


def test_local_operator_is_loopback_only(web, cli, runner):
    from ledger.web.access import local_operator

    _, view, _, _ = web
    acc = local_operator(from_config({}), "127.0.0.1")
    app = create_app(view, acc)
    assert TestClient(app, client=("127.0.0.1", 1)).get("/fleet?period=2026-W45").status_code == 200
    assert TestClient(app, client=("192.0.2.7", 1)).get("/fleet").status_code == 401
    with pytest.raises(AccessError, match="--local-operator"):
        local_operator(from_config({}), "0.0.0.0")
    r = runner.invoke(cli, ["--db", web[0], "serve", "--local-operator", "--host", "0.0.0.0"])
    assert r.exit_code == 1 and "--local-operator" in r.output and len(r.output.strip().splitlines()) == 1


def test_demo_says_how_to_open_it_in_serve(runner, cli, tmp_path):
    r = runner.invoke(cli, ["demo", "--out", str(tmp_path / "d"), "--seed", "3", "--small"])
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert "serve --local-operator" in last and "http://127.0.0.1:8787/" in last
    assert f"sqlite:///{tmp_path / 'd' / 'ledger.db'}" in last


def test_proof_bundle_route_equals_the_cli_bundle(demo, runner, cli, tmp_path):
    """After `ipledger checkpoint`, /receipts/JOB.bundle.json is the bundle `ipledger receipt JOB --proof` makes
    under the same head (on a copy of the demo ledger: the checkpoint appends)."""
    import shutil

    out, _ = demo
    db = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", db)
    url = f"sqlite:///{db}"
    key, head = tmp_path / "site.key", tmp_path / "head.json"
    assert runner.invoke(cli, ["--db", url, "keygen", "--out", str(key)]).exit_code == 0
    r = runner.invoke(cli, ["--db", url, "checkpoint", "--key", str(key), "--out", str(head)])
    assert r.exit_code == 0, r.output
    view = LedgerView(make_engine(url, read_only=True), site_from_config(config.load(None, environ={}), db=url))
    client = TestClient(create_app(view, from_config(SERVE)), client=("127.0.0.1", 1))
    job = next(b for b in view.snapshot(False).receipts.values() if b["job"]["account"] == "astro")["job"]["job_id"]
    got = client.get(f"/receipts/{job}.bundle.json", headers={"X-Remote-User": "ast"})
    assert got.status_code == 200, got.text[:300]
    r = runner.invoke(cli, ["--db", url, "receipt", job, "--proof", "--head", str(head), "--out", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    assert got.content == (tmp_path / "b.json").read_bytes()


def test_statement_page_equals_export_monthly(web, cli, runner):
    """/statements/MONTH (and .json) shows what `ipledger export monthly --month MONTH [--tenant T] --format json`
    writes, for the operator's whole month and for a tenant's own account (--as-of the head: the CLI then records
    nothing, so both read the same ledger)."""
    url, view, local, _ = web
    seq = view.snapshot(False).seq
    for user, query, tenant in (("op", "", None), ("ast", "", "astro"), ("op", "?tenant=astro", "astro")):
        args = ["export", "monthly", "--month", "2026-11", "--format", "json", "--out", "-", "--as-of", str(seq)]
        want = _cli_json(cli, runner, url, *args, *(["--tenant", tenant] if tenant else []))
        got = local.get(f"/statements/2026-11.json{query}", headers={"X-Remote-User": user})
        assert got.status_code == 200, got.text[:300]
        assert got.json() == json.loads(json.dumps(want, default=str)), (user, query)
        html = local.get(f"/statements/2026-11{query}", headers={"X-Remote-User": user}).text
        shown = _figures(html)
        t = want["totals"]
        assert t["runs"] > 0 and want["tenant"] == tenant
        assert shown["runs"] == t["runs"]
        assert shown["paid"] == round(t["paid"], 6) and shown["delivered"] == round(t["delivered"], 6)
        assert shown["billed"] == t["billed"]


def test_metrics_export_the_recorded_verify(web, cli, runner, tmp_path):
    """`ipledger verify --record FILE` writes the outcome; /metrics exports it ([serve] verify_status). None
    recorded or an unreadable file: ok 0 and age +Inf. A bad file's field is named in one line."""
    from ledger.chain.verify_status import VerifyStatusError, parse

    url, view, _, _ = web

    def scrape(status) -> dict[str, float]:
        app = create_app(view, from_config(SERVE), metrics_only=True, verify_status=str(status))
        text = TestClient(app, client=("127.0.0.1", 1)).get("/metrics").text
        return {k: float(v) for k, v in re.findall(r"^(ipledger_verify_[a-z_]+) (\S+)$", text, re.M)}

    status = tmp_path / "verify.json"
    assert scrape(status) == {"ipledger_verify_ok": 0.0, "ipledger_verify_age_seconds": float("inf"),
                              "ipledger_verify_head_seq": -1.0}
    site_toml = Path(url.removeprefix("sqlite:///")).parent / "site.toml"   # the demo's carbon zone replays
    r = runner.invoke(cli, ["--db", url, "--config", str(site_toml), "verify", "--record", str(status)])
    assert r.exit_code == 0, r.output
    got = scrape(status)
    assert got["ipledger_verify_ok"] == 1.0 and got["ipledger_verify_head_seq"] == view.snapshot(False).seq
    assert 0 <= got["ipledger_verify_age_seconds"] < 600
    doc = json.loads(status.read_text())
    status.write_text(json.dumps({**doc, "ok": False}))           # a failed verify, as recorded
    assert scrape(status)["ipledger_verify_ok"] == 0.0
    status.write_text("{not json")
    assert scrape(status)["ipledger_verify_age_seconds"] == float("inf")
    with pytest.raises(VerifyStatusError, match=r"^st\.json: field head_seq: ") as e:
        parse(json.dumps({**doc, "head_seq": "12"}), "st.json")
    assert "\n" not in str(e.value)


def test_a_failed_verify_is_recorded_and_exported(demo, cli, runner, tmp_path):
    """On a copy of the demo ledger with one entry's node edited behind ipledger's back, `verify --record` exits 1
    and still records the failure; /metrics then says ok 0 for the head it checked."""
    import shutil
    import sqlite3

    out, _ = demo
    db = tmp_path / "ledger.db"
    shutil.copy(out / "ledger.db", db)
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER entries_no_update")
    con.execute("UPDATE entries SET node = 'forged' WHERE seq = 3")
    con.commit()
    con.close()
    url, status = f"sqlite:///{db}", tmp_path / "verify.json"
    r = runner.invoke(cli, ["--db", url, "--config", str(out / "site.toml"), "verify", "--record", str(status)])
    assert r.exit_code == 1 and "seq 3" in r.output
    view = LedgerView(make_engine(url, read_only=True), None)
    app = create_app(view, from_config(SERVE), metrics_only=True, verify_status=str(status))
    text = TestClient(app, client=("127.0.0.1", 1)).get("/metrics").text
    got = {k: float(v) for k, v in re.findall(r"^(ipledger_verify_[a-z_]+) (\S+)$", text, re.M)}
    recorded = json.loads(status.read_text())
    assert got["ipledger_verify_ok"] == 0.0 and recorded["problems"] >= 1 and recorded["ok"] is False
    # the seq the walk reached: a failed verify stops before the head, so the head shows as not verified
    assert got["ipledger_verify_head_seq"] == recorded["head_seq"] < view.snapshot(False).seq


SERVER_PAGES = ("/", "/fleet", "/fleet?period=2026-11", "/tenants/astro", "/tenants/astro?period=2026-11",
                "/statements/2026-11", "/statements/2026-11.json?tenant=astro", "/metrics")


def test_the_server_process_never_imports_the_analysis_stack(demo):
    """The pages' heavy work (the agents' dataset, statements, receipt files) runs in figures children: after
    every kind of page, a receipt's text, JSON and PDF included, the server process has imported none of pandas,
    pyarrow or DuckDB (how much memory that saves is bench.web's figure)."""
    import subprocess
    import sys

    out, _ = demo
    code = f"""
import sys
from starlette.testclient import TestClient
from ledger.base import config
from ledger.chain.db import make_engine
from ledger.ingest.site import site_from_config
from ledger.web.access import from_config
from ledger.web.app import create_app
from ledger.web.views import LedgerView
url = {f"sqlite:///{out / 'ledger.db'}"!r}
view = LedgerView(make_engine(url, read_only=True), site_from_config(config.load(None, environ={{}}), db=url))
c = TestClient(create_app(view, from_config({SERVE!r})), client=("127.0.0.1", 40000))
job = next(b for b in view.snapshot(False).receipts.values() if b["job"]["account"] == "astro")["job"]["job_id"]
codes = [c.get(p, headers={{"X-Remote-User": "op"}}).status_code
         for p in [*{SERVER_PAGES!r}, f"/receipts/{{job}}", f"/receipts/{{job}}.json", f"/receipts/{{job}}.pdf"]]
print(codes, sorted(m for m in ("pandas", "pyarrow", "duckdb", "reportlab") if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == f"{[200] * (len(SERVER_PAGES) + 3)} []", r.stdout
