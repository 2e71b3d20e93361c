"""The ledger's Merkle tree (RFC 9162): one leaf per entry, kept up to date as entries are appended.

Leaf ``i`` is entry ``seq = i + 1``; its bytes are the entry's canonical chain encoding
(:func:`ledger.entries.hash_fields`, the very bytes whose SHA-256 is the entry's chain ``hash``), so the leaf
hash is SHA-256(0x00 ‖ those bytes). The table ``merkle_nodes`` (schema/versions/0004_merkle.py) holds every
*complete* subtree: row (level, idx) is the hash of leaves [idx·2^level, (idx+1)·2^level). Appending a leaf
adds its row and one row per subtree it completes (two rows per entry on average), found from the frontier
(the ≤ 64 complete subtrees the current size decomposes into), so the tree is never rebuilt. Any root,
inclusion proof or consistency proof of any earlier size is a handful of those rows.

Hashing and proof checking are :mod:`ledger.proofcheck`'s, the file a tenant runs, so both sides agree.
"""

from __future__ import annotations

import json
from hashlib import sha256
from typing import Callable, Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from .entries import ChainedEntry, hash_fields
from .proofcheck import leaf_hash, node_hash

TABLE = "merkle_nodes"
Key = tuple[int, int]  # (level, idx)
_FETCH = 50_000


class TreeError(RuntimeError):
    """The stored tree does not match the chain it is built over (one line)."""


def leaf_bytes(ce: ChainedEntry) -> bytes:
    return hash_fields(ce.seq, ce.entry, ce.prev_hash).encode("utf-8")


# --- pure tree arithmetic over leaf ranges ------------------------------------------------------------------

def _split(n: int) -> int:
    """RFC 9162's k: the largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def frontier_keys(size: int) -> list[Key]:
    """The complete subtrees a tree of ``size`` leaves decomposes into, left to right."""
    keys = []
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            keys.append((level, (size >> level) - 1))
    return keys


def range_hash(a: int, b: int, get: Callable[[Key], bytes]) -> bytes:
    """MTH(D[a:b]) for a range the RFC's recursion produces (``a`` aligned to the range's size)."""
    n = b - a
    if n & (n - 1) == 0:
        level = n.bit_length() - 1
        return get((level, a >> level))
    k = _split(n)
    return node_hash(range_hash(a, a + k, get), range_hash(a + k, b, get))


def inclusion_ranges(m: int, size: int) -> list[tuple[int, int]]:
    """RFC 9162 §2.1.3.1 PATH(m, D[0:size]) as the leaf ranges whose hashes make the proof, leaf upwards."""
    out: list[tuple[int, int]] = []
    a, b = 0, size
    while b - a > 1:
        k = _split(b - a)
        if m - a < k:
            out.append((a + k, b))
            b = a + k
        else:
            out.append((a, a + k))
            a = a + k
    return out[::-1]


def consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """RFC 9162 §2.1.4.1 PROOF(old, D[0:new]) as leaf ranges (0 < old < new)."""
    out: list[tuple[int, int]] = []
    a, b, m, whole = 0, new, old, True
    while m != b - a:
        k = _split(b - a)
        if m <= k:
            out.append((a + k, b))
            b = a + k
        else:
            out.append((a, a + k))
            a, m, whole = a + k, m - k, False
    if not whole:
        out.append((a, b))
    return out[::-1]


def _keys_of(ranges: Iterable[tuple[int, int]]) -> set[Key]:
    keys: set[Key] = set()

    def note(k: Key) -> bytes:
        keys.add(k)
        return b""

    for a, b in ranges:
        range_hash(a, b, note)
    return keys


# --- storage ---------------------------------------------------------------------------------------------------

def tree_size(conn: Connection) -> int:
    return int(conn.execute(text(f"SELECT COALESCE(MAX(idx) + 1, 0) FROM {TABLE} WHERE level = 0")).scalar_one())


def fetch_nodes(conn: Connection, keys: Iterable[Key]) -> dict[Key, bytes]:
    """Stored hashes of these subtrees, one round trip per 50,000 keys; a missing one raises TreeError."""
    want = sorted(set(keys))
    out: dict[Key, bytes] = {}
    pg = conn.dialect.name == "postgresql"
    for i in range(0, len(want), _FETCH):
        chunk = want[i:i + _FETCH]
        if pg:
            rows = conn.exec_driver_sql(
                f"SELECT m.level, m.idx, m.hash FROM {TABLE} m JOIN unnest(%(l)s::int[], %(i)s::bigint[]) "
                f"AS k(level, idx) ON m.level = k.level AND m.idx = k.idx",
                {"l": [k[0] for k in chunk], "i": [k[1] for k in chunk]})
        else:
            rows = conn.exec_driver_sql(
                f"SELECT m.level, m.idx, m.hash FROM json_each(?) j JOIN {TABLE} m "
                f"ON m.level = json_extract(j.value, '$[0]') AND m.idx = json_extract(j.value, '$[1]')",
                (json.dumps(chunk),))
        for level, idx, h in rows:
            out[(int(level), int(idx))] = bytes.fromhex(h)
    missing = [k for k in want if k not in out]
    if missing:
        raise TreeError(f"{TABLE}: subtree (level {missing[0][0]}, index {missing[0][1]}) is missing")
    return out


def _insert(conn: Connection, rows: list[tuple[int, int, str]]) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection  # psycopg 3
        with raw.cursor() as cur:
            with cur.copy(f"COPY {TABLE} (level, idx, hash) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
    else:
        conn.exec_driver_sql(f"INSERT INTO {TABLE} (level, idx, hash) VALUES (?, ?, ?)", rows)


def extend(conn: Connection, size: int, leaves: Sequence[bytes]) -> int:
    """Append leaves (their bytes) to a tree of ``size`` leaves, inside the caller's chain-locked transaction;
    returns the new size. Reads only the frontier and writes only the new rows."""
    if not leaves:
        return size
    frontier = {level: h for (level, _i), h in zip(frontier_keys(size),
                                                   _ordered(fetch_nodes(conn, frontier_keys(size)), size))}
    rows: list[tuple[int, int, str]] = []
    for data in leaves:
        carry = leaf_hash(data)
        rows.append((0, size, carry.hex()))
        level, idx = 0, size
        while idx & 1:
            carry = node_hash(frontier.pop(level), carry)
            idx >>= 1
            level += 1
            rows.append((level, idx, carry.hex()))
        frontier[level] = carry
        size += 1
    _insert(conn, rows)
    return size


def _ordered(nodes: dict[Key, bytes], size: int) -> list[bytes]:
    return [nodes[k] for k in frontier_keys(size)]


def sync(conn: Connection, through_seq: int) -> int:
    """Bring the tree up to entry ``through_seq`` from the entries table (a ledger written before the tree
    existed, or by a writer that predates it); returns the size. A tree longer than the chain is refused."""
    from .store import iter_entries

    size = tree_size(conn)
    if size > through_seq:
        raise TreeError(f"{TABLE} holds {size} leaves but the chain has {through_seq} entries at this point")
    batch: list[bytes] = []
    for ce in iter_entries(conn, after_seq=size, through_seq=through_seq):
        batch.append(leaf_bytes(ce))
        if len(batch) >= 10_000:
            size = extend(conn, size, batch)
            batch = []
    return extend(conn, size, batch)


def on_append(conn: Connection, first_seq: int, leaves: Sequence[bytes]) -> None:
    """The append path's hook (ledger.store.append_in): leaves of entries first_seq, first_seq + 1, ..."""
    size = tree_size(conn)
    if size != first_seq - 1:
        size = sync(conn, first_seq - 1)
    extend(conn, size, leaves)


