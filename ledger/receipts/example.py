"""The worked example of docs/method.md: one H100 for one hour across a month end, every bucket present.

:func:`example_entries` returns the entries and samples; :func:`load_example` writes them into a ledger.
Tests check that ``ipledger receipt`` prints exactly the hand-computed figures of the document.

Timeline (36-second samples, so every sample is exactly 0.01 GPU-hour = 10,000,000 nanohours)::

    block  samples  signal                                     -> buckets (GPU-hours)
    A      10       SM active 1.0, clock 1980/1980, no reason  -> delivered 0.10
    B      10       SM active 1.0, clock  990, SW thermal 0x20 -> delivered 0.05, thermal 0.05
    C       5       SM active 1.0, clock 1584, SW power 0x4    -> delivered 0.04, power_cap 0.01
    D       5       SM active 1.0, clock  990, app clocks 0x2  -> delivered 0.025, other 0.025
    E      10       SM active 0.5, clock 1980                  -> delivered 0.05, underutilized 0.05
    F      10       SM active 0.01, 1 process, 20 GiB FB       -> starved 0.10
    G      10       SM active 0.0, no process, 0 FB            -> idle_held 0.10
    H      (10)     no samples; unknown_interval collector down  -> unknown 0.10
    I      (10)     allocation suspended                       -> suspended 0.10 (beside paid)
    J      10       SM active 1.0, clock 1782, sync boost 0x10 -> delivered 0.09, sync_boost 0.01
    K      10       SM active 1.0, clock  990, HW slowdown 0x8 -> delivered 0.05, hw_slowdown 0.05
"""

from __future__ import annotations

import datetime as dt

from ..chain.entries import Entry, Kind, make_entry
from ..telemetry.model import Sample

START = dt.datetime(2026, 11, 30, 23, 30, tzinfo=dt.timezone.utc)
CADENCE = 36.0
UUID = "GPU-5e1f0c2a-0000-4000-8000-000000000001"
KEY = dict(cluster="hpc1", job_id="7001", run=0)
CONTRACT_TOML = """\
id = "example-contract"
version = "1"
currency = "USD"
unknown_policy = "credit"
billing_granularity_s = 1
effective_from = "2026-11-01T00:00:00Z"

[skus.H100-SXM5-80GB]
rate_per_gpu_hour = "2.00"
"""

# (samples, sm_active, sm_clock_mhz, clock_reasons, compute_procs, fb_used_mib) per block; None = a gap block
BLOCKS = [
    ("A", 10, 1.0, 1980.0, 0, 1, 30000.0),
    ("B", 10, 1.0, 990.0, 0x20, 1, 30000.0),
    ("C", 5, 1.0, 1584.0, 0x4, 1, 30000.0),
    ("D", 5, 1.0, 990.0, 0x2, 1, 30000.0),
    ("E", 10, 0.5, 1980.0, 0, 1, 30000.0),
    ("F", 10, 0.01, 1980.0, 0, 1, 20480.0),
    ("G", 10, 0.0, 345.0, 0x1, 0, 0.0),
    ("H", 10, None, None, None, None, None),
    ("I", 10, None, None, None, None, None),
    ("J", 10, 1.0, 1782.0, 0x10, 1, 30000.0),
    ("K", 10, 1.0, 990.0, 0x8, 1, 30000.0),
]

EXPECTED_HOURS = {
    "paid": 0.9, "delivered": 0.405, "underutilized": 0.05, "starved": 0.1, "idle_held": 0.1, "unknown": 0.1,
    "suspended": 0.1,
    "throttled": {"thermal": 0.05, "power_cap": 0.01, "hw_slowdown": 0.05, "sync_boost": 0.01, "other": 0.025},
}
EXPECTED_COST = {"paid": 1.80, "delivered": 0.81, "lost": 0.99, "billed_before_adjustments": 1.60,
                 "adjustments": -0.10, "billed_after_adjustments": 1.50}


def _at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def example_entries() -> tuple[list[Entry], list[Sample], dict[str, tuple[float, float]]]:
    """(run entries, samples, spans of the gap and suspended blocks in seconds from START)."""
    samples: list[Sample] = []
    spans: dict[str, tuple[float, float]] = {}
    t = 0.0
    t0 = START.timestamp()
    for name, n, act, clk, reasons, procs, fb in BLOCKS:
        if act is None:
            spans[name] = (t, t + n * CADENCE)
        else:
            for i in range(n):
                samples.append(Sample(device=UUID, t=t0 + t + i * CADENCE, dt=CADENCE, clock_reasons=reasons,
                                      sm_active=act, sm_clock_mhz=clk, compute_procs=float(procs),
                                      fb_used_mib=fb, gpu_util=min(1.0, act * 1.2), power_w=300.0))
        t += n * CADENCE
    end = t
    entries = [
        make_entry(Kind.ALLOCATION_STARTED, START, {"account": "physics", "user": "u1001", "partition": "gpu",
                                                    "qos": "normal", "nodes": ["gpu-a01"], "gpus": 1,
                                                    "tres": "gres/gpu=1"}, node="gpu-a01", source="hook.prolog",
                   **KEY),
        make_entry(Kind.DEVICE_BOUND, START, {"index": 0, "uuid": UUID, "sku": "NVIDIA H100 80GB HBM3",
                                              "vendor": "nvidia", "node": "gpu-a01"}, device=UUID, node="gpu-a01",
                   source="hook.prolog", **KEY),
        make_entry(Kind.UNKNOWN_INTERVAL, _at(spans["H"][0]), {"cause": "collector_down", "scope": "device",
                                                               "detail": "node collector not running"},
                   ts_end=_at(spans["H"][1]), device=UUID, node="gpu-a01", source="collector", **KEY),
        make_entry(Kind.ALLOCATION_SUSPENDED, _at(spans["I"][0]), {"reason": "scontrol suspend"},
                   ts_end=_at(spans["I"][1]), node="gpu-a01", source="hook.epilog", **KEY),
        make_entry(Kind.ALLOCATION_ENDED, _at(end), {"exit_code": 0, "state": "COMPLETED"}, node="gpu-a01",
                   source="hook.epilog", **KEY),
    ]
    return entries, samples, spans


def load_example(engine, with_contract: bool = True, with_adjustment: bool = True) -> dict:  # noqa: ANN001
    """Write the example into a ledger: run entries, the sealed samples, the contract, a 0.05 h credit."""
    import tomllib

    from ..chain.adjustments import adjustment_entry
    from ..chain.contracts import contract_entry, parse_contract
    from ..chain.store import append
    from ..telemetry.sealed import segment_entry, write_segment

    entries, samples, spans = example_entries()
    out = {"run": append(engine, entries[:2])}
    seg = segment_entry(samples, node="gpu-a01", source="example")
    write_segment(engine, samples, seg)
    append(engine, entries[2:])
    if with_contract:
        append(engine, [contract_entry(parse_contract(tomllib.loads(CONTRACT_TOML), "example contract"))])
    if with_adjustment:
        append(engine, [adjustment_entry(direction="credit", quantity="0.05h", reason="goodwill for the outage",
                                         by="ops@example.org", ts=_at(3600), **KEY)])
    out["gap_id"] = entries[2].entry_id
    out["segment_id"] = seg.entry_id
    return out
