"""Issue 13: the exact one-sided bounds of the guaranteed modes.

- the cut-offs are valid (tail ≤ level, computed independently here) and the smallest valid;
- they are never above the version-1 bounds they replace (new ≤ old, kept as reference);
- releases made with the old formula still verify (each by the formula it was made with);
- at the edge: on data that puts every step or round exactly at the bound, the fraction of
  trials below the recorded bound stays within the recorded failure probability (and is
  close to it: the bound is sharp there).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from math import comb
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privcal import Accountant, Ledger
from privcal.accountant.releases import record_release
from privcal.calibrators.base import CalibrationInput, DataShape
from privcal.calibrators.ldp_score import LDPScoreParams, simulate
from privcal.calibrators.ldp_score_bounds import (
    exact_cutoff,
    exact_slack,
    nominal_cutoff,
    nominal_level,
    report_probability,
    rr_range,
    score_slack,
)
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.mechanisms.discrete_gaussian import discrete_gaussian_pmf
from privcal.calibrators.pcoqs import (
    PCOQS,
    PCOQSParams,
    noise_variance,
    rank_error,
    rank_error_exact,
    target_rank,
)
from privcal.calibrators.registry import get
from privcal.calibrators.tail_bounds import (
    binomial_upper_cutoff,
    discrete_gaussian_cutoff,
    discrete_gaussian_tail,
)
from privcal.costs import LocalDP, parse_cost
from tests.seeded import Seeded

TEST_LEVEL = 1e-4


def _dg_upper_tail(s2: float, k: int) -> float:
    """P(Z ≥ k) from the normalised pmf (independent of tail_bounds)."""
    r = math.ceil(40 * math.sqrt(s2)) + 1
    return math.fsum(discrete_gaussian_pmf(s2, range(k, r + 1)))


@pytest.mark.parametrize("s2", [0.25, 1.0, 17.0, 170.0, 4321.5])
@pytest.mark.parametrize("a", [0.3, 0.05 / 34, 1e-7])
def test_discrete_gaussian_cutoff_is_valid_and_smallest(s2: float, a: float) -> None:
    t = discrete_gaussian_cutoff(s2, a)
    assert _dg_upper_tail(s2, t + 1) <= a
    if t > 0:
        assert _dg_upper_tail(s2, t) > a * (1 + 1e-6)  # t − 1 would not do
    assert discrete_gaussian_tail(s2, t + 1) >= _dg_upper_tail(s2, t + 1)  # an upper bound


def test_binomial_cutoff_against_exact_rationals() -> None:
    for m in (1, 7, 40):
        for p in (Fraction(1, 10), Fraction(1, 2), Fraction(88, 100)):
            for a in (0.2, 0.01, 1e-5):
                k = binomial_upper_cutoff(m, float(p), a)

                def tail(j: int, m: int = m, p: Fraction = p) -> Fraction:
                    return sum(
                        (comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(max(j, 0), m + 1)),
                        Fraction(0),
                    )

                assert tail(k) <= a
                assert k == 0 or tail(k - 1) > a


@pytest.mark.parametrize("beta", [0.5, 0.05, 0.001])
@pytest.mark.parametrize("rho", [0.01, 0.1, 1.0, 30.0])
@pytest.mark.parametrize("n_steps", [5, 34, 60])
def test_pcoqs_exact_tau_is_never_above_the_subgaussian(n_steps: int, rho: float, beta: float):
    new, old = rank_error_exact(n_steps, rho, beta), rank_error(n_steps, rho, beta)
    assert isinstance(new, int) and 0 <= new <= math.floor(old)
    # valid: N·P(Z > τ) ≤ β for the exact discrete Gaussian
    assert n_steps * _dg_upper_tail(float(noise_variance(n_steps, rho)), new + 1) <= beta
    for n in (100, 3000, 10**6):
        assert target_rank(n, 0.1, new, False) <= target_rank(n, 0.1, old, False)


def test_pcoqs_guarantee_records_the_exact_bound() -> None:
    p = PCOQSParams(alpha=0.1, rho=0.1, beta=0.01)
    g = PCOQS().guarantee(p, DataShape(n=3000))
    old = PCOQS().guarantee(p.model_copy(update={"bound": "subgaussian"}), DataShape(n=3000))
    assert g.details["bound"] == "exact" and "bound" not in old.details
    assert g.lower == old.lower == 0.9 and g.rank < old.rank
    assert g.details["tau"] == rank_error_exact(34, 0.1, 0.01)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("g", [30, 500, 2000, 20_000])
@pytest.mark.parametrize("t", [1, 6, 15])
def test_ldp_score_exact_is_never_above_hoeffding(eps: float, g: int, t: int) -> None:
    alpha, delta = 0.1, 0.001
    new, old = exact_slack(g, t, alpha, eps, delta), score_slack(g, t, eps, delta)
    assert new <= old
    # the count cut-off: Hoeffding's rule passes iff Z ≥ 1−α+Δ_S; the exact K is ≤ that count
    k_old = math.ceil(g * (1 - alpha + old + 1 / math.expm1(eps)) / rr_range(eps) - 1e-9)
    assert exact_cutoff(g, t, alpha, eps, delta) <= max(k_old, 0)
    assert nominal_level(g, t, alpha, eps, delta) >= 1 - alpha - old - 1e-12


def test_ldp_score_cutoff_is_valid_and_smallest() -> None:
    for g, t, eps, delta in [(500, 5, 1.0, 0.05), (3000, 10, 4.0, 0.001), (40, 2, 8.0, 0.2)]:
        k = exact_cutoff(g, t, 0.1, eps, delta)
        p0 = report_probability(0.9, eps)
        assert stats.binom.sf(k - 1, g, p0) <= delta / t < stats.binom.sf(k - 2, g, p0)
        # nominal: the paper's rule at n', and no looser for more reports
        lvl = nominal_level(g, t, 0.1, eps, delta)
        k_nom = nominal_cutoff(g, g, t, 0.1, eps, delta)
        assert k_nom == math.ceil(g * p0 - 1e-12)
        assert stats.binom.sf(k_nom - 1, g, report_probability(lvl, eps)) <= delta / t
        for m in (g + 1, g + 37, 2 * g):
            km = nominal_cutoff(m, g, t, 0.1, eps, delta)
            assert stats.binom.sf(km - 1, m, report_probability(lvl, eps)) <= delta / t


def test_protocol_state_saved_before_issue_13_keeps_its_rule() -> None:
    p = LdpScoreProtocol.open(alpha=0.1, epsilon=2.0, rounds=4, group_size=1000, bound="hoeffding")
    old_state = p.model_dump(mode="json")
    del old_state["bound"]
    q = LdpScoreProtocol.model_validate(old_state)
    assert q.bound == "hoeffding" and q.slack == score_slack(1000, 4, 2.0, 0.001) and q == p
    assert LdpScoreProtocol.open(alpha=0.1, epsilon=2.0, rounds=4, group_size=1000).bound == "exact"


# --- old releases verify by their own formula ---------------------------------------


def _legacy(acct: Accountant, rel: Any, version: str, old: dict[str, Any]) -> int:
    """Re-record ``rel`` as a release of calibrator ``version``: params without ``bound``
    and the coverage the version's formula gives (what the old code wrote)."""
    cal = get(rel.method).calibrator
    params = {k: v for k, v in rel.params.items() if k != "bound"}
    p, shape = cal.Params.model_validate({**params, **old}), DataShape(**rel.shape)
    # a calibrator whose recorded text changed with its version writes that version's text
    as_version = getattr(cal, "guarantee_as", None)
    cov = as_version(version, p, shape) if as_version else cal.guarantee(p, shape)
    # a private release is recorded only with charges that pay for it
    cost = parse_cost(rel.privacy["cost"])
    # (a local one: one subject per report it used, F1 of the second review)
    used = len(rel.shape.get("group_sizes") or ()) or rel.shape["n"]
    paid = (acct.charge_subjects(rel.dataset, cost, [f"{version}-{i}" for i in range(used)])
            if isinstance(cost, LocalDP) else acct.charge(rel.dataset, cost))
    # an older version's release, as the older code wrote it: past the public API, which
    # refuses a version other than the installed one
    return record_release(
        acct.ledger, rel.dataset, _as_computed=True, method=rel.method,
        calibrator_version=version, threshold=rel.threshold,
        params=params, shape=rel.shape, coverage=cov, privacy=rel.privacy,
        charge_ids=[paid.charge_id],
    ).id  # fmt: skip


