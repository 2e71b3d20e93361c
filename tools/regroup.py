"""Regroup ``ledger/`` into packages that follow the data flow, and rename what says two jobs (issue #30).

Run from the repository root, on a clean tree: ``python tools/regroup.py`` (``--dry-run`` prints what it would do
and changes nothing). It is deterministic and idempotent: a second run finds nothing to move and nothing to
rewrite, and prints so. It can be re-run after merging other branches: their new files and imports of the old
names come out right, because every rule below works on what is in the tree when it runs.

What it does, in order:

1. Rewrites every import statement of every tracked ``.py`` file (absolute and relative; ``from pkg import mod``
   with the modules taken apart when they go to different packages) for the new module names, keeping the
   relative form where the file used one (from the importing module's new place).
2. Rewrites the text of every tracked text file (``.py .md .toml .cfg .ini .service .sh .in .yaml .txt``,
   ``Makefile``, ``Containerfile``; data under ``tests/fixtures`` only in its ``.source.txt`` and ``.md``): dotted
   module names (``"ledger.x"`` in monkeypatch and importlib strings, ``-m ledger.x``, entry points, docs),
   short forms of the renamed modules (``telemetry.store`` -> ``telemetry.sealed``), file and folder paths
   (``ledger/hooks/core.py``, ``ROOT / "ledger" / "commands.py"``), and the identifiers renamed to words
   (``nh`` -> ``nanohours``, ``bda``, ``pathb_*``). Only Python names change: strings that are CLI command names, JSON/CSV keys, config keys or
   receipt bytes are left as they are (the identifier renames apply to code tokens, to a string that is exactly
   the identifier, and to backquoted or dotted mentions in docs).
3. ``git mv`` of every file to its new place; removes the ``reports/periods.py`` re-export shim.
4. Writes the new packages' ``__init__.py`` (a docstring saying the package's job and what it may import) and
   regenerates ``[tool.setuptools] packages`` in pyproject.toml from the tree.
5. Prints top-level modules of ``ledger/`` that no rule placed (a file added after this script was written).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --- the map ------------------------------------------------------------------------------------------------

#: top-level module of ledger/ -> its new package (the module keeps its name unless RENAMED says otherwise)
FLAT = {
    # base: helpers with no dependency on the rest of the project (standard library only)
    "textsafe": "base", "safeout": "base", "fsmodes": "base", "frozen": "base", "heap": "base",
    "commands": "base", "config": "base", "periods": "base", "progressbar": "base",
    # capture: what runs on the nodes and writes the spool
    "spool": "capture", "collector": "capture", "k8s": "capture", "marks": "capture",
    # chain: the hash-chained ledger and what is written into it
    "entries": "chain", "canonical": "chain", "kinds": "chain", "store": "chain", "db": "chain", "rows": "chain",
    "verify": "chain", "verify_status": "chain", "merkle": "chain", "heads": "chain",
    "receipt_lines": "chain", "adjustments": "chain", "contracts": "chain", "closed": "chain",
    # ingest: spool -> ledger
    "intake": "ingest", "ship": "ingest", "accounting": "ingest", "site": "ingest",
}

#: file moves that are not "a flat module into its package" (old path -> new path)
FILE_MOVES = {
    "ledger/accounting.py": "ledger/ingest/sacct.py",            # sacct records at ship time (agents/ has accounting)
    "ledger/proofs.py": "ledger/receipts/bundle.py",             # a receipt's proof bundle (cli/proofs.py is the CLI)
    "ledger/demo.py": "ledger/sim/hall.py",                      # the demo hall, beside the fleet it simulates
    "reports/synthetic.py": "ledger/sim/synthetic_receipts.py",  # a fixture generator, not a report
    "ledger/hooks/install.py": "ledger/cli/install_hooks.py",    # CLI-side: never run by a hook
    "ledger/hooks/reconcile.py": "ledger/cli/reconcile.py",      # CLI-side: never run by a hook
    "ledger/telemetry/store.py": "ledger/telemetry/sealed.py",   # sealed samples (chain/store.py is the ledger's)
    "ledger/sources/amdsmi.py": "ledger/capture/sources/amd_snapshots.py",  # importers/amdsmi.py reads amd-smi logs
    "ledger/agents/attribution.py": "ledger/agents/causes.py",   # the agent's causes (method/attribution.py is the method)
    "tests/test_pathb_agrees.py": "tests/test_imported_agrees.py",
}

#: folder moves (old folder -> new folder), after FILE_MOVES
DIR_MOVES = {
    "ledger/hooks": "ledger/capture/hooks",
    "ledger/sources": "ledger/capture/sources",
}

#: modules removed; their importers import the named module instead
SHIMS = {"reports/periods.py": "ledger.base.periods"}

#: short forms of renamed modules, as the docs and docstrings write them inside the package
SHORT = {"telemetry.store": "telemetry.sealed", "sources.amdsmi": "sources.amd_snapshots",
         "agents.attribution": "agents.causes"}

#: the new packages and their __init__ docstrings
NEW_PACKAGES = {
    "ledger/base/__init__.py": '''"""Base: small helpers every other package may use, with no dependency on the rest of the project.

