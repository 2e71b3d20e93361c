"""The ECC hour flags (ledger.agents.drift.ecc_hour_flags) equal their plain reference on any series: the earlier
hours' median taken only where the other two tests pass changes no flag."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.agents import drift

counts = st.lists(st.integers(min_value=0, max_value=400), min_size=0, max_size=80)


@settings(max_examples=400, deadline=None)
@given(counts, st.data())
def test_ecc_hour_flags_equal_the_reference(row: list[int], data: st.DataObject) -> None:
    sib = data.draw(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), min_size=len(row),
                             max_size=len(row)))
    r, s = np.array(row, dtype=float), np.array(sib, dtype=float)
    fast, plain = drift.ecc_hour_flags(r, s), drift.ecc_hour_flags_reference(r, s)
    assert fast.dtype == plain.dtype == bool
    assert fast.tolist() == plain.tolist()


def test_a_rising_device_is_flagged_where_the_reference_flags_it() -> None:
    """A device whose count rises past its own history and its siblings' median: both flag the same hours, and
    there are enough of them to count (the case the rule exists for, not only the empty one)."""
    row = np.array([0, 1, 0, 1, 0, 0, 8, 20, 45, 90, 160], dtype=float)
    sib = np.zeros(len(row))
    fast = drift.ecc_hour_flags(row, sib)
    assert fast.tolist() == drift.ecc_hour_flags_reference(row, sib).tolist()
    assert fast.sum() >= drift.ECC_HOURS and not fast[:6].any()
