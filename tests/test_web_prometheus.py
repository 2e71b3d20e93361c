"""The real Prometheus scrapes a real `ipledger serve --metrics-only` on the demo ledger (and a captured
dcgm-exporter scrape, for the dashboard's dcgm panels), and every PromQL expression of dashboards/ipledger.json
returns data."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.prom_service import start_scraping_prometheus
from tests.services import free_port, unavailable

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).parents[1]
DCGM = ROOT / "tests" / "fixtures" / "real" / "dcgm_exporter" / "empty_pod_labels_gpumontools138.prom"


def _wait(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    unavailable(f"ipledger serve did not answer {url}: {proc.stdout.read() if proc.poll() is not None else ''}")


@pytest.fixture(scope="module")
def scraped(demo, tmp_path_factory):
    import uvicorn  # noqa: F401 - the server below needs it (dev extra): missing, the test fails, never skips

    out, _ = demo
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), IPLEDGER_CONFIG="")
    env.pop("IPLEDGER_CONFIG")
    db = ["--db", f"sqlite:///{out / 'ledger.db'}"]
    work = tmp_path_factory.mktemp("prom-serve")
    status = work / "verify-status.json"   # a real `ipledger verify --record`, as a site's cron runs it
    subprocess.run([sys.executable, "-m", "ledger.cli.main", *db, "--config", str(out / "site.toml"),   # its carbon zone
                    "verify", "--record", str(status)], env=env,
                   cwd=ROOT, check=True, capture_output=True)
    site = work / "site.toml"
    site.write_text(f'[serve]\nverify_status = "{status}"\n')
    serve = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", *db, "--config", str(site),
                              "serve", "--metrics-only", "--port", str(port)], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    body = DCGM.read_bytes()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:  # noqa: ANN002
            pass

    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    prom = None
    try:
        _wait(f"http://127.0.0.1:{port}/metrics", serve)
        prom = start_scraping_prometheus([f"127.0.0.1:{port}", f"127.0.0.1:{dcgm.server_address[1]}"])
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        dcgm.shutdown()
        serve.terminate()
        serve.wait(timeout=10)


def test_every_dashboard_query_returns_data(scraped):
    dash = json.loads((ROOT / "dashboards" / "ipledger.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        q = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{scraped.url}/api/v1/query?{q}", timeout=10) as r:  # noqa: S310
            res = json.loads(r.read())
        assert res["status"] == "success", (expr, res)
        assert res["data"]["result"], f"no data for {expr}"


def test_scraped_figures_equal_the_receipts(scraped, demo):
    out, summary = demo
    q = urllib.parse.urlencode({"query": "sum(ipledger_receipts_issued)"})
    with urllib.request.urlopen(f"{scraped.url}/api/v1/query?{q}", timeout=10) as r:  # noqa: S310
        got = float(json.loads(r.read())["data"]["result"][0]["value"][1])
    assert got == summary["receipts_issued"]


def _value(scraped, expr: str) -> float:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{scraped.url}/api/v1/query?{q}", timeout=10) as r:  # noqa: S310
        return float(json.loads(r.read())["data"]["result"][0]["value"][1])


def test_scraped_verify_status_is_the_recorded_verify(scraped, demo):
    """The verify the fixture recorded passed, checked the whole demo ledger, and finished before the scrape."""
    assert _value(scraped, "ipledger_verify_ok") == 1
    assert _value(scraped, "ipledger_verify_head_seq") == _value(scraped, "ipledger_ledger_head_seq")
    assert 0 <= _value(scraped, "ipledger_verify_age_seconds") < 600

