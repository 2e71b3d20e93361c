"""Contracts cannot silently zero or reprice: `contract set` refuses a typo'd SKU key, an unpriced SKU in use and
a zero rate; a contract prices runs that start while it is in effect; an exported month keeps its receipts
and statement until `issue --reprice-closed --yes`, whose changes the next statement carries as corrections."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.contracts import ContractError, contract_entry, parse_contract, select_contract
from ledger.chain.entries import ChainedEntry, Kind, make_entry

SKU = "H100-SXM5-80GB"
NOV = 1_793_491_200.0  # 2026-11-01T00:00:00Z


def _runs(url: str, n: int = 3) -> None:
    """n two-hour one-GPU runs of tenant astro in November 2026 (no telemetry: all unknown, charged)."""
    eng = db_mod.make_engine(url)
    es = []
    for k in range(n):
        key = {"cluster": "c1", "job_id": f"90{k}", "run": 0, "node": "n1"}
        a = NOV + 86400 * (3 + k)
        es += [make_entry(Kind.ALLOCATION_STARTED, a, {"account": "astro"}, source="hook.slurm", **key),
               make_entry(Kind.DEVICE_BOUND, a, {"index": 0, "uuid": f"GPU-{k}", "sku": SKU}, device=f"GPU-{k}",
                          source="hook.slurm", **key),
               make_entry(Kind.ALLOCATION_ENDED, a + 7200, {"state": "COMPLETED"}, source="hook.slurm", **key)]
    store.append(eng, es)
    eng.dispose()


def _toml(tmp_path, name: str, body: str):
    p = tmp_path / name
    p.write_text('id = "astro-gpu"\nunknown_policy = "charge"\n' + body, encoding="utf-8")
    return p


def _invoke(runner, cli, url, *args):
    return runner.invoke(cli, ["--db", url, *args])


def _billed(runner, cli, url, job: str) -> tuple[str, float]:
    r = _invoke(runner, cli, url, "receipt", job, "--format", "json")
    assert r.exit_code == 0, r.output
    b = json.loads(r.stdout)
    return b["contract"]["version"], b["cost"]["billed_after_adjustments"]


def test_contract_set_refuses_a_typo_an_unpriced_sku_in_use_and_a_zero_rate(runner, cli, sqlite_url, tmp_path):
    _runs(sqlite_url)
    typo = _toml(tmp_path, "typo.toml", 'version = "1"\n[skus.H100-SXM-80GB]\nrate_per_gpu_hour = "2.00"\n')
    r = _invoke(runner, cli, sqlite_url, "contract", "set", str(typo))
    assert r.exit_code == 1
    assert r.output == (f"ipledger: {typo}: skus.H100-SXM-80GB: 'H100-SXM-80GB' is not a SKU in the SKU table "
                        f"(did you mean H100-SXM5-80GB?)\n")
    other = _toml(tmp_path, "other.toml", 'version = "1"\n[skus.MI300X]\nrate_per_gpu_hour = "2.00"\n')
    r = _invoke(runner, cli, sqlite_url, "contract", "set", str(other))
    assert r.exit_code == 1
    assert r.output == (f"ipledger: {other}: skus: SKU {SKU} is bound in the ledger (as '{SKU}') but has no price; "
                        f"add [skus.{SKU}] or [skus.default]\n")
    zero = _toml(tmp_path, "zero.toml", f'version = "1"\n[skus.{SKU}]\nrate_per_gpu_hour = "0"\n')
    r = _invoke(runner, cli, sqlite_url, "contract", "set", str(zero))
    assert r.exit_code == 1
    assert r.output == (f"ipledger: {zero}: skus.{SKU}: a rate of 0 bills nothing; give the price, or --allow-zero "
                        f"to record a free SKU\n")
    neg = _toml(tmp_path, "neg.toml", f'version = "1"\n[skus.{SKU}]\nrate_per_gpu_hour = "-1"\n')
    r = _invoke(runner, cli, sqlite_url, "contract", "set", str(neg), "--allow-zero")
    assert r.exit_code == 1 and "must be non-negative" in r.output and r.output.count("\n") == 1
    # nothing was recorded by the refusals: receipts are still priced under the built-in default
    assert _billed(runner, cli, sqlite_url, "900")[0] == "1"
    eng = db_mod.make_engine(sqlite_url)
    assert not list(store.iter_entries(eng, kinds=[Kind.CONTRACT_VERSION]))
    eng.dispose()
    r = _invoke(runner, cli, sqlite_url, "contract", "set", str(zero), "--allow-zero")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("bad, needle", [
    ('effective_from = "2026-11-01T00:00:00"', "effective_from must be an RFC 3339 time with its offset or a date"),
    ("effective_from = 2026-11-01T00:00:00", "effective_from must name its UTC offset"),
    ('effective_from = 2026-12-01\neffective_to = "2026-11-01"', "effective_to (2026-11-01T00:00:00Z) must be after"),
])
def test_effective_dates_are_checked(tmp_path, bad, needle):
    from ledger.chain.contracts import read_contract

    p = _toml(tmp_path, "c.toml", f'version = "1"\n{bad}\n[skus.default]\nrate_per_gpu_hour = "1"\n')
    with pytest.raises(ContractError) as exc:
        read_contract(p)
    assert needle in str(exc.value) and str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_a_contract_prices_the_runs_that_start_while_it_is_in_effect():
    def version(v, frm, to=None):
        terms = {"id": "k", "version": v, "effective_from": frm, "skus": {"default": {"rate_per_gpu_hour": "2"}},
                 **({"effective_to": to} if to else {})}
        return contract_entry(parse_contract(terms))

    es = [version("nov", "2026-11-01", "2026-12-01"), version("dec", "2026-12-01"), version("late-nov", "2026-11-15")]
    chain = [ChainedEntry(seq=i + 1, entry=e, prev_hash="0" * 64, hash=f"{i + 1:064x}") for i, e in enumerate(es)]
    day = 86400.0
    assert select_contract(chain, "a", at=NOV - day)[0].id == "ipledger-default"   # before any
    assert select_contract(chain, "a", at=NOV + 3 * day)[0].version == "nov"
    assert select_contract(chain, "a", at=NOV + 20 * day)[0].version == "late-nov"  # the latest recorded wins
    assert select_contract(chain, "a", at=NOV + 40 * day)[0].version == "late-nov"  # nov ended; dec is older
    assert select_contract(chain, "a", at=NOV + 20 * day, entry_id=es[0].entry_id)[0].version == "nov"  # pinned


def test_an_exported_month_keeps_its_receipts_until_reprice_closed_yes(runner, cli, sqlite_url, tmp_path):
    _runs(sqlite_url)
    v1 = _toml(tmp_path, "v1.toml", f'version = "1"\neffective_from = 2026-11-01\n[skus.{SKU}]\nrate_per_gpu_hour = "2.00"\n')
    assert _invoke(runner, cli, sqlite_url, "contract", "set", str(v1)).exit_code == 0
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet")
    assert r.exit_code == 0 and "3 runs: 3 issued" in r.output, r.output
    nov = tmp_path / "nov.json"
    r = _invoke(runner, cli, sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "json", "--out",
                str(nov), "--quiet")
    assert r.exit_code == 0, r.output
    before = json.loads(nov.read_text())["totals"]
    assert _billed(runner, cli, sqlite_url, "900") == ("1", 4.0)

    # a December contract: November's runs started before it took effect
    dec = _toml(tmp_path, "dec.toml", f'version = "2"\neffective_from = 2026-12-01\n[skus.{SKU}]\nrate_per_gpu_hour = "9.00"\n')
    assert _invoke(runner, cli, sqlite_url, "contract", "set", str(dec)).exit_code == 0
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet")
    assert r.exit_code == 0 and r.output == "3 runs: 0 issued, 0 re-issued, 3 unchanged, 0 failed\n"

    # new November terms: the exported month keeps the terms its statement was computed under, and says so
    nov3 = _toml(tmp_path, "nov3.toml", f'version = "3"\neffective_from = 2026-11-01\n[skus.{SKU}]\nrate_per_gpu_hour = "3.00"\n')
    assert _invoke(runner, cli, sqlite_url, "contract", "set", str(nov3)).exit_code == 0
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet")
    assert r.exit_code == 0 and r.stdout == "3 runs: 0 issued, 0 re-issued, 3 unchanged, 0 failed\n"
    assert r.stderr == ("kept the contract of 3 receipt(s) of exported months (2026-11): a newer contract applies; "
                        "--reprice-closed lists what it would change\n")
    assert _billed(runner, cli, sqlite_url, "900") == ("1", 4.0)  # the receipt says what the month billed
    r = _invoke(runner, cli, sqlite_url, "receipt", "900")
    assert r.exit_code == 0 and r.output.splitlines()[-1] == (
        "kept the contract of its last issue: exported month(s) 2026-11 (ipledger issue --reprice-closed to reprice)")
    r = _invoke(runner, cli, sqlite_url, "receipt", "900", "--verify")
    assert r.exit_code == 0, r.output                               # and the issued one replays
    again = tmp_path / "nov-again.json"
    assert _invoke(runner, cli, sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "json", "--out",
                   str(again), "--quiet").exit_code == 0
    assert json.loads(again.read_text())["totals"] == before

    # --reprice-closed lists the receipts and the money, and changes nothing without --yes
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet", "--reprice-closed")
    assert r.exit_code == 1
    assert r.stdout.splitlines() == [f"reprice c1 job 90{k} run 0 (astro, 2026-11): 4.00 -> 6.00 USD (+2.00)"
                                     for k in range(3)] + ["3 receipt(s) of exported months: +6.00 USD"]
    assert r.stderr == ("ipledger: 3 receipt(s) of exported months would change; nothing was issued "
                        "(add --yes to re-issue them)\n")
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet", "--yes")
    assert r.exit_code == 1 and r.output == "ipledger: --yes only confirms --reprice-closed\n"
    r = _invoke(runner, cli, sqlite_url, "issue", "--month", "2026-11", "--quiet", "--reprice-closed", "--yes")
    assert r.exit_code == 0 and "3 runs: 0 issued, 3 re-issued, 0 unchanged, 0 failed" in r.stdout, r.output
    r = _invoke(runner, cli, sqlite_url, "receipt", "900", "--verify")
    assert r.exit_code == 0, r.output
    assert _billed(runner, cli, sqlite_url, "900") == ("3", 6.0)

    # November's statement as exported stands; December's carries the corrections
    assert _invoke(runner, cli, sqlite_url, "export", "monthly", "--month", "2026-11", "--format", "json", "--out",
                   str(again), "--quiet").exit_code == 0
    assert json.loads(again.read_text())["totals"] == before
    decj = tmp_path / "dec.json"
    assert _invoke(runner, cli, sqlite_url, "export", "monthly", "--month", "2026-12", "--format", "json", "--out",
                   str(decj), "--quiet").exit_code == 0
    d = json.loads(decj.read_text())
    assert d["totals"]["corrections"] == 3 and Decimal(str(d["totals"]["billed"])) == Decimal("6.00")
    eng = db_mod.make_engine(sqlite_url)
    exported = [ce.entry.data["month"] for ce in store.iter_entries(eng, kinds=[Kind.STATEMENT_EXPORTED])]
    eng.dispose()
    assert exported == ["2026-11", "2026-11", "2026-11", "2026-12"]


def test_a_spool_cannot_close_a_month():
    """statement_exported is an operator's record: a spool line claiming one is refused like a contract."""
    from ledger.ingest import intake
    from ledger.chain.closed import statement_exported_entry

    rec = statement_exported_entry("2026-11", None, "csv", 1, "0" * 64).to_record()
    with pytest.raises(intake.Refused) as exc:
        intake.check_record(rec)
    assert str(exc.value) == "kind: 'statement_exported' is not an observation; it is recorded only through the ipledger CLI"
    assert Kind.STATEMENT_EXPORTED not in intake.SPOOL_KINDS
