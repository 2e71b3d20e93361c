"""Contracts: the versioned commercial terms a receipt is priced under (docs/receipts.md, "Contracts").

A contract is loaded from a TOML file and recorded as a ``contract_version`` entry; a receipt uses the latest
contract_version at or before its sequence that applies to the run's account (else the documented
:data:`DEFAULT_CONTRACT`). Money is :class:`decimal.Decimal` throughout, never float.

File format::

    id = "acme-gpu"               # required
    version = "2026-11"           # required
    currency = "EUR"              # ISO 4217, default USD
    accounts = ["physics"]        # Slurm accounts it applies to; absent or [] = every account
    billing_granularity_s = 60    # billed time per device is rounded UP to this (default 1)
    billing_minimum_s = 0         # ... and is at least this per device (default 0)
    charge_suspended = false      # bill suspended time too (default false)
    unknown_policy = "hold"       # charge | credit | estimate | hold (default hold)
    provider_failure_loss = "charge"  # credit | charge: device-time since the last checkpoint of a run the
                                  # provider's failure ended (NODE_FAIL, a critical XID) (default charge)
    user_caused_unknown = "charge"  # charge | hold: unknown time the job's own user controls (e.g. a drop place
                                  # the hook could not empty) is charged, or held for an operator (default charge)
    period_rule = "split"         # split: usage billed in the months its seconds were paid (default);
                                  # end: the whole receipt in the month the run ended (invoice on completion)
    effective_from = "2026-11-01T00:00:00Z"   # optional (RFC 3339 or a date, UTC); the entry's ts
                                  # (default: when it is set)
    effective_to = 2027-01-01     # optional: runs that start at or after it are not priced by it

    [skus.H100-SXM5-80GB]         # a key of the SKU table, or "default"
    rate_per_gpu_hour = "2.50"    # rental ...
    [skus.MI300X]                 # ... or amortised capex plus energy
    capex_price = "24000"
    capex_years = 4
    capex_residual = "2000"
    energy_price_per_kwh = "0.11"
    pue = 1.3                     # optional, default 1.0; energy = TDP x PUE x price
    energy_basis = "measured"     # optional: measured | tdp. measured: the rate holds no energy; energy is its
                                  # own line, measured kWh x PUE x price (TDP x hours x PUE x price beside it).
                                  # Absent: TDP energy in the hourly rate, as contracts before the option.
    [skus.A100]                   # energy_price_per_kwh, pue and energy_basis may stand beside a rental rate
    rate_per_gpu_hour = "1.20"    # too (energy then comes on top of the rate)
    energy_price_per_kwh = "0.20"
    energy_basis = "measured"

A receipt is priced under the latest recorded version (by sequence) that applies to the run's account and
was in effect when the run started (``effective_from`` <= start < ``effective_to``), else
:data:`DEFAULT_CONTRACT`. :func:`check_contract` is what ``contract set`` refuses before recording: a SKU key
the SKU table does not know (naming the nearest), a SKU bound in the ledger with no price, a zero rate.
"""

from __future__ import annotations

import datetime as _dt
import tomllib
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterable, Mapping

from .canonical import format_ts, now_ts, ts_to_epoch
from .entries import ChainedEntry, Entry, Kind, make_entry

POLICIES = ("charge", "credit", "estimate", "hold")
LOSS_POLICIES = ("charge", "credit")
USER_CAUSED_POLICIES = ("charge", "hold")  # never credit: the billed party cannot move its own bill
PERIOD_RULES = ("split", "end")
ENERGY_BASES = ("measured", "tdp")
HOURS_PER_YEAR = Decimal(8760)


class ContractError(ValueError):
    """A bad contract file, phrased as one line naming the file and the field."""


