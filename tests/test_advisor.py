"""The method advisor (seed 004 §4.1; SPEC §7 guideline)."""

from __future__ import annotations

import math

import pytest

from privcal.calibrators.advisor import (
    advise,
    crossover_k,
    crossover_k_at,
    min_epsilon_label,
    min_epsilon_score,
    min_n_label,
    min_n_score,
    slack_ratio,
)
from privcal.calibrators.ldp_label import label_slack
from privcal.calibrators.ldp_score_bounds import best_rounds, exact_slack, score_slack
from privcal.errors import InvalidInput


def test_paper_guideline_crossovers() -> None:
    # SPEC §7: δ = 0.001, T = 10, the paper's Δ (Theorem 1) against Δ_S
    assert crossover_k(2.0, 0.001, 10, "paper") == 12
    assert crossover_k(4.0, 0.001, 10, "paper") == 70
    assert slack_ratio(11, 2.0, 0.001, 10, "paper") >= 1 > slack_ratio(12, 2.0, 0.001, 10, "paper")
    assert slack_ratio(69, 4.0, 0.001, 10, "paper") >= 1 > slack_ratio(70, 4.0, 0.001, 10, "paper")


@pytest.mark.parametrize("bound", ["proven", "paper"])
@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0])
def test_crossover_is_the_first_winning_k(bound: str, eps: float) -> None:
    k_star = crossover_k(eps, 0.001, 10, bound)
    assert k_star is not None
    first = next(k for k in range(2, 10_000) if slack_ratio(k, eps, 0.001, 10, bound) < 1)
    assert k_star == first


@pytest.mark.parametrize("n", [1_000, 123_450, 10**7])
def test_ratio_does_not_depend_on_n(n: int) -> None:
    # with T | n the ratio of the actual slacks is the n-free ratio
    for k, eps in [(5, 1.0), (12, 2.0), (70, 4.0)]:
        sl = label_slack(n, k, eps, 0.001)
        d_s = score_slack(n // 10, 10, eps, 0.001)
        assert d_s / sl.delta_L == pytest.approx(
            slack_ratio(k, eps, 0.001, 10, "proven"), rel=1e-12
        )
        assert d_s / sl.delta_paper == pytest.approx(
            slack_ratio(k, eps, 0.001, 10, "paper"), rel=1e-12
        )


def test_min_epsilon_is_smallest() -> None:
    n, k, s = 5000, 10, 0.1
    e = min_epsilon_label(n, k, s)
    assert e is not None
    assert (
        label_slack(n, k, e, 0.001).delta_L <= s < label_slack(n, k, e * (1 - 1e-9), 0.001).delta_L
    )
    ep = min_epsilon_label(n, k, s, bound="paper")
    assert ep is not None and ep < e  # the paper's term is smaller, so it needs less ε
    assert label_slack(n, k, ep, 0.001).delta_paper <= s
    assert s < label_slack(n, k, ep * (1 - 1e-9), 0.001).delta_paper
    es = min_epsilon_score(100_000, 0.05, 0.001, 10)
    assert es is not None
    assert (
        score_slack(10_000, 10, es, 0.001) <= 0.05 < score_slack(10_000, 10, es * (1 - 1e-9), 0.001)
    )
    # unreachable: even ε → ∞ leaves t_n (label) / √(ln(2T/δ)/(2n')) (score)
    assert min_epsilon_label(n, k, label_slack(n, k, 1.0, 0.001).t_n) is None
    assert min_epsilon_score(1000, 0.05, 0.001, 10) is None
    assert min_epsilon_score(5, 0.05, 0.001, 10) is None


def test_min_n_is_smallest() -> None:
    for k, eps, s in [(4, 2.0, 0.05), (10, 1.0, 0.1), (100, 8.0, 0.01)]:
        n = min_n_label(k, eps, s)
        assert (
            label_slack(n, k, eps, 0.001).delta_L <= s < label_slack(n - 1, k, eps, 0.001).delta_L
        )
        m = min_n_score(eps, s, 0.001, 10)
        assert m % 10 == 0
        assert score_slack(m // 10, 10, eps, 0.001) <= s < score_slack(m // 10 - 1, 10, eps, 0.001)


def test_advise_consistency() -> None:
    a = advise(10_000, 10, 2.0, 0.1, slack=0.08, score_bound="hoeffding")
    t = best_rounds(10_000, 2.0, 0.001)
    assert a.score.rounds == t and a.score.group_size == 10_000 // t
    assert a.label.slack == label_slack(10_000, 10, 2.0, 0.001).delta_L
    assert a.score.slack == score_slack(10_000 // t, t, 2.0, 0.001)
    assert a.recommended == ("ldp-score" if a.score.slack < a.label.slack else "ldp-label")
    assert a.label.trivial == (0.9 + a.label.slack > 1)
    assert a.label.min_epsilon == min_epsilon_label(10_000, 10, 0.08)
    assert a.score.min_n == min_n_score(2.0, 0.08, 0.001, t)
    assert a.crossover_k == crossover_k(2.0, 0.001, t, "proven")
    assert "label-only" in a.label.privacy
    # k large enough: the score method wins; small k: the label method
    assert advise(10**6, 200, 2.0, 0.1).recommended == "ldp-score"
    assert advise(10**6, 2, 4.0, 0.1).recommended == "ldp-label"
    assert advise(100, 10, 2.0, 0.1).requested_slack is None
    b = advise(10_000, 10, 2.0, 0.1, rounds=10, score_bound="hoeffding")
    assert b.score.rounds == 10 and b.crossover_k_paper == 12


def test_advise_uses_the_recorded_exact_slack_at_this_n() -> None:
    """Issue 13: the default compares what releases record (the exact Δ_S, which depends on
    n), with the rounds a release would use for this n and α."""
    for n in (1_000, 10_000, 100_000):
        a = advise(n, 10, 2.0, 0.1)
        t = best_rounds(n, 2.0, 0.001, alpha=0.1, bound="exact")
        assert a.score.rounds == t and a.score.slack == exact_slack(n // t, t, 0.1, 2.0, 0.001)
        assert a.score.slack <= a.score.details["delta_S_hoeffding"]
        assert a.crossover_k == crossover_k_at(n, a.score.slack, 2.0, 0.001, "proven")
        k = a.crossover_k
        if k is not None:  # the crossover is where the recorded slacks cross, at this n
            assert advise(n, k, 2.0, 0.1).recommended == "ldp-score"
            if k > 2:
                assert advise(n, k - 1, 2.0, 0.1).recommended == "ldp-label"
        assert not any("does not depend on n" in note for note in a.notes)


@pytest.mark.parametrize(
    "kw",
    [
        {"n": 0},
        {"k": 1},
        {"epsilon": 0.0},
        {"epsilon": math.inf},
        {"alpha": 1.0},
        {"delta": 0.0},
        {"slack": -0.1},
        {"rounds": 0},
        {"n": 5, "rounds": 10},
    ],
)
def test_advise_bad_input(kw: dict) -> None:
    args = {"n": 1000, "k": 10, "epsilon": 2.0, "alpha": 0.1, **kw}
    with pytest.raises(InvalidInput):
        advise(**args)


def test_advise_points_to_the_interpolating_search_for_many_classes() -> None:
    from privcal.calibrators.advisor import INTERPOLATE_K, advise

    many = advise(5000, INTERPOLATE_K, 4.0, 0.1)
    few = advise(5000, INTERPOLATE_K - 1, 4.0, 0.1)
    assert any("--search interpolate" in note for note in many.notes)
    assert not any("--search interpolate" in note for note in few.notes)
