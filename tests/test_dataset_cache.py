"""The agents' dataset cache (ledger/agents/dataset_cache.py) never changes an answer.

* `findings`, `ask`, `explain` and `account` (text and JSON) print byte for byte what they print with
  ``--no-cache`` (the dataset rebuilt from the sealed data), and a cache is really read (not rebuilt);
* an operator's verdict after the cache was written (not a part of the key) shows up as it does without the cache;
* a cache gone stale (the ledger moved) or tampered with (a byte changed, another key) is ignored;
* only a command that writes the ledger (`findings`) writes the cache; `ask`, `explain`, `account` only read it;
* the codec carries every value of the types it accepts back with the same type and bits (hypothesis), and the
  identity check it relies on when writing sees a one-value change.
"""

from __future__ import annotations

import io
import json
import math
import sqlite3

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.agents import dataset_cache
from ledger.agents.dataset_cache import Cached, cache_path
from ledger.chain.db import make_engine
from tests.test_agents import small_hall

QUESTION = "why did rack R3 lose GPU-hours in 2026-W45?"
COMMANDS = (["findings"], ["findings", "--json"], ["ask", QUESTION], ["ask", QUESTION, "--json"],
            ["ask", "which jobs wasted the most GPU-hours in 2026-W45?"], ["explain", "--rack", "R3"],
            ["explain", "--node", "C2", "--period", "2026-W45", "--json"], ["account"], ["account", "--json"],
            ["account", "--week", "2026-W45"])


@pytest.fixture
def ledger_copy(tmp_path):
    """A private copy of the small hall's ledger (the commands record findings and write the cache beside it)."""
    hall, _ = small_hall()
    dst = tmp_path / "ledger.db"
    with sqlite3.connect(hall.db_path) as src, sqlite3.connect(dst) as out:
        src.backup(out)
    return dst


def _run(runner, cli, db, args):  # noqa: ANN001, ANN202
    r = runner.invoke(cli, ["--db", f"sqlite:///{db}", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _forbid_rebuild(monkeypatch) -> None:  # noqa: ANN001
    """Make building the dataset from the sealed data fail: a command that still answers read the cache."""
    from ledger.agents import hourly

    def rebuilt(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the dataset was rebuilt, not read from the cache")

    monkeypatch.setattr(hourly, "load_compact", rebuilt)


def test_every_command_prints_the_same_with_and_without_the_cache(runner, cli, ledger_copy, monkeypatch):
    _run(runner, cli, ledger_copy, ["findings"])   # records the hall's findings and writes the cache
    assert cache_path(ledger_copy).is_file()
    plain = {tuple(a): _run(runner, cli, ledger_copy, [*a, "--no-cache"]) for a in COMMANDS}
    _forbid_rebuild(monkeypatch)
    for args in COMMANDS:
        assert _run(runner, cli, ledger_copy, args) == plain[tuple(args)], args


def test_a_verdict_after_the_cache_shows_as_without_it(runner, cli, ledger_copy, monkeypatch):
    out = json.loads(_run(runner, cli, ledger_copy, ["findings", "--json"]))
    cause = next(f for f in out["findings"] if f["agent"] != "recommendation")
    _run(runner, cli, ledger_copy, ["finding", "dismiss", cause["id"], "--by", "test"])
    commands = (["account", "--json"], ["findings", "--json"])
    plain = [_run(runner, cli, ledger_copy, [*args, "--no-cache"]) for args in commands]
    _forbid_rebuild(monkeypatch)   # a verdict does not move the key: the cache is still used
    assert [_run(runner, cli, ledger_copy, args) for args in commands] == plain
    assert any(f["status"]["status"] == "dismissed" for f in json.loads(plain[1])["findings"])


def test_read_only_commands_do_not_write_the_cache(runner, cli, ledger_copy):
    for args in (["ask", QUESTION], ["explain", "--rack", "R3"], ["account"]):
        _run(runner, cli, ledger_copy, args)
        assert not cache_path(ledger_copy).exists(), args
    _run(runner, cli, ledger_copy, ["findings", "--no-refresh"])
    assert not cache_path(ledger_copy).exists()


def _key(db) -> str:  # noqa: ANN001 - the cache key of the ledger as it is now
    engine = make_engine(f"sqlite:///{db}", read_only=True, create=False)
    try:
        with engine.connect() as conn:
            return dataset_cache.ledger_key(conn, dataset_cache.code_digest())
    finally:
        engine.dispose()


def _hit(db):  # noqa: ANN001, ANN202 - the cache's content, if it is a sound cache of the ledger as it is now
    return dataset_cache.read(cache_path(db), _key(db))


def test_a_stale_cache_is_ignored(runner, cli, ledger_copy):
    _run(runner, cli, ledger_copy, ["findings"])
    assert _hit(ledger_copy) is not None
    # the ledger moves: a progress mark of a job is an entry the dataset is built from
    engine = make_engine(f"sqlite:///{ledger_copy}")
    from ledger.chain.entries import Kind, make_entry
    from ledger.chain.store import append

    append(engine, [make_entry(Kind.PROGRESS, "2026-11-04T12:00:00Z", {"kind": "checkpoint", "step": 1},
                               cluster="demo", job_id="stale-test", run=0)])
    engine.dispose()
    assert _hit(ledger_copy) is None
    plain = _run(runner, cli, ledger_copy, ["account", "--json", "--no-cache"])
    assert _run(runner, cli, ledger_copy, ["account", "--json"]) == plain


def test_a_tampered_cache_is_ignored(runner, cli, ledger_copy):
    _run(runner, cli, ledger_copy, ["findings"])
    path = cache_path(ledger_copy)
    sound = path.read_bytes()
    assert _hit(ledger_copy) is not None
    # a changed figure, the manifest (and its digest) left as they were
    with np.load(io.BytesIO(sound), allow_pickle=False) as z:
        arrays = {n: z[n] for n in z.files}
    names = json.loads(arrays["manifest"].tobytes())["frames"]["samples"]["names"]
    column = f"samples/{names.index('h_del')}"
    arrays[column] = arrays[column].copy()
    arrays[column][len(arrays[column]) // 2] += 1.0
    edited = io.BytesIO()
    np.savez(edited, **arrays)
    path.write_bytes(edited.getvalue())
    assert _hit(ledger_copy) is None
    # a byte flipped in the middle of the file
    flipped = bytearray(sound)
    flipped[len(flipped) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    assert _hit(ledger_copy) is None
    # cut short
    path.write_bytes(sound[: len(sound) // 3])
    assert _hit(ledger_copy) is None
    # a sound cache of another key
    path.write_bytes(sound)
    assert dataset_cache.read(path, "0" * 64) is None
    assert _hit(ledger_copy) is not None
    path.write_bytes(flipped)
    plain = _run(runner, cli, ledger_copy, ["explain", "--rack", "R3", "--no-cache"])
    assert _run(runner, cli, ledger_copy, ["explain", "--rack", "R3"]) == plain


def test_a_cache_behind_a_symbolic_link_or_not_a_file_is_not_read(runner, cli, ledger_copy, tmp_path):
    """Whoever can write beside the ledger could point the cache name at another file for a root process to read:
    a link (even to a sound cache) and a non-regular file are ignored, and the answer is the ledger's own."""
    _run(runner, cli, ledger_copy, ["findings"])
    path = cache_path(ledger_copy)
    elsewhere = tmp_path / "elsewhere.npz"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert dataset_cache.read(elsewhere, _key(ledger_copy)) is not None   # a sound cache
    assert _hit(ledger_copy) is None
    path.unlink()
    path.mkdir()
    assert _hit(ledger_copy) is None
    plain = _run(runner, cli, ledger_copy, ["account", "--json", "--no-cache"])
    assert _run(runner, cli, ledger_copy, ["account", "--json"]) == plain


# --- the codec ---------------------------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=8), st.floats(allow_nan=True).map(np.float64),
                     st.integers(-2**63, 2**63 - 1).map(np.int64), st.booleans().map(np.bool_))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=4), st.integers(), st.none()), inner, max_size=4)), max_leaves=12)


def _same(a, b) -> bool:  # noqa: ANN001 - same type and bits, all the way down
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (float, np.floating)):
        return np.float64(a).tobytes() == np.float64(b).tobytes() or (math.isnan(a) and math.isnan(b))
    return a == b


