"""Data files shipped inside ledger's packages (the SKU table, the XID classes, the agents' XID codes), read
through the package's own loader: what ``importlib.resources.files(package).joinpath(name).read_text()`` gives
for a package installed as files or zipped, without importing importlib.resources (zipfile, tempfile: ≈ 5 ms
of every command that reads the SKU table, a receipt among them; tests/test_packaging.py holds the two equal)."""

from __future__ import annotations

import os
import sys


def package_text(package: str, name: str) -> str:
    """The UTF-8 text of the file ``name`` beside the modules of ``package`` (already imported: the caller's
    own package)."""
    module = sys.modules[package]
    data = module.__spec__.loader.get_data(os.path.join(os.path.dirname(module.__file__), name)).decode("utf-8")
    return data.replace("\r\n", "\n").replace("\r", "\n")   # universal newlines, as a text-mode read gives
