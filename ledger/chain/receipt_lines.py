"""Flat receipt lines: the ``receipt_lines`` table, derived from every ``receipt_issued`` entry as it is appended.

An issued receipt is a JSON document inside its entry; the monthly export needs its figures as columns. So the
store writes, in the transaction that appends the issue (:func:`on_append`, called by
:func:`ledger.chain.store.append_in`), one row per line of the receipt:

* ``part`` lines, one per period part (:func:`ledger.base.periods.part_spans` under the receipt's period rule):
  who and what (run key, cluster, job, run, tenant, user, partition, QOS, nodes, SKU, contract, method,
  currency), the window, the part's month and span, and every figure the statement sums (GPU-hours by bucket,
  cost, billing), each a part's exact share when the receipt spans months (nano-units, largest remainder,
  the parts summing to the receipt's figure);
* ``unknown`` lines, one per unknown interval of the receipt (id, device, node, span, cause, policy,
  resolution, hours);
* one ``hash_only`` line for an issue that names its receipt by hash alone.

Every line is a pure function of (the entry's seq, its payload): :func:`lines_of`. ``verify`` re-derives them
all and names the seq of any line missing, extra or altered (:func:`problems`); a ledger written before
the table existed is derived once by migration 0005 (:func:`sync`), and :func:`sync` (run by every
``ipledger init``) also catches up entries appended by a writer that predates the table. Like ``entries``
the table is append-only. The first ``part`` line of each issue (and its ``hash_only`` line) carries the
run key, so counting and grouping that column sees every issue once.

A line records the receipt's values as the JSON holds them (numbers as 64-bit floats: exactly the JSON's
numbers, which are shortest-round-trip decimals; a part's share is a whole number of nano-units). ``plain``
says the receipt has the ordinary shape (every field of the type the receipt format gives it, no adjustment
lines, no energy or carbon block, timestamps spelled ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``): the export reads plain single-part receipts from
these lines, anything else from the receipt JSON itself, whose reading stays the definition.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any, Iterable, Mapping, Sequence, TYPE_CHECKING

from ..base import periods
from .kinds import Kind
from .lite import table_exists, text

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection

TABLE = "receipt_lines"
THROTTLE = ("thermal", "power_cap", "hw_slowdown", "sync_boost", "other")
POLICIES = ("charge", "credit", "estimate", "hold")
# Figures of a part line: (column, path in the receipt). Split over period parts.
FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("paid", ("gpu_hours", "paid")), ("delivered", ("gpu_hours", "delivered")),
    *((f"th_{c}", ("gpu_hours", "throttled", c)) for c in THROTTLE),
    ("underutilized", ("gpu_hours", "underutilized")), ("starved", ("gpu_hours", "starved")),
    ("idle_held", ("gpu_hours", "idle_held")), ("unknown", ("gpu_hours", "unknown")),
    ("suspended", ("gpu_hours", "suspended")),
    ("cost_paid", ("cost", "paid")), ("cost_delivered", ("cost", "delivered")), ("cost_lost", ("cost", "lost")),
    ("before", ("cost", "billed_before_adjustments")), ("cost_adj", ("cost", "adjustments")),
    ("after", ("cost", "billed_after_adjustments")), ("gbh", ("billing", "gpu_hours_billed")),
    ("flc", ("billing", "lost_since_checkpoint_credited")),
    *((f"pol_{p}", ("billing", "unknown_gpu_hours_by_policy", p)) for p in POLICIES),
)
# (column, SQL type), in row order. Text columns hold the receipt's text; REAL columns its numbers.
TEXT, REAL, INTEGER = "text", "real", "integer"   # SQLAlchemy types in table(), where the migration makes it
_T, _R, _I = TEXT, REAL, INTEGER
COLUMNS: tuple[tuple[str, Any], ...] = (
    ("seq", _I), ("line_kind", _T), ("line_no", _I), ("run_key", _T), ("plain", _I), ("part_month", _T),
    ("receipt_hash", _T),
    # part lines
    ("cluster", _T), ("job_id", _T), ("run", _I), ("tenant", _T), ("account", _T), ("namespace", _T),
    ("tenant_", _T), ("partition", _T), ("qos", _T), ("user", _T), ("nodes", _T), ("sku", _T),
    ("n_devices", _I), ("contract_id", _T), ("contract_version", _T), ("method_name", _T),
    ("method_version", _T), ("method_keys", _I), ("replaces_hash", _T), ("currency", _T), ("period_rule", _T),
    ("open", _I), ("window_start", _T), ("window_end", _T), ("part_start", _R), ("part_end", _R),
    ("n_parts", _I), ("through_seq", _I),
    *((c, _R) for c, _ in FIGURES), ("by_policy", _I), ("n_unknown_intervals", _I), ("n_adjustments", _I),
    # unknown lines
    ("iv_id", _T), ("iv_device", _T), ("iv_node", _T), ("iv_start", _T), ("iv_end", _T), ("iv_cause", _T),
    ("iv_policy", _T), ("iv_resolution", _T), ("iv_gpu_hours", _R),
)
NAMES = tuple(c for c, _ in COLUMNS)
_POS = {c: i for i, c in enumerate(NAMES)}
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z$")
_MAX_EXACT = 2 ** 53


def table(metadata: sa.MetaData | None = None) -> sa.Table:
    """The table as SQLAlchemy sees it (the migration creates it from this)."""
    import sqlalchemy as sa

    types = {TEXT: sa.Text, REAL: sa.Float(precision=53), INTEGER: sa.BigInteger}
    return sa.Table(TABLE, metadata or sa.MetaData(),
                    *(sa.Column(c, types[t], primary_key=c in ("seq", "line_kind", "line_no"), autoincrement=False)
                      for c, t in COLUMNS))


# --- derivation (pure) ---------------------------------------------------------------------------------------

class _Shape:
    """Reads a receipt's fields, noting whether each has the type the receipt format gives it."""

    def __init__(self) -> None:
        self.plain = True

    def obj(self, d: Any, key: str) -> Mapping:
        v = d.get(key) if isinstance(d, Mapping) else None
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            self.plain = False
            return {}
        return v

    def text(self, v: Any) -> str | None:
        if v is None or isinstance(v, str):
            return v
        self.plain = False
        return None

    def number(self, v: Any) -> float | None:
        if v is None:
            return None
        if v.__class__ in (int, float) and math.isfinite(v) and abs(v) < _MAX_EXACT \
                and not (v == 0 and math.copysign(1.0, v) < 0):
            return float(v)
        self.plain = False  # text, a bool, NaN, -0.0, a huge integer: the export reads the JSON itself
        return None

    def integer(self, v: Any) -> int | None:
        if v is None or (v.__class__ is int and abs(v) < _MAX_EXACT):
            return v
        self.plain = False
        return None

    def epoch(self, v: Any) -> float:
        if isinstance(v, str) and _ISO.match(v):
            try:
                return dt.datetime.fromisoformat(v).timestamp()
            except ValueError:
                pass
        if v is not None:
            self.plain = False
        return math.nan


