"""The column-wise readers (reports.issued_lines from the receipts' flat lines, reports.issued_columns from
their JSON) give the same statement as the dict path (load_issues + select_month + flatten), byte for byte
in every format, on generated ledgers with re-issues
(corrections across months), adjustments, unknown intervals, billing blocks and odd receipt shapes that must
fall back to the dict path."""

from __future__ import annotations

import datetime as dt
import json
import random
from unittest import mock

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.base import textsafe
from reports import issued_columns, issued_lines
from ledger.sim import synthetic_receipts as synthetic
from reports.export import build_statement, long_table, to_json, write

UTC = dt.timezone.utc
OCT = dt.datetime(2026, 10, 1, tzinfo=UTC).timestamp()
NOV = dt.datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _oddity(r: dict, rng: random.Random) -> dict:
    """One of the shapes a ledger may hold: most are taken column-wise, some only by the dict path."""
    k = rng.randrange(16)
    j, gh, cost = r["job"], r["gpu_hours"], r["cost"]
    if k == 0:
        r["adjustments"] = [{"id": "a1", "kind": "credit", "amount": -2.5, "gpu_hours": -1.0, "direction": "credit",
                             "reason": "gap", "by": "ops", "references": ["x"]}]
    elif k == 1:
        gh["paid"] = str(gh["paid"])  # a number written as text
    elif k == 2:
        j["job_id"] = int(j["job_id"])
        j["run"] = rng.choice([0, 1, None])
    elif k == 3:
        r["billing"] = {"unknown_gpu_hours_by_policy": {"charge": 0.1, "credit": 0, "estimate": 0.05,
                                                         "hold": gh["unknown"] / 2},
                        "gpu_hours_billed": gh["paid"] - 0.25}
        cost["billed_before_adjustments"] = cost["paid"] - 0.5
        cost["billed_after_adjustments"] = cost["paid"] - 0.75
    elif k == 4:
        r["unknown_intervals"] = [dict(iv, resolution=rng.choice([None, "credit", "", {"as": "charge"}]),
                                       gpu_hours=rng.choice([None, 0.25, 3]),
                                       device=rng.choice([None, "", "GPU-1"]))
                                  for iv in r["unknown_intervals"]] + [
            {"id": "g2", "start": _iso(NOV + 3600), "end": _iso(NOV + 5400), "resolution": "estimate"}]
    elif k == 5:
        r["window"]["end"] = r["window"]["end"].replace("Z", ".5+00:00")  # another RFC 3339 spelling
    elif k == 6:
        r["method"] = {}
        del r["contract"]
    elif k == 7:
        j["devices"] = [{"node": "", "sku": None}, {"node": "b\u00e9ta"}, {"node": "alpha", "sku": "A100"}]
        j["account"] = ""
        j["namespace"] = "ns-" + j["user"]
    elif k == 8:
        gh["unknown"] = 2
        gh["throttled"] = {"thermal": 1, "other": -0.0}
        cost["adjustments"] = 1.25
    elif k == 9:
        del j["devices"]
        r["window"]["end"] = None
    elif k == 10:
        j["partition"] = "=HYPERLINK(\"x\")"  # neutralised in CSV the same way either path
        j["user"] = "ev\u202eil"
    elif k == 11:  # a run across the month's start (billed in two months, in parts), or an open run's receipt
        start = dt.datetime.fromisoformat(r["window"]["end"].replace("Z", "+00:00")).replace(day=1, hour=0,
                                                                                           minute=0, second=0)
        r["window"]["start"] = _iso(start.timestamp() - rng.choice([1, 3600, 5 * 86400]))
        r["open"] = rng.random() < 0.3
    elif k == 12:  # receipt 1.4's energy and carbon blocks (money as text; a measured figure may be null)
        kwh = round(rng.uniform(0, 40), 6)
        r["energy"] = {"kwh": kwh, "source": "counter", "unknown_gpu_hours": rng.choice([0.0, 0.25, 1]),
                       "cost": {"currency": "EUR", "basis": "measured", "charged": f"{kwh * 0.25:.2f}",
                                "measured": rng.choice([None, f"{kwh * 0.25:.2f}"]), "tdp": f"{kwh * 0.4:.2f}"}}
        if rng.random() < 0.5:
            r["carbon"] = {"kg_co2e": round(kwh * 0.3, 6), "zone": "DE", "pue": 1.2}
    return r


def _ledger(url: str, seed: int, n: int) -> None:
    rng = random.Random(seed)
    eng = db_mod.make_engine(url)
    entries = []
    months = [("2026-10", OCT), ("2026-11", NOV), ("2026-12", DEC)]
    for mi, (month, t0) in enumerate(months):
        for r in synthetic.receipts(n, month, seed=seed + mi):
            r["job"]["job_id"] = f"{mi}{r['job']['job_id']}"
            r = _oddity(r, rng)
            end = r["window"]["end"] or r["window"]["start"]
            issued = dt.datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp() + 60
            entries.append((issued, r))
            if rng.random() < 0.25:  # a re-issue, before or after its month closed
                r2 = json.loads(json.dumps(r))
                r2["receipt_hash"] = r["receipt_hash"] + rng.choice(["", "-fixed"])
                r2["cost"]["paid"] = float(r["cost"]["paid"]) + rng.choice([0.0, 1.5])
                r2["adjustments"] = rng.choice([[], [{"id": "late", "amount": 3.0, "by": "bob"}]])
                entries.append((issued + rng.choice([3600.0, 40 * 86400.0]), r2))
    entries.sort(key=lambda e: e[0])
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, t, {"receipt_hash": r["receipt_hash"], "issued_at": _iso(t),
                                                           "through_seq": 1, "receipt": r},
                                  cluster="hpc1", job_id=str(r["job"]["job_id"]), run=0) for t, r in entries])
    eng.dispose()


