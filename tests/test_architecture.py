"""The import rules of docs/architecture.md, checked over the real import graph of ledger/, reports/, schema/.

Every ``import`` and ``from ... import`` in a module counts, at any depth (function-level imports too: a
lazy import is still a dependency). The component table is read from docs/architecture.md itself, so the
page and the test cannot drift apart.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = frozenset({"ledger", "reports", "ipledger_schema"})
DIRS = {"ledger": "ledger", "reports": "reports", "ipledger_schema": "schema"}  # schema/ installs as ipledger_schema

# Standard-library modules of the Pythons the project supports that this interpreter may not list.
OTHER_STDLIB = {"_sha2"}  # CPython >= 3.12's SHA-2 module (ledger.chain.canonical tries it before 3.11's _sha256)


def _modules() -> dict[str, Path]:
    out = {}
    for top in PACKAGES:
        for p in (ROOT / DIRS[top]).rglob("*.py"):
            parts = [top, *p.relative_to(ROOT / DIRS[top]).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _from_prefix(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    """The absolute module a ``from ... import`` statement of ``module`` takes its names from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, path: Path) -> set[str]:
    """Every name this module imports, made absolute (``from . import x`` gives both the package and ``.x``)."""
    is_pkg = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = _from_prefix(module, node, is_pkg)
            subs = {f"{prefix}.{a.name}" for a in node.names}
            names.update(subs)
            # ``from pkg import mod`` loads pkg's __init__ anyway (as any import of a submodule does); it depends
            # on the package itself only when it takes a name the package defines
            if not subs <= set(MODULES):
                names.add(prefix)
    return names


IMPORTS = {m: _imported(m, p) for m, p in MODULES.items()}


