"""The site: every setting the ledger's work depends on, read once from the configuration and passed down.

A :class:`Site` is built by :func:`site_from_config` where the configuration is read (the CLI, the demo, a
script) and handed to shipping, issuing and verifying, so that two paths computing one receipt cannot price
it under different SKU tables, and ``ipledger --config X`` governs everything the command does. Nothing
below the caller looks the configuration up again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..base.config import Config, normalise_db_url
from ..method.carbon import CarbonSettings, IntensityError, constant_intensity, parse_intensity
from ..method.lens import LENS_METHOD_VERSIONS, LensSettings, precision_for
from ..method.skus import SkuError, SkuRating, builtin_table, site_table


@dataclass(frozen=True)
class Site:
    """One site's settings. ``sku_table`` already holds the site's ``[skus]`` / ``skus_file`` overrides."""

    db: str
    spool: str
    cluster: str | None = None
    sku_table: Mapping[str, SkuRating] = field(default_factory=builtin_table)
    receipts_dir: str | None = None
    auto_receipts: bool = True         # issue a run's receipt once its allocation_ended is shipped
    receipt_workers: int = 1           # processes a big receipt may use (>1 needs a main guard in scripts)
    # the effective-compute lens: on with ``method_version = "1.1.0"`` or "1.2.0" in the site file (None: 1.0.0)
    lens: LensSettings | None = None
    # the ``[carbon]`` section: zones and intensity tables (None: receipts carry no carbon block)
    carbon: CarbonSettings | None = None


_OFF = ("0", "false", "no")


def site_from_config(cfg: Config, *, db: str | None = None, environ: Mapping[str, str] | None = None,
                     main_program: bool = False) -> Site:
    """The site a loaded :class:`~ledger.base.config.Config` describes; ``db`` (a URL or path) overrides its database.

    ``IPLEDGER_AUTO_RECEIPTS=0`` (or ``auto_receipts = false`` in the file) turns automatic receipts off.
    Receipt workers: ``IPLEDGER_RECEIPT_WORKERS=N``, else one per core up to 8 for a ``main_program`` (the CLI,
    whose spawned workers can re-import it), else 1. Raises :class:`~ledger.method.skus.SkuError` (one line
    naming the file) for a bad SKU override.
    """
    env = os.environ if environ is None else environ
    auto = cfg.extra.get("auto_receipts", True) is not False
    if env.get("IPLEDGER_AUTO_RECEIPTS", "").strip().lower() in _OFF:
        auto = False
    workers = min(os.cpu_count() or 1, 8) if main_program else 1
    if env.get("IPLEDGER_RECEIPT_WORKERS"):
        try:
            workers = max(1, int(env["IPLEDGER_RECEIPT_WORKERS"]))
        except ValueError:
            workers = 1
    return Site(db=normalise_db_url(db or cfg.db), spool=cfg.spool, cluster=cfg.cluster,
                sku_table=site_table(cfg.extra, str(Path(cfg.path).parent) if cfg.path else None),
                receipts_dir=cfg.receipts_dir, auto_receipts=auto, receipt_workers=workers, lens=site_lens(cfg.extra),
                carbon=site_carbon(cfg.extra, str(Path(cfg.path).parent) if cfg.path else None))


def site_lens(extra: Mapping) -> LensSettings | None:
    """``method_version = "1.1.0"`` or ``"1.2.0"`` (the FP pipes in the achieved FLOPs; and
    ``compute_precision``, default bf16) turns the lens on."""
    version = str(extra.get("method_version", "1.0.0"))
    if version not in ("1.0.0", *LENS_METHOD_VERSIONS):
        raise SkuError(f"config: method_version must be 1.0.0, {' or '.join(LENS_METHOD_VERSIONS)}, got {version!r}")
    precision = extra.get("compute_precision", "bf16")
    for v in (precision.values() if isinstance(precision, Mapping) else [precision]):
        try:
            precision_for({"compute_precision": v}, None, None)
        except ValueError as exc:
            raise SkuError(f"config: {exc}") from None
    return LensSettings(compute_precision=precision, version=version) if version in LENS_METHOD_VERSIONS else None


INTENSITY_FILE_MAX_BYTES = 64 * 1024 * 1024   # an intensity file is read whole; a bigger one is refused


def site_carbon(extra: Mapping, base_dir: str | None = None) -> CarbonSettings | None:
    """The ``[carbon]`` section: ``zone`` (default) and/or ``[carbon.zones]`` (cluster or node -> zone), with
    ``intensity_file`` (Electricity Maps or WattTime CSV, relative to the config file; ``column`` = lca | direct)
    or ``intensity_constant`` (gCO2e/kWh, labelled ``intensity_label``). None when the section is absent.
    Raises :class:`~ledger.method.skus.SkuError` (one line naming the file and field) for a bad section."""
    sec = extra.get("carbon")
    if sec is None:
        return None
    if not isinstance(sec, Mapping):
        raise SkuError("config: [carbon] must be a table")
    zone = sec.get("zone")
    zones = sec.get("zones", {})
    if zone is not None and (not isinstance(zone, str) or not zone.strip()):
        raise SkuError(f"config: carbon.zone must be a zone name, got {zone!r}")
    if not isinstance(zones, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                 for k, v in zones.items()):
        raise SkuError("config: carbon.zones must map cluster or node names to zone names")
    if zone is None and not zones:
        raise SkuError("config: [carbon] names no zone (carbon.zone or [carbon.zones])")
    names = sorted({*([zone] if zone else []), *zones.values()})
    path, constant = sec.get("intensity_file"), sec.get("intensity_constant")
    if (path is None) == (constant is None):
        raise SkuError("config: [carbon] needs exactly one of carbon.intensity_file or carbon.intensity_constant")
    try:
        if constant is not None:
            if isinstance(constant, bool) or not isinstance(constant, (int, float)):
                raise SkuError(f"config: carbon.intensity_constant must be a number, got {constant!r}")
            label = str(sec.get("intensity_label", "site constant"))
            tables = {z: constant_intensity(z, float(constant), label) for z in names}
        else:
            text = _read_intensity(str(path), base_dir)
            column = str(sec.get("column", "lca"))
            tables = {z: parse_intensity(text, z, column, origin=str(path)) for z in names}
    except IntensityError as exc:
        raise SkuError(str(exc)) from None
    return CarbonSettings(tables=tables, zone=zone, zones=dict(zones))


def _read_intensity(path: str, base_dir: str | None) -> str:
    full = Path(path) if Path(path).is_absolute() or base_dir is None else Path(base_dir) / path
    try:
        with open(full, "rb") as fh:
            raw = fh.read(INTENSITY_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise SkuError(f"{path}: carbon.intensity_file cannot be read: {exc.strerror}") from None
    if len(raw) > INTENSITY_FILE_MAX_BYTES:
        raise SkuError(f"{path}: carbon.intensity_file is over {INTENSITY_FILE_MAX_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SkuError(f"{path}: carbon.intensity_file is not UTF-8 text") from None
