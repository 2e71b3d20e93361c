"""The column-wise capture parsers (ledger/importers/columnar.py, the capture importers' speed trick) give the
plain parsers' collection, field for field, on generated captures: amd-smi's watch banner, CRLF, headers repeated
and changed, blank lines, ``N/A`` / ``N/W`` cells, DCGM blank sentinels, negatives and fractions out of range,
unreadable cells, terminal noise, and restarts (a second wall-clock anchor); and the same error where the plain
parser stops."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ledger.importers import amdsmi, columnar, dmon
from ledger.importers.common import InputError


def common_blanks() -> set[float]:
    """Every DCGM blank the capture importers check, as floats (the values the lookup must find)."""
    from ledger.importers import common

    return {*map(float, common._FP64_BLANKS), *map(float, common._INT32_BLANKS)}

T0 = 1793577600.0   # 2026-11-02T00:00:00Z
DMON_COLS = ["SMACT", "POWER", "TOTEC", "GPUTL", "DVCCTR", "TMPTR", "MMTMP", "XIDER", "FOO"]
AMD_COLS = ["gfx_activity", "socket_power", "gfx_0_clk", "gfx_1_clk", "mem_0_clk", "hotspot", "mem", "used_vram",
            "total_correctable_count", "accumulation_counter", "ppt_violation_status",
            "socket_thermal_violation_status", "throttle_status", "extra_col"]


def _snapshot(c):  # noqa: ANN001, ANN202
    return {
        "series": {d: {f: (list(ts), [None if v != v else v for v in vs]) for f, (ts, vs) in fs.items()}
                   for d, fs in c.series.items()},
        "field_order": {d: list(fs) for d, fs in c.series.items()},
        "reasons": c.reasons, "devices": c.devices, "device_order": list(c.devices), "skipped": c.skipped,
        "examples": c.skipped_examples, "mapped": c.mapped, "unmapped": c.unmapped,
        "warnings": sorted(c.warnings), "segments": c.capture_segments, "span": c.span, "points": c.points,
        "cadence": c.cadence, "contexts": c.contexts, "source": c.source,
    }


def _outcome(parse, text: str, **kw):  # noqa: ANN001, ANN202
    try:
        return _snapshot(parse(text, "dmon-n1.txt", **kw))
    except InputError as exc:
        return ("error", str(exc))


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


number = st.one_of(st.integers(0, 5000).map(str), st.floats(0, 3000, allow_nan=False).map(lambda x: f"{x:.3f}"),
                   st.sampled_from(["0.5", "0.95", "1.2", "0", "-3", "1e3"]))
marker = st.sampled_from(["N/A", "N/W", "n/a", "-", "nan", "inf", "2147483632", "9223372036854775807",
                          "140737488355328"])
cell = st.one_of(number, number, number, marker, st.sampled_from(["abc", "1,2", "nan(1)", "Infinity", "+5", ".5", "NaN",
                                                                  "1_0", "1e400", "N/a"]))
noise = st.sampled_from(["^C", "$ dcgmi dmon -e 155", "dmon was stopped due to receiving a signal", "", "  ",
                         "garbage line here", "Error: something"])


@st.composite
def dmon_text(draw, cells=None, noises=None):  # noqa: ANN001, ANN201
    only_regular = cells is not None
    cell_ = cell if cells is None else cells
    noise_ = noise if noises is None else noises
    lines: list[str] = []
    t = T0
    for _seg in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            iv = draw(st.sampled_from([1000, 15000]))
            lines.append(f"# ipledger-start {_stamp(t)} node={draw(st.sampled_from(['n1', 'n2']))} interval_ms={iv}")
        cols = draw(st.lists(st.sampled_from(DMON_COLS), min_size=1, max_size=5, unique=True))
        gpus = draw(st.lists(st.sampled_from(["GPU 0", "GPU 1", "GPU 2", "GPU-I 3"]), min_size=1, max_size=3,
                             unique=True))
        for k in range(draw(st.integers(0, 12))):
            if k % 4 == 0:
                lines += ["#Entity   " + "  ".join(cols), "ID"]
            for g in gpus:
                lines.append(f"{g}  " + "  ".join(draw(cell_) if only_regular or draw(st.integers(0, 30)) else "garbage"
                                                   for _ in cols))
            if draw(st.integers(0, 6)) == 0:
                lines.append(draw(noise_))
        t += 3600
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    return sep.join(lines) + sep


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dmon_text(), st.booleans())
def test_dmon_column_wise_equals_the_plain_parser(text, given_start):
    kw = {"start": T0, "interval": 15.0} if given_start else {}
    assert _outcome(columnar.parse_dmon, text, **kw) == _outcome(dmon.parse, text, **kw)


regular = st.one_of(number, marker, st.sampled_from(["Infinity", "+5", ".5", "NaN", "5."]))
known_noise = st.sampled_from(["^C", "$ dcgmi dmon -e 155", "dmon was stopped due to receiving a signal", "",
                               "Error: something"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dmon_text(cells=regular, noises=known_noise))
def test_dmon_arrow_reads_the_common_capture_as_the_plain_parser(text):
    """Numbers, markers and known noise only: the pyarrow reading takes the capture (no fallback) and gives the
    plain parser's collection."""
    kw = {"start": T0, "interval": 15.0}
    plain = _outcome(dmon.parse, text, **kw)
    if isinstance(plain, tuple) or plain["points"] == 0:
        return
    got = _snapshot(columnar._dmon_arrow(text.splitlines(), "dmon-n1.txt", node=None, node_hint=None, **kw))
    assert got == plain


