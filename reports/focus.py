"""The FinOps FOCUS export: a month's statement as a FOCUS 1.2 cost-and-usage CSV, the column spec and a
validator.

One row per billed run and charge period (``ChargeCategory=Usage``; a charge period is a UTC day, and a run
across midnight has one row per day, its figures split exactly: :func:`by_day`), one per adjustment line of a run (``Credit`` when
negative, else ``Adjustment``), and, for receipts re-issued after their month closed, rows carrying the
difference with ``ChargeClass=Correction``. Quantities are GPU-hours. ipledger's own columns carry the
``x_`` prefix (FOCUS's rule for custom columns). docs/focus.md maps every column.

Every row carries an ``InvoiceId`` from a site-configurable scheme (:func:`invoice_id`, default
``{cluster}-{YYYY-MM}-{tenant}``): a tenant's charges of one cluster and month make one invoice.

FOCUS version: 1.2 (FinOps Open Cost and Usage Specification, column definitions as published by the FOCUS
project; the FinOps Foundation's ``focus-validator`` 2.2.1 passes the files, tests/test_focus_validator.py).
Feature levels: ``Mandatory`` columns are always present; the ``Conditional`` and
``Recommended`` columns ipledger can fill are present too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ledger.base.invoice_ids import (  # noqa: F401 - the scheme's fields and check, re-exported
    DEFAULT_INVOICE_SCHEME, INVOICE_FIELDS, InvoiceSchemeError, check_invoice_scheme
)

from .energy_columns import ENERGY_FOCUS
from .lens_columns import LENS_FOCUS

FOCUS_VERSION = "1.2"
GPU_HOURS_UNIT = "GPU-Hours"
SERVICE_NAME = "GPU allocation"
SERVICE_CATEGORY = "Compute"
SERVICE_SUBCATEGORY = "Other (Compute)"
RESOURCE_TYPE = "GPU Job Run"
VALIDATE_ROWS = 5000
TAG_PREFIX = "ipledger/"  # provider-defined tags carry a provider prefix (FOCUS Tags)


@dataclass(frozen=True)
class Column:
    """One FOCUS column: its id, data type, feature level and whether it may be null."""

    name: str
    type: str  # String | Decimal | DateTime | JSON
    level: str  # Mandatory | Conditional | Recommended | Custom
    nullable: bool = True
    allowed: tuple[str, ...] = ()


CHARGE_CATEGORIES = ("Usage", "Purchase", "Tax", "Credit", "Adjustment")
SERVICE_CATEGORIES = ("AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
                      "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things",
                      "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security",
                      "Storage", "Web", "Other")

FOCUS_COLUMNS: tuple[Column, ...] = (
    # FOCUS 1.3's split-cost allocation columns: set on the charge of a run that shared a device with other runs
    # (docs/kubernetes.md), null otherwise
    Column("AllocatedMethodDetails", "JSON", "Conditional", True),
    Column("AllocatedMethodId", "String", "Conditional", True),
    Column("BilledCost", "Decimal", "Mandatory", False),
    Column("BillingAccountId", "String", "Mandatory", False),
    Column("BillingAccountName", "String", "Mandatory", True),
    Column("BillingCurrency", "String", "Mandatory", False),
    Column("BillingPeriodEnd", "DateTime", "Mandatory", False),
    Column("BillingPeriodStart", "DateTime", "Mandatory", False),
    Column("ChargeCategory", "String", "Mandatory", False, CHARGE_CATEGORIES),
    Column("ChargeClass", "String", "Mandatory", True, ("Correction",)),
    Column("ChargeDescription", "String", "Mandatory", True),
    Column("ChargeFrequency", "String", "Recommended", False, ("One-Time", "Recurring", "Usage-Based")),
    Column("ChargePeriodEnd", "DateTime", "Mandatory", False),
    Column("ChargePeriodStart", "DateTime", "Mandatory", False),
    Column("ConsumedQuantity", "Decimal", "Conditional", True),
    Column("ConsumedUnit", "String", "Conditional", True),
    Column("ContractedCost", "Decimal", "Mandatory", False),
    Column("ContractedUnitPrice", "Decimal", "Conditional", True),
    Column("EffectiveCost", "Decimal", "Mandatory", False),
    Column("InvoiceId", "String", "Recommended", True),
    Column("InvoiceIssuerName", "String", "Mandatory", False),
    Column("ListCost", "Decimal", "Mandatory", False),
    Column("ListUnitPrice", "Decimal", "Conditional", True),
    Column("PricingCategory", "String", "Conditional", True, ("Standard", "Dynamic", "Committed", "Other")),
    Column("PricingQuantity", "Decimal", "Mandatory", True),
    Column("PricingUnit", "String", "Mandatory", True),
    Column("ProviderName", "String", "Mandatory", False),
    Column("PublisherName", "String", "Mandatory", False),
    Column("RegionId", "String", "Conditional", True),
    Column("RegionName", "String", "Conditional", True),
    Column("ResourceId", "String", "Conditional", True),
    Column("ResourceName", "String", "Conditional", True),
    Column("ResourceType", "String", "Conditional", True),
    Column("ServiceCategory", "String", "Mandatory", False, SERVICE_CATEGORIES),
    Column("ServiceName", "String", "Mandatory", False),
    Column("ServiceSubcategory", "String", "Recommended", False),
    Column("SkuId", "String", "Conditional", True),
    Column("SkuPriceId", "String", "Conditional", True),
    Column("SubAccountId", "String", "Conditional", True),
    Column("SubAccountName", "String", "Conditional", True),
    Column("Tags", "JSON", "Conditional", True),
)

X_COLUMNS: tuple[Column, ...] = tuple(Column(n, t, "Custom", True) for n, t in (
    ("x_Cluster", "String"), ("x_JobId", "String"), ("x_Run", "Decimal"), ("x_Partition", "String"),
    ("x_Qos", "String"), ("x_RowKind", "String"), ("x_DeviceCount", "Decimal"),
    ("x_PaidGpuHours", "Decimal"), ("x_DeliveredGpuHours", "Decimal"),
    ("x_ThrottledThermalGpuHours", "Decimal"), ("x_ThrottledPowerCapGpuHours", "Decimal"),
    ("x_ThrottledHwSlowdownGpuHours", "Decimal"), ("x_ThrottledSyncBoostGpuHours", "Decimal"),
    ("x_ThrottledOtherGpuHours", "Decimal"), ("x_UnderutilizedGpuHours", "Decimal"),
    ("x_StarvedGpuHours", "Decimal"), ("x_IdleHeldGpuHours", "Decimal"), ("x_UnknownGpuHours", "Decimal"),
    ("x_UnknownResolvedGpuHours", "Decimal"), ("x_UnknownPendingGpuHours", "Decimal"),
    ("x_UnknownChargedGpuHours", "Decimal"), ("x_UnknownCreditedGpuHours", "Decimal"),
    ("x_UnknownEstimatedGpuHours", "Decimal"), ("x_UnknownHeldGpuHours", "Decimal"),
    ("x_SuspendedGpuHours", "Decimal"), ("x_PaidCost", "Decimal"), ("x_DeliveredCost", "Decimal"),
    ("x_LostCost", "Decimal"),
    ("x_AdjustmentId", "String"), ("x_AdjustmentReason", "String"), ("x_ReceiptHash", "String"),
    ("x_ReplacesReceiptHash", "String"), ("x_ContractId", "String"), ("x_ContractVersion", "String"),
    ("x_Method", "String"), ("x_LedgerThroughSeq", "Decimal"), ("x_LedgerHeadHash", "String"),
)) + tuple(Column(n, "Decimal", "Custom", True) for n, _ in (*LENS_FOCUS, *ENERGY_FOCUS))

ALL_COLUMNS = FOCUS_COLUMNS + X_COLUMNS
COLUMN_NAMES = tuple(c.name for c in ALL_COLUMNS)
_DATETIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_NUMBER_RE = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


_BUCKETS = (("x_PaidGpuHours", "paid"), ("x_DeliveredGpuHours", "delivered"),
            ("x_ThrottledThermalGpuHours", "throttled_thermal"), ("x_ThrottledPowerCapGpuHours", "throttled_power_cap"),
            ("x_ThrottledHwSlowdownGpuHours", "throttled_hw_slowdown"),
            ("x_ThrottledSyncBoostGpuHours", "throttled_sync_boost"), ("x_ThrottledOtherGpuHours", "throttled_other"),
            ("x_UnderutilizedGpuHours", "underutilized"), ("x_StarvedGpuHours", "starved"),
            ("x_IdleHeldGpuHours", "idle_held"), ("x_UnknownGpuHours", "unknown"),
            ("x_UnknownResolvedGpuHours", "unknown_resolved"), ("x_UnknownPendingGpuHours", "unknown_pending"),
            ("x_UnknownChargedGpuHours", "unknown_charge"), ("x_UnknownCreditedGpuHours", "unknown_credit"),
            ("x_UnknownEstimatedGpuHours", "unknown_estimate"), ("x_UnknownHeldGpuHours", "unknown_hold"),
            ("x_SuspendedGpuHours", "suspended"))


def _iso_col(epoch: pd.Series) -> pd.Series:
    out = pd.to_datetime(epoch, unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    return out.astype(object).where(epoch.notna(), None)


def _s(col: pd.Series) -> pd.Series:
    """A column as text for concatenation (missing values as empty text)."""
    return col.astype(object).where(col.notna(), "").astype(str)


def _ascii_id(v: Any) -> str:
    """A value as InvoiceId text: ASCII only (FOCUS), reversibly (percent-encoded UTF-8)."""
    from urllib.parse import quote

    return quote(str(v), safe="-._~:@") if v is not None and v == v else "unassigned"


def invoice_id(scheme: str, month: str, cluster: Any, tenant: Any) -> str:
    """``scheme`` filled for one invoice: one per (cluster, tenant, month) with the default scheme."""
    values = {"cluster": _ascii_id(cluster), "YYYY-MM": month, "YYYY": month[:4], "MM": month[5:7],
              "tenant": _ascii_id(tenant)}
    return re.sub(r"\{([^{}]*)\}", lambda m: values[m.group(1)], check_invoice_scheme(scheme))


def by_day(rows: pd.DataFrame) -> pd.DataFrame:
    """The statement's rows with each one whose window spans UTC days replaced by one row per day: hours
    split in nanohours and money in cents (largest remainder), in proportion to the window's seconds in
    each day, so the day rows sum exactly to the row; each day row's window is its day's part."""
    from .monthly import MONEY_COLUMNS, SUM_COLUMNS
    from ledger.base.periods import days_spanned, split_int, split_nano, weights_of

    if rows.empty:
        return rows
    s = rows["window_start"].to_numpy(dtype="float64")
    e = rows["window_end"].to_numpy(dtype="float64")
    last = np.where(e > s, np.maximum(s, e - 1e-6), s)
    multi = np.flatnonzero(np.floor(s / 86400.0) != np.floor(last / 86400.0))
    if not len(multi):
        return rows
    money = set(MONEY_COLUMNS)
    out: list[dict] = []
    at: list[int] = []
    for k in multi:
        row = rows.iloc[k].to_dict()
        days = days_spanned(s[k], e[k])
        w = weights_of(days)
        parts = {}
        for c in SUM_COLUMNS:
            v = float(row[c])
            parts[c] = ([x / 100.0 for x in split_int(round(v * 100), w)] if c in money
                        else split_nano(v, w))
        for j, (lo, hi) in enumerate(days):
            out.append({**row, **{c: parts[c][j] for c in SUM_COLUMNS}, "window_start": lo, "window_end": hi})
            at.append(k)
    keep = np.ones(len(rows), dtype=bool)
    keep[multi] = False
    extra = pd.DataFrame(out, columns=rows.columns).astype(rows.dtypes.to_dict())
    order = np.concatenate([np.flatnonzero(keep), np.asarray(at, dtype="int64")])
    both = pd.concat([rows[keep], extra], ignore_index=True)
    # in statement order, a split row's days in place of it
    return both.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)


def _base(st: Any, r: pd.DataFrame, provider: str | None,
          invoice_scheme: str = DEFAULT_INVOICE_SCHEME) -> pd.DataFrame:
    """The columns a run's rows share (identity, periods, resource, tenant), one row per row of ``r``."""
    cluster = r["cluster"].astype(object).where(r["cluster"].notna(), "local").astype(str)
    prov = cluster if provider is None else pd.Series(provider, index=r.index)
    start = _iso_col(r["window_start"])
    end = _iso_col(r["window_end"])
    run = _s(r["run"])
    job = _s(r["job_id"])
    sku_price = r["contract_id"].notna()
    b = pd.DataFrame(index=r.index)
    b["BillingAccountId"] = "ipledger:" + cluster
    b["BillingAccountName"] = cluster
    b["BillingCurrency"] = r["currency"].astype(object).where(r["currency"].notna(), "XXX")
    b["BillingPeriodStart"] = st.period_start
    b["BillingPeriodEnd"] = st.period_end
    b["ChargePeriodStart"] = start
    b["ChargePeriodEnd"] = end.where(end.notna(), start)
    b["InvoiceId"] = [invoice_id(invoice_scheme, st.month, c, t) for c, t in zip(r["cluster"], r["tenant"])]
    b["InvoiceIssuerName"] = prov
    b["ProviderName"] = prov
    b["PublisherName"] = prov
    b["RegionId"] = None
    b["RegionName"] = None
    b["ResourceId"] = cluster + "/" + job + "/" + run
    b["ResourceName"] = "job " + job + " run " + run
    b["ResourceType"] = RESOURCE_TYPE
    b["ServiceCategory"] = SERVICE_CATEGORY
    b["ServiceName"] = SERVICE_NAME
    b["ServiceSubcategory"] = SERVICE_SUBCATEGORY
    b["SkuId"] = r["sku"]
    b["SkuPriceId"] = (_s(r["contract_id"]) + ":" + _s(r["contract_version"]) + ":" + _s(r["sku"])).where(
        sku_price, None)
    b["SubAccountId"] = r["tenant"]
    b["SubAccountName"] = r["tenant"]
    b["x_Cluster"] = r["cluster"]
    b["x_JobId"] = r["job_id"]
    b["x_Run"] = r["run"]
    b["x_Partition"] = r["partition"]
    b["x_Qos"] = r["qos"]
    b["x_RowKind"] = r["row_kind"]
    b["x_DeviceCount"] = r["n_devices"]
    b["x_ReceiptHash"] = r["receipt_hash"]
    b["x_ReplacesReceiptHash"] = r["replaces_hash"]
    b["x_ContractId"] = r["contract_id"]
    b["x_ContractVersion"] = r["contract_version"]
    b["x_Method"] = r["method"]
    b["AllocatedMethodId"], b["AllocatedMethodDetails"] = _allocation(r["allocation"])
    b["x_LedgerThroughSeq"] = st.through_seq
    b["x_LedgerHeadHash"] = st.head_hash
    return b


