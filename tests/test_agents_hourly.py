"""The agents' dataset over device-hours (ledger/agents/hourly.py) against the full-resolution one
(ledger/agents/data.py, kept as the reference): on the demo hall and on the independent generator's export
imported into a ledger, the daily account, the hour-of-day profile, the bucket totals, the prices and the
coverage gaps are the same, from a frame hundreds of times smaller."""

from __future__ import annotations

from functools import lru_cache

import pandas as pd
import pytest

from bench.scenario import generate, write_export
from ledger.chain import db as db_mod
from ledger.agents import accounting
from ledger.agents.common import price
from ledger.agents.data import bucket_totals, coverage_gaps, load
from ledger.agents import analyze
from ledger.agents import hourly
from ledger.agents.hourly import DAILY_FIGURES, DAILY_KEY, device_partition, load_compact, merge_daily
from ledger.agents.export_analysis import read_source
from ledger.importers import pipeline
from ledger.telemetry import hours as dh


@lru_cache(maxsize=1)
def _scenario_engine(tmp: str):  # noqa: ANN202
    sc = generate(3)
    path = write_export(sc, __import__("pathlib").Path(tmp) / "export.json")
    engine = db_mod.make_engine(f"sqlite:///{tmp}/scenario.db")
    db_mod.upgrade(engine)
    pipeline.write(engine, read_source("prometheus", [str(path)]), pipeline.ImportOptions(cluster="pathb"))
    return engine


@pytest.fixture(params=["demo", "scenario"])
def engine(request, tmp_path_factory):  # noqa: ANN001
    if request.param == "demo":
        from tests.test_agents import small_hall

        return small_hall()[0].engine
    return _scenario_engine(str(tmp_path_factory.mktemp("scenario")))


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1.0)


def test_account_parts_equal_the_full_resolution(engine) -> None:  # noqa: ANN001
    full, comp = load(engine), load_compact(engine)
    assert len(comp.samples) * 2 < len(full.samples)
    assert (comp.cadence, comp.start, comp.end) == (full.cadence, full.start, full.end)
    # the daily account: the same rows, every figure equal to rounding
    d_full = {tuple(r[k] for k in ("day", "cluster", "tenant", "partition", "qos")): r for r in accounting.daily(full)}
    d_comp = {tuple(r[k] for k in ("day", "cluster", "tenant", "partition", "qos")): r for r in accounting.daily(comp)}
    assert d_full.keys() == d_comp.keys() and d_full
    for k, r in d_full.items():
        for col in ("paid", "unknown", "delivered", "underutilized", "starved", "idle_held", "throttled"):
            assert _close(r[col], d_comp[k][col], 1e-5), (k, col, r[col], d_comp[k][col])
    hf, hc = accounting.hour_of_day(full), accounting.hour_of_day(comp)
    assert [r["hour"] for r in hf] == [r["hour"] for r in hc]
    for a, b in zip(hf, hc):
        assert _close(a["paid_observed"], b["paid_observed"]) and _close(a["delivered"], b["delivered"])
    alloc_f, alloc_c = full.samples[full.samples["ai"] >= 0], comp.samples[comp.samples["ai"] >= 0]
    bf, bc = bucket_totals(alloc_f), bucket_totals(alloc_c)
    for key in ("delivered", "underutilized", "starved", "idle_held", "unknown_field_missing"):
        assert _close(bf[key], bc[key]), key
    for reason, v in bf["throttled"].items():
        assert _close(v, bc["throttled"][reason]), reason
    for col in ("h", "h_del", "h_idle"):
        assert _close(price(full, alloc_f, col), price(comp, alloc_c, col))
    gf, gc = coverage_gaps(full), coverage_gaps(comp)
    pd.testing.assert_frame_equal(gf.reset_index(drop=True), gc.reset_index(drop=True))


def _key(f) -> tuple:  # noqa: ANN001
    j = f.to_json()
    return (j["agent"], j["kind"], tuple(sorted((k, v) for k, v in j["scope"].items() if v is not None)),
            j["start"], j["end"])