def test_dmon_flushes_in_bounded_batches_with_the_same_result(monkeypatch):
    rows = "".join(f"GPU {g} {100 + k % 7} {'N/A' if k % 11 == 0 else 0.5}\n" for k in range(300) for g in range(4))
    text = f"# ipledger-start {_stamp(T0)} node=n1 interval_ms=1000\n#Entity POWER SMACT\nID\n" + rows
    whole = _outcome(columnar.parse_dmon, text)
    monkeypatch.setattr(columnar, "FLUSH_ROWS", 7)
    assert _outcome(columnar.parse_dmon, text) == whole == _outcome(dmon.parse, text)


def test_dmon_same_error_as_the_plain_parser_on_a_time_out_of_range():
    text = "# ipledger-start 1990-01-01T00:00:00Z node=n1 interval_ms=1000\n#Entity FOO POWER\nID\nGPU 0 1 2\n"
    out = _outcome(columnar.parse_dmon, text)
    assert out == _outcome(dmon.parse, text) and out[0] == "error" and "column POWER" in out[1]


@st.composite
def amd_text(draw, cells=None, statuses=("ACTIVE", "NOT ACTIVE", "N/A", "", "weird")):  # noqa: ANN001, ANN201
    cell_ = st.one_of(cell, st.sampled_from(["421 W", "12 %", "1_0", "5."])) if cells is None else cells
    lines: list[str] = []
    t = T0
    status = st.sampled_from(statuses)
    for _seg in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            lines.append(f"# ipledger-start {_stamp(t)} node=mi-{draw(st.integers(1, 2))} interval_ms=15000")
        if draw(st.booleans()):
            lines.append("'CTRL' + 'C' to stop watching output:")
        cols = ["gpu"] + (["timestamp"] if draw(st.booleans()) else []) + \
            draw(st.lists(st.sampled_from(AMD_COLS), min_size=1, max_size=8, unique=True))
        gpus = draw(st.lists(st.sampled_from(["0", "1", "2"]), min_size=1, max_size=3, unique=True))
        for k in range(draw(st.integers(1, 8))):
            if k == 0 or draw(st.booleans()):
                lines.append(",".join(cols))
            for g in gpus:
                row = []
                for col in cols:
                    if col == "gpu":
                        row.append(g)
                    elif col == "timestamp":
                        row.append(draw(st.sampled_from([str(int(t + 15 * k)), "", _stamp(t + 15 * k)])))
                    elif "status" in col:
                        row.append(draw(status) if col != "throttle_status" else
                                   draw(st.sampled_from(["THROTTLED", "UNTHROTTLED", "N/A"])))
                    else:
                        row.append(draw(cell_))
                lines.append(",".join(row))
            if draw(st.integers(0, 8)) == 0:
                lines.append(draw(st.sampled_from(["", "^C", "$ amd-smi metric --csv"])))
        t += 3600
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    return sep.join(lines) + sep


odd_line = st.sampled_from(["  ", "\t", "   0,1,2  ", "3@node: hello", "10@gpu-host:~$ amd-smi metric --csv",
                            "# ipledger: node=mi-3", "# comment",
                            "GPU,TIMESTAMP", " gpu , timestamp ", "0,1", "1,2,3,4,5,6,7,8,9", "\u00e9t\u00e9",
                            "\u0661,2", "x\x1cy", "7\x0b8", "'CTRL' + 'C' to stop watching output", "^C"])