ALLOCATED_METHOD_PREFIX = "ipledger-device-share-"   # + the rule: declared | measured | equal (| mixed)


def _allocation(col: pd.Series) -> tuple[list, list]:
    """(AllocatedMethodId, AllocatedMethodDetails) per row from the row's ``allocation`` (monthly.allocation_of):
    one element per shared device, its ``AllocatedRatio`` the run's share; over the runs that shared a device the
    ratios of its elements sum to 1 (the equal rule: n runs of 1/n)."""
    ids, details = [], []
    for v in col.tolist():
        if not isinstance(v, str):
            ids.append(None)
            details.append(None)
            continue
        parts = json.loads(v)
        rules = sorted({p["rule"] for p in parts})
        ids.append(ALLOCATED_METHOD_PREFIX + (rules[0] if len(rules) == 1 else "mixed"))
        details.append(json.dumps({"Elements": [
            {"AllocatedRatio": float(Fraction(p["ratio"])), "x_AllocatedRule": p["rule"], "x_Device": p["device"]}
            for p in parts]}, sort_keys=True))
    return ids, details


def _tags(r: pd.DataFrame) -> list[str]:
    """The Tags JSON object per row (keys sorted, provider-prefixed; missing values left out), built with the
    json module's C string encoder rather than one json.dumps per row."""
    from json.encoder import encode_basestring_ascii as enc

    keys = ("nodes", "partition", "qos", "user")  # sorted, as json.dumps(sort_keys=True) would write them
    heads = [enc(f"{TAG_PREFIX}{k}") + ": " for k in keys]
    cols = [r[k].tolist() for k in keys]
    out = []
    for vals in zip(*cols):
        items = [h + enc(str(v)) for h, v in zip(heads, vals) if v is not None and v == v]
        out.append("{" + ", ".join(items) + "}")
    return out