Text made safe for terminals and files (``textsafe``, ``safeout``), file modes (``fsmodes``), the hooks' frozen
record class (``frozen``), the one runner of external programs (``commands``), the site configuration file
(``config``), billing periods (``periods``), the CLI's progress bar (``progressbar``) and glibc heap settings
(``heap``). Standard library only; imports nothing of the project.
"""
''',
    "ledger/chain/__init__.py": '''"""Chain: the append-only, hash-chained ledger and what is written into it.

Entries and their canonical encoding (``entries``, ``canonical``, ``kinds``), the store, its schema and rows
(``store``, ``db``, ``rows``), chain verification and its recorded status (``verify``, ``verify_status``), the
Merkle tree and signed heads (``merkle``, ``heads``), the receipt lines and the operator's facts: contracts,
adjustments, closed months (``receipt_lines``, ``contracts``, ``adjustments``, ``closed``).
May import: ``ledger.base``, ``ledger.proofcheck``.
"""
''',
    "ledger/capture/__init__.py": '''"""Capture: what runs on the nodes and writes the local spool.

The Slurm prolog/epilog (``hooks``, standard library only) and the application's progress marks (``marks``),
the vendor tools' answers read at ship time (``sources``), the node collector (``collector``), pods as runs
from the kubelet (``k8s``) and the spool they all write (``spool``).
May import: ``ledger.base``, ``ledger.chain``, ``ledger.telemetry``, ``ledger.importers``.
"""
''',
    "ledger/ingest/__init__.py": '''"""Ingest: the spool into the ledger.

