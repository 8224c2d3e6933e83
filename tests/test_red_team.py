"""Adversarial checks (red team, after issues 12 and 13): each test reaches a state where a
recorded coverage guarantee would be false, and asserts that privcal refuses it instead."""

from __future__ import annotations

import numpy as np
import pytest

from privcal import Accountant
from privcal.calibrators.base import DataShape
from privcal.calibrators.prediction_sets import prediction_sets
from privcal.errors import InvalidInput
from tests.seeded import Seeded


def _probs(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(k) * 0.5, n)
    y = np.array([rng.choice(k, p=p) for p in probs])
    return probs, y


# ------------------------------------------------------------ a threshold read on another score
@pytest.mark.parametrize("levels", [False, True])
def test_sets_on_another_score_than_the_release_is_refused(accountant: Accountant,
                                                           levels: bool) -> None:
    """A lac threshold compared with raps scores (penalised ranks) gives sets far below the
    recorded 1−α; privcal refused this for intervals, not for sets. Worst case: λ large
    makes every label past rank 1 exceed a lac threshold < 1, so the raps set is the top
    label only."""
    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    probs, y = _probs(4000, 10, seed=5)
    alpha = [0.1, 0.2] if levels else 0.1
    rel = accountant.calibrate("split", dataset="d", probs=probs[:2000], labels=y[:2000],
                               score="lac", alpha=alpha)
    lvl = {"alpha": 0.1} if levels else {}
    own = rel.predict_set(probs[2000:], **lvl)
    assert own[np.arange(2000), y[2000:]].mean() >= 0.88  # its own score: ~1−α
    same = rel.predict_set(probs[2000:], score_name="lac", **lvl)  # naming it is fine
    assert (same == own).all()
    # what the sets on raps would be: far below the recorded guarantee
    t = rel.thresholds()[0]["threshold"]
    raps = prediction_sets("raps", probs[2000:], t, rng=Seeded(0), lam=10.0, k_reg=1)
    assert raps[np.arange(2000), y[2000:]].mean() < rel.thresholds()[0]["lower"] - 0.1
    with pytest.raises(InvalidInput, match="calibrated on score 'lac', not 'raps'"):
        rel.predict_set(probs[2000:], score_name="raps", rng=Seeded(0), **lvl)
    with pytest.raises(InvalidInput, match="calibrated on score 'lac', not 'aps'"):
        rel.evaluate(probs[2000:], y[2000:], score_name="aps", **lvl)


# ------------------------------------------------------------ a saved release served by a model
class _Model:
    """predict_proba over the columns ``perm`` of X, with classes_ named accordingly."""

    def __init__(self, classes: list[str], perm: list[int]) -> None:
        self.classes_ = np.array(classes)
        self.perm = perm

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return X[:, self.perm]


def test_from_release_refuses_a_model_whose_classes_differ(accountant: Accountant) -> None:
    """A label-Mondrian release has one threshold per class, in the release's class order.
    Served by a model that lists the same classes in another order, class a's threshold was
    applied to class b's column: class-conditional coverage far below the recorded bounds."""
    from privcal.estimators import PrivateConformalClassifier as C

    accountant.create_dataset("d", rho=1, allow_nonprivate=True)
    rng = np.random.default_rng(2)
    n = 6000
    y = rng.choice(2, size=n, p=[0.5, 0.5])
    # class a is easy (p_a high when a), class b is hard (p_b barely above chance when b)
    pa = np.where(y == 0, rng.uniform(0.8, 1.0, n), rng.uniform(0.3, 0.5, n))
    X = np.column_stack([pa, 1 - pa])
    names = np.array(["a", "b"])
    clf = C(_Model(["a", "b"], [0, 1]), "split", 0.9, accountant=accountant, dataset="d",
            mondrian="label", public_groups=True)
    clf.conformalize(X[:3000], names[y[:3000]])
    saved = clf.release_.model_dump_json()
    good = C.from_release(_Model(["a", "b"], [0, 1]), saved)
    sets = good.predict_set(X[3000:])[1][:, :, 0]
    for j in range(2):  # each class covered at its own bound
        rows = y[3000:] == j
        assert sets[rows, j].mean() >= 0.87
    swapped = _Model(["b", "a"], [1, 0])  # the same model, columns listed b, a
    # what serving it would give: class b's column read with class a's threshold
    wrong = clf.release_.predict_set(swapped.predict_proba(X[3000:]))
    b_rows = y[3000:] == 1
    assert wrong[b_rows, 0].mean() < 0.5  # column 0 is b here; recorded bound 0.9
    with pytest.raises(InvalidInput, match="classes"):
        C.from_release(swapped, saved)


