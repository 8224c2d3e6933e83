"""Red team 8 (mutation audit m3): the exact samplers, the tail cut-offs, prediction sets and
class labels — code no test pinned down (second half of the audit of tests/
test_red_team_8_mutants.py).

Each test kills a mutant the suite let through. References are derived here from the
definitions (exact rationals, or :mod:`decimal` at 100+ digits), never copied from the code
under test:

- the exponential mechanism's sampler (``sample_index``) is checked exactly, without sampling:
  its proposal gives grid point j exactly 2^(−L_j) of the mass, its acceptance probability
  exp(−(d_j − s))·2^(L_j) is ≤ 1, and d_j − d_0 equals ε·(w_j − w_0)/(2Δ) from SPEC §5;
- ``_bernoulli_exp_piece`` returns True exactly when the uniform it reads is below
  exp(−t)·2^shift, reading more bits while undecided, and ``_exp_bounds`` is rigorous;
- the discrete-Gaussian cut-off is valid and smallest also past its pmf table (tiny levels),
  against an exact tail.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from privcal.calibrators.base import DataShape
from privcal.calibrators.exponq import ExponQ, ExponQParams, proven_lower
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.mechanisms import exponential as em
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.calibrators.tail_bounds import discrete_gaussian_cutoff

#: decimal digits of the reference computations
_DIGITS = 120


def _exp_neg(t: Fraction, digits: int = _DIGITS) -> Decimal:
    """exp(−t) to ``digits`` significant digits (error ≪ 10^(−digits+5) relative)."""
    with localcontext(Context(prec=digits + 10)):
        return (-(Decimal(t.numerator) / Decimal(t.denominator))).exp()


def _ln2_upper() -> Fraction:
    with localcontext(Context(prec=_DIGITS)):
        return Fraction(Decimal(2).ln()) + Fraction(1, 10 ** (_DIGITS - 5))


# ------------------------------------------------------- the exponential mechanism's sampler


class _FixedDraw:
    """An rng whose ``randrange`` returns one chosen value (the proposal's uniform)."""

    def __init__(self, r: int) -> None:
        self.r = r

    def randrange(self, n: int) -> int:
        assert 0 <= self.r < n, (self.r, n)
        return self.r

    def getrandbits(self, k: int) -> int:  # pragma: no cover - the acceptance is stubbed
        raise AssertionError("the acceptance draw is stubbed")


def _proposal(below, above, q, eps, r, monkeypatch):
    """(j, t_j, shift_j) proposed for the uniform r, the acceptance stubbed to True."""
    seen: list[tuple[Fraction, int]] = []

    def accept(t: Fraction, shift: int, rng) -> bool:
        seen.append((t, shift))
        return True

    monkeypatch.setattr(em, "_bernoulli_exp_scaled", accept)
    j = em.sample_index(np.asarray(below), np.asarray(above), q, eps, _FixedDraw(r))
    assert len(seen) == 1
    return j, seen[0][0], seen[0][1]


def _weights_from_definition(below, above, q: float, eps: float) -> list[Fraction]:
    """d_j = ε·w_j/(2Δ), w_j = max(N_<(e_j)/q, N_>(e_j)/(1−q)), Δ = max(1/q, 1/(1−q))
    (SPEC §5), with q its exact binary value and ε the decimal typed."""
    qq, ee = Fraction(q), Fraction(repr(eps))
    delta = max(1 / qq, 1 / (1 - qq))
    return [ee * max(Fraction(int(b)) / qq, Fraction(int(a)) / (1 - qq)) / (2 * delta)
            for b, a in zip(below, above, strict=True)]


CASES = [
    # (counts per grid point, q, ε): n = sum(counts)
    ([3, 0, 5, 9, 2, 0, 1, 4, 6], 0.8, 2.0),
    ([0, 0, 0, 40, 0, 0, 0], 0.9, 1.0),
    ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 0.3, 0.7),
    ([200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], 0.95, 9.0),
]