@settings(max_examples=200, deadline=None)
@given(_values)
def test_plain_values_come_back_with_their_type_and_bits(value):
    back = dataset_cache._unvalue(json.loads(json.dumps(dataset_cache._value(value))))
    assert _same(value, back)


_labels = st.one_of(st.none(), st.just(float("nan")), st.sampled_from(["A1", "A2", "R3", ""]), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_labels, st.floats(allow_nan=True), st.booleans(), st.integers(-5, 5)), max_size=30),
       st.booleans())
def test_frames_come_back_identical_and_a_changed_value_is_seen(rows, str_dtype):
    df = pd.DataFrame({"label": pd.Series([r[0] for r in rows], dtype=object),
                       "x": pd.Series([r[1] for r in rows], dtype=float),
                       "flag": pd.Series([r[2] for r in rows], dtype=bool),
                       "n": pd.Series([r[3] for r in rows], dtype=np.int64)})
    if str_dtype:
        df["name"] = pd.Series([f"d{i}" if r[2] else None for i, r in enumerate(rows)], dtype="str")
    from ledger.agents.data import Dataset

    def cached(samples: pd.DataFrame) -> Cached:
        ds = Dataset(samples=samples, allocs=df.iloc[:0], devices=df.set_index(df["n"].astype(str)),
                     gaps=[], progress=df.iloc[:0], requeues=[], statuses={}, recorded=[], cadence=60.0,
                     start=0.0, end=1.0, through_seq=0)
        return Cached(dataset=ds, causes=())

    original = cached(df)
    back = dataset_cache.decode(dataset_cache.encode("k", original), "k")
    assert back is not None and dataset_cache.identical(back, original)
    if rows:   # one label changed in value or only in type (None / NaN, 1 / 1.0): seen
        first = rows[0][0]
        changed = df.copy()
        changed["label"] = pd.Series([_other(first), *df["label"].iloc[1:]], dtype=object)
        assert not dataset_cache.identical(cached(changed), original)


def _other(label):  # noqa: ANN001, ANN202 - a label equal to ``label`` at most in value, never in type and value
    if label is None:
        return float("nan")
    if isinstance(label, float):
        return None
    if isinstance(label, int):
        return float(label)
    return label + "z"


def test_a_hit_is_the_dataset_a_fresh_build_gives(runner, cli, ledger_copy):
    _run(runner, cli, ledger_copy, ["findings"])
    engine = make_engine(f"sqlite:///{ledger_copy}", read_only=True, create=False)
    try:
        fresh = dataset_cache.load(engine, None)
        hit = dataset_cache.load(engine, cache_path(ledger_copy))
    finally:
        engine.dispose()
    assert dataset_cache.identical(hit, fresh)
    for per_call in ("statuses", "recorded", "through_seq"):
        assert getattr(hit.dataset, per_call) == getattr(fresh.dataset, per_call), per_call
    assert hit.dataset.through_seq > 0 and hit.dataset.recorded
