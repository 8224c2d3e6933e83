"""Red team, session 9: inputs that reached a charge unchecked. Each test is an attack that
used to record a false guarantee or overspend a budget; it passes when the attack fails
(refused with a one-line error and nothing written, or charged as it should be).

- a caller's own decimal context (``getcontext().prec``) changed the per-subject unit
  conversion: a cap of 10.999999999999 became 11 × 10¹² units and a subject spent 11;
- a local-DP calibration without subject ids keyed each row by its row number: one person,
  row 5 in one run and row 4 000 in the next, spent twice the cap with every key within it;
- ``Accountant.run`` of a federated method with subject ids other than its agents charged
  one subject once for several agents' messages;
- a cost built without validation (pydantic's ``model_construct``) with a negative amount
  was charged as a refund of the budget.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant import calibration
from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput
from privcal.cli import main
from privcal.costs import ZCDP, LocalDP, PureDP
from privcal.errors import AuditFailed, BudgetRefused, InvalidInput
from privcal.storage.models import MAX_SUBJECT_UNITS, cap_units, spend_units, units_eps
from tests.seeded import Seeded


def _written(acct: Any) -> tuple[int, int, int, int]:
    """Charges, audit entries, releases and per-subject spend rows in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())  # type: ignore[return-value]
                     for t in ("charges", "audit_log", "releases", "subject_spend"))


# --------------------------------------------------------------------- decimal context
def test_units_do_not_depend_on_the_callers_decimal_context() -> None:
    with decimal.localcontext() as ctx:
        ctx.prec = 13  # an embedding application's own context
        assert cap_units(Decimal("10.999999999999")) == 10_999_999_999_999
        assert spend_units(Decimal("5.5")) == 5_500_000_000_000
        assert units_eps(10_999_999_999_999) == Decimal("10.999999999999")
        ctx.prec = 3
        assert cap_units(Decimal("123456.000000000001")) == 123_456_000_000_000_001
    # the directions: a spend is rounded up, a cap down (amounts finer than a unit)
    assert spend_units(Decimal("1e-13")) == 1 and cap_units(Decimal("1e-13")) == 0
    assert spend_units(Decimal("2.0000000000001")) == 2_000_000_000_001
    assert cap_units(Decimal("2.0000000000009")) == 2_000_000_000_000


def test_a_low_precision_context_does_not_raise_the_subject_cap(accountant: Any) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon="10.999999999999")
    with decimal.localcontext() as ctx:
        ctx.prec = 13
        first = accountant.charge_subjects("d", "5.5", ["alice"])
        with pytest.raises(BudgetRefused, match="1 over cap"):  # 11 > 10.999999999999
            accountant.charge_subjects("d", "5.5", ["alice"])
    assert first.accepted == 1
    assert accountant.subject_spend("d", "alice") == Decimal("5.5")
    assert accountant.verify().entries > 0


# ------------------------------------------------------------------ local-DP subject ids
def _labels(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(4), size=n), rng.integers(0, 4, size=n)


@pytest.mark.parametrize("method", ["ldp-label", "ldp-score"])
def test_local_dp_without_subject_ids_is_refused(accountant: Any, method: str) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=2)
    probs, y = _labels(3000)
    data = ({"probs": probs, "labels": y} if method == "ldp-label"
            else {"scores": np.random.default_rng(2).uniform(size=3000)})
    before = _written(accountant)
    with pytest.raises(InvalidInput, match="give the subject id of every row"):
        accountant.calibrate(method, dataset="d", alpha=0.1, epsilon=2, **data)
    with pytest.raises(InvalidInput, match="give the subject id of every row"):
        calibration.dry_run(accountant, method, {"alpha": 0.1, "epsilon": 2}, dataset="d",
                            **data)
    assert _written(accountant) == before
    # with the ids, one person keeps one key across runs, in any row
    users = [f"user-{i}" for i in range(3000)]
    accountant.calibrate(method, dataset="d", alpha=0.1, epsilon=2, subjects=users,
                         rng=Seeded(0), **data)
    assert accountant.subject_spend("d", "user-5") == 2
    moved = users[::-1]  # the same people, in another order: each is at the cap
    if method == "ldp-label":
        with pytest.raises(BudgetRefused, match="subjects"):
            accountant.calibrate(method, dataset="d", alpha=0.1, epsilon=2, subjects=moved,
                                 **data)
        assert accountant.subject_spend("d", "user-5") == 2