``ship`` reads the spool, checks each record (``intake``), derives what the hooks' raw tool output means
(through ``ledger.capture.sources``), appends to the chain and runs the caller's after-ship steps; ``sacct``
adds the accounting records of ended runs; ``site`` is the value holding the site's settings.
May import: ``ledger.base``, ``ledger.chain``, ``ledger.method``, ``ledger.telemetry``, ``ledger.importers``,
``ledger.capture``, ``ledger.proofcheck``.
"""
''',
}

#: identifiers renamed to words (Python names only)
IDENTS = {
    "bda": "before_during_after",
    "pathb_command": "capture_recipe_command",
    "pathb_commands": "capture_recipes",
    "write_pathb_export": "write_imported_export",
    "pathb_h": "imported_h",
    "test_pathb_command_prints_an_importable_recipe": "test_capture_recipe_command_prints_an_importable_recipe",
    "test_pathb_dmon_recipe_metadata_is_what_the_importer_reads":
        "test_dmon_capture_recipe_metadata_is_what_the_importer_reads",
    "test_receipt_from_imported_pathb_data": "test_receipt_from_imported_telemetry",
}

#: exact text fixes where a moved module located a file relative to itself (old text -> new text)
TEXT_FIXES = {
    "tests/test_attacks_hooks.py": [   # the checkout's root from the test's own place, not the hook module's depth
        ("str(Path(slurm.__file__).resolve().parents[2])", "str(Path(__file__).resolve().parents[1])"),
    ],
    "ledger/sim/hall.py": [
        ('Path(__file__).parent / "sim" / "carbon-intensity-DE-2026-11.csv"',
         'Path(__file__).with_name("carbon-intensity-DE-2026-11.csv")'),
    ],
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".service", ".sh", ".in", ".yaml", ".yml", ".txt"}
TEXT_NAMES = {"Makefile", "Containerfile"}
SELF = "tools/regroup.py"
TOPS = {"ledger": "ledger", "reports": "reports"}


def nh_word(name: str) -> str:
    """``paid_nh`` -> ``paid_nanohours``, ``NH_PER_SECOND`` -> ``NANOHOURS_PER_SECOND``, ``nh`` -> ``nanohours``."""
    parts = name.split("_")
    out = ["nanohours" if p == "nh" else "NANOHOURS" if p == "NH" else p for p in parts]
    return "_".join(out)


def renamed_ident(name: str) -> str:
    if name in IDENTS:
        return IDENTS[name]
    if "nh" in name.split("_") or "NH" in name.split("_"):
        return nh_word(name)
    return name


# --- the tree -------------------------------------------------------------------------------------------------

def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def tracked() -> list[str]:
    return sorted(p for p in git("ls-files", "-z").split("\0") if p and (ROOT / p).exists())


def path_to_module(path: str) -> str | None:
    parts = Path(path).with_suffix("").parts
    if not path.endswith(".py") or parts[0] not in TOPS:
        return None
    parts = list(parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def file_moves(files: list[str]) -> dict[str, str]:
    """Every tracked file that moves: old path -> new path (an empty map once the script has run)."""
    moves: dict[str, str] = {}
    for f in files:
        p = Path(f)
        if f in FILE_MOVES:
            moves[f] = FILE_MOVES[f]
        elif len(p.parts) == 2 and p.parts[0] == "ledger" and p.suffix == ".py" and p.stem in FLAT:
            moves[f] = f"ledger/{FLAT[p.stem]}/{p.name}"
        else:
            for old, new in DIR_MOVES.items():
                if f.startswith(old + "/"):
                    moves[f] = new + f[len(old):]
    return moves


def module_map(files: list[str]) -> dict[str, str]:
    """Old dotted module name -> new one, for the current tree plus the fixed rules (so that a second run, on the
    new tree, still knows the old names text may carry)."""
    out: dict[str, str] = {}
    for stem, pkg in FLAT.items():
        out[f"ledger.{stem}"] = f"ledger.{pkg}.{stem}"
    for old, new in {**DIR_MOVES}.items():
        out[old.replace("/", ".")] = new.replace("/", ".")
    for old, new in FILE_MOVES.items():
        o, n = path_to_module(old), path_to_module(new)
        if o and n:
            out[o] = n
    for old, new in file_moves(files).items():
        o, n = path_to_module(old), path_to_module(new)
        if o and n:
            out[o] = n
    for old, new in SHIMS.items():
        out[path_to_module(old)] = new
    return out


def longest_prefix(name: str, sep: str, table: dict[str, str]) -> str:
    """``name`` with its longest prefix (whole ``sep``-separated parts) that ``table`` holds replaced."""
    parts = name.split(sep)
    for i in range(len(parts), 0, -1):
        head = sep.join(parts[:i])
        if head in table:
            return sep.join([table[head], *parts[i:]])
    return name


def map_module(name: str, mmap: dict[str, str]) -> str:
    """The new name of a dotted name (a module, or a name inside one): its longest old prefix replaced."""
    return longest_prefix(name, ".", mmap)


# --- imports ----------------------------------------------------------------------------------------------

def resolve_from(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def relative(importer: str, importer_is_pkg: bool, target: str) -> tuple[int, str]:
    """(level, module) of the shortest relative import of ``target`` from ``importer``."""
    pkg = importer.split(".") if importer_is_pkg else importer.split(".")[:-1]
    t = target.split(".")
    common = 0
    while common < min(len(pkg), len(t)) and pkg[common] == t[common]:
        common += 1
    level = len(pkg) - common + 1
    return level, ".".join(t[common:])


def fmt_from(level_or_abs: tuple[int, str] | str, names: list[tuple[str, str | None]], indent: str,
             comment: str) -> str:
    if isinstance(level_or_abs, tuple):
        level, mod = level_or_abs
        head = "." * level + mod
    else:
        head = level_or_abs
    items = [f"{n} as {a}" if a and a != n else n for n, a in names]
    line = f"from {head} import {', '.join(items)}"
    if comment:
        line += "  " + comment
    if len(indent) + len(line) <= 118:
        return line
    out = [f"from {head} import (" + ("  " + comment if comment else "")]
    cur = indent + "    "
    for it in items:
        if len(cur) + len(it) + 2 > 118 and cur.strip():
            out.append(cur.rstrip())
            cur = indent + "    "
        cur += it + ", "
    out.append(cur.rstrip().rstrip(","))
    out.append(indent + ")")
    return "\n".join(out)


def chars(line: str, col: int) -> int:
    """The character offset of ast's UTF-8 byte column ``col`` in ``line``."""
    return len(line.encode("utf-8")[:col].decode("utf-8"))


