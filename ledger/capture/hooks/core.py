"""The prolog and epilog: what they record, in which order, and what they do when something fails.

Order (docs/slurm.md): the prolog writes ``allocation_started`` + ``device_bound`` to the spool *before* it
touches DCGM; the epilog gathers what it can, writes everything to the spool in one durable file, and only then
cleans DCGM's job record and group (also when that write failed: nothing would read the record again), and only
after that reads the job user's drop place, whose marks and clean-up errors go in a second spool file (nothing a
user leaves there can cost a record). Neither ever talks to the ledger database: shipping is ``ipledger ship``
(a systemd timer, docs/slurm.md), so a database that is down cannot slow a hook or make it fail.

Neither ever runs a Slurm command (Slurm's Prolog and Epilog Guide: they "should not call Slurm commands"):
the job is what Slurm hands the hook in its environment, the devices what the local GPU tools say. What the
environment lacks (QOS, TRES, suspensions, the final state) comes from the accounting database at ship time
(:mod:`ledger.ingest.sacct`), and the job-level start and end from the controller's hooks
(:mod:`ledger.capture.hooks.controller`).

Bounded whatever the node does: one deadline (``hook_timeout_s``) for all the tools a hook runs, each tool
killed with its whole process group at the deadline or once it has written ``MAX_TOOL_OUTPUT`` bytes, at most
:data:`ledger.capture.hooks.slurm.MAX_GPUS` devices, environment bytes that are not UTF-8 kept as escapes, log lines
escaped, the hook state opened relative to its directory and never through a symlink.

Every failure becomes a value: a ``hook_error`` entry and/or an ``unknown_interval`` with its cause over
exactly the span that is not covered, plus a line on stderr/syslog. Nothing is ever recorded as zero that was
not measured. Standard library only.
"""

from __future__ import annotations

import os
import sys
import time

from ... import __version__
from .. import spool
from ...base.fsmodes import SPOOL_DIR, SPOOL_FILE, make_dirs
from ...chain.kinds import Kind
from ...chain.canonical import loads
from ...base.frozen import Frozen
from . import dropbox, slurm
from .records import entry_record, escape_text, spool_line

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing, dataclasses and ledger.chain.entries stay off the hook's import path
    from typing import Any, Callable, Mapping

    from ...base.config import Config

SOURCE = "hook.slurm"
DEFAULT_GAP_TOLERANCE_S = 2.0  # DCGM's job times have 1 s resolution; a gap this small is no evidence
DEFAULT_TIMEOUT_S = 5.0       # used when hook_timeout_s is not a finite number of seconds in (0, MAX_TIMEOUT_S]
MAX_TIMEOUT_S = 300.0         # slurmd's own PrologEpilogTimeout default is 65 535 s; a hook must end long before
MIN_CALL_S = 0.05             # a call that starts after the deadline still gets this long (to fail quickly)
MAX_TOOL_OUTPUT = 4 << 20     # bytes one tool may write in a hook; `nvidia-smi -q -x` on 8 GPUs is ~0.3 MB
# Characters of a tool's answer kept in its tool_output entry (the intake takes payloads up to 1 MiB); DCGM's
# verbose job report is ≈ 4 kB per GPU. A longer answer is kept cut, and says so (``truncated``).
MAX_RECORDED_STDOUT = 192 << 10
MAX_RECORDED_STDERR = 4 << 10
FINAL_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}  # reconcile's test of a job record (off the hook path)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# ``[hooks] error_log``: a file every log line is also appended to, for nodes where syslog is not read (or not
# there: without /dev/log Python's syslog drops messages silently). Set by run_hook once the config is read.
_error_log: str | None = None


