"""The FinOps FOCUS export: a month's statement as a FOCUS 1.1 cost-and-usage CSV, the column spec and a
validator.

One row per billed run (``ChargeCategory=Usage``), one per adjustment line of a run (``Credit`` when
negative, else ``Adjustment``), and, for receipts re-issued after their month closed, rows carrying the
difference with ``ChargeClass=Correction``. Quantities are GPU-hours. ipledger's own columns carry the
``x_`` prefix (FOCUS's rule for custom columns). docs/focus.md maps every column.

FOCUS version: 1.1 (FinOps Open Cost and Usage Specification, column definitions as published by the FOCUS
project). Feature levels: ``Mandatory`` columns are always present; the ``Conditional`` and
``Recommended`` columns ipledger can fill are present too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

FOCUS_VERSION = "1.1"
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
))

ALL_COLUMNS = FOCUS_COLUMNS + X_COLUMNS
COLUMN_NAMES = tuple(c.name for c in ALL_COLUMNS)
_DATETIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_NUMBER_RE = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


def _iso(epoch: float | None) -> str | None:
    if epoch is None or (isinstance(epoch, float) and math.isnan(epoch)):
        return None
    return pd.Timestamp(epoch, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


def _rate(cost: float, qty: float) -> float | None:
    return round(cost / qty, 6) if qty and abs(qty) > 1e-12 else None


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


def focus_table(st: Any, provider: str | None = None) -> pd.DataFrame:  # st: reports.export.Statement
    """The statement's rows in FOCUS 1.1 columns (plus ``x_`` columns), in ``COLUMN_NAMES`` order."""
    rows = st.rows
    recs: list[dict] = []
    for r in rows.to_dict(orient="records"):
        correction = r["row_kind"] == "correction"
        cluster = r["cluster"] or "local"
        prov = provider or cluster
        paid = float(r["paid"])
        base = {
            "BillingAccountId": f"ipledger:{cluster}", "BillingAccountName": cluster,
            "BillingCurrency": r["currency"] or "XXX",
            "BillingPeriodStart": st.period_start, "BillingPeriodEnd": st.period_end,
            "ChargePeriodStart": _iso(r["window_start"]),
            "ChargePeriodEnd": _iso(r["window_end"]) or _iso(r["window_start"]),
            "InvoiceIssuerName": prov, "ProviderName": prov, "PublisherName": prov,
            "RegionId": None, "RegionName": None,
            "ResourceId": f"{cluster}/{r['job_id']}/{r['run']}", "ResourceName": f"job {r['job_id']} run {r['run']}",
            "ResourceType": RESOURCE_TYPE, "ServiceCategory": SERVICE_CATEGORY, "ServiceName": SERVICE_NAME,
            "ServiceSubcategory": SERVICE_SUBCATEGORY, "SkuId": r["sku"],
            "SkuPriceId": f"{r['contract_id']}:{r['contract_version']}:{r['sku']}" if r["contract_id"] else None,
            "SubAccountId": r["tenant"], "SubAccountName": r["tenant"],
            "Tags": json.dumps({k: v for k, v in ((f"{TAG_PREFIX}partition", r["partition"]),
                                                  (f"{TAG_PREFIX}qos", r["qos"]),
                                                  (f"{TAG_PREFIX}user", r["user"]),
                                                  (f"{TAG_PREFIX}nodes", r["nodes"])) if v is not None},
                               sort_keys=True),
            "x_Cluster": r["cluster"], "x_JobId": r["job_id"], "x_Run": r["run"], "x_Partition": r["partition"],
            "x_Qos": r["qos"], "x_RowKind": r["row_kind"], "x_DeviceCount": r["n_devices"],
            "x_ReceiptHash": r["receipt_hash"], "x_ReplacesReceiptHash": r["replaces_hash"],
            "x_ContractId": r["contract_id"], "x_ContractVersion": r["contract_version"], "x_Method": r["method"],
            "x_LedgerThroughSeq": st.through_seq, "x_LedgerHeadHash": st.head_hash,
        }
        usage = dict(base)
        cost = round(float(r["billed_before_adjustments"]), 2)  # after the unknown policy, before adjustments
        qty = float(r["billed_gpu_hours"])
        rate = _rate(cost, qty)
        usage.update({
            "ChargeCategory": "Usage", "ChargeClass": "Correction" if correction else None,
            "ChargeFrequency": "Usage-Based",
            "ChargeDescription": (("Correction: " if correction else "") +
                                  f"{r['n_devices']} x {r['sku'] or 'GPU'} allocated to job {r['job_id']} run "
                                  f"{r['run']}: {paid:.4f} GPU-hours paid, {float(r['delivered']):.4f} delivered"),
            "BilledCost": cost, "EffectiveCost": cost, "ListCost": cost, "ContractedCost": cost,
            "ContractedUnitPrice": rate, "ListUnitPrice": rate,
            "ConsumedQuantity": paid, "ConsumedUnit": GPU_HOURS_UNIT,
            "PricingQuantity": qty, "PricingUnit": GPU_HOURS_UNIT, "PricingCategory": "Standard",
            "x_PaidCost": round(float(r["cost_paid"]), 2),
            "x_DeliveredCost": round(float(r["cost_delivered"]), 2), "x_LostCost": round(float(r["cost_lost"]), 2),
        })
        for xc, col in _BUCKETS:
            usage[xc] = round(float(r[col]), 6)
        # FOCUS: a non-correction Usage row needs a positive ConsumedQuantity. A zero-hour run bills nothing
        # (no row); a zero-hour run that still costs something is booked as an Adjustment.
        if not correction and paid <= 0:
            if cost != 0:
                recs.append(_adjustment_row(base, cost, 0.0, None, "charge without GPU-hours", correction=False))
        else:
            recs.append(usage)
        if correction and abs(float(r["adjustment_cost"])) >= 0.005:
            amt = round(float(r["adjustment_cost"]), 2)
            recs.append(_adjustment_row(base, amt, float(r["adjustment_gpu_hours"]), None,
                                        "change of adjustments on re-issue", correction=True))
    if len(st.flat.adjustments):
        keyed = {(r["cluster"], r["job_id"], r["run"]): r for r in rows.to_dict(orient="records")
                 if r["row_kind"] == "usage"}
        for a in st.flat.adjustments.to_dict(orient="records"):
            if a["row_kind"] != "usage":
                continue  # corrections carry their adjustment delta on one row above
            r = keyed.get((a["cluster"], a["job_id"], a["run"]))
            if r is None:
                continue
            base = _base_for(st, r, provider)
            recs.append(_adjustment_row(base, round(float(a["amount"]), 2), float(a["gpu_hours"]), a["id"],
                                        a["reason"] or a["kind"], correction=False))
    df = pd.DataFrame(recs, columns=list(COLUMN_NAMES))
    return df