def _get(r: Mapping, path: tuple[str, ...]) -> Any:
    v: Any = r
    for k in path:
        v = v.get(k) if isinstance(v, Mapping) else None
    return v


def receipt_of(payload: Any) -> Mapping | None:
    """The receipt an issue entry carries (in ``receipt``, or the payload itself), None when by hash only."""
    def is_receipt(d: Any) -> bool:
        return isinstance(d, Mapping) and "gpu_hours" in d and "job" in d

    if not isinstance(payload, Mapping):
        return None
    r = payload.get("receipt")
    return r if is_receipt(r) else (payload if is_receipt(payload) else None)


def _run_key(job: Mapping) -> str | None:
    """The run a statement keys the receipt by: [cluster, str(job_id), int(run or 0)] as JSON."""
    try:
        return json.dumps([job.get("cluster"), str(job.get("job_id")), int(job.get("run") or 0)])
    except (TypeError, ValueError):
        return None


def lines_of(seq: int, payload: Any) -> list[tuple]:
    """Every line of the issue entry ``seq`` with ``payload`` (decoded JSON), as tuples in :data:`NAMES` order."""
    r = receipt_of(payload)
    if r is None:
        return [_row(seq, "hash_only", 0, run_key="", plain=0,
                     receipt_hash=payload.get("receipt_hash") if isinstance(payload, Mapping)
                     and isinstance(payload.get("receipt_hash"), str) else None)]
    sh = _Shape()
    job = sh.obj(r, "job")
    for k in ("gpu_hours", "cost", "window", "contract", "method", "billing", "ledger"):
        sh.obj(r, k)
    sh.obj(r.get("gpu_hours"), "throttled")
    win = r.get("window") if isinstance(r.get("window"), Mapping) else {}
    contract = r.get("contract") if isinstance(r.get("contract"), Mapping) else {}
    method = r.get("method") if isinstance(r.get("method"), Mapping) else {}
    billing = r.get("billing") if isinstance(r.get("billing"), Mapping) else {}
    devices = job.get("devices")
    if devices is not None and not isinstance(devices, list):
        sh.plain, devices = False, []
    devices = devices or []
    nodes: set[str] = set()
    skus: set[str] = set()
    for d in devices:
        if not isinstance(d, Mapping):
            sh.plain = False
            continue
        node, sku = sh.text(d.get("node")), sh.text(d.get("sku"))
        if node:
            nodes.add(node)
        if sku:
            skus.add(sku)
    lines = r.get("devices")
    if isinstance(lines, list) and any(isinstance(d, Mapping) and "share" in d for d in lines):
        sh.plain = False  # a shared device's split (FOCUS AllocatedMethodDetails): the export reads the JSON
    if r.get("energy") is not None or r.get("carbon") is not None:
        sh.plain = False  # receipt 1.4's energy and carbon: the lines carry no such figures, the export reads the JSON
    adjs = r.get("adjustments")
    if adjs not in (None, []):
        sh.plain = False  # adjustment lines: the export reads the receipt from its JSON
    ivs = r.get("unknown_intervals")
    if ivs is not None and not isinstance(ivs, list):
        sh.plain, ivs = False, []
    ivs = ivs or []
    by_policy = billing.get("unknown_gpu_hours_by_policy")
    if by_policy is not None and not isinstance(by_policy, Mapping):
        sh.plain = False
    cost_adj = _get(r, ("cost", "adjustments"))
    figures = {c: (None if c == "cost_adj" and isinstance(cost_adj, (list, Mapping)) else sh.number(_get(r, p)))
               for c, p in FIGURES}
    account, namespace, tenant_ = (sh.text(job.get(k)) for k in ("account", "namespace", "tenant"))
    start, end = sh.epoch(win.get("start")), sh.epoch(win.get("end"))
    if win.get("start") is None:
        sh.plain = False
    rule = contract.get("period_rule")
    rule = rule if rule in periods.PERIOD_RULES else periods.DEFAULT_PERIOD_RULE
    is_open = r.get("open")
    if is_open is not None and not isinstance(is_open, bool):
        sh.plain = False
    job_id = job.get("job_id")
    if not isinstance(job_id, str):
        sh.plain = False
    version = contract.get("version")
    if version is not None and not isinstance(version, str):
        sh.plain = False
    common = {
        "cluster": sh.text(job.get("cluster")), "job_id": job_id if isinstance(job_id, str) else None,
        "run": sh.integer(job.get("run")), "tenant": account or namespace or tenant_, "account": account,
        "namespace": namespace, "tenant_": tenant_, "partition": sh.text(job.get("partition")),
        "qos": sh.text(job.get("qos")), "user": sh.text(job.get("user")),
        "nodes": ",".join(sorted(nodes)) if nodes else None,
        "sku": (sorted(skus)[0] if len(skus) == 1 else "mixed") if skus else None, "n_devices": len(devices),
        "contract_id": sh.text(contract.get("id")), "contract_version": version if isinstance(version, str) else None,
        "method_name": sh.text(method.get("name")), "method_version": sh.text(method.get("version")),
        "method_keys": int(bool(method)), "replaces_hash": sh.text(r.get("_replaces_hash")),
        "currency": sh.text(_get(r, ("cost", "currency"))), "period_rule": rule, "open": int(bool(is_open)),
        "window_start": sh.text(win.get("start")), "window_end": sh.text(win.get("end")),
        "through_seq": sh.integer(_get(r, ("ledger", "through_seq"))),
        "by_policy": int(isinstance(by_policy, Mapping)), "n_unknown_intervals": len(ivs),
        "n_adjustments": len(adjs) if isinstance(adjs, list) else 0,
    }
    iv_rows = [_interval(sh, iv) for iv in ivs]
    parts = _parts(sh, start, end, rule, bool(is_open))
    run_key = _run_key(job)
    if run_key is None:
        sh.plain, run_key = False, ""
    receipt_hash = sh.text(r.get("receipt_hash"))
    plain = int(sh.plain)
    base = {"plain": plain, "receipt_hash": receipt_hash, **common}
    rows = []
    if not parts:  # not billed in any month (an open run under "end", an unreadable window): one line
        rows.append(_row(seq, "part", 0, run_key=run_key, part_month=None, n_parts=0, **base, **figures))
    else:
        weights = periods.weights_of([(lo, hi) for _, lo, hi in parts])
        split = {c: (None if v is None else periods.split_nano(v, weights)) if len(parts) > 1 else None
                 for c, v in figures.items()}
        for k, (m, lo, hi) in enumerate(parts):
            part = figures if len(parts) == 1 else {c: None if s is None else s[k] for c, s in split.items()}
            # the run key on the first line only: one per issue, which the export counts and groups
            rows.append(_row(seq, "part", k, run_key=None if k else run_key, part_month=m, part_start=lo,
                             part_end=hi, n_parts=len(parts), **base, **part))
    month = parts[0][0] if len(parts) == 1 else None
    rows.extend(_row(seq, "unknown", k, plain=plain, part_month=month, receipt_hash=receipt_hash, **iv)
                for k, iv in enumerate(iv_rows))
    return rows