def rewrite_imports(path: str, text: str, modules: set[str], mmap: dict[str, str], new_path: str) -> str:
    """The file's import statements for the new module names (the rest of the text as it is)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    me = path_to_module(path)
    me_new = path_to_module(new_path)
    is_pkg = path.endswith("__init__.py")
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            changed = False
            items = []
            for a in node.names:
                new = map_module(a.name, mmap)
                changed |= new != a.name
                items.append(f"{new} as {a.asname}" if a.asname else new)
            if changed:
                edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                              "import " + ", ".join(items)))
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level and me is None:
                continue
            src = resolve_from(me, is_pkg, node) if node.level else (node.module or "")
            if src.split(".")[0] not in TOPS:
                continue
            groups: dict[str, list[tuple[str, str | None]]] = {}
            renamed = False
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub in modules or sub in mmap:  # a submodule taken by name
                    new = map_module(sub, mmap)
                    parent, leaf = new.rsplit(".", 1)
                    renamed |= leaf != a.name
                    groups.setdefault(parent, []).append((leaf, a.asname or (a.name if leaf != a.name else None)))
                else:
                    groups.setdefault(map_module(src, mmap), []).append((a.name, a.asname))
            moved_me = node.level and me_new != me
            if list(groups) == [src] and not moved_me and not renamed:
                continue
            first = lines[node.lineno - 1]
            indent = first[: len(first) - len(first.lstrip())]
            seg = text[offsets[node.lineno - 1] + chars(first, node.col_offset):
                       offsets[node.end_lineno - 1] + chars(lines[node.end_lineno - 1], node.end_col_offset)]
            m = re.search(r"#[^\n]*", seg.split("\n", 1)[0]) if "(" in seg.split("\n", 1)[0] else None
            comment = m.group(0).strip() if m else ""
            stmts = []
            for target, names in groups.items():
                if node.level and target.split(".")[0] == me_new.split(".")[0]:
                    head = relative(me_new, is_pkg, target)
                else:
                    head = target
                stmts.append(fmt_from(head, names, indent, comment))
                comment = ""
            if len(stmts) > 1 and chars(first, node.col_offset) != len(indent):
                raise SystemExit(f"{path}:{node.lineno}: an import to split that does not start its line")
            new_text = ("\n" + indent).join(stmts)
            edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, new_text))
    if not edits:
        return text
    out = text
    for l0, c0, l1, c1, new in sorted(edits, reverse=True):
        a = offsets[l0 - 1] + chars(lines[l0 - 1], c0)
        b = offsets[l1 - 1] + chars(lines[l1 - 1], c1)
        out = out[:a] + new + out[b:]
    return out


# --- text -------------------------------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w.\-/])((?:ledger|reports)(?:\.\w+)+)")
PATH = re.compile(r"(?<![\w./\-])((?:ledger|reports|tests)/[\w./\-]*\w)")


def rewrite_dotted(text: str, mmap: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1)
        start, end = m.span(1)
        new = map_module(name, mmap)
        if new == name:
            return name
        # ``ledger.db`` is also the name of a SQLite file: a module only when followed by an attribute
        # or written as code (`ledger.db`)
        head = name.split(".")[:2]
        if head == ["ledger", "db"] and name == "ledger.db":
            before = text[start - 1: start] if start else ""
            if before != "`":
                return name
        return new
    return DOTTED.sub(sub, text)


def rewrite_paths(text: str, pmap: dict[str, str]) -> str:
    return PATH.sub(lambda m: longest_prefix(m.group(1), "/", pmap), text)


def path_map(mmap: dict[str, str], moves: dict[str, str]) -> dict[str, str]:
    out = {**FILE_MOVES, **DIR_MOVES, **moves}
    for old, new in mmap.items():
        out.setdefault(old.replace(".", "/") + ".py", new.replace(".", "/") + ".py")
    for old in SHIMS:
        out[old] = SHIMS[old].replace(".", "/") + ".py"
    return out


JOINED = re.compile(r"""(["'])(ledger|reports)\1((?:\s*/\s*["'][\w.\-]+["'])+)""")


def rewrite_joined(text: str, pmap: dict[str, str]) -> str:
    """``ROOT / "ledger" / "commands.py"`` (a path built with ``/``) for the new places."""
    def sub(m: re.Match) -> str:
        q = m.group(1)
        parts = [m.group(2), *re.findall(r"[\"']([\w.\-]+)[\"']", m.group(3))]
        new = rewrite_paths("/".join(parts), pmap).split("/")
        if new == parts:
            return m.group(0)
        return " / ".join(f"{q}{p}{q}" for p in new)
    return JOINED.sub(sub, text)


def rewrite_short(text: str) -> str:
    for old, new in SHORT.items():
        text = re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, text)
    return text


IDENT_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def rewrite_idents_py(path: str, text: str) -> str:
    """Rename identifiers in code tokens, in strings that are exactly an identifier, and in comments and strings
    where the identifier carries an underscore (``seconds_to_nh``); never a bare word inside a longer string."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text
    names = {t.string for t in toks if t.type == tokenize.NAME}
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    edits = []
    for t in toks:
        new = None
        if t.type == tokenize.NAME:
            r = renamed_ident(t.string)
            if r != t.string:
                if r in names:
                    raise SystemExit(f"{path}:{t.start[0]}: renaming {t.string} to {r}, a name the file has")
                new = r
        elif t.type in (tokenize.STRING, tokenize.COMMENT) or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            s = t.string
            q = re.fullmatch(r"([rbuf]*)(['\"])(\w+)\2", s, re.I)
            if q and t.type == tokenize.STRING and renamed_ident(q.group(3)) != q.group(3):
                new = q.group(1) + q.group(2) + renamed_ident(q.group(3)) + q.group(2)
            else:
                s2 = IDENT_WORD.sub(lambda m: renamed_ident(m.group(0)) if "_" in m.group(0) or m.group(0) == "bda"
                                    else m.group(0), s)
                if s2 != s:
                    new = s2
        if new is not None:
            a = offsets[t.start[0] - 1] + t.start[1]
            b = offsets[t.end[0] - 1] + t.end[1]
            edits.append((a, b, new))
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def rewrite_idents_md(text: str) -> str:
    return IDENT_WORD.sub(lambda m: renamed_ident(m.group(0)) if "_" in m.group(0) or m.group(0) == "bda"
                          else m.group(0), text)


