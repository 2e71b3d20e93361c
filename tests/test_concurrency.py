"""Many shippers at once, on both backends: no entry lost, none duplicated, one gapless verified chain.

A small version of bench/load_pg.py: 8 nodes (threads, each with its own spool and its own database
connection) play epilogs and ship after each; every epilog also records one fact that all nodes record
identically (so shippers race to record the same entry), and now and then a shipped file reappears in a
spool (a crash after commit, before the move), so at-least-once delivery is exercised too.
"""

from __future__ import annotations

from bench.load_pg import expected_ids, ledger_tally, run_shippers

SHIPPERS = 8
EPILOGS = 6


def test_concurrent_shippers_lose_nothing_and_duplicate_nothing(ledger_url):
    want = expected_ids(SHIPPERS, EPILOGS)
    tally = run_shippers(ledger_url, SHIPPERS, EPILOGS, processes=False)
    got = ledger_tally(ledger_url)

    assert tally["pending"] == 0, "every spool file was shipped and moved aside"
    assert got["ids"] == want, "exactly the expected facts are in the ledger"
    assert got["rows"] == got["distinct"] == len(want), "no fact recorded twice"
    assert (got["min_seq"], got["max_seq"]) == (1, len(want)), "one sequence, no gaps"
    assert got["chain_ok"] and got["verified"] == len(want), "one linear hash chain that verifies"
    # every record offered (including the shared facts and the re-shipped files) was either appended once or
    # recognised as a duplicate
    assert tally["appended"] == len(want)
    assert tally["appended"] + tally["duplicates"] == tally["records"]
    assert tally["duplicates"] > 0, "the shared facts and re-shipped files were offered more than once"
