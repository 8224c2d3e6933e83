"""The (ε, δ) filter's stored grid, the migration, and what budgets report (issue 14, items 1–2)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text

from privcal import Accountant, Ledger
from privcal.accountant import privacy as acc
from privcal.accountant.report import audit_report
from privcal.cli import main
from privcal.costs import ZCDP, ApproxDP, PureDP
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage import audit
from privcal.storage.audit import now
from privcal.storage.models import Dataset

ADAPTIVE = "not a guarantee under adaptive use"


def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _dataset_entry(acct: Accountant, name: str) -> dict[str, Any]:
    with acct.ledger.engine.connect() as conn:
        for (payload,) in conn.execute(text("SELECT payload FROM audit_log ORDER BY seq")):
            doc = json.loads(payload)
            if doc["kind"] == "dataset" and doc["data"]["name"] == name:
                return dict(doc["data"])
    raise AssertionError(f"no dataset entry for {name}")


# ------------------------------------------------------------------ the grid
def test_grid_is_fixed_at_creation_stored_logged_and_used(accountant: Accountant) -> None:
    info = accountant.create_dataset("a", approx_epsilon=5, approx_delta=1e-6,
                                     renyi_orders=[8, "2", 4.5])
    assert info.renyi_orders == [Decimal(2), Decimal("4.5"), Decimal(8)]
    assert _dataset_entry(accountant, "a")["renyi_orders"] == ["2", "4.5", "8"]
    accountant.charge("a", ZCDP(rho=0.001))
    got = accountant.budget("a").spent["epsilon"]
    d_each = 1e-6 / 2 / 3
    want = min(a * 0.001 + (math.log(1 / d_each) - math.log(a) + (a - 1) * math.log1p(-1 / a))
               / (a - 1) for a in (2.0, 4.5, 8.0))
    assert Decimal(want) <= got <= Decimal(want) + Decimal(10) ** (Decimal(want).adjusted() - 5)
    assert accountant.budget("a").renyi_orders == [Decimal(2), Decimal("4.5"), Decimal(8)]
    # the default grid, when none is given
    accountant.create_dataset("b", approx_epsilon=1, approx_delta=1e-6)
    assert _dataset_entry(accountant, "b")["renyi_orders"] == [
        acc.dstr(a) for a in acc.DEFAULT_RENYI_ORDERS]
    assert accountant.verify().datasets == 2


def test_grid_edited_in_the_row_fails_verification(accountant: Accountant) -> None:
    accountant.create_dataset("a", approx_epsilon=1, approx_delta=1e-6)
    accountant.verify()
    with accountant.ledger.engine.begin() as conn:
        conn.execute(text("UPDATE datasets SET renyi_orders = :g"), {"g": json.dumps(["2"])})
    with pytest.raises(AuditFailed, match="differs from what the log recorded"):
        accountant.verify()


@pytest.mark.parametrize("kw, match", [
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": [1]}, r"in \(1, 1e6\]"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": [0.5, 2]}, r"in \(1, 1e6\]"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": ["two"]}, "must be a number"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": []}, "at least one"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": [float("inf")]}, r"\(1, 1e6\]"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": list(range(2, 80))}, "at most 64"),
    ({"approx_epsilon": 1, "approx_delta": 1e-6, "renyi_orders": [True]}, "must be a number"),
    ({"rho": 1, "renyi_orders": [2]}, r"only to an \(ε, δ\) budget"),
    ({"epsilon": 1, "renyi_orders": [2]}, r"only to an \(ε, δ\) budget"),
])
def test_bad_grid_is_refused_and_writes_nothing(accountant: Accountant, kw: dict[str, Any],
                                                match: str) -> None:
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match=match):
        accountant.create_dataset("a", **kw)
    assert accountant.datasets() == [] and accountant.ledger.head() == head


def test_cli_renyi_orders(ledger_url: str) -> None:
    assert _cli(ledger_url, "db", "upgrade").exit_code == 0
    r = _cli(ledger_url, "dataset", "create", "a", "--approx-epsilon", "1", "--approx-delta",
             "1e-6", "--renyi-orders", "4,2,16", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["renyi_orders"] == ["2", "4", "16"]
    r = _cli(ledger_url, "dataset", "create", "b", "--rho", "1", "--renyi-orders", "2")
    assert r.exit_code == 1 and "only to an (ε, δ) budget" in r.stderr
    r = _cli(ledger_url, "dataset", "create", "c", "--approx-epsilon", "1", "--approx-delta",
             "1e-6", "--renyi-orders", "2,x")
    assert r.exit_code == 2 and "must be a number" in r.stderr  # usage error: red team 25
    assert [d["name"] for d in json.loads(_cli(ledger_url, "dataset", "list", "--json").stdout)
            ] == ["a"]


# ------------------------------------------------------------------ migration
def _legacy_dataset(acct: Accountant, name: str) -> None:
    """An (ε, δ) dataset as privcal wrote it before migration 0004: no grid in row or log."""
    def tx(s: Any) -> None:
        zero = Decimal(0)
        ds = Dataset(name=name, description="", notion="approx", cap_epsilon=Decimal(1),
                     cap_rho=None, cap_delta=Decimal("1e-6"), reporting_delta=Decimal("1e-6"),
                     subject_epsilon=None, allow_nonprivate=False, created_at=now(),
                     spent_pure_eps=zero, spent_pure_rho=zero, spent_zcdp_rho=zero,
                     spent_approx_eps=zero, spent_approx_delta=zero, charge_count=0)
        s.add(ds)
        s.flush()
        doc = audit.dataset_doc(ds)
        assert "renyi_orders" not in doc  # the pre-0004 document, key for key
        acct.ledger.append_audit(s, "dataset", doc)

    acct.ledger.write(tx)


def test_migrated_dataset_uses_the_frozen_grid_and_still_verifies(accountant: Accountant) -> None:
    _legacy_dataset(accountant, "old")
    accountant.charge("old", ZCDP(rho=0.005))
    assert accountant.budget("old").renyi_orders == list(acc.MIGRATED_RENYI_ORDERS)
    pol = acc.Policy("approx", Decimal(1), None, Decimal("1e-6"), acc.MIGRATED_RENYI_ORDERS)
    assert accountant.budget("old").spent == acc.used(pol, acc.Spent(zcdp_rho=Decimal("0.005")))
    accountant.verify()
    # through a downgrade to before migration 0004 and back, row and log entry still agree
    accountant.ledger.downgrade("0003")
    accountant.ledger.upgrade()
    with accountant.ledger.read() as s:
        assert s.scalars(select(Dataset.renyi_orders)).one() is None
    assert accountant.verify().datasets == 1
    assert accountant.budget("old").spent["epsilon"] > acc.round_up(acc.cks20_epsilon(0.005, 5e-7))


# ------------------------------------------------------------------ reporting
def test_budget_reports_the_cap_guarantee_and_labels_the_realized_spend(
    accountant: Accountant,
) -> None:
    # issue 14's case: a ρ = 1 cap holding pure and zCDP charges. The realized "basic
    # composition of pure ε + CKS20 of zCDP ρ" is not a guarantee; the cap's CKS20 is.
    accountant.create_dataset("z", rho=1, delta=1e-6)
    accountant.charge("z", PureDP(eps=0.5))
    accountant.charge("z", ZCDP(rho=0.01))
    rep = accountant.budget("z")
    assert rep.guarantee.epsilon == acc.round_up(
        math.nextafter(acc.cks20_epsilon(1.0, 1e-6), math.inf))
    assert rep.guarantee.epsilon >= Decimal(acc.cks20_epsilon(1.0, 1e-6))
    assert rep.guarantee.delta == Decimal("0.000001") and "Feldman" in rep.guarantee.rule
    assert rep.spent_dp.epsilon < rep.guarantee.epsilon and ADAPTIVE in rep.spent_dp.note
    assert ADAPTIVE in rep.summary and "guarantee (" in rep.summary

    accountant.create_dataset("p", epsilon=2)
    accountant.charge("p", PureDP(eps=0.25))
    g = accountant.budget("p").guarantee
    assert (g.epsilon, g.delta) == (Decimal(2), Decimal(0)) and "basic composition" in g.rule

    accountant.create_dataset("a", approx_epsilon=3, approx_delta=1e-5)
    g = accountant.budget("a").guarantee
    assert (g.epsilon, g.delta) == (Decimal(3), Decimal("0.00001")) and "Rényi" in g.rule
    assert accountant.budget("z").renyi_orders is None


def test_cli_budget_show_and_audit_report_name_guarantee_and_realized(ledger_url: str) -> None:
    assert _cli(ledger_url, "db", "upgrade").exit_code == 0
    _cli(ledger_url, "dataset", "create", "z", "--rho", "1")
    _cli(ledger_url, "charge", "z", "--epsilon", "0.5")
    doc = json.loads(_cli(ledger_url, "budget", "show", "z", "--json").stdout)
    assert set(doc["guarantee"]) == {"epsilon", "delta", "rule", "statement", "established"}
    assert doc["guarantee"]["established"] is True
    assert ADAPTIVE in doc["spent_dp"]["note"]
    assert {"epsilon", "delta", "rule", "candidates"} <= set(doc["spent_dp"])  # kept
    human = _cli(ledger_url, "budget", "show", "z").stdout
    assert "guarantee" in human and ADAPTIVE in human
    rep = audit_report(Accountant(Ledger(ledger_url)), "z")[0]
    assert "however the requests adapt" in rep.guarantee
    assert all(ADAPTIVE in t.spent_dp_after for t in rep.timeline)
    human = _cli(ledger_url, "audit", "report", "--dataset", "z").stdout
    assert "guarantee:" in human and ADAPTIVE in human


def test_charges_and_an_approx_budget_do_not_load_scipy(tmp_path: Path) -> None:
    # the filter terms are closed form; SciPy is only for a CKS20 optimum (a realized-spend
    # figure of a pure or zCDP dataset, or a zCDP cap's guarantee)
    url = f"sqlite:///{tmp_path}/l.sqlite"
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("p", epsilon=1)
    acct.create_dataset("z", rho=1)
    acct.create_dataset("a", approx_epsilon=1, approx_delta=1e-6)
    code = ("import sys; from privcal.cli import main\n"
            "for args in (['charge', 'p', '--epsilon', '0.1'], ['charge', 'z', '--rho', '0.1'],"
            " ['charge', 'a', '--rho', '0.01'], ['charge', 'a', '--epsilon', '0.1'],"
            " ['budget', 'show', 'a']):\n"
            f"    main(['--db-url', {url!r}, *args], standalone_mode=False)\n"
            "print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_approx_delta_is_reserved_only_with_a_zcdp_group(accountant: Accountant) -> None:
    # an (ε, δ) charge may use the whole δ while there is no zCDP group (e.g. a shuffled
    # release); then no zCDP charge fits, and once there is one, Σδ stays ≤ D/2
    accountant.create_dataset("a", approx_epsilon=2, approx_delta=1e-6)
    accountant.charge("a", ApproxDP(eps=0.5, delta=1e-6))
    from privcal.errors import BudgetRefused

    with pytest.raises(BudgetRefused):
        accountant.charge("a", ZCDP(rho=1e-6))
    accountant.create_dataset("b", approx_epsilon=2, approx_delta=1e-6)
    accountant.charge("b", ZCDP(rho=1e-4))
    with pytest.raises(BudgetRefused):
        accountant.charge("b", ApproxDP(eps=0.1, delta=6e-7))
    accountant.charge("b", ApproxDP(eps=0.1, delta=5e-7))


def test_the_chart_points_without_the_realized_spend(tmp_path: Path) -> None:
    """``audit_report(realized=False)`` (the UI's spend chart): the same budget used after
    every charge as the full report, and no realized (ε, δ) — None, not a stale or empty
    statement."""
    acct = Accountant(Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}"))
    acct.create_dataset("z", rho=1)
    acct.create_dataset("p", epsilon=3)
    for i in range(5):
        acct.charge("z", ZCDP(rho=f"0.0{i + 1}"))
        acct.charge("p", PureDP(epsilon=f"0.{i + 1}"))
    for name in ("z", "p"):
        (full,) = audit_report(acct, name)
        (points,) = audit_report(acct, name, realized=False)
        assert [t.used_after for t in points.timeline] == [t.used_after for t in full.timeline]
        assert len(points.timeline) == 5
        assert all(t.spent_dp_after is None for t in points.timeline)
        assert all(t.spent_dp_after.startswith("spent so far ε=") for t in full.timeline)
    acct.ledger.close()
