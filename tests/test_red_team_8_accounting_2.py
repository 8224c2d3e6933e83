"""Red team 8 (mutation audit m2, second pass): accountant mutants the first pass left alive.

Each test kills a mutant no test killed; every reference figure is derived here (exact
integers, or :mod:`decimal` at 50–60 digits), never by calling the function under test:

- V09: ``audit verify`` compares a dataset's per-subject spends with its logged local-DP
  charges (in units) before the subject-by-subject replay, and says so;
- G04: a dataset's realized spend adds the largest per-subject Σε0 to the central figure;
- N04: an amount with a nonzero digit past the 12th decimal place is refused;
- P02: a running total ≥ 10¹⁸ (what NUMERIC(48, 30) cannot hold) is refused;
- H07 / H09: an amplification bound whose certificate fails is never the result;
- H11: δ(ε) of a truncated clone plan counts the truncated *lower* tail too;
- G09: the realized spend's "pure ε + CKS20 of zCDP ρ" sum allows for its float error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import ROUND_CEILING, Context, Decimal, localcontext
from math import comb
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant import privacy as acc
from privcal.accountant.privacy import shuffle
from privcal.accountant.privacy import shuffle_bounds as sb
from privcal.cli import main
from privcal.costs import ZCDP, PureDP
from privcal.errors import AuditFailed, InvalidInput
from tests import test_red_team_8_accounting as first_pass

_HI = Context(prec=60)


def _state(ledger: Any) -> tuple[Any, ...]:
    """Every row count a dataset, a charge or a subject charge writes, and the audit head."""
    with ledger.engine.connect() as conn:
        counts = tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                       for t in ("datasets", "charges", "audit_log", "audit_queue",
                                 "subject_spend"))
        totals = [tuple(r) for r in conn.execute(text(
            "SELECT name, spent_pure_eps, spent_pure_rho, spent_zcdp_rho, spent_approx_eps, "
            "spent_approx_delta, charge_count FROM datasets ORDER BY id"))]
    return counts, totals, str(ledger.head())


def _ceil6(x: Decimal) -> Decimal:
    """``x`` rounded up to 6 significant digits."""
    return x.quantize(Decimal(1).scaleb(x.adjusted() - 5), rounding=ROUND_CEILING)


# ------------------------------------------------------------------ V09
@pytest.mark.parametrize("edit", ["spent_units + 1", "0"])
def test_an_edited_subject_spend_fails_verify_by_its_total(accountant: Any, ledger_url: str,
                                                           edit: str) -> None:
    """V09: after ε0 = 0.5 charged to subjects 1–3, one subject's stored units raised by
    one (or zeroed: its budget re-opened) no longer add up to the charge's 3 × 0.5 — verify
    (library and ``audit verify``) fails on that total, naming the dataset."""
    accountant.create_dataset("d", rho=1, subject_epsilon=2)
    accountant.charge_subjects("d", "0.5", [1, 2, 3])
    led = accountant.ledger
    assert led.verify().charges == 1
    assert CliRunner().invoke(main, ["--db-url", ledger_url, "audit", "verify"]).exit_code == 0
    with led.engine.begin() as conn:
        sid = conn.execute(text("SELECT min(subject) FROM subject_spend")).scalar_one()
        conn.execute(text(f"UPDATE subject_spend SET spent_units = {edit} "
                          "WHERE subject = :s"), {"s": sid})
    msg = ("dataset 1 ('d'): per-subject spends do not add up to its logged local-DP charges "
           "(rows edited)")
    with pytest.raises(AuditFailed) as exc:
        led.verify()
    assert str(exc.value) == msg
    r = CliRunner().invoke(main, ["--db-url", ledger_url, "audit", "verify"])
    assert r.exit_code == 4 and msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ G04
def test_realized_spend_adds_the_largest_subject_spend(accountant: Any) -> None:
    """G04: on a pure-ε dataset, a central ε 0.25 and subject spends 0.5 + 0.75 (subject 1)
    and 0.5 (subject 2): the realized ε is 0.25 + 1.25 = 1.5 — the worst subject's Σε0
    added to the central figure (basic composition), δ 0."""
    accountant.create_dataset("d", epsilon=1, subject_epsilon=2)
    accountant.charge("d", PureDP("0.25"))
    accountant.charge_subjects("d", "0.5", [1, 2])
    accountant.charge_subjects("d", "0.75", [1])
    b = accountant.budget("d")
    central, worst = Decimal("0.25"), Decimal("0.5") + Decimal("0.75")
    assert b.spent_dp.central_epsilon == central
    assert b.spent_dp.subject_max == worst
    assert (b.spent_dp.epsilon, b.spent_dp.delta) == (central + worst, Decimal(0))
    assert "largest per-subject Σε0 = 1.25" in b.spent_dp.rule
    # the figure with no central charge is the worst subject's alone
    accountant.create_dataset("e", epsilon=1, subject_epsilon=2)
    accountant.charge_subjects("e", "0.5", [7])
    assert accountant.budget("e").spent_dp.epsilon == Decimal("0.5")


# ------------------------------------------------------------------ N04
_TOO_FINE = ["0.0000000000001", "1.0000000000005", "0.1234567890123", "2.000000000000000001",
             1e-13, "1E-13"]


@pytest.mark.parametrize("value", _TOO_FINE)
def test_an_amount_past_twelve_places_is_refused(accountant: Any, value: Any) -> None:
    """N04: an amount whose value has a nonzero digit past the 12th decimal place — as a
    cap (each kind), a reporting δ, a subject cap or an ε0 charged to subjects — is an
    InvalidInput naming the rule, and nothing is written."""
    accountant.create_dataset("s", rho=1, subject_epsilon=5)
    before = _state(accountant.ledger)
    cases: list[dict[str, Any]] = [
        {"epsilon": value}, {"rho": value}, {"approx_epsilon": value, "approx_delta": "1e-6"},
        {"rho": 1, "subject_epsilon": value}]
    if Decimal(str(value)) < 1:  # a δ of 1 or more is refused as such first
        cases += [{"approx_epsilon": 1, "approx_delta": value}, {"rho": 1, "delta": value}]
    for kwargs in cases:
        with pytest.raises(InvalidInput, match="has more than 12 decimal places"):
            accountant.create_dataset("d", **kwargs)
    with pytest.raises(InvalidInput, match="ε0 has more than 12 decimal places"):
        accountant.charge_subjects("s", value, [1, 2])
    assert _state(accountant.ledger) == before


def test_twelve_places_and_trailing_zeros_are_accepted(accountant: Any) -> None:
    """N04's boundary: 12 places, or more digits that are all zeros, are the same amount."""
    accountant.create_dataset("a", epsilon="0.000000000001")
    accountant.create_dataset("b", epsilon="0.1000000000000000")
    assert accountant.dataset("b").cap == {"epsilon": Decimal("0.1")}


