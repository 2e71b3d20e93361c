"""The prolog and epilog: what they record, in which order, and what they do when something fails.

Order (DESIGN.md §2.9): the prolog writes ``allocation_started`` + ``device_bound`` to the spool *before* it
touches DCGM; the epilog gathers what it can, writes everything to the spool in one durable file, and only then
cleans DCGM's job record and group (also when that write failed: nothing would read the record again). Neither ever talks to the ledger database: shipping is ``ipledger ship``
(a systemd timer, docs/slurm.md), so a database that is down cannot slow a hook or make it fail.

Every failure becomes a value: a ``hook_error`` entry and/or an ``unknown_interval`` with its cause over
exactly the span that is not covered, plus a line on stderr/syslog. Nothing is ever recorded as zero that was
not measured. Standard library only.
"""

from __future__ import annotations

import os
import sys
import time

from .. import __version__, spool
from ..fsmodes import SPOOL_DIR, SPOOL_FILE, create_file, make_dirs
from ..kinds import Kind
from . import dropbox, records, slurm
from .records import entry_record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing, dataclasses and ledger.entries stay off the hook's import path
    from typing import Any, Mapping

    from ..config import Config

SOURCE = "hook.slurm"
DEFAULT_GAP_TOLERANCE_S = 2.0  # ctime and scontrol times have 1 s resolution; a gap this small is no evidence
FINAL_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}


# ``[hooks] error_log``: a file every log line is also appended to, for nodes where syslog is not read (or not
# there: without /dev/log Python's syslog drops messages silently). Set by run_hook once the config is read.
_error_log: str | None = None


