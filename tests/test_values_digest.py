"""The values digest a segment entry seals beside ``samples_sha256`` (ledger.telemetry.sealed: values_sha256).

Its fast paths (rows through numpy, a spool's checked columns, a decoded block's Arrow buffers) are the plain
reference's bytes; verify checks a segment against it where the entry seals it, against the canonical
``samples_sha256`` where it does not (a ledger written before it) and against both with ``--deep``; intake
refuses a spool segment whose values_sha256 does not describe its rows. The attacks: a value changed in a block
re-encoded with its sha256 fixed up, two segments' blocks swapped, a block re-encoded with the same samples."""

from __future__ import annotations

import json
import math
import time
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import store
from ledger.chain.entries import Entry, Kind, make_entry
from ledger.chain.verify import verify
from ledger.ingest import intake
from ledger.receipts.auto import verify_checks
from ledger.telemetry import blocks
from ledger.telemetry.model import SAMPLE_COLUMNS, Sample
from ledger.telemetry.sealed import (
    carried_columns, sample_row_values, segment_entry, table_values_digest, values_digest, values_digest_reference,
    write_segment,
)

from tests.test_table_digest import _rows, _table, read_back


@settings(max_examples=150, deadline=None)
@given(_rows, st.booleans(), st.integers(1, 30))
def test_every_path_gives_the_reference_digest(rows, without_extension, batch_rows):
    """Rows through numpy, and a block as verify reads it back (one table per device, several record batches)."""
    rows, table = read_back(rows, without_extension, batch_rows)
    reference = values_digest_reference(rows)
    assert values_digest(rows) == reference
    assert table_values_digest(table) == (reference, carried_columns(rows))
    one = sorted(((rows[0][0], *r[1:]) for r in rows), key=lambda r: r[1])   # a spool's checked rows: one device
    assert values_digest(_checked(one)) == values_digest_reference(one)


def _checked(rows):
    """Rows as intake hands them to the shipper (blocks.Checked: the float columns built, NaN where None)."""
    import numpy as np

    cols = list(zip(*rows))
    values = np.array([[math.nan if v is None else float(v) for v in col] for col in cols[1:]], dtype=np.float64)
    t = values[0]
    return blocks.Checked(list(rows), cols[0], values, len(set(cols[0])) == 1 and bool((t[1:] >= t[:-1]).all()))


@settings(max_examples=100, deadline=None)
@given(_rows, st.integers(0, len(SAMPLE_COLUMNS) - 1), st.integers(0, 79))
def test_the_digest_sees_every_value(rows, column, row):
    """Any one value changed (or set to NULL, or a NULL set) changes the digest; so does a device's name."""
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    i = row % len(ordered)
    before = ordered[i][column]
    if column == 0:
        after = before + "x"
    elif column == 3:
        after = 1 if before is None else None if before else before + 1
    elif column in (1, 2):
        after = before + 1.0 if before + 1.0 != before else before * 2 + 1.0
    else:
        after = 0.5 if before is None or before != 0.5 else None
    changed = [*ordered[:i], (*ordered[i][:column], after, *ordered[i][column + 1:]), *ordered[i + 1:]]
    assert values_digest_reference(changed) != values_digest_reference(ordered)


def test_minus_zero_is_not_zero_and_a_null_is_not_zero():
    row = ("GPU-a", 1.0, 1.0, None, *[None] * (len(SAMPLE_COLUMNS) - 4))
    power = SAMPLE_COLUMNS.index("power_w")
    with_value = [(*row[:power], v, *row[power + 1:]) for v in (0.0, -0.0, None)]
    assert len({values_digest_reference([r]) for r in with_value}) == 3


def test_a_decoded_table_out_of_order_is_left_to_the_reference():
    rows = [("GPU-b", 2.0, 1.0, None, *[1.0] * (len(SAMPLE_COLUMNS) - 4)),
            ("GPU-a", 1.0, 1.0, None, *[1.0] * (len(SAMPLE_COLUMNS) - 4))]
    assert table_values_digest(_table(rows)) is None
    assert table_values_digest(_table(sorted(rows))) == (values_digest_reference(rows), carried_columns(rows))


# --- verify ---------------------------------------------------------------------------------------------------

def _samples(dev="GPU-1", n=10, t0=1_760_000_000.0):
    return [Sample(device=dev, t=t0 + 10 * i, dt=10.0, sm_active=0.5, power_w=300.0 + i,
                   clock_reasons=0x4 if i % 3 == 0 else 0, fb_used_mib=None if i == 4 else 2048.0)
            for i in range(n)]


