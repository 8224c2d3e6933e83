"""Which local-DP calibrator for a given (n, k, ε)? The guideline of Penso et al. (seed 004,
§4.1 "LDP-CP-L vs. LDP-CP-S", and the Δ_L/Δ_S comparison of §5, Fig. 5) made computable.

With Hoeffding's Δ_S both slacks scale as 1/√n (Δ_L = C_L(k, ε, δ)/√n, Δ_S =
C_S(ε, δ, T)·√T/√n when T | n), so that ratio does not depend on n (:func:`slack_ratio`,
:func:`crossover_k`). Releases now record LDP-CP-S's exact binomial slack (issue 13,
:mod:`~privcal.calibrators.ldp_score_bounds`), which is not C/√n: it depends on n, α and the
variance of the reports, so :func:`advise` compares the recorded slacks *at the given n*
(:func:`crossover_k_at`) and its default rounds are chosen for that n. LDP-CP-L's slack grows
with k through β = k/(k−1+e^ε), LDP-CP-S's does not depend on k (SPEC §7).

Two comparisons are offered:

- ``bound="proven"``: privcal's recorded Δ_L (SPEC §6) against Δ_S — what the releases
  actually guarantee;
- ``bound="paper"``: the paper's Δ_paper (Theorem 1) against Δ_S — reproduces the SPEC §7
  guideline (δ = 0.001, T = 10: LDP-CP-S wins for k ≥ 12 at ε = 2 and k ≥ 70 at ε = 4).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from privcal.calibrators.ldp_label import label_slack
from privcal.calibrators.ldp_score_bounds import Bound as ScoreBound
from privcal.calibrators.ldp_score_bounds import best_rounds, exact_slack, rr_range, score_slack
from privcal.errors import InvalidInput, numeric_edge

__all__ = [
    "Advice",
    "Bound",
    "advise",
    "crossover_k",
    "crossover_k_at",
    "min_epsilon_label",
    "min_epsilon_score",
    "min_n_label",
    "min_n_score",
    "slack_ratio",
]

Bound = Literal["proven", "paper"]


#: the largest n and T advice is computed for
MAX_N, MAX_ROUNDS = 10**12, 10**4


def _check(
    n: int | None = None,
    k: int | None = None,
    eps: float | None = None,
    delta: float | None = None,
    slack: float | None = None,
    alpha: float | None = None,
    rounds: int | None = None,
) -> None:
    def bad_int(v: object, lo: int) -> bool:
        return isinstance(v, bool) or not isinstance(v, int) or v < lo

    # the upper ends are the service's (routes_plans): beyond them the exact tails run for
    # minutes or overflow (red team 7: `advise --n 2**63` hung in scipy's binom.isf)
    if n is not None and (bad_int(n, 1) or n > MAX_N):
        raise InvalidInput(f"n must be an integer in [1, 10¹²], got {n!r:.40}")
    if k is not None and bad_int(k, 2):
        raise InvalidInput(f"k must be an integer ≥ 2, got {k!r:.40}")
    if rounds is not None and (bad_int(rounds, 1) or rounds > MAX_ROUNDS):
        raise InvalidInput(f"rounds must be an integer in [1, 10⁴], got {rounds!r:.40}")
    if eps is not None and not (math.isfinite(eps) and eps > 0):
        raise InvalidInput(f"ε must be a finite number > 0, got {eps!r}")
    if delta is not None and not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta!r}")
    if alpha is not None and not (0 < alpha < 1):
        raise InvalidInput(f"α must be in (0, 1), got {alpha!r}")
    if slack is not None and not (math.isfinite(slack) and slack > 0):
        raise InvalidInput(f"slack must be a finite number > 0, got {slack!r}")


def _label_value(n: float, k: int, eps: float, delta: float, bound: Bound) -> float:
    sl = label_slack(1, k, eps, delta)  # every term is (n = 1 value)/√n
    return (sl.delta_L if bound == "proven" else sl.delta_paper) / math.sqrt(n)


def slack_ratio(
    k: int, epsilon: float, delta: float = 0.001, rounds: int = 10, bound: Bound = "paper"
) -> float:
    """Δ_S/Δ_L with n' = n/T (independent of n): < 1 means LDP-CP-S has the smaller slack."""
    _check(k=k, eps=epsilon, delta=delta, rounds=rounds)
    # Δ_S = c·√(T·ln(2T/δ)/(2n)); evaluate both at n = 1
    d_s = rr_range(epsilon) * math.sqrt(rounds * math.log(2 * rounds / delta) / 2)
    return d_s / _label_value(1, k, epsilon, delta, bound)