def escape_line(text: str) -> str:
    """One log line: control characters (newlines included), DEL and undecodable bytes become ``\\xNN``, so
    a job id or a tool's output can never start a line of its own in a log."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        o = ord(c)
        if c.isprintable():
            out.append(c)
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, as Python keeps it (surrogateescape)
            out.append(f"\\x{o - 0xDC00:02x}")
        else:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
    return "".join(out)


def log(msg: str, *, loss: bool = False) -> None:
    """Failures go to stderr (slurmd's log at debug level), syslog (daemon, tag ``ipledger-hook``; LOG_ERR when
    entries were lost, else LOG_WARNING) and the ``error_log`` file when configured. Never raises."""
    msg = escape_line(msg)
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
            fd = os.open(_error_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o640)
            try:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                os.write(fd, f"{stamp} {os.uname().nodename} ipledger-hook[{os.getpid()}]: {msg}\n".encode())
            finally:
                os.close(fd)
        except OSError:  # the log may sit on the same full or read-only disk as the spool
            pass


class SpoolWriteFailed(OSError):
    """The spool could not take the hook's entries (unwritable, full, missing); they are lost and logged."""


class HookSettings(Frozen):
    """``[hooks]`` in the site config (all optional): vendor (nvidia | amd | none), dcgm, state_dir, trace,
    gap_tolerance_s, error_log; ``timeout`` is the config's hook_timeout_s, the whole hook's budget for tools
    (``timeout_note`` says why a configured value was not used)."""

    __slots__ = ("vendor", "dcgm", "state_dir", "trace", "gap_tolerance_s", "timeout", "timeout_note")

    @classmethod
    def from_config(cls, cfg: Config) -> "HookSettings":
        h = dict(cfg.extra.get("hooks", {}) or {})
        cmds = cfg.commands
        vendor = h.get("vendor") or ("nvidia" if ("nvidia-smi" in cmds or "dcgmi" in cmds)
                                     else "amd" if "amd-smi" in cmds else "none")
        timeout, note = checked_timeout(cfg.hook_timeout_s)
        return cls(vendor=vendor, dcgm=bool(h.get("dcgm", "dcgmi" in cmds)) and vendor == "nvidia",
                   state_dir=h.get("state_dir") or os.path.join(cfg.spool, "hook-state"),
                   trace=h.get("trace"), gap_tolerance_s=float(h.get("gap_tolerance_s", DEFAULT_GAP_TOLERANCE_S)),
                   timeout=timeout, timeout_note=note)


def checked_timeout(value: object) -> tuple[float, str | None]:
    """hook_timeout_s as a usable budget: ``inf``, ``nan``, ≤ 0 or above MAX_TIMEOUT_S would make the hook
    wait for ever or not at all, so DEFAULT_TIMEOUT_S is used instead, with the reason."""
    try:
        t = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        t = float("nan")
    if t == t and 0 < t <= MAX_TIMEOUT_S:  # t == t: not NaN; the bounds exclude ±inf
        return t, None
    return DEFAULT_TIMEOUT_S, (f"hook_timeout_s = {value!r} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}]; "
                               f"used {DEFAULT_TIMEOUT_S:g}")


