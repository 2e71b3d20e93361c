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
PACKAGES = ("ledger", "reports", "schema")

# Imports the rules forbid that the code still has, each with why it is tolerated for now. A new one fails the
# test; the fix is in the code, not here.
HOOK_EXCEPTIONS = {
    # the hook parses DCGM / NVML / amd-smi output itself; recording raw output and parsing at ship time ends it
    "ledger.sources", "ledger.sources.amdsmi", "ledger.sources.dcgm", "ledger.sources.nvml",
    # optional vendor bindings named (inside functions) by those source modules
    "pynvml", "amdsmi",
}
# Imports between components that the table forbids, by (importer, imported) module; docs/architecture.md says why
# each is wrong and where the code belongs. They are left out of the cycle check between components too.
KNOWN_CROSSINGS = {
    ("ledger.receipts.compute", "ledger.hooks.accounting"),
    ("ledger.receipts.progress", "ledger.hooks.accounting"),
}
KNOWN_MODULE_CYCLES = [
    # reports/ imports itself in a circle (export, focus, issued, issued_columns, issued_lines, monthly,
    # pdf_statement)
    {"reports", "reports.export", "reports.focus", "reports.issued", "reports.issued_columns",
     "reports.issued_lines", "reports.monthly", "reports.pdf_statement"},
    # the hooks package's run() imports .core lazily; core, controller and dropbox import one another
    {"ledger.hooks", "ledger.hooks.core", "ledger.hooks.controller", "ledger.hooks.dropbox"},
    # the store extends the Merkle tree as it appends; merkle reads the store's head and entries
    {"ledger.store", "ledger.merkle"},
]


def _modules() -> dict[str, Path]:
    out = {}
    for top in PACKAGES:
        for p in (ROOT / top).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imported(module: str, path: Path) -> set[str]:
    """Every name this module imports, made absolute (``from . import x`` gives both the package and ``.x``)."""
    is_pkg = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{a.name}" for a in node.names)
    return names


IMPORTS = {m: _imported(m, p) for m, p in MODULES.items()}


def _project(names: set[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def _crossings() -> list[tuple[str, str]]:
    """(importer, imported) pairs of modules in different components, the known exceptions left out."""
    return sorted((m, t) for m, names in IMPORTS.items() for t in _project(names)
                  if component(t) != component(m) and (m, t) not in KNOWN_CROSSINGS)


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
    assert set(ALLOWED) >= {"foundation", "hooks", "receipts", "reports", "app"}, "table not found in the page"
    for c, targets in ALLOWED.items():
        assert targets <= set(ALLOWED), f"{c} may import unknown components {targets - set(ALLOWED)}"
    assert not _cycles(ALLOWED), "the allowed imports themselves form a cycle"
    for m in MODULES:
        component(m)


def test_every_import_between_components_is_allowed():
    bad = [f"{m} imports {t} ({component(m)} -> {component(t)})" for m, t in _crossings()
           if component(t) not in ALLOWED[component(m)]]
    assert not bad, "\n".join(bad)


def test_no_cycles_among_components():
    graph: dict[str, set[str]] = defaultdict(set)
    for m, t in _crossings():
        graph[component(m)].add(component(t))
    assert not _cycles(graph), _cycles(graph)


def test_no_new_cycles_among_modules():
    graph = {m: _project(names) - {m} for m, names in IMPORTS.items()}
    new = [c for c in _cycles(graph) if not any(c <= known for known in KNOWN_MODULE_CYCLES)]
    assert not new, f"modules importing each other in a circle: {new}"


def _hook_modules() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The hook's own modules", 1)[1].split("Known exceptions", 1)[0]
    return set(re.findall(r"`([\w.]+)`", section))


def test_the_hook_imports_only_the_standard_library_and_its_own_modules():
    own = _hook_modules()
    assert {"ledger.hooks", "ledger.hooks.core", "ledger.canonical"} <= own
    reached: set[str] = set()
    foreign: set[str] = set()
    todo = ["ledger.hooks"]
    while todo:
        m = todo.pop()
        if m in reached:
            continue
        reached.add(m)
        for name in IMPORTS[m]:
            if name in MODULES:
                todo.append(name)
            elif name.split(".")[0] not in PACKAGES and name.split(".")[0] not in sys.stdlib_module_names:
                foreign.add(name.split(".")[0])
    outside = (reached - own) | foreign
    assert outside <= HOOK_EXCEPTIONS, f"the hook loads {sorted(outside - HOOK_EXCEPTIONS)}"
    # the hook entry point must not reach the database, the CLI or the receipts at all
    assert not {m for m in reached if m.startswith(("ledger.cli", "ledger.receipts", "ledger.db", "ledger.store"))}
