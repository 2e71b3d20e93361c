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

from .config import Config, normalise_db_url
from .method.lens import LensSettings, precision_for
from .method.skus import SkuError, SkuRating, builtin_table, site_table


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
    # method 1.1's effective-compute lens: on with ``method_version = "1.1.0"`` in the site file (None: 1.0.0)
    lens: LensSettings | None = None


_OFF = ("0", "false", "no")


def site_from_config(cfg: Config, *, db: str | None = None, environ: Mapping[str, str] | None = None,
                     main_program: bool = False) -> Site:
    """The site a loaded :class:`~ledger.config.Config` describes; ``db`` (a URL or path) overrides its database.

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
                receipts_dir=cfg.receipts_dir, auto_receipts=auto, receipt_workers=workers, lens=site_lens(cfg.extra))


def site_lens(extra: Mapping) -> LensSettings | None:
    """``method_version = "1.1.0"`` (and ``compute_precision``, default bf16) turns the lens on."""
    version = str(extra.get("method_version", "1.0.0"))
    if version not in ("1.0.0", "1.1.0"):
        raise SkuError(f"config: method_version must be 1.0.0 or 1.1.0, got {version!r}")
    precision = extra.get("compute_precision", "bf16")
    for v in (precision.values() if isinstance(precision, Mapping) else [precision]):
        try:
            precision_for({"compute_precision": v}, None, None)
        except ValueError as exc:
            raise SkuError(f"config: {exc}") from None
    return LensSettings(compute_precision=precision) if version == "1.1.0" else None