def log(msg: str, *, loss: bool = False) -> None:
    """Failures go to stderr (slurmd's log at debug level), syslog (daemon, tag ``ipledger-hook``; LOG_ERR when
    entries were lost, else LOG_WARNING) and the ``error_log`` file when configured. Never raises."""
    line = f"ipledger-hook: {msg}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the hook
        pass
    try:
        import syslog

        syslog.openlog("ipledger-hook", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR if loss else syslog.LOG_WARNING, msg)
    except Exception:  # noqa: BLE001
        pass
    if _error_log:
        try:  # one write() of a line opened O_APPEND: concurrent hooks never interleave inside a line
            fd = os.open(_error_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                os.write(fd, f"{stamp} {os.uname().nodename} ipledger-hook[{os.getpid()}]: {msg}\n".encode())
            finally:
                os.close(fd)
        except OSError:  # the log may sit on the same full or read-only disk as the spool
            pass


class SpoolWriteFailed(OSError):
    """The spool could not take the hook's entries (unwritable, full, missing); they are lost and logged."""


class HookSettings:
    """``[hooks]`` in the site config (all optional): vendor (nvidia | amd | none), dcgm, scontrol, state_dir,
    trace, gap_tolerance_s; timeout is the config's hook_timeout_s."""

    def __init__(self, *, vendor: str, dcgm: bool, scontrol: bool, state_dir: str, trace: str | None,
                 gap_tolerance_s: float, timeout: float) -> None:
        self.vendor, self.dcgm, self.scontrol, self.state_dir = vendor, dcgm, scontrol, state_dir
        self.trace, self.gap_tolerance_s, self.timeout = trace, gap_tolerance_s, timeout

    @classmethod
    def from_config(cls, cfg: Config) -> "HookSettings":
        h = dict(cfg.extra.get("hooks", {}) or {})
        cmds = cfg.commands
        vendor = h.get("vendor") or ("nvidia" if ("nvidia-smi" in cmds or "dcgmi" in cmds)
                                     else "amd" if "amd-smi" in cmds else "none")
        return cls(vendor=vendor, dcgm=bool(h.get("dcgm", "dcgmi" in cmds)) and vendor == "nvidia",
                   scontrol=bool(h.get("scontrol", "scontrol" in cmds)),
                   state_dir=h.get("state_dir") or os.path.join(cfg.spool, "hook-state"),
                   trace=h.get("trace"), gap_tolerance_s=float(h.get("gap_tolerance_s", DEFAULT_GAP_TOLERANCE_S)),
                   timeout=float(cfg.hook_timeout_s))


class Hook:
    """One hook run: its config, settings and job, and the spool records and errors it has gathered."""

    def __init__(self, cfg: Config, settings: HookSettings, env: slurm.JobEnv) -> None:
        self.cfg, self.settings, self.env = cfg, settings, env
        self.entries: list[dict] = []  # spool records (entry_record), written by write_spool()
        self.errors: list[dict] = []

    # -- helpers -------------------------------------------------------------------------------------------------
    def keys(self, run: int, cluster: str | None) -> dict[str, Any]:
        return {"cluster": cluster, "job_id": self.env.job_id, "run": run, "node": self.env.node,
                "source": SOURCE, "source_version": __version__}

    def add(self, kind: str, ts: float, payload: Mapping[str, Any], keys: Mapping[str, Any], *,
            ts_end: float | None = None, device: str | None = None, recorded_at: float | None = None) -> None:
        self.entries.append(entry_record(kind, ts, payload, ts_end=ts_end, device=device,
                                         recorded_at=recorded_at or time.time(), **keys))

    def error(self, stage: str, message: str) -> None:
        self.errors.append({"stage": stage, "error": message[:500]})
        log(f"job {self.env.job_id}: {stage}: {message[:300]}")

    def scontrol(self) -> slurm.JobRecord | None:
        if not self.settings.scontrol:
            return None
        from .. import commands

        r = commands.run("scontrol", ["show", "job", "-d", "-o", self.env.job_id], commands=self.cfg.commands,
                         timeout=self.settings.timeout)
        if not r.ok:
            self.error("scontrol", ("timed out" if r.timed_out else (r.stderr or r.stdout).strip()) or "failed")
            return None
        return slurm.job_record(slurm.parse_scontrol_oneline(r.stdout))

    def state_path(self) -> str:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in self.env.job_id)
        return os.path.join(self.settings.state_dir, f"{safe}.json")

    def write_spool(self, hook: str) -> None:
        if not self.entries:
            return
        try:
            spool.write_records(self.cfg.spool, self.entries, prefix="hook", encode=records.spool_line)
        except OSError as exc:
            counts: dict[str, int] = {}
            for e in self.entries:
                counts[e["kind"]] = counts.get(e["kind"], 0) + 1
            lost = ", ".join(f"{k}×{n}" for k, n in counts.items())
            then = ("`ipledger reconcile` will close this run with an unknown interval (cause epilog_missing)"
                    if hook == "epilog" else
                    "the ledger will only learn of this run if its epilog can write (it then rebuilds the start)")
            log(f"job {self.env.job_id}: {hook} failed: SPOOL WRITE FAILED in {self.cfg.spool}: {type(exc).__name__}: "
                f"{exc.strerror or exc}; {len(self.entries)} entries NOT recorded ({lost}); {then}", loss=True)
            self.entries = []
            self.errors.append({"stage": "spool", "error": f"{type(exc).__name__}: {exc}"[:500]})  # for the trace
            raise SpoolWriteFailed(exc.errno, str(exc)) from exc
        self.entries = []

    # -- devices -------------------------------------------------------------------------------------------------
    def map_devices(self) -> list[dict]:
        """Slurm's GPU indices -> {index, uuid, sku, vendor, dcgm_id}; what cannot be mapped keeps uuid None."""
        idx = list(self.env.gpus)
        if not idx:
            return []
        s = self.settings
        devices = [{"index": i, "uuid": None, "sku": None, "vendor": s.vendor if s.vendor != "none" else None}
                   for i in idx]
        if s.vendor == "nvidia":
            from ..sources import dcgm, nvml

            inv: list = []
            if "nvidia-smi" in self.cfg.commands:
                got = nvml.NvidiaSmiCli(self.cfg.commands, s.timeout).inventory()
                if isinstance(got, str):
                    self.error("nvidia-smi", got)
                else:
                    inv = got
            disc: list = []
            if s.dcgm:
                got2 = dcgm.DcgmiCli(self.cfg.commands, s.timeout).discovery()
                if isinstance(got2, dcgm.DcgmError):
                    self.error("dcgmi discovery", f"{got2.cause}: {got2.message}")
                else:
                    disc = got2
            for d in devices:
                # Slurm's index is the position in gres.conf's File= list; with /dev/nvidia[0-N] that is the minor.
                g = next((g for g in inv if g.minor_number == d["index"]), None) or \
                    next((g for g in inv if g.index == d["index"]), None)
                if g is not None:
                    d["uuid"], d["sku"] = g.uuid, g.name
                dg = next((x for x in disc if d["uuid"] and x.uuid == d["uuid"]), None)
                if dg is None and not inv:
                    dg = next((x for x in disc if x.gpu_id == d["index"]), None)
                    if dg is not None:
                        d["uuid"], d["sku"] = dg.uuid, dg.name
                d["dcgm_id"] = dg.gpu_id if dg is not None else d["index"]
        elif s.vendor == "amd":
            from ..sources import amdsmi

            got3 = amdsmi.AmdSmiCli(self.cfg.commands, s.timeout).inventory()
            if isinstance(got3, str):
                self.error("amd-smi list", got3)
            else:
                for d in devices:
                    g = next((g for g in got3 if g.index == d["index"]), None)
                    if g is not None:
                        d["uuid"], d["sku"] = g.uuid, g.sku
        if s.vendor != "none":  # with no GPU tool configured, indices are all there is to record
            for d in devices:
                if not d["uuid"]:
                    self.error("devices", f"GPU index {d['index']}: no UUID found")
        return devices

    def amd_snapshot(self, devices: list[dict]) -> dict | str:
        from ..sources import amdsmi

        snap = amdsmi.AmdSmiCli(self.cfg.commands, self.settings.timeout).counters([d["index"] for d in devices])
        if isinstance(snap, str):
            return snap
        out = {}
        for d in devices:
            vals, miss = amdsmi.counters(snap, d["index"])
            out[str(d["index"])] = {"values": vals, "missing": miss}
        return out


