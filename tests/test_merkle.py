"""The ledger's Merkle tree: RFC 9162 hashing kept incrementally on append, proofs, and its `verify` check.

The reference is the RFC's own recursive definition of MTH over the whole list of leaves, computed here
from scratch; the ledger's stored tree, its roots at every size and its proofs must agree with it.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.chain import merkle, store
from ledger.chain.entries import Kind, chain_hash, make_entry
from ledger.proofcheck import Failure, check_consistency, leaf_hash, node_hash, root_from_inclusion
from ledger.receipts.auto import verify_checks
from ledger.chain.verify import verify


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 §2.1.1, literally."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


def entries(n: int, start: int = 0) -> list:
    return [make_entry(Kind.PROGRESS, 1_780_000_000 + i, {"i": i}, job_id="7") for i in range(start, start + n)]


def ledger_leaves(engine) -> list[bytes]:  # noqa: ANN001
    return [merkle.leaf_bytes(ce) for ce in store.iter_entries(engine)]


@given(st.integers(1, 300), st.data())
@settings(max_examples=60, deadline=None)
def test_proofs_from_stored_subtrees_match_the_rfc_definition(size, data):
    """Roots, inclusion and consistency proofs assembled from complete subtrees verify with the RFC's
    algorithms against the recursive MTH, and fail for any other leaf or old root."""
    leaves = [i.to_bytes(4, "big") for i in range(size)]
    nodes: dict = {}
    frontier: dict = {}
    for i, leaf in enumerate(leaves):  # the same frontier walk merkle.extend does, into a dict
        carry, level, idx = leaf_hash(leaf), 0, i
        nodes[(0, i)] = carry
        while idx & 1:
            carry = node_hash(frontier.pop(level), carry)
            idx, level = idx >> 1, level + 1
            nodes[(level, idx)] = carry
        frontier[level] = carry
    get = nodes.__getitem__
    n = data.draw(st.integers(1, size))
    root = merkle.range_hash(0, n, get)
    assert root == mth(leaves[:n])
    m = data.draw(st.integers(0, n - 1))
    path = [merkle.range_hash(a, b, get) for a, b in merkle.inclusion_ranges(m, n)]
    assert root_from_inclusion(m, n, leaf_hash(leaves[m]), path) == root
    assert root_from_inclusion(m, n, leaf_hash(b"other"), path) != root
    old = data.draw(st.integers(1, n))
    proof = [merkle.range_hash(a, b, get) for a, b in merkle.consistency_ranges(old, n)] if old < n else []
    check_consistency(old, n, mth(leaves[:old]), root, proof)
    if old < n:
        with pytest.raises(Failure):
            check_consistency(old, n, mth([b"x", *leaves[1:old]]), root, proof)


def test_tree_is_extended_on_every_append_and_matches_a_rebuild(engine):
    for batch in (1, 2, 5, 1, 8, 13, 1, 17, 33, 3):
        store.append(engine, entries(batch, start=store.count(engine)))
        leaves = ledger_leaves(engine)
        size, root = merkle.current_root(engine)
        assert size == len(leaves) and root == mth(leaves)
    with engine.connect() as conn:
        # stored rows: every complete subtree of 16 leaves and up, nothing else (about one per 8 entries)
        rows = conn.execute(text("SELECT COUNT(*) FROM merkle_nodes")).scalar_one()
        assert rows == sum(len(leaves) >> level for level in range(merkle.STORED_LEVEL, len(leaves).bit_length()))
        for size in range(1, len(leaves) + 1):
            assert merkle.root_at(conn, size) == mth(leaves[:size])
        proofs = merkle.inclusion_proofs(conn, range(len(leaves)), len(leaves))
        for m, path in proofs.items():
            assert root_from_inclusion(m, len(leaves), leaf_hash(leaves[m]), path) == mth(leaves)
        for old in range(1, len(leaves)):
            check_consistency(old, len(leaves), mth(leaves[:old]), mth(leaves),
                              merkle.consistency_proof(conn, old, len(leaves)))
    assert verify(engine, checks=verify_checks()).ok


def test_duplicates_add_no_leaves(engine):
    batch = entries(6)
    store.append(engine, batch)
    store.append(engine, batch + entries(2, start=6))
    assert merkle.current_root(engine) == (8, mth(ledger_leaves(engine)))


def test_leaf_bytes_are_the_chain_encoding(engine):
    store.append(engine, entries(3))
    for ce in store.iter_entries(engine):
        digest = hashlib.sha256(merkle.leaf_bytes(ce)).hexdigest()
        assert digest == ce.hash == chain_hash(ce.seq, ce.entry, ce.prev_hash)


def _raw_append(engine, batch, after: int, prev: str) -> str:  # noqa: ANN001
    """Entries written as a writer that predates the tree would: chained, no tree rows."""
    rows = []
    for seq, e in enumerate(batch, start=after + 1):
        h = chain_hash(seq, e, prev)
        rows.append(store._row(seq, e, prev, h))
        prev = h
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO entries ({', '.join(store.ENTRY_COLUMNS)}) VALUES "
                             f"({','.join('?' * len(store.ENTRY_COLUMNS))})", rows)
    return prev


def test_entries_written_without_the_tree_are_caught_up(sqlite_url):
    engine = db_mod.make_engine(sqlite_url)
    res = store.append(engine, entries(40))
    _raw_append(engine, entries(30, start=40), 40, res.head_hash)
    with engine.connect() as conn:
        assert merkle.tree_size(conn) == 47  # 40 built; the stored frontier of 47 (32 + 15) is that of 40
    report = verify(engine, checks=verify_checks())
    assert not report.ok and "covers 47 entries" in report.problems[0].reason
    store.append(engine, entries(2, start=70))
    assert merkle.current_root(engine) == (72, mth(ledger_leaves(engine)))
    assert verify(engine, checks=verify_checks()).ok
    engine.dispose()


def test_migration_builds_the_tree_of_an_existing_ledger(tmp_path):
    """A ledger at 0003 (no tree) holding entries: `ipledger init` (upgrade) builds the tree once."""
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = db_mod.make_engine(url)
    with engine.begin() as conn:
        command.upgrade(db_mod._alembic_config(conn), "0003")
    _raw_append(engine, entries(41), 0, "0" * 64)
    db_mod.upgrade(engine)
    assert merkle.current_root(engine) == (41, mth(ledger_leaves(engine)))
    store.append(engine, entries(3, start=41))
    assert merkle.current_root(engine) == (44, mth(ledger_leaves(engine)))
    assert verify(engine, checks=verify_checks()).ok
    engine.dispose()


@pytest.mark.parametrize("level,idx", [(4, 2), (5, 1), (6, 0)])
def test_verify_names_a_stored_subtree_that_was_rewritten(sqlite_url, level, idx):
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, entries(70))
    with engine.begin() as conn:  # an attacker with the file: triggers dropped, one row rewritten
        conn.exec_driver_sql("DROP TRIGGER merkle_nodes_no_update")
        conn.exec_driver_sql("UPDATE merkle_nodes SET hash = ? WHERE level = ? AND idx = ?", (b"\xab" * 32, level, idx))
    report = verify(engine, checks=verify_checks())
    assert not report.ok
    assert "merkle_nodes" in report.problems[0].reason
    assert report.problems[0].seq == (idx << level) + 1
    engine.dispose()


def test_nodes_are_append_only(sqlite_url):
    engine = db_mod.make_engine(sqlite_url)
    store.append(engine, entries(20))
    for sql in ("UPDATE merkle_nodes SET hash = x'00'", "DELETE FROM merkle_nodes"):
        with pytest.raises(Exception, match="append-only"):
            with engine.begin() as conn:
                conn.exec_driver_sql(sql)
    engine.dispose()


# --- verify's one-pass tree check (the chain walk's workers) against the reference heads.subtree_problems -----

N_BIG = 3000  # 187 stored subtrees of 16 and their parents up to level 11 (2,048 leaves)


@pytest.fixture(scope="module")
def big_ledger(tmp_path_factory):
    """A ledger file of N_BIG entries appended in uneven batches (as shipments do); tests copy it."""
    path = tmp_path_factory.mktemp("big") / "ledger.db"
    engine = db_mod.make_engine(f"sqlite:///{path}")
    db_mod.upgrade(engine)
    for start in range(0, N_BIG, 700):
        store.append(engine, entries(min(700, N_BIG - start), start=start))
    engine.dispose()
    return path


def _copy(big_ledger, tmp_path):  # noqa: ANN001, ANN202
    import shutil

    dst = tmp_path / "copy.db"
    shutil.copyfile(big_ledger, dst)
    return db_mod.make_engine(f"sqlite:///{dst}")


def _both_ways(engine, monkeypatch, workers):  # noqa: ANN001, ANN202
    """(fast report, reference report) of the full `verify`, the fast path forced on, then off."""
    from ledger.chain import verify as verify_mod

    monkeypatch.setattr(verify_mod, "FAST_MIN_ENTRIES", 1)
    fast = verify(engine, workers=workers, checks=verify_checks())
    monkeypatch.setattr(verify_mod, "FAST_MIN_ENTRIES", 10**12)
    reference = verify(engine, checks=verify_checks())
    return fast, reference


def _rewrite_entry(engine, seq: int) -> None:  # noqa: ANN001
    """An attacker with the file: one entry's payload changed and the chain re-hashed from it on, so the chain
    verifies (no anchor) and only the tree, built from the original entries, can tell."""
    from ledger.chain.entries import Entry, compute_entry_id

    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER entries_no_update")
        rows = conn.execute(text("SELECT * FROM entries WHERE seq >= :s ORDER BY seq"), {"s": seq}).mappings().all()
        prev = rows[0]["prev_hash"]
        for i, r in enumerate(rows):
            fields = {k: r[k] for k in ("kind", "ts", "payload", "ts_end", "recorded_at", "cluster", "job_id", "run",
                                        "node", "device", "source", "source_version", "entry_id")}
            if i == 0:
                fields["payload"] = '{"i":-1}'
                fields["entry_id"] = compute_entry_id(Entry(**fields))
            h = chain_hash(r["seq"], Entry(**fields), prev)
            conn.execute(text("UPDATE entries SET payload = :p, entry_id = :e, prev_hash = :ph, hash = :h "
                              "WHERE seq = :s"), {"p": fields["payload"], "e": fields["entry_id"], "ph": prev,
                                                  "h": h, "s": r["seq"]})
            prev = h


@pytest.mark.parametrize("workers", [1, 3])
def test_one_pass_tree_check_covers_every_stored_subtree(big_ledger, tmp_path, monkeypatch, workers):
    from ledger.chain import verify as verify_mod

    engine = _copy(big_ledger, tmp_path)
    monkeypatch.setattr(verify_mod, "FAST_MIN_ENTRIES", 1)
    report = verify_mod.verify_chain(engine, workers=workers, tree=True)
    assert report.ok and report.tree_checked
    fast, reference = _both_ways(engine, monkeypatch, workers)
    assert fast.ok and reference.ok and fast.tree_checked and not reference.tree_checked
    engine.dispose()


def _damage_stored_node(engine, damage: str, level: int, idx: int) -> None:  # noqa: ANN001
    """Rewrite or drop stored subtree (level, idx), or add one past the tree's end ("extra node")."""
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER merkle_nodes_no_update")
        conn.exec_driver_sql("DROP TRIGGER merkle_nodes_no_delete")
        if damage == "rewrite node":
            conn.exec_driver_sql("UPDATE merkle_nodes SET hash = ? WHERE level = ? AND idx = ?",
                                 (b"\xab" * 32, level, idx))
        elif damage == "drop node":
            conn.exec_driver_sql("DELETE FROM merkle_nodes WHERE level = ? AND idx = ?", (level, idx))
        else:
            conn.exec_driver_sql("INSERT INTO merkle_nodes VALUES (?, ?, ?)", (level, N_BIG >> level, b"\x01" * 32))