def test_findings_from_device_hours_equal_the_full_resolution(engine) -> None:  # noqa: ANN001
    """Every agent over device-hours plus the raw samples their findings' scopes and windows need
    (hourly.analyze), against every agent over every sample (agents.analyze): the same findings of every kind
    (kinds, scopes, windows), GPU-hours within 1 %, the same evidence and recommendations."""
    full, hyb = analyze(engine), hourly.analyze(engine)
    want = {_key(f): f for f in full.findings}
    got = {_key(f): f for f in hyb.findings}
    assert got.keys() == want.keys()
    kinds = {k[1] for k in want}
    # both halls raise causes of every rule the agents decide on hourly statistics or on screens
    assert {"hot_because_cooling", "power_cap", "idle_held", "starved", "xid", "unknown_gap", "ecc_drift"} <= kinds
    for k, f in want.items():
        g = got[k]
        assert abs(g.gpu_hours - f.gpu_hours) <= 0.01 * max(f.gpu_hours, 1e-9), k
        assert g.to_json()["evidence"] == f.to_json()["evidence"], k
    # the same samples counted (device-hours keep their count), held in fewer rows
    assert hyb.meta["samples"] == full.meta["samples"]
    assert len(hourly.load_compact(engine, detail=True).samples) < full.meta["samples"]
    for col in ("paid", "delivered", "lost"):
        assert abs(hyb.account[col] - full.account[col]) <= 1e-3, col


def test_vectorised_merge_equals_the_reference_merge(engine) -> None:  # noqa: ANN001
    """The agents read device-hours merged by pandas group operations; hours.merge (held to the whole by
    tests/test_device_hours.py) is the reference, here over every device-hour of both ledgers."""
    with engine.connect() as conn:
        frame = dh.merged_frame(conn)
        ref = dh.merged(conn)
    rows = [dh.DeviceHour(*[int(v) if k in dh.INT_FIELDS else v for k, v in zip(dh.FIELDS, r)])
            for r in frame.itertuples(index=False)]
    assert len(rows) == len(ref) and dh.first_mismatch(ref, rows) is None


def test_device_partitions_merge_to_the_single_run(engine) -> None:  # noqa: ANN001
    """The scale-out simulation (docs/scale.md): the fleet's device-hours split by node into 3 partitions, the
    daily account run on each alone, the rows summed: the single run's account."""
    ds = load_compact(engine)
    nodes = sorted(ds.devices["node"].dropna().unique())
    parts = [ds.devices.index[ds.devices["node"].isin(nodes[i::3])] for i in range(3)]
    merged = merge_daily([accounting.daily(device_partition(ds, p)) for p in parts])
    single = {tuple(r[c] for c in DAILY_KEY): r for r in accounting.daily(ds)}
    assert {tuple(r[c] for c in DAILY_KEY) for r in merged} == single.keys()
    for r in merged:
        s = single[tuple(r[c] for c in DAILY_KEY)]
        for f in DAILY_FIGURES:
            assert abs(r[f] - s[f]) <= 3e-4, (f, r[f], s[f])   # three partitions' 4-decimal rounding


def test_daily_command_from_hours_equals_from_samples(runner, cli, engine) -> None:  # noqa: ANN001
    import json

    url = str(engine.url)
    hours_out = runner.invoke(cli, ["--db", url, "daily", "--json"])
    samples_out = runner.invoke(cli, ["--db", url, "daily", "--json", "--samples"])
    assert hours_out.exit_code == 0 and samples_out.exit_code == 0, hours_out.output + samples_out.output
    a, b = json.loads(hours_out.output), json.loads(samples_out.output)
    assert (a["source"], b["source"]) == ("device_hours", "samples") and len(a["daily"]) == len(b["daily"]) > 0
    for x, y in zip(a["daily"], b["daily"]):
        assert [x[k] for k in DAILY_KEY] == [y[k] for k in DAILY_KEY]
        assert all(abs(x[f] - y[f]) <= 1e-3 for f in DAILY_FIGURES)
    text_out = runner.invoke(cli, ["--db", url, "daily"])
    assert text_out.exit_code == 0 and "paid" in text_out.output
    assert "Example" in runner.invoke(cli, ["daily", "--help"]).output


