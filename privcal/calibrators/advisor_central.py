"""From which n can a central method return a finite threshold? (issue 13)

P-COQS (SPEC §4) and ExponQ (SPEC §5) release +∞ (every label) when their inflated target
cannot be met by n scores — a function of public quantities only:

- P-COQS: the target rank r' = ⌈(1−α)(n+1)⌉ + τ (guaranteed; τ the rank error of
  :func:`~privcal.calibrators.pcoqs.rank_error_exact`, or r = ⌈(1−α)(n+1)⌉ nominal) must be
  ≤ n. τ does not depend on n, and r' − n is non-increasing in n (⌈(1−α)(n+2)⌉ ≤
  ⌈(1−α)(n+1)⌉ + 1), so the feasible n form an interval [n_min, ∞). At a feasible n the
  release is finite unless no noisy count reaches r' (the search never moves ``right``).
- ExponQ: the inflated level q̃(n) (Angelopoulos et al. 2022, Alg. 2, with the optimal γ and
  the default bins) must be < 1; then the release is finite unless the top grid point is
  drawn. q̃ is not proven monotone in n here (the default bins grow with n), so
  :func:`min_n_exponq` scans every n up to the answer rather than bisecting.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from privcal.calibrators.exponq import MAX_BINS, MIN_BINS, ExponQ, ExponQParams
from privcal.calibrators.pcoqs import PCOQS, PCOQSParams
from privcal.errors import InvalidInput, first_error, numeric_edge

__all__ = ["CentralAdvice", "advise_central", "min_n_exponq", "min_n_pcoqs"]

#: the largest n searched (beyond it the method is reported as never finite)
N_LIMIT = 10**9


#: the largest ε ExponQ advice is computed for
MAX_EXPONQ_EPSILON = 1e6


def _pcoqs_rank(params: PCOQSParams, n: int) -> int:
    return PCOQS()._plan(params, n)[2]


def min_n_pcoqs(params: PCOQSParams) -> int:
    """The smallest n with target rank ≤ n (P-COQS can return a finite threshold)."""
    lo, hi = 1, 1
    while _pcoqs_rank(params, hi) > hi:
        hi *= 2
        if hi > N_LIMIT:
            raise InvalidInput(f"P-COQS needs more than {N_LIMIT:,} scores at these parameters")
    while lo < hi:  # r' − n non-increasing: the feasible n are [n_min, ∞)
        mid = (lo + hi) // 2
        if _pcoqs_rank(params, mid) <= mid:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _q_tilde(params: ExponQParams, n: int) -> float:
    """q̃ as :class:`~privcal.calibrators.exponq.ExponQ` computes it (inf when γ ≥ 1)."""
    return ExponQ().plan(params, n)[2]


def _q_tilde_many(params: ExponQParams, ns: np.ndarray) -> np.ndarray:
    """q̃ for many n at once (the formulas of :mod:`~privcal.calibrators.exponq`, vectorised;
    equal to the scalar ones up to a few ulps)."""
    a, e = params.alpha, params.epsilon
    n = ns.astype(np.float64)
    if params.bins is not None:
        m = np.full_like(n, float(params.bins))
    else:
        m = np.clip(np.ceil(e * n / 2), MIN_BINS, MAX_BINS)
    b = a * e * (n + 1) * (1 - a) / 2 + 2 * a
    gamma = 2.0 / (b + np.sqrt(b * b - 4 * a * a))
    with np.errstate(invalid="ignore", divide="ignore"):
        q = (n + 1) * (1 - a) / (n * (1 - gamma * a)) + (2 / (e * n)) * np.log(m / (gamma * a))
    return np.where(gamma >= 1, np.inf, q)


def exponq_n_floor(params: ExponQParams) -> float:
    """A proven lower bound: no n ≤ this value has q̃(n) < 1.

    With γ < 1 (else q̃ = ∞) and m ≥ m₀ bins (m₀ = ``bins``, or the default's minimum),
    q̃(n) = (n+1)(1−α)/(n(1−γα)) + (2/(εn))·ln(m/(γα)) > (1−α) + (2/(εn))·ln(m₀/α),
    which is ≥ 1 as soon as n ≤ 2·ln(m₀/α)/(εα). Tiny ε make this astronomically large
    (or ∞), which is how :func:`min_n_exponq` answers them at once instead of scanning."""
    m0 = float(params.bins) if params.bins is not None else float(MIN_BINS)
    a, e = params.alpha, params.epsilon
    with np.errstate(over="ignore", divide="ignore"):
        return float(np.float64(2.0) * np.log(m0 / a) / (np.float64(e) * a))


def min_n_exponq(params: ExponQParams) -> int:
    """The smallest n with q̃(n) < 1 (ExponQ can return a finite threshold). Every n from
    the proven floor of :func:`exponq_n_floor` on is checked: blocks are scanned vectorised
    and each n whose vectorised q̃ is within 10⁻⁹ of 1 or below is re-checked with the
    calibrator's own (scalar) computation."""
    floor = exponq_n_floor(params)
    if not floor < N_LIMIT:
        raise InvalidInput(f"ExponQ needs more than {N_LIMIT:,} scores at these parameters")
    start, block = max(1, int(floor)), 4096
    while start <= N_LIMIT:
        ns = np.arange(start, start + block)
        q = _q_tilde_many(params, ns)
        for n in ns[q < 1 + 1e-9].tolist():
            if _q_tilde(params, n) < 1:
                return n
        start, block = start + block, min(block * 2, 1 << 22)
    raise InvalidInput(f"ExponQ needs more than {N_LIMIT:,} scores at these parameters")


class CentralAdvice(BaseModel):
    """The result of :func:`advise_central`; serialisable (``model_dump(mode="json")``)."""

    model_config = ConfigDict(frozen=True)

    method: Literal["pcoqs", "exponq"]
    alpha: float
    rho: float | None = None
    epsilon: float | None = None
    failure_probability: float | None = None
    nominal: bool = False
    min_n: int = Field(description="smallest n at which a finite threshold is possible")
    n: int | None = None
    finite_possible: bool | None = Field(
        default=None, description="at n: the target can be met (else the release is +inf)"
    )
    details: dict[str, float | int | str | None] = Field(default_factory=dict)
    notes: list[str]


@numeric_edge("advise")
def advise_central(
    method: str,
    alpha: float,
    *,
    n: int | None = None,
    rho: float | None = None,
    epsilon: float | None = None,
    failure_probability: float = 0.05,
    nominal: bool = False,
    lower: float = 0.0,
    upper: float = 1.0,
    tol: float | None = None,
) -> CentralAdvice:
    """The smallest n for a finite P-COQS (given ρ) or ExponQ (given ε) threshold, and, for a
    given n, whether it is reached and the public target (rank r' and τ, or q̃)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidInput(f"n must be an integer ≥ 1, got {n!r}")
    try:
        if method == "pcoqs":
            if rho is None:
                raise InvalidInput("advise --method pcoqs needs --rho")
            pp = PCOQSParams(alpha=alpha, rho=rho, failure_probability=failure_probability,
                             nominal=nominal, lower=lower, upper=upper,
                             **({} if tol is None else {"tol": tol}))  # fmt: skip
            n_min = min_n_pcoqs(pp)
            n_steps, tau, _ = PCOQS()._plan(pp, n or n_min)
            details: dict[str, float | int | str | None] = {"N": n_steps, "tau": tau}
            if n is not None:
                details["target_rank"] = _pcoqs_rank(pp, n)
            ok = None if n is None else _pcoqs_rank(pp, n) <= n
            note = ("finite when the target rank ⌈(1−α)(n+1)⌉ + τ is ≤ n and a noisy count "
                    "reaches it; τ from the exact discrete-Gaussian tail. τ grows with the "
                    f"search's N = {n_steps} steps (from tol = {pp.tol:g}, the threshold's "
                    "resolution): a coarser tol (e.g. 2^-12 of the range) lowers τ and n_min "
                    "(calibrate pcoqs --tol)")  # fmt: skip
            details["tol"] = pp.tol
        elif method == "exponq":
            if tol is not None:
                raise InvalidInput("tol applies to pcoqs (its search's resolution), not exponq")
            if epsilon is None:
                raise InvalidInput("advise --method exponq needs --epsilon")
            if isinstance(epsilon, int | float) and not isinstance(epsilon, bool) \
                    and epsilon > MAX_EXPONQ_EPSILON:
                # past it b² overflows and q̃ is NaN: the search scanned to 10⁹ for minutes
                # and answered "needs more than 10⁹ scores" (red team 7)
                raise InvalidInput(f"advise computes ExponQ for ε ≤ 10⁶, got {epsilon:g} (at "
                                   "such an ε a handful of scores suffice)")
            ep = ExponQParams(alpha=alpha, epsilon=epsilon, lower=lower, upper=upper)
            n_min = min_n_exponq(ep)
            details = {}
            if n is not None:
                m, gamma, q = ExponQ().plan(ep, n)
                details = {"bins": m, "gamma": gamma, "q_tilde": q if q < 1 else "inf"}
            ok = None if n is None else _q_tilde(ep, n) < 1
            note = ("finite when the inflated level q̃ < 1 and the top grid point is not drawn "
                    "(default bins)")  # fmt: skip
        else:
            raise InvalidInput(f"unknown central method {method!r} (pcoqs or exponq)")
    except ValueError as exc:  # pydantic.ValidationError
        if isinstance(exc, InvalidInput):
            raise
        where, msg, _ = first_error(exc) if hasattr(exc, "errors") else ("", str(exc), "")
        raise InvalidInput(f"{method}: invalid {where or 'parameters'}: {msg}") from None
    return CentralAdvice(
        method=method,  # type: ignore[arg-type]
        alpha=alpha,
        rho=rho if method == "pcoqs" else None,
        epsilon=epsilon if method == "exponq" else None,
        failure_probability=failure_probability if method == "pcoqs" else None,
        nominal=nominal if method == "pcoqs" else False,
        min_n=n_min,
        n=n,
        finite_possible=ok,
        details=details,
        notes=[note, "n_min depends on α, the budget and the public range only, not on the data"],
    )
