"""Start-up: what each entry point imports (issue 11). Checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LEDGER = ("privcal.storage", "privcal.accountant.accountant", "sqlalchemy", "alembic")


def _modules(code: str, env: dict[str, str] | None = None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json\n"
         "print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip().splitlines()[-1]
    return set(json.loads(out))


def _cli(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    return _modules(
        f"import sys\nsys.argv = ['privcal', *{args!r}]\nfrom privcal.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code",
        env)


def _loaded(mods: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_client_loads_no_scipy_and_no_ledger() -> None:
    mods = _modules("from privcal.client import fedcp2_qq_message, fedcp_qq_message, krr, "
                    "label_scores")
    assert _loaded(mods, ("scipy", *LEDGER)) == []


def test_amplify_loads_no_ledger_code() -> None:
    mods = _cli(["amplify", "--epsilon0", "1", "--n", "1000", "--delta", "1e-6", "--json"])
    assert _loaded(mods, LEDGER) == []


@pytest.mark.parametrize("extra", [[], ["--epsilon", "1"]])
def test_fed_plan_loads_no_ledger_code(extra: list[str]) -> None:
    mods = _cli(["fed", "plan", "--agents", "20", "--local-n", "1000", "--alpha", "0.1",
                 *extra, "--json"])
    assert _loaded(mods, LEDGER) == []


def test_budget_show_loads_neither_scipy_nor_alembic(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path)}
    env.pop("PRIVCAL_DATABASE_URL", None)
    _cli(["dataset", "create", "d", "--epsilon", "1"], env)
    mods = _cli(["budget", "show", "d"], env)
    assert _loaded(mods, ("scipy", "alembic", "mako")) == []
    assert "sqlalchemy" in mods  # it did read the ledger


def test_head_revision_scan_agrees_with_alembic() -> None:
    from alembic.script import ScriptDirectory

    from privcal.storage import Ledger
    from privcal.storage.schema import _scan_head

    led = Ledger("sqlite://")
    want = ScriptDirectory.from_config(led._alembic_config()).get_current_head()
    assert _scan_head() == want == led.head_revision()
