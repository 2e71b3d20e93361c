"""An append's derived writes are one listed sequence of append steps (ledger.chain.store): the ledger's own
(Merkle nodes, receipt lines) then the caller's, all inside the append's transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry


def _entries(n: int, job: str = "9") -> list:
    return [make_entry(Kind.ALLOCATION_STARTED, f"2026-11-01T10:{i:02d}:00Z", {"account": "a"}, cluster="c",
                       job_id=job, run=0, node=f"n{i:02d}") for i in range(n)]


def _state(eng) -> tuple[int, tuple]:  # noqa: ANN001
    with eng.connect() as conn:
        return (conn.execute(text("SELECT COUNT(*) FROM entries")).scalar_one(), store.head(conn))


def test_the_ledgers_derived_writes_are_listed_in_order():
    assert store.DERIVED_WRITES == (store.merkle_nodes, store.receipt_line_rows)


def test_caller_steps_run_after_the_ledgers_own_and_see_what_was_appended(sqlite_url, monkeypatch):
    eng = db_mod.make_engine(sqlite_url)
    order = []
    monkeypatch.setattr(store.merkle, "on_append", lambda conn, first, leaves: order.append(("merkle", first)))
    monkeypatch.setattr(store.receipt_lines, "on_append", lambda conn, issued: order.append(("lines", len(issued))))

    def step(conn, appended):  # noqa: ANN001, ANN202
        order.append(("caller", appended.first_seq, len(appended.leaves)))

    with db_mod.write_tx(eng) as conn:
        store.append_in(conn, _entries(3), also=[step])
    with db_mod.write_tx(eng) as conn:   # all duplicates: the caller's step still runs, the ledger's do nothing
        store.append_in(conn, _entries(3), also=[step])
    assert order == [("merkle", 1), ("lines", 0), ("caller", 1, 3), ("caller", None, 0)]
    eng.dispose()


def test_a_failing_step_undoes_the_append_and_its_derived_writes(sqlite_url):
    eng = db_mod.make_engine(sqlite_url)
    store.append(eng, _entries(2, job="1"))
    before = _state(eng)

    def disk_full(conn, appended):  # noqa: ANN001, ANN202
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        with db_mod.write_tx(eng) as conn:
            store.append_in(conn, _entries(4, job="2"), also=[disk_full])
    assert _state(eng) == before and before[0] == 2
    eng.dispose()
