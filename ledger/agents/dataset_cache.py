"""A derived, checked cache of the agents' dataset and causes: what `findings`, `ask`, `explain` and `account` would
otherwise rebuild from the sealed sample blocks on every call (about 3 s on the demo ledger).

The cache is one file beside an SQLite ledger (``ledger.db.agents-cache``, a NumPy ``.npz`` read with
``allow_pickle=False``: arrays and a JSON manifest, nothing that runs code when read). It holds the device-hour
dataset :func:`ledger.agents.hourly.load_compact` builds (``detail=True``) and the causes the agents find in it
(every finding but the recommendations, which depend on operators' verdicts and are worked out on each call).

It never changes an answer:

- **Keyed by the chain.** The key is a digest of the cache format, the method's version, a digest of the code that
  computes what is cached (every source and data file of the ``ledger`` package), the versions of Python, NumPy
  and pandas, and the hash of the ledger's last entry of a kind the dataset is built from: every kind but the
  agents' own records and operators' verdicts (``finding_recorded`` / ``finding_confirmed`` /
  ``finding_dismissed``), which the cached part does not read. The chain is hash-linked, so that one hash commits
  to every entry before it (and through the telemetry segments' entries, to their sealed sample blocks). A cache
  of any other key is stale and is not used.
- **Checked when read.** The manifest carries the SHA-256 of every array; a file whose arrays do not match it
  (cut short, edited, swapped) is ignored, as is one that cannot be read at all. Whoever can write the ledger's
  directory can rewrite the ledger file itself, so the cache is trusted as far as the ledger file is; `--no-cache`
  recomputes from the sealed data.
- **Checked when written.** :func:`store` reads back what it wrote and keeps the file only when the read-back
  dataset and causes are identical to what was computed (dtypes, indexes, every value and its Python type);
  otherwise it removes it.
- **What a call adds.** The per-call parts (the verdicts, the findings already recorded, the ledger's head
  sequence number) are read from the ledger on every call, so the dataset a hit returns equals a fresh build.

Only commands that write the ledger anyway (`findings`, which records what it finds) write the cache; the read-only
commands only read it (tests/test_dataset_cache.py runs each command with and without it and compares the output
byte for byte).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import text

from ..chain.entries import Kind
from ..chain.store import iter_entries
from .data import Dataset, EntryScan
from .model import Evidence, Finding

FORMAT = "ipledger-agents-cache/1"
SUFFIX = ".agents-cache"
# The kinds the cached part does not read (they are read on every call): the agents' records, operators' verdicts.
PER_CALL_KINDS = (Kind.FINDING_RECORDED, Kind.FINDING_CONFIRMED, Kind.FINDING_DISMISSED)
FRAMES = ("samples", "allocs", "devices", "progress", "hourly")
_PACKAGE = Path(__file__).resolve().parent.parent   # the ledger package: its code computes what is cached


class Uncacheable(ValueError):
    """A value the cache's codec does not carry exactly (the cache is then not written)."""


@dataclass(frozen=True)
class Cached:
    """The ledger's agents' dataset and the causes found in it."""

    dataset: Dataset
    causes: tuple[Finding, ...]


def cache_path(ledger_file: Path) -> Path:
    """Where the cache of the SQLite ledger at ``ledger_file`` lives: beside it."""
    return ledger_file.with_name(ledger_file.name + SUFFIX)