@pytest.mark.parametrize(("counts", "q", "eps"), CASES)
def test_exponential_sampler_is_exactly_the_mechanism(counts, q, eps, monkeypatch) -> None:
    """The exact sampler, checked without sampling: for each grid point j, the set of proposal
    uniforms r that propose j is an interval of exactly 2^(K−L_j) values (found by bisection
    over r), L_j the shift its acceptance draw is given; the acceptance probability
    exp(−t_j)·2^(L_j) is ≤ 1 (t_j ≥ L_j·ln 2, t_j ≥ 0); and t_j − t_0 = d_j − d_0 with d from
    SPEC §5. Then P(j) ∝ 2^(K−L_j)·exp(−t_j)·2^(L_j) ∝ exp(−d_j) exactly: pure ε-DP as
    recorded. (Mutants: the proposal's ``searchsorted`` side, the shift s above min d_j, the
    levels L_j one too high or from the min of the two counts, w_j's min for max or 1/q for
    1/(1−q), the mechanism's N_>(e_j) counting the bin itself.)"""
    counts = np.asarray(counts, dtype=np.int64)
    below = np.cumsum(counts) - counts
    above = counts.sum() - below - counts
    m = counts.size
    d = _weights_from_definition(below, above, q, eps)
    ln2 = _ln2_upper()

    # the first uniform that proposes each j (bisection: the proposal is monotone in r)
    info: dict[int, tuple[Fraction, int]] = {}

    def prop(r: int) -> int:
        j, t, shift = _proposal(below, above, q, eps, r, monkeypatch)
        info[j] = (t, shift)
        return j

    total = None

    class _Size:
        def randrange(self, n: int) -> int:
            nonlocal total
            total = n
            return 0

    monkeypatch.setattr(em, "_bernoulli_exp_scaled", lambda t, s, rng: True)
    em.sample_index(below, above, q, eps, _Size())
    assert total is not None
    starts = []
    for j in range(m):
        lo, hi = -1, total  # prop(lo) < j ≤ prop(hi)  (prop(total) := m)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if prop(mid) >= j:
                hi = mid
            else:
                lo = mid
        starts.append(hi)
    starts.append(total)
    assert starts[0] == 0
    sizes = [starts[j + 1] - starts[j] for j in range(m)]
    shifts = [info[j][1] for j in range(m)]
    ts = [info[j][0] for j in range(m)]
    k = sizes[0].bit_length() - 1 + shifts[0]  # K: sizes[j] must be 2^(K − L_j)
    for j in range(m):
        assert sizes[j] == 1 << (k - shifts[j]), (j, sizes, shifts)
        assert ts[j] >= 0, (j, ts[j])
        assert ts[j] >= shifts[j] * ln2, (j, ts[j], shifts[j])  # acceptance ≤ 1
        assert ts[j] - ts[0] == d[j] - d[0], j
    assert sum(sizes) == total


def test_exponential_quantile_counts_are_n_below_and_n_above(monkeypatch) -> None:
    """``exponential_quantile`` hands the sampler N_<(e_j) and N_>(e_j) of the scores rounded up
    to the grid (SPEC §5): counted here one score at a time."""
    scores = np.array([0.0, 0.1, 0.1, 0.25, 0.3, 0.5, 0.55, 0.9, 1.0, 1.7, -0.2])
    e = em.grid(0.0, 1.0, 11)
    got = {}

    def fake(below, above, q, eps, rng):
        got["below"], got["above"] = np.asarray(below).tolist(), np.asarray(above).tolist()
        return 0

    monkeypatch.setattr(em, "sample_index", fake)
    em.exponential_quantile(scores, e, 0.9, 1.0, None)
    rounded = [min(int(np.searchsorted(e, s, side="left")), e.size - 1) for s in scores]
    assert got["below"] == [sum(r < j for r in rounded) for j in range(e.size)]
    assert got["above"] == [sum(r > j for r in rounded) for j in range(e.size)]


class _Bits:
    """An rng whose ``getrandbits(64)`` returns the given words in order."""

    def __init__(self, words: list[int]) -> None:
        self.words = list(words)
        self.used = 0

    def getrandbits(self, k: int) -> int:
        assert k == 64
        self.used += 1
        return self.words.pop(0)


