"""What `pip install` puts on sys.path: every package of the tree, and the migrations as `ipledger_schema`
(the folder schema/), never a top-level `schema` package (a popular PyPI name it would shadow)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_the_package_list_names_every_package_and_no_top_level_schema():
    st = _setuptools()
    dirs = st["package-dir"]
    assert dirs == {"ipledger_schema": "schema"}
    on_disk = set()
    for top, where in (("ledger", "ledger"), ("reports", "reports"), ("ipledger_schema", "schema")):
        for init in (ROOT / where).rglob("__init__.py"):
            on_disk.add(".".join([top, *init.parent.relative_to(ROOT / where).parts]))
    assert set(st["packages"]) == on_disk
    assert not any(p == "schema" or p.startswith("schema.") for p in st["packages"])


def test_the_installed_migrations_are_the_schema_folder():
    import ipledger_schema
    import ipledger_schema.head

    here = Path(ipledger_schema.__file__).parent
    assert (here / "alembic.ini").is_file() and (here / "script.py.mako").is_file()
    revisions = sorted(p.name.split("_")[0] for p in (here / "versions").glob("0*.py"))
    assert tuple(revisions) == ipledger_schema.head.REVISIONS
