"""The device-hour dataset against the full-resolution one on ledgers hypothesis draws: runs that start and end
mid-hour (and one left open), overlapping runs on a device, gaps in the telemetry, clocks above the rated
clock, a device without a SKU rating, segments that cut hours anywhere. The daily account, bucket totals and
coverage gaps must agree (tests/test_agents_hourly.py does the same on the demo hall and the generator)."""

from __future__ import annotations

import itertools
import tempfile

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger.agents import accounting
from ledger.agents.data import bucket_totals, coverage_gaps, load
from ledger.agents.hourly import DAILY_FIGURES, DAILY_KEY, load_compact
from ledger.chain.entries import Kind, make_entry
from ledger.chain.store import append
from ledger.telemetry.model import Sample
from ledger.telemetry.sealed import segment_entry, write_segment

T0 = 1_793_577_600.0 + 1_234.0       # not on an hour
CADENCE = 60.0
SKUS = ("NVIDIA H100 80GB HBM3", None)
_n = itertools.count()


@st.composite
def ledgers(draw) -> tuple[list[Sample], list[list[int]], list[tuple]]:  # noqa: ANN001
    samples = []
    for d in range(draw(st.integers(1, 3))):
        t = T0 + draw(st.integers(0, 3)) * CADENCE
        for _ in range(draw(st.integers(20, 240))):
            if draw(st.integers(0, 30)) == 0:
                t += draw(st.integers(3, 90)) * CADENCE          # a gap in the telemetry
            act = draw(st.sampled_from([None, 0.0, 0.02, 0.5, 0.9]))
            samples.append(Sample(f"GPU-{d}", t, CADENCE, clock_reasons=draw(st.sampled_from([None, 0, 0x4, 0x20])),
                                  sm_active=act, sm_clock_mhz=draw(st.sampled_from([None, 1500.0, 1980.0, 2100.0])),
                                  power_w=400.0, gpu_temp_c=60.0, fb_used_mib=draw(st.sampled_from([0.0, 4000.0])),
                                  compute_procs=draw(st.sampled_from([0.0, 1.0]))))
            t += CADENCE
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(samples) - 1)), max_size=5))))
    devices = sorted({s.device for s in samples})
    runs = []
    for d in devices:
        for _ in range(draw(st.integers(0, 3))):
            a = T0 + draw(st.integers(-30, 400)) * CADENCE + draw(st.integers(0, 59))
            b = a + draw(st.integers(1, 300)) * CADENCE + draw(st.integers(0, 59))
            runs.append((d, a, None if draw(st.integers(0, 9)) == 0 else b, draw(st.sampled_from(SKUS)),
                         draw(st.sampled_from(["t1", "t2"]))))
    return samples, cuts, runs


def _build(samples: list[Sample], cuts: list[int], runs: list[tuple]):  # noqa: ANN202
    url = f"sqlite:///{tempfile.mkdtemp(prefix='ipledger-hourly-')}/l.db"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    ordered = sorted(samples, key=lambda s: (s.t, s.device))
    for a, b in zip([0, *cuts], [*cuts, len(ordered)]):
        if a < b:
            seg = ordered[a:b]
            write_segment(engine, seg, segment_entry(seg, node="n1", source="test"))
    entries = []
    sku_of: dict[str, str | None] = {}
    for dev, a, b, sku, tenant in runs:
        sku = sku_of.setdefault(dev, sku)        # one SKU per device
        key = dict(cluster="c", job_id=str(next(_n)), run=0, node="n1")
        entries.append(make_entry(Kind.ALLOCATION_STARTED, a, {"account": tenant, "partition": "gpu", "qos": "q"},
                                  **key))
        entries.append(make_entry(Kind.DEVICE_BOUND, a, {"uuid": dev, "node": "n1", **({"sku": sku} if sku else {})},
                                  device=dev, **key))
        if b is not None:
            entries.append(make_entry(Kind.ALLOCATION_ENDED, b, {"state": "COMPLETED", "exit_code": 0}, **key))
    if entries:
        append(engine, entries)
    return engine


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ledgers())
def test_daily_account_and_gaps_agree_on_drawn_ledgers(drawn) -> None:  # noqa: ANN001
    engine = _build(*drawn)
    try:
        full, comp = load(engine), load_compact(engine)
        assert (comp.cadence, comp.start, comp.end) == (full.cadence, full.start, full.end)
        f = {tuple(r[k] for k in DAILY_KEY): r for r in accounting.daily(full)}
        c = {tuple(r[k] for k in DAILY_KEY): r for r in accounting.daily(comp)}
        assert f.keys() == c.keys()
        for k, r in f.items():
            for col in DAILY_FIGURES:
                assert abs(r[col] - c[k][col]) <= 2e-4, (k, col, r[col], c[k][col])
        bf = bucket_totals(full.samples[full.samples["ai"] >= 0])
        bc = bucket_totals(comp.samples[comp.samples["ai"] >= 0])
        for key in ("delivered", "underutilized", "starved", "idle_held", "unknown_field_missing"):
            assert abs(bf[key] - bc[key]) <= 1e-6, key
        assert all(abs(v - bc["throttled"][r]) <= 1e-6 for r, v in bf["throttled"].items())
        pd.testing.assert_frame_equal(coverage_gaps(full).reset_index(drop=True),
                                      coverage_gaps(comp).reset_index(drop=True))
    finally:
        engine.dispose()
