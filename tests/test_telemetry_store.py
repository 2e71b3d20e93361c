"""Samples sealed by segment entries: stored once, read back in order, and tamper-evident through verify."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.telemetry.model import Sample
from ledger.telemetry.store import load_samples, segment_entry, write_segment
from ledger.verify import verify


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


def test_edited_sample_fails_verify_on_its_segment(engine):
    s = _samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e)
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER samples_no_update"))
        else:
            conn.execute(text("DROP TRIGGER samples_no_update_delete ON samples"))
        conn.execute(text("UPDATE samples SET power_w = 1 WHERE t = 1760000050"))
    report = verify(engine)
    assert not report.ok and report.problems[0].seq == 1
    assert "digest" in report.problems[0].reason


def test_samples_refuse_update(engine):
    s = _samples(n=2)
    write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    with pytest.raises(Exception, match="append-only"):
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM samples"))
