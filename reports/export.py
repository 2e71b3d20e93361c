"""A month's statement: the billed receipts and corrections of a month as tables, and its writers
(CSV, Parquet, JSON; FOCUS in :mod:`reports.focus`, PDF in :mod:`reports.pdf_statement`).

:func:`statement_from_issues` is pure (issued receipts in, :class:`Statement` out); :func:`build_statement`
reads the issued receipts from a ledger first. The CSV and Parquet files hold the same long table: one
row per aggregate with a ``level`` column (``total``, ``tenant``, ``class``, ``hour``, ``run``), so the
run rows reconcile the aggregates inside the file itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from .alias import Aliaser
from .issued import Correction, Issue, IssuedSet, flatten_issues, load_issues, select_month
from .monthly import (MONEY_COLUMNS, NUMERIC_COLUMNS, SUM_COLUMNS, ExportError, Flat, Summary, cents, flatten, month_bounds,
                      summarise, top_runs_by_loss)

STATEMENT_VERSION = "1"
FORMATS = ("csv", "parquet", "focus", "json", "pdf")
HOURS_DECIMALS = 6


class UnknownTenant(ExportError):
    pass


@dataclass(frozen=True)
class Statement:
    """Everything a month's export shows; the writers only format it."""

    month: str
    period_start: str
    period_end: str
    through_seq: int
    head_hash: str
    tenant: str | None
    aliased: bool
    flat: Flat  # usage and correction rows, unknown intervals, adjustments
    summary: Summary
    notes: list[str] = field(default_factory=list)
    # The newest signed tree head recorded through ``through_seq`` (None: none is signed); a tenant checks a
    # receipt offline against it (docs/proofs.md).
    tree_head: dict | None = None

    @property
    def rows(self) -> pd.DataFrame:
        return self.flat.rows

    @property
    def empty(self) -> bool:
        return self.flat.rows.empty

    @property
    def totals(self) -> dict:
        return self.summary.totals


def correction_flat(corrections: list[Correction]) -> Flat:
    """Rows carrying (new - previously billed) for every numeric column; detail lines that are new."""
    if not corrections:
        return flatten([], row_kind="correction")
    new = flatten_issues([c.new for c in corrections], "correction", [c.old.receipt_hash for c in corrections])
    old = flatten_issues([c.old for c in corrections], "correction")
    rows = new.rows.copy()
    for col in NUMERIC_COLUMNS:
        if col != "n_devices":
            rows[col] = new.rows[col].to_numpy() - old.rows[col].to_numpy()
    key = ["cluster", "job_id", "run"]
    seen_u = set(map(tuple, old.unknowns[key + ["id", "resolution"]].astype(str).itertuples(index=False)))
    u = new.unknowns[[tuple(r) not in seen_u for r in
                      new.unknowns[key + ["id", "resolution"]].astype(str).itertuples(index=False)]]
    seen_a = set(map(tuple, old.adjustments[key + ["id", "kind", "amount"]].astype(str)
                     .itertuples(index=False)))
    a = new.adjustments[[tuple(r) not in seen_a for r in
                         new.adjustments[key + ["id", "kind", "amount"]].astype(str).itertuples(index=False)]]
    return Flat(rows=rows, unknowns=u.reset_index(drop=True), adjustments=a.reset_index(drop=True))


def _alias(flat: Flat, aliaser: Aliaser) -> Flat:
    if not aliaser.active:
        return flat
    rows = flat.rows.copy()
    rows["nodes"] = [aliaser.hosts(v) for v in rows["nodes"]]
    rows["user"] = [aliaser.user(v) for v in rows["user"]]
    u = flat.unknowns.copy()
    u["node"] = [aliaser.host(v) for v in u["node"]]
    u["device"] = [aliaser.device(v) for v in u["device"]]
    a = flat.adjustments.copy()
    a["by"] = [aliaser.user(v) for v in a["by"]]
    return Flat(rows=rows, unknowns=u, adjustments=a)


