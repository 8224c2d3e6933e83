"""How likely one release's coverage is as low as a test set shows, under its guarantee.

A marginal guarantee (split, P-COQS given its event E, ExponQ, the federated methods: over
calibration sets *and* test points) is about the average release: one release may fall
below it, and a test set that shows it below is evidence against the guarantee only as far
as such a release is unlikely. :func:`shortfall` bounds P(C ≤ u) for the release's coverage
C and u the test set's 95% upper confidence bound:

- **Markov's inequality** on the miss rate 1 − C, for every marginal guarantee: a mean
  coverage ≥ L gives P(C ≤ u) ≤ (1 − L)/(1 − u); with P-COQS's E, of probability ≥ 1 − β,
  the mean is ≥ (1 − β)·L (red team 14);
- **an order statistic**, where the threshold is at least the rank-r calibration score,
  so that C is at least a Beta(r, n+1−r) variable (continuous scores; ties only raise it),
  far sharper (red team 16: 0.31 against 0.9 at n = 3000 was "p ≤ 0.21" by Markov):
  a plain split release (rank r, exactly); P-COQS (red team 17): on E the released
  threshold is backed by a noisy count ≥ its target rank r', so at least r' − τ scores lie
  at or below it (seed 003, Thm 2's lower bound; SPEC §4), and P(C ≤ u) ≤ β + Beta-cdf(u;
  r'−τ, n+1−r'+τ).

:func:`with_shortfall` records the bound on an evaluation (``shortfall_probability``,
``shortfall_bound``), so ``Release.evaluate``, ``evaluate --json`` and the CLI's verdict
all carry the same figure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["rank_tail", "shortfall", "with_shortfall"]


def rank_tail(rel: Any, u: float) -> tuple[float, str] | None:
    """(a bound on P(C ≤ u), how) from the order statistic a split or P-COQS release's
    threshold is at least (module docstring); None for another release, or where the
    recorded rank, n or τ are missing or leave no order statistic (r' − τ < 1)."""
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
    from scipy.stats import beta

    p = min(1.0, failure + float(beta.cdf(u, rank, n + 1 - rank)))
    if method == "split":
        return p, (f"split at rank {rank} of n = {n}: a release's coverage is "
                   f"Beta({rank}, {n + 1 - rank}) distributed, larger with ties")
    return p, (f"P-COQS: outside an event of probability ≤ {failure:.4g}, its threshold has "
               f"at least {rank} of n = {n} scores at or below it, so its coverage is at "
               f"least a Beta({rank}, {n + 1 - rank}) variable")


def shortfall(ev: Any, failure: float = 0.0, rel: Any = None) -> tuple[float, str] | None:
    """(a bound on P(C ≤ u) under the guarantee, how it was derived) for an evaluation
    ``ev`` below a *marginal* guarantee and inconsistent with it (u its 95% upper bound);
    None otherwise (met, consistent, or a per-release guarantee a test set can refute).
    ``failure``: the guarantee's failure probability β; ``rel``: the release, for its rank."""
    if ev.meets_guarantee or ev.consistent_with_guarantee or not getattr(ev, "marginal", False):
        return None
    u, low = ev.coverage_upper_95, (1 - failure) * ev.guaranteed_lower
    odds = 1.0 if u >= 1 else min(1.0, (1 - low) / (1 - u))
    how = f"Markov's inequality on the miss rate, (1 − {low:.4g})/(1 − {u:.4g})"
    tail = rank_tail(rel, u)
    if tail is not None and tail[0] < odds:
        odds, how = tail
    return odds, how


def with_shortfall(ev: Any, rel: Any) -> Any:
    """``ev`` with its ``shortfall_probability`` and ``shortfall_bound`` set from release
    ``rel`` (unchanged where :func:`shortfall` gives none)."""
    found = shortfall(ev, float(getattr(rel.coverage, "failure_probability", 0.0) or 0.0), rel)
    if found is None:
        return ev
    return ev.model_copy(update={"shortfall_probability": found[0],
                                 "shortfall_bound": found[1]})
