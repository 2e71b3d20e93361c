"""Reading a receipt's inputs from the ledger, cut at a sequence number (the only I/O of receipts).

Everything read is either keyed to the run (job_id, run) or found by device and time overlap (importer gaps,
telemetry segments); samples are read only from segments whose entry seq is at or before the cut, so an
``--as-of`` receipt never sees later telemetry.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from typing import Sequence, TYPE_CHECKING

import numpy as np

from ..chain.canonical import ts_to_epoch
from ..chain.lite import is_connection, text
from ..chain.entries import ChainedEntry, Kind
from ..method import DeviceAccount, SampleArrays, attribute_device
from ..method.attribution import attribute_device_covered
from ..method.energy_arrays import by_time
from ..method.lens import DeviceLens, lens_reader
from ..chain.rows import ENTRY_COLUMNS, iter_entries, to_chained
from ..telemetry.blocks import float_values
from ..telemetry.blocks import open_block
from ..telemetry.sealed import DecodedSegments, block_pieces, block_rows, iter_sample_pieces
from .compute import ReceiptError, RunInputs, RunKey, run_frame
from .progress import end_state

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

SAMPLE_READ_COLUMNS = ("device", "t", "dt", "clock_reasons", "sm_active", "tensor_active", "gpu_util",
                       "sm_clock_mhz", "compute_procs", "fb_used_mib")
# read as well only for method 1.1's effective-compute lens (a 1.0.0 receipt reads what it always read)
LENS_READ_COLUMNS = ("sm_occupancy", "dram_active", "fp64_active", "fp32_active", "fp16_active", "fp_ops")
# read as well only under measured-energy terms (receipt 1.4's energy block), in the same pass
ENERGY_READ_COLUMNS = ("energy_j", "power_w")


def runs_of_job(conn: Connection, job_id: str, as_of: int | None) -> dict[RunKey, list[ChainedEntry]]:
    runs: dict[RunKey, list[ChainedEntry]] = defaultdict(list)
    for ce in iter_entries(conn, job_id=str(job_id), through_seq=as_of):
        if ce.entry.kind in (Kind.RECEIPT_ISSUED, Kind.EVIDENCE_REFUSED):
            continue  # a receipt never depends on earlier receipts; a refusal's key is the refused record's
        runs[RunKey(ce.entry.cluster, str(job_id), ce.entry.run or 0)].append(ce)
    return runs


def pick_run(runs: dict[RunKey, list[ChainedEntry]], job_id: str, run: int | None,
             cluster: str | None = None) -> RunKey:
    keys = [k for k in runs if cluster is None or k.cluster == cluster]
    if not keys:
        raise ReceiptError(f"job {job_id}: no entries in the ledger" + (f" for cluster {cluster}" if cluster else ""))
    clusters = sorted({str(k.cluster) for k in keys})
    if len(clusters) > 1:
        raise ReceiptError(f"job {job_id} exists on several clusters ({', '.join(clusters)}); name one with --cluster")
    if run is None:
        return max(keys, key=lambda k: k.run)
    for k in keys:
        if k.run == run:
            return k
    raise ReceiptError(f"job {job_id}: no run {run} (runs: {', '.join(str(k.run) for k in sorted(keys, key=lambda k: k.run))})")


def _select(conn: Connection, where: str, params: dict) -> list[ChainedEntry]:
    sql = text(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM entries WHERE {where} ORDER BY seq")
    return [to_chained(r) for r in conn.execute(sql, params)]


def overlapping_entries(conn: Connection, kind: str, start: str, end: str, as_of: int | None, extra: str = "") -> list[ChainedEntry]:
    """Entries of a kind whose [ts, ts_end] overlaps the window; compared on the seconds prefix (so a
    fraction of a second of slack), then filtered exactly by the caller."""
    where = "kind = :kind AND substr(ts, 1, 19) <= :end AND substr(COALESCE(ts_end, ts), 1, 19) >= :start"
    params = {"kind": kind, "start": start[:19], "end": end[:19]}
    if as_of is not None:
        where += " AND seq <= :asof"
        params["asof"] = as_of
    return _select(conn, where + extra, params)


def segments_overlapping(conn: Connection, start: str, end: str, as_of: int | None,
                         decoded: DecodedSegments | None = None) -> list[ChainedEntry]:
    """``overlapping_entries`` of the telemetry segments; with verify's ``decoded``, every segment entry is read
    once into it and each replay's window is picked from there by the same test as the query's (the seconds prefix
    of ts, and of ts_end or else ts, as text; seq ≤ as_of), in seq order (tests/test_verify_decoded.py holds the
    two equal). A value that is not text leaves the choice to the database, as without the cache."""
    if decoded is None:
        return overlapping_entries(conn, Kind.TELEMETRY_SEGMENT, start, end, as_of)
    if decoded.segment_entries is None:
        decoded.segment_entries = _select(conn, "kind = :kind", {"kind": Kind.TELEMETRY_SEGMENT})
    lo, hi = start[:19], end[:19]
    try:
        return [s for s in decoded.segment_entries if (as_of is None or s.seq <= as_of) and s.entry.ts[:19] <= hi
                and (s.entry.ts if s.entry.ts_end is None else s.entry.ts_end)[:19] >= lo]
    except TypeError:
        return overlapping_entries(conn, Kind.TELEMETRY_SEGMENT, start, end, as_of)


def listed_devices(segment: ChainedEntry, decoded: DecodedSegments | None = None) -> list | None:
    """The devices a segment's payload lists (None where it lists none); with verify's ``decoded``, each payload
    parsed once for all the replays (one that does not parse raises each time, as it would without)."""
    if decoded is None:
        return segment.entry.data.get("devices")
    key = segment.entry.entry_id
    if key not in decoded.listed_devices:
        decoded.listed_devices[key] = segment.entry.data.get("devices")
    return decoded.listed_devices[key]


def gather(engine_or_conn: Engine | Connection, job_id: str, run: int | None = None, *, cluster: str | None = None,
           as_of: int | None = None, contract_id: str | None = None, workers: int = 1,
           contract_entry_id: str | None = None, lens_columns: bool = False,
           decoded: DecodedSegments | None = None) -> RunInputs:
    """The run's inputs (``lens_columns``: the samples also carry what method 1.1's lens reads). ``workers`` > 1 lets a big run (an engine, not a connection) read and attribute its
    devices in that many processes (spawned: a script needs the ``if __name__ == "__main__"`` guard).
    ``contract_entry_id`` pins the contract (an issued receipt's replay); ``decoded``: verify's decoded
    sample blocks, read from there where they hold the run's segments (the same samples)."""
    if not is_connection(engine_or_conn):
        with engine_or_conn.connect() as conn:
            return _gather(conn, engine_or_conn, job_id, run, cluster, as_of, contract_id, workers, lens_columns,
                           contract_entry_id, decoded)
    return _gather(engine_or_conn, None, job_id, run, cluster, as_of, contract_id, workers, lens_columns,
                   contract_entry_id, decoded)


def _gather(conn: Connection, engine: Engine | None, job_id: str, run: int | None, cluster: str | None,
            as_of: int | None, contract_id: str | None, workers: int = 1, lens_columns: bool = False,
            contract_entry_id: str | None = None, decoded: DecodedSegments | None = None) -> RunInputs:
    runs = runs_of_job(conn, str(job_id), as_of)
    key = pick_run(runs, str(job_id), run, cluster)
    entries = runs[key]
    frame = run_frame(entries)
    if frame.start is None:
        raise ReceiptError(f"job {job_id} run {key.run}: no allocation_started entry in the ledger")
    open_end = None
    if frame.open:  # extend an open run to the end of the latest telemetry on its devices
        uuids0 = {d["uuid"] for d in frame.devices}
        later = [s for s in overlapping_entries(conn, Kind.TELEMETRY_SEGMENT, frame.start, "9999-12-31T23:59:59Z", as_of)
                 if set(s.entry.data.get("devices") or [s.entry.device]) & uuids0]
        if later:
            open_end = max((s.entry.ts_end or s.entry.ts for s in later), key=ts_to_epoch)
            frame = run_frame(entries, open_end)
    start, end = frame.start, frame.end or frame.start
    w0, w1 = ts_to_epoch(start), ts_to_epoch(end)
    uuids = {d["uuid"] for d in frame.devices}
    nodes = set(frame.nodes)
    asof_clause = "" if as_of is None else " AND seq <= :asof"
    asof_param = {} if as_of is None else {"asof": as_of}

    gaps = [g for g in overlapping_entries(conn, Kind.UNKNOWN_INTERVAL, start, end, as_of, " AND job_id IS NULL")
            if (g.entry.device in uuids or (g.entry.device is None and g.entry.node in nodes))
            and ts_to_epoch(g.entry.ts_end or g.entry.ts) > w0 and ts_to_epoch(g.entry.ts) < w1]
    # resolutions keyed to this run come with its entries; un-keyed ones (a gap resolved without --job) here
    resolutions = _select(conn, "kind = :k AND job_id IS NULL" + asof_clause, {"k": Kind.GAP_RESOLUTION, **asof_param})
    contracts = _select(conn, "kind = :k" + asof_clause, {"k": Kind.CONTRACT_VERSION, **asof_param})
    segments, listed = [], []   # each segment's payload "devices", read once
    for seg in segments_overlapping(conn, start, end, as_of, decoded):
        named = listed_devices(seg, decoded)
        devs = set(named or ([seg.entry.device] if seg.entry.device else []))
        if devs & uuids and ts_to_epoch(seg.entry.ts_end or seg.entry.ts) > w0 and ts_to_epoch(seg.entry.ts) < w1:
            segments.append(seg)
            listed.append(named)
    if decoded is not None:   # a verify worker's cache decodes each block once for all its replays
        decoded.fill(conn, [s.entry.entry_id for s in segments])
    by_device: dict[str, list[str]] = {d["uuid"]: [] for d in frame.devices}
    for seg, named in zip(segments, listed):
        for d in named or [seg.entry.device]:
            if d in by_device:
                by_device[d].append(seg.entry.entry_id)
    # only a ledger with measured-energy terms reads the counter (receipt 1.4's energy block), in the same pass
    # over the sample blocks as the attribution's columns
    with_energy = any("energy_basis" in sku for c in contracts for sku in (c.entry.data.get("skus") or {}).values())
    energy_columns: Mapping[str, Mapping[str, tuple]] = {}
    if engine is not None:
        samples: Mapping[str, SampleArrays] = LazySamples(engine, by_device, w0, w1, workers=workers,
                                                          lens_columns=lens_columns, energy=with_energy,
                                                          decoded=decoded)
        if with_energy:
            energy_columns = LazyEnergy(samples)
    else:
        energy_out: dict | None = {} if with_energy else None
        samples = load_sample_arrays(conn, [s.entry.entry_id for s in segments], sorted(uuids), w0, w1,
                                     lens_columns, energy_out=energy_out, decoded=decoded)
        energy_columns = energy_out or {}
    used = {s for s in segments}
    xid_samples = {}
    if end_state(entries) not in (None, "COMPLETED"):  # only a run that did not complete can be a provider failure
        xid_samples = load_xid_samples(conn, [s.entry.entry_id for s in segments], sorted(uuids), w0, w1,
                                       decoded)
    return RunInputs(key=key, entries=tuple(entries), gaps=tuple(gaps), resolutions=tuple(resolutions),
                     contracts=tuple(contracts), segments=tuple(sorted(used, key=lambda c: c.seq)),
                     samples=samples, contract_id=contract_id, contract_entry_id=contract_entry_id,
                     open_end=open_end, xid_samples=xid_samples, energy_columns=energy_columns)


def load_energy_columns(conn: Connection, segment_ids: Sequence[str], devices: Sequence[str], start: float,
                        end: float, decoded: DecodedSegments | None = None) -> dict[str, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]]:
    """Each device's ``energy_j`` and ``power_w`` columns (times, values as float arrays, NaN: not measured)
    over these segments' samples, in time order."""
    if not segment_ids or not devices:
        return {}
    parts: dict[str, list[list]] = defaultdict(lambda: [[], [], []])
    for device, table in iter_sample_pieces(conn, segment_ids=segment_ids, devices=devices, start=start, end=end,
                                            columns=("t", "energy_j", "power_w"), decoded=decoded):
        acc = parts[device]
        for k, c in enumerate(table.columns):
            acc[k].append(float_values(c))
    return energy_columns_of(parts)


