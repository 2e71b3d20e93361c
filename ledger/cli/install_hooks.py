"""Writing the Slurm hook scripts: ``DIR/prolog`` and ``DIR/epilog`` (slurmd, every node) and
``DIR/prolog_slurmctld`` and ``DIR/epilog_slurmctld`` (slurmctld, once per job) from the templates in ``slurm/``.

The scripts name the interpreter by absolute path (``#!/abs/python -IS``: isolated, no site-packages), put the
directory holding the ``ledger`` package first on ``sys.path`` and call :func:`ledger.capture.hooks.run_script` with
the config path baked in. They import neither click nor SQLAlchemy. The template is ``slurm/prolog/ipledger-<kind>.in``
(``slurm/epilog/`` for the epilogs) in a source checkout; an identical copy is kept here for installs without the
checkout (a test keeps them equal).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TEMPLATE = '''#!@PYTHON@ -IS
# ipledger Slurm @KIND@, installed by `ipledger hooks install --dir DIR` (slurm.conf: @KIND_TITLE@=DIR/@KIND@).
# It runs no Slurm command: the job is what Slurm puts in this script's environment (docs/slurm.md).
# Standard library only, isolated interpreter (-I -S): no site-packages, no PYTHON* variables, no PATH needed.
# It always exits 0; failures go to syslog/stderr and to the spool as hook_error entries (docs/slurm.md).
import sys

sys.path.insert(0, "@PACKAGE_ROOT@")
from ledger.capture.hooks import run_script  # noqa: E402

run_script("@KIND@", @CONFIG@, __file__)
'''

KINDS = ("prolog", "epilog", "prolog_slurmctld", "epilog_slurmctld")
TITLES = {"prolog": "Prolog", "epilog": "Epilog", "prolog_slurmctld": "PrologSlurmctld",
          "epilog_slurmctld": "EpilogSlurmctld"}  # the slurm.conf parameter of each

# DIR/mark: `ipledger mark` for job scripts, on the same isolated fast start (ledger.capture.marks; docs/progress.md).
MARK_TEMPLATE = '''#!@PYTHON@ -IS
# ipledger progress marks, installed by `ipledger hooks install --dir DIR`; in a job: DIR/mark checkpoint --step N
# Standard library only, isolated interpreter (-I -S); it never fails the job unless given --strict.
import sys

sys.path.insert(0, "@PACKAGE_ROOT@")
from ledger.capture.marks import main  # noqa: E402

sys.exit(main(sys.argv[1:], @CONFIG@, __file__))
'''


def package_root() -> str:
    import ledger

    return str(Path(ledger.__file__).resolve().parent.parent)


def template_path(kind: str) -> Path:
    return Path(package_root()) / "slurm" / kind.split("_")[0] / f"ipledger-{kind}.in"


def template(kind: str) -> str:
    """The checkout's template for ``kind`` (placeholders @PYTHON@ @PACKAGE_ROOT@ @CONFIG@), else the built-in."""
    p = template_path(kind)
    if p.is_file():
        return p.read_text(encoding="utf-8")
    return TEMPLATE.replace("@KIND_TITLE@", TITLES[kind]).replace("@KIND@", kind)


def render(kind: str, python: str, config_path: str | None) -> str:
    """The script for ``kind`` (prolog, epilog or mark) with the interpreter, package root and config filled in."""
    if not os.path.isabs(python):
        raise ValueError(f"interpreter must be an absolute path, got {python!r}")
    if config_path is not None and not os.path.isabs(config_path):
        raise ValueError(f"config path must be absolute, got {config_path!r}")
    text = MARK_TEMPLATE if kind == "mark" else template(kind)
    return (text.replace("@PYTHON@", python).replace("@PACKAGE_ROOT@", package_root())
            .replace("@CONFIG@", repr(config_path)))


def install(directory: str | os.PathLike, config_path: str | None = None, python: str | None = None) -> list[Path]:
    """Write DIR/prolog, DIR/epilog, DIR/prolog_slurmctld, DIR/epilog_slurmctld and DIR/mark (mode 0755,
    atomically); return the four hooks' paths in that order (the mark script is :func:`mark_path` of DIR)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    py = python or sys.executable
    cfg = os.path.abspath(config_path) if config_path else None
    written = []
    for kind in (*KINDS, "mark"):
        target = d / kind
        tmp = d / f".{kind}.tmp"
        tmp.write_text(render(kind, py, cfg), encoding="utf-8")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
        written.append(target)
    return written[:len(KINDS)]


def mark_path(directory: str | os.PathLike) -> Path:
    """The ``mark`` script :func:`install` writes into DIR, for job scripts (docs/progress.md)."""
    return Path(directory) / "mark"
