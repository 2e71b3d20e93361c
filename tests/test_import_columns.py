"""The import's column path (pipeline.window_columns -> blocks.encode_columns, hours.aggregate_columns) stores
exactly what its reference, the row tuples (blocks.encode, hours.aggregate_rows), stores: the same sample block
bytes and the same device-hours, for every window of any timeline, and the same ledger for a whole import."""

from __future__ import annotations

import math
import sqlite3

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger.importers import pipeline, prometheus, synth
from ledger.telemetry import blocks, hours
from ledger.telemetry.timeline import FIELDS, build_timeline_arrays

T0 = 1_767_225_600.0
# values a field can hold after parsing: NaN (not measured), signed zeros, fractions, large and small magnitudes
value = st.one_of(st.just(math.nan), st.just(-0.0), st.just(0.0), st.floats(-1e6, 1e6, allow_nan=False),
                  st.sampled_from([0.25, 1.0, 7.0, 300.5, 2.0**40]))


@st.composite
def timelines(draw):  # noqa: ANN001, ANN201
    n = draw(st.integers(1, 40))
    steps = draw(st.lists(st.sampled_from([1.0, 15.0, 15.0, 60.0, 400.0, 1300.0]), min_size=n, max_size=n))
    times = T0 + np.cumsum([0.0, *steps[:-1]])
    arrays = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=8)) + ["sm_active"]:
        keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        t = times[np.array(keep, dtype=bool)] if any(keep) else times[:1]
        arrays[name] = (t, np.array([draw(value) for _ in t], dtype=np.float64))
    cadence = draw(st.sampled_from([None, 15.0]))
    return build_timeline_arrays("GPU-x", arrays, cadence=cadence)


def _same_hours(a: list, b: list) -> bool:
    return [repr(hours.values(h)) for h in a] == [repr(hours.values(h)) for h in b]   # NaN and -0.0 compared too


@settings(max_examples=60, deadline=None)
@given(timelines(), st.sampled_from([600.0, 3600.0, 6 * 3600.0]))
def test_every_window_seals_the_same_block_and_device_hours(tl, segment_seconds):
    opts = pipeline.ImportOptions(segment_seconds=segment_seconds)
    rows, cols = pipeline.sample_windows(tl, opts), pipeline.window_columns(tl, opts)
    assert cols is not None and sorted(cols) == sorted(rows)
    for w, seg_rows in rows.items():
        assert blocks.encode_columns(cols[w]).data == blocks.encode(seg_rows).data
        assert _same_hours(hours.aggregate_columns(cols[w]), hours.aggregate_rows(seg_rows))


def _import(tmp_path, name: str, collected, monkeypatch, reference: bool) -> dict:  # noqa: ANN001
    path = tmp_path / f"{name}.db"
    engine = db_mod.make_engine(f"sqlite:///{path}")
    db_mod.upgrade(engine)
    with monkeypatch.context() as m:
        if reference:
            m.setattr(pipeline, "window_columns", lambda tl, opts: None)
        pipeline.write(engine, collected)
    engine.dispose()
    con = sqlite3.connect(path)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in ("entries", "sample_blocks", "device_hours", "merkle_nodes")}
    finally:
        con.close()


def test_an_import_stores_the_same_ledger_by_either_path(tmp_path, monkeypatch):
    files = synth.write_query_range(tmp_path / "export", n_gpus=3, hours=13, cadence=60, jobs="k8s",
                                    holes=[(1, 3600, 1200), (2, 6 * 3600 - 300, 900)])
    collected = prometheus.read([str(f) for f in files])
    fast = _import(tmp_path, "columns", collected, monkeypatch, reference=False)
    slow = _import(tmp_path, "rows", collected, monkeypatch, reference=True)
    assert len(fast["sample_blocks"]) == 9 and len(fast["device_hours"]) == 3 * 13
    assert fast == slow
