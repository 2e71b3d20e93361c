"""Reading the ``entries`` table back: its columns, a row as a chained entry, and filtered streaming.

Below both the store (which appends) and the Merkle tree (which rehashes stored entries), so neither has to
import the other to read the chain.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TYPE_CHECKING

from .lite import is_connection, text

from .entries import ChainedEntry, Entry

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

ENTRY_COLUMNS = ("seq", "entry_id", "kind", "ts", "ts_end", "recorded_at", "cluster", "job_id", "run", "node",
                 "device", "payload", "source", "source_version", "prev_hash", "hash")


def to_chained(row) -> ChainedEntry:  # noqa: ANN001
    e = Entry(kind=row.kind, ts=row.ts, payload=row.payload, ts_end=row.ts_end, recorded_at=row.recorded_at,
              cluster=row.cluster, job_id=row.job_id, run=row.run, node=row.node, device=row.device,
              source=row.source, source_version=row.source_version, entry_id=row.entry_id)
    return ChainedEntry(seq=int(row.seq), entry=e, prev_hash=row.prev_hash, hash=row.hash)


def iter_entries(
    engine_or_conn: Engine | Connection,
    *,
    through_seq: int | None = None,
    kinds: Sequence[str] | None = None,
    cluster: str | None = None,
    job_id: str | None = None,
    run: int | None = None,
    device: str | None = None,
    after_seq: int = 0,
    batch: int = 10_000,
) -> Iterator[ChainedEntry]:
    """Entries in sequence order, filtered; streamed in batches so memory stays flat on big ledgers."""
    where = ["seq > :after"]
    params: dict = {}
    if through_seq is not None:
        where.append("seq <= :through")
        params["through"] = through_seq
    if kinds:
        where.append("kind IN (" + ",".join(f":k{i}" for i in range(len(kinds))) + ")")
        params.update({f"k{i}": k for i, k in enumerate(kinds)})
    for col, val in (("cluster", cluster), ("job_id", job_id), ("run", run), ("device", device)):
        if val is not None:
            where.append(f"{col} = :{col}")
            params[col] = val
    sql = text(f"SELECT {', '.join(ENTRY_COLUMNS)} FROM entries WHERE {' AND '.join(where)} "
               f"ORDER BY seq LIMIT :lim")

    def _run(conn: Connection) -> Iterator[ChainedEntry]:
        last = after_seq
        while True:
            rows = conn.execute(sql, {**params, "after": last, "lim": batch}).fetchall()
            for row in rows:
                yield to_chained(row)
            if len(rows) < batch:
                return
            last = int(rows[-1].seq)

    if is_connection(engine_or_conn):
        yield from _run(engine_or_conn)
    else:
        with engine_or_conn.connect() as conn:
            yield from _run(conn)