@st.composite
def amd_text_with_odd_lines(draw):  # noqa: ANN001, ANN201
    """A generated amd-smi capture with odd lines: spaces around rows, tabs, other line breaks, non-ASCII digits
    and letters, '@', a shell prompt, headers spelled otherwise, rows of other widths."""
    lines = draw(amd_text()).splitlines()
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(odd_line))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = draw(st.sampled_from([" ", "  "])) + lines[at] + draw(st.sampled_from(["", " ", "  "]))
    sep = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return sep.join(lines) + sep


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(amd_text(), amd_text_with_odd_lines()), st.booleans())
def test_amd_csv_column_wise_equals_the_plain_parser(text, given_start):
    kw = {"start": T0, "interval": 15.0, "node": None} if given_start else {"node_hint": "mi-9"}
    assert _outcome(columnar.parse_amdsmi, text, **kw) == _outcome(amdsmi.parse, text, **kw)


def test_the_project_generators_captures_read_the_same_both_ways(tmp_path, monkeypatch):
    """The report-on generator's files (what the bench reads): equal collections either way, and read by
    pyarrow (neither the plain parser nor the Python-list reading is what gives them)."""
    from bench.capture_fleet import generate, write_captures

    fl = generate(1, hours=24.0, cadence=600.0)
    for p in write_captures(fl, tmp_path, exporter=False):   # dmon and amd-smi files only
        text = p.read_text()
        plain, fast = (dmon.parse, columnar.parse_dmon) if p.name.startswith("dmon") else \
            (amdsmi.parse, columnar.parse_amdsmi)
        a = _outcome(plain, text)
        with monkeypatch.context() as m:
            m.setattr(columnar, "column_values", None)       # the slower readings would fail here
            m.setattr(amdsmi, "parse_csv", None)
            b = _outcome(fast, text)
        assert a == b and isinstance(a, dict) and a["points"] > 0, p.name
        if p.name.startswith("dmon"):     # read by pyarrow, not by the fallback
            kw = {"start": None, "interval": None, "node": None, "node_hint": None}
            assert _snapshot(columnar._dmon_arrow(text.splitlines(), "dmon-n1.txt", **kw)) == a


def test_column_values_keeps_each_markers_reason_beside_nan():
    """'N/A' is not available, 'nan' is nan, in one column read cell by cell ('Infinity' is no marker: the
    pyarrow reading leaves the column to column_values); the N/A cell was once recorded as 'nan'."""
    _v, text = columnar.column_values(["0", "nan", "N/A", "Infinity"])
    assert text == {1: "nan", 2: "not_available"}
    csv = "gpu,timestamp,gfx_activity\n0,1793584800,0\n1,1793584800,nan\n2,1793584800,N/A\n0,1793584815,Infinity\n"
    assert _outcome(columnar.parse_amdsmi, csv, node_hint="mi-9") == _outcome(amdsmi.parse, csv, node_hint="mi-9")


def test_column_values_reads_markers_and_refuses_what_clean_refuses():
    v, text = columnar.column_values(["1.5", "N/A", "n/w", "7"])
    assert np.isnan(v[1]) and v[3] == 7.0 and text == {1: "not_available", 2: "not_watched"}
    assert columnar.column_values(["1", "abc"]) is None
    with pytest.raises(InputError):
        columnar.parse_dmon("GPU 0 1\n", "x.txt")



@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=12), max_size=4),
       st.integers(0, 3), st.sampled_from([np.float64, np.int32]))
def test_numbers_from_buffers_equal_pyarrows_to_numpy(chunks, cut, dtype):
    """columnar.numbers (a column read from its buffers, no pandas import) is pyarrow's to_numpy, for chunked
    and sliced columns (an offset into the buffer) of both widths the parsers read."""
    import pyarrow as pa

    typ = pa.float64() if dtype is np.float64 else pa.int32()
    parts = [pa.array(np.array(c, dtype=np.float64) if dtype is np.float64 else
                      np.nan_to_num(np.array(c, dtype=np.float64), posinf=7, neginf=-7).clip(-9, 9).astype(np.int32),
                      type=typ) for c in chunks]
    col = pa.chunked_array(parts, type=typ)
    col = col.slice(min(cut, len(col)))
    got = columnar.numbers(col, dtype)
    want = col.to_numpy()
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=dtype is np.float64)
    one = col.combine_chunks()
    assert np.array_equal(columnar.numbers(one, dtype), one.to_numpy(zero_copy_only=False),
                          equal_nan=dtype is np.float64)


