"""LDP-CP-L: conformal calibration from k-RR-randomized labels (label ε-LDP) — SPEC §6.

Penso, Mahpud, Goldberger, Sheffet, *Privacy-Preserving Conformal Prediction Under Local
Differential Privacy* (seed 004), §3.1, Algorithms 1–2, Eq. (2), Theorems 1 and 3.

Each user applies k-RR to their label (:func:`privcal.calibrators.mechanisms.
randomized_response.krr`) and sends (x, ỹ); the features go in the clear, so the privacy
guarantee is **label-only ε-LDP** (label-DP). The aggregator computes the n×k class scores
and corrects for the known noise channel:

    F̂ⁿ(q) = (1/n) Σ 1{S(x_i, ỹ_i) ≤ q},  F̂ʳ(q) = (1/(nk)) Σ_i |C_q(x_i)|,
    F̂ᶜ(q) = (F̂ⁿ(q) − β F̂ʳ(q)) / (1 − β),  β = k/(k−1+e^ε)           (seed 004, Eq. (2))

and releases the "last crossing" of the target (SPEC §6 Decision) instead of the paper's
bisection.

Review (issue 14.8)
-------------------
- **Privacy claim**: label-only ε-LDP of each subject, charged as ``LocalDP(ε)``; the
  features are sent in the clear (``privacy["neighbouring"]``, ``local_statement``).
- **Sensitivity**: not applicable (local randomizer): k-RR keeps the label
  w.p. e^ε/(e^ε+k−1), a likelihood ratio ≤ e^ε.
- **Sampler**: the client's label is replaced by a uniform one of k iff a 53-bit uniform from
  the OS CSPRNG is below β raised by 4 ulps (``randomized_response``'s mixture form): at least
  the exact β, so both likelihood ratios are ≤ e^ε exactly; no noise in the aggregator.
- **Coverage claim**: with probability ≥ 1−δ over the calibration data and the users'
  responses, P(Y ∈ C(X)) ≥ 1−α (target 1−α+Δ_L) or ≥ 1−α−Δ_L (``nominal``); Δ_L: the
  proven one-sided DKW–Massart + McDiarmid slack (:func:`label_slack`; version 1's
  two-sided one with ``bound="two-sided"``). Assumptions: (i) i.i.d. (x, y); (ii) k is
  the probabilities' columns (checked); (iii) no score range (a candidate score, or +∞);
  (iv) every user follows the protocol (its own k-RR output on its true label) and (v)
  which users' reports are kept does not depend on their data. privcal **cannot enforce
  (iv) or (v), so the recorded guarantee states them** (``over``, ``statement``; versions
  3 and 4: :mod:`~privcal.calibrators.participation`).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from privcal.calibrators.base import (
    CalibrationInput,
    CalibrationResult,
    CalibratorParams,
    CoverageGuarantee,
    DataShape,
    LocalFailureProbability,
)
from privcal.calibrators.bound_floats import float_at_most, text_at_most
from privcal.calibrators.mechanisms.randomized_response import krr_beta
from privcal.calibrators.participation import UNSELECTED_LABELS
from privcal.calibrators.validation import check_labels, check_lengths, check_probs
from privcal.calibrators.versions import clause_since
from privcal.costs import LocalDP
from privcal.errors import InvalidInput

__all__ = ["HONEST_USERS", "LDPLabel", "LDPLabelParams", "LabelSlack", "label_slack",
           "noise_aware_threshold"]

PRIVACY_NOTE = "label-only ε-LDP: features sent in the clear"
#: the assumption of the coverage guarantee privcal cannot enforce (a randomized label
#: cannot be checked), stated in the recorded guarantee (red team 6)
HONEST_USERS = ("every user following the protocol (each label its own k-RR output with this "
                "ε on its true label; no Byzantine participants)")

#: elements of the sorted score array processed per vectorised step of the scan
_CHUNK = 1 << 18


LabelBound = Literal["one-sided", "two-sided"]

#: E sup_q (F(q) − F̃(q)) ≤ C_SUP/√n for an empirical CDF F̃ of n i.i.d. values, from
#: Massart's one-sided bound: ∫₀^∞ min(1, e^{−2nt²}) dt with the bound used only where
#: e^{−2nt²} ≤ 1/2, i.e. C_SUP = (√ln 2 + (√π/2)·erfc(√ln 2))/√2 ≈ 0.7385 (< √(π/2) ≈ 1.2533)
C_SUP = (math.sqrt(math.log(2))
         + math.sqrt(math.pi) / 2 * math.erfc(math.sqrt(math.log(2)))) / math.sqrt(2)


class LabelSlack(BaseModel):
    """The finite-sample terms of LDP-CP-L for (n, k, ε, δ); all public quantities."""

    model_config = ConfigDict(frozen=True)

    n: int
    k: int
    epsilon: float
    delta: float
    beta: float = Field(description="k-RR noise level β = k/(k−1+e^ε)")
    t_n: float = Field(
        description="DKW–Massart term for F̂ⁿ at δ/2: √(ln(2/δ)/(2n)) one-sided (default), "
        "√(ln(4/δ)/(2n)) two-sided (version 1)"
    )
    t_r: float = Field(
        description="McDiarmid term for F̂ʳ at δ/2: C/√n + √(ln(2/δ)/(2n)), C = 0.7385 "
        "one-sided (default) or √(π/2) (version 1)"
    )
    delta_L: float = Field(description="proven slack (t_n + β t_r)/(1 − β)")
    h: float = Field(description="(1 − β)/(1 + β)")
    delta_paper: float = Field(description="seed 004 Thm 1: √(ln(4/δ)/(2n h²)) (not proven)")


def label_slack(
    n: int, k: int, epsilon: float, delta: float = 0.001, bound: LabelBound = "one-sided"
) -> LabelSlack:
    """Δ_L (proven, recorded) and Δ_paper (seed 004, Theorem 1; recorded beside it) — SPEC §6.

    ``bound="two-sided"`` (calibrator version 1): with probability ≥ 1 − δ over the
    calibration data and the users' randomization, sup_q |F̂ᶜ(q) − Fᶜ(q)| ≤ Δ_L:
    DKW–Massart bounds sup|F̂ⁿ − Fⁿ| by t_n with probability 1 − δ/2; McDiarmid (bounded
    differences 1/n, E sup ≤ √(π/(2n))) bounds sup|F̂ʳ − Fʳ| by t_r with probability 1 − δ/2;
    then Eq. (2) of seed 004 divides by 1 − β.

    ``bound="one-sided"`` (version 2, the default; issue 13): the release q̂ has
    F̂ᶜ(q̂) ≥ target, so coverage needs only that F̂ᶜ does not *over*-estimate:
    F̂ᶜ − Fᶜ = [(F̂ⁿ − Fⁿ) − β(F̂ʳ − Fʳ)]/(1−β) ≤ [sup(F̂ⁿ − Fⁿ) + β·sup(Fʳ − F̂ʳ)]/(1−β).
    (i) Massart (1990, Ann. Probab. 18(3), Thm 1 and its one-sided statement):
    P(sup(F̂ⁿ − Fⁿ) > t) ≤ exp(−2nt²) whenever exp(−2nt²) ≤ 1/2, for any distribution; at
    δ/2 ≤ 1/2 this gives t_n = √(ln(2/δ)/(2n)). (ii) F̂ʳ(q) = E[F̃(q) | x] where F̃ is the
    empirical CDF of S(x_i, U_i), U_i uniform labels, i.i.d. with CDF Fʳ; so E sup(Fʳ − F̂ʳ)
    ≤ E sup(Fʳ − F̃) = ∫₀^∞ P(sup > t) dt ≤ t₀ + ∫_{t₀}^∞ e^{−2nt²} dt with t₀ = √(ln 2/(2n))
    (Massart one-sided for the reflected sample) = C_SUP/√n; McDiarmid (one-sided,
    differences 1/n) adds √(ln(2/δ)/(2n)) at δ/2. Both terms are ≤ the version-1 ones.
    """
    if n < 1:
        raise InvalidInput(f"n must be ≥ 1, got {n}")
    if not (0 < delta < 1):
        raise InvalidInput(f"δ must be in (0, 1), got {delta}")
    beta = krr_beta(k, epsilon)
    if bound == "two-sided":
        t_n = math.sqrt(math.log(4 / delta) / (2 * n))
        t_r = math.sqrt(math.pi / (2 * n)) + math.sqrt(math.log(2 / delta) / (2 * n))
    elif bound == "one-sided":
        t_n = math.sqrt(math.log(2 / delta) / (2 * n))
        t_r = C_SUP / math.sqrt(n) + math.sqrt(math.log(2 / delta) / (2 * n))
    else:
        raise InvalidInput(f"bound must be 'one-sided' or 'two-sided', got {bound!r}")
    h = (1 - beta) / (1 + beta)
    if not math.isfinite(delta_l := (t_n + beta * t_r) / (1 - beta)):  # red team 10
        # δ ≤ ~1e-308: c/δ overflows, Δ_L = +inf, and no coverage can be stated or reached
        raise InvalidInput(f"failure probability δ = {delta!r} is too small: the slack Δ_L is "
                           "not finite (ln(2/δ) or ln(4/δ) overflows a float); use δ ≥ 1e-300")
    return LabelSlack(n=n, k=k, epsilon=epsilon, delta=delta, beta=beta, t_n=t_n, t_r=t_r,
                      delta_L=delta_l, h=h,
                      delta_paper=math.sqrt(math.log(4 / delta) / (2 * n * h * h)))


def noise_aware_threshold(
    class_scores: np.ndarray,
    noisy_labels: np.ndarray,
    beta: float,
    target: float,
    *,
    overwrite: bool = False,
) -> float:
    """The exact "last crossing" of F̂ᶜ over all n·k candidate scores (SPEC §6 Decision).

    Returns the smallest q such that F̂ᶜ(q') ≥ ``target`` for every q' ≥ q, where F̂ᶜ is the
    noise-corrected empirical coverage of seed 004, Eq. (2); +inf when F̂ᶜ is below
    ``target`` at the largest candidate (then no finite threshold is backed by the data).

    F̂ᶜ is a right-continuous step function that jumps only at candidate values, so the
    condition need only be checked at the *last* member of each run of equal values (a tie
    group): the answer is the value just above the highest failing group, or the smallest
    candidate if none fails (F̂ᶜ = 0 < target below it). With N(q) = #{i : S(x_i, ỹ_i) ≤ q}
    and R(q) = #{(i, y) : S(x_i, y) ≤ q} (both integers), F̂ᶜ(q) ≥ t is exactly
    k·N − t·n·k ≥ β·(R − t·n·k), which is evaluated without dividing, so F̂ᶜ = 1 at the top
    compares equal to a target of 1.

    Cost: one in-place sort of the n·k scores plus a linear, chunked scan; extra memory is
    one copy of the scores (none with ``overwrite=True``, which sorts ``class_scores``
    in place and leaves it sorted) plus O(n) and O(chunk) work arrays.
    """
    s = np.asarray(class_scores)
    if s.ndim != 2:
        raise InvalidInput(f"class scores must be an n×k array, got shape {s.shape}")
    n, k = s.shape
    if n < 1 or k < 2:
        raise InvalidInput(f"class scores must have ≥ 1 row and ≥ 2 columns, got {s.shape}")
    y = np.asarray(noisy_labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise InvalidInput(f"noisy labels must be {n} integers, got {y.dtype} {y.shape}")
    if y.min() < 0 or y.max() >= k:
        raise InvalidInput(f"noisy labels must be in [0, {k})")
    if not (0 <= beta < 1):
        raise InvalidInput(f"β must be in [0, 1), got {beta}")
    if not (math.isfinite(target) and target > 0):
        # F̂ᶜ = 0 below every candidate, so a target ≤ 0 would make the answer −inf
        raise InvalidInput(f"target must be a finite number > 0, got {target}")
    noisy = np.array(s[np.arange(n), y], dtype=np.float64)  # a copy: taken before sorting
    if np.isnan(noisy).any():
        raise InvalidInput("class scores contain NaN")
    if overwrite and s.dtype == np.float64 and s.flags.c_contiguous and s.flags.writeable:
        flat = s.reshape(-1)
    else:
        flat = np.array(s, dtype=np.float64).reshape(-1)
    flat.sort()
    if np.isnan(flat[-1]):  # NaN sorts last
        raise InvalidInput("class scores contain NaN")
    noisy.sort()
    m = n * k
    # the group end (last position with value ≤ v) of each noisy-label score v; ascending
    pos = np.searchsorted(flat, noisy, side="right") - 1
    t_nk = target * n * k
    # Scan from the top for the highest failing group end.
    for b in range(m, 0, -_CHUNK):
        a = max(0, b - _CHUNK)
        vals = flat[a:b]
        is_end = np.empty(b - a, dtype=bool)
        np.not_equal(vals[:-1], vals[1:], out=is_end[:-1])
        is_end[-1] = True if b == m else bool(flat[b - 1] != flat[b])
        lo_i, hi_i = np.searchsorted(pos, [a, b])
        counts = np.bincount(pos[lo_i:hi_i] - a, minlength=b - a)
        big_n = np.cumsum(counts)
        big_n += lo_i  # noisy scores at positions < a
        lhs = k * big_n.astype(np.float64) - t_nk
        rhs = beta * (np.arange(a + 1, b + 1, dtype=np.float64) - t_nk)
        fail = (lhs < rhs) & is_end
        if fail.any():
            p = a + (b - a - 1) - int(np.argmax(fail[::-1]))
            return math.inf if p == m - 1 else float(flat[p + 1])
    return float(flat[0])


class LDPLabelParams(CalibratorParams):
    """Parameters of ``ldp-label`` (alpha from the base model)."""

    epsilon: float = Field(gt=0, allow_inf_nan=False, description="users' k-RR ε (label ε-LDP)")
    k: int | None = Field(default=None, ge=2, description="number of classes; default: the "
                          "probabilities' columns (must match them)")
    failure_probability: LocalFailureProbability = 0.001
    score: str = Field(default="lac", description="classification score name (SPEC §1)")
    nominal: bool = Field(
        default=False, description="target 1−α (coverage ≥ 1−α−Δ_L) instead of 1−α+Δ_L"
    )
    bound: LabelBound = Field(
        default="one-sided",
        description="Δ_L from one-sided Massart bounds (default) or the two-sided bound of "
        "calibrator version 1",
    )

    @field_validator("score")
    @classmethod
    def _score(cls, v: str) -> str:
        from privcal.calibrators.scores import SCORES

        spec = SCORES.get(v)
        if spec is None or spec.kind != "classification":
            known = ", ".join(n for n, s in SCORES.items() if s.kind == "classification")
            raise ValueError(f"unknown classification score {v!r} (known: {known})")
        return v


def target_level(params: LDPLabelParams, slack: LabelSlack) -> float:
    """The level F̂ᶜ must reach: 1−α+Δ_L (default, guaranteed) or 1−α (``nominal``)."""
    return 1 - params.alpha + (0.0 if params.nominal else slack.delta_L)


class LDPLabel:
    """LDP-CP-L (seed 004 §3.1, Algorithms 1–2; SPEC §6): noise-aware conformal calibration
    from k-RR labels. Privacy: label-only ε-LDP (features are sent in the clear)."""

    name: ClassVar[str] = "ldp-label"
    #: 4: it also states that which reports are kept is not chosen by their data (red team
    #: 15); 3: that every user follows the protocol (red team 6; same formula as 2); 2:
    #: one-sided Massart + McDiarmid slack (issue 13); 1: two-sided
    version: ClassVar[str] = "4"
    #: parameters a release of an older version was made with (``privcal audit verify``
    #: recomputes it by its own formula; its older sentences are counted, not compared):
    #: version 1 had no ``bound`` and was two-sided, versions 2 and 3 are version 4's formula
    legacy_params: ClassVar[dict[str, dict[str, object]]] = {"1": {"bound": "two-sided"}, "2": {},
                                                              "3": {}}
    privacy_model: ClassVar[str] = "local"
    #: the neighbouring relation of the privacy claim (recorded as ``privacy["neighbouring"]``)
    neighbouring: ClassVar[str] = (
        "any two labels of one subject (label-only local DP: the features are sent in the clear)"
    )
    local_statement: ClassVar[str] = ("{eps}-local DP of each participating subject's label "
                                      "(label-only: its features are sent in the clear)")
    Params: ClassVar[type[CalibratorParams]] = LDPLabelParams
    inputs: ClassVar[frozenset[str]] = frozenset({"probs", "labels"})
    summary: ClassVar[str] = "LDP-CP-L: k-RR noisy labels, noise-aware threshold (label-only ε-LDP)"

    def cost(self, params: LDPLabelParams, shape: DataShape) -> LocalDP:
        """ε0 = ε, charged to each participating subject (each sends one k-RR label)."""
        return LocalDP(eps0=params.epsilon)

    def _k(self, params: LDPLabelParams, shape: DataShape) -> int:
        """k from the parameters or, when not given, from the probabilities' shape."""
        if params.k is not None and shape.k is not None and shape.k != params.k:
            raise InvalidInput(f"k = {params.k} but the probabilities have {shape.k} columns")
        k = params.k if params.k is not None else shape.k
        if k is None:
            raise InvalidInput("ldp-label needs k: give --k or the n×k probabilities")
        return k

    def guarantee(self, params: LDPLabelParams, shape: DataShape) -> CoverageGuarantee:
        """Coverage ≥ 1−α (default) or ≥ 1−α−Δ_L (nominal) with probability ≥ 1−δ."""
        return self.guarantee_as(self.version, params, shape)

    def guarantee_as(self, version: str, params: LDPLabelParams,
                     shape: DataShape) -> CoverageGuarantee:
        """:meth:`guarantee` as ``version`` worded it (before 4, no selection clause)."""
        users = HONEST_USERS + clause_since(UNSELECTED_LABELS, version, "4")
        k = self._k(params, shape)
        delta = params.failure_probability
        sl = label_slack(shape.n, k, params.epsilon, delta, params.bound)
        target = target_level(params, sl)
        lower = 1 - params.alpha if not params.nominal else max(0.0, 1 - params.alpha - sl.delta_L)
        # the recorded bound and the statement's numbers never above their exact values
        exact = max(Fraction(0), 1 - Fraction(repr(params.alpha))
                    - (Fraction(sl.delta_L) if params.nominal else 0))
        lower = float_at_most(lower, exact)
        mode = "nominal target 1−α" if params.nominal else "target 1−α+Δ_L"
        return CoverageGuarantee(
            target=1 - params.alpha,
            lower=lower,
            failure_probability=delta,
            over=f"the calibration data and the users' randomized responses, {users}",
            statement=(
                f"With probability ≥ {text_at_most(1 - delta, 1 - Fraction(repr(delta)))} over "
                "the calibration data and the users' randomized responses, "
                f"P(Y ∈ C(X) | calibration) ≥ {text_at_most(lower, exact)} "
                f"(LDP-CP-L, {mode}, Δ_L = {sl.delta_L:.6g}), {users}; privacy: "
                f"{PRIVACY_NOTE}."
            ),
            details={
                "delta_L": sl.delta_L,
                "delta_paper": sl.delta_paper,
                "h": sl.h,
                "beta": sl.beta,
                "t_n": sl.t_n,
                "t_r": sl.t_r,
                "delta": delta,
                "epsilon": params.epsilon,
                "k": k,
                "n": shape.n,
                "calibration_target": target,
                "nominal": int(params.nominal),
                "score": params.score,
                "privacy": PRIVACY_NOTE,
                **({"bound": "one-sided"} if params.bound == "one-sided" else {}),
            },
        )

    def only_infinite(self, params: LDPLabelParams, shape: DataShape) -> bool:
        """Whether the target 1−α+Δ_L exceeds 1: no candidate's corrected coverage reaches it."""
        sl = label_slack(shape.n, self._k(params, shape), params.epsilon,
                         params.failure_probability, params.bound)
        return target_level(params, sl) > 1

    def _inputs(self, params: LDPLabelParams,
                data: CalibrationInput) -> tuple[np.ndarray, np.ndarray, int]:
        """(probabilities, the users' noisy labels, k), checked: the one set of rules of
        :meth:`calibrate` and :meth:`check_inputs` (a one-line InvalidInput)."""
        if data.probs is None or data.labels is None:
            raise InvalidInput("ldp-label needs probabilities and the users' noisy labels")
        probs = check_probs(data.probs, min_rows=1)
        k = self._k(params, DataShape(n=probs.shape[0], k=probs.shape[1]))
        labels = check_labels(data.labels, k, min_rows=1)
        check_lengths(probs=probs, labels=labels)
        return probs, labels, k

    def check_inputs(self, params: LDPLabelParams, data: CalibrationInput) -> None:
        """What :meth:`calibrate` refuses, refused before every subject is charged ε."""
        self._inputs(params, data)

    def calibrate(
        self, data: CalibrationInput, params: LDPLabelParams, rng: random.Random
    ) -> CalibrationResult:
        """Threshold from the probabilities and the users' noisy labels (``data.labels``)."""
        from privcal.calibrators.scores import all_class_scores

        probs, labels, k = self._inputs(params, data)
        n = probs.shape[0]
        sl = label_slack(n, k, params.epsilon, params.failure_probability, params.bound)
        target = target_level(params, sl)
        scores = all_class_scores(params.score, probs, rng=rng)
        if np.may_share_memory(scores, probs) or np.may_share_memory(scores, data.probs):
            # never sort the caller's matrix in place
            scores = scores.copy()
        threshold = noise_aware_threshold(scores, labels, sl.beta, target, overwrite=True)
        return CalibrationResult(
            threshold=threshold,
            diagnostics={
                "n": n,
                "k": k,
                "beta": sl.beta,
                "delta_L": sl.delta_L,
                "delta_paper": sl.delta_paper,
                "calibration_target": target,
                "trivial": math.isinf(threshold),
                "privacy": PRIVACY_NOTE,
            },
        )
