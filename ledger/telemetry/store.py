"""Telemetry storage: samples in the `samples` side table, each batch sealed by a `telemetry_segment` entry.

The segment entry's payload carries the sha256 of the batch's canonical rows, so `ipledger verify` can
prove the samples a receipt was computed from are the samples that were recorded.
"""

from __future__ import annotations

import hashlib
import operator
from typing import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..canonical import canonical_json
from ..db import write_tx
from ..entries import Entry, Kind, make_entry
from ..store import AppendResult, append_in
from ..verify import ChainProblem, VerifyReport, register_check
from .model import SAMPLE_COLUMNS, Sample

INSERT_COLUMNS = ("segment_id", *SAMPLE_COLUMNS)


def _norm(row: Sequence) -> tuple:
    """One type per column whatever the backend returns: device str, clock_reasons int, the rest float."""
    device, *rest = row
    out = [str(device)]
    for name, v in zip(SAMPLE_COLUMNS[1:], rest):
        if v is None:
            out.append(None)
        elif name == "clock_reasons":
            out.append(int(v))
        else:
            out.append(float(v))
    return tuple(out)


_METRIC_GETTERS = tuple(operator.attrgetter(c) for c in SAMPLE_COLUMNS[4:])


_ALL_GETTER = operator.attrgetter(*SAMPLE_COLUMNS)
_FLOAT_OR_NONE = frozenset({float, type(None)})


def _row_values(s: Sample) -> tuple:
    """The same values as ``_norm`` over the sample's columns, without the per-column dispatch (hot path)."""
    vals = _ALL_GETTER(s)
    cr = vals[3]
    if type(vals[0]) is str and type(vals[1]) is float and type(vals[2]) is float \
            and (cr is None or type(cr) is int) and set(map(type, vals[4:])) <= _FLOAT_OR_NONE:
        return vals     # already exactly the normalised form
    return (str(s.device), float(s.t), float(s.dt), None if cr is None else int(cr),
            *[None if v is None else float(v) for v in (g(s) for g in _METRIC_GETTERS)])


def samples_digest(rows: Iterable[tuple]) -> str:
    """sha256 over canonical JSON lines of the rows (SAMPLE_COLUMNS order), sorted by (device, t)."""
    return _digest_normalised([_norm(r) for r in rows])


