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

from ..frozen import Frozen  # records without dataclasses (≈ 10 ms of imports)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hook's import path
    from typing import Mapping

# ``re`` (≈ 5 ms to import under -I -S) is only needed to parse scontrol's answer, so it is imported there;
# the environment (every hook run) is parsed with str methods.
_KEY_PATTERN = r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)="


def _two_ints(text: str) -> tuple[int, int] | None:
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


# No node has this many GPUs: a larger index (a corrupt ``0-99999999999``) is skipped rather than expanded,
# which would exhaust the hook's memory and time budget.
MAX_GPU_INDEX = 4095


def parse_index_list(value: str | None) -> list[int]:
    """``0,1`` / ``0-2,5`` -> [0, 1, 2, 5]; anything else (``NoDevFiles``, empty, > MAX_GPU_INDEX) is skipped."""
    out: list[int] = []
    for part in (value or "").split(","):
        part = part.strip()
        a, dash, b = part.partition("-")  # what re.fullmatch(r"(\d+)(?:-(\d+))?", part) accepts
        if not _digits(a) or (dash and not _digits(b)):
            continue
        lo = int(a)
        hi = int(b) if dash else lo
        if hi <= MAX_GPU_INDEX:
            out.extend(range(lo, hi + 1))
    return out


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

    m = _two_ints(fields.get("ExitCode", ""))
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
    """The job as the hook's environment describes it (``gpus`` a tuple of Slurm's GPU indices)."""

    __slots__ = ("job_id", "restart_count", "cluster", "node", "account", "user", "uid", "partition", "qos",
                 "nodes", "gpus", "exit_code", "exit_signal", "context")


def job_env(environ: Mapping[str, str]) -> JobEnv | None:
    """Read the job from Slurm's prolog/epilog environment; None when there is no job id (not run by Slurm)."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    rc = environ.get("SLURM_JOB_RESTART_COUNT")
    # GPU indices: SLURM_JOB_GPUS (prolog/epilog), else the per-vendor visibility lists Slurm sets from the same gres.
    gpus_text = (environ.get("SLURM_JOB_GPUS") or environ.get("CUDA_VISIBLE_DEVICES")
                 or environ.get("GPU_DEVICE_ORDINAL") or environ.get("ROCR_VISIBLE_DEVICES") or "")
    m = _two_ints(environ.get("SLURM_JOB_EXIT_CODE2", ""))
    ec = environ.get("SLURM_JOB_EXIT_CODE")
    exit_code = m[0] if m else (int(ec) if ec and _digits(ec[1:] if ec[0] == "-" else ec) else None)
    return JobEnv(
        job_id=job_id, restart_count=int(rc) if rc and _digits(rc) else None,
        cluster=environ.get("SLURM_CLUSTER_NAME"), node=environ.get("SLURMD_NODENAME"),
        account=environ.get("SLURM_JOB_ACCOUNT"), user=environ.get("SLURM_JOB_USER"),
        uid=environ.get("SLURM_JOB_UID"), partition=environ.get("SLURM_JOB_PARTITION"),
        qos=environ.get("SLURM_JOB_QOS"), nodes=environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"),
        gpus=tuple(parse_index_list(gpus_text)), exit_code=exit_code,
        exit_signal=m[1] if m else None, context=environ.get("SLURM_SCRIPT_CONTEXT"),
    )
