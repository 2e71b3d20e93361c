"""A real Prometheus for the live-import tests: TSDB backfilled with promtool, served on 127.0.0.1:<free port>.

``start_prometheus(openmetrics_file)`` runs ``promtool tsdb create-blocks-from openmetrics FILE DIR`` and then
``prometheus --storage.tsdb.path=DIR --web.listen-address=127.0.0.1:PORT`` (no scrape targets), waits for
``/-/ready``, and returns a handle with ``url`` and ``stop()``. When a binary is missing or the server does
not come up, :func:`tests.services.unavailable` fails the test in CI and skips it elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.services import free_port, unavailable

PROMETHEUS = os.environ.get("IPLEDGER_TEST_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("IPLEDGER_TEST_PROMTOOL", "/usr/bin/promtool")


@dataclass
class Prometheus:
    url: str
    workdir: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:   # its TSDB is thrown away: no need to wait for a clean shutdown
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_prometheus(openmetrics_file: Path) -> Prometheus:
    for binary in (PROMETHEUS, PROMTOOL):
        if not os.access(binary, os.X_OK):
            unavailable(f"{binary} not installed (Debian package `prometheus`; `make test` installs it)")
    work = Path(tempfile.mkdtemp(prefix="ipledger-prom-"))
    data = work / "data"
    data.mkdir()
    backfill = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics_file), str(data)],
                              capture_output=True, text=True, timeout=300)
    if backfill.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        unavailable(f"promtool backfill failed: {backfill.stderr.strip()[-400:]}")
    config = work / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n", encoding="utf-8")
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return Prometheus(url=url, workdir=work, proc=proc)
        except OSError:
            time.sleep(0.3)
    text = (work / "prometheus.log").read_text(errors="replace")[-600:]
    Prometheus(url=url, workdir=work, proc=proc).stop()
    unavailable(f"Prometheus did not become ready: {text}")
    raise AssertionError("unreachable")


def start_scraping_prometheus(targets: list[str], interval_s: int = 1) -> Prometheus:
    """A real Prometheus scraping ``targets`` (host:port, path /metrics) every ``interval_s`` seconds; ready
    once every target has been scraped up (``up == 1``)."""
    import json as _json

    if not os.access(PROMETHEUS, os.X_OK):
        unavailable(f"{PROMETHEUS} not installed (Debian package `prometheus`; `make test` installs it)")
    work = Path(tempfile.mkdtemp(prefix="ipledger-prom-scrape-"))
    (work / "data").mkdir()
    config = work / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: {interval_s}s\n  scrape_timeout: {interval_s}s\n"
                      f"scrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: {_json.dumps(targets)}\n",
                      encoding="utf-8")
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=work)
    prom = Prometheus(url=f"http://127.0.0.1:{port}", workdir=work, proc=proc)
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{prom.url}/api/v1/query?query=up", timeout=2) as r:  # noqa: S310
                res = _json.loads(r.read())["data"]["result"]
            if len(res) == len(targets) and all(x["value"][1] == "1" for x in res):
                return prom
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    text = (work / "prometheus.log").read_text(errors="replace")[-600:]
    prom.stop()
    unavailable(f"Prometheus did not scrape {targets}: {text}")
    raise AssertionError("unreachable")