def is_text(path: str) -> bool:
    p = Path(path)
    if path == SELF:
        return False
    if path.startswith("tests/fixtures/"):
        return path.endswith((".source.txt", ".md"))
    return p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES


# --- pyproject ---------------------------------------------------------------------------------------------

def packages_block(files: list[str]) -> str:
    pkgs = sorted({path_to_module(f) for f in files if f.endswith("/__init__.py") and f.split("/")[0] in TOPS})
    pkgs = [p for p in pkgs if p]
    ledger = [p for p in pkgs if p.split(".")[0] == "ledger"]
    lines, cur = [], "packages = ["
    for p in ledger:
        item = f'"{p}", '
        if len(cur) + len(item) > 118:
            lines.append(cur.rstrip())
            cur = "            "
        cur += item
    lines.append(cur.rstrip())
    lines.append('            "reports",')
    lines.append('            "ipledger_schema", "ipledger_schema.versions"]')
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = ap.parse_args()
    files = tracked()
    moves = file_moves(files)
    mmap = module_map(files)
    pmap = path_map(mmap, moves)
    modules = {m for m in (path_to_module(f) for f in files) if m}
    changed: list[str] = []
    for f in files:
        if not is_text(f):
            continue
        p = ROOT / f
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = text
        if f.endswith(".py"):
            new = rewrite_imports(f, new, modules, mmap, moves.get(f, f))
        new = rewrite_dotted(new, mmap)
        new = rewrite_short(new)
        new = rewrite_paths(new, pmap)
        if f.endswith(".py"):
            new = rewrite_joined(new, pmap)
        if f.endswith(".py"):
            new = rewrite_idents_py(f, new)
        elif f.endswith(".md"):
            new = rewrite_idents_md(new)
        if new != text:
            changed.append(f)
            if not args.dry_run:
                p.write_text(new, encoding="utf-8")
    for f in changed:
        print(f"rewrote {f}")
    for old, new in sorted(moves.items()):
        print(f"git mv {old} {new}")
        if not args.dry_run:
            (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
            git("mv", old, new)
    for old in DIR_MOVES:   # the folders the moves emptied (a folder still holding a file is kept)
        d = ROOT / old
        if d.is_dir() and not any(p.is_file() and "__pycache__" not in p.parts for p in d.rglob("*")):
            print(f"removed the emptied folder {old}")
            if not args.dry_run:
                for p in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    p.unlink() if p.is_file() else p.rmdir()
                d.rmdir()
    for old in SHIMS:
        if (ROOT / old).exists():
            print(f"git rm {old}")
            if not args.dry_run:
                git("rm", "-q", "-f", old)
    fixed = False
    for f, text in TEXT_FIXES.items():
        p = ROOT / f
        if p.exists():
            body = p.read_text(encoding="utf-8")
            for old, new in text:
                if old in body:
                    print(f"fixed {f}: {old} -> {new}")
                    fixed = True
                    body = body.replace(old, new)
                    if not args.dry_run:
                        p.write_text(body, encoding="utf-8")
    for f, doc in NEW_PACKAGES.items():
        p = ROOT / f
        if not p.exists():
            print(f"wrote {f}")
            if not args.dry_run:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(doc, encoding="utf-8")
                git("add", f)
    pyproject = ROOT / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    files_now = tracked() if not args.dry_run else files
    block = packages_block(files_now)
    new = re.sub(r'packages = \[[^\]]*\]', lambda m: block, text, count=1)
    if new != text:
        print("rewrote pyproject.toml [tool.setuptools] packages")
        if not args.dry_run:
            pyproject.write_text(new, encoding="utf-8")
    if args.dry_run:
        files_now = sorted({moves.get(f, f) for f in files})
    flat = sorted(f for f in files_now if Path(f).parent == Path("ledger") and f.endswith(".py")
                  and Path(f).stem not in ("__init__", "proofcheck"))
    for f in flat:
        print(f"NOT PLACED: {f} (add it to FLAT in tools/regroup.py)")
    if not changed and not moves and not fixed and not any((ROOT / s).exists() for s in SHIMS):
        print("nothing to do: the tree is already regrouped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