# --- the byte readings (columnar._amd_bytes, columnar._dmon_bytes): what `analyze` and `import` read files with ---

def _bytes_outcome(read, data: bytes, **kw):  # noqa: ANN001, ANN202
    try:
        return _snapshot(read(data, "dmon-n1.txt", **kw))
    except InputError as exc:
        return ("error", str(exc))


def _plain_amd(data: bytes, **kw):  # noqa: ANN202
    from ledger.importers.common import decode_text

    return _bytes_outcome(lambda d, p, **k: amdsmi.parse(decode_text(d, p), p, **k), data, **kw)


# what the byte reading takes whole (strict numbers, markers, statuses it knows): most examples exercise it
amd_common = amd_text(cells=st.one_of(st.integers(0, 5000).map(str), st.sampled_from(["0.5", "N/A", "12.25", "-3"])),
                      statuses=("ACTIVE", "NOT ACTIVE", "N/A"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(amd_text(), amd_text_with_odd_lines(), amd_text(cells=regular), amd_common, amd_common),
       st.booleans(), st.sampled_from(["utf-8", "latin-1"]))
def test_amd_bytes_equal_the_plain_parser(text, given_start, encoding):
    """The file's bytes read as `analyze` reads them (the byte reading, else the text one) give the plain
    parser's collection or its error; and where the byte reading takes the capture, it alone gives it."""
    kw = {"start": T0, "interval": 15.0, "node": None} if given_start else {"node_hint": "mi-9"}
    try:
        data = text.encode(encoding)
    except UnicodeEncodeError:
        data = text.encode("utf-8")
    want = _plain_amd(data, **kw)
    assert _bytes_outcome(columnar.parse_amdsmi_bytes, data, **kw) == want
    try:
        got = _snapshot(columnar._amd_bytes(data, "dmon-n1.txt", **kw))
    except (columnar._Irregular, InputError):
        return
    assert got == want


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dmon_text(), st.booleans())
def test_dmon_bytes_equal_the_plain_parser(text, given_start):
    kw = {"start": T0, "interval": 15.0} if given_start else {}
    want = _outcome(dmon.parse, text, **kw)
    try:
        got = _snapshot(columnar._dmon_bytes(text.encode(), "dmon-n1.txt", **kw))
    except columnar._Irregular:
        return
    assert got == want


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dmon_text(cells=regular, noises=known_noise), st.integers(3, 40))
def test_dmon_bytes_read_the_common_capture_in_any_blocks(text, flush_rows):
    """Numbers, markers and known noise: the byte reading equals the plain parser whatever its block size
    (FLUSH_ROWS splits a run of rows), CRLF or LF."""
    kw = {"start": T0, "interval": 15.0}
    want = _outcome(dmon.parse, text, **kw)
    old = columnar.FLUSH_ROWS
    columnar.FLUSH_ROWS = flush_rows
    try:
        got = _snapshot(columnar._dmon_bytes(text.encode(), "dmon-n1.txt", **kw))
    except columnar._Irregular:
        return
    finally:
        columnar.FLUSH_ROWS = old
    assert got == want


def test_read_dmon_and_read_amdsmi_equal_the_references_on_files(tmp_path):
    """The files the project ships (real captures, Path B fixtures) and odd ones (a CR alone, a tab, latin-1,
    trailing spaces, a MIG capture): the file readers give the reference readers' collection or error."""
    from pathlib import Path

    root = Path(__file__).parent / "fixtures"
    dmon_files = [p for p in root.rglob("*") if p.is_file() and "dmon" in p.name and not p.name.endswith(
        (".source.txt", ".md")) and "nvidia_smi" not in p.name]
    amd_files = [p for p in root.rglob("*") if p.is_file() and ("amd_smi" in str(p) or "amdsmi" in p.name)
                 and not p.name.endswith((".source.txt", ".md"))]
    odd = {"cr.txt": b"#Entity POWER\nID W\nGPU 0 1\rGPU 1 2\n", "tab.txt": b"#Entity POWER\nID W\nGPU 0\t1\n",
           "latin.txt": "#Entity POWER\nGPU 0 1 \u00e9\n".encode("latin-1"),
           "trail.txt": b"#Entity POWER SMACT \r\nID W\r\nGPU 0   1.5   0.25   \r\nGPU 1 2 0.5\r\n",
           "mig.txt": b"#Entity POWER\nGPU 0 100\nGPU-I 1 20\n", "empty.txt": b"  \n\n",
           "row_first.txt": b"GPU 0 100\n#Entity POWER\nGPU 0 100\n", "no_end.txt": b"#Entity POWER\nGPU 0 1 "}
    for name, data in odd.items():
        (tmp_path / name).write_bytes(data)
        (tmp_path / name.replace(".txt", ".csv")).write_bytes(
            data.replace(b"#Entity POWER", b"gpu,socket_power").replace(b"GPU ", b"").replace(b" ", b","))
    dmon_files += sorted(tmp_path.glob("*.txt"))
    amd_files += sorted(tmp_path.glob("*.csv"))
    kw = {"start": T0, "interval": 15.0}
    for p in dmon_files:
        assert _bytes_outcome(lambda d, _p, **k: columnar.read_dmon(p, **k), b"", **kw) == \
            _bytes_outcome(lambda d, _p, **k: dmon.read(p, **k), b"", **kw), p.name
    assert len(amd_files) >= 8
    for p in amd_files:
        assert _bytes_outcome(lambda d, _p, **k: columnar.read_amdsmi(p, **k), b"", **kw) == \
            _bytes_outcome(lambda d, _p, **k: amdsmi.read(p, **k), b"", **kw), p.name


