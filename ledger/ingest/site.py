"""The site: every setting the ledger's work depends on, read and checked once from the configuration and passed down.

A :class:`Site` is built by :func:`site_from_config` where the configuration is read (the CLI, the demo, a
script) and handed to the library's entry points (``ledger.api``: ship, issue, export) and to whatever else
needs a setting, so that two paths computing one receipt cannot price it under different SKU tables, and
``ipledger --config X`` governs everything the command does. A bad value is refused here, once, in one line
naming the file and the key (:class:`SiteError`, or :class:`~ledger.method.skus.SkuError` for the SKU and
method settings). Nothing below the caller looks the configuration up again.

The Slurm hooks are the exception by design: they run on the nodes under ``python -I -S``, read their
``[hooks]`` table (``error_log``, ``state_dir``, the drop places' limits) on their own fast path
(``ledger.capture.hooks.core.HookSettings``) and never build a site.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from ..base.config import Config, normalise_db_url
from ..base.invoice_ids import DEFAULT_INVOICE_SCHEME, InvoiceSchemeError, check_invoice_scheme
from ..chain.adjustments import DEFAULT_MAX_FACTOR
from ..method.carbon import CarbonSettings, IntensityError, constant_intensity, parse_intensity
from ..method.lens import LENS_METHOD_VERSIONS, LensSettings, precision_for
from ..method.skus import SkuError, SkuRating, builtin_table, site_table

if TYPE_CHECKING:  # the sacct module (and the hook modules it uses) only where a site asks for accounting
    from .sacct import AccountingSettings


class SiteError(ValueError):
    """A bad setting in the site config: one line naming the file and the key."""


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
    # ``[accounting]``: the sacct records shipping adds for runs that ended (None: not asked)
    accounting: AccountingSettings | None = None
    # ``[focus] invoice_id``: the FOCUS export's InvoiceId scheme (checked)
    focus_invoice_scheme: str = DEFAULT_INVOICE_SCHEME
    # ``max_adjustment_factor``: an adjustment is at most the run's paid GPU-hours (or cost) times this
    max_adjustment_factor: float = DEFAULT_MAX_FACTOR
    # ``trusted_keys``: the public keys (PEM files) that must have signed every tree head (verify)
    trusted_keys: tuple[str, ...] = ()
    # ``[commands]``: program -> absolute path (sacct, scontrol, ... for reconcile); and the hooks' tool budget
    commands: Mapping[str, str] = field(default_factory=dict)
    hook_timeout_s: float = 5.0


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
    where = cfg.path or "config"
    return Site(db=normalise_db_url(db or cfg.db), spool=cfg.spool, cluster=cfg.cluster,
                sku_table=site_table(cfg.extra, str(Path(cfg.path).parent) if cfg.path else None),
                receipts_dir=cfg.receipts_dir, auto_receipts=auto, receipt_workers=workers, lens=site_lens(cfg.extra),
                carbon=site_carbon(cfg.extra, str(Path(cfg.path).parent) if cfg.path else None),
                accounting=site_accounting(cfg.extra, cfg.commands, where),
                focus_invoice_scheme=site_invoice_scheme(cfg.extra, where),
                max_adjustment_factor=site_adjustment_factor(cfg.extra, where),
                trusted_keys=tuple(cfg.trusted_keys), commands=dict(cfg.commands), hook_timeout_s=cfg.hook_timeout_s)


def site_accounting(extra: Mapping, commands: Mapping[str, str], where: str = "config") -> AccountingSettings | None:
    """``[accounting]``: enabled (default: when ``[commands] sacct`` is set), batch (runs per sacct call, at
    least 1), lookback_days and timeout_s (positive numbers). None when not enabled."""
    a = extra.get("accounting", {})
    if a is None:
        a = {}
    if not isinstance(a, Mapping):
        raise SiteError(f"{where}: [accounting] must be a table")
    enabled = a.get("enabled", "sacct" in commands)
    if not isinstance(enabled, bool):
        raise SiteError(f"{where}: accounting.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return None
    from .sacct import DEFAULT_BATCH, DEFAULT_LOOKBACK_DAYS, AccountingSettings

    batch = a.get("batch", DEFAULT_BATCH)
    try:
        batch_n = max(1, int(batch))   # as before: 0 or below is one run per call
    except (TypeError, ValueError, OverflowError):
        raise SiteError(f"{where}: accounting.batch must be a whole number of runs, got {batch!r}") from None
    if isinstance(batch, bool):
        raise SiteError(f"{where}: accounting.batch must be a whole number of runs, got {batch!r}")
    return AccountingSettings(commands=dict(commands), batch=batch_n,
                              lookback_days=_positive(a, "lookback_days", DEFAULT_LOOKBACK_DAYS, where),
                              timeout_s=_positive(a, "timeout_s", 60.0, where))


def _positive(table: Mapping, key: str, default: float, where: str) -> float:
    raw = table.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        value = float("nan")
    if isinstance(raw, bool) or not 0 < value < float("inf"):
        raise SiteError(f"{where}: accounting.{key} must be a positive number, got {raw!r}")
    return value


def site_invoice_scheme(extra: Mapping, where: str = "config") -> str:
    """``[focus] invoice_id``: the FOCUS export's InvoiceId scheme (default ``{cluster}-{YYYY-MM}-{tenant}``)."""
    focus = extra.get("focus")
    if focus is None:
        return DEFAULT_INVOICE_SCHEME
    if not isinstance(focus, Mapping):
        raise SiteError(f"{where}: [focus] must be a table")
    try:
        return check_invoice_scheme(str(focus.get("invoice_id", DEFAULT_INVOICE_SCHEME)))
    except InvoiceSchemeError as exc:
        raise SiteError(f"{where}: {exc}") from None


def site_adjustment_factor(extra: Mapping, where: str = "config") -> float:
    """``max_adjustment_factor``: a number between 0 and 1e6 (default :data:`DEFAULT_MAX_FACTOR`)."""
    raw = extra.get("max_adjustment_factor", DEFAULT_MAX_FACTOR)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw < 1e6:
        raise SiteError(f"{where}: max_adjustment_factor: expected a number between 0 and 1e6, got {raw!r}")
    return float(raw)


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
