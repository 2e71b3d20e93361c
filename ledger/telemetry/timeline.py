"""Per-device timelines with explicit gaps: raw readings in, contiguous samples and unknown intervals out.

Pure functions, no I/O. The rules (docs/telemetry.md, "Timelines"):

* Readings are sorted by time; duplicates at the same instant merge field by field; two *different* values
  for one field at one instant become ``None`` with the reason ``conflicting_duplicate``.
* Each sample covers from its instant up to the next sample. When the next sample is further away than the
  tolerance (``TOLERANCE_FACTOR`` x cadence), the sample covers one cadence and the rest of the hole becomes
  a :class:`Gap` (an ``unknown_interval`` in the ledger) with its cause.
* With a known span (the export's or the query's start and end), a missing head or tail longer than the
  tolerance is a gap too (cause ``edge_cause``, e.g. ``export_truncated``); shorter edges are outside what the
  source claims to have observed and are left out of the timeline's span.
* Counters (energy, ECC, row remaps) that go backwards are a :class:`CounterReset`: the raw reading is kept,
  and the delta across the reset is unknown (the ledger records it as an ``unknown_interval`` with cause
  ``counter_reset`` and scope ``field``).
* Values that are not measurements (``N/A``, ``Not Supported``, DCGM blank sentinels, NaN, infinities,
  negatives, fractions above 1) become ``None`` and are counted per field and reason in ``Timeline.missing``.

Invariants (property-tested): samples and gaps never overlap, are ordered, and together cover exactly
``[Timeline.start, Timeline.end)``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .model import EXTENSION_METRICS, METRICS, Sample

TOLERANCE_FACTOR = 3.0          # a hole longer than 3 cadences is unknown, not "covered by the last sample"
DEFAULT_CADENCE_S = 30.0        # dcgm-exporter's default collection interval; used only for a lone sample
FIELDS = ("clock_reasons", *METRICS, *EXTENSION_METRICS)
COUNTERS = frozenset({"energy_j", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate",
                      "ecc_dbe_aggregate"})
FRACTIONS = frozenset({"sm_active", "sm_occupancy", "tensor_active", "dram_active", "gpu_util", "mem_copy_util",
                       "fp64_active", "fp32_active", "fp16_active"})

# DCGM blank values (dcgmlib/dcgm_structs.h): BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED.
DCGM_INT64_BLANK = 9223372036854775792
DCGM_INT32_BLANKS = frozenset(range(2147483632, 2147483636))
DCGM_FP64_BLANKS = frozenset(140737488355328.0 + i for i in range(4))
INT64_BLANK_FLOAT = float(DCGM_INT64_BLANK) * (1 - 1e-15)

# Text a tool prints instead of a number, and the reason we record for it.
TEXT_REASONS = {
    "n/a": "not_available", "[n/a]": "not_available", "na": "not_available", "-": "not_available",
    "n/w": "not_watched", "not supported": "not_supported", "[not supported]": "not_supported",
    "not specified": "not_specified", "not found": "not_found", "insf. permission": "no_permission",
    "[insufficient permissions]": "no_permission", "unknown error": "unknown_error",
    "[unknown error]": "unknown_error", "[gpu is lost]": "gpu_lost", "[gpu requires reset]": "gpu_requires_reset",
    "": "empty", "nan": "nan", "+inf": "infinite", "-inf": "infinite", "inf": "infinite",
}


class BadValue(ValueError):
    """Text in a value position that is neither a number nor a known "not measured" marker."""


def clean(raw: object, field_name: str = "") -> tuple[float | None, str | None]:
    """One raw reading -> (value, None) or (None, reason). Raises :class:`BadValue` on unexplained text.

    Applied *before* unit conversion, so sentinels are recognised in the units the source printed.
    """
    if raw is None:
        return None, "absent"
    if isinstance(raw, bool):
        raise BadValue(f"boolean {raw!r}")
    if isinstance(raw, str):
        s = raw.strip()
        reason = TEXT_REASONS.get(s.lower())
        if reason is not None:
            return None, reason
        try:
            v = float(s)
        except ValueError:
            raise BadValue(f"not a number: {s[:40]!r}") from None
    elif isinstance(raw, (int, float)):
        v = float(raw)
        if isinstance(raw, int) and raw >= DCGM_INT64_BLANK:
            return None, "dcgm_blank"
    else:
        raise BadValue(f"unexpected {type(raw).__name__}")
    if math.isnan(v):
        return None, "nan"
    if math.isinf(v):
        return None, "infinite"
    if v >= INT64_BLANK_FLOAT:
        return None, "dcgm_blank"
    if v in DCGM_FP64_BLANKS:
        return None, "dcgm_blank"
    if field_name not in ("energy_j", "ops_16", "ops_32", "ops_64") and v in DCGM_INT32_BLANKS:   # counters
        return None, "dcgm_blank"
    if v < 0:
        return None, "negative"
    return v, None


def check_range(field_name: str, v: float | None) -> tuple[float | None, str | None]:
    """After unit conversion: fractions must lie in [0, 1] (a little slack for rounding)."""
    if v is not None and field_name in FRACTIONS and v > 1.0 + 1e-6:
        return None, "out_of_range"
    return v, None


@dataclass(frozen=True, slots=True)
class Gap:
    device: str
    start: float
    end: float
    cause: str
    detail: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class CounterReset:
    device: str
    field: str
    t_before: float
    t_after: float
    before: float
    after: float


@dataclass(frozen=True)
class Timeline:
    device: str
    cadence: float
    cadence_source: str                 # "given" | "inferred" | "default"
    tolerance_s: float
    start: float | None
    end: float | None
    samples: tuple[Sample, ...]
    gaps: tuple[Gap, ...]
    resets: tuple[CounterReset, ...]
    missing: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    rows: Sequence = ()    # the samples as normalised SAMPLE_COLUMNS rows (array path only; else empty)
    # The array path's samples as float64 columns: "t", "dt" and each field it has (NaN = None); else None.
    columns: Mapping[str, np.ndarray] | None = field(default=None, compare=False, repr=False)

    @property
    def covered_s(self) -> float:
        if self.columns is not None:   # the same left-to-right sum, without building the samples
            return sum(self.columns["dt"].tolist())
        return sum(s.dt for s in self.samples)

    @property
    def unknown_s(self) -> float:
        return sum(g.seconds for g in self.gaps)


class Deferred(Sequence):
    """A tuple built on first use: the array path's samples and rows, which export analysis never needs one by
    one (it reads ``Timeline.columns``). Its length is known without building it; it equals the same tuple."""

    __slots__ = ("_n", "_build", "_items")

    def __init__(self, n: int, build: Callable[[], tuple]) -> None:
        self._n, self._build, self._items = n, build, None

    def _all(self) -> tuple:
        if self._items is None:
            self._items = self._build()
            self._build = None
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # noqa: ANN001, ANN204
        return self._all()[i]

    def __iter__(self) -> Iterator:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Deferred, tuple)):
            return self._all() == (other._all() if isinstance(other, Deferred) else other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Deferred({self._all()!r})"


def timeline_columns(tl: Timeline) -> dict[str, np.ndarray]:
    """The timeline's samples as float64 columns ("t", "dt", and each field with a value; NaN = None): the
    array path's own, or read off the samples (the reference path)."""
    if tl.columns is not None:
        return dict(tl.columns)
    out = {"t": np.array([s.t for s in tl.samples], dtype=np.float64),
           "dt": np.array([s.dt for s in tl.samples], dtype=np.float64)}
    for name in FIELDS:
        vals = [getattr(s, name) for s in tl.samples]
        if any(v is not None for v in vals):
            out[name] = np.array([np.nan if v is None else v for v in vals], dtype=np.float64)
    return out