class Hook:
    """One hook run: its config, settings and job, the deadline its tools share, and the spool records and
    errors it has gathered."""

    def __init__(self, cfg: Config, settings: HookSettings, env: slurm.JobEnv, kind: str = "") -> None:
        self.cfg, self.settings, self.env, self.kind = cfg, settings, env, kind
        self.entries: list[dict] = []  # spool records (entry_record), written by write_spool()
        self.errors: list[dict] = []
        self.deadline = time.monotonic() + settings.timeout
        if settings.timeout_note:
            self.error("config", settings.timeout_note)
        for note in env.notes:
            self.error("environment", note)

    # -- helpers -------------------------------------------------------------------------------------------------
    def keys(self, run: int, cluster: str | None) -> dict[str, Any]:
        return {"cluster": cluster, "job_id": self.env.job_id, "run": run, "node": self.env.node,
                "source": SOURCE, "source_version": __version__}

    def add(self, kind: str, ts: float, payload: Mapping[str, Any], keys: Mapping[str, Any], *,
            ts_end: float | None = None, device: str | None = None, recorded_at: float | None = None) -> None:
        self.entries.append(entry_record(kind, ts, payload, ts_end=ts_end, device=device,
                                         recorded_at=recorded_at or time.time(), **keys))

    def error(self, stage: str, message: str, **fields: str) -> None:
        """A ``hook_error`` for the spool (``fields``: e.g. ``cause``, ``controlled_by``) and a log line."""
        try:
            message.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from something a user named: escaped, never a crash
            message = escape_text(message)
        self.errors.append({"stage": stage, "error": message[:500], **fields})
        log(f"job {self.env.job_id}: {stage}: {message[:300]}")

    def left(self) -> float:
        """Seconds the next tool may run: what is left of the hook's one deadline (a little once it passed,
        so a call still fails as a value rather than not being made)."""
        return max(MIN_CALL_S, self.deadline - time.monotonic())

    def run_tool(self, program: str, args: list[str]):  # noqa: ANN201 - a ledger.base.commands.CommandResult
        """What the vendor CLI classes call: ledger.base.commands.run under the hook's deadline and output cap."""
        from ...base import commands

        return commands.run(program, args, commands=self.cfg.commands, timeout=self.left(),
                            max_output=MAX_TOOL_OUTPUT)

    def run_tools(self, calls: list[tuple[str, list[str]]]) -> list:
        """Several tool calls that depend neither on each other's answers nor on their order, started together
        (ledger.base.commands.run_all) under what is left of the hook's deadline, each with its own output cap."""
        from ...base import commands

        return commands.run_all(calls, commands=self.cfg.commands, timeout=self.left(), max_output=MAX_TOOL_OUTPUT)

    def tool(self, cls):  # noqa: ANN001, ANN201 - DcgmiCli / AmdSmiCli
        return cls(self.cfg.commands, self.settings.timeout, run=self._bounded_run)

    def _bounded_run(self, program: str, args: list, **_kw):  # noqa: ANN003, ANN201
        return self.run_tool(program, list(args))

    def observe(self, program: str, args: list[str]) -> dict[str, Any]:
        """Run a vendor tool and keep what it said, unread: the raw answer (bounded), its exit status and how
        long it took. What it means is derived at ship time (ledger.capture.sources.observed)."""
        t0 = time.monotonic()
        r = self.run_tool(program, args)
        elapsed = time.monotonic() - t0
        if not r.ok:
            log(f"job {self.env.job_id}: {program} {' '.join(args)}: "
                f"{'timed out' if r.timed_out else f'exit {r.returncode}'}")
        return {"program": program, "args": list(args), "exit_code": r.returncode, "timed_out": r.timed_out,
                "truncated": r.truncated or len(r.stdout) > MAX_RECORDED_STDOUT,
                "stdout": r.stdout[:MAX_RECORDED_STDOUT], "stderr": r.stderr[:MAX_RECORDED_STDERR],
                "elapsed_s": round(elapsed, 6)}

    def write_spool(self, hook: str) -> None:
        if not self.entries:
            return
        try:
            spool.write_records(self.cfg.spool, self.entries, prefix="hook", encode=spool_line)
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
        """Slurm's GPU indices -> {index, uuid, sku, vendor, dcgm_id, key}; ``key`` is the entries' device: the
        UUID, or ``index:NODE:I`` when a GPU tool was configured and could not name it (the allocation still
        holds the GPU: it is bound by index, and the epilog marks its time unknown)."""
        idx = list(self.env.gpus)
        if not idx:
            return []
        s = self.settings
        devices = [{"index": i, "uuid": None, "sku": None, "vendor": s.vendor if s.vendor != "none" else None}
                   for i in idx]
        if s.vendor in ("nvidia", "amd"):
            from . import vendor  # here: a node without GPU tools never loads it
        if s.vendor == "nvidia":
            # The inventory and DCGM's discovery are independent reads: started together, their waits overlap.
            asks = {}
            if "nvidia-smi" in self.cfg.commands:
                asks["nvidia-smi"] = list(vendor.INVENTORY_ARGS)
            if s.dcgm:
                asks["dcgmi"] = list(vendor.DISCOVERY_ARGS)
            said = dict(zip(asks, self.run_tools(list(asks.items())))) if asks else {}
            inv: list = []
            if "nvidia-smi" in said:
                got = vendor.inventory_answer(said["nvidia-smi"])
                if isinstance(got, str):
                    self.error("nvidia-smi", got)
                else:
                    inv = got
            disc: list = []
            if "dcgmi" in said:
                got2 = vendor.discovery_answer(said["dcgmi"])
                if isinstance(got2, vendor.DcgmError):
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
            got3 = self.tool(vendor.AmdSmiCli).inventory()
            if isinstance(got3, str):
                self.error("amd-smi list", got3)
            else:
                for d in devices:
                    g = next((g for g in got3 if g.index == d["index"]), None)
                    if g is not None:
                        d["uuid"], d["sku"] = g.uuid, g.sku
        unnamed = []
        for d in devices:
            d["key"] = d["uuid"]
            if not d["uuid"] and s.vendor != "none":  # with no GPU tool configured, indices are all there is
                d["key"] = index_key(self.env.node, d["index"])
                unnamed.append(str(d["index"]))
        if unnamed:
            self.error("devices", f"GPU index {', '.join(unnamed)}: no UUID found; bound by index, time unknown")
        return devices


