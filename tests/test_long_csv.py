"""The streamed monthly CSV (reports.long_csv, what ``ipledger export monthly --format csv`` runs where it
answers) writes the same bytes as the reference, build_statement + write_csv: on plain ledgers, where it must
answer, and on ledgers with every odd shape, where it answers or declines and the reference writes."""

from __future__ import annotations

import datetime as dt

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from reports import long_csv
from ledger.sim import synthetic_receipts as synthetic
from reports.export import build_statement, write
from reports.statement_file import export_file
from tests.test_export_columns import _iso, _ledger

UTC = dt.timezone.utc
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()


def _engine(tmp_path):  # noqa: ANN001, ANN202
    eng = db_mod.make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    db_mod.upgrade(eng)
    return eng


def _plain_ledger(eng, seed: int, n: int, months=("2026-11",)) -> None:  # noqa: ANN001
    """Synthetic receipts (unknown intervals with and without resolutions, issued once): every one plain."""
    entries = []
    for k, month in enumerate(months):
        for r in synthetic.receipts(n, month, seed=seed + k):
            r["job"]["job_id"] = f"{k}{r['job']['job_id']}"
            t = dt.datetime.fromisoformat(r["window"]["end"].replace("Z", "+00:00")).timestamp() + 60
            entries.append((t, r))
    entries.sort(key=lambda e: e[0])
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, t, {"receipt_hash": r["receipt_hash"], "issued_at": _iso(t),
                                                           "receipt": r}, cluster="hpc1", job_id=r["job"]["job_id"],
                                  run=0) for t, r in entries])


def _reference(eng, month, as_of, path) -> bytes:  # noqa: ANN001
    write(build_statement(eng, month, as_of=as_of), "csv", path)
    return path.read_bytes()


def test_streamed_csv_equals_the_reference_on_plain_ledgers(tmp_path_factory, soak):  # noqa: ANN001
    @settings(max_examples=40 if soak else 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=hs.integers(0, 10_000), n=hs.integers(1, 60), cut=hs.sampled_from([None, 0.5, 0.9]))
    def run(seed: int, n: int, cut: float | None) -> None:
        _plain_case(tmp_path_factory.mktemp("plain"), seed, n, cut)

    run()


def _plain_case(tmp, seed: int, n: int, cut: float | None) -> None:  # noqa: ANN001
    eng = _engine(tmp)
    _plain_ledger(eng, seed, n, months=("2026-10", "2026-11"))
    as_of = None if cut is None else max(1, int(n * 2 * cut))
    for month in ("2026-10", "2026-11"):
        want = _reference(eng, month, as_of, tmp / "ref.csv")
        done = long_csv.write_month_csv(eng, month, tmp / "fast.csv", as_of=as_of)
        if as_of is None or month == "2026-10":
            assert done is not None  # a plain month is always streamed
        if done is not None:
            assert (tmp / "fast.csv").read_bytes() == want
            assert done.totals["runs"] == want.count(b"\nrun,")
    eng.dispose()


def test_streamed_csv_equals_the_reference_on_odd_ledgers(tmp_path_factory, soak):  # noqa: ANN001
    """Re-issues, adjustments, split and open runs, odd spellings, formulas: declined or equal, never different."""
    @settings(max_examples=60 if soak else 5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(seed=hs.integers(0, 10_000), n=hs.integers(0, 30),
           month=hs.sampled_from(["2026-10", "2026-11", "2026-12"]))
    def run(seed: int, n: int, month: str) -> None:
        tmp = tmp_path_factory.mktemp("odd")
        eng = _engine(tmp)
        _ledger(str(eng.url), seed, n)
        want = _reference(eng, month, None, tmp / "ref.csv")
        export_file(eng, month, "csv", tmp / "got.csv")
        assert (tmp / "got.csv").read_bytes() == want
        eng.dispose()

    run()


def test_a_reissued_run_and_its_correction_are_streamed(tmp_path):  # noqa: ANN001
    """A run re-issued after its month closed: the dict path plans it, the stream writes its rows (the
    October usage, the November correction) in the reference's order and bytes."""
    import json

    eng = _engine(tmp_path)
    _plain_ledger(eng, 5, 30, months=("2026-10", "2026-11"))
    r = next(iter(synthetic.receipts(30, "2026-10", seed=5)))
    r["job"]["job_id"] = f"0{r['job']['job_id']}"
    r2 = json.loads(json.dumps(r))
    r2["receipt_hash"] += "-fixed"
    r2["cost"]["paid"] = float(r["cost"]["paid"]) + 1.5
    t = NOV + 20 * 86400
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, t, {"receipt_hash": r2["receipt_hash"], "issued_at": _iso(t),
                                                           "receipt": r2}, cluster="hpc1",
                                  job_id=r2["job"]["job_id"], run=0)])
    for month in ("2026-10", "2026-11"):
        want = _reference(eng, month, None, tmp_path / "ref.csv")
        done = long_csv.write_month_csv(eng, month, tmp_path / "fast.csv")
        assert done is not None
        assert (tmp_path / "fast.csv").read_bytes() == want
    assert b",correction," in want and done.notes == ["1 correction(s) to earlier months' runs are billed in 2026-11."]
    eng.dispose()