def infer_cadence(times: Iterable[float]) -> float | None:
    """Median positive spacing of the distinct instants (robust to a few holes), or None with < 2 instants."""
    ts = sorted(set(times))
    diffs = [b - a for a, b in zip(ts, ts[1:]) if b - a > 0]
    return float(median(diffs)) if diffs else None


def merge_readings(series: Mapping[str, Iterable[tuple[float, float | None]]],
                   missing: dict[str, dict[str, int]] | None = None) -> dict[float, dict[str, float | None]]:
    """{field: [(t, value|None), ...]} -> {t: {field: value}}; conflicting duplicates become None."""
    missing = missing if missing is not None else {}
    by_t: dict[float, dict[str, float | None]] = defaultdict(dict)
    conflicts: set[tuple[float, str]] = set()
    for name, points in series.items():
        if name not in FIELDS:
            raise ValueError(f"unknown sample field {name!r}")
        for t, v in points:
            row = by_t[float(t)]
            if name in row and (t, name) not in conflicts:
                old = row[name]
                same = (old is None and v is None) or (old is not None and v is not None and
                                                       math.isclose(old, v, rel_tol=1e-12, abs_tol=0.0))
                if not same:
                    if old is None:          # a value beats "not measured" at the same instant
                        row[name] = v
                    elif v is not None:
                        row[name] = None
                        conflicts.add((t, name))
                        _count(missing, name, "conflicting_duplicate")
                continue
            row[name] = v
    return by_t


def _count(missing: dict[str, dict[str, int]], name: str, reason: str, n: int = 1) -> None:
    missing.setdefault(name, {})
    missing[name][reason] = missing[name].get(reason, 0) + n


