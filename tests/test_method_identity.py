"""The accounting identity, property-tested: every allocated second lands in exactly one bucket.

Random per-device timelines (gaps, overlapping and repeated samples, every reason-bit combination, None
fields, zero-length runs, suspended spans, windows across midnight and month ends) through the method and
through whole receipts; plus the clock-reason precedence, SKU matching and summary-only attribution.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain.canonical import canonical_json
from ledger.chain.entries import ChainedEntry, Kind, make_entry
from ledger.method import (
    BUCKETS,
    THROTTLE_REASONS,
    SampleArrays,
    attribute_device,
    attribute_summary,
    reason_bucket,
)
from ledger.method.attribution import NANOHOURS_PER_SECOND
from ledger.method.skus import builtin_table, match_sku, site_table
from ledger.receipts import RunInputs, RunKey, compute_receipt

# Month ends and midnights: the windows start near these instants.
ANCHORS = [dt.datetime(2026, 1, 31, 23, 0, tzinfo=dt.timezone.utc),
           dt.datetime(2026, 2, 28, 23, 59, 30, tzinfo=dt.timezone.utc),
           dt.datetime(2026, 12, 31, 22, 15, tzinfo=dt.timezone.utc),
           dt.datetime(2028, 2, 29, 0, 0, tzinfo=dt.timezone.utc)]

maybe_frac = st.one_of(st.none(), st.floats(0, 1), st.sampled_from([0.0, 0.01, 0.05, 1.0]))


@st.composite
def timelines(draw):
    anchor = draw(st.sampled_from(ANCHORS)).timestamp()
    start = anchor + draw(st.integers(-7200, 7200)) + draw(st.sampled_from([0.0, 0.25, 0.123456]))
    length = draw(st.one_of(st.just(0.0), st.floats(0, 86400 * 2), st.integers(1, 10).map(float)))
    end = start + length
    n = draw(st.integers(0, 60))
    cadence = draw(st.sampled_from([1.0, 10.0, 30.0, 600.0]))
    # sample times: mostly regular, with jitter, duplicates and holes; may start before / end after the window
    base = start - draw(st.integers(0, 3)) * cadence
    ts = [base + i * cadence + draw(st.sampled_from([0.0, 0.0, 0.5, -0.5, 3.0])) for i in range(n)]
    ts += draw(st.lists(st.sampled_from(ts or [start]), max_size=3))  # exact duplicates
    m = len(ts)
    cols = {
        "t": ts,
        "dt": [draw(st.sampled_from([cadence, cadence, cadence * 2, 0.0, 0.5])) for _ in range(m)],
        "sm_active": [draw(maybe_frac) for _ in range(m)],
        "gpu_util": [draw(maybe_frac) for _ in range(m)],
        "sm_clock": [draw(st.one_of(st.none(), st.floats(0, 3000))) for _ in range(m)],
        "reasons": [draw(st.one_of(st.none(), st.integers(0, 0x1FF))) for _ in range(m)],
        "procs": [draw(st.one_of(st.none(), st.integers(0, 3))) for _ in range(m)],
        "fb_used": [draw(st.one_of(st.none(), st.floats(0, 80000))) for _ in range(m)],
    }
    span = st.tuples(st.floats(start - 600, end + 600), st.floats(0, max(length, 1.0) + 600))
    gaps = [(a, a + w, f"g{i}") for i, (a, w) in enumerate(draw(st.lists(span, max_size=4)))]
    susp = [(a, a + w) for a, w in draw(st.lists(span, max_size=3))]
    rated = draw(st.one_of(st.none(), st.sampled_from([1410.0, 1980.0, 2100.0])))
    return start, end, cols, gaps, susp, rated


def _arrays(cols) -> SampleArrays:
    def f(xs):
        return np.array([np.nan if x is None else x for x in xs], dtype=np.float64)

    return SampleArrays.from_columns(t=f(cols["t"]), dt=f(cols["dt"]), sm_active=f(cols["sm_active"]),
                                     gpu_util=f(cols["gpu_util"]), sm_clock=f(cols["sm_clock"]),
                                     reasons=f(cols["reasons"]), procs=f(cols["procs"]), fb_used=f(cols["fb_used"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines())
def test_identity_holds_exactly_for_every_device_timeline(tl):
    start, end, cols, gaps, susp, rated = tl
    acc = attribute_device((start, end), _arrays(cols), unknown=gaps, suspended=susp, rated_clock_mhz=rated)
    assert acc.buckets.dtype == np.int64 and (acc.buckets >= 0).all()
    assert int(acc.buckets.sum()) == acc.paid_nanohours  # exact, in nanohours
    # paid + suspended is the whole window; paid excludes exactly the suspended time
    assert abs((acc.paid_nanohours + acc.suspended_nanohours) - (end - start) * NANOHOURS_PER_SECOND) <= 1
    # unknown = the gaps' shares + the unattributed causes
    assert int(acc.buckets[-1]) == sum(acc.gap_nanohours.values()) + sum(acc.unknown_causes.values())
    assert all(v >= 0 for v in acc.gap_nanohours.values()) and all(v >= 0 for v in acc.unknown_causes.values())
    hours = acc.buckets / 1e9
    assert abs(hours.sum() - acc.paid_nanohours / 1e9) < 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines(), st.sampled_from(["charge", "credit", "estimate", "hold"]), st.booleans())
def test_identity_holds_in_every_receipt(tl, policy, charge_suspended):
    start, end, cols, gaps, susp, rated = tl
    key = dict(cluster="c", job_id="1", run=0)
    uuids = ["GPU-a", "GPU-b"]
    es = [make_entry(Kind.ALLOCATION_STARTED, start, {"account": "acct"}, node="n1", **key),
          make_entry(Kind.ALLOCATION_STARTED, start + 0.5 if end > start + 0.5 else start, {"account": "acct"},
                     node="n2", **key)]  # multi-node: recorded once per node, merged
    es += [make_entry(Kind.DEVICE_BOUND, start, {"index": i, "sku": "NVIDIA H100 80GB HBM3"}, device=u,
                      node=f"n{i + 1}", **key) for i, u in enumerate(uuids)]
    es += [make_entry(Kind.UNKNOWN_INTERVAL, a, {"cause": "collector_down", "scope": "device"}, ts_end=b,
                      device=uuids[i % 2], **key) for i, (a, b, _g) in enumerate(gaps)]
    es += [make_entry(Kind.ALLOCATION_SUSPENDED, a, {}, ts_end=b, **key) for a, b in susp]
    es.append(make_entry(Kind.ALLOCATION_ENDED, end, {"exit_code": 0}, node="n1", **key))
    es.append(make_entry(Kind.CONTRACT_VERSION, start, {"id": "k", "version": "1", "unknown_policy": policy,
                                                        "charge_suspended": charge_suspended,
                                                        "billing_granularity_s": 60,
                                                        "skus": {"default": {"rate_per_gpu_hour": "3.10"}}}))
    chained = tuple(ChainedEntry(seq=i + 1, entry=e, prev_hash="0" * 64, hash=f"{i + 1:064x}") for i, e in enumerate(es))
    inputs = RunInputs(key=RunKey("c", "1", 0), entries=tuple(c for c in chained if c.entry.job_id),
                       contracts=tuple(c for c in chained if c.entry.kind == Kind.CONTRACT_VERSION),
                       samples={"GPU-a": _arrays(cols)})
    r = compute_receipt(inputs)
    gh = r.body["gpu_hours"]
    parts = gh["delivered"] + sum(gh["throttled"].values()) + gh["underutilized"] + gh["starved"] + \
        gh["idle_held"] + gh["unknown"]
    assert abs(gh["paid"] - parts) <= 1e-9
    for d in r.body["devices"]:
        h = d["gpu_hours"]
        assert abs(h["paid"] - (h["delivered"] + sum(h["throttled"].values()) + h["underutilized"] + h["starved"]
                                + h["idle_held"] + h["unknown"])) <= 1e-9
    pol = r.body["billing"]["unknown_gpu_hours_by_policy"]
    assert abs(sum(pol.values()) - gh["unknown"]) <= 1e-9 and pol[policy] == gh["unknown"]
    # money: lost is exactly paid - delivered, in cents
    c = r.body["cost"]
    assert round((c["paid"] - c["delivered"]) * 100) == round(c["lost"] * 100)
    # the hash is over the canonical body: recomputing gives the same bytes
    assert canonical_json(compute_receipt(inputs).body) == canonical_json(r.body)


def test_zero_length_run_is_all_zero_and_balanced():
    acc = attribute_device((100.0, 100.0), _arrays({"t": [100.0], "dt": [10.0], "sm_active": [1.0], "gpu_util": [None],
                                                    "sm_clock": [None], "reasons": [None], "procs": [1], "fb_used": [None]}))
    assert acc.paid_nanohours == 0 and int(acc.buckets.sum()) == 0


def test_reason_precedence_thermal_then_hw_then_power_then_sync():
    names = [THROTTLE_REASONS[i] for i in reason_bucket(np.array(
        [0x0, 0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x40, 0x80, 0x4 | 0x20, 0x4 | 0x8, 0x10 | 0x4, 0x80 | 0x4, -1]))]
    assert names == ["other", "other", "other", "power_cap", "hw_slowdown", "sync_boost", "thermal", "thermal",
                     "hw_slowdown", "thermal", "hw_slowdown", "power_cap", "hw_slowdown", "other"]


def test_throttle_split_follows_clock_ratio():
    # 100 s at full activity, clock at 75 % of rated, SW power cap: 75 s delivered, 25 s power_cap
    sa = SampleArrays.from_columns(t=[0.0], dt=[100.0], sm_active=[1.0], sm_clock=[1485.0], reasons=[0x4])
    acc = attribute_device((0.0, 100.0), sa, rated_clock_mhz=1980.0).as_dict()
    assert acc["delivered"] == round(75 * NANOHOURS_PER_SECOND)
    # the sample's covered time is rounded once; throttled is the rest of its active share
    assert acc["delivered"] + acc["throttled.power_cap"] == round(100 * NANOHOURS_PER_SECOND)


def test_coarse_utilisation_is_the_fallback_and_is_counted():
    sa = SampleArrays.from_columns(t=[0.0, 10.0], dt=[10.0, 10.0], sm_active=[None, 0.5], gpu_util=[0.8, 0.9])
    acc = attribute_device((0.0, 20.0), sa)
    assert acc.as_dict()["delivered"] == round(8 * NANOHOURS_PER_SECOND) + round(5 * NANOHOURS_PER_SECOND)
    assert acc.coarse_nanohours == round(10 * NANOHOURS_PER_SECOND)


def test_starved_needs_a_resident_process_else_idle_held():
    # 36 s samples are exactly 0.01 h each, so no rounding residue enters this comparison
    sa = SampleArrays.from_columns(t=[0.0, 36.0, 72.0], dt=[36.0] * 3, sm_active=[0.01, 0.0, 0.02],
                                   procs=[1, 0, None], fb_used=[None, 100.0, 4096.0])
    d = attribute_device((0.0, 108.0), sa).as_dict()
    assert d["starved"] == 20_000_000 and d["idle_held"] == 10_000_000


def test_summary_only_run_uses_dcgm_job_stats_and_is_marked():
    # shaped like ledger.capture.sources.dcgm.summary_fields(): values / missing / processes
    payload = {"source": "dcgm_job_stats", "values": {"sm_util_pct_avg": 60.0, "sm_clock_mhz_avg": 1584.0,
                                                      "slowdown_power_pct": 30.0, "slowdown_thermal_pct": 10.0,
                                                      "slowdown_sync_boost_pct": 0.0, "processes": 1},
               "missing": {"slowdown_board_limit_pct": "not_supported"}, "processes": [{"pid": 10140}]}
    acc = attribute_summary((0.0, 3600.0), payload, rated_clock_mhz=1980.0)
    d = acc.as_dict()
    assert acc.fidelity == "summary" and int(acc.buckets.sum()) == acc.paid_nanohours == 10**9
    assert d["delivered"] == 480_000_000  # 0.6 activity x 0.8 clock ratio
    assert d["underutilized"] == 400_000_000
    assert d["throttled.power_cap"] + d["throttled.thermal"] == 120_000_000
    assert d["throttled.power_cap"] == 3 * d["throttled.thermal"]  # split by the violation times 30 : 10
    empty = attribute_summary((0.0, 3600.0), {"values": {}, "missing": {"sm_util_pct_avg": "not_supported"}})
    assert empty.as_dict()["unknown"] == 10**9 and empty.unknown_causes["field_missing"] == 10**9


def test_sku_table_has_every_required_part_with_a_source():
    table = builtin_table()
    for name, key in [("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
                      ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"), ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
                      ("NVIDIA H200", "H200-141GB"), ("NVIDIA B200", "B200-180GB"), ("NVIDIA GB200", "GB200"),
                      ("NVIDIA L40S", "L40S"), ("AMD Instinct MI250X", "MI250X"),
                      ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI325X", "MI325X")]:
        r = match_sku(name, table)
        assert r is not None and r.key == key, name
        assert r.rated_sm_clock_mhz and r.tdp_w and r.peak_bf16_dense_tflops and "http" in r.source
    assert match_sku("Tesla T4", table) is None


def test_site_overrides_a_rating_and_adds_a_part(tmp_path):
    f = tmp_path / "skus.toml"
    f.write_text('[T4]\nrated_sm_clock_mhz = 1590\ntdp_w = 70\nmatch = ["Tesla T4"]\nsource = "site"\n')
    t = site_table({"skus": {"H100-SXM5-80GB": {"rated_sm_clock_mhz": 1755}}, "skus_file": str(f)})
    assert t["H100-SXM5-80GB"].rated_sm_clock_mhz == 1755 and t["H100-SXM5-80GB"].tdp_w == 700
    assert match_sku("Tesla T4", t).tdp_w == 70
    assert len(BUCKETS) == 10


def test_measured_samples_beat_a_gap_and_unmeasured_ones_yield_to_it():
    # a run-wide epilog_missing gap (the hook never ran) over a run the collector did sample for 108 s of 216
    t = [0.0, 36.0, 72.0, 108.0]
    sa = SampleArrays.from_columns(t=t, dt=[36.0] * 4, sm_active=[1.0, 1.0, 1.0, None])
    acc = attribute_device((0.0, 216.0), sa, unknown=[(0.0, 216.0, "epilog")])
    d = acc.as_dict()
    assert d["delivered"] == 30_000_000  # the three measured samples count
    assert acc.gap_nanohours == {"epilog": 30_000_000}  # the gap keeps the unmeasured sample and the uncovered rest
    assert acc.unknown_causes == {"field_missing": 0, "no_telemetry": 0}
    assert int(acc.buckets.sum()) == acc.paid_nanohours == 60_000_000