def energy_columns_of(parts: Mapping[str, Sequence[Sequence[np.ndarray]]]
                      ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Each device's (t, energy_j, power_w) pieces, in the order read, as its columns in time order (equal times
    keep their reading order)."""
    out = {}
    for d, (t, e, p) in parts.items():
        # pieces in time order; equal times keep their reading order
        ts, es, ps = by_time(*(np.concatenate(x) if len(x) > 1 else x[0] for x in (t, e, p)))
        out[d] = {"energy_j": (ts, es), "power_w": (ts, ps)}
    return out


def load_xid_samples(conn: Connection, segment_ids: Sequence[str], devices: Sequence[str], start: float,
                     end: float, decoded: DecodedSegments | None = None) -> dict[str, tuple[tuple[float, float | None], ...]]:
    """Each device's (t, xid) over the samples of these segments overlapping [start, end) (the rows the
    receipt's attribution reads), not-measured XIDs as NaN."""
    if not segment_ids or not devices:
        return {}
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for device, table in iter_sample_pieces(conn, segment_ids=segment_ids, devices=devices, start=start, end=end,
                                            columns=("t", "xid"), decoded=decoded):
        t, x = (float_values(c) for c in table.columns)
        out[device].extend(zip(t.tolist(), x.tolist()))
    return {d: tuple(v) for d, v in out.items()}


