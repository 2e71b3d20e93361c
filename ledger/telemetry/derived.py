"""Keeping the derived device-hours (:mod:`ledger.telemetry.hours`) in step with the samples they summarise:
deriving them for segments sealed before they existed (``ipledger init``), and the ``ipledger verify`` check
that recomputes every segment's device-hours from its stored samples and names the first mismatch.
"""

from __future__ import annotations

from typing import Any, Callable

from ..chain.lite import text

from ..chain.entries import Kind
from ..chain.store import iter_entries
from ..chain.verify import ChainProblem
from . import hours
from .blocks import table_rows
from .sealed import DecodedSegments, read_samples, segment_samples


def backfill(conn) -> int:  # noqa: ANN001
    """Device-hours for every stored segment that has none (a ledger sealed before they existed)."""
    have = {r[0] for r in conn.execute(text(f"SELECT DISTINCT segment_id FROM {hours.TABLE}"))}
    ids = [r[0] for r in conn.execute(text("SELECT segment_id FROM sample_blocks UNION "
                                           "SELECT DISTINCT segment_id FROM samples")) if r[0] not in have]
    n = 0
    for sid in ids:
        n += hours.store_in(conn, sid, table_rows(read_samples(conn, segment_ids=[sid])))
    return n


def check_segments(engine, report, decoded: DecodedSegments | None = None,  # noqa: ANN001 - an ExtraCheck
                   meanwhile: Callable[[Any], None] | None = None, canonical: bool = False) -> list:
    """Every sealed segment, its samples read once: they still hash to what its entry recorded
    (:func:`ledger.telemetry.sealed.segment_samples`), its stored device-hours are what they give (the first
    mismatch named), and no device-hour names a segment the ledger does not hold. ``decoded``: keep the
    decoded blocks there for the receipt replays that follow; ``meanwhile(engine)`` is called first (verify starts
    its receipt replays in worker processes, to run while the segments are read); ``canonical`` (``verify
    --deep``): every segment's ``samples_sha256`` re-derived, even where its entry seals ``values_sha256``."""
    if meanwhile is not None:
        meanwhile(engine)
    problems = []
    with engine.connect() as conn:
        have_all = hours.stored_rows(conn)   # made into device-hours only where they differ from the samples'
        legacy = {r[0] for r in conn.execute(text("SELECT DISTINCT segment_id FROM samples"))}
        seen = set()
        for ce in iter_entries(conn, kinds=[Kind.TELEMETRY_SEGMENT]):
            sid = ce.entry.entry_id
            seen.add(sid)
            table, problem = segment_samples(conn, ce, decoded, canonical=canonical)
            if problem is not None:
                problems.append(problem)  # missing or altered samples: their device-hours are not judged
                continue
            if sid not in have_all and sid in legacy:
                continue  # rows stored before blocks, added after `init` derived theirs: none to check
            if sid not in have_all and table.num_rows:
                problems.append(ChainProblem(ce.seq, sid, f"no {hours.TABLE} rows for this segment (sealed before "
                                                          f"they existed? `ipledger init` derives them)"))
                continue
            # the device-hours as the stored rows would hold them: compared with those, made into DeviceHours only
            # if they differ
            why = hours.stored_mismatch(hours.aggregate_table(table, as_rows=True), have_all.get(sid, []))
            if why:
                problems.append(ChainProblem(ce.seq, sid, why))
        orphans = set(have_all) - seen
        if orphans:
            # Confirmed from the table's own rows: an index edited to hide a segment's entry is `verify --deep`'s
            # finding (the rows are intact), not device-hours without an entry.
            scan = "entries NOT INDEXED" if conn.dialect.name == "sqlite" else "entries"
            orphans -= {r[0] for r in conn.execute(text(f"SELECT entry_id FROM {scan} WHERE kind = :k"),
                                                   {"k": Kind.TELEMETRY_SEGMENT})}
        for sid in sorted(orphans):
            problems.append(ChainProblem(0, "", f"{hours.TABLE} holds rows of segment {sid}, which no entry seals"))
    return problems
