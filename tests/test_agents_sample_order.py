"""agents.data.sample_frame returns samples in (device, t) order: a frame already in that order is kept as it
is (the shortcut), any other is sorted stably. Both give exactly what the stable sort gives, whatever the
devices, times, ties and missing times."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from ledger.agents.data import sample_frame

row = st.tuples(st.sampled_from(["n1/gpu0", "n1/gpu1", "n2/gpu0"]),
                st.one_of(st.sampled_from([0.0, 15.0, 30.0, 45.0]), st.just(float("nan"))))


@settings(max_examples=200, deadline=None)
@given(st.lists(row, max_size=25), st.booleans())
def test_sample_frame_order_is_the_stable_sort(rows, presorted):
    if presorted:
        rows = sorted(rows, key=lambda r: (r[0], np.inf if r[1] != r[1] else r[1]))
    raw = pd.DataFrame({"device": pd.Series([d for d, _ in rows], dtype=object),
                        "t": [t for _, t in rows], "sm_active": np.arange(len(rows), dtype=float)})
    want = raw.rename(columns={"sm_active": "sm"}).sort_values(["device", "t"], kind="stable") \
        .reset_index(drop=True)
    got = sample_frame(raw)
    pd.testing.assert_frame_equal(got, want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(["a", "b", "B", "", "n1/gpu1", "n1/gpu10", "n1/gpu2"]), st.none()),
                max_size=14))
def testdevices_in_order_is_pandas_monotonic_test(devices):
    """The shortcut's order test (from the column's codes) says what ``is_monotonic_increasing`` says."""
    from ledger.agents.data import devices_in_order

    col = pd.DataFrame({"device": np.array([*devices, "x"], dtype=object)[:len(devices)]})["device"]
    assert devices_in_order(col) == col.is_monotonic_increasing