def _outputs(eng, month, tenant, as_of, columnar, tmp_path):  # noqa: ANN001, ANN202
    st = build_statement(eng, month, tenant=tenant, as_of=as_of, columnar=columnar)
    out = {"json": json.dumps(to_json(st), sort_keys=True), "long": long_table(st).to_csv()}
    for fmt in ("csv", "focus", "parquet"):
        p = tmp_path / f"{columnar}.{fmt}"
        write(st, fmt, p)
        out[fmt] = p.read_bytes()
    return out


@hs.composite
def ledgers(draw):  # noqa: ANN001, ANN201
    return (draw(hs.integers(min_value=0, max_value=10_000)), draw(hs.integers(min_value=0, max_value=40)),
            draw(hs.sampled_from(["2026-10", "2026-11", "2026-12", "2027-01"])),
            draw(hs.sampled_from([None, "astro", "bio"])), draw(hs.sampled_from([None, 0.5])))


def test_columnar_reader_equals_dict_path(tmp_path_factory, soak):  # noqa: ANN001
    """``make test`` draws 8 ledgers (about 10 s here); ``--soak`` / IPLEDGER_SOAK=1 draws 200."""
    @settings(max_examples=200 if soak else 8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ledgers())
    def run(case) -> None:  # noqa: ANN001
        _compare(tmp_path_factory.mktemp("cols"), *case)

    run()


def _compare(tmp_path, seed, n, month, tenant, cut) -> None:  # noqa: ANN001, PLR0913
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    _ledger(url, seed, n)
    as_of = None
    if cut is not None:
        head = max((c.seq for c in store.iter_entries(eng)), default=0)
        as_of = int(head * cut)
    try:
        want = _outputs(eng, month, tenant, as_of, False, tmp_path)
    except Exception as exc:  # noqa: BLE001 - the columnar path must fail the same way (e.g. an unknown tenant)
        with pytest.raises(type(exc)) as got_exc:
            _outputs(eng, month, tenant, as_of, True, tmp_path)
        assert str(got_exc.value) == str(exc)
        return
    finally:
        eng.dispose()
    got = _outputs(eng, month, tenant, as_of, True, tmp_path)
    with mock.patch.object(issued_lines, "read_month", lambda *a, **k: None):  # the JSON column reader
        from_json = _outputs(eng, month, tenant, as_of, True, tmp_path)
    for k in want:
        assert got[k] == want[k], k
        assert from_json[k] == want[k], k


def test_plain_receipts_never_take_the_dict_path(tmp_path, monkeypatch):
    """Synthetic receipts (unknown intervals with and without resolution objects, no adjustments, issued
    once) are read entirely column-wise: the dict path's flatten sees none of them."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    rs = list(synthetic.receipts(300, "2026-11", seed=4))
    assert any(iv.get("resolution") for r in rs for iv in r["unknown_intervals"])
    store.append(eng, [make_entry(Kind.RECEIPT_ISSUED, NOV + 29 * 86400, {"receipt_hash": r["receipt_hash"],
                                                                          "receipt": r},
                                  cluster="hpc1", job_id=r["job"]["job_id"], run=0) for r in rs])
    seen: list[int] = []
    real = issued_columns.flatten_issues
    monkeypatch.setattr(issued_columns, "flatten_issues",
                        lambda issues, kind: seen.append(len(issues)) or real(issues, kind))
    got = issued_columns.read_month(eng, "2026-11")
    assert seen == [0]
    assert len(got.usage.rows) == 300 and list(got.usage_seqs) == sorted(got.usage_seqs)
    assert len(got.usage.unknowns) == sum(len(r["unknown_intervals"]) for r in rs)
    eng.dispose()


@settings(max_examples=300, deadline=None)
@given(hs.lists(hs.one_of(hs.none(), hs.text(), hs.integers(), hs.sampled_from(["=1", "-x", "+", "@a", "\tx", "a\rb",
                                                                                 "a\x85", "\u202eab", "\xa0", ""]),
                          hs.text(alphabet="=+-@\t\r\x00\x1f\x7f\x9f\xa0\u061c\u200f\u2069ab")), max_size=12))
def test_textsafe_column_scan_changes_exactly_the_cells_csv_cell_changes(values):
    df = pd.DataFrame({"text": pd.Series(values, dtype=object), "n": range(len(values))})
    out = textsafe.neutralise_frame(df)
    assert list(out["text"]) == [textsafe.csv_cell(v) for v in values]
    assert list(out["n"]) == list(range(len(values)))
