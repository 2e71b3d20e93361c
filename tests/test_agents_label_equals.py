"""agents.common.label_equals (each label column factorized once, its codes compared) against pandas' own
``frame[col] == value``: the same rows, whatever the labels (strings, None, NaN, pandas' string dtype) and
whether the value is among them."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from ledger.agents.common import label_equals

label = st.one_of(st.sampled_from(["gpu-0", "gpu-1", "node-a", "", "0", "1"]), st.none(), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(st.lists(label, max_size=40), st.lists(st.sampled_from(["gpu-0", "gpu-1", "node-a", "", "0", "x"]),
                                              min_size=1, max_size=6), st.booleans())
def test_label_equals_is_pandas_equality(labels, values, as_string_dtype):
    col = pd.Series(labels, dtype="str" if as_string_dtype else object)
    frame = pd.DataFrame({"device": col, "other": np.arange(len(labels))})
    equals = label_equals(frame)
    for v in values:   # repeated: the second comparison reads the codes the first one made
        want = (frame["device"] == v).to_numpy(dtype=bool)
        got = equals("device", v)
        assert got.dtype == bool and np.array_equal(got, want), (labels, v)