def test_findings_command_reads_device_hours_and_samples_alike(runner, cli, engine, tmp_path) -> None:  # noqa: ANN001
    """`ipledger findings` (device-hours, the default) and `--samples` (every sample) print the same findings;
    on a copy of the ledger, since both record what they find."""
    import json
    import shutil

    db = tmp_path / "copy.db"
    shutil.copy(engine.url.database, db)
    url = f"sqlite:///{db}"
    hours_out = runner.invoke(cli, ["--db", url, "findings", "--json"])
    samples_out = runner.invoke(cli, ["--db", url, "findings", "--json", "--samples"])
    assert hours_out.exit_code == 0 and samples_out.exit_code == 0, hours_out.output + samples_out.output
    a, b = json.loads(hours_out.output), json.loads(samples_out.output)
    assert (a["source"], b["source"]) == ("device_hours", "samples")
    assert [f["id"] for f in a["findings"]] == [f["id"] for f in b["findings"]] and a["findings"]
    for x, y in zip(a["findings"], b["findings"]):
        assert abs(x["gpu_hours"] - y["gpu_hours"]) <= 0.01 * max(y["gpu_hours"], 1e-9), x["id"]
    assert "--samples" in runner.invoke(cli, ["findings", "--help"]).output


def _same_json(a, b, path: str = "") -> None:  # noqa: ANN001
    """Equal structure and text; numbers to the rounding of the printed figures (3 decimals)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same_json(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same_json(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= 2e-3 + 1e-6 * abs(a), (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_explain_ask_account_read_device_hours_and_samples_alike(runner, cli, engine) -> None:  # noqa: ANN001
    """`explain`, `ask` and `account` over device-hours (the default) answer as over every sample (`--samples`)."""
    import json

    from ledger.chain.canonical import format_ts

    ds = load_compact(engine)
    node = sorted(ds.devices["node"].dropna().unique())[0]
    job = sorted(ds.allocs["job_id"].unique())[0]
    day = format_ts(ds.start)[:10]
    url = str(engine.url)
    for args in (["explain", "--node", node], ["explain", "--job", job], ["ask", f"why is {node} slow?"],
                 ["ask", f"where did the GPU-hours go on {day}?"], ["account", "--day", day]):
        a = runner.invoke(cli, ["--db", url, *args, "--json"])
        b = runner.invoke(cli, ["--db", url, *args, "--json", "--samples"])
        assert a.exit_code == 0 and b.exit_code == 0, (args, a.output, b.output)
        x, y = json.loads(a.output), json.loads(b.output)
        assert (x.pop("source", "device_hours"), y.pop("source", "samples")) == ("device_hours", "samples")
        _same_json(x, y)


_KEY_VALUES = {"cluster": ["c1", "c2", None], "job_id": ["1", "22", None], "run": [0, 1, "2", None],
               "tenant": ["astro", "bio", None], "sku": ["H100-SXM5-80GB", "A100", None]}


@pytest.mark.parametrize("seed", range(25))
def test_delivered_by_run_rate_equals_its_reference(seed: int) -> None:
    """The grouped run-money rows (samples grouped on their own columns) equal the plain version that formats
    every sample's key, row for row and bit for bit, missing tenants, SKUs and all-missing columns included."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    frame = {c: [vals[i] for i in rng.integers(0, len(vals), n)] for c, vals in _KEY_VALUES.items()}
    if seed % 5 == 0:   # a column with no value at all
        frame[["tenant", "sku", "cluster"][seed % 3]] = [None] * n
    frame["h_del"] = rng.random(n) * rng.choice([1e-6, 1.0, 1e3], n)
    samples = pd.DataFrame(frame)
    got = accounting._delivered_by_run_rate(samples)  # noqa: SLF001 - the trick, held to its reference
    assert got == accounting.delivered_by_run_rate_reference(samples)
