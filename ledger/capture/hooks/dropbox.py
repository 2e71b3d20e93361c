"""A run's drop place: where the job's user leaves progress marks without write access to the spool.

The prolog (as root) makes ``DROP_DIR/<job id>``, mode 0700, owned by the job's uid, inside ``DROP_DIR``
(root's, mode 0711: others may pass through it, not list or change it). ``ipledger mark`` run as the job's user
appends JSON lines to ``marks.jsonl`` there (:mod:`ledger.capture.marks`). The epilog reads that file and turns each
valid line into a ``progress`` entry keyed to *this* run — job id, run, cluster and node come from the hook,
never from the file — then removes the directory.

Everything in the directory is the user's, so the hooks treat it as hostile:

* **Its own bounded space.** ``DROP_DIR`` must not share the spool's filesystem (a user who fills its inodes or
  blocks would otherwise make the spool writes of this run and the next fail): the prolog refuses to make a drop
  place on the spool's filesystem unless ``[hooks] drop_dir_shared_fs = true`` says the site bounds it another
  way (a project quota). docs/slurm.md shows the separate tmpfs.
* **After the records.** The epilog collects only once its own records are durable in the spool
  (:func:`ledger.capture.hooks.core.epilog`), so nothing a drop place holds can cost the run a record.
* **Read without trust.** The directory and the file are opened without following symlinks; only a regular file
  owned by the job's uid with one link is read, at most ``max_bytes`` of it; at most ``max_marks`` marks with
  known fields of bounded size inside the run's window are accepted; a note is escaped losslessly
  (:func:`ledger.capture.hooks.records.escape_text`) before anything encodes it. One ``hook_error`` says how many lines
  were refused and why.
* **Removed within the deadline, by descriptor.** The whole tree is walked and removed with ``*at`` calls
  relative to directory descriptors (never a path, never a symlink, never another filesystem), every entry
  counted, within what is left of the hook's deadline. A tree beyond the per-run quota (``drop_max_entries``,
  ``drop_max_bytes``) is a ``hook_error`` with cause ``drop_place_over_quota``; what could not be removed in time
  is renamed aside (``DROP_DIR/.unclean-<job>-<ns>``), reported with cause ``drop_place_unclean``, and left to
  the root-owned janitor :func:`sweep` (``ipledger hooks sweep``). Both causes are controlled by the job's user.

Standard library only.
"""

from __future__ import annotations

import os
import time

from ...chain.kinds import Kind
from ..marks import DROP_FILE, KINDS, MAX_DROP_BYTES, MAX_MARKS, MAX_NOTE, drop_dir_for
from ...chain.canonical import loads
from .records import escape_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Mapping

ROOT_MODE, RUN_MODE = 0o711, 0o700
CLOCK_SLACK_S = 5.0  # marks are stamped by the job's clock, the window by Slurm's (1 s resolution)
FIELDS = frozenset({"kind", "t", "step", "note", "job_id", "run", "node"})
MAX_ENTRIES = 64          # entries a run's drop place may hold (marks.jsonl is all a mark needs); more: over quota
MAX_TREE_BYTES = 1 << 20  # bytes of regular files it may hold (max_mark_bytes is 256 KiB)
MAX_DEPTH = 16            # directories held open at once while removing; deeper ones are moved up, not followed
MIN_CLEAN_S = 0.25        # the epilog's removal gets what is left of the deadline, and at least this
UNCLEAN_PREFIX = ".unclean-"
SWEEP_SETTLE_S = 300.0    # an orphaned drop place (no hook state) this old is the janitor's
OWNER = "job_user"        # who controls the evidence behind the drop place's causes
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class Limits:
    """``[hooks]`` settings for drop places: ``drop_dir``, ``max_marks``, ``max_mark_bytes``, ``drop_max_entries``,
    ``drop_max_bytes``, ``drop_dir_shared_fs``."""

    __slots__ = ("drop_dir", "max_marks", "max_bytes", "max_entries", "max_tree_bytes", "shared_fs")

    def __init__(self, spool: str, hooks: Mapping[str, Any] | None) -> None:
        h = hooks or {}
        self.drop_dir = drop_dir_for(spool, h)
        self.max_marks = int(h.get("max_marks", MAX_MARKS))
        self.max_bytes = int(h.get("max_mark_bytes", MAX_DROP_BYTES))
        self.max_entries = int(h.get("drop_max_entries", MAX_ENTRIES))
        self.max_tree_bytes = int(h.get("drop_max_bytes", MAX_TREE_BYTES))
        self.shared_fs = h.get("drop_dir_shared_fs") is True


