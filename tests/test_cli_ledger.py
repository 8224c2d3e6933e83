"""The ledger CLI: the issue's acceptance scenario, exit codes, --json, tampering, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant import privacy as acc
from privcal.cli import main
from privcal.storage import Ledger


def run(url: str, *args: str) -> Any:
    """Invoke the CLI; stderr is kept apart so --json output can be parsed."""
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def js(result: Any) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def url(ledger_url: str) -> str:
    assert run(ledger_url, "db", "upgrade").exit_code == 0
    return ledger_url


def _state(url: str) -> tuple[Any, ...]:
    with Ledger(url).engine.connect() as conn:
        counts = tuple(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                       for t in ("datasets", "charges", "releases", "audit_log"))
    return (*counts, js(run(url, "audit", "head", "--json"))["head"])


def test_acceptance_rho_budget(url: str) -> None:
    assert run(url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    for _ in range(3):
        assert run(url, "charge", "d", "--rho", "0.3").exit_code == 0
    before = _state(url)
    r = run(url, "charge", "d", "--rho", "0.3")
    assert r.exit_code == 3
    assert r.stderr.startswith("error: budget refused") and r.stderr.count("\n") == 1
    assert "remaining rho=0.1" in r.stderr
    assert _state(url) == before
    b = js(run(url, "budget", "show", "d", "--json"))
    assert b["spent"] == {"rho": "0.9"} and b["remaining"] == {"rho": "0.1"}
    assert b["spent_dp"]["epsilon"] == acc.dstr(acc.round_up(acc.cks20_epsilon(0.9, 1e-6)))
    assert b["spent_dp"]["delta"] == "0.000001" and "CKS20" in b["spent_dp"]["rule"]
    assert Decimal(b["spent_dp"]["epsilon"]) >= Decimal(acc.cks20_epsilon(0.9, 1e-6))
    v = js(run(url, "audit", "verify", "--json"))
    assert v["ok"] and v["entries"] == 4 and v["head"] == before[-1]


def test_idempotent_charge_cli(url: str) -> None:
    run(url, "dataset", "create", "d", "--epsilon", "2")
    a = js(run(url, "charge", "d", "--epsilon", "0.5", "--idempotency-key", "k1", "--json"))
    b = js(run(url, "charge", "d", "--epsilon", "0.5", "--idempotency-key", "k1", "--json"))
    assert a["charge_id"] == b["charge_id"] and b["replayed"] and not a["replayed"]
    assert js(run(url, "budget", "show", "d", "--json"))["charges"] == 1


@pytest.mark.parametrize("args", [
    ("charge", "d", "--epsilon", "-1"),
    ("charge", "d", "--approx-epsilon", "1", "--approx-delta", "1"),
    ("charge", "d", "--approx-epsilon", "1", "--approx-delta", "2"),
    ("charge", "d", "--epsilon", "1", "--rho", "1"),
    ("charge", "nope", "--epsilon", "1"),
    ("dataset", "create", "d", "--epsilon", "1"),  # duplicate name
    ("dataset", "create", "e", "--epsilon", "-1"),
    ("dataset", "create", "e", "--rho", "1", "--delta", "1"),
    ("dataset", "create", "e", "--approx-epsilon", "1", "--approx-delta", "1.0"),
    ("budget", "show", "nope"),
    ("release", "show", "42"),
])
def test_bad_input_one_line_error_nothing_changed(url: str, args: tuple[str, ...]) -> None:
    run(url, "dataset", "create", "d", "--epsilon", "5")
    before = _state(url)
    r = run(url, *args)
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert r.stdout == ""
    assert _state(url) == before


@pytest.mark.parametrize("args", [
    ("charge", "d", "--epsilon", "abc"),
    ("charge", "d", "--rho", "1e400x"),
    ("charge", "d", "--epsilon", "inf"),
    ("dataset", "create", "e", "--rho", "NaN"),
    ("dataset", "create", "e", "--epsilon", "1", "--delta", "one"),
    ("dataset", "create", "e", "--rho", "1", "--subject-epsilon", ""),
])
def test_malformed_amount_is_a_usage_error(url: str, args: tuple[str, ...]) -> None:
    """Issue 15: amounts are parsed by a click decimal type; a malformed one exits 2 (usage)."""
    run(url, "dataset", "create", "d", "--epsilon", "5")
    before = _state(url)
    r = run(url, *args)
    assert r.exit_code == 2, r.output
    assert "not a" in r.stderr and r.stdout == ""
    assert _state(url) == before


def test_malformed_url_is_one_line() -> None:
    r = CliRunner().invoke(main, ["--db-url", "definitely not a url", "dataset", "list"])
    assert r.exit_code == 1 and r.stderr.startswith("error: malformed ledger URL")
    assert r.stderr.count("\n") == 1


def test_stale_schema_exit_5(ledger_url: str) -> None:
    if ledger_url.startswith("sqlite"):
        # issue 15: a new SQLite file is created on first use; an existing one of an older
        # schema is what is refused (PostgreSQL: an empty database is refused too)
        old = Ledger(ledger_url)
        old.upgrade("0001")
        old.close()
    r = run(ledger_url, "dataset", "list")
    assert r.exit_code == 5 and "privcal db upgrade" in r.stderr
    assert run(ledger_url, "db", "check").exit_code == 5
    assert run(ledger_url, "db", "upgrade").exit_code == 0
    assert run(ledger_url, "db", "check").exit_code == 0
    cur = js(run(ledger_url, "db", "current", "--json"))
    assert cur["revision"] == cur["head"]


def test_tampering_detected_by_cli(url: str) -> None:
    run(url, "dataset", "create", "d", "--rho", "1")
    run(url, "charge", "d", "--rho", "0.1")
    run(url, "charge", "d", "--rho", "0.2")
    head = js(run(url, "audit", "head", "--json"))["head"]
    with Ledger(url).engine.begin() as conn:
        conn.execute(text("UPDATE charges SET rho = '0.02' WHERE id = 2"))
    r = run(url, "audit", "verify")
    assert r.exit_code == 4 and "audit entry 3" in r.stderr
    with Ledger(url).engine.begin() as conn:
        conn.execute(text("UPDATE charges SET rho = '0.2' WHERE id = 2"))
    assert run(url, "audit", "verify", "--expect-head", head).exit_code == 0
    bogus = head.split(":")[0] + ":" + "0" * 64
    r = run(url, "audit", "verify", "--expect-head", bogus)
    assert r.exit_code == 4 and "audit entry 3: hash differs" in r.stderr


def test_listing_and_showing(url: str) -> None:
    run(url, "dataset", "create", "d", "--approx-epsilon", "1", "--approx-delta", "1e-6",
        "--subject-epsilon", "2", "--allow-nonprivate", "--description", "demo")
    ds = js(run(url, "dataset", "list", "--json"))
    assert [d["name"] for d in ds] == ["d"] and ds[0]["allow_nonprivate"]
    shown = js(run(url, "dataset", "show", "d", "--json"))
    assert shown["cap"] == {"epsilon": "1", "delta": "0.000001"}
    assert shown["subject_epsilon"] == "2" and shown["description"] == "demo"
    human = run(url, "dataset", "list")
    assert human.exit_code == 0 and "d" in human.stdout
    assert js(run(url, "release", "list", "--json")) == []
    b = js(run(url, "budget", "show", "d", "--subjects", "--subject", "x", "--json"))
    assert b["subject_summary"]["subjects"] == 0 and b["subject"]["spent"] == "0"


def test_real_subprocess(tmp_path: Any) -> None:
    """The installed console script, end to end, on the embedded default ledger."""
    env = {**os.environ, "PRIVCAL_HOME": str(tmp_path)}
    env.pop("PRIVCAL_DATABASE_URL", None)
    # the console script installed next to this interpreter (pip install -e . / the CI venv)
    script = Path(sys.executable).parent / "privcal"
    assert script.exists(), f"privcal is not installed next to {sys.executable}"
    exe = [str(script)]

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*exe, *args], env=env, capture_output=True, text=True, timeout=120)

    assert call("dataset", "create", "d", "--rho", "0.5").returncode == 0
    assert (tmp_path / "privcal.sqlite").exists()
    assert call("charge", "d", "--rho", "0.3").returncode == 0
    refused = call("charge", "d", "--rho", "0.3")
    assert refused.returncode == 3 and refused.stdout == ""
    assert refused.stderr.startswith("error: budget refused")
    out = call("budget", "show", "d", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["spent"] == {"rho": "0.3"}
