"""What Slurm tells a prolog/epilog about its job: the environment, and ``scontrol show job -d -o`` parsed.

Slurm (22.05, ``PrologFlags=Alloc``) runs the hooks as root on the node with a minimal environment
(``SLURM_JOB_ID``, ``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_GPUS``, ``CUDA_VISIBLE_DEVICES``, ...; no ``PATH``, no
``SLURM_JOB_QOS``). Observed quirks handled here: in the epilog of a *requeued* run both
``SLURM_JOB_RESTART_COUNT`` and ``Restarts=`` already show the next run; ``SLURM_JOB_EXIT_CODE`` is ``0`` for a
cancelled job while scontrol's ``ExitCode=0:15`` carries the signal; times are local, without a zone.
Standard library only.
"""

from __future__ import annotations

import time

from ...base.frozen import Frozen  # records without dataclasses (≈ 10 ms of imports)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hook's import path
    from typing import Mapping

# ``re`` (≈ 5 ms to import under -I -S) is only needed to parse scontrol's answer, so it is imported there;
# the environment (every hook run) is parsed with str methods.
_KEY_PATTERN = r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)="


def two_ints(text: str) -> tuple[int, int] | None:
    """``"1:15"`` -> (1, 15), exactly what ``re.fullmatch(r"(\\d+):(\\d+)", text)`` accepts, else None."""
    a, sep, b = text.partition(":")
    if sep and _digits(a) and _digits(b):
        return int(a), int(b)
    return None


def _digits(text: str) -> bool:
    """One to 18 Unicode decimal digits, which int() reads (``\\d``; not ``isdigit``, which also takes ``²``).

    Longer runs are no id, count or code Slurm prints, and int() refuses 4,300 digits and more.
    """
    return text.isdecimal() and len(text) <= 18


