"""Application progress marks: a checkpoint written, an output accepted, a step reached (docs/progress.md).

``from ledger.capture.marks import mark`` and ``ipledger mark KIND`` (and the ``mark`` script ``ipledger hooks install``
writes) record one mark for the run in Slurm's environment. Standard library only, no database, no click: a
training loop may call it at every checkpoint, and its start-up is measured against a bare interpreter
(bench/mark.py).

Where the mark goes depends on who calls:

* root, or the owner of the spool directory: a ``progress`` entry straight into the spool, like the hooks;
* anyone else (the job's user): one JSON line appended to the run's *drop place*,
  ``DROP_DIR/<job id>/marks.jsonl``, a directory the prolog made for the job's uid alone
  (:mod:`ledger.capture.hooks.dropbox`); the epilog validates those lines and moves them into the spool.

A mark never fails the job: misuse (an unknown kind, a bad ``--step``) raises :class:`MarkError` (one line);
a spool or drop place that cannot be written is logged on stderr and the call returns without raising, unless
``strict`` (then :class:`MarkUnavailable`).
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the start-up path
    from typing import Mapping

KINDS = ("checkpoint", "output", "step")
MAX_NOTE = 200                  # characters of --note kept (a label, not a log)
DROP_FILE = "marks.jsonl"       # the drop place's one file; a non-Python application may append to it
MAX_DROP_BYTES = 256 * 1024     # the epilog reads at most this much of it; mark refuses to grow it further
MAX_MARKS = 1000                # marks per run the epilog accepts from a drop place
DEFAULT_DROP_DIR = "/var/spool/ipledger-drop"
SOURCE = "mark"


class MarkError(ValueError):
    """Misuse: an unknown kind, a bad value, no job to mark (one line)."""


class MarkUnavailable(OSError):
    """The mark could not be recorded (no spool or drop place writable); raised only when strict."""


def drop_dir_for(spool: str, hooks: Mapping | None) -> str:
    """The drop places' root: ``[hooks] drop_dir``, else the spool's path with ``-drop`` appended
    (``/var/spool/ipledger`` -> ``/var/spool/ipledger-drop``): beside the spool, never inside it, since the
    spool is not for the job's user to enter."""
    d = (hooks or {}).get("drop_dir")
    return str(d) if d else spool.rstrip("/") + "-drop"


def check_job_id(job_id: str) -> str:
    """Slurm's job id is decimal; anything else could name a path outside the drop places."""
    if not (job_id.isdecimal() and len(job_id) <= 18):
        raise MarkError(f"job id {job_id!r}: not a Slurm job id (digits)")
    return job_id


def drop_path(drop_dir: str, job_id: str) -> str:
    """``DROP_DIR/<job id>``: derivable from the job id alone."""
    return os.path.join(drop_dir, check_job_id(job_id))


def _epoch(at: str | float | int | None) -> float:
    if at is None or at == "":
        return time.time()
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return float(at)
    text = str(at).strip()
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime, timezone  # only for --at TIME

    try:
        dt = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise MarkError(f"--at {text!r}: not an RFC 3339 time (2026-12-01T14:00:00Z) or epoch seconds") from None
    if dt.tzinfo is None:
        raise MarkError(f"--at {text!r}: give a time zone (Z or +HH:MM)")
    return dt.astimezone(timezone.utc).timestamp()


def _step(step: object) -> int | None:
    if step is None or step == "":
        return None
    if isinstance(step, bool):
        raise MarkError(f"--step {step!r}: not a whole number >= 0")
    if isinstance(step, int):
        value = step
    elif isinstance(step, str) and step.isdecimal() and len(step) <= 18:
        value = int(step)
    else:
        raise MarkError(f"--step {step!r}: not a whole number >= 0")
    if value < 0 or value >= 10**18:
        raise MarkError(f"--step {step!r}: not a whole number >= 0")
    return value


def _note(note: object) -> str | None:
    """The note as given, cut to MAX_NOTE characters; escaped (losslessly) where it is written: by the epilog
    for a drop line, by :func:`_to_spool` for the spool."""
    if note is None:
        return None
    return str(note)[:MAX_NOTE] or None