MAX_PARTS = 1200  # a window over a century of months is no run's: one line without a month, read from JSON


def _parts(sh: _Shape, start: float, end: float, rule: str, is_open: bool) -> list[tuple[str, float, float]]:
    """The receipt's period parts; none (and not plain) when its window cannot be placed in months."""
    if math.isnan(start):
        return []
    if not math.isnan(end) and (end - start) / 86400 / 28 > MAX_PARTS:
        sh.plain = False
        return []
    try:
        return periods.part_spans(start, start if math.isnan(end) else end, rule, is_open)
    except (ValueError, OverflowError):  # PeriodError: a window in 9999-12, which no month ends
        sh.plain = False
        return []


def _interval(sh: _Shape, iv: Any) -> dict:
    if not isinstance(iv, Mapping):
        sh.plain = False
        return {}
    hours = sh.number(iv.get("gpu_hours"))
    if iv.get("gpu_hours") is None:  # hours from the span: both ends must read as the export reads them
        for k in ("start", "end"):
            if iv.get(k) not in (None, ""):
                sh.epoch(iv.get(k))
    res = iv.get("resolution")
    if res is not None and not isinstance(res, (str, Mapping)):
        sh.plain = False
    return {"iv_id": sh.text(iv.get("id")), "iv_device": sh.text(iv.get("device")),
            "iv_node": sh.text(iv.get("node")), "iv_start": sh.text(iv.get("start")),
            "iv_end": sh.text(iv.get("end")), "iv_cause": sh.text(iv.get("cause")),
            "iv_policy": sh.text(iv.get("policy")),
            "iv_resolution": None if res is None else json.dumps(res, sort_keys=True, ensure_ascii=False),
            "iv_gpu_hours": hours}