@pytest.mark.parametrize(("t", "shift"), [
    (Fraction(1, 2), 0), (Fraction(1), 0), (Fraction(7, 3), 1), (Fraction(3, 10), 0),
    (Fraction(50), 70), (Fraction(123456789, 10**7), 3),
])
def test_bernoulli_exp_piece_compares_the_uniform_with_the_exact_probability(t, shift) -> None:
    """The uniform V = 0.w₁w₂… (64-bit words) is compared with p = exp(−t)·2^shift exactly: with
    w₁ the word that contains p, V is undecided after one word, so a second word is read,
    and V just below p gives True, just above gives False. (Mutants: deciding on the first
    word's lower/upper end, t ≤ 1 taken as p = 1.)"""
    p = Fraction(_exp_neg(t)) * 2**shift
    assert 0 < p < 1
    with localcontext(Context(prec=400)):  # finding M3-1 aside (test below)
        _check_piece(t, shift, p)


def _check_piece(t: Fraction, shift: int, p: Fraction) -> None:
    w1 = math.floor(p * 2**64)
    w2 = math.floor((p * 2**64 - w1) * 2**64)  # V = (w1·2^64 + w2)/2^128 ≤ p < V + 2^-128
    assert 0 < w2 < 2**64 - 1
    below = _Bits([w1, w2 - 1, 0, 0])  # V < p
    above = _Bits([w1, w2 + 1, 0, 0])  # V > p
    assert em._bernoulli_exp_piece(t, shift, below) is True
    assert em._bernoulli_exp_piece(t, shift, above) is False
    assert below.used >= 2 and above.used >= 2


@pytest.mark.parametrize("t", [Fraction(1, 2), Fraction(1), Fraction(2), Fraction(3, 4),
                               Fraction(5), Fraction(1, 8), Fraction(10), Fraction(1, 3),
                               Fraction(22, 7), Fraction(40), Fraction(999, 1000)])
@pytest.mark.parametrize("digits", [30, 50])
def test_exp_bounds_are_rigorous(t: Fraction, digits: int) -> None:
    """``_exp_bounds(t, d)`` brackets exp(−t): lo ≤ exp(−t) ≤ hi, against exp(−t) to 120 digits.
    (Mutant: no widening — ``Decimal.exp`` rounds to nearest, so for a t exact in d digits
    (1/2, 1, 2, …) hi is below exp(−t) about half the time.)"""
    with localcontext(Context(prec=400)):  # finding M3-1 aside (test below)
        lo, hi = em._exp_bounds(t, digits)
    ref = Fraction(_exp_neg(t))
    eps = ref / 10**100
    assert lo <= ref - eps and ref + eps <= hi, (t, digits)
    assert hi - lo <= ref * Fraction(1, 10 ** (digits - 4))  # and tight


@pytest.mark.parametrize("prec", [28, 5])
def test_exp_bounds_do_not_depend_on_the_thread_decimal_context(prec: int) -> None:
    """Finding M3-1 (fixed): ``-t_lo`` / ``-t_hi`` rounded to the *thread's* precision, so at
    the default 28 digits the bounds of exp(−7/3) missed it by 3·10⁻²⁸ relative at every
    ``digits``, and under a caller's ``getcontext().prec = 5`` (an agent embedding
    ``fedcp2_qq_message``) by ~10⁻⁵·t — the 'exact' sampler then drew from another
    distribution (privacy loss 10 for a claimed ε = 1 between two neighbours). The
    negation is ``copy_negate`` now: exact, in no context."""
    t = Fraction(7, 3)
    ref = Fraction(_exp_neg(t))
    with localcontext(Context(prec=prec)):
        for digits in (30, 50, 70):
            lo, hi = em._exp_bounds(t, digits)
            assert lo <= ref <= hi, digits


# -------------------------------------------------- discrete Gaussian cut-off past its table


def _dg_tail_exact(s2: Fraction, k: int) -> Fraction:
    """P(Z ≥ k), Z ~ N_ℤ(0, σ²), to 80 digits: the sums are cut where the terms are < 10⁻⁴⁰⁰."""
    with localcontext(Context(prec=90)):
        two_s2 = Decimal(2 * s2.numerator) / Decimal(s2.denominator)
        r = math.isqrt(int(2 * 1000 * s2)) + k + 10
        f = [(-(Decimal(z * z) / two_s2)).exp() for z in range(r + 1)]
        total = f[0] + 2 * sum(f[1:])
        return Fraction(sum(f[k:]) / total)