def _adjustments(base: pd.DataFrame, amount: pd.Series, hours: pd.Series, adj_id: pd.Series, reason: pd.Series,
                 correction: bool) -> pd.DataFrame:
    a = base.copy()
    amount = amount.astype(float).round(2)
    credit = amount < 0
    label = pd.Series("Adjustment", index=a.index).where(~credit, "Credit")
    a["ChargeCategory"] = label
    a["ChargeClass"] = "Correction" if correction else None
    a["ChargeFrequency"] = "One-Time"
    a["ChargeDescription"] = (label + " on job " + _s(a["x_JobId"]) + " run " + _s(a["x_Run"]) + ": "
                              + _s(reason).where(reason.notna(), "adjustment") + " ("
                              + hours.astype(float).map("{:.4f}".format) + " GPU-hours)")
    for c in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost"):
        a[c] = amount
    for c in ("ConsumedQuantity", "ConsumedUnit", "PricingQuantity", "PricingUnit", "PricingCategory",
              "ContractedUnitPrice", "ListUnitPrice"):
        a[c] = None
    a["x_RowKind"] = "correction" if correction else "adjustment"
    a["x_AdjustmentId"] = adj_id
    a["x_AdjustmentReason"] = reason
    a["Tags"] = json.dumps({f"{TAG_PREFIX}adjustment": True}, sort_keys=True)
    return a