PARALLEL_MIN_DEVICES = 128
DEVICE_BATCH = 16


def load_sample_arrays(conn: Connection, segment_ids: Sequence[str], devices: Sequence[str], start: float,
                       end: float, lens_columns: bool = False, energy_out: dict | None = None,
                       decoded: DecodedSegments | None = None) -> dict[str, SampleArrays]:
    """Columns of the samples of these segments and devices overlapping [start, end), one array set per device.

    Read through :func:`ledger.telemetry.sealed.iter_sample_pieces` (columnar blocks, decompressing only these
    devices and the receipt's columns; legacy row segments alike) straight into float64 arrays, NULL as NaN:
    no per-row Python objects. ``energy_out``: also each device's ``energy_j`` and ``power_w`` columns, read in
    the same pass and put there as :func:`load_energy_columns` (the plain second pass, a test holds them equal)
    gives them. The whole batch at once: :class:`DeviceReader` gives the same arrays a device at a time.
    """
    if not segment_ids or not devices:
        return {}
    parts: dict[str, list[list[np.ndarray | None]]] = defaultdict(list)
    energy_parts: dict[str, list[list]] = defaultdict(lambda: [[], [], []])
    columns = _read_columns(lens_columns, energy_out is not None)
    if decoded is not None and decoded.holds(segment_ids):
        # verify's kept blocks, their columns converted once for all the replays (the same pieces' values)
        for device, values, nulls in decoded.float_pieces(segment_ids, devices, start, end, columns,
                                                          count_nulls=LENS_READ_COLUMNS):
            _take_values(values, [nulls.get(c, 0) for c in columns], energy_out is not None, parts[device],
                         energy_parts[device])
    else:
        for device, table in iter_sample_pieces(conn, segment_ids=segment_ids, devices=devices, start=start,
                                                end=end, columns=columns, decoded=decoded):
            _take_piece(table, energy_out is not None, parts[device], energy_parts[device])
    if energy_out is not None:
        energy_out.update(energy_columns_of(energy_parts))
    return {device: _device_arrays(parts.pop(device)) for device in devices if device in parts}


