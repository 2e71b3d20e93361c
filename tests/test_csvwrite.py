"""reports.csvwrite writes the same bytes as pandas' ``to_csv(index=False, float_format="%.6f")``.

pandas is the reference: random frames with the column kinds the statement's long table has (rounded and
unrounded floats, NaN, signed zeros, huge values, nullable and plain integers, text needing quotes or not,
missing text) are written both ways and compared byte for byte.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports import csvwrite

floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=False, width=64),
    st.floats(min_value=-1e8, max_value=1e8).map(lambda x: round(x, 6)),
    st.floats(min_value=-1e4, max_value=1e4).map(lambda x: round(x, 2)),
    st.sampled_from([0.0, -0.0, -1e-7, 5e-7, 2.5e-6, 1e9, -1e9 + 0.5, 999999999.999999, 1e300]),
)
texts = st.one_of(st.none(), st.text(alphabet=st.sampled_from('ab ,"\r\n\té=-+@1'), max_size=6),
                  st.sampled_from(["", "astro", "a,b", 'q"q', "line\nbreak", "cr\rx"]))


@st.composite
def frames(draw) -> pd.DataFrame:  # noqa: ANN001
    n = draw(st.integers(min_value=0, max_value=25))
    cols = {
        "f": draw(st.lists(floats, min_size=n, max_size=n)),
        "t": pd.Series(draw(st.lists(texts, min_size=n, max_size=n)), dtype="object"),
        "i": np.array(draw(st.lists(st.integers(-2**62, 2**62), min_size=n, max_size=n)), dtype="int64"),
        "ni": pd.array(draw(st.lists(st.one_of(st.none(), st.integers(-10**6, 10**6)), min_size=n, max_size=n)),
                       dtype="Int64"),
        "g": draw(st.lists(floats, min_size=n, max_size=n)),
        "s": pd.Series(draw(st.lists(texts, min_size=n, max_size=n)), dtype="string"),
    }
    df = pd.DataFrame({k: (np.array(v, dtype="float64") if k in ("f", "g") else v) for k, v in cols.items()})
    df["const"] = "2026-11"  # a scalar column: pandas infers its own text dtype
    return df


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames())
def test_same_bytes_as_pandas(tmp_path_factory, df):  # noqa: ANN001
    d = tmp_path_factory.mktemp("csv")
    df.to_csv(d / "pandas.csv", index=False, float_format="%.6f")
    csvwrite.write_csv(df, d / "arrow.csv")
    assert (d / "arrow.csv").read_bytes() == (d / "pandas.csv").read_bytes()


def test_a_statement_takes_the_arrow_path_and_matches_pandas(tmp_path, monkeypatch):
    """Every column of a real statement's long table is formatted column-wise (no silent pandas fallback)."""
    import datetime as dt

    from ledger.sim import synthetic_receipts as synthetic
    from reports.export import long_table, statement_from_issues
    from reports.issued import Issue, IssuedSet

    rs = list(synthetic.receipts(60, "2026-11", seed=5))
    at = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc).timestamp()
    issued = IssuedSet(issues=[Issue(i + 1, at, r) for i, r in enumerate(rs)], through_seq=len(rs), head_hash="h")
    table = long_table(statement_from_issues(issued, "2026-11"))
    assert all(csvwrite._formatter(t) is not None for t in table.dtypes)
    monkeypatch.setattr(table, "to_csv", None)  # the arrow path must not need pandas' writer
    csvwrite.write_csv(table, tmp_path / "arrow.csv")
    monkeypatch.undo()
    table.to_csv(tmp_path / "pandas.csv", index=False, float_format="%.6f")
    assert (tmp_path / "arrow.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_chunks_and_unsupported_dtypes_still_match(tmp_path, monkeypatch):
    monkeypatch.setattr(csvwrite, "CHUNK_ROWS", 7)
    df = pd.DataFrame({"x": np.linspace(-3, 3, 50).round(6), "s": [f"r{i}" if i % 3 else None for i in range(50)]})
    df.to_csv(tmp_path / "a.csv", index=False, float_format="%.6f")
    csvwrite.write_csv(df, tmp_path / "b.csv")
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()
    df["flag"] = df["x"] > 0  # bool: handed to pandas whole
    df.to_csv(tmp_path / "c.csv", index=False, float_format="%.6f")
    csvwrite.write_csv(df, tmp_path / "d.csv")
    assert (tmp_path / "d.csv").read_bytes() == (tmp_path / "c.csv").read_bytes()