def _without_values_digest(e: Entry) -> Entry:
    """The segment entry as a writer before values_sha256 sealed it."""
    data = e.data
    del data["values_sha256"]
    return make_entry(Kind.TELEMETRY_SEGMENT, e.ts, data, ts_end=e.ts_end, node=e.node, device=e.device,
                      source=e.source)


def _replace_block(engine, segment_id, block):
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER IF EXISTS sample_blocks_no_update"))
        else:
            conn.execute(text("DROP TRIGGER IF EXISTS sample_blocks_no_update_delete ON sample_blocks"))
        conn.execute(text("UPDATE sample_blocks SET data = :d, sha256 = :h, format = :f WHERE segment_id = :s"),
                     {"d": block.data, "h": block.sha256, "f": block.format, "s": segment_id})


def _problems(engine, deep=False):
    return [(p.seq, p.entry_id, p.reason) for p in verify(engine, checks=verify_checks(deep=deep)).problems]


def _segments(engine):
    return [(ce.seq, ce.entry.entry_id) for ce in store.iter_entries(engine, kinds=[Kind.TELEMETRY_SEGMENT])]


@pytest.mark.parametrize("sealed", [True, False], ids=["values_sha256", "before_values_sha256"])
def test_a_value_changed_in_a_re_encoded_block_is_named_at_its_segment(engine, sealed):
    """The block re-encoded with one value changed and its stored sha256 fixed up: named by the values digest
    where the entry seals one, by the canonical digest where it does not (an older ledger), and by --deep."""
    s = _samples()
    e = segment_entry(s, node="n1", source="test")
    write_segment(engine, s, e if sealed else _without_values_digest(e))
    [(seq, sid)] = _segments(engine)
    [ce] = store.iter_entries(engine, kinds=[Kind.TELEMETRY_SEGMENT])
    assert ("values_sha256" in ce.entry.data) is sealed
    assert _problems(engine) == [] and _problems(engine, deep=True) == []
    rows = [sample_row_values(x) for x in s]
    power = SAMPLE_COLUMNS.index("power_w")
    rows[5] = (*rows[5][:power], rows[5][power] + 1e-9, *rows[5][power + 1:])
    _replace_block(engine, sid, blocks.encode(rows))
    named = [(seq, sid, "samples do not match the segment digest")]
    assert _problems(engine) == named
    assert _problems(engine, deep=True) == named


def test_two_segments_blocks_swapped_are_both_named(engine):
    a, b = _samples("GPU-a"), _samples("GPU-b", t0=1_760_000_003.0)
    for s in (a, b):
        write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    (seq_a, sid_a), (seq_b, sid_b) = _segments(engine)
    block_a, block_b = (blocks.encode([sample_row_values(x) for x in s]) for s in (a, b))
    _replace_block(engine, sid_a, block_b)
    _replace_block(engine, sid_b, block_a)
    reason = "samples do not match the segment digest"
    assert _problems(engine) == [(seq_a, sid_a, reason), (seq_b, sid_b, reason)]