def parse_scontrol_oneline(text: str) -> dict[str, str]:
    """``scontrol show job -d -o ID``: ``Key=Value`` pairs on one line; a value may contain spaces."""
    import re

    line = text.strip().splitlines()[0] if text.strip() else ""
    matches = list(re.finditer(_KEY_PATTERN, line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        key = m.group(1)
        if key not in out:  # the first occurrence is the job's (per-node detail repeats Nodes=, GRES=)
            out[key] = line[m.end():end].strip()
    return out


def parse_slurm_time(value: str | None) -> float | None:
    """``2026-11-30T04:28:29`` (local time) -> epoch seconds; ``Unknown``/``None``/``N/A`` -> None."""
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_duration(value: str | None) -> float | None:
    """``[DD-]HH:MM:SS`` -> seconds."""
    if not value:
        return None
    import re

    m = re.fullmatch(r"(?:(\d{1,9})-)?(\d{1,9}):(\d{1,9}):(\d{1,9})", value.strip())
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


# No node has this many GPUs: a larger index (a corrupt ``0-99999999999``) is skipped rather than expanded.
MAX_GPU_INDEX = 4095
# The most distinct GPUs one job may hold on one node, from any variable: beyond it the list is cut (and the
# hook says so). Each range is bounded by MAX_GPU_INDEX and duplicates count once, so 14 KB of ``0-4095``
# costs one pass over the text, never a 3 GB spool file.
MAX_GPUS = 256


def parse_index_list(value: str | None, cap: int = MAX_GPUS) -> tuple[list[int], str | None]:
    """``0,1`` / ``0-2,5`` -> ([0, 1, 2, 5], None): sorted distinct indices, and why anything was left out.

    Anything that is no index or range (``NoDevFiles``, empty) is skipped silently, as Slurm writes it for a
    job without GPUs; an index above MAX_GPU_INDEX or a list of more than ``cap`` distinct GPUs is cut, with
    the reason returned.
    """
    spans: list[tuple[int, int]] = []
    note = None
    for part in (value or "").split(","):
        part = part.strip()
        a, dash, b = part.partition("-")  # what re.fullmatch(r"(\d+)(?:-(\d+))?", part) accepts
        if not _digits(a) or (dash and not _digits(b)):
            continue
        lo = int(a)
        hi = int(b) if dash else lo
        if hi > MAX_GPU_INDEX:
            note = f"GPU index above {MAX_GPU_INDEX} skipped ({part[:40]})"
            continue
        if lo <= hi:
            spans.append((lo, hi))
    # The lowest ``cap`` indices, whatever order the list was written in; spans are merged first, so a long
    # list of repeated ranges costs no more than its length.
    spans.sort()
    out: list[int] = []
    for lo, hi in spans:
        start = max(lo, out[-1] + 1) if out else lo
        for i in range(start, hi + 1):
            if len(out) >= cap:
                return out, f"more than {cap} GPUs listed; the list was cut at {cap}"
            out.append(i)
    return out, note


def clean_text(value: str | None) -> tuple[str | None, bool]:
    """An environment value as text that encodes to UTF-8: bytes that were not UTF-8 (which Python keeps as
    surrogate escapes) become ``\\xNN``, so the record is kept and says what was there; True if escaped."""
    if value is None:
        return None, False
    try:
        value.encode("utf-8")
        return value, False
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"), True


class JobRecord(Frozen):
    """The parts of scontrol's job record the hooks use (all str/int/float or None; ``raw`` every field)."""

    __slots__ = ("state", "restarts", "start", "end", "suspend_time", "secs_pre_suspend", "run_time", "exit_code",
                 "exit_signal", "qos", "tres", "nodes", "partition", "account", "raw")
    _defaults = {"raw": dict}

    def suspended_total(self) -> float:
        """Seconds suspended: (end - start) - RunTime (RunTime excludes suspended time)."""
        if self.start is None or self.end is None or self.run_time is None:
            return 0.0
        return max(0.0, (self.end - self.start) - self.run_time)


def job_record(fields: Mapping[str, str]) -> JobRecord:
    def opt(k: str) -> str | None:
        v = fields.get(k)
        return None if v in (None, "", "(null)", "N/A") else v

    m = two_ints(fields.get("ExitCode", ""))
    restarts = fields.get("Restarts")
    return JobRecord(
        state=opt("JobState"), restarts=int(restarts) if restarts and _digits(restarts) else None,
        start=parse_slurm_time(fields.get("StartTime")), end=parse_slurm_time(fields.get("EndTime")),
        suspend_time=parse_slurm_time(fields.get("SuspendTime")),
        secs_pre_suspend=float(fields["SecsPreSuspend"]) if _digits(fields.get("SecsPreSuspend", "")) else None,
        run_time=parse_duration(fields.get("RunTime")),
        exit_code=m[0] if m else None, exit_signal=m[1] if m else None,
        qos=opt("QOS"), tres=opt("TRES"), nodes=opt("NodeList"), partition=opt("Partition"),
        account=opt("Account"), raw=dict(fields),
    )


class JobEnv(Frozen):
    """The job as the hook's environment describes it (``gpus`` a tuple of Slurm's GPU indices; ``notes`` what
    could not be taken as it was: escaped bytes, a cut GPU list)."""

    __slots__ = ("job_id", "restart_count", "cluster", "node", "account", "user", "uid", "partition", "qos",
                 "nodes", "gpus", "exit_code", "exit_signal", "derived_exit_code", "context", "constraints",
                 "job_name", "group", "notes")


# Variable per field; the first one set wins (SLURM_JOBID: older releases).
_TEXT = {"job_id": ("SLURM_JOB_ID", "SLURM_JOBID"), "cluster": ("SLURM_CLUSTER_NAME",),
         "node": ("SLURMD_NODENAME",), "account": ("SLURM_JOB_ACCOUNT",), "user": ("SLURM_JOB_USER",),
         "uid": ("SLURM_JOB_UID",), "partition": ("SLURM_JOB_PARTITION",), "qos": ("SLURM_JOB_QOS",),
         "nodes": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"), "context": ("SLURM_SCRIPT_CONTEXT",),
         "constraints": ("SLURM_JOB_CONSTRAINTS",), "job_name": ("SLURM_JOB_NAME",),
         "group": ("SLURM_JOB_GROUP",)}
# GPU indices: SLURM_JOB_GPUS (prolog/epilog), else the per-vendor visibility lists Slurm sets from the same gres.
_GPU_VARS = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")


def _exit_pair(text: str | None, plain: str | None) -> tuple[int | None, int | None]:
    """``SLURM_JOB_EXIT_CODE2``-style ``code:signal``, else a plain (possibly negative) ``code``."""
    m = two_ints(text or "")
    if m:
        return m
    if plain and _digits(plain[1:] if plain[0] == "-" else plain):
        return int(plain), None
    return None, None


def job_env(environ: Mapping[str, str]) -> JobEnv | None:
    """Read the job from Slurm's prolog/epilog environment; None when there is no job id (not run by Slurm)."""
    vals: dict = {}
    notes: list[str] = []
    for field, names in _TEXT.items():
        raw = next((environ[n] for n in names if environ.get(n)), None)
        vals[field], escaped = clean_text(raw)
        if escaped:
            notes.append(f"{names[0]} is not UTF-8; kept with \\xNN escapes")
    if not vals["job_id"]:
        return None
    gpus_text = next((environ[n] for n in _GPU_VARS if environ.get(n)), "")
    gpus, cut = parse_index_list(gpus_text)
    if cut:
        notes.append(cut)
    rc = environ.get("SLURM_JOB_RESTART_COUNT")
    code, sig = _exit_pair(environ.get("SLURM_JOB_EXIT_CODE2"), environ.get("SLURM_JOB_EXIT_CODE"))
    derived, _dsig = _exit_pair(environ.get("SLURM_JOB_DERIVED_EC"), None)
    return JobEnv(restart_count=int(rc) if rc and _digits(rc) else None, gpus=tuple(gpus), exit_code=code,
                  exit_signal=sig, derived_exit_code=derived, notes=tuple(notes), **vals)