# ------------------------------------------------------------ the exact binomial cut-off's floats
def _exact_tails(m: int, p: float) -> tuple[list[int], int]:
    """P(Bin(m, p) ≥ j) = tails[j] / den exactly for j ≥ m·p (0 below: not computed), for
    the float p (a dyadic rational)."""
    from fractions import Fraction

    q = Fraction(p)
    u, v, d = q.numerator, q.denominator - q.numerator, q.denominator
    j0 = int(m * p)
    tails = [0] * (m + 2)
    term = u**m  # comb(m, j)·u^j·v^(m−j) at j = m, then downwards by the ratio
    for j in range(m, j0 - 1, -1):
        tails[j] = tails[j + 1] + term
        if j > j0:  # term(j−1) = term(j)·j·v / ((m−j+1)·u)
            term = term * j * v // ((m - j + 1) * u)
    return tails, d**m


def test_binomial_cutoff_is_valid_where_scipy_underflows() -> None:
    """LDP-CP-S's exact cut-off (issue 13) at α = 1/2, n' = 1077, T = 1, δ = 10⁻²⁶⁰: scipy's
    binomial tail returns 0 for P(Bin(1077, 1/2) ≥ 1039) ≈ 1.06·10⁻²⁵⁴, so the cut-off 1039
    was accepted and the recorded failure probability 10⁻²⁶⁰ was false. Checked here in exact
    rationals, over a range of levels down to the smallest accepted (10⁻³⁰⁰)."""
    from fractions import Fraction

    from privcal.calibrators.ldp_score_bounds import exact_cutoff, report_probability
    from privcal.calibrators.tail_bounds import binomial_upper_cutoff

    m = 1077
    assert report_probability(0.5, 2.0) == 0.5
    tails, den = _exact_tails(m, 0.5)
    for delta in (1e-200, 1e-250, 1e-258, 1e-260, 1e-280, 1e-299):
        k = exact_cutoff(m, 1, 0.5, 2.0, delta)
        assert Fraction(tails[k], den) <= Fraction(delta), (delta, k)
        assert Fraction(tails[k - 1], den) > Fraction(delta) / 10**6  # still sharp
    for pp in (0.1, 0.7):
        tails, den = _exact_tails(1500, pp)
        for a in (1e-120, 1e-250):
            k = binomial_upper_cutoff(1500, pp, a)
            assert Fraction(tails[k] if k <= 1500 else 0, den) <= Fraction(a), (pp, a, k)


def test_a_tail_level_below_the_float_range_is_refused() -> None:
    from privcal.calibrators.ldp_score_bounds import exact_cutoff
    from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
    from privcal.calibrators.tail_bounds import MIN_LEVEL

    with pytest.raises(InvalidInput, match="too small"):
        exact_cutoff(1077, 1, 0.5, 2.0, MIN_LEVEL / 2)
    with pytest.raises(InvalidInput, match="too small"):  # β/N for P-COQS
        PCOQS().guarantee(PCOQSParams(alpha=0.1, rho=1, beta=1e-299), DataShape(n=1000))


# ------------------------------------------------------------ LDP-CP-L's one-sided constants
@pytest.mark.parametrize("n", [1, 7, 100, 10_000])
def test_c_sup_is_the_massart_integral_and_the_condition_holds(n: int) -> None:
    """C_SUP = 0.7385 (LDP-CP-L version 2): E sup(F − F̃) ≤ ∫₀^∞ P(sup > t) dt ≤ t₀ +
    ∫_{t₀}^∞ e^{−2nt²} dt, where Massart's one-sided bound P(sup > t) ≤ e^{−2nt²} is used only
    from t₀ = √(ln 2/(2n)) on, i.e. where e^{−2nt²} ≤ 1/2 (Massart 1990, Thm 1's condition);
    below t₀ the probability is bounded by 1. The t_n term uses the bound at δ/2 < 1/2."""
    import math

    from scipy.integrate import quad

    from privcal.calibrators.ldp_label import C_SUP, label_slack

    t0 = math.sqrt(math.log(2) / (2 * n))
    assert math.exp(-2 * n * t0 * t0) == pytest.approx(0.5, rel=1e-12)
    tail, _err = quad(lambda t: math.exp(-2 * n * t * t), t0, math.inf)
    assert math.sqrt(n) * (t0 + tail) == pytest.approx(C_SUP, rel=1e-9)
    assert 0.7384 < C_SUP < 0.7386 < math.sqrt(math.pi / 2)
    for delta in (0.999, 0.5, 1e-3, 1e-12):
        sl = label_slack(n, 5, 2.0, delta)
        assert math.exp(-2 * n * sl.t_n**2) == pytest.approx(delta / 2, rel=1e-9)
        assert math.exp(-2 * n * sl.t_n**2) <= 0.5  # Massart's condition at the t used
        assert sl.t_r == pytest.approx(C_SUP / math.sqrt(n)
                                       + math.sqrt(math.log(2 / delta) / (2 * n)), rel=1e-12)


