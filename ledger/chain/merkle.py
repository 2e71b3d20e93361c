"""The ledger's Merkle tree (RFC 9162): one leaf per entry, kept up to date as entries are appended.

Leaf ``i`` is entry ``seq = i + 1``; its bytes are the entry's canonical chain encoding
(:func:`ledger.chain.entries.hash_fields`, the very bytes whose SHA-256 is the entry's chain ``hash``), so the leaf
hash is SHA-256(0x00 ‖ those bytes). The table ``merkle_nodes`` (schema/versions/0004_merkle.py) holds every
*complete* subtree of 2^STORED_LEVEL (16) leaves or more: row (level, idx) is the hash of leaves
[idx·2^level, (idx+1)·2^level). Smaller subtrees are recomputed from at most 16 entry rows when a proof
needs them, which keeps the tree at one row per 8 entries and its upkeep cheap on the shipping path.
Appending entries adds one row per stored subtree they complete, found from the frontier (the ≤ 64
complete subtrees the current size decomposes into), so the tree is never rebuilt. Any root, inclusion
proof or consistency proof of any earlier size is a handful of rows.

Hashing and proof checking are :mod:`ledger.proofcheck`'s, the file a tenant runs, so both sides agree.
"""

from __future__ import annotations

import json
from hashlib import sha256
from typing import Callable, Iterable, Sequence, TYPE_CHECKING

from .lite import text

from .entries import ChainedEntry, hash_fields
from ..proofcheck import leaf_hash, node_hash
from .rows import ENTRY_COLUMNS, iter_entries, to_chained

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

TABLE = "merkle_nodes"
STORED_LEVEL = 4  # subtrees of 16 leaves and up are stored; smaller ones are hashed from the entries
Key = tuple[int, int]  # (level, idx)
_FETCH = 50_000
_NODE0 = sha256(b"\x01")  # RFC 9162's node prefix, hashed once and copied


class TreeError(RuntimeError):
    """The stored tree does not match the chain it is built over (one line)."""


class PlantedNode(TreeError):
    """A stored row no tree of the ledger's entries has (see :func:`outside_nodes`): the tree is not extended
    over it, so a shipment names it instead of failing on the row it would have written there."""


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

