"""An export analysis without a ledger: a parsed telemetry export turned straight into the agents' :class:`Dataset`.

``ipledger analyze`` used to import into a scratch SQLite ledger and read it back (about 40 % of its time).
This builds the same Dataset from the collection itself: the importer's own timelines, its own
``unknown_interval`` and synthetic-run entries (built by :mod:`ledger.importers.pipeline`, so their ids and
timestamps are the ones the ledger would hold), the samples the segments would have stored, and the sequence
number the scratch ledger would have reached (segments + unknown intervals + run entries, a repeated fact
counted once as ``append`` does). tests/test_analyze.py checks the result equals the ledger round trip.

:func:`hourly_from_collected` is the bounded-memory way (``ipledger analyze``'s default): each device's
device-hours computed from its timeline as the import would seal them (per segment window, merged as the
ledger merges them), and its raw samples kept as float64 columns (only those it measured) for the bounded
reads of :func:`ledger.agents.hourly.compact_dataset`; no per-sample frame is built.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from ..chain.entries import ChainedEntry, Entry
from ..base.heap import return_freed_heap
from ..importers.common import Collected
from ..importers.pipeline import ImportOptions, ImportResult, counted_runs, each_timeline, unknown_entries
from ..telemetry import hours as dh
from ..telemetry.timeline import timeline_columns
from .data import SAMPLE_READ_COLUMNS, Dataset, EntryScan, assemble


class _Sequencer:
    """Feeds entries to an :class:`EntryScan` numbered as ``append`` would number them in a fresh ledger."""

    def __init__(self) -> None:
        self.scan = EntryScan()
        self.seq = 0
        self._seen: set[str] = set()

    def feed(self, entries: list[Entry]) -> int:
        fed = 0
        for e in entries:
            if e.entry_id in self._seen:
                continue
            self._seen.add(e.entry_id)
            self.seq += 1
            fed += 1
            self.scan.add(ChainedEntry(seq=self.seq, entry=e, prev_hash="", hash=""))
        return fed

    def sealed_segment(self, device: str, node: str | None) -> None:
        """A segment entry takes a sequence number; the agents read only its node from it."""
        self.seq += 1
        if node:
            self.scan.seg_nodes.setdefault(device, node)


def _sample_frame(parts: list[tuple[str, dict[str, np.ndarray]]]) -> pd.DataFrame:
    """SAMPLE_READ_COLUMNS of each device's sample columns (device order, then time), with the dtypes the
    ledger's reader gives pandas. Values are the stored rows' (clock_reasons an integer; tested against the
    ledger round trip in tests/test_analyze.py).

    The float columns are filled into one preallocated block, each device's columns dropped from ``parts`` once
    copied (the list is emptied), so building the frame costs one copy of the samples, not three."""
    counts = [len(cols["t"]) for _, cols in parts]
    names = SAMPLE_READ_COLUMNS[1:]
    block = np.empty((len(names), sum(counts)))
    # each device's name once, repeated: no Python string per sample
    device = np.repeat(np.array([d for d, _ in parts], dtype=object), counts)
    at = 0
    for n in counts:
        _, cols = parts.pop(0)
        for j, c in enumerate(names):
            col = cols.get(c)
            if col is None:
                block[j, at:at + n] = np.nan
            elif c == "clock_reasons":   # the row stores int(x); + 0.0 turns a -0.0 into the 0 it reads back as
                block[j, at:at + n] = np.trunc(col) + 0.0
            else:
                block[j, at:at + n] = col
        at += n
    frame = pd.DataFrame(block.T, columns=list(names), copy=False)
    frame.insert(0, "device", device)
    return frame


def dataset_from_collected(c: Collected, opts: ImportOptions = ImportOptions(), topology: dict | None = None,
                           progress: Callable[[int, int], None] | None = None,
                           release: bool = False) -> tuple[Dataset, ImportResult]:
    """The Dataset and import result :func:`ledger.importers.pipeline.write` + :func:`ledger.agents.data.load`
    would give for ``c`` in a fresh ledger, without one.

    ``release``: drop each device's series from ``c`` once its timeline is built (``c`` keeps its devices,
    contexts and report, not its values), so the parsed export and the samples are not both held whole."""
    parts: list[tuple[str, dict[str, np.ndarray]]] = []
    scan, res = _scan_timelines(c, opts, progress, release, lambda dev, cols: parts.append((dev, cols)))
    frame = _sample_frame(parts)
    if release:
        return_freed_heap()
    return assemble(scan, frame, topology), res


def hourly_from_collected(c: Collected, opts: ImportOptions = ImportOptions(),
                          progress: Callable[[int, int], None] | None = None,
                          release: bool = False) -> tuple[EntryScan, "ExportSamples", ImportResult]:
    """What :func:`ledger.agents.hourly.compact_dataset` reads for ``c``, without a ledger: the entries a fresh
    ledger would hold, and the export's device-hours and raw samples (:class:`ExportSamples`). ``release`` as
    :func:`dataset_from_collected`'s."""
    src = ExportSamples()
    scan, res = _scan_timelines(c, opts, progress, release,
                                lambda dev, cols: src.add(dev, cols, opts.segment_seconds))
    src.seal()
    if release:
        return_freed_heap()
    return scan, src, res


