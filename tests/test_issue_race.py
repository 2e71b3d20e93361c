"""Two shippers issuing the same run's receipt at once: the ledger keeps one receipt_issued, not two.

The race is made deterministic: the second issuer's first look at the ledger is stale (it sees no receipt),
exactly as when both read before either appends; the check repeated under the chain lock must still refuse
the duplicate.
"""

from __future__ import annotations

from ledger.chain import db as db_mod
from ledger.chain.entries import Kind
from ledger.receipts import issue as issue_mod
from ledger.receipts.example import KEY, load_example
from ledger.receipts.compute import RunKey
from ledger.chain.store import iter_entries


def _issued(engine) -> list:
    return list(iter_entries(engine, kinds=[Kind.RECEIPT_ISSUED]))


def test_a_stale_second_issuer_does_not_issue_the_same_receipt_twice(ledger_url, monkeypatch):
    eng = db_mod.make_engine(ledger_url)
    load_example(eng)
    first = issue_mod.issue_receipt(eng, KEY["job_id"], KEY["run"], cluster=KEY["cluster"])
    assert first.status == "issued"

    real = issue_mod.issued_entries
    looks = []

    def stale_first_look(engine_or_conn, key: RunKey):
        looks.append(key)
        return [] if len(looks) == 1 else real(engine_or_conn, key)

    monkeypatch.setattr(issue_mod, "issued_entries", stale_first_look)
    second = issue_mod.issue_receipt(eng, KEY["job_id"], KEY["run"], cluster=KEY["cluster"])
    assert len(looks) == 2, "the second look, under the chain lock, must happen"
    assert second.status == "unchanged" and second.entry is None
    assert second.receipt.hash == first.receipt.hash
    assert [c.entry.entry_id for c in _issued(eng)] == [first.entry.entry_id]
    eng.dispose()
