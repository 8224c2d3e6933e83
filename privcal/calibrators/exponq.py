"""ExponQ: private split conformal with the exponential mechanism, central ε-DP (SPEC §5).

Angelopoulos, Bates, Zrnic, Jordan, *Private Prediction Sets* (Harvard Data
Science Review 4(2), 2022), Algorithm 2 (private conformal calibration) with
Algorithm 1 (private quantile), Theorem 2 (coverage) and the optimal γ of their
Proposition 3; as summarised in Romanus & Molinari (seed 003, §2 and §5, where
it is the "ExponQ" baseline). SPEC §5 corrections to the released code:
Δ = max(1/q̃, 1/(1−q̃)) (not ε·min(α, 1−α), which is not ε-DP); +inf when
q̃ ≥ 1 (not the max score, which is not private); m deterministic (not chosen
by a random simulation).

The inflated level q̃ = (n+1)(1−α)/(n(1−γα)) + (2/(εn))·ln(m/(γα)) makes the
exponential mechanism's rank error exceed its budget with probability ≤ γα,
and the remaining (1−γα) of the time the released grid point is at least the
empirical quantile of level (n+1)(1−α)/(n(1−γα)), so the marginal coverage
is ≥ (1−γα)·(1−α)/(1−γα) = 1−α (Angelopoulos et al. 2022, Thm 2).

Review (issue 14.8)
-------------------
- **Privacy claim**: ε-DP (pure, central), recorded as ``PureDP(ε)``.
  Neighbouring relation: substitution of one calibration score, n public
  (``privacy["neighbouring"]``). n is public because q̃ and the default m are
  functions of n; under add/remove of a record n would change and the released
  threshold could switch between +∞ (q̃ ≥ 1) and a finite value, so no
  add/remove claim is made.
- **Sensitivity**: each weight w_j = max(N_<(e_j)/q̃, N_>(e_j)/(1−q̃)) moves by at
  most Δ = max(1/q̃, 1/(1−q̃)) under a substitution (each count by ≤ 1).
- **Sampler**: exact (:func:`~privcal.calibrators.mechanisms.exponential.sample_index`:
  exact rationals and lazily refined comparisons, no float CDF); uniform bits
  from ``rng`` — ``secrets.SystemRandom`` (OS CSPRNG) in production.
- **Coverage claim**: P(Y ∈ C(X)) ≥ 1−α, marginal over the calibration data,
  the mechanism's randomness and the test point (Thm 2). Assumptions, each
  enforced: (i) the calibration and test scores are exchangeable (the user's
  data; not checkable); (ii) q̃ ≥ 1/2, which the rank-error bound with
  Δ = 1/(1−q̃) needs — guaranteed by refusing α > 1/2 (:class:`ExponQParams`);
  (iii) q̃ < 1, else +∞ is released; (iv) **no score range is assumed**: each
  score is mapped by the fixed monotone map g(s) = (smallest grid point ≥
  min(s, b)), the theorem holds for g(S), and g(S) ≤ e_j ⇔ S ≤ e_j for every
  grid point e_j < b, so a threshold below the top grid point means the same
  set for S; a draw of the top grid point b (which scores above b are rounded
  into) is released as +∞. Scores below ``lower`` round up to e_0 = a and can
  only make the threshold conservative. The default range is [0, 1]; for
  scores that can exceed it (``absolute`` residuals, ``raps`` with a penalty)
  pass a public ``--upper`` that covers them, or most releases will be +∞.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import ClassVar

from pydantic import Field, model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
)
from privcal.calibrators.bound_floats import float_at_most, text_at_most
from privcal.calibrators.mechanisms.exponential import exponential_quantile, grid
from privcal.calibrators.score_range import check_range_arithmetic
from privcal.calibrators.split import _scores
from privcal.costs import PureDP
from privcal.errors import InvalidInput

__all__ = ["ExponQ", "ExponQParams", "default_bins", "inflated_level", "optimal_gamma"]

#: bounds of the default number of bins (see :func:`default_bins`)
MIN_BINS, MAX_BINS = 100, 100_000
#: the largest ``bins`` accepted (≈ 50 MB of work arrays; checked before anything is charged)
BINS_LIMIT = 1_000_000


class ExponQParams(CalibratorParams):
    """Parameters of ExponQ (SPEC §5)."""

    epsilon: float = Field(
        gt=0, allow_inf_nan=False, description="privacy budget ε (pure ε-DP), > 0"
    )
    lower: float = Field(
        default=0.0, allow_inf_nan=False, description="public lower bound a of the score range"
    )
    upper: float = Field(
        default=1.0, allow_inf_nan=False, description="public upper bound b of the score range"
    )
    bins: int | None = Field(
        default=None,
        ge=2,
        le=BINS_LIMIT,
        description="number m of grid points on [lower, upper] (2 … "
        f"{BINS_LIMIT:,}); default clamp(⌈ε·n/2⌉, {MIN_BINS}, {MAX_BINS})",
    )

    @model_validator(mode="after")
    def _range(self) -> ExponQParams:
        check_range_arithmetic(self.lower, self.upper)
        if self.alpha > 0.5:
            # the coverage proof (Angelopoulos et al. 2022, Thm 2) converts the mechanism's
            # weight error into a rank error with Δ = 1/(1−q̃), i.e. it needs q̃ ≥ 1/2, and
            # α ≤ 1/2 ⇒ q̃ > (1−α)(n+1)/n ≥ 1/2
            raise ValueError(
                f"exponq needs α ≤ 1/2 (its coverage proof uses q̃ ≥ 1/2), got {self.alpha}"
            )
        return self


def default_bins(epsilon: float, n: int) -> int:
    """Default m = clamp(⌈ε·n/2⌉, 100, 100 000): deterministic, from public quantities only.

    Why: the privacy slack of q̃ is (2/(εn))·ln(m/(γα)) of quantile mass, while
    rounding scores up to a grid of width (b−a)/(m−1) overshoots the quantile by
    about f·(b−a)/m of mass (f the score density relative to the range, ≈ 1 for
    scores spread over [a, b]). The sum 2·ln(m)/(εn) + 1/m is smallest at
    m = εn/2. The floor keeps the grid from being coarse when εn is small (the
    log term then dominates anyway); the cap bounds memory and time.
    """
    return min(max(math.ceil(epsilon * n / 2), MIN_BINS), MAX_BINS)


def optimal_gamma(alpha: float, epsilon: float, n: int) -> float:
    """The root in (0, 1/α) of α²γ² − (αε(n+1)(1−α)/2 + 2α)γ + 1 = 0 that minimises q̃ (SPEC §5).

    Setting dq̃/dγ = 0 gives that quadratic; its roots are real and positive
    (product 1/α², discriminant α²((ε(n+1)(1−α)/2 + 2)² − 4) > 0) and q̃ falls
    up to the smaller one, which is the one returned. It is computed as
    2/(−B + √(B² − 4α²)), which does not cancel. It can be ≥ 1 (ε·n small); then
    q̃ > 1 for every γ in (0, 1) and the caller returns +inf.
    """
    b = alpha * epsilon * (n + 1) * (1 - alpha) / 2 + 2 * alpha
    return 2.0 / (b + math.sqrt(b * b - 4 * alpha * alpha))


def inflated_level(alpha: float, epsilon: float, n: int, m: int, gamma: float) -> float:
    """q̃ = (n+1)(1−α)/(n(1−γα)) + (2/(εn))·ln(m/(γα)) (SPEC §5; Angelopoulos et al., Alg. 2)."""
    return (n + 1) * (1 - alpha) / (n * (1 - gamma * alpha)) + (2 / (epsilon * n)) * math.log(
        m / (gamma * alpha)
    )


def proven_lower(alpha: float, gamma: float, n: int) -> Fraction:
    """A rational lower bound of the coverage Thm 2 proves, for the recorded ``lower``.

    The proof (as in Humbert et al. 2023, proof of Thm 4.1, eq. (20)): with probability
    ≥ 1−γα given the scores, the draw is at least the k-th smallest score,
    k = ⌈(n+1)(1−α)/(1−γα)⌉, so P(Y ∈ C(X)) ≥ (1−γα)·k/(n+1), which exceeds 1−α by
    (1−γα)(k − x)/(n+1), x = (n+1)(1−α)/(1−γα). That ceiling's slack is what lets the float
    1−α (an ulp above the decimal 1−α for about one α in five, e.g. α = 0.18 →
    0.8200000000000001) be recorded unchanged: it is far more than an ulp unless x lies just
    above an integer. x is taken exactly from the float α and γ the mechanism uses, and k
    from x less a margin n·1e−11 (which covers the float error of q̃ and of its log term,
    ~1e−15 relative, in ranks), so this bound holds for the q̃ actually computed. Where the
    slack is smaller than the ulp, ``float_at_most`` records a smaller float.
    """
    a, g = Fraction(alpha), Fraction(gamma)
    x = (n + 1) * (1 - a) / (1 - g * a)
    k = math.ceil(x - Fraction(n) * Fraction(1, 10**11))
    return (1 - g * a) * k / (n + 1)


class ExponQ:
    """ExponQ: ε-DP conformal threshold by the exponential mechanism on a public grid."""

    name: ClassVar[str] = "exponq"
    version: ClassVar[str] = "1.0.0"
    privacy_model: ClassVar[PrivacyModel] = "central-pure"
    #: its scores: at least two, finite (``_scores``), checked before the charge
    min_scores: ClassVar[int] = 2
    #: the neighbouring relation of the privacy claim (recorded as ``privacy["neighbouring"]``)
    neighbouring: ClassVar[str] = (
        "substitution of one calibration score; n is public (q̃ and the grid depend on n; "
        "add/remove is not claimed)"
    )
    Params: ClassVar[type[CalibratorParams]] = ExponQParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores"})
    summary: ClassVar[str] = (
        "ExponQ (ε-DP): exponential mechanism over binned scores at an inflated level "
        "(Angelopoulos et al. 2022)"
    )

    def cost(self, params: ExponQParams, shape: DataShape) -> PureDP:
        """ε-DP: one exponential mechanism with sensitivity Δ (McSherry & Talwar 2007)."""
        return PureDP(eps=params.epsilon)

    def plan(self, params: ExponQParams, n: int) -> tuple[int, float, float]:
        """(m, γ, q̃) from public quantities; q̃ ≥ 1 (or γ ≥ 1) means the threshold is +inf."""
        if n < 1:
            raise InvalidInput(f"n must be ≥ 1, got {n}")
        m = params.bins if params.bins is not None else default_bins(params.epsilon, n)
        gamma = optimal_gamma(params.alpha, params.epsilon, n)
        if gamma >= 1:
            return m, gamma, math.inf
        return m, gamma, inflated_level(params.alpha, params.epsilon, n, m, gamma)

    def guarantee(self, params: ExponQParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage ≥ 1−α, marginal over calibration data, mechanism and test point (Thm 2)."""
        n, alpha = shape.n, params.alpha
        m, gamma, q = self.plan(params, n)
        # the grid the mechanism will use, checked before the charge: a range whose width
        # overflows, or a step below the floats' resolution, would refuse only after it
        grid(params.lower, params.upper, m)
        details: dict[str, float | int | str | None] = {
            "n": n,
            "alpha": alpha,
            "epsilon": params.epsilon,
            "bins": m,
            "gamma": gamma,
            "q_tilde": q if math.isfinite(q) else "inf",
            "sensitivity": max(1 / q, 1 / (1 - q)) if q < 1 else None,
            "lower_bound_range": params.lower,
            "upper_bound_range": params.upper,
        }
        over = (
            "calibration data, the mechanism's randomness and the test point (marginal; "
            "exchangeable scores; a draw of the top grid point is released as +inf)"
        )
        if q >= 1:
            return CoverageGuarantee(
                target=1 - alpha,
                lower=1.0,
                upper=1.0,
                failure_probability=0.0,
                over=over,
                statement=(
                    f"inflated level q̃ ≥ 1 for n = {n}, ε = {params.epsilon}: the threshold is "
                    "+inf and every set contains every label (coverage 1)"
                ),
                details=details,
            )
        bound = proven_lower(alpha, gamma, n)
        return CoverageGuarantee(
            target=1 - alpha,
            lower=float_at_most(1 - alpha, bound),
            upper=None,
            failure_probability=0.0,
            over=over,
            statement=(
                f"P(Y ∈ C(X)) ≥ {text_at_most(1 - alpha, bound)}, marginally over the "
                "calibration data, the "
                f"mechanism's randomness and the test point (Angelopoulos et al. 2022, Thm 2; "
                f"q̃ = {q:.6g}, m = {m} bins)"
            ),
            details=details,
        )

    def calibrate(
        self, data: CalibrationInput, params: ExponQParams, rng: random.Random
    ) -> CalibrationResult:
        """Sample a grid point at level q̃ with the exact ε-DP exponential mechanism.

        +inf when q̃ ≥ 1, and when the draw is the top grid point ``upper`` (scores above
        the range are rounded into it, so it does not certify any finite threshold).
        """
        s = _scores(data)
        n = s.shape[0]
        m, gamma, q = self.plan(params, n)
        diag: dict[str, object] = {"bins": m, "gamma": gamma, "q_tilde": q}
        if q >= 1:
            diag["q_tilde"] = "inf" if math.isinf(q) else q
            return CalibrationResult(threshold=math.inf, diagnostics=diag)
        j, t = exponential_quantile(s, grid(params.lower, params.upper, m), q, params.epsilon, rng)
        top = j == m - 1
        return CalibrationResult(
            threshold=math.inf if top else t, diagnostics={**diag, "bin": j, "top_bin": top}
        )