def index_key(node: str | None, index: int) -> str:
    """The device key of a GPU whose UUID could not be read: unique on its node, never mistaken for a UUID."""
    return f"index:{node or '?'}:{index}"


# -- the hook state: one small file per job, between the prolog and the epilog ---------------------------------
# Opened only relative to the state directory's descriptor, O_NOFOLLOW, never through a symlink: the hooks run
# as root, and whoever can write the spool could otherwise plant `hook-state/<job>.json.tmp` -> /etc/... .


def state_name(job_id: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in job_id)[:200] + ".json"


def _state_dir_fd(path: str, create: bool) -> int:
    if create and not os.path.lexists(path):
        make_dirs(path, SPOOL_DIR)
    return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)


def load_state(state_dir: str, name: str) -> dict | None:
    try:
        dfd = _state_dir_fd(state_dir, create=False)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            # A regular file of sane size, written by this hook's own user: whoever else can write the spool
            # could otherwise hand the epilog a run number, a start and devices of their choosing.
            if (st.st_mode & 0o170000) != 0o100000 or st.st_size > 1 << 20 or st.st_uid != os.geteuid():
                return None
            data = os.read(fd, st.st_size + 1)
        finally:
            os.close(fd)
        state = loads(data.decode("utf-8"))
        return state if isinstance(state, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(dfd)


def save_state(state_dir: str, name: str, state: dict, *, fsync: bool = True) -> None:
    """Write the hook state ``name`` (replaced whole by a rename). ``fsync=False`` where a crash of this machine
    also ends everything that would read the state (the node prolog's: see :func:`prolog`)."""
    # The state names the job's devices and keys: spool modes (docs/ledger.md, "Permissions"), whatever the umask.
    dfd = _state_dir_fd(state_dir, create=True)
    try:
        tmp = name + ".tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
        try:
            fd = os.open(tmp, flags, SPOOL_FILE, dir_fd=dfd)
        except FileExistsError:  # a stale temp file, or something planted there: unlink the name (never its target)
            os.unlink(tmp, dir_fd=dfd)
            fd = os.open(tmp, flags, SPOOL_FILE, dir_fd=dfd)
        try:
            os.fchmod(fd, SPOOL_FILE)
            data = memoryview(spool_line(state).encode("utf-8"))
            while data:
                data = data[os.write(fd, data):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def drop_state(state_dir: str, name: str) -> None:
    try:
        dfd = _state_dir_fd(state_dir, create=False)
    except OSError:
        return
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def dcgm_job_key(job_id: str, run: int) -> str:
    return f"{job_id}.{run}"


def _started_entries(h: Hook, keys: dict, start: float, devices: list[dict]) -> None:
    e = h.env
    # Only what Slurm handed the hook; QOS, TRES and time limits come from accounting at ship time (absent here,
    # not null, so that the job-level record fills them in).
    payload = {"account": e.account, "user": e.user, "partition": e.partition, "nodes": e.nodes,
               "gpus": len(devices)}
    if e.qos:
        payload["qos"] = e.qos
    if e.constraints:
        payload["constraints"] = e.constraints
    h.add(Kind.ALLOCATION_STARTED, start, payload, keys)
    for d in devices:
        h.add(Kind.DEVICE_BOUND, start, {"index": d["index"], "uuid": d["uuid"], "sku": d["sku"],
                                          "vendor": d["vendor"], "node": e.node}, keys, device=d.get("key", d["uuid"]))


def prolog(h: Hook) -> None:
    now = time.time()
    run = h.env.restart_count or 0
    cluster = h.cfg.cluster or h.env.cluster
    keys = h.keys(run, cluster)
    devices = h.map_devices()
    _started_entries(h, keys, now, devices)
    h.write_spool("prolog")  # the allocation is on disk before anything else can go wrong
    dropbox.prepare(h)  # the job's user may leave progress marks there (ledger.capture.hooks.dropbox)
    state: dict[str, Any] = {"job_id": h.env.job_id, "run": run, "cluster": cluster, "start": now,
                             "devices": devices, "node": h.env.node}
    if h.settings.dcgm and devices:
        from . import vendor

        cli = h.tool(vendor.DcgmiCli)
        key = dcgm_job_key(h.env.job_id, run)
        st: dict[str, Any] = {"job_key": key, "started": False}
        gid = cli.create_group(f"ipledger-{key}", [d["dcgm_id"] for d in devices])
        if isinstance(gid, vendor.DcgmError):
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
    if h.settings.vendor == "amd" and devices:  # the counters' baseline, kept raw for the epilog to record
        from . import vendor

        call = h.observe("amd-smi", vendor.amd_counter_args([d["index"] for d in devices]))
        state["amd_before"], state["amd_before_ts"] = call, time.time()
        if call["exit_code"] or call["timed_out"]:
            h.error("amd-smi counters", ("timeout" if call["timed_out"] else "error") + ": "
                    + (call["stderr"] or call["stdout"]).strip()[:200])
    try:
        # Not fsynced (one of the prolog's three waits on the disk, ≈ a third of its own cost; bench/hook.py):
        # the state is read only by this run's epilog on this node, and a crash of the node ends the run with it
        # (no epilog runs; `ipledger reconcile` closes the run as epilog_missing). A state a crash left torn or
        # empty reads as no state, the epilog's "no prolog state" path. The allocation itself is already
        # durable in the spool (write_spool above). The controller's state is fsynced: its jobs outlive a crash
        # of the controller's host.
        save_state(h.settings.state_dir, state_name(h.env.job_id), state, fsync=False)
    except OSError as exc:  # the epilog then records the run from the environment, with prolog_missing
        h.error("state", f"hook state not saved in {h.settings.state_dir}: {type(exc).__name__}: {exc}")
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "prolog", **err}, keys)
    h.write_spool("prolog")