def statement_from_issues(issued: IssuedSet, month: str, tenant: str | None = None,
                          aliaser: Aliaser | None = None, grace_s: float = 0.0) -> Statement:
    """The statement of ``month`` from issued receipts (pure)."""
    month_bounds(month)
    if tenant is not None and tenant not in issued.tenants:
        _unknown_tenant(tenant, issued.tenants)
    usage, corrections = select_month(issued.issues, month, issued.close_seq, grace_s)
    if tenant is not None:
        usage = [i for i in usage if i.tenant == tenant]
        corrections = [c for c in corrections if c.new.tenant == tenant]
    return _statement(month, tenant, aliaser, issued.through_seq, issued.head_hash, issued.not_replayed,
                      flatten_issues(usage, "usage"), corrections)


def _unknown_tenant(tenant: str, tenants: set[str]) -> None:
    known = ", ".join(sorted(tenants)) or "none"
    raise UnknownTenant(f"--tenant {tenant!r}: no issued receipt names this tenant (known: {known})")


def _statement(month: str, tenant: str | None, aliaser: Aliaser | None, through_seq: int,  # noqa: PLR0913
               head_hash: str, not_replayed: int, u: Flat, corrections: list[Correction]) -> Statement:
    """The statement from the month's usage rows (in sequence order) and its corrections."""
    start, end = month_bounds(month)
    c = correction_flat(corrections)
    flat = Flat(rows=pd.concat([u.rows, c.rows], ignore_index=True) if len(c.rows) else u.rows,
                unknowns=pd.concat([u.unknowns, c.unknowns], ignore_index=True) if len(c.unknowns)
                else u.unknowns,
                adjustments=pd.concat([u.adjustments, c.adjustments], ignore_index=True) if len(c.adjustments)
                else u.adjustments)
    flat = _alias(flat, aliaser or Aliaser(None))
    notes = []
    if flat.rows.empty:
        who = f" for tenant {tenant}" if tenant else ""
        notes.append(f"No issued receipts{who} for runs in {month} (ledger through seq {through_seq}): "
                     "this statement is empty.")
    if not_replayed:
        notes.append(f"{not_replayed} issued receipt(s) did not replay to their issued hash; "
                     "run `ipledger verify`.")
    if len(corrections):
        notes.append(f"{len(corrections)} correction(s) to earlier months' runs are billed in {month}.")
    return Statement(month=month, period_start=start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                     period_end=end.strftime("%Y-%m-%dT%H:%M:%SZ"), through_seq=through_seq,
                     head_hash=head_hash, tenant=tenant, aliased=bool(aliaser and aliaser.active),
                     flat=flat, summary=summarise(flat.rows), notes=notes)


def build_statement(engine, month: str, tenant: str | None = None, as_of: int | None = None,  # noqa: ANN001
                    aliaser: Aliaser | None = None, grace_s: float = 0.0,
                    progress: Callable[[int, int], None] | None = None, columnar: bool = True) -> Statement:
    """Read the issued receipts through ``as_of`` from the ledger and build the month's statement, naming the
    newest signed tree head recorded through the same cut.

    ``columnar`` reads them column-wise: from the receipts' flat lines (:mod:`reports.issued_lines`), else from
    their JSON (:mod:`reports.issued_columns`); the same statement without a dict per receipt. False, or a
    ledger with hash-only issues, takes the dict path (:func:`load_issues`), the definition of the others."""
    st = _read_statement(engine, month, tenant, as_of, aliaser, grace_s, progress, columnar)
    from ledger.chain import heads

    with engine.connect() as conn:
        return replace(st, tree_head=heads.latest_head(conn, st.through_seq))