@pytest.mark.parametrize("s2", [Fraction(1), Fraction(5, 2), Fraction(1, 3)])
@pytest.mark.parametrize("a", [1e-40, 1e-80, 1e-150, 1e-250])
def test_discrete_gaussian_cutoff_is_valid_past_its_table(s2: Fraction, a: float) -> None:
    """At tiny levels the cut-off lies past the pmf table (R = ⌈14σ⌉ + 2), where the closed
    form f(k) + ∫_k^∞ f bounds the tail: P(Z > t) ≤ a must still hold exactly, and t be at
    most one above the smallest valid cut-off. (Mutants: the closed form without f(k), or with
    half its integral — both under-state the tail, a cut-off too small: a P-COQS τ whose event
    E fails with probability above β/N.)"""
    t = discrete_gaussian_cutoff(s2, a)
    assert _dg_tail_exact(s2, t + 1) <= Fraction(a), (t, float(_dg_tail_exact(s2, t + 1)))
    assert _dg_tail_exact(s2, t - 1) > Fraction(a)


@pytest.mark.parametrize("a", [1e-6, 1e-12, 1e-30])
def test_discrete_gaussian_cutoff_is_valid_past_a_capped_table(a: float) -> None:
    """σ = 10⁶: the table stops at 2·10⁶ terms, below 14σ, so the cut-off (≈ 5–11σ) comes from
    the closed form. A lower bound of the true tail — ∫_{t+1}^∞ f over D ≤ √(2π)σ·(1 + 10⁻⁹⁰⁰⁰)
    (Poisson summation), i.e. erfc((t+1)/(σ√2))/2 — must be ≤ a. (Mutant: the closed form's
    integral halved, a cut-off where the true tail is ≈ 2a.)"""
    s2 = Fraction(10**12)
    t = discrete_gaussian_cutoff(s2, a)
    assert math.erfc((t + 1) / (1e6 * math.sqrt(2))) / 2 <= a * (1 + 1e-9), t


# ---------------------------------------------------- P-COQS statement: the printed lower


@pytest.mark.parametrize("n", [139, 259, 339, 1019, 1299, 2379, 7139])
@pytest.mark.parametrize("alpha", [0.1, 0.05, 0.2])
def test_pcoqs_nominal_statement_never_prints_more_than_the_proof(n: int, alpha: float) -> None:
    """The nominal statement's lower bound, read as the decimal printed, is ≤ ⌈r − τ⌉/(n+1),
    r = ⌈(1−α)(n+1)⌉ — the proof's bound on E. With (1−α)(n+1) and τ integers the float lower
    is that rational's nearest float, and printing it to 6 significant digits rounds up half
    the time (877/1001 = 0.8761238… → '0.876124'). (Mutant: the statement prints lower:.6g.)"""
    p = PCOQSParams(alpha=alpha, rho=1.0, nominal=True)
    g = PCOQS().guarantee(p, DataShape(n=n))
    tau = g.details["tau"]
    r = math.ceil((n + 1) * (1 - Fraction(repr(alpha))))
    bound = Fraction(max(0, math.ceil(r - Fraction(tau))), n + 1)
    printed = g.statement.split(" ≤ P(Y", 1)[0].split()[-1]
    assert Fraction(printed) <= bound, (printed, float(bound))
    assert Fraction(repr(g.lower)) <= bound


# ------------------------------------------------------------- ExponQ: the proven lower


@pytest.mark.parametrize(("alpha", "eps", "n"), [
    (0.1, 1.0, 1000), (0.18, 2.0, 500), (0.05, 0.5, 20000), (0.3, 8.0, 99), (0.1, 1.0, 1234),
])
def test_exponq_proven_lower_is_the_theorem_s_bound(alpha: float, eps: float, n: int) -> None:
    """Thm 2's bound (1−γα)·k/(n+1), k = ⌈(n+1)(1−α)/(1−γα)⌉, from the float α and the recorded
    γ — never more (mutant: k one larger). The recorded lower is ≤ it."""
    g = ExponQ().guarantee(ExponQParams(alpha=alpha, epsilon=eps), DataShape(n=n))
    gamma = g.details["gamma"]
    a, gg = Fraction(alpha), Fraction(gamma)
    x = (n + 1) * (1 - a) / (1 - gg * a)
    assert abs(x - round(x)) > Fraction(1, 10**6)  # away from an integer: k is ⌈x⌉
    ref = (1 - gg * a) * math.ceil(x) / (n + 1)
    assert proven_lower(alpha, gamma, n) == ref
    assert Fraction(repr(g.lower)) <= ref