@dataclass(frozen=True)
class CostBasis:
    rate_per_gpu_hour: Decimal | None = None
    capex_price: Decimal | None = None
    capex_years: Decimal | None = None
    capex_residual: Decimal = Decimal(0)
    energy_price_per_kwh: Decimal = Decimal(0)
    pue: Decimal = Decimal(1)
    energy_basis: str | None = None   # "measured" | "tdp" | None (legacy: TDP energy inside the capex rate)

    def hourly(self, tdp_w: float | None) -> Decimal:
        """Price of one GPU-hour: the rental rate, or capex amortised over its years plus TDP energy.

        With an ``energy_basis`` the rate holds no energy: :meth:`energy_cost` prices it as its own line.
        """
        if self.rate_per_gpu_hour is not None:
            return self.rate_per_gpu_hour
        assert self.capex_price is not None and self.capex_years
        amort = (self.capex_price - self.capex_residual) / (self.capex_years * HOURS_PER_YEAR)
        if self.energy_basis is not None:
            return amort
        energy = Decimal(str(tdp_w or 0)) / Decimal(1000) * self.pue * self.energy_price_per_kwh
        return amort + energy

    def energy_cost(self, measured_kwh: Decimal | None, tdp_w: float | None, gpu_hours: Decimal) -> dict:
        """The energy line: what was charged and what the other basis would have charged, beside it.

        ``measured_kwh`` None (nothing measured) under ``measured`` falls back to TDP, named as such
        (``basis = "tdp_fallback"``), never zero. Returns Decimals: ``charged``, ``measured``, ``tdp``, ``basis``.
        """
        price = self.energy_price_per_kwh * self.pue
        tdp = Decimal(str(tdp_w or 0)) / Decimal(1000) * gpu_hours * price
        measured = None if measured_kwh is None else measured_kwh * price
        if self.energy_basis == "measured" and measured is not None:
            basis, charged = "measured", measured
        elif self.energy_basis == "measured":
            basis, charged = "tdp_fallback", tdp
        else:
            basis, charged = "tdp", tdp
        return {"basis": basis, "charged": charged, "measured": measured, "tdp": tdp}

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        for k in ("rate_per_gpu_hour", "capex_price", "capex_years", "capex_residual", "energy_price_per_kwh", "pue"):
            v = getattr(self, k)
            if v is not None and not (k in ("capex_residual", "energy_price_per_kwh") and v == 0 and
                                      self.rate_per_gpu_hour is not None) and not (k == "pue" and v == 1):
                out[k] = str(v)
        if self.energy_basis is not None:   # only when set: contracts before the option keep their payload
            out["energy_basis"] = self.energy_basis
        return out


@dataclass(frozen=True)
class Contract:
    id: str
    version: str
    currency: str = "USD"
    accounts: tuple[str, ...] = ()
    billing_granularity_s: int = 1
    billing_minimum_s: int = 0
    charge_suspended: bool = False
    unknown_policy: str = "hold"
    provider_failure_loss: str = "charge"
    user_caused_unknown: str = "charge"
    period_rule: str = "split"
    skus: Mapping[str, CostBasis] = field(default_factory=dict)
    effective_from: str | None = None  # canonical RFC 3339; None: when it is recorded
    effective_to: str | None = None    # canonical RFC 3339; None: open-ended
    entry_id: str | None = None  # the contract_version entry it came from (None = the built-in default)

    def basis_for(self, sku_key: str | None) -> CostBasis:
        if sku_key and sku_key in self.skus:
            return self.skus[sku_key]
        if "default" in self.skus:
            return self.skus["default"]
        return CostBasis(rate_per_gpu_hour=Decimal(0))

    def to_payload(self) -> dict:
        return {"id": self.id, "version": self.version, "currency": self.currency, "accounts": list(self.accounts),
                "billing_granularity_s": self.billing_granularity_s, "billing_minimum_s": self.billing_minimum_s,
                "charge_suspended": self.charge_suspended, "unknown_policy": self.unknown_policy,
                **({"period_rule": self.period_rule} if self.period_rule != "split" else {}),
                "skus": {k: v.to_json() for k, v in sorted(self.skus.items())},
                # only when set: contract versions recorded before the option keep their exact payload
                **({"provider_failure_loss": self.provider_failure_loss}
                   if self.provider_failure_loss != "charge" else {}),
                **({"user_caused_unknown": self.user_caused_unknown} if self.user_caused_unknown != "charge" else {}),
                # effective_from is the entry's ts; effective_to only when given (same reason)
                **({"effective_to": self.effective_to} if self.effective_to else {})}


DEFAULT_CONTRACT = Contract(
    id="ipledger-default", version="1", currency="USD",
    skus={"default": CostBasis(rate_per_gpu_hour=Decimal("1.00"))},
    unknown_policy="hold",
)


def _dec(v: Any, where: str, positive: bool = False) -> Decimal:
    if isinstance(v, bool):
        raise ContractError(f"{where} must be a number, got {v!r}")
    try:
        d = Decimal(str(v))
    except (InvalidOperation, ValueError):
        raise ContractError(f"{where} must be a number, got {v!r}") from None
    if not d.is_finite() or d < 0 or (positive and d == 0):
        raise ContractError(f"{where} must be {'positive' if positive else 'non-negative'}, got {v!r}")
    return d