def _row(seq: int, kind: str, no: int, **values: Any) -> tuple:
    out: list[Any] = [None] * len(NAMES)
    out[0], out[1], out[2] = seq, kind, no
    for k, v in values.items():
        out[_POS[k]] = v
    return tuple(out)


def lines_of_entries(issued: Iterable[tuple[int, str]]) -> list[tuple]:
    """The lines of issue entries given as (seq, payload text)."""
    out: list[tuple] = []
    for seq, payload in issued:
        try:
            p = json.loads(payload)
        except ValueError:
            p = None
        out.extend(lines_of(int(seq), p))
    return out


# --- writing -------------------------------------------------------------------------------------------------

def insert_sql(mark: str = "?") -> str:
    """The INSERT of one line in :data:`NAMES` order, with the driver's parameter ``mark``."""
    cols = ", ".join(f'"{c}"' for c in NAMES)
    return f"INSERT INTO {TABLE} ({cols}) VALUES ({','.join([mark] * len(NAMES))})"


def insert(conn: Connection, rows: Sequence[tuple]) -> None:
    if rows:
        conn.exec_driver_sql(insert_sql("?" if conn.dialect.name == "sqlite" else "%s"), list(rows))


def has_table(conn: Connection) -> bool:
    return table_exists(conn, TABLE)


