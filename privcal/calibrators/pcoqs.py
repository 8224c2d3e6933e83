"""P-COQS: private conformity via quantile search, central ρ-zCDP (SPEC §4).

Romanus & Molinari, *Differentially Private Conformal Prediction via Quantile
Binary Search* (seed 003): §3, Algorithm 1 (noisy binary search, after Huang,
Liang, Yi 2021 PrivQuant), Algorithm 2 (P-COQS), eq. (2) (NoisyRC), Proposition 1
(rank error τ) and Theorem 2 (coverage bounds). Decisions of SPEC §4 that differ
from the paper: the loop runs exactly N times (not N+1), returns ``right`` (not
the midpoint), counts are not floored nor the output rounded, the noise is an
exact discrete Gaussian (Canonne, Kamath, Steinke 2020, Algorithm 3) rather than
a float Gaussian, and by default the target rank is inflated by τ so that
coverage ≥ 1−α holds with probability ≥ 1−β.

Why the bound is exact with ``right``: ``right`` only ever moves to a midpoint
whose noisy count was ≥ the target rank r'. On the event E₊ that all N noise
draws satisfy Z ≤ τ, the true count #{s ≤ right} ≥ r' − τ ≥ (1−α)(n+1), so
``right`` is at least the ⌈(1−α)(n+1)⌉-th smallest score (or is b, above every
in-range score), and split-conformal exchangeability gives coverage ≥ 1−α.
E₊ depends only on the noise, which is independent of the data. P(not E₊) ≤ β
by a union bound over the N draws when P(Z > τ) ≤ β/N. Only the *upper* tail
matters: a noise below −τ can only move ``left`` up, never release a low
``right``. Two bound versions (parameter ``bound``; each release records its own and
``privcal audit verify`` recomputes it by that formula):

- ``"exact"`` (calibrator version ≥ 2.0.0, the default, issue 13): τ is the smallest
  integer with P(Z > τ) ≤ β/N for Z ~ N_ℤ(0, σ²), σ² = N/(2ρ), from the exact
  discrete-Gaussian tail (:func:`~privcal.calibrators.tail_bounds.discrete_gaussian_cutoff`,
  proof there). The counts and the noise are integers, so an integer τ loses nothing,
  and r' = ⌈(1−α)(n+1)⌉ + τ.
- ``"subgaussian"`` (version 1.0.0): the discrete Gaussian is σ²-subgaussian (CKS20,
  Corollary 9), P(|Z| > τ) ≤ 2·exp(−τ²/(2σ²)), so τ = √((N/ρ)·ln(2N/β)) (seed 003,
  Proposition 1; two-sided). Since P(Z > τ_sub) ≤ β/(2N), the exact τ ≤ ⌊τ_sub⌋: the
  new target rank is never above the old one (``test_pcoqs`` checks this on a grid).

The union is over all N steps: any step's midpoint can lie below the quantile (scores
near the top of the range put every early midpoint there), so no step can be left out
without an assumption on the data.

Review (issue 14.8)
-------------------
- **Privacy claim**: ρ-zCDP (central), recorded as ``ZCDP(ρ)`` and converted to
  (ε, δ) at the dataset's reporting δ by CKS20. Neighbouring relation:
  substitution of one calibration score, n public (``privacy["neighbouring"]``).
  n is public because the target rank r' is a function of n: under add/remove
  the release can switch between +∞ (r' > n) and a finite threshold at a fixed
  n (e.g. 165/166), so no add/remove claim is made.
- **Sensitivity**: each of the N counts #{s ≤ mid} changes by at most 1 under a
  substitution; each is released with N_ℤ(0, N/(2ρ)) noise, which is
  (ρ/N)-zCDP (CKS20, Thm 4), and N of them compose to ρ (Bun & Steinke 2016).
- **Sampler**: exact discrete Gaussian (CKS20 Alg. 3) on exact rationals;
  uniform bits from ``rng`` — ``secrets.SystemRandom`` (OS CSPRNG) in production.
- **Running time**: the counts are N·n comparisons whatever the data (issue 16.5); the N
  noise draws are not constant-time (slower for larger |Z|), and |Z| with a step's decision
  tells about its count: timing is not covered by the DP claim (red team 25, privacy F1).
- **Coverage claim** (seed 003, Thm 2 with SPEC §4's inflated rank): let E be
  the event, a function of the noise alone, that all N noises satisfy |Z| ≤ τ;
  P(E) ≥ 1−β. On E, P(Y ∈ C(X) | E) ≥ 1−α, where the probability is over the
  calibration data and the test point (the noise is independent of them). It
  is a marginal statement, not one about a single release: a given release's
  coverage, conditional on its calibration data, can be below 1−α (as for
  split conformal). Unconditionally P(Y ∈ C(X)) ≥ (1−β)(1−α). Assumptions,
  each enforced: (i) exchangeable calibration and test scores (the user's
  data; not checkable); (ii) **no score range is assumed**: the counts are of
  the raw scores, so a score above ``upper`` is never counted below a
  midpoint (exactly as it compares with any finite threshold), and a
  threshold is released only if a noisy count backed it — when ``right``
  never moved the release is +∞ (:func:`noisy_binary_search`); a score below
  ``lower`` is counted at every step, which only makes the threshold
  conservative (and voids the *upper* bound: its ``upper_requires`` names the range
  since version 2.1.0); (iii) the τ bound: the exact discrete-Gaussian tail
  (:mod:`~privcal.calibrators.tail_bounds`) or, for version 1, its σ²-subgaussian bound
  (CKS20, Cor. 9), both checked by ``test_pcoqs``. The default range is [0, 1]: for
  scores that can exceed it (``absolute`` residuals, ``raps`` with a penalty)
  pass a public ``--upper`` that covers them, or the release will be +∞.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import ClassVar, Literal

import numpy as np
from pydantic import AliasChoices, Field, model_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    PrivacyModel,
)
from privcal.calibrators.bound_floats import float_at_least, float_at_most, rank_bound
from privcal.calibrators.mechanisms.discrete_gaussian import discrete_gaussian, to_fraction
from privcal.calibrators.pcoqs_statement import coverage_statement
from privcal.calibrators.score_range import check_range_arithmetic
from privcal.calibrators.split import _scores
from privcal.calibrators.tail_bounds import discrete_gaussian_cutoff
from privcal.costs import ZCDP
from privcal.errors import InvalidInput

__all__ = ["MAX_RECORDED_RANK", "PCOQS", "PCOQSParams", "noise_variance", "noisy_binary_search",
           "num_steps", "rank_error", "rank_error_exact", "target_rank"]

#: the largest τ or target rank a release records (its audit JSON, RFC 8785: 2⁵³ − 1)
MAX_RECORDED_RANK = 2**53 - 1


class PCOQSParams(CalibratorParams):
    """Parameters of P-COQS (SPEC §4)."""

    rho: float = Field(gt=0, allow_inf_nan=False, description="privacy budget ρ (ρ-zCDP), > 0")
    lower: float = Field(
        default=0.0, allow_inf_nan=False, description="public lower bound a of the score range"
    )
    upper: float = Field(
        default=1.0, allow_inf_nan=False, description="public upper bound b of the score range"
    )
    tol: float = Field(
        default=1e-10,
        gt=0,
        allow_inf_nan=False,
        description="resolution of the search: N = ⌈log2((b−a)/tol)⌉ steps",
    )
    failure_probability: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        validation_alias=AliasChoices("failure_probability", "beta"),
        description="failure probability β of the coverage guarantee: the probability "
        "over the privacy noise that the rank error exceeds τ (not a DP δ); formerly 'beta'",
    )
    nominal: bool = Field(
        default=False,
        description="target the paper's rank ⌈(n+1)(1−α)⌉ (coverage ≥ 1−α−τ/(n+1)) "
        "instead of the guaranteed rank ⌈(n+1)(1−α)+τ⌉",
    )
    bound: Literal["exact", "subgaussian"] = Field(
        default="exact",
        description="rank error τ from the exact one-sided discrete-Gaussian tail (default) "
        "or the two-sided sub-Gaussian bound of calibrator version 1.0.0",
    )

    @model_validator(mode="after")
    def _range(self) -> PCOQSParams:
        check_range_arithmetic(self.lower, self.upper)
        if not (self.upper - self.lower) > self.tol:
            raise ValueError(f"tol ({self.tol}) must be smaller than upper − lower")
        return self


def num_steps(lower: float, upper: float, tol: float) -> int:
    """N = ⌈log2((b − a)/tol)⌉, exact (seed 003, Alg. 1 line 1; SPEC §4).

    The bounds are read as the decimals typed (shortest float repr) and the
    logarithm is taken in integers: N is the least integer with 2^N·tol ≥ b − a,
    so powers of two give exact answers ((b−a)/tol = 2^k ⇒ N = k), where
    ``math.ceil(math.log2(x))`` can be off by one.
    """
    ratio = (to_fraction(upper, "upper") - to_fraction(lower, "lower")) / to_fraction(tol, "tol")
    if ratio <= 1:
        raise InvalidInput(f"tol ({tol}) must be smaller than upper − lower ({upper - lower})")
    p, q = ratio.numerator, ratio.denominator
    n = max(p.bit_length() - q.bit_length() - 1, 0)
    while (q << n) < p:
        n += 1
    return n


def noise_variance(n_steps: int, rho: float) -> Fraction:
    """σ² = N/(2ρ), exact: each step is (ρ/N)-zCDP for a sensitivity-1 count (seed 003, eq. 2)."""
    return Fraction(n_steps) / (2 * to_fraction(rho, "ρ"))


def rank_error(n_steps: int, rho: float, beta: float) -> float:
    """τ = √((N/ρ)·ln(2N/β)): all N counts are within τ w.p. ≥ 1−β (seed 003, Prop. 1)."""
    return math.sqrt((n_steps / rho) * math.log(2 * n_steps / beta))


def rank_error_exact(n_steps: int, rho: float, beta: float) -> int:
    """τ = min{t ∈ ℕ : P(Z > t) ≤ β/N}, Z ~ N_ℤ(0, N/(2ρ)): all N noises are ≤ τ w.p. ≥ 1−β
    (exact one-sided discrete-Gaussian tail and a union over the N steps; issue 13)."""
    if n_steps < 1:
        raise InvalidInput(f"N must be ≥ 1, got {n_steps}")
    return discrete_gaussian_cutoff(noise_variance(n_steps, rho), beta / n_steps)


def target_rank(n: int, alpha: float, tau: float, nominal: bool) -> int:
    """r = ⌈(1−α)(n+1)⌉ (nominal) or r' = ⌈(1−α)(n+1) + τ⌉ (guaranteed, SPEC §4).

    (1−α)(n+1) is exact (α as typed); τ enters as its exact binary value.
    """
    base = (1 - Fraction(str(alpha))) * (n + 1)
    return math.ceil(base if nominal else base + Fraction(tau))


def count_at_most(scores: np.ndarray, mid: float, buf: np.ndarray) -> int:
    """#{s ≤ mid} by one full pass over every score (the work does not depend on the values).

    ``np.less_equal`` into a preallocated buffer and ``np.count_nonzero`` are branch-free
    vector loops: each call costs n comparisons whatever the scores and ``mid`` are.
    """
    np.less_equal(scores, mid, out=buf)
    return int(np.count_nonzero(buf))


def noisy_binary_search(
    scores: np.ndarray,
    rank: int,
    lower: float,
    upper: float,
    n_steps: int,
    sigma2: Fraction,
    rng: random.Random,
) -> tuple[float, float, bool]:
    """Seed 003 Alg. 1 with SPEC §4's decisions; returns (left, right, backed).

    Each step releases c = #{s ≤ mid} + Z, Z ~ N_ℤ(0, σ²), and moves ``left``
    to mid if c < rank, else ``right``. The count is over the raw scores: no
    clipping is needed, since for mid ∈ (a, b) a score above b is never ≤ mid
    and one below a always is, exactly as they compare with the threshold.
    ``backed`` is True when ``right`` moved at least once, i.e. some noisy
    count ≥ rank backs it; when it is False ``right`` is still the public
    ``upper``, which no count supports, and the caller releases +inf.

    Running time (issue 16.5): every step is one full pass over all n scores
    (:func:`count_at_most`), N·n comparisons whatever the data are; the discrete Gaussian
    draw is not constant-time (≈ 15 µs at |Z| < 10, ≈ 30 µs at |Z| ≈ 35 for σ ≈ 13), and
    |Z| with the decision tells about the count: timing is outside the DP claim.
    """
    left, right = float(lower), float(upper)
    backed = False
    buf = np.empty(scores.shape[0], dtype=bool)
    for _ in range(n_steps):
        mid = (left + right) / 2
        noisy = count_at_most(scores, mid, buf) + discrete_gaussian(sigma2, rng)
        if noisy < rank:
            left = mid
        else:
            right, backed = mid, True
    return left, right, backed


#: versions whose ``upper_requires`` omitted the score range (:meth:`PCOQS.guarantee_as`)
_SHORT_UPPER_REQUIRES = frozenset({"1.0.0", "2.0.0"})


class PCOQS:
    """P-COQS: ρ-zCDP conformal threshold by noisy binary search (seed 003, Alg. 1–2)."""

    name: ClassVar[str] = "pcoqs"
    #: 2.3.0: the statement's numbers never overstate (:mod:`~privcal.calibrators.
    #: pcoqs_statement`); 2.2.0: the statement names every condition of the upper bound;
    #: 2.1.0: upper_requires names the score range; 2.0.0: exact τ (issue 13); 1.0.0:
    #: sub-Gaussian
    version: ClassVar[str] = "2.3.0"
    #: parameters a release of an older version was made with (``privcal audit verify``
    #: recomputes it by its own formula, :meth:`guarantee_as`): 1.0.0 had no ``bound`` and
    #: used the sub-Gaussian τ; 1.0.0 and 2.0.0 recorded the shorter ``upper_requires``
    legacy_params: ClassVar[dict[str, dict[str, object]]] = {"1.0.0": {"bound": "subgaussian"},
                                                             "2.0.0": {}, "2.1.0": {},
                                                             "2.2.0": {}}
    privacy_model: ClassVar[PrivacyModel] = "central-zcdp"
    #: its scores: at least two, finite (``_scores``), checked before the charge
    min_scores: ClassVar[int] = 2
    #: the neighbouring relation of the privacy claim (recorded as ``privacy["neighbouring"]``)
    neighbouring: ClassVar[str] = (
        "substitution of one calibration score; n is public (under add/remove the release "
        "can switch between +inf and a finite threshold at a fixed n: not claimed)"
    )
    Params: ClassVar[type[CalibratorParams]] = PCOQSParams
    inputs: ClassVar[frozenset[str]] = frozenset({"scores"})
    summary: ClassVar[str] = (
        "P-COQS (ρ-zCDP): noisy binary search for the conformal quantile, exact discrete Gaussian"
    )

    def cost(self, params: PCOQSParams, shape: DataShape) -> ZCDP:
        """ρ-zCDP: N sensitivity-1 counts, each (ρ/N)-zCDP, composed (Bun & Steinke 2016)."""
        return ZCDP(rho=params.rho)

    def _plan(self, params: PCOQSParams, n: int) -> tuple[int, float, int]:
        n_steps = num_steps(params.lower, params.upper, params.tol)
        if params.bound == "exact":
            tau: float = rank_error_exact(n_steps, params.rho, params.failure_probability)
        else:
            tau = rank_error(n_steps, params.rho, params.failure_probability)
        r = target_rank(n, params.alpha, tau, params.nominal)
        return n_steps, tau, r

    def _recordable_plan(self, params: PCOQSParams, n: int) -> tuple[int, float, int]:
        """:meth:`_plan` of a release (guarantee, run; ``advise`` uses :meth:`_plan`): a τ or
        rank its record cannot hold is refused before the charge (red team 10: ρ ≈ 1e-30)."""
        n_steps, tau, r = self._plan(params, n)
        if max(r, tau if isinstance(tau, int) else 0) > MAX_RECORDED_RANK:
            raise InvalidInput(f"pcoqs: ρ = {params.rho!r} is too small: its rank error τ = "
                               f"{tau:.6g} (target rank {r}) is past 2**53 − 1, the largest "
                               "integer a release records (a guaranteed release would be +inf)")
        return n_steps, tau, r

    def guarantee(self, params: PCOQSParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage bounds of seed 003 Thm 2 (nominal) or ≥ 1−α (guaranteed), w.p. ≥ 1−β."""
        return self.guarantee_as(self.version, params, shape)

    def guarantee_as(
        self, version: str, params: PCOQSParams, shape: DataShape
    ) -> CoverageGuarantee:
        """The guarantee as ``version`` recorded it (``audit verify``): before 2.1.0, its
        ``upper_requires`` omitted the range the upper bound needs (a score below ``lower``
        is always counted, so ``left`` may never move; one above ``upper`` never is); before
        2.2.0 its statement omitted that the upper bound ignores the scores inside the
        search's final interval (width ≤ tol): scores concentrated there lift the coverage
        above it (a Monte Carlo at tol = 0.25 gave 0.97 against a recorded 0.80); before
        2.3.0 it rounded its upper bound, 1−β and τ to nearest (:mod:`~privcal.calibrators.
        pcoqs_statement`)."""
        n, alpha, beta = shape.n, params.alpha, params.failure_probability
        n_steps, tau, r = self._recordable_plan(params, n)
        exact = params.bound == "exact"
        event = (
            "E, the event that no noisy count exceeds its true count by more than τ"
            if exact
            else "E, the event that every rank error is ≤ τ"
        )
        over = (
            f"the privacy noise: with probability ≥ 1−β the noise lies in {event}, and given "
            "E the bound holds marginally over the calibration data and the test point (not "
            "per release)"
        )
        details: dict[str, float | int | str | None] = {
            "n": n, "alpha": alpha, "rho": params.rho, "beta": beta, "N": n_steps, "tau": tau,
            "sigma2": str(noise_variance(n_steps, params.rho)), "target_rank": r,
            "variant": "nominal" if params.nominal else "guaranteed",
            "lower_bound_range": params.lower, "upper_bound_range": params.upper,
            "tol": params.tol,
        }
        if exact:
            details["bound"] = "exact"
        if r > n:
            return CoverageGuarantee(
                target=1 - alpha,
                lower=1.0,
                upper=1.0,
                failure_probability=0.0,
                over=over,
                rank=r,
                statement=(
                    f"target rank {r} exceeds n = {n}: the threshold is +inf and every set "
                    "contains every label (coverage 1); nothing was computed from the data"
                ),
                details=details,
            )
        if params.nominal:
            lower = max(0.0, 1 - alpha - tau / (n + 1))
            upper = min(1.0, 1 - alpha + (tau + 1) / (n + 1))
            upper_bound = min(Fraction(1), 1 - Fraction(str(alpha)) + (Fraction(tau) + 1)
                              / (n + 1))
        else:
            lower = 1 - alpha
            # on E, #{s ≤ left} < r' + τ, so P(S ≤ left) ≤ ⌈r' + τ⌉/(n+1) without ties
            upper = min(1.0, math.ceil(r + tau) / (n + 1))
            upper_bound = min(Fraction(1), Fraction(math.ceil(r + Fraction(tau)), n + 1))
        lower = float_at_most(lower, bound := rank_bound(r, tau, n))  # on E, counts ≥ r − τ
        if version not in self.legacy_params:  # since 2.3.0: never an ulp below its proof
            upper = float_at_least(upper, upper_bound)
        details["upper_requires"] = "no ties; " + ("" if version in _SHORT_UPPER_REQUIRES else (
            "every score in [lower, upper] (a score below lower is counted at every step, one "
            "above upper never: either can push the coverage above this bound); ")
        ) + "ignores the score mass inside the final tol interval"
        if exact:  # the upper bound needs the lower tail, the same τ by symmetry
            details["upper_requires"] += "; holds given E₋ (no noise below −τ), P(E₋) ≥ 1−β"
        # (a +inf release, when no count backs the top of the range, has coverage 1)
        return CoverageGuarantee(
            target=1 - alpha, lower=lower, upper=upper, failure_probability=beta, over=over,
            rank=r, statement=coverage_statement(
                version, lower=lower, lower_bound=bound, upper=upper, upper_bound=upper_bound,
                beta=beta, tau=tau, exact=exact, n_steps=n_steps, rank=r, n=n, tol=params.tol),
            details=details,
        )

    def calibrate(
        self, data: CalibrationInput, params: PCOQSParams, rng: random.Random
    ) -> CalibrationResult:
        """Run the N-step noisy binary search and release ``right`` (SPEC §4)."""
        s = _scores(data)
        n = s.shape[0]
        n_steps, tau, r = self._recordable_plan(params, n)
        diag: dict[str, object] = {"N": n_steps, "tau": tau, "target_rank": r}
        if r > n:
            # trivial set; the data are not touched, so no noise is drawn either
            return CalibrationResult(threshold=math.inf, diagnostics={**diag, "interval": None})
        left, right, backed = noisy_binary_search(
            s, r, params.lower, params.upper, n_steps, noise_variance(n_steps, params.rho), rng
        )
        # never rest on the public range: an unbacked ``right`` (= upper) becomes +inf
        threshold = right if backed else math.inf
        return CalibrationResult(
            threshold=threshold,
            diagnostics={**diag, "interval": [left, right], "backed": backed},
        )