def test_old_releases_verify_by_their_own_formula(ledger_url: str) -> None:
    from click.testing import CliRunner

    from privcal.cli import main

    assert CliRunner().invoke(main, ["--db-url", ledger_url, "db", "upgrade"]).exit_code == 0
    acct = Accountant(Ledger(ledger_url))
    acct.create_dataset("z", rho=10, subject_epsilon=100)
    s = np.random.default_rng(2).beta(2, 5, 3000)
    r = Seeded(0)
    pc = acct.calibrate("pcoqs", dataset="z", scores=s, alpha=0.1, rho=0.5, rng=r)
    users = [f"u{i}" for i in range(3000)]
    ls = acct.calibrate("ldp-score", dataset="z", scores=s, alpha=0.1, epsilon=2, rng=r,
                        subjects=users)
    probs = np.random.default_rng(3).dirichlet(np.ones(4), 3000)
    labels = np.random.default_rng(4).integers(0, 4, 3000)
    ll = acct.calibrate("ldp-label", dataset="z", probs=probs, labels=labels, alpha=0.1,
                        epsilon=2, rng=r, subjects=[f"v{i}" for i in range(3000)])  # fmt: skip
    assert pc.coverage.details["bound"] == "exact" and ls.coverage.details["bound"] == "exact"
    assert ll.coverage.details["bound"] == "one-sided"
    _legacy(acct, pc, "1.0.0", {"bound": "subgaussian"})
    _legacy(acct, ls, "1", {"bound": "hoeffding"})
    _legacy(acct, ll, "1", {"bound": "two-sided"})
    rep = acct.verify()
    assert rep.guarantees_recomputed == 6
    # a version-1 release whose coverage was computed with the new formula does not verify
    bad = _legacy(acct, pc, "1.0.0", {"bound": "exact"})
    from privcal.errors import AuditFailed

    with pytest.raises(AuditFailed, match=f"release {bad}"):
        acct.verify()


