"""The layout of DESIGN.md and ARCHITECTURE.md, enforced on the real import graph (issue 9).

Every ``import`` of every module under ``privcal/`` is read from the source with
:mod:`ast` — at module level, inside functions and under ``TYPE_CHECKING`` alike — and
resolved to the privcal module it loads: ``from privcal.accountant import Accountant``
counts as an import of the module the package's lazy ``_EXPORTS`` (or its own imports)
take ``Accountant`` from. On that graph:

- ``calibrators`` never import ``storage``, the ``accountant``, the ``cli`` or the
  ``service`` (nor SQLAlchemy/Alembic): a calibrator is mathematics and never sees the ledger;
- ``storage`` never imports ``calibrators``, the ``accountant``, the ``cli`` or the ``service``;
- ``accountant.privacy`` (the pure privacy mathematics) imports neither ``storage``,
  SQLAlchemy, the accountant's orchestration nor ``calibrators``;
- the ``cli`` and the ``service`` are skins: no library module imports them, and the
  service does not import the CLI;
- inside each package (``accountant``, ``calibrators``, ``storage``, ``cli``, ``service``,
  ``client``, ``data``) the modules import each other without a cycle, deferred imports
  inside functions included;
- no module under ``privcal/`` is over 400 lines unless its docstring gives the reason on
  a line starting ``Size:``.

Each rule is a function of the graph, so a violation fails with the offending module,
the module it imports and the line (see ``test_a_violation_is_caught``).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import privcal

ROOT = Path(privcal.__file__).parent
MAX_LINES = 400


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` (``target`` may be outside privcal)."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} imports {self.target} (line {self.line})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str) -> bool:
    path = _modules().get(name)
    return path is not None and path.name == "__init__.py"


@cache
def _package_names(package: str) -> dict[str, str]:
    """Where a package's names come from: its lazy ``_EXPORTS`` and its own imports."""
    out: dict[str, str] = {}
    tree = ast.parse(_modules()[package].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    exports = getattr(importlib.import_module(package), "_EXPORTS", None)
    if isinstance(exports, dict):
        out.update({k: v for k, v in exports.items() if isinstance(v, str)})
    return out


def _resolve_from(module: str, name: str) -> str:
    """The module that ``from module import name`` loads ``name`` from."""
    if f"{module}.{name}" in _modules():
        return f"{module}.{name}"
    if _is_package(module):
        source = _package_names(module).get(name)
        if source is not None and source != module and source in _modules():
            return _resolve_from(source, name) if _is_package(source) else source
    return module


def _absolute(source: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = source.split(".")
    if not _is_package(source):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports_of(source: str, path: Path) -> list[Edge]:
    edges: list[Edge] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            edges += [Edge(source, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(source, node)
            for a in node.names:
                target = _resolve_from(module, a.name) if module.startswith("privcal") else module
                edges.append(Edge(source, target, node.lineno))
    return edges


@cache
def graph() -> tuple[Edge, ...]:
    """Every import of every privcal module."""
    return tuple(e for name, path in _modules().items() for e in _imports_of(name, path))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(edges: tuple[Edge, ...], sources: str, forbidden: tuple[str, ...],
               allowed: tuple[str, ...] = ()) -> list[str]:
    """The imports from modules under ``sources`` of anything under ``forbidden``
    (except what is under ``allowed``)."""
    return [str(e) for e in edges
            if _under(e.source, sources)
            and any(_under(e.target, f) for f in forbidden)
            and not any(_under(e.target, a) for a in allowed)]


SKINS = ("privcal.cli", "privcal.service")

RULES = {
    "calibrators are mathematics: no ledger, no accountant, no skin": (
        "privcal.calibrators",
        ("privcal.storage", "privcal.accountant", "privcal.migrations", *SKINS,
         "sqlalchemy", "alembic"),
        (),
    ),
    "storage knows no calibrator, no accountant, no skin": (
        "privcal.storage",
        ("privcal.calibrators", "privcal.accountant", *SKINS),
        (),
    ),
    "the privacy mathematics is pure: no storage, SQL, orchestration or calibrator": (
        "privcal.accountant.privacy",
        ("privcal.storage", "privcal.migrations", "sqlalchemy", "alembic",
         "privcal.accountant", "privcal.calibrators", *SKINS),
        ("privcal.accountant.privacy",),
    ),
    "the service does not import the CLI": ("privcal.service", ("privcal.cli",), ()),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_dependency_directions(rule: str) -> None:
    sources, forbidden, allowed = RULES[rule]
    assert violations(graph(), sources, forbidden, allowed) == [], rule


def test_the_library_does_not_import_its_skins() -> None:
    bad = [str(e) for e in graph()
           if not any(_under(e.source, s) for s in SKINS)
           and any(_under(e.target, s) for s in SKINS)]
    assert bad == []


def cycles(edges: tuple[Edge, ...], package: str) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a
    module importing itself) among the modules under ``package``."""
    succ: dict[str, set[str]] = {}
    for e in edges:
        if _under(e.source, package) and _under(e.target, package) and e.target in _modules():
            succ.setdefault(e.source, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(
    "package",
    ["privcal.accountant", "privcal.calibrators", "privcal.storage", "privcal.cli",
     "privcal.service", "privcal.client", "privcal.data"],
)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    assert cycles(graph(), package) == []


def _size_reason(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return next((ln for ln in doc.splitlines() if ln.strip().startswith("Size:")), None)


def oversized(paths: list[Path], base: Path) -> list[str]:
    """Modules over :data:`MAX_LINES` lines whose docstring gives no ``Size:`` reason."""
    out = []
    for p in paths:
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES and _size_reason(p) is None:
            out.append(f"{p.relative_to(base)}: {n} lines, no 'Size:' line in its docstring")
    return out


def test_no_module_over_400_lines_without_a_reason() -> None:
    assert oversized(list(_modules().values()), ROOT.parent) == []


# ------------------------------------------------------------- the checks can fail


def test_the_graph_is_read() -> None:
    edges = graph()
    # function-level imports count: the CLI imports the accountant inside its commands
    assert any(e.source == "privcal.cli.app" and _under(e.target, "privcal.accountant")
               for e in edges)
    # a lazily exported name resolves to the module that defines it
    ledger = _resolve_from("privcal", "Ledger")
    assert _under(ledger, "privcal.storage") and ledger in _modules()
    assert _resolve_from("privcal.accountant", "Accountant").startswith("privcal.accountant.")
    assert len(_modules()) > 50


def test_a_violation_is_caught(tmp_path: Path) -> None:
    bad = (Edge("privcal.calibrators.split", "privcal.storage.models", 3),
           Edge("privcal.storage.engine", "privcal.cli.app", 9),
           Edge("privcal.accountant.privacy.filters", "sqlalchemy", 1))
    found = {rule: violations(bad, *RULES[rule]) for rule in RULES}
    assert found[next(iter(RULES))] == [str(bad[0])]
    assert found["storage knows no calibrator, no accountant, no skin"] == [str(bad[1])]
    assert len(found["the privacy mathematics is pure: no storage, SQL, orchestration or "
                     "calibrator"]) == 1
    # the cycle check follows modules that exist: two real ones, importing each other
    real = sorted(m for m in _modules() if m.startswith("privcal.accountant."))[:2]
    loop = (Edge(real[0], real[1], 1), Edge(real[1], real[0], 1))
    assert cycles(loop, "privcal.accountant") == [sorted(real)]
    long = tmp_path / "long.py"
    long.write_text('"""A long module."""\n' + "x = 1\n" * MAX_LINES)
    reasoned = tmp_path / "reasoned.py"
    reasoned.write_text('"""A long module.\n\nSize: one table of constants.\n"""\n'
                        + "x = 1\n" * MAX_LINES)
    short = tmp_path / "short.py"
    short.write_text('"""A short module."""\n' + "x = 1\n" * (MAX_LINES - 1))
    found_long = oversized(sorted(tmp_path.glob("*.py")), tmp_path)
    assert [s.split(":")[0] for s in found_long] == ["long.py"]
