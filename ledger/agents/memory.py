"""Path B without a ledger: a parsed telemetry export turned straight into the agents' :class:`Dataset`.

``ipledger analyze`` used to import into a scratch SQLite ledger and read it back (about 40 % of its time).
This builds the same Dataset from the collection itself: the importer's own timelines, its own
``unknown_interval`` and synthetic-run entries (built by :mod:`ledger.importers.pipeline`, so their ids and
timestamps are the ones the ledger would hold), the samples the segments would have stored, and the sequence
number the scratch ledger would have reached (segments + unknown intervals + run entries, a repeated fact
counted once as ``append`` does). tests/test_analyze.py checks the result equals the ledger round trip.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from ..entries import ChainedEntry, Entry
from ..importers.common import Collected
from ..importers.pipeline import (ImportOptions, ImportResult, counted_runs, each_timeline, sample_windows,
                                  unknown_entries)
from ..telemetry.model import SAMPLE_COLUMNS
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


def _sample_frame(row_batches: list[list[tuple]]) -> pd.DataFrame:
    """SAMPLE_READ_COLUMNS of normalised rows, through Arrow as the ledger's reader hands them to pandas."""
    import pyarrow as pa

    at = {c: i for i, c in enumerate(SAMPLE_COLUMNS)}
    parts: dict[str, list] = {c: [] for c in SAMPLE_READ_COLUMNS}
    for rows in row_batches:
        if not rows:
            continue
        cols = list(zip(*rows))
        for c in SAMPLE_READ_COLUMNS:
            col = cols[at[c]]
            parts[c].append(np.array(col, dtype=object) if c == "device" else np.array(col, dtype=np.float64))
    return pa.table({c: pa.array(np.concatenate(v) if v else [], type=pa.string() if c == "device" else pa.float64())
                     for c, v in parts.items()}).to_pandas()


def dataset_from_collected(c: Collected, opts: ImportOptions = ImportOptions(), topology: dict | None = None,
                           progress: Callable[[int, int], None] | None = None) -> tuple[Dataset, ImportResult]:
    """The Dataset and import result :func:`ledger.importers.pipeline.write` + :func:`ledger.agents.data.load`
    would give for ``c`` in a fresh ledger, without one."""
    res = ImportResult(source=c.source)
    seq = _Sequencer()
    spans: dict[str, tuple] = {}
    row_batches: list[list[tuple]] = []
    for tl in each_timeline(c, opts, res, spans, progress):
        windows = sample_windows(tl, opts)
        gaps_by_w = unknown_entries(c, tl, opts)
        node = c.devices[tl.device].node
        for w in sorted(set(windows) | set(gaps_by_w)):
            if windows.get(w):
                seq.sealed_segment(tl.device, node)
                res.segments += 1
                row_batches.append(windows[w])
            res.appended += seq.feed(gaps_by_w.get(w, []))
    res.appended += seq.feed(counted_runs(res, c, spans, opts))
    res.appended += res.segments
    seq.scan.seq = seq.seq
    return assemble(seq.scan, _sample_frame(row_batches), topology), res
