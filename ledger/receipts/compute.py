"""The receipt as a pure function of its inputs: run entries, gaps, resolutions, contract, samples.

No database here (``gather.py`` reads the inputs). Same :class:`RunInputs` -> same body -> same hash, in any
process, from any backend. Hours are integer nanohours until the body is written; money is Decimal until it
is rounded to cents, once per figure (docs/receipts.md, "Rounding").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Mapping, Sequence

from ..chain.canonical import canonical_json, format_ts, sha256_hex, ts_to_epoch
from ..chain.contracts import Contract, select_contract
from ..chain.entries import ChainedEntry, Kind
from ..method import DeviceAccount, SampleArrays, Thresholds, attribute_device, attribute_summary
from ..method.attribution import DEFAULT_THRESHOLDS, attribute_device_covered
from ..method.evidence import (REPLACED_BY_SAMPLES, controlled_by, rests_on_dcgm_job_record, user_controlled,
                               xids_raised)
from ..method.lens import (DeviceLens, LensSettings, lens_block, lens_device, lens_reader, peak_tflops, pipe_peaks,
                           precision_for)
from ..method.mig import mig_share
from ..method.shares import scale_account, share_of, share_segments, sum_accounts
from ..method.skus import SkuRating, match_sku
from ..telemetry.energy import device_energy_of
from ..method.carbon import CarbonSettings
from .energy import DeviceEnergyInput, carbon_block, energy_block
from .progress import progress_block
# the receipt's plain stages (price, bill) and the method's constants are the tenant's verifier's: one definition
from ..proofcheck import (BUCKETS, METHOD_NAME, METHOD_VERSION, POLICIES, adjustments_block, bill_device, cut,
                          energy_parts, part_buckets, slice_hours,
                          device_line, estimated_delivered, hours_block, money, price_device, rate_of,
                          run_accounting)
from ..proofcheck import hours as nanohours_to_hours

RECEIPT_VERSION = "1.2"  # 1.1: the progress block, provider_failure_loss, lost_since_checkpoint_credited;
# 1.2: who controls each piece of evidence (controlled_by, replaced_by, the failure's evidence), provider
# failures need provider-side evidence, user_caused_unknown
# 1.3 (method 1.1.0): the effective_compute block; a receipt computed without the lens stays 1.2 exactly
LENS_RECEIPT_VERSION = "1.3"
# 1.4: the energy block, for runs priced under a contract with energy_basis (with method 1.1.0 it carries the
# effective_compute block too); every other receipt keeps its version and its bytes
ENERGY_RECEIPT_VERSION = "1.4"
# 1.5: 1.4 where a device is shared (a MIG slice, a GPU several runs hold): the run bears its share of the GPU's
# energy (ledger.proofcheck.energy_parts); a 1.4 receipt of a shared device billed the whole GPU's, and replays so
ENERGY_SHARE_RECEIPT_VERSION = "1.5"
NANOHOURS = Decimal(10) ** 9


class ReceiptError(LookupError):
    """No such job/run, or a run the ledger cannot account (one line for the user)."""


@dataclass(frozen=True)
class RunKey:
    cluster: str | None
    job_id: str
    run: int


@dataclass(frozen=True)
class RunInputs:
    """Everything a receipt depends on, already cut at the as-of sequence."""

    key: RunKey
    entries: tuple[ChainedEntry, ...]            # the run's own entries (no receipt_issued), seq order
    gaps: tuple[ChainedEntry, ...] = ()          # unknown_interval entries not keyed to the run but on its devices
    resolutions: tuple[ChainedEntry, ...] = ()   # gap_resolution entries (any; filtered by gap id)
    contracts: tuple[ChainedEntry, ...] = ()     # contract_version entries
    segments: tuple[ChainedEntry, ...] = ()      # telemetry_segment entries whose samples are in `samples`
    samples: Mapping[str, SampleArrays] = field(default_factory=dict)
    contract_id: str | None = None
    contract_entry_id: str | None = None  # pin the contract_version (contracts.select_contract's entry_id)
    open_end: str | None = None  # for a run with no allocation_ended: the end of its latest telemetry
    # device -> ((t, xid), ...) of its samples in the window (DCGM field 230); read for runs that did not
    # complete, where a provider-side XID can make the end the provider's failure
    xid_samples: Mapping[str, tuple[tuple[float, float | None], ...]] = field(default_factory=dict)
    # device -> {"energy_j": (times, values), "power_w": (...)}: read only when a contract names energy_basis
    energy_columns: Mapping[str, Mapping[str, tuple]] = field(default_factory=dict)


@dataclass
class Receipt:
    body: dict                                    # the hashed JSON (receipt_hash included)
    timelines: dict[str, Any] = field(default_factory=dict)  # device -> (bins, TIMELINE_CODES) shares (PDF)

    @property
    def hash(self) -> str:
        return self.body["receipt_hash"]

    def canonical(self) -> str:
        return canonical_json(self.body)


# --- the run's frame: window, devices, suspended spans -----------------------------------------------------

@dataclass(frozen=True)
class RunFrame:
    start: str | None
    end: str | None
    open: bool
    account: str | None
    partition: str | None
    qos: str | None
    devices: tuple[dict, ...]
    nodes: tuple[str, ...]
    suspended: tuple[tuple[float, float], ...]


def run_frame(entries: Sequence[ChainedEntry], open_end: str | None = None) -> RunFrame:
    """Merge per-node allocation entries of one run into its window, devices and suspended spans.

    A run without allocation_ended (still running, or its epilog never ran) is accounted up to the last
    instant the ledger knows of: its entries' ends, or ``open_end`` (its latest telemetry), whichever is later.
    """
    started = [c for c in entries if c.entry.kind == Kind.ALLOCATION_STARTED]
    ended = [c for c in entries if c.entry.kind == Kind.ALLOCATION_ENDED]
    start = min((c.entry.ts for c in started), key=ts_to_epoch, default=None)
    end = max((c.entry.ts for c in ended), key=ts_to_epoch, default=None)
    is_open = end is None
    if end is None:  # still running or the epilog never ran: account up to the last thing we know of
        ends = [ts_to_epoch(c.entry.ts_end or c.entry.ts) for c in entries
                if c.entry.kind not in (Kind.ADJUSTMENT, Kind.GAP_RESOLUTION, Kind.EVIDENCE_REFUSED)]
        if open_end is not None:
            ends.append(ts_to_epoch(open_end))
        if start is not None and ends:
            end = format_ts(max(max(ends), ts_to_epoch(start)))
    ctx: dict = {}
    for c in started:  # first node's record wins, others fill gaps
        for k, v in c.entry.data.items():
            ctx.setdefault(k, v)
    devices: dict[str, dict] = {}
    bounds: dict[str, list] = {}
    for c in entries:
        if c.entry.kind != Kind.DEVICE_BOUND:
            continue
        d = c.entry.data
        uuid = c.entry.device or d.get("uuid")
        if uuid is None:
            continue
        bounds.setdefault(uuid, []).append((ts_to_epoch(c.entry.ts), d))
        if uuid in devices:
            continue
        devices[uuid] = {"uuid": uuid, "node": c.entry.node or d.get("node"), "index": d.get("index"),
                         "sku": d.get("sku"), "vendor": d.get("vendor"), "mig_profile": d.get("mig_profile"),
                         "mig_instance": d.get("mig_instance"), "gpu_uuid": d.get("gpu_uuid"),
                         "shared": share_of(d)}
    for uuid, dev in devices.items():   # the pods holding it changed during the run (method.shares.share_segments)
        segs = share_segments(bounds[uuid]) if len(bounds[uuid]) > 1 else []
        if len(segs) > 1:
            dev["segments"] = tuple(segs)
            dev["shared"] = ("segments", None)
    nodes = sorted({d["node"] for d in devices.values() if d["node"]} |
                   {c.entry.node for c in started if c.entry.node})
    susp = []
    resumed = sorted(ts_to_epoch(c.entry.ts) for c in entries if c.entry.kind == Kind.ALLOCATION_RESUMED)
    for c in entries:
        if c.entry.kind != Kind.ALLOCATION_SUSPENDED:
            continue
        a = ts_to_epoch(c.entry.ts)
        if c.entry.ts_end:
            b = ts_to_epoch(c.entry.ts_end)
        else:
            b = next((r for r in resumed if r >= a), ts_to_epoch(end) if end else a)
        susp.append((a, b))
    devs = tuple(sorted(devices.values(), key=lambda d: (str(d["node"]), d["index"] if isinstance(d["index"], int)
                                                          else 1 << 30, d["uuid"])))
    return RunFrame(start=start, end=end, open=is_open, account=ctx.get("account"),
                    partition=ctx.get("partition"), qos=ctx.get("qos"), devices=devs, nodes=tuple(nodes),
                    suspended=tuple(sorted(susp)))


def _attribute_window(uuid, window, inputs, summaries, mine, suspended, rated, thresholds) -> DeviceAccount:
    """One device's account over a part of the run's window, by the same sources as the whole (samples, else the
    job summary, else none)."""
    samples = inputs.samples.get(uuid)
    if samples is not None and len(samples):
        acc = attribute_device(window, samples, unknown=mine, suspended=suspended, rated_clock_mhz=rated,
                               thresholds=thresholds)
        if acc is not None:
            return acc
    if uuid in summaries:
        return attribute_summary(window, summaries[uuid].entry.data, unknown=mine, suspended=suspended,
                                 rated_clock_mhz=rated, thresholds=thresholds)
    return attribute_device(window, None, unknown=mine, suspended=suspended, rated_clock_mhz=rated,
                            thresholds=thresholds)


def gap_applies(gap: ChainedEntry, device: Mapping, key: RunKey) -> bool:
    """Does this unknown_interval cover this device of this run?"""
    e = gap.entry
    if e.job_id is not None and (e.job_id != key.job_id or (e.run or 0) != key.run):
        return False
    if e.device is not None:
        return e.device == device["uuid"]
    if e.node is not None:
        return e.node == device["node"]
    return e.job_id is not None  # a whole-run gap; an un-keyed gap with no device or node applies to nothing


# --- the receipt -------------------------------------------------------------------------------------------

def compute_receipt(inputs: RunInputs, sku_table: Mapping[str, SkuRating] | None = None,
                    thresholds: Thresholds = DEFAULT_THRESHOLDS, lens: LensSettings | None = None,
                    carbon: CarbonSettings | None = None, energy_shares: bool = True) -> Receipt:
    """The receipt body; ``lens`` None computes method 1.0.0 / receipt 1.2 exactly as before, a
    :class:`LensSettings` method 1.1.0 / receipt 1.3 (the same body plus ``effective_compute``). ``carbon`` (the
    site's zones and intensity tables) adds the ``carbon`` block to an energy receipt (1.4) whose devices have a
    zone; it changes no other receipt. ``energy_shares`` False: a shared device's energy as receipt 1.4 billed it
    (the whole GPU's), to replay a receipt issued as 1.4; else such a receipt is 1.5."""
    key = inputs.key
    # Stage frame: the run's window, devices and context (the verifier's compute_receipt has the same stages).
    frame = run_frame(inputs.entries, inputs.open_end)
    if frame.start is None:
        raise ReceiptError(f"job {key.job_id} run {key.run}: no allocation_started entry in the ledger")
    w0, w1 = ts_to_epoch(frame.start), ts_to_epoch(frame.end or frame.start)
    contract, contract_ce = select_contract(inputs.contracts, frame.account, inputs.contract_id, at=w0,
                                            entry_id=inputs.contract_entry_id)

    all_gaps = sorted({c.seq: c for c in (*inputs.gaps, *(c for c in inputs.entries
                                                           if c.entry.kind == Kind.UNKNOWN_INTERVAL))}.values(),
                      key=lambda c: c.seq)
    gap_ids = {g.entry.entry_id for g in all_gaps}
    resolutions: dict[str, ChainedEntry] = {}
    for r in sorted((*inputs.resolutions, *(c for c in inputs.entries if c.entry.kind == Kind.GAP_RESOLUTION)),
                    key=lambda c: c.seq):
        gid = r.entry.data.get("gap_id")
        if gid in gap_ids:
            resolutions[gid] = r  # the latest resolution of a gap wins
    summaries: dict[str, ChainedEntry] = {}
    for c in inputs.entries:
        if c.entry.kind == Kind.TELEMETRY_SUMMARY and c.entry.device:
            summaries[c.entry.device] = c  # latest per device

    accounts: list[tuple[dict, SkuRating | None, DeviceAccount]] = []
    timelines: dict[str, Any] = {}
    # Stage attribute: each device's integer nanohours per bucket (vectorised; proofcheck's is one sample at a time).
    plan = []
    # Independent evidence wins: on a device the node collector's sealed samples cover, an interval that rests
    # only on DCGM's job record (which anyone reaching the host engine can remove) is measured by the samples.
    sampled = sampled_devices(inputs.segments)
    replaced: set[str] = set()
    kept: set[str] = set()
    for dev in frame.devices:
        rating = match_sku(dev.get("sku"), sku_table)
        rated = rating.rated_sm_clock_mhz if rating else None
        mine = []
        for g in all_gaps:
            if not gap_applies(g, dev, key):
                continue
            if dev["uuid"] in sampled and rests_on_dcgm_job_record(g.entry.data.get("cause"), g.entry.source):
                replaced.add(g.entry.entry_id)
                continue
            kept.add(g.entry.entry_id)
            mine.append((ts_to_epoch(g.entry.ts), ts_to_epoch(g.entry.ts_end or g.entry.ts), g.entry.entry_id))
        plan.append((dev, rating, rated, mine))
    replaced -= kept
    # Big runs read and attribute their samples in worker processes (same functions, same integers);
    # a sample source that cannot, or a small run, does it here, one batch of devices at a time.
    parallel = getattr(inputs.samples, "attribute_all", None)
    done: dict[str, tuple[DeviceAccount | None, DeviceLens | None]] = {}
    device_paid: dict[str, int] = {}
    # Method 1.1's lens is computed from the same samples in the same pass as the attribution (one read)
    sample_lens: dict[str, DeviceLens | None] = {}
    if parallel is not None:
        done = parallel([(dev["uuid"], (w0, w1), mine, frame.suspended, rated, thresholds)
                         for dev, _r, rated, mine in plan]) or {}
    for dev, rating, rated, mine in plan:
        if dev["uuid"] in done:
            acc, sample_lens[dev["uuid"]] = done[dev["uuid"]]
        else:
            samples = inputs.samples.get(dev["uuid"])
            acc = None
            if samples is not None and len(samples) and lens is not None:
                # one pass: the lens reads the covered time and clock ratio the attribution computed
                acc, sample_lens[dev["uuid"]] = attribute_device_covered(
                    (w0, w1), samples, unknown=mine, suspended=frame.suspended, rated_clock_mhz=rated,
                    thresholds=thresholds, use=lens_reader(samples))
            elif samples is not None and len(samples):
                acc = attribute_device((w0, w1), samples, unknown=mine, suspended=frame.suspended,
                                       rated_clock_mhz=rated, thresholds=thresholds)
            samples = None   # (dropped before the next device is read, so its memory is reused)
        if acc is None and dev["uuid"] in summaries:
            acc = attribute_summary((w0, w1), summaries[dev["uuid"]].entry.data, unknown=mine,
                                    suspended=frame.suspended, rated_clock_mhz=rated, thresholds=thresholds)
        elif acc is None:
            acc = attribute_device((w0, w1), None, unknown=mine, suspended=frame.suspended,
                                   rated_clock_mhz=rated, thresholds=thresholds)
        if dev.get("segments"):   # the sharers changed: each segment of the window pays that segment's share
            device_paid[dev["uuid"]] = acc.paid_nanohours
            parts = []
            for i, (t0, sh) in enumerate(dev["segments"]):
                a = w0 if i == 0 else max(w0, min(w1, t0))
                b = w1 if i + 1 == len(dev["segments"]) else max(w0, min(w1, dev["segments"][i + 1][0]))
                if b <= a:
                    continue
                part = _attribute_window(dev["uuid"], (a, b), inputs, summaries, mine, frame.suspended, rated,
                                         thresholds)
                parts.append(part if sh is None else scale_account(part, sh[1]))
            acc = replace(sum_accounts(parts, acc.fidelity), timeline=acc.timeline) if parts else acc
        elif dev.get("shared") is not None:   # several runs hold it: this run pays its share (method.shares)
            device_paid[dev["uuid"]] = acc.paid_nanohours
            acc = scale_account(acc, dev["shared"][1])
        accounts.append((dev, rating, acc))
        timelines[dev["uuid"]] = acc.timeline

    run_total = sum_accounts([acc for _dev, _r, acc in accounts], "run")   # the devices added: the run's figures
    total, paid_nanohours, suspended_nanohours, coarse_nanohours = run_total.buckets, run_total.paid_nanohours, run_total.suspended_nanohours, \
        run_total.coarse_nanohours
    gap_nanohours, causes = run_total.gap_nanohours, run_total.unknown_causes
    assert int(total.sum()) == paid_nanohours, "accounting identity broken"
    xids = [(dev["uuid"], t, code) for dev in frame.devices
            for t, code in xids_raised(inputs.xid_samples.get(dev["uuid"], ()))]
    progress, credited_span = progress_block(inputs.entries, (w0, w1), len(frame.devices), frame.suspended,
                                             contract.provider_failure_loss == "credit", xids)

    # Unknown intervals and the policy each is billed under.
    intervals = []
    gap_policy: dict[str, str] = {}
    for g in all_gaps:
        gid = g.entry.entry_id
        if gid not in gap_nanohours and g.entry.job_id is None:
            continue
        d = g.entry.data
        res = resolutions.get(gid)
        cause = d.get("cause", "unspecified")
        # an operator's resolution decides; else what the job's user controls is never credited automatically
        policy = (res.entry.data.get("resolution") if res else
                  contract.user_caused_unknown if user_controlled(cause) else contract.unknown_policy)
        gap_policy[gid] = policy
        causes[cause] = causes.get(cause, 0) + gap_nanohours.get(gid, 0)
        intervals.append({
            "id": gid, "device": g.entry.device, "node": g.entry.node, "scope": d.get("scope"),
            "start": g.entry.ts, "end": g.entry.ts_end, "cause": cause, "detail": d.get("detail"),
            "gpu_hours": nanohours_to_hours(gap_nanohours.get(gid, 0)), "policy": policy,
            "controlled_by": controlled_by(cause), "replaced_by": REPLACED_BY_SAMPLES if gid in replaced else None,
            "resolution": None if res is None else {
                "as": res.entry.data.get("resolution"), "reason": res.entry.data.get("reason"),
                "by": res.entry.data.get("by"), "entry_id": res.entry.entry_id, "ts": res.entry.ts},
        })

    # Stages price and bill, per device (each device has its own SKU and rate): proofcheck's own functions.
    by_policy = {p: 0 for p in POLICIES}
    rates: dict[str, Decimal] = {}
    cost_nanohours: dict[str, Decimal] = {k: Decimal(0) for k in ("paid", "delivered", "billed", "suspended",
                                                            *BUCKETS)}
    billed_total_nanohours = 0
    lost_credited_nanohours = 0
    gaps_of = {dev["uuid"]: mine for dev, _r, _rated, mine in plan}
    unattributed_policy = contract.unknown_policy
    dev_lines = []
    for dev, rating, acc in accounts:
        rate, rate_key, mig = _device_rate(contract, rating, dev)
        rates[rate_key] = rate
        unknown_by_policy, lost_nanohours, billed = bill_device(
            acc, gaps_of[dev["uuid"]], gap_policy, unattributed_policy, contract.charge_suspended, credited_span,
            frame.suspended, contract.billing_granularity_s, contract.billing_minimum_s)
        for p, v in unknown_by_policy.items():
            by_policy[p] += v
        lost_credited_nanohours += lost_nanohours
        billed_total_nanohours += billed
        price_device(cost_nanohours, acc, billed, rate)
        dev_lines.append(device_line(dev, rating.key if rating else None, acc, billed, rate, mig, w0,
                                     device_paid.get(dev["uuid"])))
    fidelities = sorted({acc.fidelity for _d, _r, acc in accounts})
    fidelity = fidelities[0] if len(fidelities) == 1 else ("mixed" if fidelities else "none")

    paid_cost = money(cost_nanohours["paid"])
    delivered_cost = money(cost_nanohours["delivered"])
    billed_cost = money(cost_nanohours["billed"])
    mean_rate = (sum(rates.values(), Decimal(0)) / len(rates)) if rates else Decimal(0)

    adjustments, adj_total, adj_hours_nanohours = adjustments_block(
        (c.entry for c in inputs.entries if c.entry.kind == Kind.ADJUSTMENT), mean_rate)

    relevant = [*inputs.entries, *(g for g in inputs.gaps if g.entry.entry_id in gap_policy),
                *(r for r in resolutions.values()), *inputs.segments,
                *([contract_ce] if contract_ce is not None else [])]
    last = max(relevant, key=lambda c: c.seq)
    est_delivered = estimated_delivered(by_policy["estimate"], int(total[0]), paid_nanohours, int(total[-1]))

    # energy under an energy_basis is its own line, billed on top of the GPU-hours (the rate holds none of it)
    energy_rows = _energy_rows(inputs, contract, frame, accounts, (w0, w1), energy_shares)
    energy = energy_block(energy_rows, contract.currency) if energy_rows else None
    if energy is not None:
        billed_cost += Decimal(energy["cost"]["charged"])

    body: dict[str, Any] = {
        "receipt_version": RECEIPT_VERSION,
        "job": {"cluster": key.cluster, "job_id": key.job_id, "run": key.run, "account": frame.account,
                "partition": frame.partition, "qos": frame.qos,
                "devices": [{k: d[k] for k in ("uuid", "node", "index", "sku")} for d in frame.devices]},
        "window": {"start": frame.start, "end": frame.end},
        "open": frame.open,  # True: no allocation_ended yet; the window ends at the last thing the ledger knows
        "contract": {"id": contract.id, "version": contract.version, "entry_id": contract.entry_id,
                     "currency": contract.currency, "unknown_policy": contract.unknown_policy,
                     "charge_suspended": contract.charge_suspended,
                     "billing_granularity_s": contract.billing_granularity_s,
                     "billing_minimum_s": contract.billing_minimum_s,
                     "provider_failure_loss": contract.provider_failure_loss,
                     # only when not the default, so receipts under default terms keep their hashes
                     **({"period_rule": contract.period_rule} if contract.period_rule != "split" else {}),
                     **({"user_caused_unknown": contract.user_caused_unknown}
                        if contract.user_caused_unknown != "charge" else {})},
        "method": {"name": METHOD_NAME, "version": METHOD_VERSION, "fidelity": fidelity,
                   "coarse_signal_gpu_hours": nanohours_to_hours(coarse_nanohours),
                   "thresholds": {"active_min": thresholds.active_min,
                                  "resident_fb_mib": thresholds.resident_fb_mib}},
        "gpu_hours": hours_block(total, paid_nanohours, suspended_nanohours),
        "unknown_by_cause": {k: nanohours_to_hours(v) for k, v in sorted(causes.items()) if v},
        "unknown_intervals": intervals,
        "progress": progress,
        "billing": {
            "gpu_hours_paid": nanohours_to_hours(paid_nanohours),
            "unknown_gpu_hours_by_policy": {p: nanohours_to_hours(v) for p, v in by_policy.items()},
            "estimated_delivered_in_unknown": nanohours_to_hours(est_delivered),
            "suspended_charged": contract.charge_suspended,
            "lost_since_checkpoint_credited": nanohours_to_hours(lost_credited_nanohours),
            "gpu_hours_billed": nanohours_to_hours(billed_total_nanohours),
        },
        "devices": dev_lines,
        "adjustments": adjustments,
        "cost": {
            "currency": contract.currency,
            "rates_per_gpu_hour": {k: str(v) for k, v in sorted(rates.items())},
            "paid": float(paid_cost), "delivered": float(delivered_cost), "lost": float(paid_cost - delivered_cost),
            "by_bucket": {name: float(money(cost_nanohours[name])) for name in BUCKETS},
            "billed_before_adjustments": float(billed_cost),
            "adjustments": float(adj_total),
            "billed_after_adjustments": float(billed_cost + adj_total),
        },
        "totals": {
            "before_adjustments": {"gpu_hours": nanohours_to_hours(billed_total_nanohours), "amount": float(billed_cost)},
            "after_adjustments": {"gpu_hours": nanohours_to_hours(billed_total_nanohours + adj_hours_nanohours),
                                  "amount": float(billed_cost + adj_total)},
        },
        "ledger": {"through_seq": last.seq, "head_hash": last.hash},
    }
    if energy is not None:   # only under measured-energy terms: every other receipt keeps version 1.2 and its bytes
        shared = any(r.parts for r in energy_rows)
        body["receipt_version"] = ENERGY_SHARE_RECEIPT_VERSION if shared else ENERGY_RECEIPT_VERSION
        body["energy"] = energy
        body["cost"]["energy"] = energy["cost"]["charged"]
        carbon_ = _carbon(energy_rows, carbon, key.cluster) if carbon is not None else None
        if carbon_ is not None:
            body["carbon"] = carbon_
    accounting = run_accounting([c.entry for c in inputs.entries])
    if accounting is not None:  # runs the Slurm hooks recorded: the accounting record, or what still waits for it
        body["job"]["accounting"] = accounting
    if lens is not None:
        _add_lens(body, sample_lens, frame, plan, accounts, lens, (w0, w1), thresholds)
    body["receipt_hash"] = receipt_hash(body)
    return Receipt(body=body, timelines=timelines)


def _add_lens(body: dict, sample_lens: Mapping[str, DeviceLens | None], frame: Any, plan: Sequence,
              accounts: Sequence, lens: LensSettings, window: tuple[float, float], thresholds: Thresholds) -> None:
    """Method 1.1: the effective_compute block (docs/method.md, "Effective compute") from each device's lens of
    its samples (computed beside its attribution); the rest is untouched."""
    precision = None
    per_device = []
    summary_nanohours = 0
    for (dev, rating, rated, mine), (_d, _r, acc) in zip(plan, accounts):
        p = precision_for({"compute_precision": lens.compute_precision}, rating.key if rating else None,
                          frame.account)
        precision = p if precision in (None, p) else "mixed"
        if acc.fidelity == "summary":  # a summary carries no pipe field: its covered time is unmeasured
            summary_nanohours += acc.paid_nanohours - sum(acc.gap_nanohours.values())
            continue
        x = sample_lens.get(dev["uuid"]) if acc.fidelity == "samples" else None
        if x is None:  # no samples: nothing measured, nothing known
            x = lens_device(window, None, unknown=mine, suspended=frame.suspended, rated_clock_mhz=rated,
                            thresholds=thresholds)
        share = mig_share(dev.get("mig_profile"), dev.get("sku")) if dev.get("mig_profile") else None
        per_device.append((x, peak_tflops(rating, p), None if share is None else float(share), pipe_peaks(rating)))
    block = lens_block(per_device, precision or precision_for({"compute_precision": lens.compute_precision},
                                                             None, frame.account), summary_nanohours, lens.version)
    if body["receipt_version"] == RECEIPT_VERSION:  # an energy receipt (1.4) keeps its version
        body["receipt_version"] = LENS_RECEIPT_VERSION
    body["method"]["version"] = lens.version
    body["effective_compute"] = block

def _energy_rows(inputs: RunInputs, contract: Any, frame: RunFrame, accounts: list,
                 window: tuple[float, float], energy_shares: bool = True) -> list[DeviceEnergyInput]:
    """Each device's energy input (ledger.receipts.energy); empty when no device's terms name a basis. A shared
    device (a MIG slice, a GPU several runs hold) bears its share of the GPU's energy, part by part of the window
    (the verifier's energy_parts), and a slice its share of the GPU's TDP hours."""
    rows = []
    for dev, rating, acc in accounts:
        basis = contract.basis_for(rating.key if rating else None)
        if basis.energy_basis is None:
            continue
        columns = inputs.energy_columns.get(dev["uuid"], {})
        de = device_energy_of(dev["uuid"], columns, *window)
        buckets = tuple((a, b, "paid") for a, b in cut(window, list(frame.suspended))) + tuple(
            (a, b, "suspended") for a, b in frame.suspended)
        gpu_hours = Decimal(acc.paid_nanohours) / NANOHOURS
        parts = energy_parts(dev, *window) if energy_shares else ()
        if parts:
            parts = tuple((device_energy_of(dev["uuid"], columns, a, b), part_buckets(a, b, frame.suspended), sh)
                          for a, b, sh in parts)
            gpu_hours = slice_hours(dev, gpu_hours)
        rows.append(DeviceEnergyInput(de, buckets, rating.tdp_w if rating else None, gpu_hours, basis,
                                      dev.get("node"), parts))
    return rows


def _carbon(rows: Sequence[DeviceEnergyInput], carbon: CarbonSettings, cluster: str | None) -> dict | None:
    """The ``carbon`` block under the site's settings, or None when no device of the run has a zone."""
    zoned = [(carbon.table_for(cluster, r.node), r) for r in rows]
    zoned = [(t, r) for t, r in zoned if t is not None]
    return carbon_block(zoned) if zoned else None


def sampled_devices(segments: Sequence[ChainedEntry]) -> frozenset[str]:
    """The devices the receipt's telemetry segments (the node collector's sealed samples) cover."""
    return frozenset(d for seg in segments for d in (seg.entry.data.get("devices") or [seg.entry.device]) if d)


def _device_rate(contract: Any, rating: SkuRating | None, dev: Mapping) -> tuple[Decimal, str, dict | None]:
    """(hourly rate, its key in the receipt's rate table, the MIG slice it names or None) for one device: the
    verifier's :func:`ledger.proofcheck.rate_of` over this contract's prices (MIG shares: ``method.mig``)."""
    key = rating.key if rating else None
    tdp_w = rating.tdp_w if rating else None

    def named(name: str) -> Decimal | None:
        priced = contract.skus.get(name)
        return None if priced is None else priced.hourly(tdp_w)

    return rate_of(key, dev, lambda: contract.basis_for(key).hourly(tdp_w), named)


def receipt_hash(body: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the body without its own hash field."""
    return "sha256:" + sha256_hex(canonical_json({k: v for k, v in body.items() if k != "receipt_hash"}))


__all__ = ["LENS_RECEIPT_VERSION", "LensSettings", "RECEIPT_VERSION", "Receipt", "ReceiptError", "RunFrame", "RunInputs", "RunKey", "compute_receipt",
           "gap_applies", "receipt_hash", "run_frame", "Contract"]