def test_a_stored_byte_changed_is_named(engine):
    """One byte of the block changed, its stored sha256 left: named before decoding; fixed up as well: the block
    no longer decodes or its values differ, named at the segment either way."""
    import hashlib

    s = _samples(n=40)
    write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    [(seq, sid)] = _segments(engine)
    good = blocks.encode([sample_row_values(x) for x in s])
    caught = 0
    for at in range(0, len(good.data), max(1, len(good.data) // 25)):
        data = good.data[:at] + bytes([good.data[at] ^ 0x10]) + good.data[at + 1:]
        _replace_block(engine, sid, blocks.Block(good.format, good.rows, good.sha256, data))
        assert [(p[0], p[1]) for p in _problems(engine)] == [(seq, sid)]
        _replace_block(engine, sid, blocks.Block(good.format, good.rows, hashlib.sha256(data).hexdigest(), data))
        found = _problems(engine)
        # a byte Arrow never reads (padding, an unread metadata field) changes nothing the samples hold
        assert len(found) <= 1 and all((p[0], p[1]) == (seq, sid) for p in found)
        caught += bool(found)
    assert caught


def test_a_block_re_encoded_with_the_same_samples_verifies(engine):
    """Storage is not evidence: other bytes holding the same samples (another batching here, as another pyarrow
    build might write them) are the same segment for both digests."""
    s = _samples("GPU-a", 30) + _samples("GPU-b", 30)
    write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    [(_seq, sid)] = _segments(engine)
    with patch.object(blocks, "BATCH_ROWS", 7):
        other = blocks.encode([sample_row_values(x) for x in s])
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT data FROM sample_blocks")).scalar()
    assert other.data != stored
    _replace_block(engine, sid, other)
    assert _problems(engine) == [] and _problems(engine, deep=True) == []


def test_deep_checks_the_canonical_digest_where_the_values_digest_is_sealed(engine):
    """An entry whose two digests disagree (a writer that sealed another batch's values digest): the default
    check trusts the values digest the chain seals, --deep re-derives samples_sha256 and names the segment."""
    s, other = _samples(), _samples(n=9)
    e = segment_entry(s, node="n1", source="test")
    data = e.data
    data["values_sha256"] = values_digest([sample_row_values(x) for x in s])
    data["samples_sha256"] = segment_entry(other, node="n1", source="test").data["samples_sha256"]
    forged = make_entry(Kind.TELEMETRY_SEGMENT, e.ts, data, ts_end=e.ts_end, node=e.node, device=e.device,
                        source=e.source)
    write_segment(engine, s, forged)
    [(seq, sid)] = _segments(engine)
    assert _problems(engine) == []
    assert _problems(engine, deep=True) == [(seq, sid, "samples do not match the segment digest")]


def test_an_edited_values_digest_breaks_the_chain(engine):
    s = _samples()
    write_segment(engine, s, segment_entry(s, node="n1", source="test"))
    [(seq, sid)] = _segments(engine)
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER IF EXISTS entries_no_update"))
        else:
            conn.execute(text("DROP TRIGGER IF EXISTS entries_no_update_delete ON entries"))
        payload = conn.execute(text("SELECT payload FROM entries WHERE entry_id = :s"), {"s": sid}).scalar()
        data = json.loads(payload)
        data.pop("values_sha256")
        conn.execute(text("UPDATE entries SET payload = :p WHERE entry_id = :s"),
                     {"p": json.dumps(data, sort_keys=True, separators=(",", ":")), "s": sid})
    assert [p[0] for p in _problems(engine)] == [seq]


# --- intake ---------------------------------------------------------------------------------------------------

def _record(samples, **payload_changes):
    e = segment_entry(samples, node="n1", source="collector")
    data = e.data
    data.update(payload_changes)
    data = {k: v for k, v in data.items() if v is not None}
    e = make_entry(Kind.TELEMETRY_SEGMENT, e.ts, data, ts_end=e.ts_end, node=e.node, device=e.device,
                   source=e.source)
    rec = e.to_record()
    rec["samples"] = [list(sample_row_values(x)) for x in samples]
    return rec


@pytest.mark.parametrize("samples", [_samples(), _samples("GPU-b", 3) + _samples("GPU-a", 4)],
                         ids=["one_device_in_order", "two_devices"])
def test_intake_checks_values_sha256_where_a_record_has_it(samples):
    now = time.time() + 86_400 * 365 * 3
    entry, rows = intake.check_record(json.loads(json.dumps(_record(samples))), now)
    assert entry.data["values_sha256"] == values_digest_reference(rows)
    intake.check_record(json.loads(json.dumps(_record(samples, values_sha256=None))), now)   # an older collector
    wrong = values_digest_reference([sample_row_values(x) for x in samples[:-1]])
    with pytest.raises(intake.Refused, match="values_sha256"):
        intake.check_record(json.loads(json.dumps(_record(samples, values_sha256=wrong))), now)


def test_intake_checked_columns_path_keeps_large_clock_reasons_exact():
    """A clock-reason mask past 2^53 (not exact as a float): the digest is taken from the rows."""
    s = [Sample(device="GPU-1", t=1_760_000_000.0 + i, dt=1.0, clock_reasons=2 ** 60 + i) for i in range(3)]
    now = time.time() + 86_400 * 365 * 3
    entry, rows = intake.check_record(json.loads(json.dumps(_record(s))), now)
    assert entry.data["values_sha256"] == values_digest_reference(rows)
    plus_one = [Sample(device="GPU-1", t=1_760_000_000.0 + i, dt=1.0, clock_reasons=2 ** 60 + i + (i == 1))
                for i in range(3)]
    with pytest.raises(intake.Refused, match="values_sha256"):
        intake.check_record(json.loads(json.dumps(_record(
            s, values_sha256=values_digest_reference([sample_row_values(x) for x in plus_one])))), now)