# ------------------------------------------------------------------ P02
def test_a_running_total_of_1e18_is_refused(accountant: Any) -> None:
    """P02: a pure ε of 1414213562.373096 adds ε²/2 ≈ 1.0000000000000006e18 to the pure-ρ
    total: past what the ledger stores (< 10¹⁸; PostgreSQL's NUMERIC(48, 30) cannot hold
    it), refused with the rule, nothing written. One step lower (ε²/2 just below 10¹⁸) is
    charged and stored exactly."""
    below, above = Decimal("1414213562.373095"), Decimal("1414213562.373096")
    with localcontext(_HI):
        assert below * below / 2 < Decimal("1e18") <= above * above / 2
    accountant.create_dataset("d", epsilon="1e10")
    before = _state(accountant.ledger)
    with localcontext(_HI):
        total = str(above * above / 2)  # 1000000000000001345.197552312608
    with pytest.raises(InvalidInput, match=rf"the cost is too large: a running total of the "
                                           rf"dataset would be {re.escape(total)}, past what "
                                           r"the ledger stores \(< 1e18\)"):
        accountant.charge("d", PureDP(above))
    assert _state(accountant.ledger) == before
    accountant.charge("d", PureDP(below))
    with accountant.ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT spent_pure_rho FROM datasets")).scalar_one()
    with localcontext(_HI):
        assert Decimal(str(stored)) == below * below / 2
    accountant.ledger.verify()


