"""docs/security.md's threat model: every actor the model names has rows, and every test a row cites exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACTORS = ("job user", "other tenant", "node root", "operator", "DB writer role", "host engine",
          "whoever sends an export")


def _threat_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## Threat model", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| actor")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows if not set(r) <= set("|- ")]


def test_every_actor_has_rows_and_every_row_names_what_stops_it():
    rows = _threat_rows()
    assert all(len(r) == 5 for r in rows), [r for r in rows if len(r) != 5]
    for actor in ACTORS:
        assert any(actor in r[0] for r in rows), actor
    for r in rows:
        assert r[3] and r[4], r


def test_every_cited_test_exists():
    cited = 0
    for r in _threat_rows():
        current = None
        for m in re.finditer(r"`(?:(test_\w+\.py))?::(test_\w+)`|`(test_\w+\.py)::(test_\w+)`", r[4]):
            file = m.group(1) or m.group(3)
            name = m.group(2) or m.group(4)
            current = file or current
            assert current, r[4]
            src = (ROOT / "tests" / current).read_text()
            assert re.search(rf"^def {name}\(", src, re.M), f"{current}::{name}"
            cited += 1
        if "stopped" in r[3] or r[3].startswith(("fixed", "trusted")):
            assert current, f"a row without a test: {r}"
    assert cited >= 20