def _base_for(st: Any, r: dict, provider: str | None) -> dict:
    cluster = r["cluster"] or "local"
    prov = provider or cluster
    return {"BillingAccountId": f"ipledger:{cluster}", "BillingAccountName": cluster,
            "BillingCurrency": r["currency"] or "XXX", "BillingPeriodStart": st.period_start,
            "BillingPeriodEnd": st.period_end, "ChargePeriodStart": _iso(r["window_start"]),
            "ChargePeriodEnd": _iso(r["window_end"]) or _iso(r["window_start"]), "InvoiceIssuerName": prov,
            "ProviderName": prov, "PublisherName": prov, "ResourceId": f"{cluster}/{r['job_id']}/{r['run']}",
            "ResourceName": f"job {r['job_id']} run {r['run']}", "ResourceType": RESOURCE_TYPE,
            "ServiceCategory": SERVICE_CATEGORY, "ServiceName": SERVICE_NAME,
            "ServiceSubcategory": SERVICE_SUBCATEGORY, "SkuId": r["sku"], "SubAccountId": r["tenant"],
            "SubAccountName": r["tenant"], "x_Cluster": r["cluster"], "x_JobId": r["job_id"], "x_Run": r["run"],
            "x_Partition": r["partition"], "x_Qos": r["qos"], "x_RowKind": r["row_kind"],
            "x_ReceiptHash": r["receipt_hash"], "x_LedgerThroughSeq": st.through_seq,
            "x_LedgerHeadHash": st.head_hash}


def _adjustment_row(base: dict, amount: float, hours: float, adj_id: Any, reason: Any, correction: bool) -> dict:
    row = dict(base)
    row.update({"ChargeCategory": "Credit" if amount < 0 else "Adjustment",
                "ChargeClass": "Correction" if correction else None, "ChargeFrequency": "One-Time",
                "ChargeDescription": f"{'Credit' if amount < 0 else 'Adjustment'} on job {base['x_JobId']} run "
                                     f"{base['x_Run']}: {reason or 'adjustment'} ({hours:.4f} GPU-hours)",
                "BilledCost": amount, "EffectiveCost": amount, "ListCost": amount, "ContractedCost": amount,
                "ConsumedQuantity": None, "ConsumedUnit": None, "PricingQuantity": None, "PricingUnit": None,
                "PricingCategory": None, "ContractedUnitPrice": None, "ListUnitPrice": None,
                "x_RowKind": "correction" if correction else "adjustment",
                "x_AdjustmentId": adj_id, "x_AdjustmentReason": reason,
                "Tags": json.dumps({f"{TAG_PREFIX}adjustment": True}, sort_keys=True)})
    return row


def write_focus(st: Any, path: str | Path, provider: str | None = None) -> None:
    df = focus_table(st, provider)
    # Every row comes from the same code path: validating the first rows (and every column) catches a
    # broken mapping without a per-row Python pass over a million-run month.
    problems = validate(df.head(VALIDATE_ROWS))
    if problems:  # never write a file that claims FOCUS and is not
        raise ValueError(f"FOCUS export invalid: {problems[0]}")
    df.to_csv(path, index=False)


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