def perfect_hash(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH of a power-of-two run of leaf hashes (node_hash inlined: verify hashes one run per 16 entries)."""
    level = list(leaf_hashes)
    while len(level) > 1:
        pairs = []
        for i in range(0, len(level), 2):
            h = _NODE0.copy()
            h.update(level[i])
            h.update(level[i + 1])
            pairs.append(h.digest())
        level = pairs
    return level[0]


def _present(conn: Connection, size: int) -> bool:
    try:
        fetch_nodes(conn, [k for k in frontier_keys(size) if k[0] >= STORED_LEVEL])
    except TreeError:
        return False
    return True


def tree_size(conn: Connection, chain_size: int | None = None) -> int:
    """How many of the chain's entries the stored tree covers: ``chain_size`` (default: the chain's length)
    unless a writer that predates the tree appended entries without it. Stored subtrees only ever cover a
    prefix of the chain, so the largest size whose frontier is stored is found by bisection."""
    if chain_size is None:
        chain_size = int(conn.execute(text("SELECT COALESCE(MAX(seq), 0) FROM entries")).scalar_one())
    if _present(conn, chain_size):
        return chain_size
    lo, hi = 0, chain_size  # frontier of lo is stored, of hi is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _present(conn, mid) else (lo, mid)
    return lo


def _leaves(conn: Connection, indices: Sequence[int]) -> dict[Key, bytes]:
    """Leaf hashes recomputed from the entries rows (leaf i is seq i + 1)."""
    out: dict[Key, bytes] = {}
    cols = ", ".join(ENTRY_COLUMNS)
    pg = conn.dialect.name == "postgresql"
    for i in range(0, len(indices), _FETCH):
        seqs = [m + 1 for m in indices[i:i + _FETCH]]
        if pg:
            rows = conn.execute(text(f"SELECT {cols} FROM entries WHERE seq = ANY(:s)"), {"s": seqs})
        else:
            rows = conn.execute(text(f"SELECT {cols} FROM entries WHERE seq IN (SELECT value FROM json_each(:s))"),
                                {"s": json.dumps(seqs)})
        for row in rows:
            ce = to_chained(row)
            out[(0, ce.seq - 1)] = leaf_hash(leaf_bytes(ce))
    return out


def fetch_nodes(conn: Connection, keys: Iterable[Key]) -> dict[Key, bytes]:
    """Hashes of these subtrees (stored ones, and small ones from the entries), one round trip per 50,000
    keys; a missing one raises TreeError."""
    want = sorted(set(keys))
    small = [k for k in want if k[0] < STORED_LEVEL]
    leaves = _leaves(conn, sorted({i for lv, idx in small for i in range(idx << lv, (idx + 1) << lv)}))
    out: dict[Key, bytes] = {}
    for lv, idx in small:
        run = [leaves.get((0, i)) for i in range(idx << lv, (idx + 1) << lv)]
        if None not in run:
            out[(lv, idx)] = perfect_hash(run)  # type: ignore[arg-type]
    want = [k for k in want if k[0] >= STORED_LEVEL]
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
            out[(int(level), int(idx))] = bytes(h)
    missing = [k for k in sorted(set(keys)) if k not in out]
    if missing:
        raise TreeError(f"{TABLE}: subtree (level {missing[0][0]}, index {missing[0][1]}) is missing")
    return out


def _insert(conn: Connection, rows: list[tuple[int, int, bytes]]) -> None:
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


def outside_nodes(conn: Connection, size: int, limit: int = 10) -> list[Key]:
    """The stored rows (level, idx) that are not a subtree of the tree of ``size`` leaves, first ``limit`` in
    (level, idx) order: a level below STORED_LEVEL, a negative index, or an index at or beyond ``size >> level``
    at its level (every row of a level above the root's). Index probes of the (level, idx) key, one statement,
    so the append path can afford it on every append."""
    top = size.bit_length() - 1  # the highest level a stored subtree of this tree can have
    cut = f"ORDER BY level, idx LIMIT {int(limit)}"
    wheres = [f"level < {STORED_LEVEL}", f"level > {max(top, STORED_LEVEL - 1)}"]
    for lv in range(STORED_LEVEL, top + 1):
        wheres += [f"level = {lv} AND idx < 0", f"level = {lv} AND idx >= {size >> lv}"]
    sql = " UNION ALL ".join(f"SELECT * FROM (SELECT level, idx FROM {TABLE} WHERE {w} {cut}) AS q{i}"
                             for i, w in enumerate(wheres))
    rows = conn.exec_driver_sql(f"SELECT level, idx FROM ({sql}) AS outside {cut}").fetchall()
    return [(int(lv), int(idx)) for lv, idx in rows]


def outside_reason(key: Key, size: int) -> str:
    return (f"{TABLE}: stored subtree (level {key[0]}, index {key[1]}) lies outside the tree of {size} entries: "
            f"no entry makes it (a row inserted behind ipledger's back)")


def extend(conn: Connection, size: int, leaves: Sequence[bytes]) -> int:
    """Append leaves (their bytes) to a tree of ``size`` leaves, inside the caller's chain-locked transaction;
    returns the new size. Reads only the frontier and writes only the new rows. A stored row outside the
    tree (:func:`outside_nodes`) raises :class:`PlantedNode`: nothing is written until it is gone."""
    if not leaves:
        return size
    planted = outside_nodes(conn, size, 1)
    if planted:
        raise PlantedNode(f"{outside_reason(planted[0], size)}; the tree (and so the ledger) is not extended "
                          f"until `ipledger verify` is clean (docs/proofs.md, \"A row outside the tree\")")
    keys = frontier_keys(size)
    nodes = fetch_nodes(conn, keys)
    frontier = {level: nodes[(level, i)] for level, i in keys}
    rows: list[tuple[int, int, bytes]] = []
    leaf0, node0 = sha256(b"\x00"), sha256(b"\x01")  # leaf_hash / node_hash inlined: the shipping hot path
    for data in leaves:
        h = leaf0.copy()
        h.update(data)
        carry = h.digest()
        level, idx = 0, size
        while idx & 1:
            h = node0.copy()
            h.update(frontier.pop(level))
            h.update(carry)
            carry = h.digest()
            idx >>= 1
            level += 1
            if level >= STORED_LEVEL:
                rows.append((level, idx, carry))
        frontier[level] = carry
        size += 1
    _insert(conn, rows)
    return size


def sync(conn: Connection, through_seq: int) -> int:
    """Bring the tree up to entry ``through_seq`` from the entries table (a ledger written before the tree
    existed, or by a writer that predates it); returns the size."""
    size = tree_size(conn, through_seq)
    batch: list[bytes] = []
    for ce in iter_entries(conn, after_seq=size, through_seq=through_seq):
        batch.append(leaf_bytes(ce))
        if len(batch) >= 10_000:
            size = extend(conn, size, batch)
            batch = []
    return extend(conn, size, batch)


def on_append(conn: Connection, first_seq: int, leaves: Sequence[bytes]) -> None:
    """The append path's hook (ledger.chain.store.append_in): leaves of entries first_seq, first_seq + 1, ...
    Only a tree that lags the chain (entries appended by a writer that predates it) is caught up first."""
    try:
        extend(conn, first_seq - 1, leaves)
    except PlantedNode:
        raise
    except TreeError:
        extend(conn, sync(conn, first_seq - 1), leaves)


# --- checking the stored tree in spans (verify's workers) ---------------------------------------------------
# ledger.chain.verify's chain workers each walk a span of the entries, its start a multiple of 2^STORED_LEVEL, and
# already hold every entry's chain encoding: each also hashes the leaves, checks every stored subtree wholly
# inside its span (span_subtrees_ok), and the caller checks the few that straddle two spans (joins_ok). Both
# together check exactly what heads.tree_problems recomputes from the entries, in one pass over them.

StoredRows = Callable[[int, int, int], Iterable[tuple[int, bytes]]]  # (level, a, b) -> rows a <= idx < b, in order


def span_subtrees_ok(first_leaf: int, low: Sequence[bytes], stored: StoredRows) -> bool:
    """Every stored subtree wholly inside a span of leaves hashes as recomputed: ``low`` are the span's complete
    2^STORED_LEVEL-leaf subtree hashes (computed from its leaves), the span starting at leaf ``first_leaf`` (a
    multiple of 2^STORED_LEVEL); each level's stored rows over the span must be exactly those hashes."""
    level, first, hashes = STORED_LEVEL, first_leaf >> STORED_LEVEL, list(low)
    while hashes:
        rows = iter(stored(level, first, first + len(hashes)))
        for i, want in enumerate(hashes, first):
            row = next(rows, None)
            if row is None or row[0] != i or bytes(row[1]) != want:
                return False
        if next(rows, None) is not None:
            return False
        if first & 1:  # its sibling lies before the span: the pair straddles a boundary (joins_ok)
            hashes, first = hashes[1:], first + 1
        hashes = [node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes) - 1, 2)]
        first, level = first >> 1, level + 1
    return True


def joins_ok(conn: Connection, size: int, span_starts: Sequence[int]) -> bool:
    """The rest of the check span_subtrees_ok made in every span (spans starting at these leaves, in order,
    covering a tree of ``size`` leaves): each stored subtree over a boundary between spans hashes its two stored
    children, and no level holds a subtree beyond ``size`` leaves (nor the level above the root's)."""
    keys: set[Key] = set()
    level = STORED_LEVEL
    while size >> level:
        keys.update((level, b >> level) for b in span_starts[1:]
                    if b & ((1 << level) - 1) and b >> level < size >> level)
        level += 1
    children = {(lv - 1, 2 * i + j) for lv, i in keys for j in (0, 1)}
    try:
        nodes = fetch_nodes(conn, keys | children)
    except TreeError:
        return False
    if any(node_hash(nodes[(lv - 1, 2 * i)], nodes[(lv - 1, 2 * i + 1)]) != nodes[(lv, i)] for lv, i in keys):
        return False
    extra = text(f"SELECT 1 FROM {TABLE} WHERE level = :lv AND idx >= :n LIMIT 1")
    return all(conn.execute(extra, {"lv": lv, "n": size >> lv}).first() is None
               for lv in range(STORED_LEVEL, level + 1))


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
