"""The incremental query_range reader gives the reference parser's records and errors, whatever the chunking.

The reference is ``prometheus.parse_query_range(text)`` (``json.loads`` of the whole response). The streaming
reader (``prometheus_stream.read_query_range``) gets the same bytes through a stream that hands out random short
reads, with a window of a few dozen characters, so chunk and window boundaries fall inside keys, strings,
numbers, series and UTF-8 sequences; the collections (or the one-line errors) are equal. The real captures under
tests/fixtures/real/prometheus go through both, and ``prometheus.read`` (what ``analyze`` and ``import`` use)
streams a file on disk rather than reading it whole.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.importers import prometheus, prometheus_stream, synth
from ledger.importers.common import InputError
T0 = 1_793_577_600  # 2026-11-02
REAL = Path(__file__).parent / "fixtures" / "real" / "prometheus"


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


class _Trickle(io.RawIOBase):
    """A binary stream whose reads return at most the next of ``sizes`` bytes (cycled)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes, self.at, self.k = data, sizes, 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        step = self.sizes[self.k % len(self.sizes)]
        self.k += 1
        out = self.data[self.at:self.at + min(step, n if n >= 0 else step)]
        self.at += len(out)
        return out


def _snapshot(c) -> tuple:  # noqa: ANN001
    def floats(a) -> list:  # noqa: ANN001
        return ["nan" if math.isnan(x) else x for x in a]
    series_ = {d: {k: (floats(t), floats(v)) for k, (t, v) in f.items()} for d, f in c.series.items()}
    return (c.devices, series_, c.reasons, c.contexts, c.points, c.path, c.mapped, c.unmapped, c.warnings,
            c.skipped)


def _outcome(fn) -> tuple:  # noqa: ANN001
    try:
        return "ok", _snapshot(fn())
    except InputError as exc:
        return "error", str(exc)


def _reference(data: bytes) -> tuple:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "error", f"x.json: byte {exc.start}: not UTF-8 text"
    return _outcome(lambda: prometheus.parse_query_range(text, "x.json"))


def _streamed(data: bytes, sizes: list[int], monkeypatch) -> tuple:  # noqa: ANN001
    monkeypatch.setattr(prometheus_stream, "READ_CHARS", 48)
    try:
        return _outcome(lambda: prometheus_stream.read_query_range(_Trickle(data, sizes), "x.json",
                                                                    prometheus.add_series))
    except prometheus_stream.WholeFile:
        return _reference(data)   # what prometheus.read then does


sizes = st.lists(st.integers(1, 97), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents(), sizes, st.sampled_from(["", " ", "\n  ", "\r\n\t"]))
def test_random_responses_read_at_random_chunk_boundaries_equal_the_reference(monkeypatch, doc, chunks, pad):
    # documents() includes vectors, failed statuses, odd points, a series whose metric is a list, two
    # responses in one file (json.loads: "Extra data"); pad spreads whitespace through the structure
    text = doc.replace(", ", "," + pad).replace(": ", ":" + pad)
    data = (pad + text + pad).encode()
    assert _streamed(data, chunks, monkeypatch) == _reference(data)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(series(), min_size=1, max_size=3), st.integers(0, 10**6), sizes)
def test_a_response_cut_anywhere_gives_the_references_error(monkeypatch, result, cut, chunks):
    text = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}, indent=1)
    data = text[:cut % len(text)].encode()
    got = _streamed(data, chunks, monkeypatch)
    assert got == _reference(data)
    assert got[0] == "error" and "\n" not in got[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(series(), min_size=1, max_size=3), st.integers(0, 10**6), st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82"]),
       sizes)
def test_invalid_utf8_anywhere_is_the_first_error_as_in_a_whole_read(monkeypatch, result, at, bad, chunks):
    text = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result},
                       "note": "caf\u00e9 \u2014 \U0001f600"}).encode()
    i = at % len(text)
    data = text[:i] + bad + text[i:]
    assert _streamed(data, chunks, monkeypatch) == _reference(data)


@pytest.mark.parametrize("doc", [
    # keys in an order json.dumps(sort_keys=True) writes: data before status, result before resultType
    {"status": "error", "error": "bad query", "data": {"resultType": "matrix", "result": []}},
    {"data": {"result": [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0"}, "values": [[T0, "40"]]}],
              "resultType": "matrix"}, "status": "success"},
    {"data": {"resultType": "scalar", "result": [T0, "1"]}, "status": "success"},
    {"data": {"resultType": "matrix", "result": {}}},
    {"data": 5, "status": "success"},
    {"status": "success"},
])
def test_odd_but_valid_responses_equal_the_reference(monkeypatch, doc):
    for sort in (False, True):
        data = json.dumps(doc, sort_keys=sort).encode()
        assert _streamed(data, [5, 11], monkeypatch) == _reference(data)


def test_a_repeated_data_member_is_read_whole_with_json_loads_meaning(tmp_path):
    s = {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "UUID": "GPU-0"}, "values": [[T0, "40"]]}
    text = ('{"status": "success", "data": {"resultType": "matrix", "result": [' + json.dumps(s) + ']}, '
            '"data": {"resultType": "matrix", "result": []}}')
    with pytest.raises(prometheus_stream.WholeFile):
        prometheus_stream.read_query_range(io.BytesIO(text.encode()), "x.json", prometheus.add_series)
    p = tmp_path / "x.json"
    p.write_text(text)
    assert prometheus.read(p).points == 0 == prometheus.parse_query_range(text, str(p)).points


