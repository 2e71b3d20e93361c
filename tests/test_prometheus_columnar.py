"""The columnar (DuckDB) query_range reader gives the same collection as the per-value JSON path, or declines.

Random query_range documents, plain and odd (NaN / Inf / N/A values, null points, wrong arity, string times,
a vector, a failed status, an error-free empty result, two documents in one file), are read by
``prometheus.read`` with and without the columnar reader: the collections are equal, and an input the
per-value path rejects is rejected with the same message either way.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.importers import prometheus, prometheus_columnar
from ledger.importers.common import InputError

T0 = 1_793_577_600  # 2026-11-02


def _snapshot(c) -> tuple:  # noqa: ANN001
    def floats(a) -> list:  # noqa: ANN001
        return ["nan" if math.isnan(x) else x for x in a]
    series = {d: {k: (floats(t), floats(v)) for k, (t, v) in f.items()} for d, f in c.series.items()}
    return c.devices, series, c.reasons, c.contexts, c.points, c.path


def _read_both(tmp_path, docs: list[str]) -> tuple:  # noqa: ANN001
    paths = []
    for i, text in enumerate(docs):
        p = tmp_path / f"m{i}.json"
        p.write_text(text)
        paths.append(str(p))
    outcomes = []
    for columnar in (True, False):
        saved = prometheus_columnar.read_files
        if not columnar:
            prometheus_columnar.read_files = lambda names, add: {}
        try:
            outcomes.append(("ok", _snapshot(prometheus.read(paths))))
        except InputError as exc:
            outcomes.append(("error", str(exc)))
        finally:
            prometheus_columnar.read_files = saved
    return outcomes[0], outcomes[1]


values = st.one_of(
    st.floats(min_value=0, max_value=1, allow_nan=False).map(lambda x: f"{x:.6f}"),
    st.integers(0, 700).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "N/A", "", " 0.5", "1e400", "-3", "9223372036854775794"]),
    st.floats(min_value=0, max_value=500, allow_nan=False),   # a number instead of a string
)
points = st.one_of(
    st.tuples(st.integers(0, 400).map(lambda i: T0 + 15 * i), values).map(list),
    st.sampled_from([None, [T0], [T0, "0.5", "x"], [str(T0), "0.5"], [True, "0.5"], [T0 + 0.5, None]]),
)
metrics = st.sampled_from(["DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                           "DCGM_FI_DEV_SM_CLOCK", "not_a_dcgm_metric"])


@st.composite
def series(draw) -> dict:  # noqa: ANN001
    gpu = draw(st.integers(0, 3))
    labels = {"__name__": draw(metrics), "gpu": str(gpu), "UUID": f"GPU-{gpu}", "Hostname": "n1"}
    if draw(st.booleans()):
        labels["hpc_job"] = "42"
    plain = draw(st.booleans())
    ts = sorted(set(draw(st.lists(st.integers(0, 400), max_size=30))))
    pts = ([[T0 + 15 * i, f"{(i % 10) / 10:.1f}"] for i in ts] if plain
           else draw(st.lists(points, max_size=12)))
    return {"metric": labels, "values": pts}


@st.composite
def documents(draw) -> str:  # noqa: ANN001
    doc = {"status": "success", "data": {"resultType": "matrix", "result": draw(st.lists(series(), max_size=4))}}
    odd = draw(st.sampled_from(["none", "none", "none", "vector", "status_error", "status_null", "no_status",
                                "two_docs", "metric_list"]))
    if odd == "vector":
        doc["data"]["resultType"] = "vector"
    elif odd == "status_error":
        doc["status"] = "error"
    elif odd == "status_null":
        doc["status"] = None
    elif odd == "no_status":
        del doc["status"]
    elif odd == "metric_list" and doc["data"]["result"]:
        doc["data"]["result"][0]["metric"] = ["a"]
    text = json.dumps(doc)
    return text + text if odd == "two_docs" else text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(documents(), min_size=1, max_size=3))
def test_columnar_reader_equals_the_per_value_path(tmp_path, docs):  # noqa: ANN001
    columnar, per_value = _read_both(tmp_path, docs)
    assert columnar == per_value


def test_plain_export_takes_the_columnar_path(tmp_path):
    from ledger.importers import synth

    files = synth.write_query_range(tmp_path / "x", n_gpus=2, hours=1, cadence=15, jobs="slurm",
                                    metrics=synth.DEFAULT_METRICS[:3])
    got = prometheus_columnar.read_files({str(f): f.read_text() for f in files}, prometheus.add_series_columns)
    assert set(got) == {str(f) for f in files}
    assert sum(c.points for c in got.values()) == 2 * 240 * 3
    columnar, per_value = _read_both(tmp_path, [f.read_text() for f in files])
    assert columnar == per_value and columnar[0] == "ok"


@pytest.mark.parametrize("text", ["{not json", '{"status": "success", "data": {"resultType": "matrix", '
                                  '"result": [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP"}, "values": 5}]}}'])
def test_malformed_files_are_declined_and_explained_by_the_per_value_path(tmp_path, text):
    columnar, per_value = _read_both(tmp_path, [text])
    assert columnar == per_value and columnar[0] == "error"