def _read_statement(engine, month: str, tenant: str | None, as_of: int | None,  # noqa: ANN001, PLR0913
                    aliaser: Aliaser | None, grace_s: float, progress: Callable[[int, int], None] | None,
                    columnar: bool) -> Statement:
    month_bounds(month)
    if columnar:
        from . import issued_columns, issued_lines

        got = issued_lines.read_month(engine, month, through_seq=as_of, progress=progress, grace_s=grace_s)
        if got is None:  # lines that cannot answer: the receipts' JSON, column-wise
            got = issued_columns.read_month(engine, month, through_seq=as_of, progress=progress, grace_s=grace_s)
        if got is not None:
            if tenant is not None and tenant not in got.tenants:
                _unknown_tenant(tenant, got.tenants)
            u, corrections = got.usage, got.corrections
            if tenant is not None:
                keep = (u.rows["tenant"] == tenant).to_numpy(dtype=bool)
                u = Flat(rows=u.rows[keep].reset_index(drop=True),
                         unknowns=u.unknowns[(u.unknowns["tenant"] == tenant).to_numpy(dtype=bool)]
                         .reset_index(drop=True),
                         adjustments=u.adjustments[(u.adjustments["tenant"] == tenant).to_numpy(dtype=bool)]
                         .reset_index(drop=True))
                corrections = [c for c in corrections if c.new.tenant == tenant]
            return _statement(month, tenant, aliaser, got.through_seq, got.head_hash, 0, u, corrections)
    issued = load_issues(engine, through_seq=as_of, progress=progress, grace_s=grace_s)
    return statement_from_issues(issued, month, tenant=tenant, aliaser=aliaser, grace_s=grace_s)


# --- the long table (CSV, Parquet) ---------------------------------------------------------------------------

LONG_KEYS = ("level", "month", "tenant", "partition", "qos", "currency", "hour", "cluster", "job_id", "run",
             "row_kind", "user", "nodes", "sku", "window_start", "window_end", "receipt_hash", "replaces_hash")
LONG_COLUMNS = LONG_KEYS + ("runs", "corrections", "lost") + SUM_COLUMNS + ("through_seq", "head_hash")


