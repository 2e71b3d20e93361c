"""An export analysis without a ledger: a parsed telemetry export turned straight into the agents' :class:`Dataset`.

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
    """SAMPLE_READ_COLUMNS of each device's sample columns (device order, then time), through Arrow as the
    ledger's reader hands them to pandas. Values are the stored rows' (clock_reasons an integer; tested
    against the ledger round trip in tests/test_analyze.py)."""
    import pyarrow as pa

    counts = [len(cols["t"]) for _, cols in parts]
    # each device's name once, repeated by index: no Python string per sample
    which = pa.array(np.repeat(np.arange(len(parts), dtype=np.int32), counts))
    names = pa.array([d for d, _ in parts], type=pa.string())
    table: dict[str, pa.Array] = {"device": pa.DictionaryArray.from_arrays(which, names).cast(pa.string())}
    for c in SAMPLE_READ_COLUMNS[1:]:
        pieces = []
        for (_, cols), n in zip(parts, counts):
            col = cols.get(c)
            if col is None:
                col = np.full(n, np.nan)
            elif c == "clock_reasons":   # the row stores int(x); + 0.0 turns a -0.0 into the 0 it reads back as
                col = np.trunc(col) + 0.0
            pieces.append(col)
        table[c] = pa.array(np.concatenate(pieces) if pieces else np.empty(0), type=pa.float64())
    return pa.table(table).to_pandas()


def dataset_from_collected(c: Collected, opts: ImportOptions = ImportOptions(), topology: dict | None = None,
                           progress: Callable[[int, int], None] | None = None) -> tuple[Dataset, ImportResult]:
    """The Dataset and import result :func:`ledger.importers.pipeline.write` + :func:`ledger.agents.data.load`
    would give for ``c`` in a fresh ledger, without one."""
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
    res.appended += seq.feed(counted_runs(res, c, spans, opts))
    res.appended += res.segments
    seq.scan.seq = seq.seq
    return assemble(seq.scan, _sample_frame(parts), topology), res