# --- at the edge of the new bounds (statistical) ------------------------------------
#
# P-COQS: m−1 scores below the range (counted at every step) and the rest above it (never
# counted), m = ⌈(1−α)(n+1)⌉: every one of the N counts is m−1, so a step moves ``right``
# (and the release is finite, covering only m−1 scores: below the guarantee) iff its noise
# is ≥ r' − m + 1 = τ + 1. Failure probability 1 − (1 − P(Z > τ))^N, which the exact τ makes
# ≤ β and close to it.
#
# LDP-CP-S: a fraction F = G − 10⁻⁹ of the population below the range, the rest above: every
# round's query has coverage F just under the recorded level G, and a finite release is a
# failure. Its probability is 1 − (1 − P(Bin(n', p(F)) ≥ K))^T ≤ δ, close to δ.

EDGE_TRIALS = 400


def _check_edge(failures: int, bound: float, exact: float) -> None:
    assert exact <= bound
    assert failures <= stats.binom.isf(TEST_LEVEL, EDGE_TRIALS, bound), (failures, bound)
    # sharp: the failure rate is near the bound (a loose bound would give ≈ 0 failures)
    assert failures >= stats.binom.ppf(TEST_LEVEL, EDGE_TRIALS, exact), (failures, exact)


@pytest.mark.statistical
def test_pcoqs_at_the_edge() -> None:
    n, alpha, rho, beta = 1000, 0.1, 1.0, 0.3
    params = PCOQSParams(alpha=alpha, rho=rho, beta=beta)
    g = PCOQS().guarantee(params, DataShape(n=n))
    m = math.ceil((1 - alpha) * (n + 1))
    n_steps, tau = g.details["N"], g.details["tau"]
    assert g.rank == m + tau <= n
    s = np.concatenate([np.full(m - 1, -1.0), np.full(n - m + 1, 2.0)])
    fails = 0
    for i in range(EDGE_TRIALS):
        t = PCOQS().calibrate(CalibrationInput(scores=s), params, random.Random(i)).threshold
        fails += int((s <= t).sum() < m)  # coverage rank below ⌈(1−α)(n+1)⌉
    p_step = _dg_upper_tail(float(noise_variance(n_steps, rho)), tau + 1)
    _check_edge(fails, beta, 1 - (1 - p_step) ** n_steps)


@pytest.mark.statistical
@pytest.mark.parametrize("nominal", [False, True])
def test_ldp_score_at_the_edge(nominal: bool) -> None:
    n, alpha, eps, delta, rounds = 6000, 0.1, 2.0, 0.25, 5
    params = LDPScoreParams(
        alpha=alpha, epsilon=eps, failure_probability=delta, rounds=rounds, nominal=nominal
    )
    g = n // rounds
    level = nominal_level(g, rounds, alpha, eps, delta) if nominal else 1 - alpha
    f = level - 1e-9
    k = (nominal_cutoff(g, g, rounds, alpha, eps, delta) if nominal
         else exact_cutoff(g, rounds, alpha, eps, delta))  # fmt: skip
    gen = np.random.default_rng(7)
    fails = 0
    for i in range(EDGE_TRIALS):
        s = np.where(gen.random(n) < f, -1.0, 2.0)  # i.i.d.: P(S ≤ q) = F for every q in (0, 1)
        proto = simulate(s, params, random.Random(i))
        assert proto.guarantee_lower() == pytest.approx(level)
        fails += int(math.isfinite(proto.threshold))  # coverage F < the recorded level
    p_round = stats.binom.sf(k - 1, g, report_probability(f, eps))
    _check_edge(fails, delta, 1 - (1 - p_round) ** rounds)


