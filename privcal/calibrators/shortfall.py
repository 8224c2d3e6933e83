"""How likely a test result as low as an evaluation's is, under a release's guarantee.

A marginal guarantee (split, P-COQS given its event E, ExponQ, the federated methods: over
calibration sets *and* test points) is about the average release: one release may fall
below it, and a test set that shows it below is evidence against the guarantee only as far
as such a result is unlikely. :func:`shortfall` bounds the probability, under the
guarantee, that m test points cover k or fewer — over the release (its coverage C) and the
test points (given C, Binomial(m, C)); :func:`rank_tail` bounds P(C ≤ u):

- **Markov's inequality** on the miss rate 1 − C, for every marginal guarantee: a mean
  coverage ≥ L gives P(C ≤ v) ≤ (1 − L)/(1 − v), so P(X ≤ k) ≤ (1 − L)/(1 − v) +
  P(Binomial(m, v) ≤ k) for every v < L (the smallest over a grid of v is used); with
  P-COQS's E, of probability ≥ 1 − β, the mean is ≥ (1 − β)·L (red team 14);
- **an order statistic**, where the threshold is at least the rank-r calibration score,
  so that C is at least a Beta(r, n+1−r) variable (continuous scores; ties only raise it),
  far sharper (red team 16: 0.31 against 0.9 at n = 3000 was "p ≤ 0.21" by Markov):
  a plain split release (rank r, exactly); P-COQS (red team 17): on E the released
  threshold is backed by a noisy count ≥ its target rank r', so at least r' − τ scores lie
  at or below it (seed 003, Thm 2's lower bound; SPEC §4), and P(C ≤ u) ≤ β + Beta-cdf(u;
  r'−τ, n+1−r'+τ); the test result's tail is then the beta-binomial one.

:func:`with_shortfall` records the bound on an evaluation (``shortfall_probability``,
``shortfall_bound``), so ``Release.evaluate``, ``evaluate --json`` and the CLI's verdict
all carry the same figure.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rank_tail", "shortfall", "with_shortfall"]


def _order_statistic(rel: Any) -> tuple[int, int, float, str] | None:
    """(a, b, β, how): a split or P-COQS release's coverage is, outside an event of
    probability ≤ β, at least a Beta(a, b) variable (module docstring); None for another
    release, or where the recorded rank, n or τ are missing or leave no order statistic."""
    method = getattr(rel, "method", None) if rel is not None else None
    if method not in ("split", "pcoqs"):
        return None
    cov = rel.coverage
    rank = getattr(cov, "rank", None)
    shape = rel.shape if isinstance(rel.shape, dict) else {}
    n = shape.get("n")
    if not isinstance(rank, int) or not isinstance(n, int):
        return None
    failure = 0.0
    if method == "pcoqs":
        details = getattr(cov, "details", None) or {}
        tau, failure = details.get("tau"), getattr(cov, "failure_probability", None)
        if not isinstance(tau, int) or not isinstance(failure, float | int):
            return None
        rank -= tau
    if not 1 <= rank <= n:
        return None
    if method == "split":
        return rank, n + 1 - rank, 0.0, (
            f"split at rank {rank} of n = {n}: a release's coverage is "
            f"Beta({rank}, {n + 1 - rank}) distributed, larger with ties")
    return rank, n + 1 - rank, float(failure), (
        f"P-COQS: outside an event of probability ≤ {failure:.4g}, its threshold has at "
        f"least {rank} of n = {n} scores at or below it, so its coverage is at least a "
        f"Beta({rank}, {n + 1 - rank}) variable")


def rank_tail(rel: Any, u: float) -> tuple[float, str] | None:
    """(a bound on P(C ≤ u), how) for the coverage C of a split or P-COQS release, from the
    order statistic its threshold is at least (module docstring); None for another release."""
    found = _order_statistic(rel)
    if found is None:
        return None
    from scipy.stats import beta

    a, b, failure, how = found
    return min(1.0, failure + float(beta.cdf(u, a, b))), how


def _result_tail(rel: Any, covered: int, m: int) -> tuple[float, str] | None:
    """(a bound on P(X ≤ covered), how) for X the points covered of m test points by a split
    or P-COQS release: X given C is Binomial(m, C) and C is at least Beta(a, b), so X is at
    least a beta-binomial variable (outside P-COQS's event)."""
    found = _order_statistic(rel)
    if found is None:
        return None
    from scipy.stats import betabinom

    a, b, failure, how = found
    p = min(1.0, failure + float(betabinom.cdf(covered, m, a, b)))
    return p, f"{how}; {m} test points then cover at most {covered} with a beta-binomial tail"


def _markov_binomial(covered: int, m: int, low: float) -> tuple[float, float]:
    """(a bound on P(X ≤ covered), the v it was taken at) for X the points covered of m test
    points when the coverage C has mean ≥ ``low``: for every v < low,
    P(X ≤ k) ≤ P(C ≤ v) + P(X ≤ k, C > v) ≤ (1 − low)/(1 − v) + P(Binomial(m, v) ≤ k)
    (Markov's inequality on the miss rate 1 − C; the binomial tail falls as C grows)."""
    from scipy.stats import binom

    v = np.linspace(covered / m, low, 513)[:-1]
    total = (1 - low) / (1 - v) + binom.cdf(covered, m, v)
    i = int(np.argmin(total))
    return min(1.0, float(total[i])), float(v[i])


def shortfall(ev: Any, failure: float = 0.0, rel: Any = None) -> tuple[float, str] | None:
    """(a bound on the probability, under the guarantee, of a test result as low as ``ev``'s,
    how it was derived) for an evaluation below a *marginal* guarantee and inconsistent
    with it; None otherwise (met, consistent, or a per-release guarantee a test set can
    refute). ``failure``: the guarantee's failure probability β; ``rel``: the release, for
    its rank.

    The probability is of the test result — ``covered`` of the evaluation's ``n`` points or
    fewer — over the release *and* the test points (red team 19, coverage F5): a bound on
    P(C ≤ u) for u the test set's 95% upper bound left out that u is itself below the
    release's coverage on up to 5% of test sets, and called a release that met its
    guarantee outright (0.99005 ≥ 0.99; 293 of 300 covered, which it shows 3.2% of the
    time) "probability at most 0.00099: strong evidence against it"."""
    if ev.meets_guarantee or ev.consistent_with_guarantee or not getattr(ev, "marginal", False):
        return None
    m = int(ev.n)
    covered = round(float(ev.coverage) * m)
    low = (1 - failure) * ev.guaranteed_lower
    odds, v = _markov_binomial(covered, m, low)
    how = (f"Markov's inequality on the miss rate, (1 − {low:.4g})/(1 − v), plus the chance "
           f"that {m} test points cover at most {covered} at coverage v = {v:.4g}")
    tail = _result_tail(rel, covered, m)
    if tail is not None and tail[0] < odds:
        odds, how = tail
    return odds, how


def with_shortfall(ev: Any, rel: Any) -> Any:
    """``ev`` with its ``shortfall_probability`` and ``shortfall_bound`` set from release
    ``rel`` (unchanged where :func:`shortfall` gives none); a Mondrian release's groups
    each get their own (:func:`_group_shortfall`)."""
    update: dict[str, Any] = {}
    found = shortfall(ev, float(getattr(rel.coverage, "failure_probability", 0.0) or 0.0), rel)
    if found is not None:
        update = {"shortfall_probability": found[0], "shortfall_bound": found[1]}
    if getattr(ev, "by_group", None):
        update["by_group"] = [_group_shortfall(g, rel) for g in ev.by_group]
    return ev.model_copy(update=update) if update else ev


def _group_shortfall(g: Any, rel: Any) -> Any:
    """A Mondrian group's evaluation with the probability of a test result as low as its
    own under the group's guarantee (:func:`shortfall`, the group's own rank, n, β and τ
    where a plain split or P-COQS ran in it: :func:`~privcal.calibrators.mondrian.
    group_release`): a group's 95% bound alone is below its guarantee for about 5% of the
    groups of a valid release (the review of red team 19: "BELOW" on 36 of 40 valid
    30-group releases)."""
    from privcal.calibrators.mondrian import group_release

    view = group_release(rel, g.group)
    failure = view.coverage.failure_probability if view is not None else 0.0
    inner = view if view is not None and view.method in ("split", "pcoqs") else None
    found = None if g.coverage is None else shortfall(g, failure, inner)
    return g if found is None else g.model_copy(update={"shortfall_probability": found[0]})
