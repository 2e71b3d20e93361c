"""AMD device inventory and counter snapshots: ``amd-smi`` JSON / human-output parsers and an amdsmi reader.

The hooks record AMD accumulating counters (energy, ECC totals, violation/throttle accumulators) raw in the
prolog and again in the epilog; ship time takes their difference here. ``amd-smi ... --json`` nests values as
``{"value": V, "unit": U}`` objects or plain scalars, and writes ``"N/A"`` where a value is unsupported; the
human form is YAML-like (``KEY: value unit``, 4-space nesting, ``GPU: n`` blocks). A counter that went down
between the snapshots (driver reload, reset) is reported as ``counter_reset``, never as a negative or zero use.
"""

from __future__ import annotations

import re

from ...base.frozen import Frozen
# The inventory parser the hooks need to name their GPUs lives with them; named here too for the importers.
from ..hooks.vendor import (  # noqa: F401
    NA, AmdGpu, AmdSmiCli, amd_counter_args, gpu_index, json_records, parse_list_json, parse_static_market_names,
    unwrap
)

from typing import Any, Mapping

# Flattened counter keys (lower-case path) that accumulate over time and may be diffed between snapshots.
COUNTER_PATTERNS = (
    r"energy\.(total_energy_consumption|energy_accumulator)$",
    r"ecc\.total_(correctable|uncorrectable|deferred)_count$",
    r"throttle\.(accumulation_counter|[a-z_]+_accumulated)$",
    r"violation_status\.acc_[a-z_]+$",
)


class Snapshot(Frozen):
    """Per GPU index: flattened ``section.key`` -> number, and what was not available."""

    __slots__ = ("values", "missing")
    values: Mapping[int, Mapping[str, float]]
    missing: Mapping[int, Mapping[str, str]]


def _flatten(obj: Any, prefix: str, out: dict, missing: dict) -> None:
    obj = unwrap(obj)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k.lower()}" if prefix else k.lower(), out, missing)
        return
    if isinstance(obj, list):
        return  # per-XCP lists are time-series material (importers), not job counters
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        out[prefix] = float(obj)
        return
    if isinstance(obj, str):
        s = obj.strip()
        if s in NA:
            missing[prefix] = "not_available"
            return
        m = re.fullmatch(r"(-?[\d.]+)\s*[A-Za-z%°]*", s)
        if m:
            try:
                out[prefix] = float(m.group(1))
            except ValueError:
                pass


def parse_metric_json(text: str) -> Snapshot:
    """``amd-smi metric [...] --json`` -> per-GPU flattened numbers (a leading ``$ command`` line is skipped)."""
    values: dict[int, dict[str, float]] = {}
    missing: dict[int, dict[str, str]] = {}
    for item in json_records(text, "metric"):
        idx = gpu_index(item, "metric")
        v: dict[str, float] = {}
        m: dict[str, str] = {}
        _flatten({k: x for k, x in item.items() if k != "gpu"}, "", v, m)
        values[idx], missing[idx] = v, m
    return Snapshot(values=values, missing=missing)


def parse_metric_text(text: str) -> Snapshot:
    """The human form (``GPU: 0`` / ``    THROTTLE:`` / ``        KEY: value unit``), wrapped lines tolerated."""
    values: dict[int, dict[str, float]] = {}
    missing: dict[int, dict[str, str]] = {}
    gpu: int | None = None
    stack: list[tuple[int, str]] = []
    for ln in text.splitlines():
        if not ln.strip() or ln.lstrip().startswith("$") or ln.strip() == "...":
            continue
        m = re.match(r"GPU:\s*(\d+)\s*$", ln)
        if m:
            gpu = int(m.group(1))
            values.setdefault(gpu, {})
            missing.setdefault(gpu, {})
            stack = []
            continue
        if gpu is None:
            continue
        indent = len(ln) - len(ln.lstrip())
        s = ln.strip()
        if ":" not in s:
            continue  # continuation of a wrapped list value
        key, val = (x.strip() for x in s.split(":", 1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [key.lower()])
        if val == "":
            stack.append((indent, key.lower()))
            continue
        if val.startswith("["):
            continue
        if val in NA:
            missing[gpu][path] = "not_available"
            continue
        mm = re.fullmatch(r"(-?[\d.]+)\s*[A-Za-z%°]*", val)
        if mm:
            values[gpu][path] = float(mm.group(1))
    return Snapshot(values=values, missing=missing)


def counters(snapshot: Snapshot, gpu: int) -> tuple[dict[str, float], dict[str, str]]:
    """The accumulating counters of one GPU (and the counters that were N/A)."""
    vals = {k: v for k, v in snapshot.values.get(gpu, {}).items() if any(re.search(p, k) for p in COUNTER_PATTERNS)}
    miss = {k: c for k, c in snapshot.missing.get(gpu, {}).items() if any(re.search(p, k) for p in COUNTER_PATTERNS)}
    return vals, miss


def counter_delta(before: Mapping[str, float], after: Mapping[str, float],
                  missing_before: Mapping[str, str] | None = None,
                  missing_after: Mapping[str, str] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """after - before per counter; a counter absent at either end, or that went down, is missing with a cause."""
    delta: dict[str, float] = {}
    missing: dict[str, str] = {}
    for k in sorted(set(before) | set(after) | set(missing_before or {}) | set(missing_after or {})):
        if k in before and k in after:
            d = after[k] - before[k]
            if d < 0:
                missing[k] = "counter_reset"
            else:
                delta[k] = d
        elif k in (missing_before or {}) or k in (missing_after or {}):
            missing[k] = (missing_after or {}).get(k) or (missing_before or {}).get(k) or "not_available"
        else:
            missing[k] = "absent_at_start" if k not in before else "absent_at_end"
    return delta, missing


def counters_result(r) -> Snapshot | str:  # noqa: ANN001 - a ledger.base.commands.CommandResult
    """What ``amd-smi metric ... --json`` answered: its snapshot, or a one-line cause (never raises)."""
    if not r.ok:
        return ("timeout" if r.timed_out else "error") + ": " + (r.stderr or r.stdout).strip()[:200]
    try:
        return parse_metric_json(r.stdout)
    except (ValueError, KeyError, TypeError) as exc:
        return f"unparsed: {exc}"