def test_the_generators_captures_are_read_from_their_bytes(tmp_path):
    """What the bench reads takes the byte readings (neither falls back) and gives the plain parsers'."""
    from bench.capture_fleet import generate, write_captures

    fl = generate(2, hours=24.0, cadence=600.0)
    for p in write_captures(fl, tmp_path, exporter=False):
        data = p.read_bytes()
        if p.name.startswith("dmon"):
            got, want = columnar._dmon_bytes(data, str(p)), dmon.read(p)
        else:
            got, want = columnar._amd_bytes(data, str(p)), amdsmi.read(p)
        assert _snapshot(got) == _snapshot(want) and want.points > 0, p.name


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789.-", max_size=6), min_size=1, max_size=8))
def test_decimal_column_takes_exactly_the_strict_numbers(cells):
    """Among cells of digits, '.' and '-': the cast takes a column exactly when every cell is a strict number,
    and reads each as float() does."""
    import re

    import pyarrow as pa

    got = columnar.decimal_column(pa.array(cells, type=pa.string()).slice(0))
    strict = all(re.match(columnar._STRICT_NUMBER, x) for x in cells)
    assert (got is not None) == strict
    if strict:
        assert [float(x) for x in cells] == got.tolist()
    assert columnar.decimal_column(pa.array(cells + ["N/A"])) is None


class _State:
    def __init__(self, tick: int, seen: set, ticks: int = 0) -> None:
        self.tick, self.seen, self.ticks = tick, seen, ticks


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(0, 3), max_size=30), st.integers(-1, 5),
       st.sets(st.integers(0, 3)), st.booleans())
def test_tick_codes_follow_the_row_by_row_rule(k, raw, tick, seen_codes, regular):
    """The ticks in one step (the common capture) are the row-by-row rule's, state and all."""
    names = [f"GPU {i}" for i in range(k)]
    codes = list(range(k)) * (len(raw) // max(k, 1) + 1) if regular else [c % k for c in raw]
    codes = codes[:len(raw)] if not regular else codes
    seen = {names[c % k] for c in seen_codes} if tick >= 0 else set()
    want_state, out = _State(tick, set(seen)), []
    for g in (names[c] for c in codes):
        if g in want_state.seen or want_state.tick < 0:
            want_state.tick, want_state.seen = want_state.tick + 1, set()
            want_state.ticks = want_state.tick + 1
        want_state.seen.add(g)
        out.append(want_state.tick)
    state = _State(tick, set(seen))
    got = columnar.tick_codes(state, names, np.array(codes, dtype=np.int64))
    assert got.tolist() == out and (state.tick, state.seen, state.ticks) == \
        (want_state.tick, want_state.seen, want_state.ticks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from(sorted(common_blanks())),
                          st.floats(min(common_blanks()), max(common_blanks())),   # between two blanks
                          st.integers(-2**31, 2**31).map(float)), max_size=60))
def test_the_blank_lookup_is_isin(values):
    """common._among (the blank check's lookup, only the values inside the blanks' range) is np.isin."""
    from ledger.importers import common

    v = np.array(values, dtype=np.float64)
    for blanks in (common._FP64_BLANKS, common._INT32_BLANKS):
        assert np.array_equal(common._among(v, blanks), np.isin(v, blanks))
