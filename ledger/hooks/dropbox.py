"""A run's drop place: where the job's user leaves progress marks without write access to the spool.

The prolog (as root) makes ``DROP_DIR/<job id>``, mode 0700, owned by the job's uid, inside ``DROP_DIR``
(root's, mode 0711: others may pass through it, not list or change it). ``ipledger mark`` run as the job's user
appends JSON lines to ``marks.jsonl`` there (:mod:`ledger.marks`). The epilog reads that file and turns each
valid line into a ``progress`` entry keyed to *this* run — job id, run, cluster and node come from the hook,
never from the file — then removes the directory.

Everything in the directory is the user's, so the epilog treats it as hostile: it opens the directory and the
file without following symlinks, takes only a regular file owned by the job's uid with one link, reads at most
``max_bytes`` of it, accepts at most ``max_marks`` marks with known fields of bounded size inside the run's
window, and says in one ``hook_error`` how many lines it refused and why. Standard library only.
"""

from __future__ import annotations

import os

from ..kinds import Kind
from ..marks import DROP_FILE, KINDS, MAX_DROP_BYTES, MAX_MARKS, MAX_NOTE, drop_dir_for
from ..canonical import loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Mapping

ROOT_MODE, RUN_MODE = 0o711, 0o700
CLOCK_SLACK_S = 5.0  # marks are stamped by the job's clock, the window by Slurm's (1 s resolution)
FIELDS = frozenset({"kind", "t", "step", "note", "job_id", "run", "node"})


class Limits:
    """``[hooks]`` settings for drop places: ``drop_dir``, ``max_marks``, ``max_mark_bytes``."""

    __slots__ = ("drop_dir", "max_marks", "max_bytes")

    def __init__(self, spool: str, hooks: Mapping[str, Any] | None) -> None:
        h = hooks or {}
        self.drop_dir = drop_dir_for(spool, h)
        self.max_marks = int(h.get("max_marks", MAX_MARKS))
        self.max_bytes = int(h.get("max_mark_bytes", MAX_DROP_BYTES))


def _limits(h: Any) -> Limits:
    return Limits(h.cfg.spool, h.cfg.extra.get("hooks") if isinstance(h.cfg.extra.get("hooks"), dict) else None)


def _uid(h: Any) -> int | None:
    u = h.env.uid
    return int(u) if u and u.isdecimal() and len(u) <= 9 else None


def prepare(h: Any) -> None:
    """Prolog: make the run's drop place for the job's uid (an old one left by a run whose epilog never ran is
    removed first, with a hook_error saying so). Failures are hook errors; the job runs regardless."""
    try:
        err = prepare_dir(_limits(h).drop_dir, h.env.job_id, _uid(h))
    except OSError as exc:
        err = f"{type(exc).__name__}: {exc}"
    if err:
        h.error("marks", f"drop place not prepared: {err}")


def prepare_dir(drop_dir: str, job_id: str, uid: int | None) -> str | None:
    """Make ``drop_dir/job_id`` (0700, owned by ``uid``); returns an error text, or None when done."""
    if uid is None:
        return "no SLURM_JOB_UID in the environment"
    if not os.path.isabs(drop_dir):
        return f"[hooks] drop_dir {drop_dir!r} is not an absolute path"
    if not (job_id.isdecimal() and len(job_id) <= 18):
        return f"job id {job_id!r} is not decimal"
    if not os.path.isdir(drop_dir):
        from ..fsmodes import make_dirs

        make_dirs(drop_dir, ROOT_MODE)
    st = os.lstat(drop_dir)
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"{drop_dir}: not a directory owned by uid {os.geteuid()} and writable by it alone"
    path = os.path.join(drop_dir, job_id)
    note = None
    if os.path.lexists(path):
        _remove(path)
        note = f"{path}: an earlier run's drop place (its epilog never ran) was removed, its marks unread"
    os.mkdir(path, RUN_MODE)
    os.chmod(path, RUN_MODE)  # mkdir's mode went through the umask
    os.chown(path, uid, -1, follow_symlinks=False)
    return note


