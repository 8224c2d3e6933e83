"""Scores (SPEC §1) against direct per-row formulas, ties, shared u, sets and intervals."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privcal.calibrators.base import numpy_rng
from privcal.calibrators.prediction_sets import prediction_sets, regression_interval
from privcal.calibrators.scores import SCORES, all_class_scores, label_scores
from privcal.errors import InvalidInput
from tests.seeded import Seeded


def _probs(n: int, k: int, seed: int, ties: bool = False) -> np.ndarray:
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.ones(k), size=n)
    if ties:
        # quantise so that many rows have tied classes
        p = np.round(p * 8) + 1
        p = p / p.sum(axis=1, keepdims=True)
    return p


def _naive(name: str, p: np.ndarray, u: np.ndarray, lam: float = 0.01, k_reg: int = 5):
    """The SPEC §1 formulas, one (row, class) at a time."""
    n, k = p.shape
    out = np.empty((n, k))
    for i in range(n):
        for y in range(k):
            if name == "lac":
                out[i, y] = 1 - p[i, y]
                continue
            greater = [p[i, j] for j in range(k) if p[i, j] > p[i, y]]
            s = math.fsum(greater) + u[i] * p[i, y]
            if name == "raps":
                rank = 1 + len(greater)
                s += lam * max(0, rank - k_reg)
            out[i, y] = s
    return out


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("name", ["lac", "aps", "raps"])
def test_all_class_scores_match_formula(name, ties):
    p = _probs(200, 7, seed=1, ties=ties)
    opts = {"lam": 0.2, "k_reg": 2} if name == "raps" else {}
    got = all_class_scores(name, p, rng=Seeded(5), **opts)
    # the same u the implementation draws: one numpy_rng(rng).random(n) per call
    u = numpy_rng(random.Random(5)).random(200) if name != "lac" else np.ones(200)
    want = _naive(name, p, u, **opts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_aps_ties_get_identical_scores():
    p = np.array([[0.25, 0.25, 0.25, 0.25], [0.4, 0.2, 0.2, 0.2]])
    s = all_class_scores("aps", p, randomized=False)
    # strict ">": no class is above a tied one, so each gets only its own mass
    assert s[0].tolist() == [0.25] * 4
    assert s[1, 1] == s[1, 2] == s[1, 3]
    assert s[1, 1] == pytest.approx(0.6)
    r = all_class_scores("raps", p, randomized=False, lam=1.0, k_reg=1)
    # every tied class has rank 2 in row 1 (one class strictly more probable)
    np.testing.assert_allclose(r[1], [0.4, 1.6, 1.6, 1.6])


def test_aps_nonrandomized_is_u_equal_one_and_shared_u_per_row():
    p = _probs(50, 5, seed=2)
    s1 = all_class_scores("aps", p, randomized=False)
    np.testing.assert_allclose(s1, _naive("aps", p, np.ones(50)), atol=1e-12)
    # randomized: score − (mass above) is u·p_y with the same u for every class of a row
    s = all_class_scores("aps", p, rng=Seeded(3))
    u_hat = (s - (s1 - p)) / p
    np.testing.assert_allclose(u_hat, np.repeat(u_hat[:, :1], 5, axis=1), atol=1e-9)
    assert 0 <= u_hat.min() and u_hat.max() <= 1
    assert u_hat[:, 0].std() > 0.1  # really random across rows


def test_label_scores_equal_gathered_class_scores():
    p = _probs(300, 4, seed=3)
    y = np.random.default_rng(4).integers(0, 4, 300)
    for name in ("lac", "aps", "raps"):
        full = all_class_scores(name, p, rng=Seeded(9))
        lab = label_scores(name, p, y, rng=Seeded(9))
        np.testing.assert_array_equal(lab, full[np.arange(300), y])


def test_prediction_sets_threshold_semantics():
    p = _probs(100, 6, seed=5)
    s = all_class_scores("lac", p)
    t = float(np.median(s))
    sets = prediction_sets("lac", p, t)
    assert sets.dtype == bool and sets.shape == (100, 6)
    np.testing.assert_array_equal(sets, s <= t)
    assert prediction_sets("lac", p, math.inf).all()
    assert not prediction_sets("lac", p, -math.inf).any()
    with pytest.raises(InvalidInput, match="NaN"):
        prediction_sets("lac", p, math.nan)
    # a calibration score equal to the threshold is in its own set (≤, bit-identical scores)
    y = np.random.default_rng(6).integers(0, 6, 100)
    lab = label_scores("aps", p, y, rng=Seeded(1))
    sets = prediction_sets("aps", p, float(lab[17]), rng=Seeded(1))
    assert sets[17, y[17]]


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(2, 9),
    seed=st.integers(0, 2**32 - 1),
    t=st.floats(0, 1.2, allow_nan=False),
)
def test_aps_sets_nested_and_nonrandomized_contains_top_class_at_its_mass(k, seed, t):
    p = _probs(20, k, seed)
    s = all_class_scores("aps", p, randomized=False)
    small = prediction_sets("aps", p, t, randomized=False)
    big = prediction_sets("aps", p, t + 0.05, randomized=False)
    assert (big | ~small).all()  # nested in the threshold
    # with u = 1 the top class's score is its own probability, so it is in every set ≥ that
    top = p.argmax(axis=1)
    assert (s[np.arange(20), top] <= p.max(axis=1) + 1e-12).all()


def test_regression_scores_and_intervals():
    f = np.array([1.0, 2.0, 3.0])
    y = np.array([1.5, 1.0, 3.0])
    np.testing.assert_allclose(label_scores("absolute", f, y), [0.5, 1.0, 0.0])
    lo, hi = regression_interval("absolute", f, 0.5)
    np.testing.assert_allclose(lo, [0.5, 1.5, 2.5])
    np.testing.assert_allclose(hi, [1.5, 2.5, 3.5])
    q = np.array([[1.0, 2.0], [0.0, 0.5], [2.0, 4.0]])
    sc = label_scores("cqr", q, y)
    np.testing.assert_allclose(sc, [-0.5, 0.5, -1.0])
    lo, hi = regression_interval("cqr", q, 0.25)
    # y is in its interval iff its score ≤ t
    inside = (lo <= y) & (y <= hi)
    np.testing.assert_array_equal(inside, sc <= 0.25)
    lo, hi = regression_interval("cqr", q, math.inf)
    assert np.isneginf(lo).all() and np.isposinf(hi).all()


def test_registry_of_scores():
    assert set(SCORES) == {"lac", "aps", "raps", "absolute", "cqr"}
    assert {n for n, s in SCORES.items() if s.needs == "probs"} == {"lac", "aps", "raps"}
    assert SCORES["raps"].options == {"randomized": True, "lam": 0.01, "k_reg": 5}


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: all_class_scores("nope", np.eye(2)), "unknown score 'nope'"),
        (lambda: all_class_scores("absolute", np.eye(2)), "regression score"),
        (lambda: all_class_scores("lac", np.eye(2), lam=1.0), "does not take option"),
        (lambda: all_class_scores("raps", np.eye(2), lam=-1.0), "λ"),
        (lambda: all_class_scores("raps", np.eye(2), k_reg=1.5), "k_reg"),
        (lambda: all_class_scores("aps", np.eye(2), randomized="yes"), "randomized"),
        (lambda: label_scores("lac", np.eye(2), [0, 2]), "outside"),
        (lambda: label_scores("lac", np.eye(3), [0, 1]), "length mismatch"),
        (lambda: label_scores("cqr", np.zeros(3), np.zeros(3)), "shape \\(n, 2\\)"),
        (lambda: regression_interval("lac", np.zeros(3), 1.0), "classification score"),
        (lambda: all_class_scores("lac", np.array([[0.5, 0.6]])), "sums to"),
    ],
)
def test_score_errors(call, fragment):
    with pytest.raises(InvalidInput, match=fragment) as exc:
        call()
    assert "\n" not in str(exc.value)


# ---- lac prediction sets without the score matrix (issue 11): bit-identical to 1 − p ≤ t
@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False), st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_lac_cut_matches_the_score_comparison(t: float, ps: list[float]) -> None:
    import math

    from privcal.calibrators.prediction_sets import lac_cut

    c = lac_cut(t)
    cand = [*ps, *(1.0 - p for p in ps), 0.0, 1.0]
    if math.isfinite(c):
        cand += [c, math.nextafter(c, -math.inf), math.nextafter(c, math.inf)]
    for p in cand:
        if math.isfinite(p):
            assert (1.0 - p <= t) == (p >= c), (t, p, c)


def test_lac_sets_equal_the_score_matrix_on_boundary_thresholds() -> None:
    gen = np.random.default_rng(3)
    p = gen.random((500, 7))
    p /= p.sum(axis=1, keepdims=True)
    for t in [*(1.0 - p[:20, 0]), *(1.0 - p[20:40, 3] + 1e-17), 0.0, 1.0, -1.0, 2.0, -np.inf]:
        assert (prediction_sets("lac", p, float(t)) == (1.0 - p <= t)).all()
    assert prediction_sets("lac", p, np.inf).all()


def test_probability_rows_at_the_tolerance() -> None:
    from privcal.calibrators.validation import check_probs, prob_sum_tolerance

    p = np.array([[0.5, 0.5], [0.25, 0.75]])
    tol = prob_sum_tolerance(2)
    assert tol == 1e-6 + 2 * 5e-7
    near = p.copy()
    near[1, 1] += tol * 0.999999  # inside the tolerance but past the fast margin
    assert (check_probs(near) == near).all()
    off = p.copy()
    off[1, 1] += tol * 1.5
    with pytest.raises(InvalidInput, match="row 1 sums to"):
        check_probs(off)
    for bad, msg in ((np.nan, "must be finite"), (np.inf, "must be finite"),
                     (-0.25, "negative")):
        q = p.copy()
        q[1, 0] = bad
        with pytest.raises(InvalidInput, match=msg):
            check_probs(q)


def test_probabilities_written_with_six_decimals_are_accepted() -> None:
    """A CSV writing each probability with 6 decimals (pandas' float_format="%.6f", R,
    spreadsheets) moves a row of k by up to k·5e-7: such rows were refused as summing to
    "0.999999, not 1 (tolerance 1e-06)"; a matrix that is not one of probabilities still is."""
    from privcal.calibrators.validation import check_probs

    rng = np.random.default_rng(0)
    for k in (3, 10, 100, 1000):
        p = rng.dirichlet(np.ones(k), 2000)
        rounded = np.array([[float(f"{v:.6f}") for v in row] for row in p])
        assert np.abs(rounded.sum(axis=1) - 1).max() > 1e-6  # the old tolerance refused it
        assert (check_probs(rounded) == rounded).all()
    with pytest.raises(InvalidInput,
                       match=r"row 0 sums to 1\.01, not 1 \(tolerance 2\.5e-06 for 3"):
        check_probs(np.array([[0.5, 0.3, 0.21], [0.2, 0.3, 0.5]]))