def _scan_timelines(c: Collected, opts: ImportOptions, progress: Callable[[int, int], None] | None, release: bool,
                    take: Callable[[str, dict[str, np.ndarray]], None]) -> tuple[EntryScan, ImportResult]:
    """The import's timelines of ``c``, each device's columns handed to ``take``, and the entries (numbered as
    a fresh ledger would number them) and import result."""
    res = ImportResult(source=c.source)
    seq = _Sequencer()
    spans: dict[str, tuple] = {}
    for tl in each_timeline(c, opts, res, spans, progress):
        cols = timeline_columns(tl)
        windows = set(np.floor(cols["t"] / opts.segment_seconds).astype(np.int64).tolist())
        gaps_by_w = unknown_entries(c, tl, opts)
        node = c.devices[tl.device].node
        for w in sorted(windows | set(gaps_by_w)):
            if w in windows:   # a segment the import would seal (sample_windows' keys)
                seq.sealed_segment(tl.device, node)
                res.segments += 1
            res.appended += seq.feed(gaps_by_w.get(w, []))
        if len(cols["t"]):
            take(tl.device, cols)
        if release:
            c.series.pop(tl.device, None)
            c.reasons.pop(tl.device, None)
    res.appended += seq.feed(counted_runs(res, c, spans, opts))
    res.appended += res.segments
    seq.scan.seq = seq.seq
    return seq.scan, res


class ExportSamples:
    """An export's device-hours and raw samples held in memory, read as the ledger's
    (:class:`ledger.agents.hourly.LedgerSamples`): per device the SAMPLE_READ_COLUMNS it measured, as the
    stored rows hold them (float64; clock_reasons an integer), ≈ 8 B a value instead of the agents' ≈ 380 B a
    sample; device-hours per segment window (:func:`ledger.telemetry.hours.aggregate`, what the import seals)
    merged by :func:`ledger.telemetry.hours.merge_frame`, as the ledger's are read."""

    def __init__(self) -> None:
        self.cols: dict[str, dict[str, np.ndarray]] = {}
        self._pieces: list[dh.DeviceHour] = []
        self._hours: pd.DataFrame | None = None

    def add(self, device: str, cols: dict[str, np.ndarray], segment_seconds: float) -> None:
        keep = {}
        for c in SAMPLE_READ_COLUMNS[1:]:
            col = cols.get(c)
            if col is None or np.isnan(col).all():
                continue
            # the row stores int(x); + 0.0 turns a -0.0 into the 0 it reads back as
            keep[c] = np.trunc(col) + 0.0 if c == "clock_reasons" else np.array(col, dtype=np.float64)
        self.cols[device] = keep
        t = keep["t"]
        # one segment per window, as the import seals them; windows of whole hours never split an hour, so
        # one aggregate over the device gives the same rows (each hour's samples reduced in the same order)
        w = np.floor(t / segment_seconds) if segment_seconds % dh.HOUR else np.zeros(len(t))
        for win in np.unique(w):
            m = w == win
            batch = {c: (keep[c][m] if c in keep else np.full(int(m.sum()), np.nan)) for c in dh.NEEDED[1:]}
            batch["device"] = np.full(int(m.sum()), device, dtype=object)
            self._pieces.extend(dh.aggregate(batch))

    def seal(self) -> None:
        """The device-hours merged (the pieces ordered as the ledger's reader orders them)."""
        pieces = sorted(self._pieces, key=lambda h: (h.device, h.hour, h.t_first))
        self._pieces = []
        self._hours = dh.merge_frame(dh.pieces_frame(pieces))

    def hours(self) -> pd.DataFrame:
        return self._hours.copy()

    def done_reading(self) -> None:
        """No more reads: the raw columns are dropped (the device-hours stay)."""
        self.cols = {}
        return_freed_heap()

    def _frame(self, devices, columns: tuple[str, ...], mask=None) -> pd.DataFrame:  # noqa: ANN001
        out: dict[str, list] = {c: [] for c in columns}
        for dev in devices:
            cols = self.cols.get(dev)
            if cols is None:
                continue
            m = mask(dev, cols["t"]) if mask else slice(None)
            n = int(np.count_nonzero(m)) if mask else len(cols["t"])
            if not n:
                continue
            for c in columns:
                if c == "device":
                    out[c].append(np.full(n, dev, dtype=object))
                else:
                    out[c].append(cols[c][m] if c in cols else np.full(n, np.nan))
        return pd.DataFrame({c: (np.concatenate(v) if v else np.zeros(0, dtype=object if c == "device" else float))
                             for c, v in out.items()})

    def device_samples(self, devices: list[str], columns: tuple[str, ...]) -> pd.DataFrame:
        return self._frame(sorted(devices), columns)

    def sample_batches(self, columns: tuple[str, ...], rows: int):  # noqa: ANN201 - Iterator[pd.DataFrame]
        """Every sample, these columns, as frames of whole devices of about ``rows`` rows."""
        devices, batch, n = sorted(self.cols), [], 0
        for dev in devices:
            batch.append(dev)
            n += len(self.cols[dev]["t"])
            if n >= rows:
                yield self._frame(batch, columns)
                batch, n = [], 0
        if batch:
            yield self._frame(batch, columns)

    def hour_samples(self, want: dict[str, set]) -> pd.DataFrame:
        return self._frame(sorted(want), SAMPLE_READ_COLUMNS,
                           lambda dev, t: np.isin((t // dh.HOUR) * dh.HOUR, list(want[dev])))