def _log(msg: str) -> None:
    try:
        sys.stderr.write(f"ipledger mark: {msg}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not fail the job
        pass


def _settings(environ: Mapping[str, str], config_path: str | None, snapshot: str | None) -> tuple[str, str | None, str]:
    """(spool, cluster, drop_dir) from the site config; a config the job's user may not read is no error:
    the environment (``IPLEDGER_SPOOL``, ``IPLEDGER_DROP``, ``SLURM_CLUSTER_NAME``) and defaults stand in."""
    from ..base import config as config_mod

    try:
        values = config_mod.load_values(config_path, environ, snapshot=snapshot)
    except OSError:  # e.g. /etc/ipledger/config.toml readable by root alone
        values = {"spool": environ.get("IPLEDGER_SPOOL") or config_mod.DEFAULT_SPOOL,
                  "cluster": environ.get("IPLEDGER_CLUSTER"), "extra": {}}
    hooks = values["extra"].get("hooks")
    drop = environ.get("IPLEDGER_DROP") or drop_dir_for(values["spool"], hooks if isinstance(hooks, dict) else None)
    return values["spool"], values["cluster"] or environ.get("SLURM_CLUSTER_NAME"), drop


def _may_write_spool(spool: str) -> bool:
    """Root, or the spool's owner: the spool is theirs to write (everyone else goes through a drop place)."""
    euid = os.geteuid()
    if euid == 0:
        return True
    try:
        return os.stat(spool).st_uid == euid
    except OSError:
        return False


def mark(kind: str, *, step: int | str | None = None, note: str | None = None, at: str | float | None = None,
         job: str | None = None, run: int | str | None = None, strict: bool = False,
         environ: Mapping[str, str] | None = None, config_path: str | None = None,
         snapshot: str | None = None) -> str | None:
    """Record one progress mark for a run; returns where it went (a spool file or the drop file), or None when
    it could not be recorded (logged on stderr; :class:`MarkUnavailable` instead when ``strict``).

    ``job``/``run`` default to ``SLURM_JOB_ID`` / ``SLURM_RESTART_COUNT``; ``at`` (RFC 3339 or epoch seconds)
    to now, for backfilling marks from an application's log.
    """
    env = os.environ if environ is None else environ
    if kind not in KINDS:
        raise MarkError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    job_id = str(job or env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "")
    if not job_id:
        raise MarkError("no job: give --job ID, or run inside a Slurm job (SLURM_JOB_ID)")
    run_text = run if run is not None else (env.get("SLURM_RESTART_COUNT") or env.get("SLURM_JOB_RESTART_COUNT") or "0")
    if isinstance(run_text, bool) or not str(run_text).isdecimal() or len(str(run_text)) > 9:
        raise MarkError(f"--run {run_text!r}: not a whole number >= 0")
    run_no = int(run_text)
    ts = _epoch(at)
    fields = {"kind": kind, "step": _step(step), "note": _note(note)}
    check_job_id(job_id)
    from ..base.config import ConfigError

    try:
        spool, cluster, drop = _settings(env, config_path, snapshot)
    except ConfigError as exc:  # the site's config, not the caller, is wrong: the job goes on
        if strict:
            raise MarkUnavailable(22, f"{kind} mark NOT recorded: {exc}") from None
        _log(f"job {job_id} run {run_no}: {kind} mark NOT recorded: {exc}")
        return None
    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    try:
        if _may_write_spool(spool):
            return _to_spool(spool, fields, ts, cluster, job_id, run_no, node)
        return _to_drop(drop, fields, ts, job_id, run_no, node)
    except OSError as exc:
        where = spool if _may_write_spool(spool) else os.path.join(drop, job_id, DROP_FILE)
        msg = (f"job {job_id} run {run_no}: {kind} mark NOT recorded: {where}: "
               f"{exc.strerror or type(exc).__name__}")
        if strict:
            raise MarkUnavailable(exc.errno, msg) from None
        _log(msg)
        return None


def _to_spool(spool: str, fields: dict, ts: float, cluster: str | None, job_id: str, run: int, node: str) -> str:
    from .. import __version__
    from . import spool as spool_mod
    from .hooks.records import entry_record, escape_text, spool_line
    from ..chain.kinds import Kind

    if fields.get("note") is not None:  # argv's undecodable bytes arrive as U+DC80-U+DCFF (surrogateescape)
        fields = {**fields, "note": escape_text(fields["note"])}
    rec = entry_record(Kind.PROGRESS, ts, {**fields, "via": "spool"}, recorded_at=time.time(), cluster=cluster,
                       job_id=job_id, run=run, node=node, source=SOURCE, source_version=__version__)
    return spool_mod.write_records(spool, [rec], prefix="mark", encode=spool_line)


def drop_line(fields: Mapping, ts: float, job_id: str, run: int, node: str | None) -> bytes:
    """One line of the drop file: ``{"kind", "t" (epoch seconds), "step", "note", "job_id", "run", "node"}``,
    UTF-8 with argv's undecodable bytes written back as they were (the epilog shows them as ``\\xNN``); any other
    lone surrogate as a JSON ``\\uNNNN`` escape."""
    from .hooks.records import spool_line

    rec = {**fields, "t": ts, "job_id": job_id, "run": run, "node": node}
    try:
        return (spool_line(rec) + "\n").encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        import json

        return (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def _to_drop(drop: str, fields: dict, ts: float, job_id: str, run: int, node: str) -> str:
    path = os.path.join(drop_path(drop, job_id), DROP_FILE)
    # O_NOFOLLOW: the file is the job user's own, in a directory only they (and root) may enter.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        line = drop_line(fields, ts, job_id, run, node)
        if os.fstat(fd).st_size + len(line) > MAX_DROP_BYTES:
            raise OSError(27, f"drop place full ({MAX_DROP_BYTES} bytes; the epilog reads no more)")  # EFBIG
        os.write(fd, line)  # one write of one line with O_APPEND: concurrent ranks never interleave
    finally:
        os.close(fd)
    return path


USAGE = """usage: ipledger mark {checkpoint|output|step} [--step N] [--note TEXT] [--at TIME] [--job ID] [--run N]
                     [--strict] [--config PATH]"""


def parse_args(argv: list[str]) -> dict:
    """``mark``'s arguments without argparse (its import alone costs a third of the start-up budget)."""
    if not argv:
        raise MarkError("missing KIND (checkpoint, output or step)")
    opts: dict = {"kind": None}
    takes = {"--step": "step", "--note": "note", "--at": "at", "--job": "job", "--run": "run",
             "--config": "config_path"}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if name in takes:
            if not eq:
                if i + 1 >= len(argv):
                    raise MarkError(f"{name} needs a value")
                i += 1
                value = argv[i]
            opts[takes[name]] = value
        elif a == "--strict":
            opts["strict"] = True
        elif a.startswith("-") and a != "-":
            raise MarkError(f"unknown option {a!r}")
        elif opts["kind"] is None:
            opts["kind"] = a
        else:
            raise MarkError(f"unexpected argument {a!r}")
        i += 1
    if opts["kind"] is None:
        raise MarkError("missing KIND (checkpoint, output or step)")
    return opts


def main(argv: list[str] | None = None, config_path: str | None = None, script: str | None = None) -> int:
    """``ipledger mark`` on the fast path (and the installed ``mark`` script): 0 unless misuse or ``--strict``."""
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        sys.stdout.write(USAGE + "\n")
        return 0
    try:
        opts = parse_args(args)
        snapshot = None
        if script:  # the hooks' parsed-config snapshot beside the installed scripts, readable if the site allows
            snapshot = os.path.join(os.path.dirname(os.path.abspath(script)), ".ipledger-config-snapshot")
        opts.setdefault("config_path", config_path)
        mark(opts.pop("kind"), snapshot=snapshot, **opts)
    except MarkError as exc:
        _log(str(exc))
        return 2
    except MarkUnavailable as exc:
        _log(exc.strerror or str(exc))
        return 1
    return 0
