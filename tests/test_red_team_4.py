"""Red team, session 10: the central calibrators and what a calibration run records. Each
test is an attack that used to record a false guarantee, record a mechanism that did not
run, or spend budget for no release; it passes when the attack fails (refused with a
one-line error and nothing written, or recorded truthfully).

- a Mondrian group named ``a: alpha=0.1`` overwrote group ``a``'s level-0.1 bound in the
  release's flat ``details`` (a recorded lower bound of 1.0 for a threshold covering 0.94);
- P-COQS's statement named two of the three conditions of its upper bound (scores in the
  search's final interval lift the coverage above it: 0.97 against a recorded 0.80);
- a caller's subclass of a built-in, with the built-in's name, was recorded as privcal's
  method (``audit verify`` recomputed the built-in's guarantee and passed);
- a one-row Mondrian group, a one-row ``Accountant.run``, an ExponQ grid that overflows or
  does not increase, and parameters built without validation were checked only once charged;
- the exact exponential-mechanism sampler evaluated exp(−t) in one piece, which underflows to
  0 from t ≈ 2.3·10⁶: a grid point with probability 0 under one dataset and > 0 under its
  neighbour (pure ε-DP broken, at probability ≈ 10^−10⁶);
- a dataset's guarantee ("everything released … is (ε, δ)-DP") left out its local-DP
  releases, which are charged per subject, never to the central cap;
- below δ ≈ 2e−12 the shuffle bound's window of clone counts spanned all of [0, n].
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant.releases import record_release
from privcal.calibrators.base import CalibrationInput, CalibrationResult, DataShape
from privcal.calibrators.exponq import ExponQParams
from privcal.calibrators.mechanisms import exponential as ex
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.split import SplitConformal
from privcal.costs import ZCDP
from privcal.errors import InvalidInput


def _written(acct: Any) -> tuple[int, int, int]:
    """Charges, audit entries and releases in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())  # type: ignore[return-value]
                     for t in ("charges", "audit_log", "releases"))


# ---------------------------------------------------------------- Mondrian details keys
def test_a_group_name_that_collides_with_another_groups_level_is_refused(accountant: Any
                                                                         ) -> None:
    acct = accountant
    acct.create_dataset("d", rho=10)
    scores = np.random.default_rng(0).random(401)
    groups = ["a"] * 399 + ["a: alpha=0.1"] * 2
    before = _written(acct)
    with pytest.raises(InvalidInput, match=r"same name .*group a: alpha=0\.1"):
        acct.calibrate("pcoqs", {"alpha": [0.1, 0.2], "rho": 1}, dataset="d", scores=scores,
                       groups=groups, public_groups=True)
    assert _written(acct) == before
    # distinct names record every group's own bound: group a's level 0.1 is its own
    rel = acct.calibrate("pcoqs", {"alpha": [0.1, 0.2], "rho": 1}, dataset="d",
                         scores=scores, groups=["a"] * 399 + ["b"] * 2, public_groups=True)
    row = next(r for r in rel.thresholds() if r["group"] == "a" and r["alpha"] == 0.1)
    inner = PCOQS().guarantee(PCOQSParams(alpha=0.1, rho=1), DataShape(n=399))
    assert row["lower"] == inner.lower < 1


