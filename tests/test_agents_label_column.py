"""data.label_column (each sample's run label taken by pyarrow from the few labels, where they are strings) makes
the column data.label_column_reference's objects make: the same dtype, the same values, the same missing ones,
for labels of every kind (strings, numbers, None and NaN among them, all missing, none at all)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from ledger.agents.data import label_column, label_column_reference

LABELS = st.one_of(st.text(max_size=6), st.none(), st.just(float("nan")), st.integers(-3, 3),
                   st.sampled_from(["node:a", "job-1", "ns/pod", ""]))


def _frame(column) -> pd.DataFrame:   # noqa: ANN001 - how assign_runs uses it: a frame's column
    f = pd.DataFrame({"t": np.zeros(len(column))})
    f["label"] = column
    return f


@settings(max_examples=300, deadline=None)
@given(st.lists(LABELS, max_size=8), st.data())
def test_label_column_equals_the_reference(values, data):
    vals = np.array(values + [None], dtype=object)[:len(values)]   # an object array even of one kind
    rows = np.array(data.draw(st.lists(st.integers(-1, len(values) - 1), max_size=40)), dtype=np.int64)
    fast, plain = _frame(label_column(vals, rows)), _frame(label_column_reference(vals, rows))
    assert fast["label"].dtype == plain["label"].dtype
    pd.testing.assert_frame_equal(fast, plain)


def test_string_labels_take_the_fast_way():
    vals = np.array(["node:a", "node:b", None], dtype=object)
    rows = np.array([0, 0, 1, -1, 2, 1], dtype=np.int64)
    fast = label_column(vals, rows)
    assert not isinstance(fast, np.ndarray)               # not one Python object a sample
    pd.testing.assert_frame_equal(_frame(fast), _frame(label_column_reference(vals, rows)))