def test_a_formula_or_a_comma_in_a_name(tmp_path):  # noqa: ANN001
    """A name the CSV neutralises is left to the reference; one the CSV only quotes is streamed."""
    eng = _engine(tmp_path)
    rs = list(synthetic.receipts(20, "2026-11", seed=3))
    rs[3]["job"]["partition"] = 'gpu,"big"'
    rs[5]["job"]["user"] = "=cmd()"
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, NOV + 29 * 86400, {"receipt_hash": r["receipt_hash"],
                                                                          "receipt": r},
                                  cluster="hpc1", job_id=r["job"]["job_id"], run=0) for r in rs])
    want = _reference(eng, "2026-11", None, tmp_path / "ref.csv")
    assert long_csv.write_month_csv(eng, "2026-11", tmp_path / "fast.csv") is None
    export_file(eng, "2026-11", "csv", tmp_path / "got.csv")
    assert (tmp_path / "got.csv").read_bytes() == want
    assert b'"gpu,""big"""' in want and b"'=cmd()" in want
    eng.dispose()


_CON = duckdb.connect()


@settings(max_examples=100, deadline=None)
@given(hs.lists(hs.one_of(hs.floats(-3 * long_csv.LARGE, 3 * long_csv.LARGE), hs.floats(-1e-3, 1e-3),
                         hs.integers(-10**9, 10**9).map(lambda k: (k + 0.5) / 1e6)), min_size=1, max_size=200),
       hs.sampled_from([2, 6]))
def test_number_cells_print_what_pandas_round_and_percent_format_print(values, decimals):  # noqa: ANN001
    """Over the range the stream answers (a run's figures below LARGE, so what it derives below 3 LARGE)."""
    x = np.array(values, dtype="float64")
    _CON.register("t", pa.table({"x": x}))
    got = _CON.execute(f"SELECT {long_csv._number_cell('r')} FROM (SELECT {long_csv._rounded('x', decimals)} "
                      f"AS r FROM t)").fetchall()
    want = ["%.6f" % v for v in pd.Series(x).round(decimals)]
    assert [g[0] for g in got] == want


def test_cli_streams_and_writes_the_reference_bytes(tmp_path):  # noqa: ANN001
    from ledger.cli.main import cli

    eng = _engine(tmp_path)
    _plain_ledger(eng, 7, 40)
    want = _reference(eng, "2026-11", None, tmp_path / "ref.csv")
    out = tmp_path / "cli.csv"
    res = CliRunner().invoke(cli, ["--db", str(eng.url), "export", "monthly", "--month", "2026-11", "--out",
                                   str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == want
    assert '"runs": 40' in res.output
    eng.dispose()


@pytest.mark.parametrize("month", ["2026-11", "2027-01"])
def test_an_empty_or_absent_month_is_the_reference(tmp_path, month):  # noqa: ANN001
    eng = _engine(tmp_path)
    _plain_ledger(eng, 1, 5)
    want = _reference(eng, month, None, tmp_path / "ref.csv")
    export_file(eng, month, "csv", tmp_path / "got.csv")
    assert (tmp_path / "got.csv").read_bytes() == want
    eng.dispose()