KINDS = ("prolog", "epilog", "prolog_slurmctld", "epilog_slurmctld")


def _gap(h: Hook, keys: dict, a: float, b: float, cause: str, detail: str, device: str | None,
         scope: str = "device") -> None:
    if b - a > 0:
        h.add(Kind.UNKNOWN_INTERVAL, a, {"cause": cause, "scope": scope, "detail": detail[:300]}, keys,
              ts_end=b, device=device)


def _dev(d: dict) -> str | None:
    """A device's key in entries (state written before keys existed has only the UUID)."""
    return d.get("key", d.get("uuid"))


def _devices_seen(devices: list[dict]) -> list[dict]:
    return [{"index": d["index"], "dcgm_id": d.get("dcgm_id", d["index"]), "key": _dev(d)} for d in devices]


def _dcgm_epilog(h: Hook, keys: dict, state: dict | None, devices: list[dict], start: float, end: float) -> dict:
    """Stop DCGM's job record and read its report, raw: a ``tool_output`` entry with what the run's
    summaries and unknown intervals are derived from at ship time."""
    st = (state or {}).get("dcgm") or {}
    key = st.get("job_key") or dcgm_job_key(h.env.job_id, keys["run"])
    calls = [h.observe("dcgmi", ["stats", "-x", key]), h.observe("dcgmi", ["stats", "-v", "-j", key])]
    context = {"job_key": key, "prolog": state is not None, "dcgm": st, "start": start, "end": end,
               "gap_tolerance_s": h.settings.gap_tolerance_s, "devices": _devices_seen(devices)}
    h.add(Kind.TOOL_OUTPUT, start, {"step": "dcgm_job_stats", "calls": calls, "context": context}, keys, ts_end=end)
    return st


