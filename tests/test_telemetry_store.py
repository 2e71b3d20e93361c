"""Samples sealed by segment entries: stored once, read back in order, and tamper-evident through verify."""

from __future__ import annotations

from ledger.telemetry.model import Sample
from ledger.telemetry.sealed import load_samples, segment_entry, write_segment
from ledger.chain.verify import verify


def _samples(dev="GPU-1", n=10):
    return [Sample(device=dev, t=1_760_000_000 + 10 * i, dt=10.0, sm_active=0.5, power_w=300.0 + i,
                   clock_reasons=0x4 if i % 3 == 0 else 0) for i in range(n)]


def test_segment_round_trip_and_idempotent(engine):
    s = _samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e)
    write_segment(engine, s, e)  # at-least-once
    back = load_samples(engine, ["GPU-1"])
    assert back == s
    assert load_samples(engine, ["GPU-1"], start=1_760_000_015, end=1_760_000_030) == s[1:3]
    assert verify(engine).ok


# Tamper evidence and append-only storage, for blocks and legacy rows alike: tests/test_sample_blocks.py.