def _increasing(t: np.ndarray) -> bool:
    """Strictly increasing (so without a repeated instant): what a scrape series is, checked in one pass."""
    return bool((t[1:] > t[:-1]).all())


def _union(times: list[np.ndarray]) -> np.ndarray:
    """The sorted distinct instants of all fields (np.unique of them all; one field's own times when every field
    has the same strictly increasing times, which is what most devices' scrapes are)."""
    if not times:
        return np.empty(0)
    first = times[0]
    if _increasing(first) and all(t.size == first.size and np.array_equal(t, first) for t in times[1:]):
        return first.copy()
    return np.unique(np.concatenate(times))


def build_timeline_arrays(device: str, arrays: Mapping[str, tuple], *, cadence: float | None = None,
                          span: tuple[float | None, float | None] | None = None,
                          tolerance_factor: float = TOLERANCE_FACTOR, gap_cause: str = "scrape_missing",
                          edge_cause: str = "scrape_missing", missing: Mapping[str, Mapping[str, int]] | None = None,
                          default_cadence: float = DEFAULT_CADENCE_S) -> Timeline:
    """:func:`build_timeline` over columns: ``{field: (times, values)}`` as float arrays, NaN = not measured.

    The same result, computed with numpy when no field repeats an instant; inputs with duplicate instants go
    through the per-reading path (which resolves them). Importers and the collector call this one.
    """
    kw = dict(cadence=cadence, span=span, tolerance_factor=tolerance_factor, gap_cause=gap_cause,
              edge_cause=edge_cause, missing=missing, default_cadence=default_cadence)
    cols: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (ts, vs) in arrays.items():
        if name not in FIELDS:
            raise ValueError(f"unknown sample field {name!r}")
        t = np.asarray(ts, dtype=np.float64)
        v = np.asarray(vs, dtype=np.float64)
        if len(t) and not _increasing(t) and np.unique(t).size != t.size:
            series = {n: [(float(a), None if b != b else float(b)) for a, b in zip(*arrays[n])] for n in arrays}
            return build_timeline(device, series, **kw)
        cols[name] = (t, v)
    miss: dict[str, dict[str, int]] = {k: dict(v) for k, v in (missing or {}).items()}
    start_lim, end_lim = span if span else (None, None)
    alltimes = _union([t for t, _ in cols.values()])
    keep = np.ones(alltimes.size, dtype=bool)
    if start_lim is not None:
        keep &= alltimes >= start_lim
    if end_lim is not None:
        keep &= alltimes < end_lim
    times = alltimes[keep]
    if cadence is not None and cadence > 0:
        cad, cad_src = float(cadence), "given"
    else:
        diffs = np.diff(times)
        diffs = diffs[diffs > 0]
        cad, cad_src = (float(np.median(diffs)), "inferred") if diffs.size else (float(default_cadence), "default")
    tol = tolerance_factor * cad
    n = times.size
    if n == 0:
        if start_lim is not None and end_lim is not None and end_lim > start_lim:
            gap = Gap(device, start_lim, end_lim, edge_cause, "no samples in the span")
            return Timeline(device, cad, cad_src, tol, start_lim, end_lim, (), (gap,), (), miss)
        return Timeline(device, cad, cad_src, tol, None, None, (), (), (), miss)
    gaps: list[Gap] = []
    t_list = times.tolist()
    t0 = t_list[0]
    tl_start = t0
    if start_lim is not None and t0 - start_lim > tol:
        gaps.append(Gap(device, start_lim, t0, edge_cause, f"no samples for {t0 - start_lim:.0f}s after the span start"))
        tl_start = start_lim
    nxt = np.empty(n)
    nxt[:-1] = times[1:]
    nxt[-1] = np.nan if end_lim is None else end_lim
    step = nxt - times
    hole = step > tol                       # NaN (no end) compares False
    dt = np.where(np.isnan(step) | hole, cad, step)
    for i in np.flatnonzero(hole).tolist():
        a, b = t_list[i], float(nxt[i])
        gaps.append(Gap(device, a + cad, b, gap_cause if i + 1 < n else edge_cause,
                        f"no samples for {b - a:.0f}s (cadence {cad:g}s, tolerance {tol:g}s)"))
    # Align every field on the union of instants; NaN where the field has no reading.
    order = list(cols)
    aligned: dict[str, np.ndarray] = {}
    resets: list[tuple[float, int, CounterReset]] = []
    for k, name in enumerate(order):
        t, v = cols[name]
        if t.size == n and np.array_equal(t, times):   # the usual case: every field read at every instant
            full = v.copy()
        else:
            inside = np.isin(t, times)
            t, v = t[inside], v[inside]
            full = np.full(n, np.nan)
            full[np.searchsorted(times, t)] = v
        if name in COUNTERS:
            sel = ~np.isnan(full)
            ct, cv = times[sel], full[sel]
            for j in np.flatnonzero(np.diff(cv) < 0).tolist():
                resets.append((float(ct[j + 1]), k, CounterReset(device, name, float(ct[j]), float(ct[j + 1]),
                                                                 float(cv[j]), float(cv[j + 1]))))
        aligned[name] = full
    dt_list = dt.tolist()

    def value_columns() -> list[list]:
        none_col = [None] * n
        out = []
        for c in FIELDS:
            if c not in aligned:
                out.append(none_col)
            elif c == "clock_reasons":
                out.append([None if x != x else int(x) for x in aligned[c].tolist()])
            else:
                out.append([None if x != x else x for x in aligned[c].tolist()])
        return out

    dev_col = [device] * n
    samples = Deferred(n, lambda: tuple(map(Sample, dev_col, t_list, dt_list, *value_columns())))
    rows = Deferred(n, lambda: tuple(zip(dev_col, t_list, dt_list, *value_columns())))
    last_t, last_dt = t_list[-1], dt_list[-1]
    tl_end = gaps[-1].end if gaps and gaps[-1].end > last_t else last_t + last_dt
    resets.sort(key=lambda r: (r[0], r[1]))
    return Timeline(device, cad, cad_src, tol, tl_start, tl_end, samples, tuple(gaps),
                    tuple(r for _, _, r in resets), miss, rows, {"t": times, "dt": dt, **aligned})