# ------------------------------------------------------------ bool smuggled as a number
@pytest.mark.parametrize("params", [{"rho": True}, {"rho": 1, "beta": np.bool_(True)},
                                    {"rho": 1, "tol": False}])
def test_a_bool_for_a_numeric_parameter_is_refused(accountant: Accountant,
                                                   params: dict) -> None:
    """``rho: true`` in a JSON body or a Python call was read as ρ = 1 and charged."""
    accountant.create_dataset("d", rho=10)
    s = np.random.default_rng(0).uniform(size=300)
    with pytest.raises(InvalidInput, match="must be a number, not"):
        accountant.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, **params)
    assert accountant.budget("d").charges == 0
    rel = accountant.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=1, nominal=True)
    assert rel.params["nominal"] is True  # a bool parameter still takes a bool


# ------------------------------------------------------------ a number smuggled as a bool
@pytest.mark.parametrize("params", [{"nominal": 1}, {"nominal": 0}, {"nominal": "true"},
                                    {"nominal": "yes"}, {"nominal": 1.0}])
def test_a_non_bool_for_a_bool_parameter_is_refused(accountant: Accountant,
                                                    params: dict) -> None:
    """``nominal: 1`` was read by pydantic's lax mode as True (the paper's rank, a weaker
    guarantee) and charged: now a one-line error, nothing charged."""
    accountant.create_dataset("d", rho=10)
    s = np.random.default_rng(0).uniform(size=300)
    with pytest.raises(InvalidInput, match=r"^pcoqs: invalid parameters: .*nominal must be "
                                           r"true or false, not [^\n]*$"):
        accountant.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=1, **params)
    probs = np.random.default_rng(1).dirichlet(np.ones(3), 300)
    y = np.random.default_rng(2).integers(0, 3, 300)
    with pytest.raises(InvalidInput, match="public_groups must be"):
        accountant.calibrate("pcoqs", dataset="d", probs=probs, labels=y, score="lac",
                             alpha=0.1, rho=1, mondrian="label", public_groups=1)
    assert accountant.budget("d").charges == 0 and accountant.releases("d") == []
    rel = accountant.calibrate("pcoqs", dataset="d", scores=s, alpha=0.1, rho=1,
                               nominal=np.True_)
    assert rel.params["nominal"] is True  # a bool (numpy's too) is still a bool


# ------------------------------------------------------------ a hand-built group column
@pytest.mark.parametrize(("groups", "count", "msg"), [
    ([-1] * 50 + [0] * 50, 2, r"group indices must lie in \[0, 2\)"),
    ([0] * 50 + [2] * 50, 2, r"group indices must lie in \[0, 2\)"),
    ([0.0] * 50 + [1.0] * 50, 2, "groups must be a 1-D array of integer group indices"),
    ([0] * 99, 2, "groups has 99 rows, the calibration data 100"),
    ([0] * 50 + [1] * 50, 0, "group_count must be an integer ≥ 1, got 0"),
])
def test_a_bad_hand_built_group_column_is_refused_before_any_charge(
        accountant: Accountant, groups: list, count: int, msg: str) -> None:
    """``Accountant.run`` with a CalibrationInput whose group indices are negative raised
    numpy's ValueError from ``bincount``; now a one-line InvalidInput, nothing charged."""
    from privcal.calibrators.base import CalibrationInput
    from privcal.calibrators.registry import get

    accountant.create_dataset("d", rho=10)
    cal = get("mondrian:pcoqs").calibrator
    params = {"alpha": 0.1, "rho": 1, "groups": ["a", "b"], "group_by": "column",
              "public_groups": True}
    s = np.random.default_rng(0).uniform(size=100)
    with pytest.raises(InvalidInput, match=f"^{msg}$"):
        accountant.run(cal, params, CalibrationInput(scores=s, groups=np.asarray(groups),
                                                     group_count=count), dataset="d")
    assert accountant.budget("d").charges == 0 and accountant.releases("d") == []
    rel = accountant.run(cal, params, CalibrationInput(
        scores=s, groups=np.repeat([0, 1], 50), group_count=2), dataset="d")
    assert rel.shape["group_sizes"] == [50, 50] and accountant.budget("d").charges == 1
