"""Every external program ipledger may run, and the only functions that run them: :func:`run` one program,
:func:`run_all` several that depend neither on each other's answers nor on their order, at once.

Read-only toward the fleet (docs/slurm.md, tests/test_readonly.py): each program has an allowlist of argument shapes that read
state (or, for DCGM job statistics, start/stop a *watch*, which changes no GPU setting). Anything else is
refused before a process is started. Absolute paths come from the site config's ``[commands]`` table.
Standard library only and import-light, as the hooks call this on their fast path: a program is started with
``os.posix_spawn`` (vfork + exec: no copy of the interpreter's pages) and read through ``select.poll`` with a
deadline, instead of ``subprocess``, whose imports (signal, threading, selectors, enum) cost more than the
start of a small tool. The one other way ipledger starts a process is here too: :func:`fork_call`, a forked copy
of this process that runs its own code (no program, no exec) and writes its result back through a pipe.
"""

from __future__ import annotations

import os

from .frozen import Frozen

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


# nvidia-smi and scontrol take their write operations as extra options/words (`nvidia-smi -q -r`,
# `nvidia-smi --query-gpu=name -pl 300`, `scontrol show job 1 update ...`), so for them every token must be a
# read's, not just the first ones.
_NVSMI_FLAGS = {"-q", "--query", "-L", "--list-gpus", "-x", "--xml-format"}
_NVSMI_VALUED = {"-i", "--id", "-d", "--display"}  # the next token is the value
_NVSMI_PREFIXES = ("--query-gpu=", "--format=", "--id=", "--display=")


def _nvidia_smi_read(args: Sequence[str]) -> bool:
    queried, i = False, 0
    while i < len(args):
        a = args[i]
        if a in _NVSMI_FLAGS or a.startswith(_NVSMI_PREFIXES):
            queried = queried or a in ("-q", "--query", "-L", "--list-gpus") or a.startswith("--query-gpu=")
            i += 1
        elif a in _NVSMI_VALUED and i + 1 < len(args) and not args[i + 1].startswith("-"):
            i += 2
        else:
            return False
    return queried


def _scontrol_show(args: Sequence[str]) -> bool:
    words = [a for a in args if a not in ("-o", "--oneliner", "-d", "--details", "--json")]
    return 2 <= len(words) <= 3 and words[0] == "show" and words[1] in ("job", "jobs", "node", "nodes") and \
        not any(w.startswith("-") for w in words[2:])


ALLOWLIST: Mapping[str, tuple[Rule, ...]] = {
    "dcgmi": (_dcgmi_group, _dcgmi_stats, _starts("discovery", "-l"), _starts("dmon")),
    "amd-smi": (_starts("list"), _starts("static"), _starts("metric"), _starts("monitor"), _starts("version")),
    "nvidia-smi": (_nvidia_smi_read,),
    "scontrol": (_scontrol_show,),
    "squeue": (lambda a: "--json" in a or "-o" in a or "--format" in a,),
    "sacct": (lambda a: "--json" in a or "-P" in a or "--parsable2" in a,),
}


class CommandRefused(PermissionError):
    """The program or its arguments are not on the read-only allowlist."""


class CommandResult(Frozen):
    """What a program said: argv (a tuple), returncode, stdout, stderr (text), timed_out, truncated. Immutable;
    equal by value."""

    __slots__ = ("argv", "returncode", "stdout", "stderr", "timed_out", "truncated")
    _defaults = {"timed_out": False, "truncated": False}
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool  # the program wrote more than the cap allowed and was killed; stdout is its first bytes

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


_SIGKILL = 9  # fixed by POSIX; the signal module would import enum onto the hook path
_READ = 65536
# What one program may write (stdout and stderr together) before it is killed: far above any read-only answer
# ipledger asks for (`nvidia-smi -q -x` on 8 GPUs is ~0.3 MB), far below what would strain a node's memory.
MAX_OUTPUT = 16 << 20


