"""Random job runs for the proof tests: every kind of input a receipt reads, drawn from one seed.

A run has 1-3 devices (rated, unrated and unknown SKUs, whole GPUs or MIG instances of known and unknown
profiles), each with sealed samples (missing values, repeated instants, short and zero durations, every
clock-event reason, XIDs of every class raised or left over from before), a DCGM summary in the shape the hooks
derive it (with or without XID errors), or nothing; intervals that rest on DCGM's job record or on what the
job's user controls; un-keyed and run-keyed unknown
intervals, some resolved, and refused evidence; suspensions; progress marks (checkpoints, outputs, steps, some
outside the window); an open or closed window, ended by a node, the controller and/or the accounting database
in any final state (a provider failure among them), perhaps requeued; a contract (rental or capex, a MIG
profile's own price, granularity, minimum, provider-failure loss credited or charged, period rule) or the
default; adjustments in hours and in money.
"""

from __future__ import annotations

import random
from pathlib import Path

from ledger.chain.adjustments import adjustment_entry
from ledger.chain.contracts import contract_entry, parse_contract
from ledger.chain.entries import Kind, make_entry
from ledger.chain.store import append
from ledger.telemetry.model import SAMPLE_COLUMNS
from ledger.telemetry.sealed import segment_entry_rows, write_segment_rows_in
from ledger.chain.db import write_tx
from ledger.ingest.ship import refusal_entries

JOB = "8100"
SKUS = ["NVIDIA H100 80GB HBM3", "AMD Instinct MI300X", "Acme Tensor 9", None, "NVIDIA A100-SXM4-80GB"]
REASONS = [0, 0, 0x20, 0x4, 0x8, 0x10, 0x2, 0x44, 0x80, None]
MIG_PROFILES = ["3g.40gb", "1g.10gb", "7g.80gb", "2g.20gb+me", "9g.90gb", "odd"]  # the last two: not in the table
STATES = ["COMPLETED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "CANCELLED", None]


def _maybe(rng: random.Random, value, p: float = 0.1):  # noqa: ANN001, ANN202
    return None if rng.random() < p else value


def _rows(rng: random.Random, uuid: str, t0: float, dur: float) -> list[tuple]:
    cadence = rng.choice([5.0, 10.0, 36.0, 60.0, 7.5])
    t = t0 - rng.uniform(0, 2 * cadence)
    rows = []
    while t < t0 + dur + cadence:
        act = rng.choice([rng.uniform(0, 1), rng.uniform(0, 0.06), 1.0, 1.2, 0.0])
        row = {c: None for c in SAMPLE_COLUMNS}
        row.update(device=uuid, t=round(t, 3), dt=rng.choice([cadence] * 8 + [cadence / 2, 0.0]),
                   clock_reasons=rng.choice(REASONS), sm_active=_maybe(rng, act, 0.15),
                   tensor_active=_maybe(rng, act * 0.4, 0.5), gpu_util=_maybe(rng, min(1.0, act * 1.1), 0.3),
                   sm_clock_mhz=_maybe(rng, rng.choice([1980.0, 1410.0, 990.0, 2300.0, 1700.5]), 0.1),
                   compute_procs=_maybe(rng, float(rng.choice([0, 1, 2])), 0.2),
                   fb_used_mib=_maybe(rng, rng.choice([0.0, 600.0, 20480.0]), 0.2), power_w=300.0)
        rows.append(tuple(row[c] for c in SAMPLE_COLUMNS))
        if rng.random() < 0.03:
            rows.append(rows[-1])  # the same instant twice
        t += cadence * rng.choice([1, 1, 1, 1, 0.5, 3])
    return rows


def build(engine, seed: int) -> dict:  # noqa: ANN001
    """Write one random run (job 8100) and some unrelated entries into the ledger; returns what was drawn."""
    rng = random.Random(seed)
    more = random.Random(seed * 7919 + 1)  # the draws added later: the earlier ones stay those of each seed
    t0 = 1_780_000_000 + rng.choice([0.0, 0.25, 17.5])
    dur = rng.uniform(300, 4 * 3600)
    key = {"cluster": "hpc1", "job_id": JOB, "run": rng.choice([0, 0, 1])}
    account = rng.choice(["physics", "bio"])
    uuids = [f"GPU-{seed:08x}-{i:04d}" for i in range(rng.randint(1, 3))]
    nodes = [f"n{i % 2}" for i in range(len(uuids))]
    hook = rng.choice(["hook.prolog", "hook.slurm"])  # hook.slurm: the receipt says what accounting it waits for
    run = [make_entry(Kind.ALLOCATION_STARTED, t0, {"account": account, "partition": "gpu", "qos": "normal"},
                      node="n0", source=hook, **key)]
    for i, u in enumerate(uuids):
        bound = {"index": i, "uuid": u, "sku": rng.choice(SKUS), "node": nodes[i]}
        if rng.random() < 0.3:  # a MIG instance of a parent GPU
            bound.update(sku=rng.choice(["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", bound["sku"]]),
                         mig_profile=rng.choice(MIG_PROFILES), mig_instance=rng.randint(1, 14),
                         gpu_uuid=f"GPU-parent-{i}")
        run.append(make_entry(Kind.DEVICE_BOUND, t0, bound, device=u, node=nodes[i], source=hook, **key))
    closed = rng.random() < 0.8
    if closed:
        run.append(make_entry(Kind.ALLOCATION_ENDED, t0 + dur, {"exit_code": 0, "state": rng.choice(STATES)},
                              node="n0", source=rng.choice(["hook.epilog", hook]), **key))
        job_level = {**key, "node": None}
        if rng.random() < 0.3:
            run.append(make_entry(Kind.ALLOCATION_ENDED, t0 + dur, {"scope": "job", "state": rng.choice(STATES)},
                                  source="hook.slurmctld", **job_level))
        if rng.random() < 0.3:  # the accounting database's record: its state wins
            run.append(make_entry(Kind.ALLOCATION_STARTED, t0, {"scope": "job", "account": account, "qos": "high",
                                                                "tres": "gres/gpu=2"}, source="sacct", **job_level))
            run.append(make_entry(Kind.ALLOCATION_ENDED, t0 + dur + rng.choice([0.0, 1.5]),
                                  {"scope": "job", "state": rng.choice(STATES), "state_basis": "sacct"},
                                  source="sacct", **job_level))
    if rng.random() < 0.1:
        run.append(make_entry(Kind.ALLOCATION_REQUEUED, t0 + dur / 2, {"next_run": key["run"] + 1}, node="n0",
                              source=hook, **key))
    for _ in range(rng.choice([0, 0, 1, 3, 5])):
        run.append(make_entry(Kind.PROGRESS, t0 + rng.uniform(-60, dur + 60), {
            "kind": rng.choice(["checkpoint", "checkpoint", "output", "step", None]),
            "step": rng.choice([None, rng.randint(1, 5000)]), "note": rng.choice([None, "ckpt-a"])},
            node="n0", source=hook, **key))
    if rng.random() < 0.3:
        a = t0 + rng.uniform(0, dur / 2)
        run.append(make_entry(Kind.ALLOCATION_SUSPENDED, a, {}, ts_end=a + rng.uniform(10, dur / 3), node="n0",
                              source="hook", **key))
    if rng.random() < 0.2:
        a = t0 + rng.uniform(dur / 2, dur)
        run.append(make_entry(Kind.ALLOCATION_SUSPENDED, a, {}, node="n0", source="hook", **key))
        run.append(make_entry(Kind.ALLOCATION_RESUMED, a + rng.uniform(5, 200), {}, node="n0", source="hook", **key))
    gaps = []
    for _ in range(rng.randint(0, 3)):
        a = t0 + rng.uniform(-600, dur)
        b = a + rng.uniform(1, dur / 2)
        i = rng.randrange(len(uuids))
        keyed = rng.random() < 0.4
        gaps.append(make_entry(Kind.UNKNOWN_INTERVAL, a, {"cause": rng.choice(["collector_down", "epilog_missing"]),
                                                          "scope": "device"}, ts_end=b,
                               device=rng.choice([uuids[i], None]), node=nodes[i], source="collector",
                               **(key if keyed else {"cluster": "hpc1"})))
    extra_gaps = []
    for _ in range(more.choice([0, 0, 1, 2])):  # from DCGM's job record (samples may replace it), or the user's
        a = t0 + more.uniform(0, dur / 2)
        cause, source = more.choice([("dcgm_host_engine_restart", "ipledger.derive"), ("dcgm_no_data", "hook.epilog"),
                                     ("dcgm_host_engine_restart", "collector"), ("drop_place_over_quota", "hook.epilog")])
        extra_gaps.append(make_entry(Kind.UNKNOWN_INTERVAL, a, {"cause": cause, "scope": "device"},
                               ts_end=a + more.uniform(1, dur / 2), device=more.choice(uuids), node="n0",
                               source=source, **key))
    if rng.random() < 0.2:  # a spool record the shipper refused: an unknown interval on the run
        a = t0 + rng.uniform(0, dur)
        gaps += refusal_entries(Path("n0.jsonl"), 7, "sm_active: not a number", {
            "kind": "telemetry_summary", "ts": a, "ts_end": a + rng.uniform(0, dur / 4), "node": "n0",
            "device": rng.choice([uuids[0], None]), **key}, mtime=t0, now=t0 + dur)
    append(engine, run + gaps + extra_gaps)
    for i, u in enumerate(uuids):
        mode = rng.choice(["samples", "samples", "samples", "summary", "none"])
        if mode == "samples":
            rows = _rows(rng, u, t0, dur)
            if more.random() < 0.5:  # DCGM field 230: the device's last XID, raised during the run or stale
                xi = SAMPLE_COLUMNS.index("xid")
                code, at, before = more.choice([79.0, 13.0, 48.0, 43.0, 119.0, 999.0]), more.randrange(len(rows)), \
                    more.choice([0.0, 0.0, None, 13.0])  # floats: the samples' column type
                rows = [r[:xi] + ((before if j < at else code),) + r[xi + 1:] for j, r in enumerate(rows)]
            cut = rng.randrange(len(rows) + 1) if rng.random() < 0.5 else len(rows)
            for part in (rows[:cut], rows[cut:]):
                if part:
                    with write_tx(engine) as conn:
                        write_segment_rows_in(conn, part, segment_entry_rows(part, node=nodes[i], source="collector"))
        elif mode == "summary":
            payload = {"sm_util_pct_avg": rng.choice([rng.uniform(0, 100), 2.0, None]),
                       "sm_clock_mhz_avg": rng.choice([1500.0, None]), "slowdown_thermal_pct": rng.uniform(0, 30),
                       "num_processes": rng.choice([0, 1, None]), "xid_errors": rng.choice([0, 0, 3, None])}
            payload = {"values": payload}  # where the hooks' derived summaries hold DCGM's figures
            append(engine, [make_entry(Kind.TELEMETRY_SUMMARY, t0 + dur, payload, device=u, node=nodes[i],
                                       source="hook.epilog", **key)])
    later = []
    for g in gaps:
        if rng.random() < 0.5:
            later.append(make_entry(Kind.GAP_RESOLUTION, t0 + dur + 60, {
                "gap_id": g.entry_id, "resolution": rng.choice(["charge", "credit", "estimate", "hold"]),
                "reason": "agreed", "by": "ops"}, source="ipledger.resolve"))
    for g in extra_gaps:
        if more.random() < 0.3:
            later.append(make_entry(Kind.GAP_RESOLUTION, t0 + dur + 60, {
                "gap_id": g.entry_id, "resolution": more.choice(["charge", "credit"]), "reason": "agreed",
                "by": "ops"}, source="ipledger.resolve"))
    if rng.random() < 0.7:
        terms = {"id": "c1", "version": str(rng.randint(1, 3)), "currency": "EUR",
                 "unknown_policy": rng.choice(["charge", "credit", "estimate", "hold"]),
                 "billing_granularity_s": rng.choice([1, 60, 3600]), "billing_minimum_s": rng.choice([0, 600]),
                 "charge_suspended": rng.random() < 0.3, "accounts": rng.choice([[], [account], ["other"]]),
                 "provider_failure_loss": rng.choice(["charge", "credit", "credit"]),
                 "period_rule": rng.choice(["split", "end"]), "user_caused_unknown": more.choice(["charge", "hold"]),
                 "skus": {"default": {"rate_per_gpu_hour": "2.50"},
                          "A100-SXM4-80GB/3g.40gb": {"rate_per_gpu_hour": "1.10"},  # a MIG profile's own price
                          "MI300X": {"capex_price": "24000", "capex_years": 4, "capex_residual": "2000",
                                     "energy_price_per_kwh": "0.11", "pue": 1.3}}}
        later.append(contract_entry(parse_contract(terms), ts="2026-01-01T00:00:00Z"))
    for _ in range(rng.randint(0, 2)):
        later.append(adjustment_entry(direction=rng.choice(["credit", "debit"]),
                                      quantity=rng.choice(["0.05h", "1.5h", "12.34"]), reason="goodwill",
                                      by="ops", ts=t0 + dur, **key))
    # unrelated entries: another job on other devices
    later.append(make_entry(Kind.ALLOCATION_STARTED, t0, {"account": "x"}, cluster="hpc1", job_id="9999", run=0))
    append(engine, later)
    return {"key": key, "uuids": uuids, "closed": closed}