def test_levels_equal_to_six_digits_are_refused(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", rho=10)
    before = _written(acct)
    with pytest.raises(InvalidInput, match="same name"):
        acct.calibrate("pcoqs", {"alpha": [0.1, 0.1000001], "rho": 1}, dataset="d",
                       scores=np.random.default_rng(1).random(300))
    assert _written(acct) == before


# ---------------------------------------------------------------- P-COQS's upper bound
def test_pcoqs_statement_names_every_condition_of_its_upper_bound(accountant: Any) -> None:
    """Scores inside the final interval (tol = 0.25, uniform scores): the coverage is far
    above the recorded upper bound, so the statement must say that bound does not hold
    then; a 2.1.0 release (its statement without it) still verifies."""
    cal = PCOQS()
    p, shape = PCOQSParams(alpha=0.2, rho=50, tol=0.25), DataShape(n=120)
    g = cal.guarantee(p, shape)
    assert cal.version == "2.3.0"
    assert "no score inside the search's final interval (width ≤ tol = 0.25)" in g.statement
    old = cal.guarantee_as("2.1.0", p, shape)
    assert "final interval" not in old.statement and old.details == g.details
    # the coverage that statement now disclaims: well above the recorded upper bound
    rng = random.Random(3)
    gen = np.random.default_rng(3)
    thresholds = [cal.calibrate(CalibrationInput(scores=gen.random(120)), p, rng).threshold
                  for _ in range(40)]
    assert g.upper is not None and np.mean(np.minimum(thresholds, 1.0)) > g.upper + 0.1
    acct = accountant
    acct.create_dataset("z", rho=100)
    rel = acct.calibrate("pcoqs", dataset="z", scores=gen.random(500), alpha=0.1, rho=1)
    paid = acct.charge("z", ZCDP(rho=1))  # a private release is recorded only when paid for
    # a 2.1.0 release as 2.1.0 wrote it: past the public API, which refuses another version
    record_release(
        acct.ledger, "z", _as_computed=True, method="pcoqs", calibrator_version="2.1.0",
        threshold=rel.threshold,
        params=rel.params, shape=rel.shape, coverage=cal.guarantee_as(
            "2.1.0", PCOQSParams(**rel.params), DataShape(**rel.shape)),
        privacy=rel.privacy, diagnostics=rel.diagnostics, charge_ids=[paid.charge_id])
    assert acct.verify().guarantees_recomputed == 2  # each version by its own formula


# ---------------------------------------------------------------- provenance
class _NoNoisePCOQS(PCOQS):
    """A stand-in with P-COQS's name, cost and guarantee that releases the exact quantile."""

    def calibrate(self, data: CalibrationInput, params: Any, rng: Any) -> CalibrationResult:
        return SplitConformal().calibrate(data, params, rng)


class _Mine(SplitConformal):
    name = "my-split"


def test_a_stand_in_under_a_builtin_name_is_refused(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", rho=1)
    s = np.random.default_rng(0).random(500)
    before = _written(acct)
    with pytest.raises(InvalidInput, match=r"'pcoqs' is privcal's.*_NoNoisePCOQS"):
        acct.run(_NoNoisePCOQS(), {"alpha": 0.1, "rho": 0.1}, CalibrationInput(scores=s),
                 dataset="d")
    with pytest.raises(InvalidInput, match="'pcoqs' is privcal's"):
        acct.calibrate(_NoNoisePCOQS(), {"alpha": 0.1, "rho": 0.1}, dataset="d", scores=s)
    assert _written(acct) == before
    # the built-in object itself is recorded as privcal's, at its real version
    rel = acct.run(PCOQS(), {"alpha": 0.1, "rho": 0.1}, CalibrationInput(scores=s),
                   dataset="d")
    assert (rel.distribution, rel.distribution_version) != ("privcal", "")
    assert rel.distribution == "privcal" and rel.distribution_version != "unknown"


def test_a_custom_calibrator_is_recorded_as_its_own_and_a_foreign_record_fails_verify(
        accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    s = np.random.default_rng(0).random(200)
    rel = acct.run(_Mine(), {"alpha": 0.1}, CalibrationInput(scores=s), dataset="d")
    assert (rel.distribution, rel.distribution_version) == (__name__.split(".")[0], "unknown")
    acct2_rel = acct.calibrate("split", {"alpha": 0.1}, dataset="d", scores=s)
    acct.record_release(
        "d", method="split", calibrator_version=acct2_rel.calibrator_version,
        threshold=acct2_rel.threshold, params=acct2_rel.params, shape=acct2_rel.shape,
        coverage=acct2_rel.coverage, privacy=acct2_rel.privacy,
        diagnostics=acct2_rel.diagnostics, distribution="evil-plugin")
    assert any("made by 'evil-plugin', but the installed split comes from 'privcal'" in p
               for r in _checks(acct) for p in r.problems)


def _checks(acct: Any) -> list[Any]:
    from privcal.accountant.verification import check_release

    return [check_release(acct, r) for r in acct.ledger.releases()]


# ---------------------------------------------------------------- checked before the charge
def test_a_one_row_mondrian_group_is_released_at_infinity(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", rho=10)
    scores = np.random.default_rng(0).random(301)
    rel = acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.5}, dataset="d", scores=scores,
                         groups=["big"] * 300 + ["solo"], public_groups=True)
    solo = next(g for g in rel.diagnostics["groups"] if g["group"] == "solo")
    assert math.isinf(float(solo["threshold"])) and math.isinf(rel.threshold)
    assert rel.coverage.details["group solo: lower"] == 1.0
    assert acct.verify().guarantees_recomputed == 1


@pytest.mark.parametrize("scores", [np.array([0.3]), np.array([0.3, math.inf, 0.2])],
                         ids=["one-row", "infinite"])
def test_run_checks_central_scores_before_the_charge(accountant: Any,
                                                     scores: np.ndarray) -> None:
    acct = accountant
    acct.create_dataset("d", rho=10)
    before = _written(acct)
    with pytest.raises(InvalidInput, match="scores"):
        acct.run(PCOQS(), {"alpha": 0.1, "rho": 0.5}, CalibrationInput(scores=scores),
                 dataset="d")
    assert _written(acct) == before


@pytest.mark.parametrize("extra,msg", [({"lower": -1e308, "upper": 1e308}, "too wide"),
                                       ({"lower": 1.0, "upper": 1.0 + 1e-15, "bins": 1000},
                                        "strictly increasing")])
def test_exponq_grid_is_checked_before_the_charge(accountant: Any, extra: dict[str, Any],
                                                  msg: str) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=10)
    before = _written(acct)
    with pytest.raises(InvalidInput, match=msg):
        acct.calibrate("exponq", {"alpha": 0.1, "epsilon": 1, **extra}, dataset="d",
                       scores=np.random.default_rng(0).random(500))
    assert _written(acct) == before


def test_run_validates_parameters_built_without_validation(accountant: Any) -> None:
    from privcal.calibrators.exponq import ExponQ

    acct = accountant
    acct.create_dataset("d", epsilon=10)
    before = _written(acct)
    bad = ExponQParams.model_construct(alpha=0.9, epsilon=1.0, lower=0.0, upper=1.0,
                                       bins=None)
    with pytest.raises(InvalidInput, match=r"invalid exponq parameters: .*α ≤ 1/2"):
        acct.run(ExponQ(), bad, CalibrationInput(scores=np.random.default_rng(0).random(50)),
                 dataset="d")
    assert _written(acct) == before


# ---------------------------------------------------------------- the exact sampler
def test_a_large_exponent_is_drawn_in_pieces_that_do_not_underflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Fraction, int]] = []
    piece = ex._bernoulli_exp_piece

    def spy(t: Fraction, shift: int, rng: random.Random) -> bool:
        seen.append((t, shift))
        _lo, hi = ex._exp_bounds(t, 30)
        assert hi > 0  # the factor drawn is representable: not an exact 0
        return piece(t, shift, rng)

    monkeypatch.setattr(ex, "_bernoulli_exp_piece", spy)
    # exp(−2.4·10⁶) underflows the decimal context in one piece: hi would be 0
    assert ex._exp_bounds(Fraction(2_400_000), 30)[1] == 0
    assert ex._bernoulli_exp_scaled(Fraction(2_400_000), 40, random.Random(0)) is False
    assert seen and all(t <= ex._EXP_PIECE + s for t, s in seen)