def _limits(h: Any) -> Limits:
    hooks = h.cfg.extra.get("hooks") if isinstance(h.cfg.extra.get("hooks"), dict) else None
    try:
        return Limits(h.cfg.spool, hooks)
    except (TypeError, ValueError) as exc:  # a limit that is no number: the defaults, and the hook goes on
        h.error("config", f"[hooks] drop place limits unusable ({exc}); the defaults used")
        return Limits(h.cfg.spool, {k: v for k, v in (hooks or {}).items()
                                    if k in ("drop_dir", "drop_dir_shared_fs")})


def _uid(h: Any) -> int | None:
    u = h.env.uid
    return int(u) if u and u.isdecimal() and len(u) <= 9 else None


def prepare(h: Any) -> None:
    """Prolog: make the run's drop place for the job's uid (an old one left by a run whose epilog never ran is
    renamed aside for :func:`sweep`, with a hook_error saying so). Failures are hook errors; the job runs
    regardless, and nothing here takes time from the prolog's DCGM calls (no tree is walked)."""
    lim = _limits(h)
    try:
        err = prepare_dir(lim.drop_dir, h.env.job_id, _uid(h), spool=None if lim.shared_fs else h.cfg.spool)
    except OSError as exc:
        err = f"{type(exc).__name__}: {exc}"
    if err:
        h.error("marks", f"drop place not prepared: {err}")


def prepare_dir(drop_dir: str, job_id: str, uid: int | None, spool: str | None = None) -> str | None:
    """Make ``drop_dir/job_id`` (0700, owned by ``uid``); returns an error text, or None when done. ``spool``:
    refuse when ``drop_dir`` is on that directory's filesystem."""
    if uid is None:
        return "no SLURM_JOB_UID in the environment"
    if not os.path.isabs(drop_dir):
        return f"[hooks] drop_dir {drop_dir!r} is not an absolute path"
    if not (job_id.isdecimal() and len(job_id) <= 18):
        return f"job id {job_id!r} is not decimal"
    if not os.path.isdir(drop_dir):
        from ...base.fsmodes import make_dirs

        make_dirs(drop_dir, ROOT_MODE)
    st = os.lstat(drop_dir)
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return f"{drop_dir}: not a directory owned by uid {os.geteuid()} and writable by it alone"
    if spool is not None and _same_fs(st, spool):
        return shared_fs_problem(drop_dir, spool)
    dfd = os.open(drop_dir, _DIR_FLAGS)
    try:
        note = None
        try:
            os.lstat(job_id, dir_fd=dfd)
        except FileNotFoundError:
            pass
        else:
            aside = _set_aside(dfd, job_id)
            note = (f"{drop_dir}/{job_id}: an earlier run's drop place (its epilog never ran), marks unread, "
                    f"moved to {aside} for `ipledger hooks sweep`")
        os.mkdir(job_id, RUN_MODE, dir_fd=dfd)
        rfd = os.open(job_id, _DIR_FLAGS, dir_fd=dfd)
        try:
            os.fchmod(rfd, RUN_MODE)  # mkdir's mode went through the umask
            os.fchown(rfd, uid, -1)
        finally:
            os.close(rfd)
    finally:
        os.close(dfd)
    return note


def shared_fs_problem(drop_dir: str, spool: str) -> str:
    return (f"{drop_dir} is on the spool's filesystem ({spool}): a job could fill it and cost the spool its "
            f"records; mount a separate filesystem there (docs/slurm.md), or set [hooks] drop_dir_shared_fs "
            f"= true where a project quota bounds it")


def shares_spool_fs(drop_dir: str, spool: str) -> bool:
    """Whether drop places made now would land on the spool's filesystem (the nearest existing directory of
    each on one device): what ``ipledger hooks install`` warns of."""
    def nearest(path: str) -> str:
        path = os.path.abspath(path)
        while not os.path.lexists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        return path

    try:
        return os.stat(nearest(drop_dir)).st_dev == os.stat(nearest(spool)).st_dev
    except OSError:
        return False


def _same_fs(st: os.stat_result, spool: str) -> bool:
    try:
        return os.stat(spool).st_dev == st.st_dev
    except OSError:  # no spool yet: nothing of it to lose
        return False


def _set_aside(dfd: int, name: str) -> str:
    """Rename ``name`` (in ``dfd``) to a fresh ``.unclean-NAME-NS``: O(1), whatever the tree holds."""
    aside = f"{UNCLEAN_PREFIX}{name}-{time.time_ns()}"
    os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
    return aside


class Tally:
    """What one removal did: entries and bytes (allocated blocks) removed; ``why`` it stopped short, or None
    when the directory is empty."""

    __slots__ = ("entries", "bytes", "why")

    def __init__(self) -> None:
        self.entries, self.bytes, self.why = 0, 0, None


