"""Live import from a REAL Prometheus (Debian's, on 127.0.0.1) backfilled with 24 h of dcgm-exporter series for
16 GPUs: `ipledger import prometheus --url` must give the same ledger as importing the equivalent files."""

from __future__ import annotations

import json
import time

import pytest

from ledger.chain import db as db_mod
from ledger.importers import prometheus, synth
from ledger.chain.store import iter_entries
from tests.prom_service import start_prometheus

pytestmark = pytest.mark.prometheus
DAY = 86_400
# Recent enough to be inside the TSDB's retention and behind its head; aligned to the step.
START = float((int(time.time()) // DAY - 3) * DAY)
KW = dict(n_gpus=16, hours=24, cadence=60, start=START, holes=[(7, 36_000, 1200)], jobs="slurm",
          metrics=synth.DEFAULT_METRICS[:8])


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    d = tmp_path_factory.mktemp("prom")
    om = synth.write_openmetrics(d / "dcgm.om", **KW)
    server = start_prometheus(om)
    yield server
    server.stop()


def _ledger(url):
    eng = db_mod.make_engine(url)
    try:
        rows = [(ce.seq, ce.entry.entry_id, ce.entry.kind, ce.entry.payload, ce.hash) for ce in iter_entries(eng)]
        with eng.connect() as conn:
            n = conn.exec_driver_sql("SELECT (SELECT count(*) FROM samples) + "
                                     "(SELECT coalesce(sum(rows), 0) FROM sample_blocks)").scalar()
        return rows, n
    finally:
        eng.dispose()


def test_live_import_equals_file_import(prom, runner, cli, tmp_path):
    files = tmp_path / "qr"
    synth.write_query_range(files, **KW)
    end = START + DAY - 60
    urls = {}
    for name in ("live", "files"):
        urls[name] = f"sqlite:///{tmp_path / (name + '.db')}"
        eng = db_mod.make_engine(urls[name])
        db_mod.upgrade(eng)
        eng.dispose()
    base = ["--start", str(START), "--end", str(end), "--step", "60s", "--json", "--quiet"]
    # automatic receipts off: an issued receipt records when it was issued, and this compares the imports
    r_live = runner.invoke(cli, ["--db", urls["live"], "import", "prometheus", "--url", prom.url, *base],
                           env={"IPLEDGER_CONFIG": "", "IPLEDGER_AUTO_RECEIPTS": "0"})
    assert r_live.exit_code == 0, r_live.output
    r_files = runner.invoke(cli, ["--db", urls["files"], "import", "prometheus", str(files), *base],
                            env={"IPLEDGER_CONFIG": "", "IPLEDGER_AUTO_RECEIPTS": "0"})
    assert r_files.exit_code == 0, r_files.output
    live, files_out = json.loads(r_live.output), json.loads(r_files.output)
    assert live["devices"] == 16 and live["samples"] == 16 * 1440 - 20
    assert live["unknown_intervals"] == 1 and live["per_device"][synth.gpu_uuid(0, 7)]["unknown_s"] == 1200
    (rows_live, n_live), (rows_files, n_files) = _ledger(urls["live"]), _ledger(urls["files"])
    assert n_live == n_files == 16 * 1440 - 20
    assert rows_live == rows_files            # same entries, same order, same segment digests, same chain head


def test_chunking_stays_within_the_points_limit(prom):
    windows = prometheus.chunks(START, START + DAY, 1.0)
    assert all((e - s) / 1.0 + 1 <= prometheus.MAX_POINTS_PER_SERIES for s, e in windows)
    assert windows[0][0] == START and windows[-1][1] == START + DAY
    assert all(b[0] == a[1] + 1.0 for a, b in zip(windows, windows[1:]))
    # a small step forces several chunks against the real server; the result equals one big call
    few = prometheus.fetch(prom.url, START, START + 3 * 3600, 60, metrics=["DCGM_FI_DEV_POWER_USAGE"])
    import ledger.importers.prometheus as P
    old = P.CHUNK_POINTS
    try:
        P.CHUNK_POINTS = 50
        many = prometheus.fetch(prom.url, START, START + 3 * 3600, 60, metrics=["DCGM_FI_DEV_POWER_USAGE"])
    finally:
        P.CHUNK_POINTS = old
    assert few.points == many.points == 16 * 181
    for dev in few.series:
        a, b = few.series[dev]["power_w"], many.series[dev]["power_w"]
        assert sorted(zip(a[0], a[1])) == sorted(zip(b[0], b[1]))


def test_unreachable_prometheus_is_a_one_line_error(runner, cli, sqlite_url):
    from tests.services import free_port

    r = runner.invoke(cli, ["--db", sqlite_url, "import", "prometheus", "--url", f"http://127.0.0.1:{free_port()}",
                            "--start", "0", "--end", "60"], env={"IPLEDGER_CONFIG": ""})
    assert r.exit_code != 0 and "cannot reach Prometheus" in r.output and len(r.output.strip().splitlines()) == 1
