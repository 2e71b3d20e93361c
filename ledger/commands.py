"""Every external program ipledger may run, and the only function that runs one.

Read-only toward the fleet (DESIGN.md §2.6): each program has an allowlist of argument shapes that read
state (or, for DCGM job statistics, start/stop a *watch*, which changes no GPU setting). Anything else is
refused before a process is started. Absolute paths come from the site config's ``[commands]`` table.
Standard library only: the hooks call this on their fast path.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hooks' import path (shutil too: see resolve())
    from typing import Callable, Mapping, Sequence

    # Per program: predicates over argv[1:]; a call must satisfy at least one.
    Rule = Callable[[Sequence[str]], bool]


def _starts(*prefix: str) -> Rule:
    return lambda args: tuple(args[: len(prefix)]) == prefix


def _dcgmi_group(args: Sequence[str]) -> bool:
    # `dcgmi group -l` lists; `-c NAME -a IDS` creates a watch group (DCGM-internal, no GPU state); `-d ID`
    # deletes the hooks' own per-job group afterwards (DCGM keeps at most 64 groups; still no GPU state).
    return len(args) >= 2 and args[0] == "group" and args[1] in ("-l", "--list", "-c", "--create", "-i", "--info",
                                                                 "-d", "--delete")


def _dcgmi_stats(args: Sequence[str]) -> bool:
    allowed = {"-e", "--enable", "-s", "--jstart", "-x", "--jstop", "-j", "--job", "-v", "--verbose",
               "-g", "--group", "-u", "--update-interval", "-m", "--max-keep-age", "-r", "--jremove"}
    flags = [a for a in args[1:] if a.startswith("-")]
    return len(args) >= 2 and args[0] == "stats" and all(f in allowed for f in flags)


ALLOWLIST: Mapping[str, tuple[Rule, ...]] = {
    "dcgmi": (_dcgmi_group, _dcgmi_stats, _starts("discovery", "-l"), _starts("dmon")),
    "amd-smi": (_starts("list"), _starts("static"), _starts("metric"), _starts("monitor"), _starts("version")),
    "nvidia-smi": (lambda a: any(x.startswith("--query-gpu=") for x in a), _starts("-q"), _starts("-L")),
    "scontrol": (_starts("show", "job"), _starts("show", "node"), _starts("--json", "show"),
                 _starts("-o", "show"), _starts("-d", "-o", "show")),
    "squeue": (lambda a: "--json" in a or "-o" in a or "--format" in a,),
    "sacct": (lambda a: "--json" in a or "-P" in a or "--parsable2" in a,),
}


class CommandRefused(PermissionError):
    """The program or its arguments are not on the read-only allowlist."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def check_allowed(program: str, args: Sequence[str]) -> None:
    rules = ALLOWLIST.get(program)
    if rules is None:
        raise CommandRefused(f"{program}: not on ipledger's allowlist of programs")
    if not any(rule(list(args)) for rule in rules):
        raise CommandRefused(f"{program} {' '.join(args)}: arguments not on the read-only allowlist")


def resolve(program: str, commands: Mapping[str, str] | None = None) -> str | None:
    """The absolute path configured for a program, else one found on PATH (None when absent)."""
    if commands and program in commands:
        return commands[program]
    import shutil  # ≈ 4 ms under python -I -S; the hooks use configured absolute paths and never get here

    return shutil.which(program)


# Tests replace this to prove nothing else is executed; production leaves it alone.
_SPAWN = subprocess.run


def run(program: str, args: Sequence[str], *, commands: Mapping[str, str] | None = None,
        timeout: float = 10.0, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run an allowlisted, read-only program with a timeout; failures come back as values, never hang."""
    check_allowed(program, args)
    path = resolve(program, commands)
    argv = (path or program, *args)
    if path is None or not os.path.exists(path):
        return CommandResult(argv, 127, "", f"{program}: not installed or not configured")
    try:
        proc = _SPAWN(list(argv), capture_output=True, text=True, timeout=timeout,
                      env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return CommandResult(argv, 124, out, f"{program}: timed out after {timeout}s", timed_out=True)
    except OSError as exc:
        return CommandResult(argv, 126, "", f"{program}: {exc}")
    return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)
