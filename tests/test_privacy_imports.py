"""The pure privacy mathematics (privcal.accountant.privacy) stays pure (issue 9).

It may import from privcal only the cost types and the errors: never the storage layer,
SQLAlchemy, the accountant's orchestration or a calibrator. Checked on the source (every
import statement, including those inside functions) and in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import privcal.accountant.privacy as privacy_pkg

PKG_DIR = Path(privacy_pkg.__file__).parent
MODULES = sorted(PKG_DIR.glob("*.py"))
ALLOWED_PRIVCAL = ("privcal.costs", "privcal.errors", "privcal.accountant.privacy")
FORBIDDEN_LOADED = ("sqlalchemy", "alembic", "privcal.storage", "privcal.calibrators",
                    "privcal.accountant.accountant", "privcal.accountant.sessions")


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            mod = node.module or ""
            # `from privcal.accountant import privacy` names a submodule
            out.extend(f"{mod}.{a.name}" if mod == "privcal.accountant" else mod
                       for a in node.names)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_package_has_its_modules() -> None:
    assert {p.stem for p in MODULES} >= {"__init__", "conversions", "filters", "guarantees",
                                          "shuffle", "shuffle_bounds"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_imports_only_costs_errors_and_itself(path: Path) -> None:
    bad = [m for m in _imports(path)
           if (_under(m, "privcal") and not any(_under(m, a) for a in ALLOWED_PRIVCAL))
           or _under(m, "sqlalchemy") or _under(m, "alembic")]
    assert bad == [], f"{path.name} imports {bad}"


def test_loading_it_loads_no_ledger_and_no_calibrator() -> None:
    names = ", ".join(f"privcal.accountant.privacy.{p.stem}" for p in MODULES
                      if p.stem != "__init__")
    code = (f"import importlib\nfor m in '{names}'.split(', '): importlib.import_module(m)\n"
            "import sys, json\nprint(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    loaded = set(json.loads(out))
    assert "privcal.accountant.privacy.shuffle" in loaded  # the check did import something
    assert sorted(m for m in loaded if any(_under(m, p) for p in FORBIDDEN_LOADED)) == []