def clear(root_fd: int, deadline: float | None) -> Tally:
    """Remove everything inside the directory ``root_fd`` (itself stays), by descriptor: ``unlinkat``/``rmdir``
    relative to the directory that holds each entry, subdirectories opened ``O_NOFOLLOW`` and only on the same
    filesystem, at most :data:`MAX_DEPTH` held open (a deeper directory is renamed up into ``root_fd``, then
    emptied in its turn), until ``deadline`` (``time.monotonic()``; None: no limit). Never raises for what the
    tree holds: a failure is the tally's ``why``."""
    t = Tally()
    dev = os.fstat(root_fd).st_dev
    stack: list[tuple[int, str]] = []  # (descriptor, name in its parent) of each open directory below root_fd
    fd = root_fd
    moved = 0
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                t.why = "out of time"
                return t
            sub = None
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        sub = e.name
                        break
                    try:
                        blocks = e.stat(follow_symlinks=False).st_blocks
                        os.unlink(e.name, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    t.entries += 1
                    t.bytes += blocks * 512
                    if not t.entries & 255 and deadline is not None and time.monotonic() > deadline:
                        break
            if sub is None:
                if deadline is not None and time.monotonic() > deadline:
                    continue  # stopped for time, not emptied: the check above says so
                if not stack:
                    return t
                name = stack.pop()[1]
                os.close(fd)
                fd = stack[-1][0] if stack else root_fd
                os.rmdir(name, dir_fd=fd)
                t.entries += 1
                continue
            if len(stack) >= MAX_DEPTH:
                moved += 1
                os.rename(sub, f".ipledger-deep-{time.time_ns()}-{moved}", src_dir_fd=fd, dst_dir_fd=root_fd)
                continue
            try:
                nfd = os.open(sub, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # replaced by a symlink or file since the scan: remove the name itself
                os.unlink(sub, dir_fd=fd)
                t.entries += 1
                continue
            if os.fstat(nfd).st_dev != dev:
                os.close(nfd)
                t.why = f"{escape_text(sub)}: another filesystem mounted inside"
                return t
            stack.append((nfd, sub))
            fd = nfd
    except OSError as exc:
        t.why = f"{type(exc).__name__}: {exc.strerror or exc}"
        return t
    finally:
        for nfd, _name in stack:
            os.close(nfd)


def collect(h: Any, keys: Mapping[str, Any], start: float, end: float, deadline: float) -> None:
    """Epilog, once the run's own records are durable: the run's marks into ``h`` as ``progress`` entries
    (``keys`` the run's), refusals as one hook error; then the drop place removed until ``deadline``, what it
    held beyond the quota and what could not be removed reported (``drop_place_over_quota``,
    ``drop_place_unclean``)."""
    lim = _limits(h)
    job = h.env.job_id
    if not (job.isdecimal() and len(job) <= 18):
        return
    try:
        dfd = os.open(lim.drop_dir, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        h.error("marks", f"drop places unreadable: {lim.drop_dir}: {type(exc).__name__}: {exc.strerror or exc}")
        return
    try:
        try:
            rfd = os.open(job, _DIR_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return
        except OSError as exc:  # DROP_DIR is root's: not something the job's user put there
            h.error("marks", f"drop place unreadable: {type(exc).__name__}: {exc.strerror or exc}")
            return
        try:
            try:
                marks, refused = read_marks(rfd, _uid(h), job, keys["run"], start, end, lim)
            except OSError as exc:
                marks, refused = [], {f"{DROP_FILE} unreadable ({exc.strerror or type(exc).__name__})": 1}
            for m in marks:
                ts = m.pop("t")
                h.add(Kind.PROGRESS, ts, m, keys)
            if refused:
                h.error("marks", f"{len(marks)} marks accepted, {sum(refused.values())} refused: "
                                 + "; ".join(f"{why} x{n}" for why, n in sorted(refused.items())))
            tally = clear(rfd, deadline)
        finally:
            os.close(rfd)
        where = f"{lim.drop_dir}/{job}"
        if tally.entries > lim.max_entries or tally.bytes > lim.max_tree_bytes:
            h.error("drop_place", f"{where} held {'at least ' if tally.why else ''}{tally.entries} entries, "
                                  f"{tally.bytes} bytes (quota {lim.max_entries} entries, {lim.max_tree_bytes} bytes)",
                    cause="drop_place_over_quota", controlled_by=OWNER)
        if tally.why is None:
            os.rmdir(job, dir_fd=dfd)
        else:
            aside = _set_aside(dfd, job)
            h.error("drop_place", f"{where} not emptied ({tally.why}; {tally.entries} entries removed); "
                                  f"moved to {lim.drop_dir}/{aside} for `ipledger hooks sweep`",
                    cause="drop_place_unclean", controlled_by=OWNER)
    except OSError as exc:
        h.error("drop_place", f"{lim.drop_dir}/{job} not removed: {type(exc).__name__}: {exc.strerror or exc}",
                cause="drop_place_unclean", controlled_by=OWNER)
    finally:
        os.close(dfd)


def read_marks(rfd: int, uid: int | None, job_id: str, run: int, start: float, end: float,
               lim: Limits) -> tuple[list[dict], dict[str, int]]:
    """The valid marks in ``marks.jsonl`` of the run's directory ``rfd`` (payload fields plus ``t``), and the
    refusals counted by reason."""
    refused: dict[str, int] = {}
    try:
        fd = os.open(DROP_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=rfd)
    except FileNotFoundError:
        return [], refused
    except OSError as exc:  # ELOOP: a symlink
        return [], {f"{DROP_FILE} not opened ({exc.strerror})": 1}
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
        mark["via"], mark["uid"] = "drop", uid
        out.append(mark)
    return out, refused


def _check(line: bytes, job_id: str, run: int, start: float, end: float) -> tuple[str | None, dict]:
    """(None, mark) for a valid line, else (the reason, {}). A line that is not UTF-8 is read with its bytes
    kept (``surrogateescape``), so a note's stray bytes reach the ledger as ``\\xNN``, not as a refusal."""
    try:
        text, raw = line.decode("utf-8"), False
    except UnicodeDecodeError:
        if b"\\udc" in line.lower():  # a \\udcNN escape beside raw bytes could not be told from one: refused
            return "raw bytes beside \\udcXX escapes", {}
        text, raw = line.decode("utf-8", "surrogateescape"), True
    try:
        rec = loads(text)
    except (ValueError, RecursionError, SystemError):  # SystemError: _json's scanner on a raw control character
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
    if note is not None:
        note = escape_text(note, bytes_escaped=raw)
    return None, {"kind": kind, "step": step, "note": note, "t": min(max(float(t), start), end)}


def sweep(drop_dir: str, state_dir: str, *, settle_s: float = SWEEP_SETTLE_S,
          now: float | None = None) -> list[dict]:
    """The janitor (``ipledger hooks sweep``, root): remove what epilogs set aside (``.unclean-*``) and the drop
    places of runs that are over on this node (no hook state in ``state_dir``, unchanged for ``settle_s``), each
    by :func:`clear` without a deadline. One dict per entry looked at: ``name``, ``action`` (``removed``,
    ``left``, ``kept``), ``entries`` removed, ``why``. OSError when ``drop_dir`` itself cannot be opened or is
    not root's alone."""
    now = time.time() if now is None else now
    dfd = os.open(drop_dir, _DIR_FLAGS)
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(1, f"{drop_dir}: not owned by uid {os.geteuid()} and writable by it alone")
        try:
            running = {n[:-5] for n in os.listdir(state_dir) if n.endswith(".json")}
        except FileNotFoundError:
            running = set()
        out = []
        with os.scandir(dfd) as it:
            names = [e.name for e in it]
        for name in sorted(names):
            if name.isdecimal():
                if name in running:
                    out.append({"name": name, "action": "kept", "entries": 0, "why": "its run holds hook state"})
                    continue
                if now - os.lstat(name, dir_fd=dfd).st_ctime < settle_s:
                    out.append({"name": name, "action": "kept", "entries": 0, "why": "changed recently"})
                    continue
            elif not name.startswith(UNCLEAN_PREFIX):
                out.append({"name": name, "action": "kept", "entries": 0, "why": "not a drop place"})
                continue
            out.append(_sweep_one(dfd, name))
        return out
    finally:
        os.close(dfd)


def _sweep_one(dfd: int, name: str) -> dict:
    try:
        rfd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except OSError:  # a symlink or file (never followed): the name goes
        try:
            os.unlink(name, dir_fd=dfd)
            return {"name": name, "action": "removed", "entries": 1, "why": None}
        except OSError as exc:
            return {"name": name, "action": "left", "entries": 0, "why": exc.strerror or str(exc)}
    try:
        tally = clear(rfd, None)
    finally:
        os.close(rfd)
    if tally.why is None:
        try:
            os.rmdir(name, dir_fd=dfd)
        except OSError as exc:
            tally.why = exc.strerror or str(exc)
    return {"name": name, "action": "left" if tally.why else "removed", "entries": tally.entries, "why": tally.why}