# --- roots and proofs ------------------------------------------------------------------------------------------

def root_at(conn: Connection, size: int) -> bytes:
    """MTH of the first ``size`` leaves (the empty tree's root is SHA-256 of nothing)."""
    if size == 0:
        return sha256(b"").digest()
    nodes = fetch_nodes(conn, _keys_of([(0, size)]))
    return range_hash(0, size, nodes.__getitem__)


def inclusion_proofs(conn: Connection, indices: Sequence[int], size: int) -> dict[int, list[bytes]]:
    """Inclusion proofs of many leaves in the tree of ``size``, fetching every needed subtree at once."""
    plans = {m: inclusion_ranges(m, size) for m in set(indices)}
    if any(not 0 <= m < size for m in plans):
        raise TreeError(f"leaf outside a tree of size {size}")
    nodes = fetch_nodes(conn, _keys_of(r for ranges in plans.values() for r in ranges))
    return {m: [range_hash(a, b, nodes.__getitem__) for a, b in ranges] for m, ranges in plans.items()}


def consistency_proof(conn: Connection, old: int, new: int) -> list[bytes]:
    if not 0 <= old <= new:
        raise TreeError(f"no consistency proof from size {old} to size {new}")
    if old in (0, new):
        return []
    ranges = consistency_ranges(old, new)
    nodes = fetch_nodes(conn, _keys_of(ranges))
    return [range_hash(a, b, nodes.__getitem__) for a, b in ranges]


def current_root(engine: Engine) -> tuple[int, bytes]:
    """(size, root) of the tree as it stands."""
    with engine.connect() as conn:
        size = tree_size(conn)
        return size, root_at(conn, size)