def crossover_k(
    epsilon: float,
    delta: float = 0.001,
    rounds: int = 10,
    bound: Bound = "paper",
    k_max: int = 10**9,
) -> int | None:
    """The smallest k ≥ 2 for which LDP-CP-S has the strictly smaller slack (for every n
    with T | n), or None if none up to ``k_max``. Δ_L increases with k (β does), so the
    ratio decreases and the set of winning k is an interval [k*, ∞): bisect."""
    _check(eps=epsilon, delta=delta, rounds=rounds)
    if slack_ratio(2, epsilon, delta, rounds, bound) < 1:
        return 2
    if slack_ratio(k_max, epsilon, delta, rounds, bound) >= 1:
        return None
    lo, hi = 2, k_max  # ratio(lo) ≥ 1 > ratio(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if slack_ratio(mid, epsilon, delta, rounds, bound) < 1:
            hi = mid
        else:
            lo = mid
    return hi


def crossover_k_at(
    n: int, score_slack_value: float, epsilon: float, delta: float = 0.001,
    bound: Bound = "proven", k_max: int = 10**9,
) -> int | None:  # fmt: skip
    """The smallest k ≥ 2 with Δ_L(n, k) > ``score_slack_value`` (LDP-CP-S's slack at this n,
    which does not depend on k), or None up to ``k_max``; Δ_L increases with k: bisect."""
    _check(n=n, eps=epsilon, delta=delta)

    def wins(k: int) -> bool:
        return score_slack_value < _label_value(n, k, epsilon, delta, bound)

    if wins(2):
        return 2
    if not wins(k_max):
        return None
    lo, hi = 2, k_max
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if wins(mid) else (mid, hi)
    return hi


def _smallest_ok(x: float, ok: object) -> float:
    """Nudge a closed-form root up by ulps until the (monotone) check passes."""
    for _ in range(64):
        if ok(x):  # type: ignore[operator]
            return x
        x = math.nextafter(x, math.inf)
    raise ArithmeticError("closed-form root did not verify")  # pragma: no cover


def min_epsilon_label(
    n: int, k: int, slack: float, delta: float = 0.001, bound: Bound = "proven"
) -> float | None:
    """The smallest ε for which LDP-CP-L's slack (Δ_L, or Δ_paper) is ≤ ``slack``; None if
    unreachable even as ε → ∞ (then β → 0 and the slack tends to t_n, resp. √(ln(4/δ)/2n)).

    Closed form: Δ_L = s ⇔ β = (s − t_n)/(s + t_r); Δ_paper = s ⇔ h = t/s, β = (1−h)/(1+h);
    and β = k/(k−1+e^ε) ⇔ ε = ln(1 + k(1−β)/β).
    """
    _check(n=n, k=k, delta=delta, slack=slack)
    base = label_slack(n, k, 1.0, delta)
    if bound == "proven":
        if slack <= base.t_n:
            return None
        beta = (slack - base.t_n) / (slack + base.t_r)
    else:
        h = math.sqrt(math.log(4 / delta) / (2 * n)) / slack  # Δ_paper = that numerator / h
        if h >= 1:
            return None
        beta = (1 - h) / (1 + h)
    eps = math.log1p(k * (1 - beta) / beta)

    def ok(e: float) -> bool:
        sl = label_slack(n, k, e, delta)
        return (sl.delta_L if bound == "proven" else sl.delta_paper) <= slack

    return _smallest_ok(eps, ok)


def min_epsilon_score(n: int, slack: float, delta: float = 0.001, rounds: int = 10) -> float | None:
    """The smallest ε with Δ_S(n' = ⌊n/T⌋, T, ε, δ) ≤ ``slack``; None if unreachable (c → 1
    as ε → ∞). Closed form: c = s/√(ln(2T/δ)/(2n')), ε = ln((c+1)/(c−1))."""
    _check(n=n, delta=delta, slack=slack, rounds=rounds)
    if n < rounds:
        return None
    g = n // rounds
    c = slack / math.sqrt(math.log(2 * rounds / delta) / (2 * g))
    if c <= 1:
        return None
    eps = math.log1p(2 / (c - 1))
    return _smallest_ok(eps, lambda e: score_slack(g, rounds, e, delta) <= slack)