def iso_text(epoch: pd.Series) -> pd.Series:
    return pd.to_datetime(epoch, unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ").where(epoch.notna(), None)


def long_table(st: Statement) -> pd.DataFrame:
    """Total, tenant, class, hour and run rows in one table (documented in docs/reports.md)."""
    s = st.summary
    parts = []
    tot = pd.DataFrame([{**{c: s.totals.get(c, 0.0) for c in SUM_COLUMNS}, "runs": s.totals["runs"],
                         "corrections": s.totals["corrections"], "level": "total",
                         "currency": ",".join(s.totals["currencies"]) or None}])
    parts.append(tot)
    parts.append(s.by_tenant.assign(level="tenant"))
    parts.append(s.by_class.assign(level="class"))
    h = s.by_hour.assign(level="hour")
    parts.append(h)
    r = st.rows.copy()
    r["runs"] = (r["row_kind"] == "usage").astype("int64")
    r["corrections"] = (r["row_kind"] == "correction").astype("int64")
    r["window_start"] = iso_text(r["window_start"])
    r["window_end"] = iso_text(r["window_end"])
    parts.append(r.assign(level="run"))
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    out["month"] = st.month
    out["through_seq"] = st.through_seq
    out["head_hash"] = st.head_hash
    for c in LONG_COLUMNS:
        if c not in out.columns:
            out[c] = None
    out["lost"] = out["paid"] - out["delivered"]
    out = out[list(LONG_COLUMNS)]
    for c in ("runs", "corrections", "through_seq"):
        out[c] = out[c].fillna(0).astype("int64")
    out["hour"] = out["hour"].astype("Int64")
    out["run"] = out["run"].astype("Int64")
    money = set(MONEY_COLUMNS)
    for c in ("lost", *SUM_COLUMNS):
        out[c] = out[c].astype("float64").round(2 if c in money else HOURS_DECIMALS)
    for c in LONG_KEYS:
        if c not in ("hour", "run"):
            out[c] = out[c].astype("object").where(out[c].notna(), None)
    return out


def write_csv(st: Statement, path: Path) -> None:
    from ledger.base.textsafe import neutralise_frame  # names as text, never formulas (OWASP CSV injection)

    from .csvwrite import write_csv as write_frame

    write_frame(neutralise_frame(long_table(st)), path)


def write_parquet(st: Statement, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.Table.from_pandas(long_table(st), preserve_index=False)
    meta = {b"ipledger.month": st.month.encode(), b"ipledger.through_seq": str(st.through_seq).encode(),
            b"ipledger.head_hash": st.head_hash.encode(), b"ipledger.statement_version": STATEMENT_VERSION.encode()}
    pq.write_table(t.replace_schema_metadata({**(t.schema.metadata or {}), **meta}), path)


# --- JSON -------------------------------------------------------------------------------------------------------

def _records(df: pd.DataFrame) -> list[dict]:
    money = {*MONEY_COLUMNS, "amount"}
    out = []
    for rec in df.to_dict(orient="records"):
        clean = {}
        for k, v in rec.items():
            if isinstance(v, (np.integer,)):
                v = int(v)
            elif isinstance(v, (float, np.floating)):
                v = None if np.isnan(v) else (cents(v) if k in money else round(float(v), HOURS_DECIMALS))
            elif v is pd.NA:
                v = None
            clean[k] = v
        out.append(clean)
    return out


def to_json(st: Statement) -> dict:
    t = st.summary.totals
    totals = {k: (cents(v) if k in MONEY_COLUMNS
                  else (round(v, HOURS_DECIMALS) if isinstance(v, float) else v)) for k, v in t.items()}
    totals["lost"] = round(t["paid"] - t["delivered"], HOURS_DECIMALS)
    rows = st.rows
    corr = rows[rows["row_kind"] == "correction"]
    return {
        "statement_version": STATEMENT_VERSION,
        "month": st.month,
        "period": {"start": st.period_start, "end": st.period_end},
        "ledger": {"through_seq": st.through_seq, "head_hash": st.head_hash},
        "tenant": st.tenant,
        "aliased": st.aliased,
        "empty": st.empty,
        "notes": st.notes,
        "units": {"hours": "GPU-hours", "money": ",".join(t["currencies"]) or None},
        "totals": totals,
        "tenants": _records(st.summary.by_tenant),
        "classes": _records(st.summary.by_class),
        "hours": _records(st.summary.by_hour),
        "top_runs_by_loss": _records(top_runs_by_loss(st.rows)),
        "unknown_intervals": _records(st.flat.unknowns),
        "adjustments": _records(st.flat.adjustments),
        "corrections": _records(corr[["tenant", "cluster", "job_id", "run", "receipt_hash", "replaces_hash",
                                      "paid", "delivered", "billed_gpu_hours", "billed", "currency"]]),
    }


def write_json(st: Statement, path: Path) -> None:
    path.write_text(json.dumps(to_json(st), indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write(st: Statement, fmt: str, path: str | Path, invoice_scheme: str | None = None) -> Path:
    """Write ``st`` as ``fmt`` (one of FORMATS) to ``path``; ``invoice_scheme`` is the site's FOCUS
    InvoiceId scheme (default ``{cluster}-{YYYY-MM}-{tenant}``)."""
    p = Path(path)
    if fmt == "csv":
        write_csv(st, p)
    elif fmt == "parquet":
        write_parquet(st, p)
    elif fmt == "json":
        write_json(st, p)
    elif fmt == "focus":
        from .focus import DEFAULT_INVOICE_SCHEME, write_focus

        write_focus(st, p, invoice_scheme=invoice_scheme or DEFAULT_INVOICE_SCHEME)
    elif fmt == "pdf":
        from .pdf_statement import render

        render(st, p)
    else:
        raise ExportError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return p


def write_statement(engine, month: str, out_dir: str | Path,  # noqa: ANN001
                    formats: tuple[str, ...] = ("csv", "focus", "json", "pdf"),
                    progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write the month's statement in each format to ``out_dir`` (for ``make demo``); returns the paths."""
    st = build_statement(engine, month, progress=progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ext = {"csv": "csv", "focus": "focus.csv", "json": "json", "pdf": "pdf", "parquet": "parquet"}
    paths = []
    for f in formats:
        p = out / f"statement-{month}.{ext[f]}"
        write(st, f, p)
        paths.append(p)
    return paths


def default_name(month: str, fmt: str, tenant: str | None) -> str:
    ext = {"csv": "csv", "parquet": "parquet", "focus": "focus.csv", "json": "json", "pdf": "pdf"}[fmt]
    return f"statement-{month}{'-' + tenant if tenant else ''}.{ext}"


__all__ = ["Statement", "build_statement", "statement_from_issues", "write", "to_json", "long_table",
           "UnknownTenant", "Issue"]
