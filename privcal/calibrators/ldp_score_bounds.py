"""LDP-CP-S statistics: the debiased estimate, the per-round pass cut-off, the slack Δ_S and
the default number of rounds (SPEC §7; Penso et al., seed 004, §3.2, Theorem 4).

Setting. Round j publishes a query q_j (a function of the earlier rounds only) and asks a
fresh, disjoint group of m subjects; subject i reports binary randomized response of
b_i = 1{s_i ≤ q_j}, kept with probability e^ε/(e^ε+1). The subjects are i.i.d. and the
groups random, so given q_j the m reports are i.i.d. Bernoulli(p(F)) with F = F(q_j) =
P(S ≤ q_j), the coverage of threshold q_j, and

    p(F) = F·e^ε/(e^ε+1) + (1 − F)/(e^ε+1),   increasing in F.

A threshold q_j is *released* only by a round whose report count ``ones`` passed the cut-off
(decision "stop", or "lower" then kept as the backed ``hi``). So coverage < G can happen
only if some round j had F(q_j) < G and passed; a union bound over the T rounds gives
failure probability ≤ δ whenever each round's pass probability at F < G is ≤ δ/T.

Two bound versions (``bound`` parameter; each release records the one it used and
``privcal audit verify`` recomputes it with that formula):

- ``"hoeffding"`` (calibrator version 1): estimate Z = c·ones/m − 1/(e^ε−1),
  c = (e^ε+1)/(e^ε−1), two-sided Hoeffding with range c and a union over T rounds:
  Δ_S = c·√(ln(2T/δ)/(2m)); pass iff Z ≥ 1−α+Δ_S (guaranteed) or Z ≥ 1−α (nominal,
  coverage ≥ 1−α−Δ_S).
- ``"exact"`` (version 2, the default): only the *upper* deviation of a round that passes
  matters, and P(Bin(m, p(F)) ≥ k) increases with F, so the smallest cut-off valid for every
  F < G is K = min{k : P(Bin(m, p(G)) ≥ k) ≤ δ/T}, computed from the exact binomial tail
  (:func:`~privcal.calibrators.tail_bounds.binomial_upper_cutoff`). Guaranteed mode: G =
  1−α, pass iff ones ≥ K. Nominal mode (the paper's rule Z ≥ 1−α, i.e. ones ≥ ⌈m·p(1−α)⌉):
  G is the largest level at which that rule's pass probability is ≤ δ/T
  (:func:`nominal_level`), and a round with more than n' reports passes only if it also
  clears K at G. Both are never larger than the Hoeffding cut-offs: Hoeffding bounds the
  same tail (one-sidedly even by a factor 2 less), so the exact minimum is ≤ it
  (``tests/test_ldp_score_bounds.py`` checks new ≤ old over a grid).
"""

from __future__ import annotations

import math
from typing import Literal

from privcal.calibrators.tail_bounds import binomial_upper_cutoff, binomial_upper_tail
from privcal.errors import InvalidInput

__all__ = [
    "MAX_ROUNDS",
    "Bound",
    "best_rounds",
    "debias",
    "exact_cutoff",
    "exact_min_epsilon",
    "exact_min_group",
    "exact_slack",
    "nominal_cutoff",
    "nominal_level",
    "report_probability",
    "rr_range",
    "score_slack",
]

Bound = Literal["exact", "hoeffding"]

#: the rounds searched by :func:`best_rounds` (2^−40 of the range is far below any Δ_S)
MAX_ROUNDS = 40