def _decode(data: bytes) -> str:
    # What subprocess's text mode gave: UTF-8 (the hooks run under a C/UTF-8 locale) with universal newlines.
    text = data.decode("utf-8", "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _kill_group(pid: int) -> None:
    """SIGKILL the program's whole process group (it leads its own), so no grandchild outlives the deadline."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, _SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def spawn_and_wait(argv: list[str], *, timeout: float, env: Mapping[str, str] | None = None,
                   max_output: int = MAX_OUTPUT) -> tuple[int, str, str, bool, bool]:
    """Start ``argv`` (stdin /dev/null, stdout and stderr piped), read both until EOF or the deadline, reap it.

    Returns (returncode, stdout, stderr, timed_out, truncated). The program leads a process group of its own;
    on the deadline, or once it has written more than ``max_output`` bytes, the whole group is killed
    (SIGKILL: grandchildren too) and what it had written so far is kept (at most ``max_output`` bytes).
    A grandchild that keeps a pipe open cannot hold us past the deadline. Raises OSError when the program
    cannot be started.
    """
    got = spawn_all_and_wait([argv], timeout=timeout, env=env, max_output=max_output)[0]
    if isinstance(got, OSError):
        raise got
    return got


def _start(argv: list[str], env: Mapping[str, str] | None) -> tuple[int, int, int]:
    """``argv`` started in a process group of its own, stdin /dev/null: (pid, stdout's read end, stderr's)."""
    out_r, out_w = os.pipe()  # both ends close-on-exec; posix_spawn's dup2 gives the child inheritable 1 and 2
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(argv[0], argv, os.environ if env is None else env, setpgroup=0, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, out_r, err_r


def spawn_all_and_wait(argvs: Sequence[list[str]], *, timeout: float, env: Mapping[str, str] | None = None,
                       max_output: int = MAX_OUTPUT) -> list[tuple[int, str, str, bool, bool] | OSError]:
    """Start every program in ``argvs`` at once and wait for them together, each bounded as :func:`spawn_and_wait`
    bounds one: its own pipes and process group, one deadline (``timeout`` from when they have all started), its
    own ``max_output``, its whole group killed at the deadline or past its cap, always reaped. For programs that
    do not depend on each other's answers: their waits overlap instead of adding up.

    Returns one result per program, in order: spawn_and_wait's tuple, or the OSError that kept that program
    from starting (the others still run).
    """
    import select
    import time

    started: list[tuple[int, int, int] | OSError] = []
    status: dict[int, int | None] = {}    # program (its place in argvs) -> wait status once reaped, else None
    chunks: dict[int, list[bytes]] = {}   # pipe read end -> what came through it
    owner: dict[int, int] = {}            # pipe read end -> program
    truncated: set[int] = set()
    try:
        for i, argv in enumerate(argvs):
            try:
                started.append(_start(argv, env))
            except OSError as exc:
                started.append(exc)
                continue
            status[i] = None
            for fd in started[i][1:]:  # type: ignore[index]
                chunks[fd], owner[fd] = [], i
        deadline = time.monotonic() + timeout
        total = dict.fromkeys(status, 0)     # bytes each wrote, stdout and stderr together
        open_fds = dict.fromkeys(status, 2)  # its pipes not yet at EOF
        poller = select.poll()
        for fd in owner:
            poller.register(fd, select.POLLIN)
        reading = set(owner)
        while reading and time.monotonic() < deadline:
            for fd, _event in poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                if fd not in reading:  # its program went past its cap earlier in this batch
                    continue
                i = owner[fd]
                data = os.read(fd, min(_READ, max_output - total[i] + 1))  # POLLIN or POLLHUP: data, or EOF
                if data:
                    total[i] += len(data)
                    if total[i] > max_output:
                        data = data[: len(data) - (total[i] - max_output)]
                        truncated.add(i)
                        _kill_group(started[i][0])  # type: ignore[index]  # at once; reaped below
                        for mine in started[i][1:]:  # type: ignore[index]  # and read no more of it
                            if mine in reading:
                                poller.unregister(mine)
                                reading.discard(mine)
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    reading.discard(fd)
                    open_fds[i] -= 1
        for i, left in open_fds.items():
            if not left:  # both pipes at EOF: the program has exited or is about to; wait for it, to the deadline
                status[i] = _wait_until(started[i][0], deadline, select)  # type: ignore[index]
    finally:
        for fd in chunks:
            os.close(fd)
        for i, st in status.items():
            if st is None:  # past the deadline, too much output (or interrupted): kill the group, reap the program
                pid = started[i][0]  # type: ignore[index]
                _kill_group(pid)
                os.waitpid(pid, 0)
    results: list[tuple[int, str, str, bool, bool] | OSError] = []
    for i, p in enumerate(started):
        if isinstance(p, OSError):
            results.append(p)
            continue
        out = _decode(b"".join(chunks[p[1]]))
        if i in truncated:
            results.append((125, out, f"output exceeded {max_output} bytes; killed", False, True))
        elif status[i] is None:
            results.append((124, out, "", True, False))
        else:
            results.append((os.waitstatus_to_exitcode(status[i]), out, _decode(b"".join(chunks[p[2]])), False,
                            False))
    return results


def _wait_until(pid: int, deadline: float, select) -> int | None:  # noqa: ANN001 - the select module
    """The wait status of ``pid`` once it exits, or None if it is still running at ``deadline``."""
    import time

    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        return status
    try:
        pidfd = os.pidfd_open(pid)  # Linux ≥ 5.3: readable when the process exits
    except (AttributeError, OSError):
        while time.monotonic() < deadline:  # elsewhere: poll the wait status
            time.sleep(0.001)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
        return None
    try:
        p = select.poll()
        p.register(pidfd, select.POLLIN)
        if not p.poll(max(0.0, deadline - time.monotonic()) * 1000):
            return None
    finally:
        os.close(pidfd)
    return os.waitpid(pid, 0)[1]


# Every program ipledger runs is started through this (a list of argvs at a time); tests replace it to prove
# that nothing else is executed. Production leaves it alone.
_SPAWN = spawn_all_and_wait


def run(program: str, args: Sequence[str], *, commands: Mapping[str, str] | None = None,
        timeout: float = 10.0, env: Mapping[str, str] | None = None, max_output: int = MAX_OUTPUT) -> CommandResult:
    """Run an allowlisted, read-only program with a timeout and an output cap; failures come back as values
    (``timed_out``, ``truncated``), never hang and never fill memory."""
    return run_all([(program, args)], commands=commands, timeout=timeout, env=env, max_output=max_output)[0]


def run_all(calls: Sequence[tuple[str, Sequence[str]]], *, commands: Mapping[str, str] | None = None,
            timeout: float = 10.0, env: Mapping[str, str] | None = None,
            max_output: int = MAX_OUTPUT) -> list[CommandResult]:
    """Run several allowlisted, read-only programs at once (:func:`spawn_all_and_wait`): each (program, args)
    checked, resolved and bounded as :func:`run` does one (the timeout counted from when they start, an output
    cap each), failures as values; one CommandResult per call, in order. Only for calls that depend neither on
    each other's answers nor on their order. A call off the allowlist raises CommandRefused before any starts."""
    for program, args in calls:
        check_allowed(program, args)
    paths = [resolve(program, commands) for program, _args in calls]
    argvs = [(path or program, *args) for path, (program, args) in zip(paths, calls)]
    runnable = [i for i, path in enumerate(paths) if path is not None and os.path.exists(path)]
    got = dict(zip(runnable, _SPAWN([list(argvs[i]) for i in runnable], timeout=timeout, max_output=max_output,
                                    env=dict(env) if env is not None else None) if runnable else ()))
    return [_result(program, argvs[i], got[i], timeout) if i in got else
            CommandResult(argvs[i], 127, "", f"{program}: not installed or not configured")
            for i, (program, _args) in enumerate(calls)]


def _result(program: str, argv: tuple[str, ...], got: tuple[int, str, str, bool, bool] | OSError,
            timeout: float) -> CommandResult:
    """What :func:`spawn_all_and_wait` said of one program, as :func:`run` reports it."""
    if isinstance(got, OSError):
        return CommandResult(argv, 126, "", f"{program}: {got}")
    code, out, err, timed_out, truncated = got
    if truncated:
        return CommandResult(argv, code, out, f"{program}: output_truncated: {err}", truncated=True)
    if timed_out:
        return CommandResult(argv, 124, out, f"{program}: timed out after {timeout}s", timed_out=True)
    return CommandResult(argv, code, out, err)


def fork_call(work: Callable[[], bytes]) -> tuple[int, int] | None:
    """Run ``work`` in a forked copy of this process (no program is started: the copy runs this process' own code
    and leaves with ``os._exit``, never running its exit handlers or flushing its buffers); what ``work`` returns
    is written back through a pipe. Returns (pid, read end) for :func:`fork_join`, or None where the fork failed.
    Here, beside every other way ipledger starts a process (tests/test_readonly.py)."""
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid:
        os.close(write_fd)
        return pid, read_fd
    status = 1
    try:
        os.close(read_fd)
        data = work()
        with os.fdopen(write_fd, "wb") as out:
            out.write(data)
        status = 0
    finally:
        os._exit(status)


def fork_join(forked: tuple[int, int] | None) -> bytes | None:
    """What the forked copy of :func:`fork_call` wrote back; None where it failed (it raised, was killed, wrote
    nothing, or never started)."""
    if forked is None:
        return None
    pid, read_fd = forked
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    return data if status == 0 and data else None
