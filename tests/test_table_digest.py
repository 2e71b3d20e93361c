"""verify's segment digest from a decoded table's columns (ledger.telemetry.sealed.table_digest) is the reference
digest of the same rows as tuples (digest_normalised of blocks.table_rows), and so proofcheck's plain digest of
the carried columns; where the fast path declines (NaN, rows out of order, NULL times) it says so."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import proofcheck as pc
from ledger.telemetry import blocks
from ledger.telemetry.model import SAMPLE_COLUMNS
from ledger.telemetry.sealed import carried_columns, digest_normalised, table_digest

_floats = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0.0, -0.0, 1e16, 1e-5, 5e-324, 123456789.125, 1.0]))
_devices = st.sampled_from(["GPU-a", "GPU-b", "GPU-ü]", 'q"uote', "back\\slash", "tab\tnl\n", "Ω-\u2028", "0"])
_rows = st.lists(st.tuples(_devices, st.floats(0, 2e9, allow_nan=False), st.floats(0.001, 600, allow_nan=False),
                           st.one_of(st.none(), st.integers(0, 2**63 - 1)),
                           *[_floats] * (len(SAMPLE_COLUMNS) - 4)), min_size=1, max_size=80)


def _reference(table) -> tuple[str, tuple[str, ...]]:  # noqa: ANN001
    rows = blocks.table_rows(table)
    return digest_normalised(rows), carried_columns(rows)


def _table(rows: list[tuple]):  # noqa: ANN202 - rows as they stand, in the block's types
    schema = blocks.arrow_schema()
    return pa.Table.from_arrays([pa.array(list(v), type=f.type) for f, v in zip(schema, zip(*rows))], schema=schema)


def read_back(rows: list[tuple], without_extension: bool, batch_rows: int) -> tuple[list[tuple], object]:
    """(the rows, without the extension columns' values where asked, and their block as verify reads it back:
    one table per device, concatenated, written in record batches of ``batch_rows``)."""
    from unittest.mock import patch

    base = len(SAMPLE_COLUMNS) - 4
    if without_extension:
        rows = [(*r[:base], None, None, None, None) for r in rows]
    with patch.object(blocks, "BATCH_ROWS", batch_rows):
        block = blocks.encode(rows)
    return rows, pa.concat_tables([t for _d, t in blocks.decode(block.format, block.data)])


@settings(max_examples=150, deadline=None)
@given(_rows, st.booleans(), st.integers(1, 30))
def test_table_digest_is_the_reference_digest(rows, without_extension, batch_rows):
    """On a block as verify reads it back (one table per device, concatenated, several record batches)."""
    rows, table = read_back(rows, without_extension, batch_rows)
    fast = table_digest(table)
    assert fast == _reference(table)
    digest, carried = fast
    keep = [SAMPLE_COLUMNS.index(c) for c in carried]
    plain = sorted(([r[j] for j in keep] for r in rows), key=lambda r: (r[0], r[1]))
    assert digest == pc.samples_digest(plain)


@settings(max_examples=60, deadline=None)
@given(_rows)
def test_table_digest_declines_what_it_does_not_spell_as_the_reference(rows):
    """Rows out of (device, t) order, a NaN, a NULL time: None (the caller takes the reference), never a
    different digest."""
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    if ordered != rows and [(r[0], r[1]) for r in ordered] != [(r[0], r[1]) for r in rows]:
        assert table_digest(_table(rows)) is None
    else:
        assert table_digest(_table(rows)) == _reference(_table(rows))
    power = SAMPLE_COLUMNS.index("power_w")
    nan = [(*r[:power], math.nan, *r[power + 1:]) for r in ordered]
    assert table_digest(_table(nan)) is None
    with pytest.raises(ValueError):   # what verify names as "stored samples cannot be read"
        _reference(_table(nan))
    no_time = [(r[0], None, *r[2:]) for r in ordered]
    assert table_digest(_table(no_time)) is None