def _read_columns(lens_columns: bool, energy: bool) -> tuple[str, ...]:
    """The columns a receipt reads: the time identity's, then the lens's (method 1.1), then energy's."""
    return SAMPLE_READ_COLUMNS[1:] + (LENS_READ_COLUMNS if lens_columns else ()) + \
        (ENERGY_READ_COLUMNS if energy else ())


def _take_piece(table, energy: bool, parts: list, energy_parts: list) -> None:  # noqa: ANN001 - a pyarrow Table
    """One piece (of :func:`_read_columns`) into a device's parts: its columns as float arrays (a lens column no
    sample of the piece measured as None: the lens skips it, no column of NaN), and its (t, energy_j, power_w)."""
    columns = table.columns
    if energy:
        for k, c in enumerate((columns[0], *columns[-len(ENERGY_READ_COLUMNS):])):
            energy_parts[k].append(float_values(c))
        columns = columns[:-len(ENERGY_READ_COLUMNS)]
    base = len(SAMPLE_READ_COLUMNS) - 1
    parts.append([float_values(c) if i < base or c.null_count < len(c) else None for i, c in enumerate(columns)])


def _take_values(values: Sequence[np.ndarray], nulls: Sequence[int], energy: bool, parts: list,
                 energy_parts: list) -> None:
    """:func:`_take_piece` of a piece already as its columns' float values and NULL counts (those of the lens
    columns are the ones read; tests/test_verify_decoded.py holds the two to the same arrays)."""
    if energy:
        for k, v in enumerate((values[0], *values[-len(ENERGY_READ_COLUMNS):])):
            energy_parts[k].append(v)
        values = values[:-len(ENERGY_READ_COLUMNS)]
    base, n = len(SAMPLE_READ_COLUMNS) - 1, len(values[0])
    parts.append([v if i < base or nulls[i] < n else None for i, v in enumerate(values)])


