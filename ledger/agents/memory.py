"""An export analysis without a ledger: a parsed telemetry export turned straight into the agents' :class:`Dataset`.

``ipledger analyze`` used to import into a scratch SQLite ledger and read it back (about 40 % of its time).
This builds the same Dataset from the collection itself: the importer's own timelines, its own
``unknown_interval`` and synthetic-run entries (built by :mod:`ledger.importers.pipeline`, so their ids and
timestamps are the ones the ledger would hold), the samples the segments would have stored, and the sequence
number the scratch ledger would have reached (segments + unknown intervals + run entries, a repeated fact
counted once as ``append`` does). tests/test_analyze.py checks the result equals the ledger round trip.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable

import numpy as np
import pandas as pd

from ..entries import ChainedEntry, Entry
from ..importers.common import Collected
from ..importers.pipeline import ImportOptions, ImportResult, counted_runs, each_timeline, unknown_entries
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


def _return_freed_heap() -> None:
    """Hand the heap pages of the released export and the per-device columns back to the system (glibc's
    ``malloc_trim``): they were many small blocks, the samples frame is one large mapping that cannot reuse
    them, so without this their memory stays counted while the agents run. Elsewhere a no-op."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def dataset_from_collected(c: Collected, opts: ImportOptions = ImportOptions(), topology: dict | None = None,
                           progress: Callable[[int, int], None] | None = None,
                           release: bool = False) -> tuple[Dataset, ImportResult]:
    """The Dataset and import result :func:`ledger.importers.pipeline.write` + :func:`ledger.agents.data.load`
    would give for ``c`` in a fresh ledger, without one.

    ``release``: drop each device's series from ``c`` once its timeline is built (``c`` keeps its devices,
    contexts and report, not its values), so the parsed export and the samples are not both held whole."""
    res = ImportResult(source=c.source)
    seq = _Sequencer()
    spans: dict[str, tuple] = {}
    parts: list[tuple[str, dict[str, np.ndarray]]] = []
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
            parts.append((tl.device, cols))
        if release:
            c.series.pop(tl.device, None)
            c.reasons.pop(tl.device, None)
    res.appended += seq.feed(counted_runs(res, c, spans, opts))
    res.appended += res.segments
    seq.scan.seq = seq.seq
    frame = _sample_frame(parts)
    if release:
        _return_freed_heap()
    return assemble(seq.scan, frame, topology), res