def _project(names: set[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def _crossings() -> list[tuple[str, str]]:
    """(importer, imported) pairs of modules in different components."""
    return sorted((m, t) for m, names in IMPORTS.items() for t in _project(names) if component(t) != component(m))


def _rules() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(component -> module prefixes, component -> components it may import) from the page's table."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    prefixes: dict[str, list[str]] = {}
    allowed: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("component", "") or set(cells[0]) <= {"-"}:
            continue
        name, mods, _job, may = cells
        prefixes[name] = re.findall(r"`([\w.]+)`", mods)
        allowed[name] = set() if may == "—" else {c.strip() for c in may.split(",")}
    return prefixes, allowed


PREFIXES, ALLOWED = _rules()


def component(module: str) -> str:
    best = max(((len(p), c) for c, ps in PREFIXES.items() for p in ps if module == p or module.startswith(p + ".")),
               default=None)
    assert best is not None, f"{module} belongs to no component of docs/architecture.md"
    return best[1]


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_table_covers_every_module_and_allows_no_cycle():
    assert set(ALLOWED) >= {"verifier", "base", "chain", "capture", "ingest", "receipts", "reports", "cli"}, \
        "table not found in the page"
    for c, targets in ALLOWED.items():
        assert targets <= set(ALLOWED), f"{c} may import unknown components {targets - set(ALLOWED)}"
    assert not _cycles(ALLOWED), "the allowed imports themselves form a cycle"
    for m in MODULES:
        component(m)


def test_ledger_is_made_of_packages():
    """Every module of ledger/ lives in a package named for its stage; only the verifier (one file a tenant
    copies alone) and the package's own ``__init__`` sit at the top."""
    flat = sorted(p.name for p in (ROOT / "ledger").glob("*.py") if p.name not in ("__init__.py", "proofcheck.py"))
    assert not flat, f"modules outside a package of ledger/ (docs/architecture.md): {flat}"


def _may_import(doc: str) -> set[str] | None:
    """The components a package's docstring says it may import (its ``May import:`` line, names in backquotes),
    the empty set where it says it imports nothing of the project, None where it says neither."""
    m = re.search(r"^May import:(.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if m:
        return {component(n) for n in re.findall(r"`([\w.]+)`", m.group(1))}
    return set() if "imports nothing of the project" in " ".join(doc.split()) else None


def test_each_package_says_its_job_and_what_it_may_import():
    """Each package's ``__init__`` docstring says its job and ends with what it may import: the same components
    as its row of docs/architecture.md."""
    bad = []
    for comp, prefixes in PREFIXES.items():
        for prefix in prefixes:
            path = MODULES.get(prefix)
            if not prefix.startswith(("ledger.", "reports")) or path is None or path.name != "__init__.py":
                continue   # the top package (its version only) and single modules (the verifier)
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
            says = _may_import(doc)
            if len(doc.split()) < 8:
                bad.append(f"{prefix}: no docstring saying its job")
            elif says is None:
                bad.append(f"{prefix}: its docstring does not say what it may import ('May import: ...')")
            elif says != ALLOWED[comp]:
                bad.append(f"{prefix}: docstring says {sorted(says)}, docs/architecture.md {sorted(ALLOWED[comp])}")
    assert not bad, "\n".join(bad)


def test_every_import_between_components_is_allowed():
    bad = [f"{m} imports {t} ({component(m)} -> {component(t)})" for m, t in _crossings()
           if component(t) not in ALLOWED[component(m)]]
    assert not bad, "\n".join(bad)


def test_no_cycles_among_components():
    graph: dict[str, set[str]] = defaultdict(set)
    for m, t in _crossings():
        graph[component(m)].add(component(t))
    assert not _cycles(graph), _cycles(graph)


def test_no_cycles_among_modules():
    graph = {m: _project(names) - {m} for m, names in IMPORTS.items()}
    assert not _cycles(graph), f"modules importing each other in a circle: {_cycles(graph)}"


def _hook_modules() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The hook's own modules", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([\w.]+)`", section))


def test_the_hook_imports_only_the_standard_library_and_its_own_modules():
    own = _hook_modules()
    assert {"ledger.capture.hooks", "ledger.capture.hooks.core", "ledger.chain.canonical"} <= own
    reached: set[str] = set()
    foreign: set[str] = set()
    todo = ["ledger.capture.hooks"]
    while todo:
        m = todo.pop()
        if m in reached:
            continue
        reached.add(m)
        for name in IMPORTS[m]:
            if name in MODULES:
                todo.append(name)
            elif name.split(".")[0] not in PACKAGES | sys.stdlib_module_names | OTHER_STDLIB:
                foreign.add(name.split(".")[0])
    outside = (reached - own) | foreign
    assert not outside, f"the hook loads {sorted(outside)}"
    # the hook entry point must not reach the database, the CLI or the receipts at all
    assert not {m for m in reached if m.startswith(("ledger.cli", "ledger.receipts", "ledger.db", "ledger.chain.store"))}


def _private_imports(module: str, path: Path) -> list[str]:
    """``from X import _name`` where X is another module of the project (a private name used across modules)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{module}: from {'.' * node.level}{node.module or ''} import {a.name}")
    return out


def _private_attribute_uses(module: str, path: Path) -> list[str]:
    """``mod._name`` where ``mod`` names another module of the project (bound by ``import`` or
    ``from pkg import mod``): the same private use, written as an attribute."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in ALL_MODULES:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            prefix = _from_prefix(module, node, is_pkg)
            for a in node.names:
                if f"{prefix}.{a.name}" in ALL_MODULES:
                    bound[a.asname or a.name] = f"{prefix}.{a.name}"
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__") and bound[node.value.id] != module):
            out.append(f"{module}:{node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
    return out


def _bench_modules() -> dict[str, Path]:
    return {f"bench.{p.stem}" if p.stem != "__init__" else "bench": p for p in (ROOT / "bench").glob("*.py")}


ALL_MODULES = {**MODULES, **_bench_modules()}


def test_no_private_names_cross_modules():
    """No module of ledger/, reports/ or bench/ takes another module's private name (``from x import _y`` or
    ``x._y``): what one module shares with another is public, and named as such."""
    bad = [b for m, p in ALL_MODULES.items() for b in (*_private_imports(m, p), *_private_attribute_uses(m, p))]
    assert not bad, "\n".join(bad)


def test_receipts_package_reexports_resolve_and_stay_light() -> None:
    """`ledger.receipts` names its re-exports by module and imports them on first use: each name resolves to the
    object its module defines, `__all__` lists exactly the table plus the package's own functions, and importing a
    light submodule (what `account` and the agents read) loads neither SQLAlchemy nor the receipt's compute."""
    import importlib
    import subprocess
    import sys

    import ledger.receipts as receipts

    for mod, names in receipts.REEXPORTS.items():
        m = importlib.import_module(f"ledger.receipts.{mod}")
        for name in names:
            assert getattr(receipts, name) is getattr(m, name), (mod, name)
    own = {"build_receipt", "receipt_for", "runs_of"}
    assert set(receipts.__all__) == own | {n for names in receipts.REEXPORTS.values() for n in names}
    code = ("import sys, ledger.receipts.progress; "
            "print(sorted(m for m in ('sqlalchemy', 'ledger.receipts.compute', 'reportlab') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    assert out == "[]", out


HEAVY = ("pandas", "numpy", "pyarrow", "sqlalchemy", "duckdb", "reportlab", "cryptography", "alembic")


def test_top_level_help_imports_no_heavy_library():
    """`ipledger --help` answers at once: run as the console script pyproject.toml names, it imports no database
    layer, dataframe, array or PDF library (read from the child's ``sys.modules``)."""
    import subprocess
    import tomllib

    script = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]["ipledger"]
    module, func = script.split(":")
    code = ("import sys, importlib\n"
            f"f = getattr(importlib.import_module({module!r}), {func!r})\n"
            "sys.argv = ['ipledger', '--help']\n"
            "try:\n    f()\n"
            "except SystemExit:\n    pass\n"
            f"heavy = sorted(k for k in sys.modules if k.split('.')[0] in {HEAVY!r})\n"
            "sys.stderr.write(repr(heavy))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and "Commands:" in done.stdout, done.stderr[-2000:]
    assert done.stderr == "[]", done.stderr