@pytest.mark.parametrize("damage", ["rewrite node", "drop node"])
@pytest.mark.parametrize("level,idx", [(6, 15), (7, 15), (11, 0), (4, 61), (4, 62)])
def test_subtrees_across_worker_ranges_are_checked(big_ledger, tmp_path, monkeypatch, damage, level, idx):
    """With 3 workers the ranges start at entries 993 and 1,985: (6, 15) and (7, 15) straddle a boundary (the
    parent checks them), (11, 0) all of them, (4, 61) and (4, 62) lie each side of one (the workers do)."""
    from ledger.chain import verify as verify_mod

    engine = _copy(big_ledger, tmp_path)
    _damage_stored_node(engine, damage, level, idx)
    assert not verify_mod.verify_chain(engine, workers=3, tree=True).tree_checked
    fast, reference = _both_ways(engine, monkeypatch, 3)
    assert not reference.ok and fast.problems == reference.problems
    if damage == "rewrite node":
        assert reference.problems[0].seq == (idx << level) + 1
    engine.dispose()


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_one_pass_tree_check_names_what_the_reference_names(big_ledger, tmp_path_factory, data):
    """A rewritten or missing stored subtree at any level (inside one worker's range or across two), a subtree
    too many, or an entry rewritten with the chain re-hashed after it: the fast path's report is the
    reference's, the first bad seq named."""
    from ledger.chain import verify as verify_mod

    engine = _copy(big_ledger, tmp_path_factory.mktemp("case"))
    level = data.draw(st.integers(merkle.STORED_LEVEL, 11), label="level")
    idx = data.draw(st.integers(0, (N_BIG >> level) - 1), label="idx")
    damage = data.draw(st.sampled_from(["rewrite node", "drop node", "extra node", "rewrite entry"]), label="damage")
    workers = data.draw(st.integers(1, 4), label="workers")
    seq = data.draw(st.integers(1, N_BIG), label="seq")
    stored_leaves = N_BIG >> merkle.STORED_LEVEL << merkle.STORED_LEVEL
    harmless = damage == "rewrite entry" and seq > stored_leaves  # the tail under no stored subtree
    if damage == "rewrite entry":
        _rewrite_entry(engine, seq)
    else:
        _damage_stored_node(engine, damage, level, idx)
    assert verify_mod.verify_chain(engine, workers=workers, tree=True).tree_checked == harmless
    with pytest.MonkeyPatch.context() as mp:
        fast, reference = _both_ways(engine, mp, workers)
    assert fast.problems == reference.problems
    assert reference.ok == harmless
    if damage == "rewrite node":
        assert reference.problems[0].seq == (idx << level) + 1
    if damage == "rewrite entry" and not harmless:
        assert reference.problems[0].seq == ((seq - 1) >> merkle.STORED_LEVEL << merkle.STORED_LEVEL) + 1
    engine.dispose()