def test_the_pieces_multiply_to_the_exact_probability(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """With pieces of 1/2, p = exp(−2.3)·2 = 0.2005 is the AND of three draws (two pieces
    of exp(−1/2), then exp(−1.3)·2): the frequency of 40 000 draws is within 5 standard
    errors of p."""
    monkeypatch.setattr(ex, "_EXP_PIECE", Fraction(1, 2))
    rng = random.Random(11)
    n = 40_000
    hits = sum(ex._bernoulli_exp_scaled(Fraction(23, 10), 1, rng) for _ in range(n))
    p = math.exp(-2.3) * 2
    assert abs(hits / n - p) < 5 * math.sqrt(p * (1 - p) / n)


# ---------------------------------------------------------------- the dataset's guarantee
def test_the_dataset_guarantee_includes_its_local_dp_releases(accountant: Any) -> None:
    """Local-DP reports are charged per subject, never to the central cap: a dataset with a
    pure cap of 0.1 and a subject cap of 8 released an 8-LDP calibration while its guarantee
    still read "everything released … is (0.1, 0)-DP"."""
    from privcal.accountant.report import audit_report
    from privcal.costs import LocalDP, PureDP

    acct = accountant
    acct.create_dataset("d", epsilon="0.1", subject_epsilon=8)
    acct.create_dataset("central", epsilon="0.1")
    acct.charge("d", PureDP(eps="0.1"))
    acct.charge_subjects("d", LocalDP(eps0=8), [f"s{i}" for i in range(50)])
    g = acct.budget("d").guarantee
    assert (g.epsilon, g.delta) == (Decimal("8.1"), 0)  # the central 0.1 + each subject's 8
    assert "local-DP reports: Σε0 ≤ 8 per subject" in g.statement
    # the exact privacy loss one subject's report gives the server (randomized response at
    # ε0 = 8, as the devices run it): no guarantee of this dataset can be below it
    from privcal.calibrators.mechanisms.randomized_response import (
        krr_flip_probability,
        krr_keep_probability,
    )
    loss = math.log(krr_keep_probability(2, 8.0) / krr_flip_probability(2, 8.0))
    assert loss > 7.99 and float(g.epsilon) >= loss
    (rep,) = audit_report(acct, "d")
    assert "is (8.1, 0)-DP" in rep.guarantee
    assert acct.budget("central").guarantee.epsilon == Decimal("0.1")  # no local reports: the cap's


def test_the_shuffle_window_stays_small_at_tiny_delta() -> None:
    """Below δ ≈ 2e−12 scipy's binomial quantiles return the ends of the support: the window
    of clone counts was all of [0, n] (O(n) memory; a process killed at n = 10⁹)."""
    from privcal.accountant.privacy import shuffle_bounds as sb

    plan = sb.clone_plan(5.0, 10**7, sb.truncation_tau(1e-12), stronger=True)
    assert plan.size < 10**5


def test_the_dataset_guarantee_leaves_out_non_private_releases(accountant: Any) -> None:
    """A dataset that allows non-private releases said "everything released … is (ε, δ)-DP"
    after a non-private split release."""
    from privcal.accountant.report import audit_report

    acct = accountant
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    acct.calibrate("split", {"alpha": 0.1}, dataset="np",
                   scores=np.random.default_rng(0).random(100))
    g = acct.budget("np").guarantee
    assert g.statement.startswith("every private release from this dataset")
    assert "non-private releases (its policy allows them) have no privacy guarantee" in (
        g.statement)
    assert audit_report(acct, "np")[0].guarantee == g.statement
    acct.create_dataset("p", epsilon=1)
    assert acct.budget("p").guarantee.statement.startswith("everything released")


# ---------------------------------------------------------------- what the fixes must not break
@pytest.fixture
def _plugin(example_plugin: Any) -> Any:
    import warnings

    from privcal.calibrators import registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the example's shadowing entry point warns
        return registry.get("example-max").calibrator


def test_a_plugin_keeps_its_own_rules_and_its_old_releases_verify(accountant: Any,
                                                                    _plugin: Any) -> None:
    """The plugin declares no ``min_scores``: one score, or an infinite one, still runs, and
    a one-row Mondrian group is run, not released at +∞. Releases recorded before
    provenance was checked — ``run`` wrote ("privcal", ""), ``calibrate`` the class's
    package and "unknown" — still verify; another distribution does not."""
    import warnings

    acct = accountant
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = acct.run(_plugin, {"alpha": 0.1}, CalibrationInput(scores=np.array([0.7])),
                       dataset="d")
        assert one.threshold == 0.7 and one.distribution == "privcal-example-plugin"
        acct.run(_plugin, {"alpha": 0.1}, CalibrationInput(scores=np.array([0.1, math.inf])),
                 dataset="d")
        mo = acct.calibrate(_plugin, {"alpha": 0.1}, dataset="d",
                            scores=np.array([0.2, 0.4, 0.9]), groups=["a", "a", "b"],
                            public_groups=True)
        assert [g["threshold"] for g in mo.diagnostics["groups"]] == [0.4, 0.9]
        for dist, version in (("privcal", ""), ("privcal_example_plugin", "unknown"),
                              ("someone-else", "1.0")):
            acct.record_release(
                "d", method=one.method, calibrator_version=one.calibrator_version,
                threshold=one.threshold, params=one.params, shape=one.shape,
                coverage=one.coverage, privacy=one.privacy, diagnostics=one.diagnostics,
                distribution=dist, distribution_version=version)
        bad = [r.problems for r in _checks(acct) if not r.ok]
    assert len(bad) == 1 and "made by 'someone-else'" in bad[0][0]


def test_record_releases_default_provenance_is_not_a_legacy_form(accountant: Any,
                                                                  _plugin: Any) -> None:
    """``record_release`` defaulted to ("privcal", ""), the form ``run`` wrote before
    provenance was checked, which verify accepts for any method: a release recorded today
    with the defaults for a plugin's method passed as the plugin's."""
    import warnings

    acct = accountant
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = acct.run(_plugin, {"alpha": 0.1}, CalibrationInput(scores=np.array([0.7, 0.2])),
                       dataset="d")
        acct.record_release(
            "d", method=one.method, calibrator_version=one.calibrator_version,
            threshold=one.threshold, params=one.params, shape=one.shape,
            coverage=one.coverage, privacy=one.privacy, diagnostics=one.diagnostics)
        bad = [r.problems for r in _checks(acct) if not r.ok]
    assert len(bad) == 1 and "made by 'privcal'" in bad[0][0]