def _instant(v: Any, where: str) -> str:
    """An RFC 3339 instant (with ``Z`` or an offset) or a date (midnight UTC), as text or as TOML's own
    date/datetime values, in the ledger's one spelling."""
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            raise ContractError(f"{where} must name its UTC offset (e.g. 2026-11-01T00:00:00Z), got {v.isoformat()}")
        return str(format_ts(v))
    if isinstance(v, _dt.date):
        return str(format_ts(_dt.datetime(v.year, v.month, v.day, tzinfo=_dt.timezone.utc)))
    if isinstance(v, str):
        text = v.strip()
        try:
            if len(text) == 10:
                d = _dt.date.fromisoformat(text)
                return str(format_ts(_dt.datetime(d.year, d.month, d.day, tzinfo=_dt.timezone.utc)))
            return str(format_ts(text))
        except (ValueError, OverflowError):
            pass
    raise ContractError(f"{where} must be an RFC 3339 time with its offset or a date "
                        f"(e.g. 2026-11-01T00:00:00Z or 2026-11-01), got {v!r}")


def parse_contract(data: Mapping[str, Any], origin: str = "contract") -> Contract:
    """Validate a contract mapping (a TOML file's content, or a contract_version payload)."""
    for req in ("id", "version"):
        if not isinstance(data.get(req), (str, int)) or str(data.get(req)).strip() == "":
            raise ContractError(f"{origin}: field '{req}' is required (a string)")
    policy = data.get("unknown_policy", "hold")
    if policy not in POLICIES:
        raise ContractError(f"{origin}: unknown_policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    loss = data.get("provider_failure_loss", "charge")
    if loss not in LOSS_POLICIES:
        raise ContractError(f"{origin}: provider_failure_loss must be one of {', '.join(LOSS_POLICIES)}, got {loss!r}")
    user_caused = data.get("user_caused_unknown", "charge")
    if user_caused not in USER_CAUSED_POLICIES:
        raise ContractError(f"{origin}: user_caused_unknown must be one of {', '.join(USER_CAUSED_POLICIES)}, "
                            f"got {user_caused!r}")
    rule = data.get("period_rule", "split")
    if rule not in PERIOD_RULES:
        raise ContractError(f"{origin}: period_rule must be one of {', '.join(PERIOD_RULES)}, got {rule!r}")
    skus_raw = data.get("skus", {})
    if not isinstance(skus_raw, Mapping):
        raise ContractError(f"{origin}: [skus] must be a table of SKU tables")
    skus = {}
    for key, row in skus_raw.items():
        w = f"{origin}: skus.{key}"
        if not isinstance(row, Mapping):
            raise ContractError(f"{w} must be a table")
        basis = row.get("energy_basis")
        if basis is not None and basis not in ENERGY_BASES:
            raise ContractError(f"{w}.energy_basis must be one of {', '.join(ENERGY_BASES)}, got {basis!r}")
        if "rate_per_gpu_hour" in row:
            # energy beside a rental rate only with an energy_basis (before the option such keys were ignored)
            extra = {} if basis is None else {
                "energy_price_per_kwh": _dec(row.get("energy_price_per_kwh", 0), f"{w}.energy_price_per_kwh"),
                "pue": _dec(row.get("pue", 1), f"{w}.pue", positive=True)}
            skus[key] = CostBasis(rate_per_gpu_hour=_dec(row["rate_per_gpu_hour"], f"{w}.rate_per_gpu_hour"),
                                  energy_basis=basis, **extra)
        elif "capex_price" in row:
            if "capex_years" not in row:
                raise ContractError(f"{w}.capex_years is required with capex_price")
            skus[key] = CostBasis(
                capex_price=_dec(row["capex_price"], f"{w}.capex_price"),
                capex_years=_dec(row["capex_years"], f"{w}.capex_years", positive=True),
                capex_residual=_dec(row.get("capex_residual", 0), f"{w}.capex_residual"),
                energy_price_per_kwh=_dec(row.get("energy_price_per_kwh", 0), f"{w}.energy_price_per_kwh"),
                pue=_dec(row.get("pue", 1), f"{w}.pue", positive=True), energy_basis=basis)
            if skus[key].capex_residual > skus[key].capex_price:
                raise ContractError(f"{w}.capex_residual exceeds capex_price")
        else:
            raise ContractError(f"{w}: needs rate_per_gpu_hour, or capex_price with capex_years")
    accounts = data.get("accounts", [])
    if isinstance(accounts, str):
        accounts = [accounts]
    for k in ("billing_granularity_s", "billing_minimum_s"):
        v = data.get(k, 1 if k == "billing_granularity_s" else 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if k == "billing_granularity_s" else 0):
            raise ContractError(f"{origin}: {k} must be a whole number of seconds"
                                f"{' >= 1' if k == 'billing_granularity_s' else ''}, got {v!r}")
    if not isinstance(data.get("charge_suspended", False), bool):
        raise ContractError(f"{origin}: charge_suspended must be true or false")
    currency = str(data.get("currency", "USD"))
    if not (len(currency) == 3 and currency.isalpha()):
        raise ContractError(f"{origin}: currency must be an ISO 4217 code like USD, got {currency!r}")
    frm = None if data.get("effective_from") is None else _instant(data["effective_from"], f"{origin}: effective_from")
    to = None if data.get("effective_to") is None else _instant(data["effective_to"], f"{origin}: effective_to")
    if frm is not None and to is not None and not ts_to_epoch(to) > ts_to_epoch(frm):
        raise ContractError(f"{origin}: effective_to ({to}) must be after effective_from ({frm})")
    return Contract(
        id=str(data["id"]), version=str(data["version"]), currency=currency.upper(),
        accounts=tuple(str(a) for a in accounts),
        billing_granularity_s=int(data.get("billing_granularity_s", 1)),
        billing_minimum_s=int(data.get("billing_minimum_s", 0)),
        charge_suspended=bool(data.get("charge_suspended", False)), unknown_policy=policy, period_rule=rule,
        skus=skus, provider_failure_loss=loss, user_caused_unknown=user_caused, effective_from=frm, effective_to=to)


def read_contract(path: str | Path) -> Contract:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ContractError(f"{p}: byte {exc.start}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, and int()'s digit limit inside tomllib
        raise ContractError(f"{p}: not valid TOML: {exc}") from None
    return parse_contract(data, str(p))


def contract_entry(contract: Contract, ts: str | None = None) -> Entry:
    """The contract_version entry recording this contract; its ts is when the terms take effect
    (effective_from, else ``ts``, else now)."""
    if contract.effective_to is not None and contract.effective_from is None and ts is None:
        ts = now_ts()
        if not ts_to_epoch(contract.effective_to) > ts_to_epoch(ts):
            raise ContractError(f"contract {contract.id}: effective_to ({contract.effective_to}) is not after "
                                f"effective_from (now, {ts})")
    return make_entry(Kind.CONTRACT_VERSION, contract.effective_from or ts or now_ts(), contract.to_payload(),
                      source="ipledger.contract")


def contract_from_entry(ce: ChainedEntry) -> Contract:
    c = parse_contract(ce.entry.data, f"contract_version entry {ce.entry.entry_id}")
    return replace(c, effective_from=c.effective_from or str(format_ts(ce.entry.ts)), entry_id=ce.entry.entry_id)


def in_effect(ce: ChainedEntry, at: float) -> bool:
    """Was this contract_version in effect at the instant ``at`` (epoch seconds): from its ts (its
    effective_from) up to, not including, its effective_to?"""
    if ts_to_epoch(ce.entry.ts) > at:
        return False
    to = ce.entry.data.get("effective_to")
    return to is None or at < ts_to_epoch(str(to))


PINNED_DEFAULT = ""  # select_contract(entry_id=PINNED_DEFAULT): the built-in default, as an issued receipt had it


def select_contract(contract_entries: Iterable[ChainedEntry], account: str | None,
                    contract_id: str | None = None, *, at: float | None = None,
                    entry_id: str | None = None) -> tuple[Contract, ChainedEntry | None]:
    """Latest applicable contract_version among these (already cut at the receipt's sequence): for the
    account, of ``contract_id`` when given, in effect at ``at`` (the run's start) when given.

    ``entry_id`` pins the choice to that contract_version (:data:`PINNED_DEFAULT`: the built-in default), as
    an issued receipt recorded it: its replay, and a re-issue that keeps an exported month's terms."""
    entries = list(contract_entries)
    if entry_id is not None:
        if entry_id == PINNED_DEFAULT:
            return DEFAULT_CONTRACT, None
        for ce in entries:
            if ce.entry.entry_id == entry_id:
                return contract_from_entry(ce), ce
        raise ContractError(f"contract_version entry {entry_id} is not in the ledger at this cut")
    best: ChainedEntry | None = None
    for ce in entries:
        data = ce.entry.data
        if contract_id is not None and str(data.get("id")) != contract_id:
            continue
        accounts = data.get("accounts") or []
        if accounts and account not in accounts:
            continue
        if at is not None and not in_effect(ce, at):
            continue
        if best is None or ce.seq > best.seq:
            best = ce
    if best is None:
        return DEFAULT_CONTRACT, None
    return contract_from_entry(best), best


def _zero(basis: CostBasis) -> bool:
    if basis.rate_per_gpu_hour is not None:
        return basis.rate_per_gpu_hour == 0
    return basis.capex_price == basis.capex_residual and basis.energy_price_per_kwh == 0


def check_contract(contract: Contract, origin: str, sku_keys: Iterable[str],
                   in_use: Mapping[str, str | None] | None = None, allow_zero: bool = False) -> None:
    """Refuse (ContractError, one line naming ``origin`` and the field) terms that would price receipts at
    nothing by mistake: a SKU key the SKU table does not know (with the nearest known key), a SKU the ledger
    has bound (``in_use``: the device_bound SKU name -> its SKU table key, None when the table has none) that
    the contract gives no price, and a zero rate unless ``allow_zero``."""
    known = sorted(set(sku_keys))
    for key in sorted(contract.skus):
        if key == "default":
            continue
        base = key.split("/", 1)[0]
        if base not in known:
            import difflib   # only for the hint of a bad contract

            near = difflib.get_close_matches(base, known, n=1, cutoff=0.5)
            hint = f"did you mean {near[0]}?" if near else f"known: {', '.join(known[:8])}" + \
                (", ..." if len(known) > 8 else "")
            raise ContractError(f"{origin}: skus.{key}: {base!r} is not a SKU in the SKU table ({hint})")
    if not allow_zero:
        for key in sorted(contract.skus):
            if _zero(contract.skus[key]):
                raise ContractError(f"{origin}: skus.{key}: a rate of 0 bills nothing; give the price, or "
                                    f"--allow-zero to record a free SKU")
    if "default" in contract.skus:
        return
    for name, key in sorted((in_use or {}).items(), key=lambda kv: str(kv[0])):
        if key is None:
            raise ContractError(f"{origin}: skus: devices of SKU {name!r} (not in the SKU table) are bound in the "
                                f"ledger and would be priced 0; add [skus.default]")
        if key not in contract.skus:
            raise ContractError(f"{origin}: skus: SKU {key} is bound in the ledger (as {name!r}) but has no price; "
                                f"add [skus.{key}] or [skus.default]")


def record_contract(engine, contract: Contract, ts: str | None = None):  # noqa: ANN001, ANN201
    """Append a contract_version unless this id+version is already recorded.

    Versions are immutable: the same id and version with different terms is refused (bump the version).
    Returns (entry, seq, recorded) -- recorded False when the identical version was already there.
    """
    from .store import append, iter_entries

    payload = contract.to_payload()
    for ce in iter_entries(engine, kinds=[Kind.CONTRACT_VERSION]):
        d = ce.entry.data
        if str(d.get("id")) == contract.id and str(d.get("version")) == contract.version:
            if d == payload and contract.effective_from in (None, ce.entry.ts):
                return ce.entry, ce.seq, False
            raise ContractError(f"contract {contract.id} version {contract.version} is already recorded "
                                f"(seq {ce.seq}) with different terms; give the new terms a new version")
    entry = contract_entry(contract, ts)
    res = append(engine, [entry])
    return entry, res.last_seq, True



def bound_sku_names(engine_or_conn, accounts: Iterable[str] = ()) -> set[str | None]:  # noqa: ANN001
    """The SKU names of every device bound in the ledger (``device_bound``), of runs of these accounts
    (every run when none): what a contract must price."""
    from .store import iter_entries

    wanted = set(accounts)
    runs: dict[tuple, str | None] = {}
    names: dict[tuple, set[str | None]] = {}
    for ce in iter_entries(engine_or_conn, kinds=[Kind.ALLOCATION_STARTED, Kind.DEVICE_BOUND]):
        e = ce.entry
        key = (e.cluster, e.job_id, e.run or 0)
        if e.kind == Kind.ALLOCATION_STARTED:
            runs.setdefault(key, e.data.get("account"))
        else:
            names.setdefault(key, set()).add(e.data.get("sku"))
    return {n for key, ns in names.items() if not wanted or runs.get(key) in wanted for n in ns}