def focus_table(st: Any, provider: str | None = None,  # st: reports.export.Statement
                invoice_scheme: str = DEFAULT_INVOICE_SCHEME) -> pd.DataFrame:
    """The statement's rows in FOCUS 1.2 columns (plus ``x_`` columns), in ``COLUMN_NAMES`` order.

    Column-wise (pandas), so a million-run month costs no per-row Python beyond the Tags JSON and the
    InvoiceId, and the day split of the rows that cross midnight.
    """
    r = by_day(st.rows.reset_index(drop=True))
    parts: list[pd.DataFrame] = []
    if len(r):
        base = _base(st, r, provider, invoice_scheme)
        correction = r["row_kind"] == "correction"
        paid = r["paid"].astype(float)
        cost = r["billed_before_adjustments"].astype(float).round(2)  # after the unknown policy
        qty = r["billed_gpu_hours"].astype(float)
        rate = (cost / qty).round(6).where(qty.abs() > 1e-12, None)
        u = base.copy()
        u["ChargeCategory"] = "Usage"
        u["ChargeClass"] = pd.Series(None, index=r.index, dtype=object).where(~correction, "Correction")
        u["ChargeFrequency"] = "Usage-Based"
        u["ChargeDescription"] = (pd.Series("", index=r.index).where(~correction, "Correction: ")
                                  + _s(r["n_devices"]) + " x " + _s(r["sku"]).replace("", "GPU")
                                  + " allocated to job " + _s(r["job_id"]) + " run " + _s(r["run"]) + ": "
                                  + paid.map("{:.4f}".format) + " GPU-hours paid, "
                                  + r["delivered"].astype(float).map("{:.4f}".format) + " delivered")
        for c in ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost"):
            u[c] = cost
        u["ContractedUnitPrice"] = rate
        u["ListUnitPrice"] = rate
        u["ConsumedQuantity"] = paid
        u["ConsumedUnit"] = GPU_HOURS_UNIT
        u["PricingQuantity"] = qty
        u["PricingUnit"] = GPU_HOURS_UNIT
        u["PricingCategory"] = "Standard"
        u["x_PaidCost"] = r["cost_paid"].astype(float).round(2)
        u["x_DeliveredCost"] = r["cost_delivered"].astype(float).round(2)
        u["x_LostCost"] = r["cost_lost"].astype(float).round(2)
        for xc, col in _BUCKETS:
            u[xc] = r[col].astype(float).round(6)
        # the effective-compute lens (reports/lens_columns.py), energy and carbon (reports/energy_columns.py)
        for xc, col in (*LENS_FOCUS, *ENERGY_FOCUS):
            u[xc] = r[col].astype(float).round(6)
        u["Tags"] = _tags(r)
        # FOCUS: a non-correction Usage row needs a positive ConsumedQuantity. A zero-hour run bills nothing
        # (no row); a zero-hour run that still costs something is booked as an Adjustment.
        zero = ~correction & (paid <= 0)
        parts.append(u[~zero])
        odd = zero & (cost != 0)
        if odd.any():
            parts.append(_adjustments(base[odd], cost[odd], pd.Series(0.0, index=r.index)[odd],
                                      pd.Series(None, index=r.index, dtype=object)[odd],
                                      pd.Series("charge without GPU-hours", index=r.index)[odd], correction=False))
        # corrections carry the change of their adjustments on one row each
        ca = correction & (r["adjustment_cost"].abs() >= 0.005)
        if ca.any():
            parts.append(_adjustments(base[ca], r["adjustment_cost"][ca], r["adjustment_gpu_hours"][ca],
                                      pd.Series(None, index=r.index, dtype=object)[ca],
                                      pd.Series("change of adjustments on re-issue", index=r.index)[ca],
                                      correction=True))
        adj = st.flat.adjustments
        adj = adj[adj["row_kind"] == "usage"]
        if len(adj):
            key = ["cluster", "job_id", "run"]
            # a run's adjustment lines are charged once, on its last charge period
            usage_rows = r[~correction].drop_duplicates(key, keep="last").reset_index(drop=True)
            ubase = _base(st, usage_rows, provider, invoice_scheme)
            ubase[key] = usage_rows[key]
            m = adj.reset_index(drop=True).merge(ubase, on=key, how="inner", suffixes=("_adj", ""))
            if len(m):
                base_cols = [c for c in ubase.columns if c not in key]
                parts.append(_adjustments(m[base_cols], m["amount"], m["gpu_hours"], m["id"],
                                          m["reason"].where(m["reason"].notna(), m["kind"]), correction=False))
    if not parts:
        return pd.DataFrame(columns=list(COLUMN_NAMES))
    df = pd.concat(parts, ignore_index=True)
    for c in COLUMN_NAMES:
        if c not in df.columns:
            df[c] = None
    return df[list(COLUMN_NAMES)]