def _amd_epilog(h: Hook, keys: dict, state: dict | None, devices: list[dict], start: float, end: float) -> None:
    """The counters again, raw, beside the prolog's: their difference is derived at ship time."""
    from . import vendor

    call = h.observe("amd-smi", vendor.amd_counter_args([d["index"] for d in devices]))
    context = {"start": start, "end": end, "devices": _devices_seen(devices),
               "before": (state or {}).get("amd_before"), "before_ts": (state or {}).get("amd_before_ts")}
    h.add(Kind.TOOL_OUTPUT, start, {"step": "amd_counters", "calls": [call], "context": context}, keys, ts_end=end)


def end_state(env: slurm.JobEnv, run: int, has_state: bool) -> tuple[str, str, int | None]:
    """(state, basis, next run) as the node's environment shows them. Slurm shows the next restart count in a
    requeued run's epilog already; otherwise the exit status decides. The final word (CANCELLED, TIMEOUT,
    OUT_OF_MEMORY, ...) is the accounting database's, recorded at ship time with source ``sacct``."""
    nxt = env.restart_count if has_state else None
    if nxt is not None and nxt > run:
        return "REQUEUED", "restart_count", nxt
    if env.exit_code is None and env.exit_signal is None:
        return "UNKNOWN", "environment", None
    state = "SIGNALED" if env.exit_signal else ("FAILED" if env.exit_code else "COMPLETED")
    return state, "environment", None


def record_end(h: Hook, keys: dict, end: float, run: int, has_state: bool, **extra: Any) -> None:
    """``allocation_requeued`` (when Slurm already counts the next run) and ``allocation_ended`` as the
    environment shows the end; ``extra`` joins the end's payload."""
    status, basis, next_run = end_state(h.env, run, has_state)
    if next_run is not None:
        h.add(Kind.ALLOCATION_REQUEUED, end, {"reason": "requeued", "next_run": next_run}, keys)
    ended: dict[str, Any] = {"exit_code": h.env.exit_code, "signal": h.env.exit_signal, "state": status,
                             "state_basis": basis, **extra}
    if h.env.derived_exit_code is not None:
        ended["derived_exit_code"] = h.env.derived_exit_code
    h.add(Kind.ALLOCATION_ENDED, end, ended, keys)


def epilog(h: Hook) -> None:
    now = time.time()
    name = state_name(h.env.job_id)
    state = load_state(h.settings.state_dir, name)
    if state is not None and isinstance(state.get("run"), int):
        run = state["run"]  # the epilog of a requeued run already sees the next restart count
    else:
        state = None
        run = h.env.restart_count or 0
        h.error("state", "no prolog state for this job on this node (prolog did not run, or its state was lost)")
    cluster = state.get("cluster") if state else None
    cluster = cluster or h.cfg.cluster or h.env.cluster
    keys = h.keys(run, cluster)
    end = now
    start = state.get("start") if state else None
    devices = state.get("devices") if state else None
    if not isinstance(devices, list):
        devices = h.map_devices()
    if state is None:
        # The start is the controller's (PrologSlurmctld) or the accounting database's; this node only knows
        # what it held, and that nothing was measured on it before now.
        for d in devices:
            h.add(Kind.DEVICE_BOUND, end, {"index": d["index"], "uuid": d["uuid"], "sku": d["sku"],
                                            "vendor": d["vendor"], "node": h.env.node}, keys, device=_dev(d))
    if not isinstance(start, (int, float)):
        start = end
    for d in devices:
        if d.get("uuid") is None and _dev(d):
            _gap(h, keys, start, end, "device_uuid_unknown",
                 f"GPU index {d['index']}: its UUID could not be read at prolog time; its time is unknown", _dev(d))
    if h.settings.dcgm and devices:
        dstate = _dcgm_epilog(h, keys, state, devices, start, end)
    else:
        dstate = None
    if h.settings.vendor == "amd" and devices:
        _amd_epilog(h, keys, state, devices, start, end)
    record_end(h, keys, end, run, state is not None)
    for err in h.errors:
        h.add(Kind.HOOK_ERROR, now, {"hook": "epilog", **err}, keys)
    reported = len(h.errors)
    written = False
    try:
        # The run's own records first, durable before anything the job's user controls is read: a drop place
        # that is full, huge or hostile can cost the run its marks, never a record (ledger.capture.hooks.dropbox).
        h.write_spool("epilog")
        written = True
    finally:
        # Also after a failed write: nothing reads this DCGM record again, and a group left behind counts
        # against DCGM's 64, so a full spool must not go on to cost later jobs their telemetry.
        try:
            _release_dcgm(h, dstate)
        finally:
            drop_state(h.settings.state_dir, name)
            _drop_place(h, keys, start, end, now, reported, written)