def _eps(epsilon: float) -> float:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidInput(f"ε must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def rr_range(epsilon: float) -> float:
    """c = (e^ε+1)/(e^ε−1) = coth(ε/2): the range of one debiased binary-RR report.

    An ε so small that c overflows a float (ε below ~2.2e-308, a subnormal) is refused: the
    debiased estimate would be ∞·x − ∞ = NaN, which a session's round could not store, and a
    release would state Δ_S = nan (red team 25, fedlocal F1: such a session opened, charged
    its subjects and then failed every batch that filled a round with a traceback)."""
    c = 1.0 / math.tanh(_eps(epsilon) / 2)
    if not math.isfinite(c):
        raise InvalidInput(f"ε = {epsilon!r} is too small: the debiased estimate's range "
                           "(e^ε+1)/(e^ε−1) overflows a float (use ε ≥ 1e-300)")
    return c


def _inv_expm1(epsilon: float) -> float:
    """1/(e^ε − 1), 0 where e^ε overflows."""
    return 0.0 if epsilon > 700 else 1.0 / math.expm1(epsilon)


def debias(ones: int, count: int, epsilon: float) -> float:
    """Z = c·(ones/count) − 1/(e^ε−1): unbiased for the fraction of true 1-bits (seed 004,
    Algorithm 3 line 8, with the mean over the group, not over n)."""
    if count < 1 or not (0 <= ones <= count):
        raise InvalidInput(f"need 0 ≤ ones ≤ count and count ≥ 1, got ones={ones}, count={count}")
    return rr_range(epsilon) * (ones / count) - _inv_expm1(epsilon)


def report_probability(f: float, epsilon: float) -> float:
    """p(F) = F·e^ε/(e^ε+1) + (1−F)/(e^ε+1): P(report = 1) when a fraction F has bit 1."""
    keep = 1.0 / (1.0 + math.exp(-_eps(epsilon)))  # e^ε/(e^ε+1), no overflow
    return min(1.0, max(0.0, f * keep + (1 - f) * (1 - keep)))


def _check(group_size: int, rounds: int, delta: float) -> None:
    if group_size < 1 or rounds < 1:
        raise InvalidInput(f"group size and rounds must be ≥ 1, got {group_size}, {rounds}")
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")


def score_slack(group_size: int, rounds: int, epsilon: float, delta: float) -> float:
    """Hoeffding Δ_S = c·√(ln(2T/δ)/(2n')) (bound version "hoeffding", calibrator version 1):
    with probability ≥ 1−δ all T estimates are within Δ_S."""
    _check(group_size, rounds, delta)
    return rr_range(epsilon) * math.sqrt(math.log(2 * rounds / delta) / (2 * group_size))


def exact_cutoff(count: int, rounds: int, alpha: float, epsilon: float, delta: float) -> int:
    """K = min{k : P(Bin(count, p(1−α)) ≥ k) ≤ δ/T}: a round passes iff ones ≥ K
    (guaranteed mode, bound "exact"); K = count + 1 means it never passes."""
    _check(count, rounds, delta)
    return binomial_upper_cutoff(count, report_probability(1 - alpha, epsilon), delta / rounds)


def exact_slack(group_size: int, rounds: int, alpha: float, epsilon: float, delta: float) -> float:
    """Δ_S on the Z scale for bound "exact": Z(K) − (1−α), K = :func:`exact_cutoff` at n'.

    The pass rule ones ≥ K is the same as Z ≥ 1−α+Δ_S for the debiased mean Z; Δ_S may
    exceed α (then no round can pass and every release is +∞)."""
    k = exact_cutoff(group_size, rounds, alpha, epsilon, delta)
    c = rr_range(epsilon)
    return c * (k / group_size) - _inv_expm1(epsilon) - (1 - alpha)


def _paper_cutoff(count: int, alpha: float, epsilon: float) -> int:
    """⌈count·p(1−α)⌉: the paper's nominal rule Z ≥ 1−α in counts (1e-12 guards rounding)."""
    return max(0, math.ceil(count * report_probability(1 - alpha, epsilon) - 1e-12))


def nominal_level(
    group_size: int, rounds: int, alpha: float, epsilon: float, delta: float
) -> float:
    """G: the largest F (to 2⁻⁴⁰) at which the nominal rule ones ≥ ⌈n'·p(1−α)⌉ passes a
    round with probability ≤ δ/T (bound "exact"); coverage ≥ G with probability ≥ 1−δ."""
    _check(group_size, rounds, delta)
    k = _paper_cutoff(group_size, alpha, epsilon)
    a = delta / rounds

    def ok(f: float) -> bool:
        return binomial_upper_tail(group_size, report_probability(f, epsilon), k) <= a

    if not ok(0.0):
        return 0.0
    lo, hi = 0.0, 1 - alpha
    if ok(hi):  # cannot happen for a sensible δ (the tail at p(1−α) is about 1/2)
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def nominal_cutoff(
    count: int, group_size: int, rounds: int, alpha: float, epsilon: float, delta: float
) -> int:
    """Nominal-mode pass cut-off for a round of ``count`` ≥ n' reports: the paper's
    ⌈count·p(1−α)⌉, raised if needed to the exact cut-off at level G (so rounds with more
    reports than n' keep the recorded guarantee G; at count = n' it is the paper's rule)."""
    g = nominal_level(group_size, rounds, alpha, epsilon, delta)
    guard = binomial_upper_cutoff(count, report_probability(g, epsilon), delta / rounds)
    return max(_paper_cutoff(count, alpha, epsilon), guard)


def best_rounds(
    n: int,
    epsilon: float,
    delta: float = 0.001,
    max_rounds: int = MAX_ROUNDS,
    *,
    alpha: float = 0.1,
    bound: Bound = "hoeffding",
) -> int:
    """The default number of rounds T: the T in 1..min(max_rounds, n) minimising
    Δ_S(T) + 2^−T, with Δ_S of the given bound version (α is used by "exact" only).

    2^−T is the width of the final bisection interval as a fraction of the public range,
    i.e. the probability mass it can hold when scores have density ≤ 1/(upper − lower)
    (uniform-like scores); Δ_S(T), the statistical slack, grows with T. The sum is a
    documented heuristic for the resolution/noise trade-off; the guarantee holds for any T.
    T depends on n (through n' = ⌊n/T⌋), ε, δ and, for "exact", α. Ties go to the smaller T.
    """
    if n < 1:
        raise InvalidInput(f"n must be ≥ 1, got {n}")
    best_t, best_v = 1, math.inf
    for t in range(1, min(max_rounds, n) + 1):
        if bound == "exact":
            s = exact_slack(n // t, t, alpha, epsilon, delta)
        else:
            s = score_slack(n // t, t, epsilon, delta)
        v = s + 2.0**-t
        if v < best_v:
            best_t, best_v = t, v
    return best_t


def exact_min_epsilon(group_size: int, rounds: int, alpha: float, slack: float, delta: float,
                      start: float | None = None) -> float | None:
    """An ε at which :func:`exact_slack` ≤ ``slack`` (advice; red team 23, privacy F2: the
    advice gave Hoeffding's ε, 1.8× what the recorded exact slack needs), by bisection below
    ``start`` (Hoeffding's ε, which the exact slack never needs more than) or a doubling
    search; checked at the ε returned. The exact slack moves in steps with its cut-off K, so
    it is not monotone in ε: a slightly smaller ε may reach ``slack`` too. None if no ε ≤ 512
    does (as ε → ∞ it tends to a positive limit)."""
    def ok(e: float) -> bool:
        return exact_slack(group_size, rounds, alpha, e, delta) <= slack

    hi = start if start is not None and ok(start) else None
    e = 1.0
    while hi is None and e <= 512:
        hi, e = (e if ok(e) else None), 2 * e
    if hi is None:
        return None
    lo = hi / 2
    while ok(lo):
        if lo < 1e-300:
            return lo
        hi, lo = lo, lo / 2
    for _ in range(200):  # ok(hi), not ok(lo)
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def exact_min_group(rounds: int, alpha: float, epsilon: float, slack: float, delta: float,
                    start: int) -> int:
    """A group size n' at which :func:`exact_slack` ≤ ``slack``, by bisection below ``start``
    (a group that reaches it, e.g. Hoeffding's n', which the exact slack never needs more
    than); checked at the n' returned. Like ε, n' moves the cut-off in steps (not monotone).
    Past 10¹² (where the binomial quantile is no longer computed reliably) ``start``."""
    def ok(g: int) -> bool:
        return exact_slack(g, rounds, alpha, epsilon, delta) <= slack

    hi = max(1, start)
    if hi > 10**12 or not ok(hi):
        return hi
    lo = 0  # n' ≥ 1: 0 stands for "fails"
    while hi - lo > 1:  # ok(hi), and lo = 0 or not ok(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi
