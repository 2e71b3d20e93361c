"""Ship time: what the hooks' raw vendor tool output (``tool_output`` entries) means, as entries.

A hook records what it saw (each tool's arguments, exit code, time taken and output, bounded) and the context
it saw it in (the run's devices, its start and end, whether DCGM accepted the job at prolog time). Here that
evidence is parsed, with this module's versioned parsers, into what receipts read: a ``telemetry_summary`` per
device, an ``unknown_interval`` with its cause over every span the output does not cover, and a ``hook_error``
naming what went wrong. Both the observation and what it gave are entries: a parser fix re-derives from the
same evidence under a new :data:`VERSION` (its entries have their own ids, beside the old ones).

Pure: an entry in, entries out; never raises for what a spool may hold (a malformed observation gives a
``hook_error``). The derived entries carry source :data:`SOURCE`, which the intake refuses from a spool
(``ipledger.*`` is reserved), so a node cannot write a summary that looks derived.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...base.commands import CommandResult
from ...chain.entries import Entry, Kind, make_entry
from . import amd_snapshots as amdsmi, dcgm

SOURCE = "ipledger.derive"
VERSION = "1"
_DCGM_CAUSES = {"no_data": "dcgm_no_data", "timeout": "dcgm_timeout", "connection": "dcgm_unreachable",
                "unparsed": "dcgm_unparsed"}


class _Out:
    """The entries one observation gives, keyed like it (cluster, job, run, node) and written by ship."""

    def __init__(self, obs: Entry, step: str) -> None:
        self.keys = {"cluster": obs.cluster, "job_id": obs.job_id, "run": obs.run, "node": obs.node,
                     "source": SOURCE, "source_version": f"{step}/{VERSION}", "recorded_at": obs.recorded_at}
        self.entries: list[Entry] = []

    def add(self, kind: str, ts: float, payload: Mapping[str, Any], *, ts_end: float | None = None,
            device: str | None = None) -> None:
        self.entries.append(make_entry(kind, ts, payload, ts_end=ts_end, device=device, **self.keys))

    def gap(self, a: float, b: float, cause: str, detail: str, device: str | None) -> None:
        if b - a > 0:
            self.add(Kind.UNKNOWN_INTERVAL, a, {"cause": cause, "scope": "device", "detail": detail[:300]},
                     ts_end=b, device=device)

    def error(self, ts: float, hook: str, stage: str, message: str) -> None:
        self.add(Kind.HOOK_ERROR, ts, {"hook": hook, "stage": stage, "error": message[:500]})


def result(call: Mapping[str, Any]) -> CommandResult:
    """A recorded tool call as the CommandResult the parsers read."""
    return CommandResult((str(call["program"]), *map(str, call["args"])), int(call["exit_code"]),
                         str(call["stdout"]), str(call["stderr"]), bool(call["timed_out"]), bool(call["truncated"]))


def derive(obs: Entry) -> list[Entry]:
    """The entries a ``tool_output`` observation gives (none for any other entry)."""
    if obs.kind != Kind.TOOL_OUTPUT:
        return []
    data = obs.data
    step = data.get("step")
    out = _Out(obs, str(step))
    ctx = data.get("context")
    try:
        if step == "dcgm_job_stats":
            _dcgm(out, ctx, [result(c) for c in data["calls"]])
        elif step == "amd_counters":
            _amd(out, ctx, [result(c) for c in data["calls"]])
        else:
            raise ValueError(f"unknown step {str(step)[:40]!r}")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        out.entries = []
        when = ctx.get("end") if isinstance(ctx, dict) and isinstance(ctx.get("end"), (int, float)) else obs.ts
        out.error(when, "ship", "tool_output", f"{type(exc).__name__}: {exc}")
    return out.entries


def _dcgm(out: _Out, ctx: Mapping[str, Any], calls: list[CommandResult]) -> None:
    """``dcgmi stats -x KEY`` then ``dcgmi stats -v -j KEY``: a summary per device's block, gaps where none."""
    stop, stats = calls
    start, end, key, tol = float(ctx["start"]), float(ctx["end"]), str(ctx["job_key"]), float(ctx["gap_tolerance_s"])
    devices, st = ctx["devices"], ctx.get("dcgm") or {}
    stop_err = dcgm.outcome(stop, "Successfully stopped")
    report = dcgm.stats_result(stats)
    if isinstance(report, dcgm.DcgmError):
        # `stats -x` saying the job is unknown is the stronger evidence (`-j` then only says "no data").
        err = stop_err if stop_err is not None and stop_err.cause == "not_found" else report
        if err.cause == "not_found":
            if st.get("started"):
                cause = "dcgm_host_engine_restart"  # DCGM accepted the job at prolog time and no longer knows it
            elif not ctx["prolog"]:
                cause = "prolog_missing"  # e.g. Slurm skips the prolog of a requeued run on the same node
            else:
                cause = "dcgm_watch_not_started"
        else:
            cause = _DCGM_CAUSES.get(err.cause, "dcgm_error")
        detail = err.message or st.get("error", "")
        out.error(end, "epilog", "dcgm stats", f"{cause}: {detail}")
        for d in devices:
            out.gap(start, end, cause, detail, d["key"])
        return
    by_id = {b.gpu_id: b for b in report.blocks if b.gpu_id is not None}
    for d in devices:
        dev = d["key"]
        block = by_id.get(d["dcgm_id"])
        if block is None:
            out.gap(start, end, "dcgm_device_missing", f"dcgmi stats -v -j {key}: no block for GPU ID {d['dcgm_id']}",
                    dev)
            continue
        a = max(start, block.start) if block.start else start
        b = min(end, block.end) if block.end else end
        if b < a:
            a, b = start, end
        payload = {"source": "dcgm_job_stats", "dcgm_gpu_id": block.gpu_id, "dcgm_job": key,
                   **dcgm.summary_fields(block)}
        out.add(Kind.TELEMETRY_SUMMARY, a, payload, ts_end=b, device=dev)
        if block.start is None:
            out.gap(start, end, "dcgm_no_data", "report has no Start Time", dev)
        else:
            if block.start - start > tol:
                out.gap(start, min(block.start, end), "dcgm_watch_late", "DCGM job stats began after the allocation",
                        dev)
            if block.end is not None and end - block.end > tol:
                out.gap(max(block.end, start), end, "dcgm_stopped_early", "DCGM job stats ended before the allocation",
                        dev)
        if block.measured_nothing:
            out.gap(a, b, "dcgm_no_data", "no measured value (power, energy, clocks, utilisation all missing: "
                    + ", ".join(f"{k}={v}" for k, v in sorted(block.missing.items())[:6]) + ")", dev)


