"""The agents' daily rows name days as pandas' per-sample formatting would (accounting._day_names)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.agents.accounting import _day_names

edges = st.sampled_from([0.0, -0.5, 86399.9999999999, 86400.0, 1767225599.9999999, -86400.0000001])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=-2e9, max_value=4e9), edges), max_size=40))
def test_day_names_equal_strftime_per_sample(ts):  # noqa: ANN001
    t = pd.Series(np.array(ts, dtype=np.float64), index=np.arange(len(ts)) * 3)
    want = pd.to_datetime(t, unit="s", utc=True).dt.strftime("%Y-%m-%d")
    got = _day_names(t)
    assert list(got) == list(want) and list(got.index) == list(t.index)
