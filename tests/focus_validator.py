"""The FinOps Foundation's ``focus-validator`` (PyPI, pinned) in its own virtual environment, for the tests.

It needs Python >= 3.12 (ipledger runs on 3.11), so it never joins ipledger's dependencies: it is installed
once into ``.focus-venv/`` (gitignored) with the first Python >= 3.12 found (``IPLEDGER_FOCUS_PYTHON``,
pyenv's versions, ``python3.12``/``python3.13`` on PATH). ``make test`` prepares it (``python3
tests/focus_validator.py``); a test that finds no such Python calls ``tests.services.unavailable``.

The validator runs offline (``--block-download``) on the FOCUS 1.2 model bundled in it, from its package
directory, because it reads ``focus_validator/rules/currency_codes.csv`` relative to the working directory.

Reading its verdict: the console report lists every rule PASS/FAIL/SKIPPED. The model states some
nullability rules as an ``OR`` of two alternatives ("MUST be null when ... / MUST NOT be null when ...",
e.g. InvoiceId-C-003-C over C-004-C and C-005-C) without conditions, and the validator reports each
alternative on its own line, so one of them always reads FAIL whatever the data. A failing rule is
therefore counted as a failure unless it is an alternative of an ``OR`` composite the validator itself
passed; those are listed apart (``alternatives``), never hidden.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "2.2.1"
# focus-validator 2.2.1 pins numpy < 2 but not pyarrow, whose releases from 22 on need numpy 2.
REQUIREMENTS = (f"focus-validator=={VERSION}", "pyarrow<22")
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".focus-venv"
STAMP = VENV / f".installed-{VERSION}"
FOCUS_VERSION = "1.2"


class Unavailable(RuntimeError):
    """No Python >= 3.12 here, or the validator could not be installed (one line)."""


def find_python() -> str | None:
    """The first Python >= 3.12 on this machine (None when there is none)."""
    cands = [os.environ.get("IPLEDGER_FOCUS_PYTHON", "")]
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    cands += sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3"))
    cands += [shutil.which(n) or "" for n in ("python3.12", "python3.13", "python3.14")]
    for c in cands:
        if not c or not os.access(c, os.X_OK):
            continue
        try:
            out = subprocess.run([c, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out == "True":
            return c
    return None


def ensure_venv() -> Path:
    """The venv's ``focus-validator`` script, installing it on first use."""
    exe = VENV / "bin" / "focus-validator"
    if STAMP.exists() and exe.exists():
        return exe
    py = find_python()
    if py is None:
        raise Unavailable("focus-validator needs Python >= 3.12; none found (set IPLEDGER_FOCUS_PYTHON)")
    steps = [[py, "-m", "venv", "--clear", str(VENV)],
             [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS]]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"installing focus-validator {VERSION} into {VENV}: {last}")
    STAMP.touch()
    return exe


def package_dir(exe: Path) -> Path:
    """The site-packages directory holding ``focus_validator/`` (the validator's working directory)."""
    found = sorted(exe.parent.parent.glob("lib/python3*/site-packages/focus_validator"))
    if not found:
        raise Unavailable(f"{exe}: focus_validator package not found beside it")
    return found[0].parent


def _or_alternatives(model: dict) -> dict[str, list[str]]:
    """OR composite rule id -> the rule ids of its alternatives."""
    out: dict[str, list[str]] = {}

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                req = v.get("ValidationCriteria", {}).get("Requirement") if isinstance(v, dict) else None
                if isinstance(req, dict) and req.get("CheckFunction") == "OR":
                    out[k] = [i["ModelRuleId"] for i in req.get("Items", []) if i.get("CheckFunction") ==
                              "CheckModelRule"]
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(model)
    return out


@dataclass
class Verdict:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)        # failures (see the module doc)
    alternatives: list[str] = field(default_factory=list)  # failing alternatives of a passed OR
    skipped: int = 0
    report: str = ""

    def summary(self) -> str:
        return (f"focus-validator {VERSION} (FOCUS {FOCUS_VERSION}): {len(self.passed)} pass, "
                f"{len(self.failed)} fail, {self.skipped} skipped; failing alternatives of passed OR rules: "
                f"{', '.join(self.alternatives) or 'none'}")


_LINE = re.compile(r"^\S+\s+([A-Za-z0-9]+-[A-Z]-\d{3}-[A-Z]): (PASS|FAIL|SKIPPED)\b")


def verdict(report: str, model: dict) -> Verdict:
    """Read the console report (pure): see the module doc for how OR alternatives count."""
    status = {m.group(1): m.group(2) for m in map(_LINE.match, report.splitlines()) if m}
    excused = {alt for rule, alts in _or_alternatives(model).items() if status.get(rule) == "PASS" for alt in alts}
    v = Verdict(report=report)
    for rule, s in sorted(status.items()):
        if s == "PASS":
            v.passed.append(rule)
        elif s == "SKIPPED":
            v.skipped += 1
        elif rule in excused:
            v.alternatives.append(rule)
        else:
            v.failed.append(rule)
    return v


def validate(csv_path: str | Path) -> Verdict:
    """Run the validator on one FOCUS CSV, offline, and read its verdict."""
    exe = ensure_venv()
    cwd = package_dir(exe)
    r = subprocess.run([str(exe), "--data-file", str(Path(csv_path).resolve()), "--validate-version",
                        FOCUS_VERSION, "--block-download", "--focus-dataset", "CostAndUsage"],
                       capture_output=True, text=True, cwd=cwd, timeout=600)
    if "=== Validation Results ===" not in r.stdout:
        tail = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"focus-validator on {csv_path} gave no report (exit {r.returncode}): {tail}")
    models = sorted((cwd / "focus_validator" / "rules").glob(f"model-{FOCUS_VERSION}*.json"))
    return verdict(r.stdout, json.loads(models[-1].read_text()))


if __name__ == "__main__":  # `make test` prepares the venv; a missing Python is reported, not fatal
    try:
        print(f"focus-validator: {ensure_venv()}")
    except Unavailable as exc:
        print(f"focus-validator: unavailable: {exc}", file=sys.stderr)
    if len(sys.argv) > 1:
        print(validate(sys.argv[1]).summary())