def _response_documents() -> list:
    """The real captures that are query_range/query response documents (the others are not this reader's)."""
    return sorted(p for p in REAL.glob("*.json")
                  if p.read_bytes().lstrip().startswith(b"{") and prometheus.sniff(p.read_text()) == "json")


@pytest.mark.parametrize("path", _response_documents(), ids=lambda p: p.name)
def test_real_captures_read_the_same_streamed(monkeypatch, path):
    data = path.read_bytes()
    ref = _reference(data)
    assert _streamed(data, [7, 64, 3], monkeypatch) == ref
    assert _outcome(lambda: prometheus.read(path)) == _outcome(lambda: prometheus.parse(data.decode(), str(path)))


def test_the_window_stays_bounded_while_a_file_is_read(tmp_path, monkeypatch):
    files = synth.write_query_range(tmp_path / "x", n_gpus=24, hours=2, cadence=15, jobs="slurm",
                                    metrics=synth.DEFAULT_METRICS[:1])
    data = files[0].read_bytes()
    longest = max(len(json.dumps(s)) for s in json.loads(data)["data"]["result"])
    widest = []
    real_fill = prometheus_stream._Window.fill

    def fill(self, chars: int | None = None) -> bool:  # noqa: ANN001
        more = real_fill(self, chars)
        widest.append(len(self.buf))
        return more

    monkeypatch.setattr(prometheus_stream, "READ_CHARS", 4096)
    monkeypatch.setattr(prometheus_stream._Window, "fill", fill)
    got = prometheus.read(files[0])
    assert got.points == 24 * 480
    assert len(data) > 20 * longest      # the file is many series long ...
    assert max(widest) <= 4 * max(4096, longest)   # ... and never more than a few of them are held
    assert _snapshot(got) == _snapshot(prometheus.parse_query_range(data.decode(), str(files[0])))


def test_analyze_consuming_the_export_gives_the_same_analysis(tmp_path):
    from ledger.agents.export_analysis import analyze_collected

    files = synth.write_query_range(tmp_path / "x", n_gpus=8, hours=2, cadence=60, jobs="slurm",
                                    holes=[(2, 1800, 600)])
    kept = analyze_collected(prometheus.read(files)).to_json()
    consumed = prometheus.read(files)
    got = analyze_collected(consumed, consume=True).to_json()
    assert json.dumps(got, sort_keys=True) == json.dumps(kept, sort_keys=True)
    assert not consumed.series and len(consumed.devices) == 8   # the values went, the devices stayed


NV_REAL = Path(__file__).parent / "fixtures" / "real" / "nvidia_smi_csv"
NV_HEADER = ("timestamp, index, uuid, name, utilization.gpu [%], power.draw [W], clocks.sm [MHz], "
             "clocks_event_reasons.active, temperature.memory")


def _nv_loop(tmp_path: Path) -> Path:
    """A `nvidia-smi --query-gpu ... -l 1` capture: 2 GPUs, 300 ticks, the header repeated, a prompt, a bad value."""
    rows = ["$ nvidia-smi --query-gpu=... --format=csv -l 1"]
    for k in range(300):
        if k % 50 == 0:
            rows.append(NV_HEADER)
        rows += [f"2026/11/02 00:{k // 60:02d}:{k % 60:02d}.000, {g}, GPU-{g}, NVIDIA H100, {(k * 7 + g) % 101} %, "
                 f"{'lots' if k == 123 else f'{100 + k % 500}.25 W'}, 1980 MHz, 0x{k % 8:016x}, [N/A]"
                 for g in range(2)]
    p = tmp_path / "loop-source.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


@pytest.mark.parametrize("path", [*sorted(p for p in NV_REAL.iterdir() if not p.name.endswith(".source.txt")),
                                  "loop"], ids=lambda p: getattr(p, "name", p))
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_nvidia_smi_csv_captures_read_line_by_line_equal_the_parser(tmp_path, path, newline):
    from ledger.importers import nvidia_smi

    path = _nv_loop(tmp_path) if path == "loop" else path
    text = newline.join(path.read_text().splitlines()) + newline
    p = tmp_path / path.name
    p.write_bytes(text.encode())
    kw = {"start": T0, "interval": 1.0, "node": "n1"}
    assert _outcome(lambda: nvidia_smi.read(p, **kw)) == _outcome(lambda: nvidia_smi.parse(text, str(p), **kw))