def test_cli_local_dp_without_subjects_is_a_one_line_error(ledger_url: str,
                                                           tmp_path: Any) -> None:
    run = CliRunner()
    db = ["--db-url", ledger_url]
    assert run.invoke(main, [*db, "db", "upgrade"]).exit_code == 0
    assert run.invoke(main, [*db, "dataset", "create", "u", "--epsilon", "1",
                             "--subject-epsilon", "2"]).exit_code == 0
    probs, y = _labels(2000)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "y.npy", y)
    res = run.invoke(main, [*db, "calibrate", "ldp-label", "--dataset", "u", "--alpha", "0.1",
                            "--epsilon", "2", "--probs", str(tmp_path / "p.npy"), "--labels",
                            str(tmp_path / "y.npy")])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ldp-label is local DP")
    assert "--subjects" in lines[0]
    shown = run.invoke(main, [*db, "budget", "show", "u", "--json"])
    assert '"charges": 0' in shown.output


# ------------------------------------------------------------- federated subjects = agents
def test_a_federated_run_charges_its_agents_not_other_subject_ids(accountant: Any) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=10)
    cal = registry.get("fedcp2-qq").calibrator
    params = {"alpha": 0.1, "epsilon": 10, "bins": 100}
    scores = np.random.default_rng(0).uniform(size=1000)
    agents = np.repeat([f"agent{j}" for j in range(5)], 200)
    before = _written(accountant)
    # one person behind the five agents' data: five messages for one charge of ε0
    with pytest.raises(InvalidInput, match="its subjects are its agents"):
        accountant.run(cal, params, CalibrationInput(scores=scores, agents=agents,
                                                     subjects=np.array(["alice"] * 1000)),
                       dataset="d")
    assert _written(accountant) == before
    assert accountant.subject_spend("d", "alice") == 0
    # without subject ids (or with the agent ids) each agent is charged once
    rel = accountant.run(cal, params, CalibrationInput(scores=scores, agents=agents),
                         dataset="d", rng=Seeded(0))
    assert rel.shape["group_sizes"] == [200] * 5
    assert [accountant.subject_spend("d", f"agent{j}") for j in range(5)] == [10] * 5
    with pytest.raises(BudgetRefused, match="subjects"):  # every agent is at its cap now
        accountant.run(cal, params, CalibrationInput(scores=scores, agents=agents,
                                                     subjects=agents), dataset="d")


# -------------------------------------------------------------------- unvalidated costs
@pytest.mark.parametrize("cost", [
    ZCDP.model_construct(rho=Decimal("-0.5")),
    ZCDP.model_construct(rho=Decimal(0)),
    PureDP.model_construct(eps=Decimal("-1")),
    PureDP.model_construct(eps=0.5),
    ZCDP.model_construct(rho="0.1"),
], ids=["negative-rho", "zero-rho", "negative-eps", "float-eps", "text-rho"])
def test_a_cost_built_without_validation_is_refused(accountant: Any, cost: Any) -> None:
    accountant.create_dataset("z", rho=1)
    accountant.create_dataset("p", epsilon=1)
    name = "z" if isinstance(cost, ZCDP) else "p"
    accountant.charge(name, ZCDP(rho="0.9") if name == "z" else PureDP(eps="0.9"))
    before = (_written(accountant), accountant.budget(name).remaining)
    with pytest.raises(InvalidInput, match=r"must be|Decimal"):
        accountant.charge(name, cost)
    assert (_written(accountant), accountant.budget(name).remaining) == before


def test_a_negative_local_cost_built_without_validation_is_refused(accountant: Any) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=1)
    accountant.charge_subjects("d", "1", ["alice"])
    before = _written(accountant)
    with pytest.raises(InvalidInput, match="ε0 must be > 0"):
        accountant.charge_subjects("d", LocalDP.model_construct(eps0=Decimal("-1")), ["alice"])
    assert _written(accountant) == before
    assert accountant.subject_spend("d", "alice") == 1