@pytest.mark.statistical
def test_ldp_label_one_sided_at_the_edge() -> None:
    """LDP-CP-L with β ≈ 0 (k = 2, ε = 8) and near-continuous scores: F̂ᶜ ≈ F̂ⁿ and Δ_L ≈ t_n,
    Massart's one-sided bound, which is tight for continuous F. The overestimate
    sup(F̂ᶜ − Fᶜ) exceeds Δ_L in at most a δ fraction of trials (validity) and in a fraction
    near δ/2 (sharpness: asserted ≥ the 1e-4 quantile of Binomial(trials, δ/5))."""
    from privcal.calibrators.ldp_label import label_slack
    from privcal.calibrators.mechanisms.randomized_response import krr_beta, krr_many

    n, k, eps, delta, types_n = 2000, 2, 8.0, 0.2, 50_000
    gen = np.random.default_rng(11)
    p1 = gen.random(types_n)
    types = np.stack([p1, 1 - p1], axis=1)
    s_types, w = (1 - types).reshape(-1), types.reshape(-1) / types_n
    order = np.argsort(s_types, kind="stable")
    atoms, cw = s_types[order], np.cumsum(w[order])
    beta = krr_beta(k, eps)
    sl = label_slack(n, k, eps, delta)
    assert beta * sl.t_r < 0.02 * sl.t_n  # the β term is negligible: Δ_L ≈ t_n
    fails = 0
    for _ in range(EDGE_TRIALS):
        x = gen.integers(0, types_n, n)
        probs = types[x]
        y = (gen.random(n) > probs[:, 0]).astype(np.int64)
        y_noisy = krr_many(y, k, eps, gen)
        s_all = 1 - probs
        f_n = np.searchsorted(np.sort(s_all[np.arange(n), y_noisy]), atoms, side="right") / n
        f_r = np.searchsorted(np.sort(s_all.reshape(-1)), atoms, side="right") / (n * k)
        f_hat = (f_n - beta * f_r) / (1 - beta)
        fails += int(np.max(f_hat - cw) > sl.delta_L)
    assert fails <= stats.binom.isf(TEST_LEVEL, EDGE_TRIALS, delta), fails
    assert fails >= stats.binom.ppf(TEST_LEVEL, EDGE_TRIALS, delta / 5), fails


# --- the opt-in interpolating query rule --------------------------------------------


@given(
    fractions=st.lists(st.floats(0, 1), min_size=1, max_size=12),
    rounds=st.integers(1, 10),
    nominal=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_interpolating_search_invariants(fractions: list[float], rounds: int, nominal: bool):
    p = LdpScoreProtocol.open(
        alpha=0.1, epsilon=1.0, rounds=rounds, group_size=500, lower=-2.0, upper=6.0,
        nominal=nominal, search="interpolate",
    )  # fmt: skip
    for f in fractions:
        if p.finished:
            break
        q = p.current_query()
        assert p.lo < q < p.hi
        p = p.advance(round(f * 500), 500)
        assert LdpScoreProtocol.model_validate_json(p.model_dump_json()) == p
    if p.finished and p.history[-1].decision == "stop":
        assert p.threshold == p.history[-1].query and p.passes(p.history[-1].ones, 500)


def test_interpolating_search_reaches_a_quantile_near_the_top_sooner() -> None:
    """Scores piled up just below 1 (LAC at large k): a few rounds of bisection do not reach
    them; interpolation between the estimates does (and the guarantee is unchanged)."""
    s = 1 - np.random.default_rng(0).beta(1, 400, 20_000)  # 0.9-quantile ≈ 0.9995
    kw = {"alpha": 0.1, "epsilon": 4.0, "rounds": 8}
    bis = simulate(s, LDPScoreParams(**kw), random.Random(1))
    itp = simulate(s, LDPScoreParams(**kw, search="interpolate"), random.Random(1))
    assert math.isinf(bis.threshold) and math.isfinite(itp.threshold)
    assert itp.guarantee_lower() == bis.guarantee_lower() == 0.9
    assert float((s <= itp.threshold).mean()) >= 0.9


@pytest.mark.statistical
def test_interpolating_search_keeps_the_guarantee() -> None:
    """U[0, 1] scores (F(t) = t): coverage below 1 − α in at most a δ fraction of trials."""
    trials, delta = 300, 0.05
    p = LDPScoreParams(alpha=0.1, epsilon=2.0, failure_probability=delta, search="interpolate")
    gen = np.random.default_rng(5)
    fails = sum(
        min(simulate(gen.random(20_000), p, random.Random(i)).threshold, 1.0) < 0.9
        for i in range(trials)
    )
    assert fails <= stats.binom.isf(TEST_LEVEL, trials, delta), fails