def _min_n(value_at: object, c: float, slack: float) -> int:
    """Smallest n with value_at(n) ≤ slack, value_at(n) ≈ c/√n: gallop from (c/slack)², bisect
    (red team 10: stepping by one from ~10²⁴ ran for hours). value_at is non-increasing even in
    floats (int → float, /, √, +, ×c ≥ 0 round monotonically): the former walk's n, found fast."""

    def ok(m: int) -> bool:
        return bool(value_at(m) <= slack)  # type: ignore[operator]

    hi = max(1, math.ceil((c / slack) ** 2))
    lo, step = hi, 1
    while not ok(hi):  # gallop up
        lo, hi, step = hi, hi + step, 2 * step
    if lo == hi:  # the guess passed: gallop down (lo = 0 stands for "n ≥ 1")
        while hi > step and ok(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(0, hi - step)
    while hi - lo > 1:  # ok(lo) fails, ok(hi) holds
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def min_n_label(
    k: int, epsilon: float, slack: float, delta: float = 0.001, bound: Bound = "proven"
) -> int:
    """The smallest n for which LDP-CP-L's slack is ≤ ``slack`` (it is C/√n)."""
    _check(k=k, eps=epsilon, delta=delta, slack=slack)
    c = _label_value(1, k, epsilon, delta, bound)

    def value_at(n: int) -> float:
        sl = label_slack(n, k, epsilon, delta)
        return sl.delta_L if bound == "proven" else sl.delta_paper

    return _min_n(value_at, c, slack)


def min_n_score(epsilon: float, slack: float, delta: float = 0.001, rounds: int = 10) -> int:
    """The smallest n (a multiple of T: n = T·n') with Δ_S ≤ ``slack`` for T rounds."""
    _check(eps=epsilon, delta=delta, slack=slack, rounds=rounds)
    c = rr_range(epsilon) * math.sqrt(math.log(2 * rounds / delta) / 2)
    g = _min_n(lambda m: score_slack(m, rounds, epsilon, delta), c, slack)
    return rounds * g


class MethodAdvice(BaseModel):
    """One method's slack and what it takes to reach a requested slack."""

    model_config = ConfigDict(frozen=True)

    method: Literal["ldp-label", "ldp-score"]
    privacy: str
    slack: float = Field(description="the recorded slack Δ (proven)")
    target: float = Field(description="calibration target 1−α+Δ of the guaranteed mode")
    trivial: bool = Field(description="target > 1: the guaranteed mode returns every label")
    rounds: int | None = None
    group_size: int | None = None
    min_epsilon: float | None = Field(default=None, description="smallest ε reaching the slack")
    min_n: int | None = Field(default=None, description="smallest n reaching the slack")
    details: dict[str, float | int | None] = Field(default_factory=dict)


class Advice(BaseModel):
    """The result of :func:`advise`; serialisable (``model_dump(mode="json")``)."""

    model_config = ConfigDict(frozen=True)

    n: int
    k: int
    epsilon: float
    alpha: float
    delta: float
    requested_slack: float | None
    label: MethodAdvice
    score: MethodAdvice
    recommended: Literal["ldp-label", "ldp-score"] = Field(
        description="the method with the smaller proven slack (its target is nearer 1−α; "
        "near crossover_k see notes: an ldp-score session stops in a band above its target)")
    recommended_paper: Literal["ldp-label", "ldp-score"] = Field(
        description="the same comparison with the paper's Δ_paper for LDP-CP-L"
    )
    crossover_k: int | None = Field(
        description="smallest k where LDP-CP-S wins (proven; at this n for the exact bound)"
    )
    crossover_k_paper: int | None = Field(description="the same with Δ_paper")
    notes: list[str]


#: from this many classes on, advise points to LDP-CP-S's interpolating search (bench/RESULTS.md,
#: "guaranteed-mode set sizes": it helps at k = 100 and costs a little at k = 10)
INTERPOLATE_K = 50


@numeric_edge("advise")
def advise(
    n: int,
    k: int,
    epsilon: float,
    alpha: float,
    delta: float = 0.001,
    slack: float | None = None,
    rounds: int | None = None,
    score_bound: ScoreBound = "exact",
) -> Advice:
    """Δ_L and Δ_S side by side for (n, k, ε, δ), which is smaller, and — for a requested
    ``slack`` — the smallest ε (at this n) and the smallest n (at this ε) for each method.

    LDP-CP-S uses ``rounds`` or, by default, :func:`best_rounds` for this n (and α, with the
    exact bound); its slack is the one a release records (``score_bound``: "exact", the
    default since issue 13, or "hoeffding"). Its min-ε and min-n use Hoeffding's closed
    form (an upper bound on the exact slack, so they are sufficient, not necessary) and
    keep that T fixed (with T free, fewer rounds always lower Δ_S, at the cost of a coarser
    bisection, so "the best T" is only meaningful for a given n).
    """
    _check(n=n, k=k, eps=epsilon, delta=delta, alpha=alpha, slack=slack, rounds=rounds)
    if score_bound not in ("exact", "hoeffding"):
        raise InvalidInput(f"score bound must be 'exact' or 'hoeffding', got {score_bound!r}")
    t = rounds
    if t is None:
        t = best_rounds(n, epsilon, delta, alpha=alpha, bound=score_bound)
    if n < t:
        raise InvalidInput(f"n = {n} is smaller than the number of rounds T = {t}")
    g = n // t
    sl = label_slack(n, k, epsilon, delta)
    if score_bound == "exact":
        d_s = exact_slack(g, t, alpha, epsilon, delta)
    else:
        d_s = score_slack(g, t, epsilon, delta)
    label = MethodAdvice(
        method="ldp-label",
        privacy="label-only ε-LDP: features sent in the clear",
        slack=sl.delta_L,
        target=1 - alpha + sl.delta_L,
        trivial=1 - alpha + sl.delta_L > 1,
        min_epsilon=min_epsilon_label(n, k, slack, delta) if slack else None,
        min_n=min_n_label(k, epsilon, slack, delta) if slack else None,
        details={
            "delta_paper": sl.delta_paper,
            "beta": sl.beta,
            "h": sl.h,
            "t_n": sl.t_n,
            "t_r": sl.t_r,
        },
    )
    score = MethodAdvice(
        method="ldp-score",
        privacy="ε-LDP for features and label",
        slack=d_s,
        target=1 - alpha + d_s,
        trivial=1 - alpha + d_s > 1,
        rounds=t,
        group_size=g,
        min_epsilon=min_epsilon_score(n, slack, delta, t) if slack else None,
        min_n=min_n_score(epsilon, slack, delta, t) if slack else None,
        details={
            "rr_range_c": rr_range(epsilon),
            "delta_S_T10": score_slack(n // 10, 10, epsilon, delta) if n >= 10 else None,
            "delta_S_hoeffding": score_slack(g, t, epsilon, delta),
        },
    )
    exact = score_bound == "exact"
    notes = [
        "LDP-CP-S wins for k ≥ crossover_k at this n (its exact slack depends on n, α and T; "
        "the rounds T are chosen for this n)"
        if exact
        else "Δ_S/Δ_L does not depend on n (both scale as 1/√n); LDP-CP-S wins for k ≥ "
        "crossover_k.",
        "ldp-label protects labels only; ldp-score protects features and labels.",
        "ldp-score searches the public range [lower, upper] (default [0, 1]): a narrower "
        "public range that still holds the scores' 1−α quantile needs fewer rounds.",
    ]
    if k >= INTERPOLATE_K:
        notes.append(
            f"with k = {k} classes a calibrated model's scores crowd near the top of the range, "
            "where bisection's midpoints cannot reach them: --search interpolate aims each "
            "query at the quantile estimated from earlier rounds (post-processing, same "
            "guarantee; bench/RESULTS.md: k = 100, n = 5 000, ε = 2: 100 → 29.7 labels)."
        )
    if d_s < sl.delta_L <= 1.5 * d_s:  # red team 11: the band's mean excess is w/2 = Δ_S/2
        notes.append(f"near the crossover: an ldp-score collection session stops anywhere in "
                     f"a band of width Δ_S above its target (on average {1.5 * d_s:.4g} above "
                     f"1−α, against ldp-label's Δ_L = {sl.delta_L:.4g}), so ldp-label may give "
                     "smaller sets here (calibrate --simulate runs every round, band 0, and "
                     "has no such excess): compare both with calibrate --simulate on held-out "
                     "scores.")
    if slack is not None:
        notes.append("ldp-score's min ε / min n keep T fixed at the rounds shown, and come from "
                     "Hoeffding's bound on Δ_S: enough, not the least — the exact slack shown "
                     "(a sawtooth in n) often reaches Δ at a smaller ε or n.")
        if exact and d_s <= slack:  # red team 23, fedlocal F3: '—' beside a slack it reaches
            notes.append(f"ldp-score already reaches Δ ≤ {slack:g} at this n and ε "
                         f"(Δ_S = {d_s:.4g}), whatever its min ε / min n say.")
    return Advice(
        n=n,
        k=k,
        epsilon=epsilon,
        alpha=alpha,
        delta=delta,
        requested_slack=slack,
        label=label,
        score=score,
        recommended="ldp-score" if d_s < sl.delta_L else "ldp-label",
        recommended_paper="ldp-score" if d_s < sl.delta_paper else "ldp-label",
        crossover_k=crossover_k_at(n, d_s, epsilon, delta, "proven")
        if exact
        else crossover_k(epsilon, delta, t, "proven"),
        crossover_k_paper=crossover_k_at(n, d_s, epsilon, delta, "paper")
        if exact
        else crossover_k(epsilon, delta, t, "paper"),
        notes=notes,
    )