def _amd(out: _Out, ctx: Mapping[str, Any], calls: list[CommandResult]) -> None:
    """The prolog's and the epilog's ``amd-smi metric`` counters, differenced per device."""
    (after_call,) = calls
    start, end, devices = float(ctx["start"]), float(ctx["end"]), ctx["devices"]
    before_call = ctx.get("before")
    before = amdsmi.counters_result(result(before_call)) if before_call else None
    after = amdsmi.counters_result(after_call)
    if isinstance(after, str):
        out.error(end, "epilog", "amd-smi counters", after)
        for d in devices:
            out.gap(start, end, "amdsmi_timeout" if after.startswith("timeout") else "amdsmi_error", after, d["key"])
        return
    for d in devices:
        if before is None or isinstance(before, str):
            out.gap(start, end, "amdsmi_no_baseline", "no prolog counter snapshot", d["key"])
            continue
        bv, bm = amdsmi.counters(before, d["index"])
        av, am = amdsmi.counters(after, d["index"])
        delta, missing = amdsmi.counter_delta(bv, av, bm, am)
        out.add(Kind.TELEMETRY_SUMMARY, ctx.get("before_ts") or start,
                {"source": "amdsmi_counters", "values": delta, "missing": missing}, ts_end=end, device=d["key"])
        if not delta:
            out.gap(start, end, "amdsmi_no_data", "no counter could be differenced", d["key"])
