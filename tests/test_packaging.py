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


def test_package_text_reads_what_importlib_resources_reads_for_every_shipped_data_file():
    """ledger.method.packaged (the receipts' cheap reader) against importlib.resources (the plain reference), for
    each data file the package data lists that the code reads through it."""
    from importlib import resources

    import ledger.agents
    import ledger.method
    from ledger.method.packaged import package_text

    files = [("ledger.method", "skus.toml"), ("ledger.method", "xids.toml"), ("ledger.agents", "xid_codes.csv")]
    for package, name in files:
        text = package_text(package, name)
        assert text and text == resources.files(package).joinpath(name).read_text(encoding="utf-8"), (package, name)


def test_the_cli_runs_numpy_on_one_blas_thread_unless_the_user_says_otherwise():
    import os
    import subprocess
    import sys

    probe = "import os, ledger.cli.main; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OPENBLAS_NUM_THREADS": "3"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"