def _load_state(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return records.loads(f.read())  # = json.load, without importing json (and re)
    except (OSError, ValueError):
        return None


def _save_state(path: str, state: dict) -> None:
    # The state names the job's devices and keys: spool modes (docs/ledger.md, "Permissions"), whatever the umask.
    if not os.path.isdir(os.path.dirname(path)):
        make_dirs(os.path.dirname(path), SPOOL_DIR)
    tmp = path + ".tmp"
    with os.fdopen(create_file(tmp, SPOOL_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as f:
        f.write(records.state_json(state))  # = json.dump(state, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def dcgm_job_key(job_id: str, run: int) -> str:
    return f"{job_id}.{run}"


def _started_entries(h: Hook, keys: dict, start: float, rec: slurm.JobRecord | None, devices: list[dict]) -> None:
    e = h.env
    h.add(Kind.ALLOCATION_STARTED, start, {
        "account": e.account or (rec.account if rec else None), "user": e.user,
        "partition": e.partition or (rec.partition if rec else None),
        "qos": e.qos or (rec.qos if rec else None), "nodes": e.nodes or (rec.nodes if rec else None),
        "gpus": len(devices), "tres": rec.tres if rec else None}, keys)
    for d in devices:
        h.add(Kind.DEVICE_BOUND, start, {"index": d["index"], "uuid": d["uuid"], "sku": d["sku"],
                                          "vendor": d["vendor"], "node": e.node}, keys, device=d["uuid"])


def prolog(h: Hook) -> None:
    now = time.time()
    rec = h.scontrol()
    run = h.env.restart_count if h.env.restart_count is not None else (rec.restarts if rec and rec.restarts else 0)
    cluster = h.cfg.cluster or h.env.cluster
    start = rec.start if rec and rec.start and rec.start <= now + 5 else now
    keys = h.keys(run, cluster)
    devices = h.map_devices()
    _started_entries(h, keys, start, rec, devices)
    h.write_spool("prolog")  # the allocation is on disk before anything else can go wrong
    dropbox.prepare(h)  # the job's user may leave progress marks there (ledger.hooks.dropbox)
    state: dict[str, Any] = {"job_id": h.env.job_id, "run": run, "cluster": cluster, "start": start,
                             "devices": devices, "node": h.env.node}
    if h.settings.dcgm and devices:
        from ..sources import dcgm

        cli = dcgm.DcgmiCli(h.cfg.commands, h.settings.timeout)
        key = dcgm_job_key(h.env.job_id, run)
        st: dict[str, Any] = {"job_key": key, "started": False}
        gid = cli.create_group(f"ipledger-{key}", [d["dcgm_id"] for d in devices])
        if isinstance(gid, dcgm.DcgmError):
            st["error"] = f"{gid.cause}: {gid.message}"
        else:
            st["group_id"] = gid
            err = cli.start_job(gid, key)
            if err is None:
                st["started"] = True
                st["started_at"] = time.time()
            else:
                st["error"] = f"{err.cause}: {err.message}"
        if not st["started"]:
            h.error("dcgm start", st.get("error", "failed"))
        state["dcgm"] = st
    if h.settings.vendor == "amd" and devices:
        snap = h.amd_snapshot(devices)
        if isinstance(snap, str):
            h.error("amd-smi counters", snap)
        else:
            state["amd_before"] = snap
            state["amd_before_ts"] = time.time()
    _save_state(h.state_path(), state)
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "prolog", **err}, keys)
    h.write_spool("prolog")


_DCGM_CAUSES = {"no_data": "dcgm_no_data", "timeout": "dcgm_timeout", "connection": "dcgm_unreachable",
                "unparsed": "dcgm_unparsed"}


def _gap(h: Hook, keys: dict, a: float, b: float, cause: str, detail: str, device: str | None,
         scope: str = "device") -> None:
    if b - a > 0:
        h.add(Kind.UNKNOWN_INTERVAL, a, {"cause": cause, "scope": scope, "detail": detail[:300]}, keys,
              ts_end=b, device=device)


def _dcgm_epilog(h: Hook, keys: dict, state: dict | None, devices: list[dict], start: float, end: float) -> dict | None:
    from ..sources import dcgm

    cli = dcgm.DcgmiCli(h.cfg.commands, h.settings.timeout)
    st = (state or {}).get("dcgm") or {}
    key = st.get("job_key") or dcgm_job_key(h.env.job_id, keys["run"])
    stop_err = cli.stop_job(key)
    report = cli.job_stats(key)
    tol = h.settings.gap_tolerance_s
    if isinstance(report, dcgm.DcgmError):
        # `stats -x` saying the job is unknown is the stronger evidence (`-j` then only says "no data").
        err = stop_err if stop_err is not None and stop_err.cause == "not_found" else report
        if err.cause == "not_found":
            if st.get("started"):
                cause = "dcgm_host_engine_restart"  # DCGM accepted the job at prolog time and no longer knows it
            elif state is None:
                cause = "prolog_missing"  # e.g. Slurm skips the prolog of a requeued run on the same node
            else:
                cause = "dcgm_watch_not_started"
        else:
            cause = _DCGM_CAUSES.get(err.cause, "dcgm_error")
        detail = err.message or st.get("error", "")
        h.error("dcgm stats", f"{cause}: {detail}")
        for d in devices:
            _gap(h, keys, start, end, cause, detail, d["uuid"])
        return st
    by_id = {b.gpu_id: b for b in report.blocks if b.gpu_id is not None}
    for d in devices:
        block = by_id.get(d.get("dcgm_id", d["index"]))
        if block is None:
            _gap(h, keys, start, end, "dcgm_device_missing",
                 f"dcgmi stats -v -j {key}: no block for GPU ID {d.get('dcgm_id')}", d["uuid"])
            continue
        a = max(start, block.start) if block.start else start
        b = min(end, block.end) if block.end else end
        if b < a:
            a, b = start, end
        payload = {"source": "dcgm_job_stats", "dcgm_gpu_id": block.gpu_id, "dcgm_job": key,
                   **dcgm.summary_fields(block)}
        h.add(Kind.TELEMETRY_SUMMARY, a, payload, keys, ts_end=b, device=d["uuid"])
        if block.start is None:
            _gap(h, keys, start, end, "dcgm_no_data", "report has no Start Time", d["uuid"])
        else:
            if block.start - start > tol:
                _gap(h, keys, start, min(block.start, end), "dcgm_watch_late",
                     "DCGM job stats began after the allocation", d["uuid"])
            if block.end is not None and end - block.end > tol:
                _gap(h, keys, max(block.end, start), end, "dcgm_stopped_early",
                     "DCGM job stats ended before the allocation", d["uuid"])
        if block.measured_nothing:
            _gap(h, keys, a, b, "dcgm_no_data",
                 "no measured value (power, energy, clocks, utilisation all missing: "
                 + ", ".join(f"{k}={v}" for k, v in sorted(block.missing.items())[:6]) + ")", d["uuid"])
    return st


def _amd_epilog(h: Hook, keys: dict, state: dict | None, devices: list[dict], start: float, end: float) -> None:
    from ..sources import amdsmi

    before = (state or {}).get("amd_before")
    after = h.amd_snapshot(devices)
    if isinstance(after, str):
        h.error("amd-smi counters", after)
        for d in devices:
            _gap(h, keys, start, end, "amdsmi_timeout" if after.startswith("timeout") else "amdsmi_error", after,
                 d["uuid"])
        return
    for d in devices:
        b = (before or {}).get(str(d["index"]))
        if b is None:
            _gap(h, keys, start, end, "amdsmi_no_baseline", "no prolog counter snapshot", d["uuid"])
            continue
        a = after[str(d["index"])]
        delta, missing = amdsmi.counter_delta(b["values"], a["values"], b["missing"], a["missing"])
        h.add(Kind.TELEMETRY_SUMMARY, (state or {}).get("amd_before_ts", start),
              {"source": "amdsmi_counters", "values": delta, "missing": missing}, keys, ts_end=end,
              device=d["uuid"])
        if not delta:
            _gap(h, keys, start, end, "amdsmi_no_data", "no counter could be differenced", d["uuid"])


def _suspensions(h: Hook, keys: dict, rec: slurm.JobRecord, start: float) -> None:
    total = rec.suspended_total()
    resumed = rec.suspend_time
    if total < 1 or resumed is None:
        return
    began = start + (rec.secs_pre_suspend or 0.0)
    exact = abs((resumed - began) - total) <= 1.0
    if not exact:  # several suspend/resume cycles: Slurm keeps only the last resume and the total
        began = resumed - total
    h.add(Kind.ALLOCATION_SUSPENDED, began, {"seconds": total, "exact": exact, "source": "scontrol"}, keys,
          ts_end=resumed)
    h.add(Kind.ALLOCATION_RESUMED, resumed, {"source": "scontrol"}, keys)


def epilog(h: Hook) -> None:
    now = time.time()
    state = _load_state(h.state_path())
    rec = h.scontrol()
    if state is not None:
        run = int(state["run"])  # the epilog of a requeued run already sees the next restart count
    else:
        run = h.env.restart_count if h.env.restart_count is not None else ((rec.restarts or 0) if rec else 0)
        h.error("state", "no prolog state for this job on this node (prolog did not run, or its state was lost)")
    cluster = (state or {}).get("cluster") or h.cfg.cluster or h.env.cluster
    keys = h.keys(run, cluster)
    end = rec.end if rec and rec.end and rec.end <= now + 5 else now
    start = (state or {}).get("start") or (rec.start if rec and rec.start and rec.start <= end else None)
    devices = (state or {}).get("devices")
    if devices is None:
        devices = h.map_devices()
    if state is None and start is not None:
        _started_entries(h, keys, start, rec, devices)
    if start is None:
        start = end
        _gap(h, keys, end, end, "allocation_start_unknown", "", None, scope="run")
    if h.settings.dcgm and devices:
        dstate = _dcgm_epilog(h, keys, state, devices, start, end)
    else:
        dstate = None
    if h.settings.vendor == "amd" and devices:
        _amd_epilog(h, keys, state, devices, start, end)
    if rec is not None:
        _suspensions(h, keys, rec, start)
    # Slurm already shows the next restart count in a requeued run's epilog (scontrol and the environment).
    next_run = max([r for r in (rec.restarts if rec else None, h.env.restart_count if state else None)
                    if r is not None], default=run)
    if next_run > run:
        status, basis = "REQUEUED", "restart_count"
        h.add(Kind.ALLOCATION_REQUEUED, end, {"reason": "requeued", "next_run": next_run}, keys)
    elif rec is not None and rec.state in FINAL_STATES:
        status, basis = rec.state, "scontrol.JobState"  # type: ignore[assignment]
    else:
        # JobState is still COMPLETING here; the exit status decides. It can lag: for a job cancelled moments
        # ago slurmctld may not have the batch script's exit yet (ExitCode=0:0), so say what the state rests on.
        code = rec.exit_code if rec and rec.exit_code is not None else h.env.exit_code
        sig = rec.exit_signal if rec and rec.exit_signal is not None else h.env.exit_signal
        status = "SIGNALED" if sig else ("FAILED" if code else "COMPLETED")
        basis = "scontrol.ExitCode" if rec and rec.exit_code is not None else "environment"
    exit_code = rec.exit_code if rec and rec.exit_code is not None else h.env.exit_code
    signal = rec.exit_signal if rec and rec.exit_signal is not None else h.env.exit_signal
    h.add(Kind.ALLOCATION_ENDED, end, {"exit_code": exit_code, "signal": signal, "state": status,
                                       "state_basis": basis}, keys)
    dropbox.collect(h, keys, start, end)  # the run's progress marks from its drop place
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "epilog", **err}, keys)
    try:
        h.write_spool("epilog")  # durable before any clean-up
    finally:
        # Also after a failed write: nothing reads this DCGM record again, and a group left behind counts
        # against DCGM's 64, so a full spool must not go on to cost later jobs their telemetry.
        if dstate and dstate.get("job_key"):
            from ..sources import dcgm

            cli = dcgm.DcgmiCli(h.cfg.commands, h.settings.timeout)
            cli.remove_job(dstate["job_key"])
            if dstate.get("group_id") is not None:
                cli.delete_group(int(dstate["group_id"]))
        try:
            os.unlink(h.state_path())
        except OSError:
            pass