def _release_dcgm(h: Hook, dstate: dict | None) -> None:
    """DCGM's job record and the job's group removed (their answers unread: nothing is recorded of them). Both
    run at once: the report was read before the spool write, and neither removal needs the other's."""
    if not (dstate and dstate.get("job_key")):
        return
    from ...base.commands import CommandRefused

    calls = [("dcgmi", ["stats", "-r", dstate["job_key"]])]
    if isinstance(dstate.get("group_id"), int):
        calls.append(("dcgmi", ["group", "-d", str(dstate["group_id"])]))
    try:
        h.run_tools(calls)
    except CommandRefused:
        # a job key the allowlist refuses (a state file damaged or edited): the group is still removed, as
        # it was when the two ran in turn, and the refusal goes on to be reported
        if len(calls) > 1:
            h.run_tools(calls[1:])
        raise


def _drop_place(h: Hook, keys: dict, start: float, end: float, now: float, reported: int, write: bool) -> None:
    """After the run's records: its marks and the drop place's removal (within what is left of the deadline,
    at least dropbox.MIN_CLEAN_S), in a second spool file with the hook errors raised since the first — not
    when the first write failed (marks and errors without the run's end would only be half a record; the
    errors are logged all the same)."""
    try:
        dropbox.collect(h, keys, start, end, max(h.deadline, time.monotonic() + dropbox.MIN_CLEAN_S))
    except Exception as exc:  # noqa: BLE001 - whatever the drop place did, the errors still reach the spool
        h.error("marks", f"drop place not collected: {type(exc).__name__}: {exc}")
    if not write:
        h.entries = []
        return
    for err in h.errors[reported:]:
        h.add(Kind.HOOK_ERROR, now, {"hook": "epilog", **err}, keys)
    h.write_spool("epilog")


def run_hook(kind: str, environ: Mapping[str, str], config_path: str | None, snapshot: str | None = None,
             body: Callable[[Hook], None] | None = None) -> int:
    """Run one hook; always returns 0 (a failing epilog drains the node), logging what went wrong.

    ``snapshot``: where the parsed site config may be cached (ledger.base.config.load_values), or None.
    ``body``: what the hook does once its config and job are read (the controller's hooks pass theirs); the
    node's prolog or epilog by default.
    """
    global _error_log
    _error_log = None  # until this run's config says otherwise
    t0 = time.time()
    ok = True
    h = None
    try:
        from ...base import config as config_mod

        if kind not in KINDS:
            log(f"unknown hook kind {kind!r} (expected one of {', '.join(KINDS)})")
            return 0
        env = slurm.job_env(environ)
        if env is None:
            log(f"{kind}: no SLURM_JOB_ID in the environment; nothing recorded")
            return 0
        cfg = config_mod.Config(**config_mod.load_values(config_path, environ, snapshot=snapshot))
        _error_log = (cfg.extra.get("hooks") or {}).get("error_log") or None
        h = Hook(cfg=cfg, settings=HookSettings.from_config(cfg), env=env, kind=kind)
        (body or (prolog if kind == "prolog" else epilog))(h)
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
                                        "context": h.env.context,
                                        "elapsed_s": round(time.time() - t0, 4), "pid": os.getpid()}) + "\n")
            except OSError:
                pass
    return 0