def _export(tmp_path: Path, n_metrics: int = 4) -> list[Path]:
    return synth.write_query_range(tmp_path / "x", n_gpus=4, hours=1, cadence=15, jobs="slurm",
                                   metrics=synth.DEFAULT_METRICS[:n_metrics])


def test_files_parsed_by_workers_merge_to_what_one_process_reads(tmp_path):
    files = _export(tmp_path)
    calls = []
    parallel = prometheus.read(files, workers=2, while_reading=lambda: calls.append("w"))
    assert _snapshot(parallel) == _snapshot(prometheus.read(files, workers=0))
    assert calls == ["w"]                                   # the caller's work ran once, while they parsed
    assert parallel.points > 0 and len(parallel.devices) == 4


def test_a_bad_file_among_many_is_the_same_first_error_with_workers(tmp_path):
    files = _export(tmp_path, 5)
    files[2].write_text(files[2].read_text()[:500])         # cut short, in the middle of the export
    files[4].write_text("{\"status\": \"error\", \"error\": \"later\"}")
    errors = []
    for workers in (0, 2):
        with pytest.raises(InputError) as exc:
            prometheus.read(files, workers=workers)
        errors.append((str(exc.value), exc.value.path, exc.value.place, exc.value.message))
    assert errors[0] == errors[1] and str(files[2]) in errors[0][0]


def test_an_input_error_keeps_its_fields_across_processes():
    import pickle

    exc = InputError("x.json", "result[3] point 7", "timestamp 0 is before 2000")
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.path, back.place, back.message) == (str(exc), exc.path, exc.place, exc.message)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents())
def test_sorted_keys_are_read_in_two_passes_as_the_reference_reads_them(monkeypatch, doc):
    """`result` before `resultType` (jq -S, sort_keys): read from a file in two bounded passes, not whole."""
    monkeypatch.setattr(prometheus_stream, "READ_CHARS", 48)
    docs = [json.loads(d) for d in (doc, doc[:len(doc) // 2]) if _parses(d)]
    for d in docs:
        data = json.dumps(d, sort_keys=True).encode()
        try:
            got = _outcome(lambda: prometheus_stream.read_query_range(io.BytesIO(data), "x.json",
                                                                       prometheus.add_series))
        except prometheus_stream.WholeFile:
            assert not isinstance(d.get("data"), dict) or "resultType" not in d["data"]
            continue
        assert got == _reference(data)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_sorted_export_on_disk_is_read_with_a_bounded_window(tmp_path, monkeypatch):
    files = synth.write_query_range(tmp_path / "x", n_gpus=8, hours=2, cadence=15, jobs="slurm",
                                    metrics=synth.DEFAULT_METRICS[:1])
    p = files[0]
    p.write_text(json.dumps(json.loads(p.read_text()), sort_keys=True))
    assert p.read_text().index('"result"') < p.read_text().index('"resultType"')
    widest = []
    real_fill = prometheus_stream._Window.fill

    def fill(self, chars=None):  # noqa: ANN001, ANN202
        out = real_fill(self, chars)
        widest.append(len(self.buf))
        return out

    monkeypatch.setattr(prometheus_stream._Window, "fill", fill)
    monkeypatch.setattr(prometheus_stream, "READ_CHARS", 4096)
    got = prometheus.read(p, workers=0)
    assert _snapshot(got) == _snapshot(prometheus.parse_query_range(p.read_text(), str(p)))
    assert max(widest) < p.stat().st_size / 4   # never the whole file: a window of about one series


def test_an_archive_is_read_a_member_at_a_time_in_its_turn(tmp_path, monkeypatch):
    import tarfile

    files = _export(tmp_path, 4)
    tar = tmp_path / "export.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for f in files:
            tf.add(f, arcname=f.name)
    taken, parsed_when = [], []
    real_members, real_parse = prometheus._members, prometheus.parse

    def members(*args):  # noqa: ANN002, ANN202
        for item in real_members(*args):
            taken.append(item[0])
            yield item

    def parse(text, path, default_ts=None):  # noqa: ANN001, ANN202
        parsed_when.append(len(taken))
        return real_parse(text, path, default_ts)

    monkeypatch.setattr(prometheus, "_members", members)
    monkeypatch.setattr(prometheus, "parse", parse)
    got = prometheus.read(tar, workers=0)
    assert parsed_when == [1, 2, 3, 4]            # each member parsed before the next is read
    flat = prometheus.read(files, workers=0)
    assert _snapshot(got)[1] == _snapshot(flat)[1] and got.points == flat.points
    # an archive among files on disk: the same collection with workers, the members in their turn
    mixed = [files[0], tar, files[1]]
    assert _snapshot(prometheus.read(mixed, workers=2)) == _snapshot(prometheus.read(mixed, workers=0))