def code_digest(package: Path = _PACKAGE) -> str:
    """SHA-256 over the ``ledger`` package's source and data files (path and bytes, in path order): any change to
    the code that computes the cached part makes every cache stale."""
    h = hashlib.sha256()
    for p in sorted(package.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".toml", ".csv", ".json"):
            h.update(p.relative_to(package).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def ledger_key(conn, code: str) -> str:  # noqa: ANN001 - a Connection
    """The cache key of the ledger behind ``conn`` (see the module docstring), for code of digest ``code``."""
    from ..method import METHOD_VERSION

    marks = ",".join(f":k{i}" for i in range(len(PER_CALL_KINDS)))
    row = conn.execute(text(f"SELECT seq, hash FROM entries WHERE kind NOT IN ({marks}) ORDER BY seq DESC LIMIT 1"),
                       {f"k{i}": k for i, k in enumerate(PER_CALL_KINDS)}).first()
    chain = "empty" if row is None else f"{int(row[0])}:{row[1]}"
    libraries = [sys.version, np.__version__, pd.__version__]   # whose arithmetic the cached figures are
    return hashlib.sha256(json.dumps([FORMAT, METHOD_VERSION, code, libraries, chain]).encode()).hexdigest()


def per_call(dataset: Dataset, conn) -> Dataset:  # noqa: ANN001 - a Connection
    """``dataset`` with what the ledger says now of the parts not cached: the verdicts, the recorded findings and
    the head's sequence number (what a fresh :class:`~ledger.agents.data.EntryScan` of every entry gives)."""
    scan = EntryScan()
    for ce in iter_entries(conn, kinds=list(PER_CALL_KINDS)):
        scan.add(ce)
    row = conn.execute(text("SELECT MAX(seq) FROM entries")).first()
    return replace(dataset, statuses=scan.statuses, recorded=scan.recorded,
                   through_seq=int(row[0]) if row and row[0] is not None else 0)


# --- the codec: plain values, findings, frames ---------------------------------------------------------------

def _value(v: Any) -> Any:
    """A JSON form of ``v`` that :func:`_unvalue` turns back into a value of the same type and bits."""
    t = type(v)
    if v is None or t in (str, bool, int):
        return v
    if t is float:
        return v if math.isfinite(v) else {"float": repr(v)}
    if t is np.float64:
        return {"f64": repr(float(v))}
    if t is np.int64:
        return {"i64": int(v)}
    if t is np.bool_:
        return {"b": bool(v)}
    if t is list:
        return [_value(x) for x in v]
    if t is tuple:
        return {"tuple": [_value(x) for x in v]}
    if t is dict:
        return {"dict": [[_value(k), _value(x)] for k, x in v.items()]}
    raise Uncacheable(f"a {t.__name__} value")


def _unvalue(j: Any) -> Any:
    if isinstance(j, list):
        return [_unvalue(x) for x in j]
    if not isinstance(j, dict):
        return j
    (tag, x), = j.items()
    if tag == "float":
        return float(x)
    if tag == "f64":
        return np.float64(float(x))
    if tag == "i64":
        return np.int64(x)
    if tag == "b":
        return np.bool_(x)
    if tag == "tuple":
        return tuple(_unvalue(y) for y in x)
    if tag == "dict":
        return {_unvalue(k): _unvalue(y) for k, y in x}
    raise ValueError(f"unknown tag {tag!r}")


def _finding(f: Finding) -> dict:
    out = {fl.name: _value(getattr(f, fl.name)) for fl in fields(Finding) if fl.name != "evidence"}
    out["evidence"] = [{fl.name: _value(getattr(e, fl.name)) for fl in fields(Evidence)} for e in f.evidence]
    return out


def _unfinding(j: dict) -> Finding:
    ev = tuple(Evidence(**{k: _unvalue(v) for k, v in e.items()}) for e in j["evidence"])
    return Finding(**{k: _unvalue(v) for k, v in j.items() if k != "evidence"}, evidence=ev)


def _column(name: str, col: pd.Series | pd.Index, arrays: dict[str, np.ndarray]) -> dict:
    """Store one column: a NumPy-typed one as its array, any other as codes into a list of its distinct values."""
    dtype = col.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
        arrays[name] = np.ascontiguousarray(col.to_numpy())
        return {"dtype": dtype.str}
    values = col.to_numpy(dtype=object) if isinstance(dtype, np.dtype) else np.asarray(col.astype(object),
                                                                                     dtype=object)
    index: dict = {}
    distinct: list = []
    codes = np.empty(len(values), dtype=np.int32)
    for i, v in enumerate(values):
        key = ("nan",) if type(v) is float and v != v else (type(v), v)
        c = index.get(key)
        if c is None:
            c = index[key] = len(distinct)
            distinct.append(_value(v))
        codes[i] = c
    arrays[name] = codes
    return {"dtype": str(dtype), "values": distinct}


def _uncolumn(meta: dict, codes_or_values: np.ndarray) -> Any:
    if "values" not in meta:
        return codes_or_values
    distinct = np.empty(len(meta["values"]), dtype=object)
    distinct[:] = [_unvalue(v) for v in meta["values"]]
    values = distinct[codes_or_values]
    return values if meta["dtype"] == "object" else pd.array(values, dtype=pd.api.types.pandas_dtype(meta["dtype"]))


def _frame(name: str, df: pd.DataFrame, arrays: dict[str, np.ndarray]) -> dict:
    cols = [_column(f"{name}/{i}", df.iloc[:, i], arrays) for i in range(df.shape[1])]
    idx = df.index
    if isinstance(idx, pd.RangeIndex) and idx.start == 0 and idx.step == 1 and idx.name is None:
        index = {"range": len(idx)}
    else:
        index = {"name": _value(idx.name), **_column(f"{name}/index", idx, arrays)}
    return {"names": [_value(c) for c in df.columns], "names_dtype": str(df.columns.dtype), "columns": cols,
            "index": index}


def _unframe(name: str, meta: dict, arrays) -> pd.DataFrame:  # noqa: ANN001 - an NpzFile
    im = meta["index"]
    if "range" in im:
        index = pd.RangeIndex(im["range"])
    else:
        index = pd.Index(_uncolumn(im, arrays[f"{name}/index"]), dtype=pd.api.types.pandas_dtype(im["dtype"]),
                         name=_unvalue(im["name"]))
    data = {i: pd.Series(_uncolumn(c, arrays[f"{name}/{i}"]), index=index, copy=False,
                         dtype=object if c["dtype"] == "object" else None) for i, c in enumerate(meta["columns"])}
    df = pd.DataFrame(data, index=index, copy=False)
    df.columns = pd.Index([_unvalue(n) for n in meta["names"]], dtype=pd.api.types.pandas_dtype(meta["names_dtype"]))
    return df


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def encode(key: str, cached: Cached) -> bytes:
    """The cache file's bytes for ``cached`` under ``key``."""
    ds = cached.dataset
    arrays: dict[str, np.ndarray] = {}
    frames = {n: _frame(n, getattr(ds, n), arrays) for n in FRAMES if getattr(ds, n) is not None}
    manifest = {"format": FORMAT, "key": key, "frames": frames,
                "plain": {"gaps": _value(ds.gaps), "requeues": _value(ds.requeues), "cadence": _value(ds.cadence),
                          "start": _value(ds.start), "end": _value(ds.end), "currency": _value(ds.currency),
                          "rates": _value(ds.rates), "sample_count": _value(ds.sample_count)},
                "causes": [_finding(f) for f in cached.causes]}
    manifest["digest"] = _digest(arrays)
    buf = io.BytesIO()
    np.savez(buf, manifest=np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def decode(data: bytes | Path, key: str) -> Cached | None:
    """The cached dataset (per-call parts blank) and causes, or None when ``data`` is not a cache of ``key`` whose
    arrays match their digest."""
    try:
        with np.load(io.BytesIO(data) if isinstance(data, bytes) else data, allow_pickle=False) as z:
            manifest = json.loads(z["manifest"].tobytes())
            if manifest.get("format") != FORMAT or manifest.get("key") != key:
                return None
            arrays = {n: z[n] for n in z.files if n != "manifest"}
        if _digest(arrays) != manifest["digest"]:
            return None
        frames = {n: _unframe(n, m, arrays) for n, m in manifest["frames"].items()}
        plain = {k: _unvalue(v) for k, v in manifest["plain"].items()}
        ds = Dataset(**{n: frames.get(n) for n in FRAMES}, **plain, statuses={}, recorded=[], through_seq=0)
        return Cached(dataset=ds, causes=tuple(_unfinding(j) for j in manifest["causes"]))
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile, EOFError):
        return None


READ_LIMIT = 2 << 30   # bytes: a cache larger than the agents' memory budget is not one this code wrote


def read(path: Path, key: str) -> Cached | None:
    """The cache at ``path`` if it is a sound cache of ``key``, else None (a missing file included). Read through
    no symbolic link (the command may run as root beside a ledger another user can reach), only a regular file,
    and at most :data:`READ_LIMIT` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_size > READ_LIMIT:
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(READ_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if len(data) > READ_LIMIT else decode(data, key)


def identical(a: Cached, b: Cached) -> bool:
    """Whether two cached values are the same to the bit and the type: what :func:`store` requires of the read-back."""
    for n in FRAMES:
        x, y = getattr(a.dataset, n), getattr(b.dataset, n)
        if (x is None) != (y is None):
            return False
        if x is not None and not _frames_identical(x, y):
            return False
    for n in ("gaps", "requeues", "cadence", "start", "end", "currency", "rates", "sample_count"):
        if json.dumps(_value(getattr(a.dataset, n))) != json.dumps(_value(getattr(b.dataset, n))):
            return False
    return json.dumps([_finding(f) for f in a.causes]) == json.dumps([_finding(f) for f in b.causes])


def _frames_identical(x: pd.DataFrame, y: pd.DataFrame) -> bool:
    if x.shape != y.shape or list(x.columns) != list(y.columns) or x.columns.dtype != y.columns.dtype:
        return False
    if not _series_identical(x.index, y.index) or x.index.name != y.index.name or type(x.index) is not type(y.index):
        return False
    return all(_series_identical(x.iloc[:, i], y.iloc[:, i]) for i in range(x.shape[1]))


def _series_identical(x: pd.Series | pd.Index, y: pd.Series | pd.Index) -> bool:
    if x.dtype != y.dtype:
        return False
    if isinstance(x.dtype, np.dtype) and x.dtype.kind in "biuf":
        return x.to_numpy().tobytes() == y.to_numpy().tobytes()
    a, b = np.asarray(x.astype(object), dtype=object), np.asarray(y.astype(object), dtype=object)
    return all(type(u) is type(v) and (u == v or (type(u) is float and u != u and v != v)) for u, v in zip(a, b))


def store(path: Path, key: str, cached: Cached) -> bool:
    """Write the cache of ``key`` at ``path`` (atomically, owner-only) if it reads back identical to ``cached``;
    False (and no file left) when it cannot be written or would not read back the same."""
    try:
        data = encode(key, cached)
    except Uncacheable:
        return False
    back = decode(data, key)
    if back is None or not identical(back, cached):
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False


# --- the entry point ----------------------------------------------------------------------------------------------

def load(engine, cache: Path | None, write: bool = False) -> Cached:  # noqa: ANN001 - an Engine
    """The agents' device-hour dataset (with the raw samples of what they find) and its causes: from the cache at
    ``cache`` when it is a sound cache of this ledger, else computed (:func:`ledger.agents.hourly.load_compact`,
    :func:`ledger.agents.causes_of`) and, with ``write``, stored there for the next call. ``cache`` None: always
    computed, nothing written."""
    code = code_digest()
    with engine.connect() as conn:
        key = ledger_key(conn, code)
        hit = read(cache, key) if cache is not None else None
        if hit is not None:
            return Cached(dataset=per_call(hit.dataset, conn), causes=hit.causes)
    from . import causes_of
    from .hourly import load_compact

    ds = load_compact(engine, detail=True)
    fresh = Cached(dataset=ds, causes=tuple(causes_of(ds)))
    if cache is not None and write:
        with engine.connect() as conn:
            still = ledger_key(conn, code) == key   # the ledger did not move while the dataset was built
        if still:
            store(cache, key, fresh)
    return fresh