def on_append(conn: Connection, issued: Sequence[tuple[int, str]]) -> None:
    """The append path's hook (ledger.chain.store.append_in): the lines of the issue entries just appended, given as
    (seq, payload text), in the same transaction. A ledger at a schema before the table has none to write."""
    if issued and has_table(conn):
        insert(conn, lines_of_entries(issued))


_MISSING_SQL = (f"SELECT e.seq, e.payload FROM entries e WHERE e.kind = :k AND e.seq > :after "
                    f"AND NOT EXISTS (SELECT 1 FROM {TABLE} l WHERE l.seq = e.seq) ORDER BY e.seq LIMIT :lim")


def sync(conn: Connection, batch: int = 10_000) -> int:
    """Derive the lines of every issue entry that has none (a ledger issued before the table existed, or an
    entry appended by a writer that predates it); returns how many entries were derived."""
    done, after = 0, 0
    while True:
        got = conn.execute(text(_MISSING_SQL), {"k": Kind.RECEIPT_ISSUED, "after": after, "lim": batch}).fetchall()
        if not got:
            return done
        insert(conn, lines_of_entries((int(s), p) for s, p in got))
        done += len(got)
        after = int(got[-1][0])


def covered(conn: Connection, through_seq: int) -> bool:
    """Whether every issue entry through ``through_seq`` has its lines (a cheap count of each side)."""
    issues = conn.execute(text("SELECT COUNT(*) FROM entries WHERE kind = :k AND seq <= :s"),
                          {"k": Kind.RECEIPT_ISSUED, "s": through_seq}).scalar()
    derived = conn.execute(text(f"SELECT COUNT(*) FROM {TABLE} WHERE run_key IS NOT NULL AND seq <= :s"),
                           {"s": through_seq}).scalar()
    return int(issues or 0) == int(derived or 0)


# --- checking (verify) ---------------------------------------------------------------------------------------

def _same(a: tuple, b: tuple) -> bool:
    """Equal line by line, a REAL read back as an integer (PostgreSQL's integral floats) counting as equal."""
    return len(a) == len(b) and all(x == y and type(x) is type(y) or (
        isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool)
        and float(x) == float(y)) for x, y in zip(a, b))


def problems(conn: Connection, batch: int = 10_000) -> list[tuple[int, str]]:
    """(seq, one line) for every issue entry whose stored lines differ from its receipt's (missing, extra,
    altered), and for lines whose seq is no issue entry."""
    out: list[tuple[int, str]] = []
    cols = ", ".join(f'"{c}"' for c in NAMES)
    issues_sql = text("SELECT seq, payload FROM entries WHERE kind = :k AND seq > :after ORDER BY seq LIMIT :lim")
    lines_sql = text(f"SELECT {cols} FROM {TABLE} WHERE seq > :lo AND seq <= :hi ORDER BY seq, line_kind, line_no")
    after = 0
    while True:
        got = conn.execute(issues_sql, {"k": Kind.RECEIPT_ISSUED, "after": after, "lim": batch}).fetchall()
        if not got:
            break
        hi = int(got[-1][0])
        stored: dict[int, list[tuple]] = {}
        for row in conn.execute(lines_sql, {"lo": after, "hi": hi}):
            stored.setdefault(int(row[0]), []).append(tuple(row))
        for seq, payload in got:
            want = sorted(lines_of_entries([(int(seq), payload)]), key=lambda t: (t[1], t[2]))
            have = stored.pop(int(seq), [])
            if not have:
                out.append((int(seq), f"issued receipt's lines are missing from {TABLE}"))
            elif len(have) != len(want) or not all(_same(h, w) for h, w in zip(have, want)):
                out.append((int(seq), f"issued receipt's lines in {TABLE} differ from its receipt "
                                      f"({len(have)} stored, {len(want)} derived)"))
        out.extend((s, f"{TABLE} holds lines for seq {s}, which is no receipt_issued entry") for s in sorted(stored))
        after = hi
    for (s,) in conn.execute(text(f"SELECT DISTINCT seq FROM {TABLE} WHERE seq > :after ORDER BY seq"),
                             {"after": after}):
        out.append((int(s), f"{TABLE} holds lines for seq {s}, which is no receipt_issued entry"))
    return out