# ------------------------------------------------------------------ H07 / H09
@pytest.fixture
def wrong_closed_form(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """FMT21's closed form replaced by a figure far below the truth (ε = 0.001), which its
    certificate (the exact clone divergence at that ε) must reject; the amplify cache is
    cleared around it."""
    shuffle._amplify.cache_clear()
    monkeypatch.setattr(sb, "closed_form_eps", lambda eps0, n, delta: 0.001)
    yield
    monkeypatch.undo()
    shuffle._amplify.cache_clear()


def test_an_uncertified_closed_form_is_never_the_result(wrong_closed_form: None) -> None:
    """H07 / H09: with the closed form wrong, its row says "not certified" and the result
    is the clone bound (ε0 = 1, n = 10⁴, δ = 1e-6), its δ(ε) ≤ δ."""
    r = shuffle.amplify(1.0, 10_000, 1e-6, "generic")
    clone = next(b for b in r.bounds if b.name == "clone")
    assert clone.certified and clone.eps is not None
    assert (r.bound, r.eps, r.amplified) == ("clone", clone.eps, True)
    assert r.delta_at_eps <= 1e-6 and r.eps > 0.001
    cf = next(b for b in r.bounds if b.name == "closed-form")
    assert cf.eps is not None and cf.eps < 0.0011 and not cf.certified
    assert cf.delta_at_eps is not None and cf.delta_at_eps > 1e-6
    assert (cf.reason or "").startswith("not certified")
    cost, _ = shuffle.amplified_cost(1.0, 10_000, 1e-6, "generic")
    assert cost is not None and cost.eps == Decimal(str(clone.eps))


def test_with_nothing_certified_the_result_is_eps0(wrong_closed_form: None) -> None:
    """H07 / H09: ε0 = 1, n = 2, δ = 1e-10: no honest bound amplifies (the clone bound
    rounds to ε0) and the wrong closed form is not certified, so the result is ε0 itself,
    δ-free (no amplification)."""
    r = shuffle.amplify(1.0, 2, 1e-10, "generic")
    assert (r.bound, r.eps, r.amplified, r.delta_at_eps) == (shuffle.BOUND_NONE, 1.0, False,
                                                              0.0)
    cf = next(b for b in r.bounds if b.name == "closed-form")
    assert cf.eps is not None and cf.eps < 0.0011 and not cf.certified
    assert shuffle.amplified_cost(1.0, 2, 1e-10, "generic")[0] is None


# ------------------------------------------------------------------ H11
def _clone_delta_exact(eps: float, eps0: float, n: int) -> Decimal:
    """D_{e^ε}(P‖Q) of FMT21's clone pair, summed over every outcome at 50 digits.

    The victim lands in A w.p. pa = e^ε0/(e^ε0+1) (in B otherwise) under P, swapped under
    Q; each of the n − 1 others is a clone w.p. p_c = e^−ε0, landing in A or B w.p. ½. An
    outcome is (C, A): P = Bin(n−1, p_c)(C)·[pa·Bin(C, ½)(A−1) + qa·Bin(C, ½)(A)]."""
    with localcontext(Context(prec=50)):
        big_e, e = Decimal(eps).exp(), Decimal(eps0).exp()
        pa, qa, p_c = e / (e + 1), 1 / (e + 1), (-Decimal(eps0)).exp()
        total = Decimal(0)
        for c in range(n):
            weight = comb(n - 1, c) * p_c ** c * (1 - p_c) ** (n - 1 - c)

            def half(k: int, c: int = c) -> Decimal:
                return Decimal(comb(c, k)) / 2 ** c if 0 <= k <= c else Decimal(0)

            for a in range(c + 2):
                d = (pa * half(a - 1) + qa * half(a)) - big_e * (qa * half(a - 1) + pa * half(a))
                total += weight * max(d, Decimal(0))
        return total


@pytest.mark.parametrize(("eps0", "n", "tau"), [(0.05, 30, 0.5), (0.2, 30, 1.0),
                                                (1.0, 40, 1.0)])
def test_truncated_clone_delta_is_never_below_the_exact_delta(eps0: float, n: int,
                                                              tau: float) -> None:
    """H11: a plan truncated to a narrow window (τ up to 1) leaves out the clone counts of
    both tails; δ(ε) adds their mass back, so it is never below the exact divergence. In
    the first case all of it is the lower tail (few clones, where the divergence is
    largest: 1.5e-6 of δ(0.001) comes from there); the others cut both tails."""
    plan = sb.clone_plan(eps0, n, tau, stronger=False)
    assert plan.c[0] > 0  # the lower tail is truncated
    for eps in (0.001, 0.01, 0.05, 0.2):
        assert Decimal(sb.pair_delta(eps, plan)) >= _clone_delta_exact(eps, eps0, n), eps


# ------------------------------------------------------------------ G09
def _cks20_exact(rho: Decimal, delta: Decimal) -> Decimal:
    """inf over a > 1 of the CKS20 objective at 60 digits (the first pass's reference,
    :func:`tests.test_red_team_8_accounting._cks20_exact`, at these decimals)."""
    return first_pass._cks20_exact(str(rho), str(delta))


def test_pure_plus_cks20_sum_is_never_below_its_exact_value() -> None:
    """G09: pure ε ≈ 1000 plus zCDP ρ = 1e-8 (CKS20 ≈ 3.4559e-4 at δ 1e-6), the pure ε
    chosen so that the exact sum lies 1e-25 above a 6-digit boundary (a step of 0.01 here).
    float(ε) may be up to 5.7e-14 below ε, more than CKS20's own allowance (≈ 1.5e-15): the
    sum's relative allowance must carry the reported figure one unit above the boundary."""
    pol, rho, rd = acc.Policy("zcdp", rho=Decimal(5)), Decimal("1e-8"), Decimal("1e-6")
    cks = _cks20_exact(rho, rd)
    assert Decimal("3.4558e-4") < cks < Decimal("3.4559e-4")
    rule = "basic composition of pure ε + CKS20 of zCDP ρ"
    below = 0
    for k in range(40):
        target = Decimal("1000.01") + Decimal(k) / 100  # a 6-digit boundary
        with localcontext(_HI):
            pure = target - cks + Decimal("1e-25")
            exact = pure + cks
        assert target < exact < target + Decimal("1e-20") and _ceil6(exact) > target
        s = acc.spent_epsilon(pol, acc.Spent().add(PureDP(eps=pure)).add(ZCDP(rho=rho)), rd)
        assert s.rule == rule
        assert Decimal(s.candidates[rule]) >= exact and s.epsilon >= exact, (k, s.epsilon)
        # the float sum alone, rounded up, lands on the boundary: the case needing the slack
        below += Decimal(float(pure) + acc.cks20_epsilon(float(rho), float(rd))) <= target
    assert below > 0