# ----------------------------------------------------- LDP-CP-S (hoeffding and exact rules)


def _rr_c(eps: float) -> float:
    return (math.exp(eps) + 1) / (math.exp(eps) - 1)


def _hoeffding_slack(eps: float, n_prime: int, rounds: int, delta: float) -> float:
    return _rr_c(eps) * math.sqrt(math.log(2 * rounds / delta) / (2 * n_prime))


@pytest.mark.parametrize(("eps", "n_prime", "rounds"), [(2.0, 400, 5), (1.0, 2000, 8)])
def test_ldp_score_hoeffding_round_needs_one_minus_alpha_plus_slack(eps, n_prime, rounds) -> None:
    """Guaranteed mode, Hoeffding bound: a round passes iff Z = c·ones/n' − 1/(e^ε−1) ≥ 1−α+Δ_S,
    Δ_S = c·√(ln(2T/δ)/(2n')) — a round with 1−α ≤ Z < 1−α+Δ_S does not (mutant: compared with
    1−α, which passes rounds the proof does not cover: coverage below the recorded 1−α)."""
    alpha, delta = 0.1, 0.01
    proto = LdpScoreProtocol.open(alpha=alpha, epsilon=eps, rounds=rounds, group_size=n_prime,
                                  delta=delta, bound="hoeffding")
    c, shift = _rr_c(eps), 1 / (math.exp(eps) - 1)
    need = 1 - alpha + _hoeffding_slack(eps, n_prime, rounds, delta)
    z = [c * k / n_prime - shift for k in range(n_prime + 1)]
    inside = [k for k in range(n_prime + 1) if 1 - alpha + 1e-9 < z[k] < need - 1e-9]
    assert inside
    for k in inside:
        assert not proto.passes(k, n_prime), k
    passing = [k for k in range(n_prime + 1) if z[k] >= need + 1e-9]
    assert passing and all(proto.passes(k, n_prime) for k in passing)


@pytest.mark.parametrize(("eps", "n_prime", "rounds"), [(2.0, 400, 5), (1.0, 2000, 8)])
def test_ldp_score_nominal_hoeffding_lower_is_one_minus_alpha_minus_slack(eps, n_prime, rounds):
    """Nominal mode, Hoeffding bound: the protocol's proven level is 1−α−Δ_S (mutant: 1−α —
    the value the protocol's own recipe, release(proto.threshold, proto.guarantee_lower()),
    would record)."""
    alpha, delta = 0.1, 0.01
    proto = LdpScoreProtocol.open(alpha=alpha, epsilon=eps, rounds=rounds, group_size=n_prime,
                                  delta=delta, bound="hoeffding", nominal=True)
    want = max(0.0, 1 - alpha - _hoeffding_slack(eps, n_prime, rounds, delta))
    assert proto.guarantee_lower() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("eps", "n_prime", "rounds"), [(2.0, 400, 5), (1.0, 2000, 8),
                                                        (4.0, 150, 3)])
def test_ldp_score_exact_slack_is_the_pass_rule_on_the_z_scale(eps, n_prime, rounds) -> None:
    """Bound "exact": the recorded Δ_S is the debiased mean of the cut-off K minus 1−α, so
    'ones ≥ K' ⇔ 'Z ≥ 1−α+Δ_S' (mutant: (K−1)/n', a Δ_S one report too small)."""
    alpha, delta = 0.1, 0.01
    proto = LdpScoreProtocol.open(alpha=alpha, epsilon=eps, rounds=rounds, group_size=n_prime,
                                  delta=delta)
    k = proto.cutoff(n_prime)
    z_k = _rr_c(eps) * k / n_prime - 1 / (math.exp(eps) - 1)
    assert proto.slack == pytest.approx(z_k - (1 - alpha), abs=1e-12)