# ------------------------------------------------------------------- a cap past 64 bits
def test_a_subject_cap_past_64_bit_units_is_refused_or_lowered(accountant: Any) -> None:
    """A cap of 10⁷ ε is 10¹⁹ units, past a 64-bit spend: a charge of it raised a bare
    OverflowError. A new dataset's cap is at most 10⁶; one stored before is lowered to it
    (a cap is never raised), and charges work."""
    with pytest.raises(InvalidInput, match="subject ε must be at most 1000000"):
        accountant.create_dataset("big", epsilon=1, subject_epsilon="99999999999999")
    assert cap_units(Decimal("99999999999999")) == MAX_SUBJECT_UNITS
    accountant.create_dataset("old", epsilon=1, subject_epsilon=1_000_000)
    with accountant.ledger.engine.begin() as conn:  # as a ledger of an earlier version held it
        conn.execute(text("UPDATE datasets SET subject_epsilon = '99999999999999' "
                          "WHERE name = 'old'"))
    r = accountant.charge_subjects("old", "600000", ["s"])
    assert r.accepted == 1
    with pytest.raises(BudgetRefused, match="1 over cap"):
        accountant.charge_subjects("old", "600000", ["s"])  # 1.2e6 > the lowered 1e6
    assert accountant.subject_spend("old", "s") == 600000


def test_a_total_past_what_the_ledger_stores_is_a_one_line_error(accountant: Any) -> None:
    """A pure ε of 10¹⁰ is tracked as ρ = ε²/2 = 5 × 10¹⁹, past NUMERIC(48, 30): PostgreSQL
    raised a bare numeric overflow (SQLite stored it). Both now refuse, writing nothing."""
    accountant.create_dataset("p", epsilon="100000000000000")
    accountant.charge("p", PureDP(eps="1000000"))  # ρ 5e11: fine
    before = _written(accountant)
    with pytest.raises(InvalidInput, match=r"too large.*past what the ledger stores"):
        accountant.charge("p", PureDP(eps="10000000000"))
    assert _written(accountant) == before
    assert accountant.budget("p").spent == {"epsilon": Decimal("1000000")}


# ------------------------------------------------------------- subject ids edited at rest
@pytest.mark.parametrize("edit", ["upper-case", "digits moved", "space"])
def test_an_edited_stored_subject_fails_verification(accountant: Any, edit: str) -> None:
    """A stored pseudonym is looked up by its exact text; the verifier read it with
    ``bytes.fromhex``, which ignores case and spaces, and only checked the total length:
    an upper-cased id (or two ids with hex digits moved between them) still verified while
    the subjects' spends read as 0 — and the next run charged them past their cap."""
    accountant.create_dataset("d", epsilon=1, subject_epsilon=5)
    accountant.charge_subjects("d", "5", ["u0", "u1"])
    assert accountant.verify().entries > 0
    with accountant.ledger.engine.begin() as conn:
        a, b = sorted(conn.execute(text("SELECT subject FROM subject_spend")).scalars())
        if edit == "upper-case":
            conn.execute(text("UPDATE subject_spend SET subject = :u WHERE subject = :s"),
                         {"u": a.upper(), "s": a})
        elif edit == "digits moved":  # in row order, the joined hex is unchanged
            conn.execute(text("UPDATE subject_spend SET subject = :n WHERE subject = :s"),
                         {"n": a[:62], "s": a})
            conn.execute(text("UPDATE subject_spend SET subject = :n WHERE subject = :s"),
                         {"n": a[62:] + b, "s": b})
        else:
            conn.execute(text("UPDATE subject_spend SET subject = :n WHERE subject = :s"),
                         {"n": a[:32] + " " + a[32:], "s": a})
    assert accountant.subject_spend("d", "u0") + accountant.subject_spend("d", "u1") < 10
    with pytest.raises(AuditFailed, match="not a pseudonym"):
        accountant.verify()
