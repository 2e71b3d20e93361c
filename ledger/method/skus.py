"""SKU ratings (rated SM clock, TDP, peak BF16) and matching device names to them.

The shipped table is ``skus.toml`` next to this file, each figure with its public source. A site overrides or
extends it with ``[skus.<KEY>]`` tables in its config file, or a TOML file named by ``skus_file`` there.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from .packaged import package_text
from pathlib import Path
from typing import Mapping


PEAK_FIELDS = ("peak_fp16_dense_tflops", "peak_fp8_dense_tflops", "peak_tf32_dense_tflops", "peak_fp64_tensor_tflops",
               "peak_fp32_tflops", "peak_fp64_tflops")


class SkuError(ValueError):
    """A bad SKU table entry, phrased as one line naming the file and the field."""


@dataclass(frozen=True)
class SkuRating:
    key: str
    vendor: str
    rated_sm_clock_mhz: float | None
    tdp_w: float | None
    peak_bf16_dense_tflops: float | None
    match: tuple[str, ...]
    source: str
    # method 1.1's lens: dense peaks per precision (None: the table has no public figure for it)
    peak_fp16_dense_tflops: float | None = None
    peak_fp8_dense_tflops: float | None = None
    peak_tf32_dense_tflops: float | None = None
    peak_fp64_tensor_tflops: float | None = None
    peak_fp32_tflops: float | None = None
    peak_fp64_tflops: float | None = None    # FP64 non-tensor (vector): method 1.2.0 prices the FP64 pipe at it
    peaks_source: str = ""


def _parse_table(data: Mapping, origin: str) -> dict[str, SkuRating]:
    out = {}
    for key, row in data.items():
        if not isinstance(row, Mapping):
            raise SkuError(f"{origin}: skus.{key} must be a table")
        nums = {}
        for f in ("rated_sm_clock_mhz", "tdp_w", "peak_bf16_dense_tflops", *PEAK_FIELDS):
            v = row.get(f)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
                raise SkuError(f"{origin}: skus.{key}.{f} must be a positive number, got {v!r}")
            nums[f] = None if v is None else float(v)
        match = row.get("match", [key])
        if isinstance(match, str):
            match = [match]
        out[key] = SkuRating(key=key, vendor=str(row.get("vendor", "")), match=tuple(str(m) for m in match),
                             source=str(row.get("source", origin)), peaks_source=str(row.get("peaks_source", "")),
                             **nums)
    return out


@lru_cache(maxsize=1)
def builtin_table() -> dict[str, SkuRating]:
    text = package_text("ledger.method", "skus.toml")
    return _parse_table(tomllib.loads(text), "ledger/method/skus.toml")


def site_table(extra: Mapping | None = None, config_dir: str | None = None) -> dict[str, SkuRating]:
    """The built-in table with the site's overrides applied (``extra`` is the config's non-core keys)."""
    table = dict(builtin_table())
    extra = extra or {}
    path = extra.get("skus_file")
    if path:
        p = Path(str(path))
        if not p.is_absolute() and config_dir:
            p = Path(config_dir) / p
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: TOMLDecodeError, not UTF-8, int()'s digit limit
            raise SkuError(f"{p}: cannot read SKU table: {exc}") from None
        table.update(_merge(table, _parse_raw(data.get("skus", data)), str(p)))
    if isinstance(extra.get("skus"), Mapping):
        table.update(_merge(table, extra["skus"], "config [skus]"))
    return table


def _parse_raw(data: Mapping) -> Mapping:
    return data


def _merge(table: Mapping[str, SkuRating], raw: Mapping, origin: str) -> dict[str, SkuRating]:
    """A site row may give only the fields it changes; the rest come from the built-in row of that key."""
    merged = {}
    for key, row in raw.items():
        if not isinstance(row, Mapping):
            raise SkuError(f"{origin}: skus.{key} must be a table")
        base = table.get(key)
        full = {} if base is None else {"vendor": base.vendor, "rated_sm_clock_mhz": base.rated_sm_clock_mhz,
                                         "tdp_w": base.tdp_w, "peak_bf16_dense_tflops": base.peak_bf16_dense_tflops,
                                         "match": list(base.match), "source": base.source,
                                         "peaks_source": base.peaks_source,
                                         **{f: getattr(base, f) for f in PEAK_FIELDS}}
        full.update(row)
        if "source" not in row:
            full["source"] = f"site override ({origin})" + (f"; built-in: {base.source}" if base else "")
        merged.update(_parse_table({key: full}, origin))
    return merged


def match_sku(name: str | None, table: Mapping[str, SkuRating] | None = None) -> SkuRating | None:
    """The rating whose longest ``match`` pattern occurs in ``name`` (case-insensitive); exact key first."""
    if not name:
        return None
    table = builtin_table() if table is None else table
    if name in table:
        return table[name]
    low = name.lower()
    best: tuple[int, str] | None = None
    for key in sorted(table):
        for pat in (key, *table[key].match):
            if pat and pat.lower() in low and (best is None or len(pat) > best[0]):
                best = (len(pat), key)
    return None if best is None else table[best[1]]