def _device_arrays(pieces: Sequence[list[np.ndarray | None]]) -> SampleArrays:
    """A device's arrays from its pieces' columns (:func:`_take_piece`), in time order."""
    lengths = [len(p[0]) for p in pieces]
    cols = pieces[0] if len(pieces) == 1 else [_concatenate(c, lengths) for c in zip(*pieces)]
    t = cols[0]
    if len(t) > 1 and not bool(np.all(t[1:] > t[:-1])):
        # Sort by t, then every other column: the same order whatever order the segments came in.
        nan = np.full(len(t), np.nan)
        order = np.lexsort(tuple(reversed([nan if c is None else c for c in cols])))
        cols = [None if c is None else c[order] for c in cols]
    t, dt, reasons, sm_active, tensor_active, gpu_util, sm_clock, procs, fb_used, *lens = cols
    occupancy, dram, fp64, fp32, fp16, ops = lens if lens else (None,) * len(LENS_READ_COLUMNS)
    return SampleArrays.from_columns(t=t, dt=dt, reasons=reasons, sm_active=sm_active, tensor_active=tensor_active,
                                     gpu_util=gpu_util, sm_clock=sm_clock, procs=procs, fb_used=fb_used,
                                     sm_occupancy=occupancy, dram_active=dram, fp64_active=fp64, fp32_active=fp32,
                                     fp16_active=fp16, ops=ops)


class DeviceReader:
    """:func:`load_sample_arrays` of one batch of devices, a device at a time: the batch's blocks are fetched in
    one query, and a block is decompressed only when a device it holds is asked for (every device of the batch
    it holds at once). A device's columns are then decoded just before its attribution reads them, and the
    memory of the device before is reused, where reading the whole batch first left the batch's columns (with
    the lens's, more than the CPU's cache) to be read back cold; the receipt's own pass over each device got
    faster, the lens's most (docs/performance.md). The same arrays as the whole batch's read, bit for bit
    (tests/test_lens.py); a batch with legacy row segments is read whole."""

    def __init__(self, conn: Connection, segment_ids: Sequence[str], devices: Sequence[str], start: float,
                 end: float, lens_columns: bool = False, energy: bool = False,
                 decoded: DecodedSegments | None = None) -> None:
        self._devices = list(devices)
        self._start, self._end = start, end
        self._columns = _read_columns(lens_columns, energy)
        self._energy = energy
        self.energy: dict[str, dict] = {}    # (under measured-energy terms) each device's, once it is read
        kept = decoded is not None and bool(segment_ids) and decoded.holds(segment_ids)
        rows = block_rows(conn, segment_ids) if devices and not kept else []
        if kept or {r[0] for r in rows} != set(segment_ids):
            # verify's kept blocks (already decoded), or legacy row segments (or none): the batch read whole
            out: dict | None = {} if energy else None
            self._whole: dict[str, SampleArrays] | None = load_sample_arrays(
                conn, segment_ids, devices, start, end, lens_columns, energy_out=out, decoded=decoded)
            self.energy = out or {}
            return
        self._whole = None
        self._blocks = [open_block(format_, data) for _sid, format_, _sha, data in rows]
        wanted = set(self._devices)
        self._holding: dict[str, list[int]] = defaultdict(list)   # device -> its blocks, in reading order
        for i, block in enumerate(self._blocks):
            for device in block.devices & wanted:
                self._holding[device].append(i)
        self._decoded: set[int] = set()
        self._answered: set[str] = set()
        self._pieces: dict[str, list[tuple[int, list, list]]] = defaultdict(list)

    def _take(self, table) -> tuple[list, list]:  # noqa: ANN001 - a pyarrow Table
        parts: list = []
        energy_parts: list = [[], [], []]
        _take_piece(table, self._energy, parts, energy_parts)
        return parts[0], energy_parts

    def arrays(self, device: str) -> SampleArrays | None:
        """The device's arrays (None: no sample of it in the window), as :func:`load_sample_arrays` gives them."""
        if self._whole is not None:
            return self._whole.get(device)
        if device not in self._holding:
            return None
        if device in self._answered:   # asked again (its pieces went with its first answer): its blocks re-read
            mine = [(i, *self._take(table)) for i in self._holding[device]
                    for _d, table in block_pieces(self._blocks[i], self._columns, [device], self._start, self._end)]
        else:
            self._answered.add(device)
            for i in self._holding[device]:
                if i not in self._decoded:
                    self._decoded.add(i)
                    for d, table in block_pieces(self._blocks[i], self._columns, self._devices, self._start,
                                                 self._end):
                        self._pieces[d].append((i, *self._take(table)))
            # its pieces in reading order (a block decoded for another device before keeps its place)
            mine = sorted(self._pieces.pop(device, ()), key=lambda p: p[0])
        if not mine:
            return None
        if self._energy:
            self.energy.update(energy_columns_of({device: [[x for p in mine for x in p[2][k]] for k in range(3)]}))
        return _device_arrays([p[1] for p in mine])


