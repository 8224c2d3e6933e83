"""All SQL lives in privcal/storage (issue 9): read from the source, as a newcomer would.

Outside ``privcal/storage`` and ``privcal/migrations`` no module imports SQLAlchemy at run
time (an import under ``if TYPE_CHECKING:`` is a type hint, not a use) and no string is a SQL
statement; the accountant composes named operations of :class:`privcal.storage.Ledger`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "privcal"
SQL_HOMES = ("storage", "migrations")
#: the start of a SQL statement as this code base writes them (keywords in capitals)
SQL = re.compile(r"^\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|"
                 r"CREATE\s+(TEMP\s+|TEMPORARY\s+)?TABLE\s|COPY\s+\w+|ANALYZE\s|"
                 r"WITH\s+\w+\s+AS\s*\(|ALTER\s+TABLE\s|DROP\s+TABLE\s)")


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] not in SQL_HOMES)


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _runtime_sqlalchemy(path: Path, base: Path = ROOT.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hints = _type_checking_blocks(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(n == "sqlalchemy" or n.startswith("sqlalchemy.") for n in names) \
                and node.lineno not in hints:
            found.append(f"{path.relative_to(base)}:{node.lineno}")
    return found


def _sql_strings(path: Path, base: Path = ROOT.parent) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(base)}:{node.lineno}: {node.value[:50]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and SQL.match(node.value)]


def test_the_scan_sees_the_code_base() -> None:
    mods = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert "accountant/accountant.py" in mods and "accountant/charges.py" in mods
    assert not any(m.startswith(("storage/", "migrations/")) for m in mods)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_sqlalchemy_and_no_sql_outside_storage(path: Path) -> None:
    assert _runtime_sqlalchemy(path) == []
    assert _sql_strings(path) == []


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('from typing import TYPE_CHECKING\n'
                   'if TYPE_CHECKING:\n    from sqlalchemy.orm import Session\n'
                   'import sqlalchemy\n'
                   'Q = "SELECT b.sid FROM privcal_batch b"\n'
                   'W = "select names of files"\n', encoding="utf-8")
    assert _runtime_sqlalchemy(bad, tmp_path) == ["bad.py:4"]
    assert _sql_strings(bad, tmp_path) == ["bad.py:5: 'SELECT b.sid FROM privcal_batch b'"]
