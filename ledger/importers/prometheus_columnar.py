"""query_range JSON files read by DuckDB's C JSON reader instead of ``json.loads``: the same collection, faster.

Decoding a large Prometheus export with the standard library's ``json`` and turning each value string into a
float one by one is most of what reading it costs; DuckDB reads all the files at once (in parallel), casts
timestamps and values to doubles, and hands back one list of each per series. Only documents that are plainly
well formed take this path: one JSON object per file with ``status`` absent or ``"success"``, a ``matrix``
result whose series each have a ``metric`` object and ``values`` of ``[time, value]`` pairs whose time and
value both read as finite numbers. Anything else (a vector, ``"NaN"``/``"+Inf"``/``N/A`` values, a malformed
file, DuckDB missing) returns no collection for that file, and :mod:`ledger.importers.prometheus` parses it
with the per-value path, which also words the errors. tests/test_import_formats.py compares both paths.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Mapping

from .common import Collected

_COLUMNS = ("{'status': 'JSON', 'data': 'STRUCT(resultType VARCHAR, result STRUCT(metric JSON, "
            "\"values\" VARCHAR[][])[])'}")

# One row per series: its file, its index in the result, whether the document and the series are plain (see
# the module doc: every point exactly two elements whose first and second read as finite doubles; a NaN or an
# infinity anywhere makes the sum non-finite, as does an overflowing sum, which only costs the fast path),
# the metric labels as JSON, and the times and values as doubles.
_SQL = f"""
WITH d AS (
  SELECT filename, status, data, count(*) OVER (PARTITION BY filename) AS docs
  FROM read_json($files, columns={_COLUMNS}, format='unstructured', filename=true,
                 maximum_object_size=2147483647)
), s AS (
  SELECT filename, docs, status, data.resultType AS rtype, unnest(range(len(data.result))) AS k,
         unnest(data.result) AS s
  FROM d
), p AS (
  SELECT filename, docs, status, rtype, k, s.metric AS metric, len(s."values") AS n,
         len(flatten(s."values")) AS cells,
         list_transform(s."values", lambda x: TRY_CAST(x[1] AS DOUBLE)) AS t,
         list_transform(s."values", lambda x: TRY_CAST(x[2] AS DOUBLE)) AS v
  FROM s
)
SELECT filename, k,
       coalesce(docs = 1 AND (status IS NULL OR status::VARCHAR = '"success"') AND rtype = 'matrix'
                AND json_type(metric) = 'OBJECT' AND cells = 2 * n AND list_count(t) = n AND list_count(v) = n
                AND (n = 0 OR (isfinite(list_sum(t)) AND isfinite(list_sum(v)))), false) AS clean,
       metric::VARCHAR AS metric, t, v
FROM p ORDER BY filename, k
"""


# DuckDB reads an absent "status" and a JSON null alike; the per-value path refuses the null, so a file that
# might hold one (the pattern may also match a label; declining is always safe) is left to it.
_NULL_STATUS = re.compile(r'"status"\s*:\s*null')


def read_files(texts: Mapping[str, str],
               add_series: Callable[[Collected, dict, list, list, str], None]) -> dict[str, Collected]:
    """{file name: its collection} for the files among ``texts`` (name: its decoded text, the file on disk)
    that take this path (see the module doc).

    ``add_series`` is the importer's own function, called per series (labels, float64 arrays of times and values,
    place) in the order of the file's result, so devices, contexts and every check are the importer's.
    """
    names = [n for n, text in texts.items() if not _NULL_STATUS.search(text)]
    if not names:
        return {}
    try:
        import duckdb

        con = duckdb.connect()
        try:
            table = con.sql(_SQL, params={"files": names}).to_arrow_table()
        finally:
            con.close()
    except Exception:  # noqa: BLE001 - any file DuckDB cannot read: every file takes the per-value path
        return {}
    files = table.column("filename").to_pylist()
    clean = table.column("clean").to_pylist()
    bad = {f for f, ok in zip(files, clean) if not ok}
    out: dict[str, Collected] = {}
    metrics = table.column("metric").to_pylist()
    times, values = table.column("t"), table.column("v")
    for i, (name, k) in enumerate(zip(files, table.column("k").to_pylist())):
        if name in bad or name not in names:
            continue
        c = out.get(name)
        if c is None:
            c = out[name] = Collected("prometheus", path=name)
        t = times[i].values.to_numpy(zero_copy_only=False)
        v = values[i].values.to_numpy(zero_copy_only=False)
        add_series(c, json.loads(metrics[i]), t, v, f"result[{k}]")
    return out