def write_focus(st: Any, path: str | Path, provider: str | None = None,
                invoice_scheme: str = DEFAULT_INVOICE_SCHEME) -> None:
    df = focus_table(st, provider, invoice_scheme)
    # Every row comes from the same code path: validating the first rows (and every column) catches a
    # broken mapping without a per-row Python pass over a million-run month.
    problems = validate(df.head(VALIDATE_ROWS))
    if problems:  # never write a file that claims FOCUS and is not
        raise ValueError(f"FOCUS export invalid: {problems[0]}")
    from ledger.base.textsafe import neutralise_frame  # names as text, never formulas (OWASP CSV injection)

    neutralise_frame(df).to_csv(path, index=False)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return not math.isnan(v) and not math.isinf(v)
    return isinstance(v, str) and bool(_NUMBER_RE.match(v.strip()))


def _null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v == ""


def validate(df: pd.DataFrame) -> list[str]:
    """Every violation of the FOCUS 1.1 rules ipledger's rows are subject to, one line each (empty: valid).

    Checks: every Mandatory column present; custom columns prefixed ``x_``; types (Decimal, DateTime in
    ``YYYY-MM-DDTHH:MM:SSZ``, JSON objects for Tags); non-nullable columns non-null; allowed values;
    ConsumedQuantity positive on Usage rows that are not corrections and null on other categories;
    ChargePeriodStart <= ChargePeriodEnd and BillingPeriodStart < BillingPeriodEnd.
    """
    problems: list[str] = []
    cols = set(df.columns)
    spec = {c.name: c for c in ALL_COLUMNS}
    for c in FOCUS_COLUMNS:
        if c.level == "Mandatory" and c.name not in cols:
            problems.append(f"missing mandatory column {c.name}")
    for name in df.columns:
        if name not in spec and not name.startswith("x_"):
            problems.append(f"column {name}: not a FOCUS {FOCUS_VERSION} column and not prefixed x_")
    for i, row in enumerate(df.to_dict(orient="records"), start=2):  # line 1 is the header
        for name, v in row.items():
            c = spec.get(name)
            if c is None:
                continue
            if _null(v):
                if not c.nullable:
                    problems.append(f"line {i}: {name} is null")
                continue
            if c.type == "Decimal" and not _is_number(v):
                problems.append(f"line {i}: {name}={v!r} is not a Decimal")
            elif c.type == "DateTime" and not (isinstance(v, str) and _DATETIME_RE.match(v)):
                problems.append(f"line {i}: {name}={v!r} is not a FOCUS DateTime")
            elif c.type == "JSON":
                try:
                    ok = isinstance(json.loads(v), dict)
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    problems.append(f"line {i}: {name} is not a JSON object")
            elif c.type == "String" and not isinstance(v, str):
                problems.append(f"line {i}: {name}={v!r} is not a String")
            if c.allowed and v not in c.allowed:
                problems.append(f"line {i}: {name}={v!r} not one of {', '.join(c.allowed)}")
        cat, cls, q = row.get("ChargeCategory"), row.get("ChargeClass"), row.get("ConsumedQuantity")
        if cat == "Usage" and _null(cls):
            if _null(q) or not _is_number(q) or float(q) <= 0:
                problems.append(f"line {i}: ConsumedQuantity must be positive on a Usage row")
        elif cat != "Usage" and not _null(q):
            problems.append(f"line {i}: ConsumedQuantity must be null when ChargeCategory is {cat}")
        if cat == "Credit" and _is_number(row.get("BilledCost")) and float(row["BilledCost"]) > 0:
            problems.append(f"line {i}: a Credit must not be positive")
        ps, pe = row.get("ChargePeriodStart"), row.get("ChargePeriodEnd")
        if isinstance(ps, str) and isinstance(pe, str) and ps > pe:
            problems.append(f"line {i}: ChargePeriodStart after ChargePeriodEnd")
        bs, be = row.get("BillingPeriodStart"), row.get("BillingPeriodEnd")
        if isinstance(bs, str) and isinstance(be, str) and not bs < be:
            problems.append(f"line {i}: BillingPeriodStart not before BillingPeriodEnd")
    return problems


def read_focus(path: str | Path) -> pd.DataFrame:
    """Read a FOCUS CSV back with every column as text (nulls as None), as a FOCUS consumer would."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.astype(object).where(df != "", None)
