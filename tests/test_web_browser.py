"""A real browser on the web view: Debian's chromium and chromium-driver (Selenium) load the fleet, device, tenant
and finding pages of the demo ledger, served by a real `ipledger serve`, as an operator and as a tenant (the user
header set through the DevTools protocol, as the site's proxy would); the figures shown equal the CLI's, no
console error occurs, the charts are non-empty SVG, and each page's screenshot is saved under
$IPLEDGER_TEST_ARTIFACTS (default test-artifacts/web/)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.services import free_port, unavailable

pytestmark = pytest.mark.browser
ROOT = Path(__file__).parents[1]
CHROMIUM = os.environ.get("IPLEDGER_TEST_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("IPLEDGER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
THROTTLING = ("power_cap", "restore_power_limit", "inspect_cooling", "hot_because_cooling")
CONFIG = """[serve]
user_header = "X-Remote-User"
trusted_proxies = ["127.0.0.1"]
[serve.users.op]
role = "operator"
[serve.users.ast]
role = "tenant"
accounts = ["astro"]
"""


@pytest.fixture(scope="module")
def served(demo, tmp_path_factory):
    out, _ = demo
    work = tmp_path_factory.mktemp("web-browser")
    cfg = work / "config.toml"
    cfg.write_text(CONFIG)
    cfg.chmod(0o600)
    port = free_port()
    url = f"sqlite:///{out / 'ledger.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "ledger.cli.main", "--db", url, "--config", str(cfg), "serve",
                             "--port", str(port)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"{base}/metrics", timeout=2)  # noqa: S310
            break
        except OSError:
            time.sleep(0.3)
    if proc.poll() is not None:
        unavailable(f"ipledger serve did not start: {proc.stdout.read()[-500:]}")
    try:
        yield base, url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium not installed (the dev extra has it)")
    for binary in (CHROMIUM, DRIVER):
        if not os.access(binary, os.X_OK):
            unavailable(f"{binary} not installed (Debian packages chromium, chromium-driver; make test installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    drv.execute_cdp_cmd("Network.enable", {})
    try:
        yield drv
    finally:
        drv.quit()


def _artifacts() -> Path:
    d = Path(os.environ.get("IPLEDGER_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "web"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _load(drv, base: str, path: str, user: str, shot: str) -> dict[str, float]:
    from selenium.webdriver.common.by import By

    drv.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"X-Remote-User": user}})
    drv.get_log("browser")   # drop what earlier pages logged
    drv.get(base + path)
    assert "401" not in drv.title and "404" not in drv.title, (path, drv.title)
    errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, (path, errors)
    drv.save_screenshot(str(_artifacts() / f"{shot}.png"))
    return {e.get_attribute("data-figure"): float(e.text.replace(",", ""))
            for e in drv.find_elements(By.CSS_SELECTOR, "[data-figure]")}


def _charts(drv) -> int:
    from selenium.webdriver.common.by import By

    charts = drv.find_elements(By.CSS_SELECTOR, "svg.chart")
    drawn = [c for c in charts if c.find_elements(By.CSS_SELECTOR, "rect, polyline") and c.size["width"] > 0]
    return len(drawn)


def _cli(cli, runner, url, *args):
    r = runner.invoke(cli, ["--db", url, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_operator_pages_in_chromium(served, browser, cli, runner):
    base, url = served
    acct = _cli(cli, runner, url, "account", "--period", "2026-11", "--json")
    got = _load(browser, base, "/fleet?period=2026-11", "op", "fleet-operator")
    assert got["paid"] == round(acct["account"]["paid"], 4) and got["total.lost"] == acct["total"]["lost"]
    assert _charts(browser) >= 1
    found = _cli(cli, runner, url, "findings", "--no-refresh", "--json")["findings"]
    rack = next(f for f in found if f["evidence"])
    _load(browser, base, f"/findings/{rack['id']}", "op", "finding-operator")
    assert _charts(browser) == len(rack["evidence"])
    receipt = _cli(cli, runner, url, "receipt", "400000", "--format", "json")
    dev = receipt["job"]["devices"][0]["uuid"]
    _load(browser, base, f"/devices/{dev}", "op", "device-operator")
    assert _charts(browser) >= 4


def test_device_charts_shade_throttling_and_mark_findings(served, browser, cli, runner):
    """A device on the node of a throttling finding: its charts shade the throttled hours by reason and outline
    the finding's evidence window; unknown telemetry is marked (and its hours are gaps in the lines)."""
    from selenium.webdriver.common.by import By

    base, url = served
    found = _cli(cli, runner, url, "findings", "--no-refresh", "--json")["findings"]
    hot = next(f for f in found if f["kind"] in THROTTLING and f["scope"].get("node"))
    _load(browser, base, f"/nodes/{hot['scope']['node']}", "op", "node-operator")
    dev = browser.find_elements(By.CSS_SELECTOR, 'a[href^="/devices/"]')[0].get_attribute("href")
    _load(browser, base, dev.removeprefix(base), "op", "device-throttled")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) >= 4
    for c in charts:   # every chart of the device carries the shading and the marks
        reasons = {r.get_attribute("data-reason") for r in c.find_elements(By.CSS_SELECTOR, "rect.throttle")}
        assert reasons and reasons <= {"thermal", "power_cap", "hw_slowdown", "sync_boost", "other"}
        windows = c.find_elements(By.CSS_SELECTOR, "rect.finding-window")
        assert any(hot["id"] in w.find_element(By.TAG_NAME, "title").get_attribute("textContent") for w in windows)
        assert all(float(w.get_attribute("width")) > 0 for w in windows)


def test_tenant_pages_in_chromium(served, browser, cli, runner):
    base, url = served
    want = _cli(cli, runner, url, "explain", "--tenant", "astro", "--period", "2026-11", "--json")
    got = _load(browser, base, "/tenants/astro?period=2026-11", "ast", "tenant-astro")
    assert got["paid"] == round(want["account"]["paid"], 4)
    assert got["cost.paid"] == want["account"]["cost"]["paid"]
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"X-Remote-User": "ast"}})
    browser.get(base + "/fleet")
    assert "404" in browser.title