def build_timeline(device: str, series: Mapping[str, Iterable[tuple[float, float | None]]], *,
                   cadence: float | None = None, span: tuple[float | None, float | None] | None = None,
                   tolerance_factor: float = TOLERANCE_FACTOR, gap_cause: str = "scrape_missing",
                   edge_cause: str = "scrape_missing", missing: Mapping[str, Mapping[str, int]] | None = None,
                   default_cadence: float = DEFAULT_CADENCE_S) -> Timeline:
    """Turn one device's readings into contiguous samples and explicit gaps (see the module docstring).

    ``series`` maps Sample field names to (t, value-or-None) pairs, already cleaned and converted;
    ``missing`` carries the parser's per-field counts of values it turned into None, merged into the result.
    """
    miss: dict[str, dict[str, int]] = {k: dict(v) for k, v in (missing or {}).items()}
    by_t = merge_readings(series, miss)
    start_lim, end_lim = span if span else (None, None)
    times = sorted(t for t in by_t if (start_lim is None or t >= start_lim) and (end_lim is None or t < end_lim))
    if cadence is not None and cadence > 0:
        cad, cad_src = float(cadence), "given"
    else:
        inferred = infer_cadence(times)
        cad, cad_src = (inferred, "inferred") if inferred else (float(default_cadence), "default")
    tol = tolerance_factor * cad
    gaps: list[Gap] = []
    samples: list[Sample] = []
    resets: list[CounterReset] = []
    if not times:
        if start_lim is not None and end_lim is not None and end_lim > start_lim:
            gaps.append(Gap(device, start_lim, end_lim, edge_cause, "no samples in the span"))
            return Timeline(device, cad, cad_src, tol, start_lim, end_lim, (), tuple(gaps), (), miss)
        return Timeline(device, cad, cad_src, tol, None, None, (), (), (), miss)

    t0 = times[0]
    tl_start = t0
    if start_lim is not None and t0 - start_lim > tol:
        gaps.append(Gap(device, start_lim, t0, edge_cause, f"no samples for {t0 - start_lim:.0f}s after the span start"))
        tl_start = start_lim
    last_counter: dict[str, tuple[float, float]] = {}
    for i, t in enumerate(times):
        nxt = times[i + 1] if i + 1 < len(times) else end_lim
        if nxt is None:
            dt = cad
        elif nxt - t > tol:
            dt = cad
            gaps.append(Gap(device, t + cad, nxt, gap_cause if i + 1 < len(times) else edge_cause,
                            f"no samples for {nxt - t:.0f}s (cadence {cad:g}s, tolerance {tol:g}s)"))
        else:
            dt = nxt - t
        row = by_t[t]
        values = {}
        for name, v in row.items():
            if v is not None and name in COUNTERS:
                prev = last_counter.get(name)
                if prev is not None and v < prev[1]:
                    resets.append(CounterReset(device, name, prev[0], t, prev[1], v))
                last_counter[name] = (t, v)
            values[name] = int(v) if (name == "clock_reasons" and v is not None) else v
        samples.append(Sample(device=device, t=t, dt=dt, **values))
    last = samples[-1]
    tl_end = gaps[-1].end if gaps and gaps[-1].end > last.t else last.t + last.dt
    return Timeline(device, cad, cad_src, tol, tl_start, tl_end, tuple(samples), tuple(gaps), tuple(resets), miss)