def _remove(path: str) -> None:
    """Remove the user's directory without following anything in it (shutil would cost the hook re and enum)."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _empty(fd, depth=0)
    finally:
        os.close(fd)
    os.rmdir(path)


MAX_DEPTH, MAX_ENTRIES = 8, 10_000  # a user's tree deeper or larger than this is left, and reported


def _empty(dfd: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise OSError(39, f"more than {MAX_DEPTH} levels of directories")  # ENOTEMPTY
    with os.scandir(dfd) as it:
        names = []
        for n, e in enumerate(it):
            if n >= MAX_ENTRIES:
                raise OSError(39, f"more than {MAX_ENTRIES} entries")
            names.append((e.name, e.is_dir(follow_symlinks=False)))
    for name, is_dir in names:
        if is_dir:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                _empty(sub, depth + 1)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)


def collect(h: Any, keys: Mapping[str, Any], start: float, end: float) -> None:
    """Epilog: the run's marks into ``h`` as ``progress`` entries (``keys`` the run's), refusals as one hook
    error; the drop place is removed afterwards (its marks then travel with the epilog's spool write)."""
    lim = _limits(h)
    try:
        path = os.path.join(lim.drop_dir, h.env.job_id)
        if not (h.env.job_id.isdecimal() and os.path.lexists(path)):
            return
        marks, refused = read_marks(path, _uid(h), h.env.job_id, keys["run"], start, end, lim)
    except OSError as exc:
        h.error("marks", f"drop place unreadable: {type(exc).__name__}: {exc}")
        return
    for m in marks:
        ts = m.pop("t")
        h.add(Kind.PROGRESS, ts, m, keys)
    if refused:
        h.error("marks", f"{len(marks)} marks accepted, {sum(refused.values())} refused: "
                         + "; ".join(f"{why} x{n}" for why, n in sorted(refused.items())))
    try:
        _remove(path)
    except OSError as exc:
        h.error("marks", f"drop place not removed: {exc}")


def read_marks(path: str, uid: int | None, job_id: str, run: int, start: float, end: float,
               lim: Limits) -> tuple[list[dict], dict[str, int]]:
    """The valid marks in ``path/marks.jsonl`` (payload fields plus ``t``), and the refusals counted by reason."""
    refused: dict[str, int] = {}
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(DROP_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return [], refused
        except OSError as exc:  # ELOOP: a symlink
            return [], {f"{DROP_FILE} not opened ({exc.strerror})": 1}
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000 or st.st_nlink != 1 or (uid is not None and st.st_uid != uid):
            return [], {f"{DROP_FILE} is not a regular file of the job's user with one link": 1}
        chunks = []
        left = lim.max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 65536))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > lim.max_bytes:
        data = data[:lim.max_bytes]
        refused[f"file beyond {lim.max_bytes} bytes not read"] = 1
    owner = None if uid is None else uid
    out: list[dict] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        why, mark = _check(line, job_id, run, start, end)
        if why is None and len(out) >= lim.max_marks:
            why = f"over {lim.max_marks} marks per run"
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        mark["via"], mark["uid"] = "drop", owner
        out.append(mark)
    return out, refused


def _check(line: bytes, job_id: str, run: int, start: float, end: float) -> tuple[str | None, dict]:
    """(None, mark) for a valid line, else (the reason, {})."""
    try:
        rec = loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "not a JSON line", {}
    if not isinstance(rec, dict):
        return "not a JSON object", {}
    if set(rec) - FIELDS:
        return "unknown field", {}
    kind, t, step, note = rec.get("kind"), rec.get("t"), rec.get("step"), rec.get("note")
    if kind not in KINDS:
        return "unknown kind", {}
    if type(t) not in (int, float) or t != t:
        return "no time t (epoch seconds)", {}
    if not start - CLOCK_SLACK_S <= t <= end + CLOCK_SLACK_S:
        return "time outside the run", {}
    if step is not None and (type(step) is not int or not 0 <= step < 10**18):
        return "bad step", {}
    if note is not None and (type(note) is not str or len(note) > MAX_NOTE):
        return "bad note", {}
    if rec.get("job_id") not in (None, job_id):
        return "another job's mark", {}
    if rec.get("run") not in (None, run):
        return "another run's mark", {}
    return None, {"kind": kind, "step": step, "note": note, "t": min(max(float(t), start), end)}