def _concatenate(pieces: Sequence[np.ndarray | None], lengths: Sequence[int]) -> np.ndarray | None:
    """One column from a device's pieces of these lengths (None: unmeasured in all of them)."""
    if all(p is None for p in pieces):
        return None
    return np.concatenate([np.full(n, np.nan) if p is None else p for p, n in zip(pieces, lengths)])


class LazySamples(Mapping):
    """Per-device samples read a batch of devices at a time, in the order the receipt asks for them, so a
    receipt's memory is bounded by one batch, not by the whole run."""

    def __init__(self, engine: Engine, segments_by_device: Mapping[str, Sequence[str]], start: float, end: float,
                 batch: int = DEVICE_BATCH, workers: int = 1, lens_columns: bool = False,
                 energy: bool = False, decoded: DecodedSegments | None = None) -> None:
        self._engine = engine
        self._kept_blocks = decoded
        # under measured-energy terms: every device's energy_j/power_w columns, kept (small) once its batch is read
        self.energy: dict[str, dict] | None = {} if energy else None
        self.energy_read: set[str] = set()
        self._workers = workers
        self._segs = {d: list(s) for d, s in segments_by_device.items() if s}
        self._order = list(self._segs)
        self._pos = {d: i for i, d in enumerate(self._order)}
        self._start, self._end, self._batch = start, end, batch
        self._lens = lens_columns
        self._reader: DeviceReader | None = None    # the batch being read, a device at a time
        self._loaded: set[str] = set()              # the devices of that batch
        self._last: tuple[str, SampleArrays | None] | None = None

    def __getitem__(self, device: str) -> SampleArrays:
        if device not in self._segs:
            raise KeyError(device)
        if self._last is not None and self._last[0] == device:
            got = self._last[1]
        else:
            self._last = None   # (the device before's columns freed first: their memory is reused)
            if device not in self._loaded:
                i = self._pos[device]
                batch = self._order[i:i + self._batch]
                segs = sorted({s for d in batch for s in self._segs[d]})
                # (the batch before is dropped only once this one is fetched, as its arrays were before: the
                # next batch then reuses its memory, where dropping it first let the allocator hand it back to
                # the kernel to be faulted in again, 30-70 thousand page faults a 256-GPU receipt)
                with self._engine.connect() as conn:
                    self._reader = DeviceReader(conn, segs, batch, self._start, self._end, self._lens,
                                                energy=self.energy is not None, decoded=self._kept_blocks)
                self._loaded = set(batch)
            got = self._reader.arrays(device)
            self._last = (device, got)
            if self.energy is not None:
                self.energy.update(self._reader.energy)
                self.energy_read.add(device)
        if got is None:
            raise KeyError(device)
        return got

    def read_energy(self, device: str) -> None:
        """The energy columns alone of the batch holding ``device`` (one the worker processes attributed, so
        its samples were never read here): :func:`load_energy_columns`, three columns, not the attribution's."""
        if device not in self._segs:
            raise KeyError(device)
        i = self._pos[device]
        batch = self._order[i:i + self._batch]
        segs = sorted({s for d in batch for s in self._segs[d]})
        with self._engine.connect() as conn:
            self.energy.update(load_energy_columns(conn, segs, batch, self._start, self._end, self._kept_blocks))
        self.energy_read.update(batch)

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def attribute_all(self, tasks: Sequence[tuple]) -> dict[str, tuple[DeviceAccount | None, DeviceLens | None]] | None:
        """Read and attribute many devices in worker processes and this one, each as (account, lens: method
        1.1's effective-compute lens of the same samples, or None with the lens off); None when not worth it
        (small runs, one worker). Each device's result is computed by the same pure function
        from the same rows as the in-process path, so the receipt is byte-identical either way."""
        workers = self._workers
        mine = [t for t in tasks if t[0] in self._segs]
        if workers < 2 or len(mine) < PARALLEL_MIN_DEVICES:
            return None
        url = self._engine.url.render_as_string(hide_password=False)
        jobs = []
        for i in range(0, len(mine), self._batch):
            batch = mine[i:i + self._batch]
            segs = sorted({s for t in batch for s in self._segs[t[0]]})
            jobs.append((url, segs, batch, self._start, self._end, self._lens, self.energy is not None))
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        # workers - 1 spawned processes and this one: a spawned worker costs an interpreter start and the
        # imports (≈ 1 CPU-second), so the parent, which would otherwise only wait, takes jobs too. Each worker
        # keeps two jobs in flight; the parent takes the next one while they run.
        spawned = min(workers - 1, len(jobs))
        pending = deque(jobs)
        out: dict[str, tuple[DeviceAccount | None, DeviceLens | None]] = {}
        try:
            # spawn, not fork: the caller may hold threads and pooled connections
            with ProcessPoolExecutor(spawned, mp_context=multiprocessing.get_context("spawn")) as pool:
                running = set()
                while pending or running:
                    while pending and len(running) < 2 * spawned:
                        running.add(pool.submit(_attribute_batch, pending.popleft()))
                    if pending:
                        self._take(out, _attribute_batch(pending.popleft()))
                    else:
                        wait(running, return_when=FIRST_COMPLETED)
                    finished = {f for f in running if f.done()}
                    for f in finished:
                        self._take(out, f.result())
                    running -= finished
        except BrokenProcessPool:
            return None  # workers could not start here: the in-process path gives the same receipt
        return out

    def _take(self, out: dict, done: tuple[dict, dict | None]) -> None:
        """A batch's results into ``out``, and the energy columns its read gave (under measured-energy terms)."""
        results, energy = done
        out.update(results)
        if energy is not None and self.energy is not None:
            self.energy.update(energy)
            self.energy_read.update(results)

    def __len__(self) -> int:
        return len(self._order)