def _digest_normalised(rows: list[tuple]) -> str:
    """The digest of rows already in ``_norm`` form (segment_entry's rows come from ``_row_values``)."""
    ordered = sorted(rows, key=operator.itemgetter(0, 1))
    if ordered and not any("]" in r[0] for r in {r[0]: r for r in ordered}.values()):
        # One C-level encode of all rows, then the row separators turned into newlines: the same bytes as
        # encoding row by row (a device id without "]" cannot contain the separator "],[").
        text = canonical_json(ordered)[1:-1].replace("],[", "]\n[") + "\n"
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    h = hashlib.sha256()
    for r in ordered:
        h.update(canonical_json(list(r)).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def segment_entry(samples: Sequence[Sample], *, node: str | None, source: str, source_version: str = "",
                  cluster: str | None = None, extra: dict | None = None) -> Entry:
    """The sealing entry for one batch (all samples of one device, or of one import, as the caller chooses)."""
    return segment_entry_rows([_row_values(s) for s in samples], node=node, source=source,
                              source_version=source_version, cluster=cluster, extra=extra)


def segment_entry_rows(rows: Sequence[tuple], *, node: str | None, source: str, source_version: str = "",
                       cluster: str | None = None, extra: dict | None = None) -> Entry:
    """:func:`segment_entry` for rows already in normalised SAMPLE_COLUMNS form (importers build them columnar)."""
    devices = sorted({r[0] for r in rows})
    start = min(r[1] for r in rows)
    end = max(r[1] + r[2] for r in rows)
    payload = {"devices": devices, "rows": len(rows), "samples_sha256": _digest_normalised(list(rows)),
               "columns": list(SAMPLE_COLUMNS), **(extra or {})}
    return make_entry(Kind.TELEMETRY_SEGMENT, start, payload, ts_end=end, node=node, cluster=cluster,
                      device=devices[0] if len(devices) == 1 else None, source=source,
                      source_version=source_version)


def write_segment_in(conn: Connection, samples: Sequence[Sample], entry: Entry,
                     other_entries: Sequence[Entry] = ()) -> AppendResult:
    """Append the segment entry (plus e.g. its unknown intervals) and, if it is new, its samples."""
    return write_segment_rows_in(conn, [_row_values(s) for s in samples], entry, other_entries)


def write_segment_rows_in(conn: Connection, rows: Sequence[tuple], entry: Entry,
                          other_entries: Sequence[Entry] = ()) -> AppendResult:
    """:func:`write_segment_in` for rows already in normalised SAMPLE_COLUMNS form."""
    result = append_in(conn, [entry, *other_entries])
    already = conn.execute(text("SELECT 1 FROM samples WHERE segment_id = :s LIMIT 1"),
                           {"s": entry.entry_id}).first()
    if already is None and rows:
        sid = entry.entry_id
        if conn.dialect.name == "postgresql":
            raw = conn.connection.driver_connection
            with raw.cursor() as cur, cur.copy(f"COPY samples ({', '.join(INSERT_COLUMNS)}) FROM STDIN") as cp:
                for r in rows:
                    cp.write_row((sid, *r))
        else:
            marks = ",".join("?" * len(INSERT_COLUMNS))
            conn.exec_driver_sql(f"INSERT INTO samples ({', '.join(INSERT_COLUMNS)}) VALUES ({marks})",
                                 [(sid, *r) for r in rows])
    return result


def write_segment(engine: Engine, samples: Sequence[Sample], entry: Entry,
                  other_entries: Sequence[Entry] = ()) -> AppendResult:
    with write_tx(engine) as conn:
        return write_segment_in(conn, samples, entry, other_entries)


def load_samples(engine_or_conn, devices: Sequence[str] | None = None, start: float | None = None,  # noqa: ANN001
                 end: float | None = None, segment_ids: Sequence[str] | None = None) -> list[Sample]:
    """Samples overlapping [start, end) for these devices, ordered by (device, t)."""
    where, params = ["1=1"], {}
    if devices:
        where.append("device IN (" + ",".join(f":d{i}" for i in range(len(devices))) + ")")
        params.update({f"d{i}": d for i, d in enumerate(devices)})
    if segment_ids is not None:
        if not segment_ids:
            return []
        where.append("segment_id IN (" + ",".join(f":s{i}" for i in range(len(segment_ids))) + ")")
        params.update({f"s{i}": s for i, s in enumerate(segment_ids)})
    if start is not None:
        where.append("t + dt > :start")
        params["start"] = start
    if end is not None:
        where.append("t < :end")
        params["end"] = end
    sql = text(f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM samples WHERE {' AND '.join(where)} ORDER BY device, t")

    def _q(conn: Connection) -> list[Sample]:
        return [Sample(*_norm(row)) for row in conn.execute(sql, params)]

    if isinstance(engine_or_conn, Connection):
        return _q(engine_or_conn)
    with engine_or_conn.connect() as conn:
        return _q(conn)


@register_check
def _check_segment_digests(engine: Engine, report: VerifyReport) -> list[ChainProblem]:
    """Every sealed batch still hashes to what its segment entry recorded."""
    from ..store import iter_entries

    problems = []
    with engine.connect() as conn:
        for ce in iter_entries(conn, kinds=[Kind.TELEMETRY_SEGMENT]):
            want = ce.entry.data.get("samples_sha256")
            rows = conn.execute(text(f"SELECT {', '.join(SAMPLE_COLUMNS)} FROM samples WHERE segment_id = :s"),
                                {"s": ce.entry.entry_id}).fetchall()
            if rows and samples_digest([tuple(r) for r in rows]) != want:
                problems.append(ChainProblem(ce.seq, ce.entry.entry_id, "samples do not match the segment digest"))
            elif not rows and ce.entry.data.get("rows"):
                problems.append(ChainProblem(ce.seq, ce.entry.entry_id, "samples of this segment are missing"))
    return problems