def run_hook(kind: str, environ: Mapping[str, str], config_path: str | None, snapshot: str | None = None) -> int:
    """Run one hook; always returns 0 (a failing epilog drains the node), logging what went wrong.

    ``snapshot``: where the parsed site config may be cached (ledger.config.load_values), or None.
    """
    global _error_log
    _error_log = None  # until this run's config says otherwise
    t0 = time.time()
    ok = True
    h = None
    try:
        from .. import config as config_mod

        if kind not in ("prolog", "epilog"):
            log(f"unknown hook kind {kind!r} (expected prolog or epilog)")
            return 0
        env = slurm.job_env(environ)
        if env is None:
            log(f"{kind}: no SLURM_JOB_ID in the environment; nothing recorded")
            return 0
        cfg = config_mod.Config(**config_mod.load_values(config_path, environ, snapshot=snapshot))
        _error_log = (cfg.extra.get("hooks") or {}).get("error_log") or None
        h = Hook(cfg=cfg, settings=HookSettings.from_config(cfg), env=env)
        (prolog if kind == "prolog" else epilog)(h)
    except SpoolWriteFailed:
        ok = False  # logged, with what was lost, where it happened
    except BaseException as exc:  # noqa: BLE001 - the hook must exit 0 whatever happened
        ok = False
        log(f"{kind} failed: {type(exc).__name__}: {exc}")
        if h is not None and h.entries:
            try:
                h.write_spool(kind)
            except SpoolWriteFailed:
                pass  # logged, with what was lost
            except BaseException as exc2:  # noqa: BLE001
                log(f"{kind}: spool write failed: {exc2}", loss=True)
    finally:
        if h is not None and h.settings.trace:
            try:
                import json

                with open(h.settings.trace, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"hook": kind, "job_id": h.env.job_id, "ok": ok, "errors": h.errors,
                                        "elapsed_s": round(time.time() - t0, 4), "pid": os.getpid()}) + "\n")
            except OSError:
                pass
    return 0