class LazyEnergy(Mapping):
    """A run's energy columns by device, from :class:`LazySamples`' own reads: a device whose batch was read has
    them already, and so does one a worker process read (it hands them back); any other has its batch's energy
    columns read on asking."""

    def __init__(self, samples: LazySamples) -> None:
        self._samples = samples

    def __getitem__(self, device: str) -> dict:
        s = self._samples
        if device not in s.energy_read:
            s.read_energy(device)   # its batch's energy columns (KeyError: no segments for it)
        if device not in s.energy:
            raise KeyError(device)
        return s.energy[device]

    def __iter__(self) -> Iterator[str]:
        return iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)


def _attribute_batch(job: tuple) -> tuple[dict[str, tuple[DeviceAccount | None, DeviceLens | None]], dict | None]:
    """Worker: read one batch of devices' samples and attribute each (None = no samples for it); with the lens
    on (method 1.1), the same samples give each device's effective-compute lens in the same pass. Under
    measured-energy terms the same read also gives the batch's energy columns, handed back beside (else None)."""
    from ..chain.db import make_engine

    url, segs, batch, start, end, lens, energy = job
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            reader = DeviceReader(conn, segs, [t[0] for t in batch], start, end, lens, energy=energy)
    finally:
        engine.dispose()
    out: dict[str, tuple[DeviceAccount | None, DeviceLens | None]] = {}
    for uuid, window, unknown, suspended, rated, thresholds in batch:
        sa = None   # (the device before's columns dropped before this one's are read: their memory is reused)
        sa = reader.arrays(uuid)
        if sa is None or not len(sa):
            out[uuid] = (None, None)
            continue
        if not lens:
            out[uuid] = (attribute_device(window, sa, unknown=unknown, suspended=suspended, rated_clock_mhz=rated,
                                          thresholds=thresholds), None)
            continue
        out[uuid] = attribute_device_covered(window, sa, unknown=unknown, suspended=suspended,
                                             rated_clock_mhz=rated, thresholds=thresholds, use=lens_reader(sa))
    return out, (reader.energy if energy else None)
