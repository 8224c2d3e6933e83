"""LDP-CP-S (SPEC §7): the protocol state machine, Δ_S, simulation, statistics."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import privcal.calibrators.ldp_score as ldp_score_mod
from privcal.calibrators.base import CalibrationInput, Calibrator, DataShape
from privcal.calibrators.ldp_score import LDPScore, LDPScoreParams, simulate
from privcal.calibrators.ldp_score_bounds import (
    best_rounds,
    debias,
    exact_slack,
    nominal_level,
    rr_range,
    score_slack,
)
from privcal.calibrators.ldp_score_protocol import LdpScoreProtocol
from privcal.calibrators.registry import get
from privcal.costs import LocalDP
from privcal.errors import InfeasiblePlan, InvalidInput, PlanRejected

G = 100_000  # large enough that 1 − α + 2Δ_S < 1: every decision is reachable


def _proto(**kw) -> LdpScoreProtocol:
    base = {"alpha": 0.1, "epsilon": 2.0, "rounds": 4, "group_size": G}
    return LdpScoreProtocol.open(**{**base, **kw})


def _ones_for(p: LdpScoreProtocol, z: float) -> int:
    """The number of 1-reports (out of group_size) whose debiased mean is closest to z."""
    e = math.exp(p.epsilon)
    mean = (z + 1 / (e - 1)) / rr_range(p.epsilon)
    return round(mean * p.group_size)


def test_slack_formula_and_spec_form() -> None:
    eps, d = 2.0, 0.001
    c = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    assert rr_range(eps) == pytest.approx(c, rel=1e-14)
    # T | n: equal to SPEC's c·√(T·ln(2T/δ)/(2n))
    n, t = 20_000, 10
    spec = c * math.sqrt(t * math.log(2 * t / d) / (2 * n))
    assert score_slack(n // t, t, eps, d) == pytest.approx(spec, rel=1e-13)
    # T ∤ n: n' = ⌊n/T⌋ makes the bound larger than the n/T form (which would be invalid)
    assert score_slack(20_005 // 7, 7, eps, d) > c * math.sqrt(7 * math.log(14 / d) / (2 * 20_005))


def test_debias_is_unbiased_in_expectation() -> None:
    eps = 1.0
    keep = math.exp(eps) / (math.exp(eps) + 1)
    for f in (0.0, 0.3, 1.0):
        p1 = f * keep + (1 - f) * (1 - keep)  # P(report = 1)
        assert debias(1, 1, eps) * p1 + debias(0, 1, eps) * (1 - p1) == pytest.approx(f)
    assert debias(1, 1, eps) - debias(0, 1, eps) == pytest.approx(rr_range(eps))
    with pytest.raises(InvalidInput):
        debias(3, 2, eps)


def test_decisions_follow_the_rule() -> None:
    p = _proto()
    assert p.band == pytest.approx(p.slack) and p.target == pytest.approx(0.9 + p.slack)
    assert p.current_query() == 0.5
    # far above target + band: hi = q
    p1 = p.advance(_ones_for(p, 1.0), G)
    assert (p1.lo, p1.hi, p1.hi_backed, p1.round) == (0.0, 0.5, True, 1)
    assert p1.history[-1].decision == "lower" and p1.current_query() == 0.25
    # below target: lo = q
    p2 = p1.advance(_ones_for(p1, 0.5), G)
    assert (p2.lo, p2.hi) == (0.25, 0.5) and p2.history[-1].decision == "raise"
    # inside [target, target + band]: stop and release q
    p3 = p2.advance(_ones_for(p2, p2.target + p2.band / 2), G)
    assert p3.finished and p3.threshold == 0.375 and p3.history[-1].decision == "stop"
    with pytest.raises(PlanRejected):
        p3.current_query()
    with pytest.raises(PlanRejected):
        p3.advance(0, G)
    # the original value is unchanged (pure transitions)
    assert p.round == 0 and not p.finished


def test_out_of_rounds_returns_backed_hi_or_inf() -> None:
    p = _proto(rounds=3)
    for _ in range(3):  # always above: hi keeps being lowered
        p = p.advance(G, G)
    assert p.finished and p.threshold == 0.125 == p.hi
    q = _proto(rounds=3)
    for _ in range(3):  # always below: no estimate ever backed a finite threshold
        q = q.advance(0, G)
    assert q.finished and q.threshold == math.inf and q.lo == 0.875
    r = _proto(rounds=2)
    r = r.advance(G, G).advance(0, G)  # hi = 0.5 backed, then lo = 0.25
    assert r.threshold == 0.5


def test_count_and_sum_validation() -> None:
    p = _proto()
    with pytest.raises(PlanRejected, match=f"needs ≥ {G}"):
        p.advance(10, G - 1)
    with pytest.raises(InvalidInput):
        p.advance(G + 1, G)
    with pytest.raises(InvalidInput):
        p.advance(-1, G)
    with pytest.raises(InvalidInput):
        p.advance(1.5, G)  # type: ignore[arg-type]
    # more reports than n' are accepted: they only tighten Δ_S
    assert p.advance(G + 100, G + 100).history[0].count == G + 100
    with pytest.raises(InvalidInput):
        _proto(lower=1.0, upper=0.0)
    with pytest.raises(InvalidInput):
        _proto(alpha=1.5)


def test_json_round_trip_including_inf() -> None:
    p = _proto(rounds=2, lower=-1.0, upper=3.0)
    states = [p, p.advance(0, G), p.advance(0, G).advance(0, G)]
    assert states[-1].threshold == math.inf
    for s in states:
        assert LdpScoreProtocol.model_validate_json(s.model_dump_json()) == s
        assert LdpScoreProtocol.model_validate(json.loads(s.model_dump_json())) == s
        assert LdpScoreProtocol.model_validate(s.model_dump(mode="json")) == s
    assert '"Infinity"' in states[-1].model_dump_json()


def test_inconsistent_state_is_rejected() -> None:
    p = _proto()
    data = p.model_dump()
    with pytest.raises(ValueError):
        LdpScoreProtocol.model_validate({**data, "round": 2})
    with pytest.raises(ValueError):
        LdpScoreProtocol.model_validate({**data, "lo": 0.7, "hi": 0.6})
    with pytest.raises(ValueError):
        LdpScoreProtocol.model_validate({**data, "finished": True})


def test_best_rounds_is_the_argmin() -> None:
    for n, eps in [(1000, 1.0), (20_000, 2.0), (10**6, 4.0), (5, 1.0)]:
        vals = {t: score_slack(n // t, t, eps, 0.001) + 2.0**-t for t in range(1, min(40, n) + 1)}
        assert best_rounds(n, eps) == min(vals, key=lambda t: (vals[t], t))


def test_simulate_uses_disjoint_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    groups_seen: list[np.ndarray] = []
    bits_seen: list[np.ndarray] = []
    real_groups, real_rr = ldp_score_mod.assign_groups, ldp_score_mod.binary_rr_many

    def groups_spy(n, rounds, size, gen):
        g = real_groups(n, rounds, size, gen)
        groups_seen.append(g)
        return g

    def rr_spy(bits, eps, gen):
        bits_seen.append(bits.copy())
        return real_rr(bits, eps, gen)

    monkeypatch.setattr(ldp_score_mod, "assign_groups", groups_spy)
    monkeypatch.setattr(ldp_score_mod, "binary_rr_many", rr_spy)
    scores = np.random.default_rng(0).random(1003)
    proto = simulate(scores, LDPScoreParams(alpha=0.1, epsilon=1.0, rounds=7), random.Random(5))
    (g,) = groups_seen
    assert g.shape == (7, 143)  # n' = ⌊1003/7⌋
    flat = g.reshape(-1)
    assert np.unique(flat).size == flat.size and flat.min() >= 0 and flat.max() < 1003
    # round j asked exactly group j about q_j
    assert len(bits_seen) == proto.round
    for j, bits in enumerate(bits_seen):
        assert np.array_equal(bits, scores[g[j]] <= proto.history[j].query)


def test_simulate_is_reproducible_and_bad_input() -> None:
    s = np.random.default_rng(1).random(5000)
    p = LDPScoreParams(alpha=0.1, epsilon=2.0)
    a = simulate(s, p, random.Random(3))
    assert a == simulate(s, p, random.Random(3))
    with pytest.raises(InvalidInput):
        simulate(np.array([0.1, np.nan]), p, random.Random(0))
    with pytest.raises(InfeasiblePlan):
        simulate(
            np.array([0.1, 0.2]), LDPScoreParams(alpha=0.1, epsilon=1.0, rounds=3), random.Random(0)
        )


def test_contract_cost_and_guarantee() -> None:
    cal = get("ldp-score").calibrator
    assert isinstance(cal, Calibrator) and isinstance(cal, LDPScore)
    assert cal.privacy_model == "local" and cal.inputs == {"scores"}
    # the version-1 (Hoeffding) bound, still selectable and used to verify old releases
    p = LDPScoreParams(alpha=0.1, epsilon=2.0, rounds=10, bound="hoeffding")
    assert cal.cost(p, DataShape(n=1000)) == LocalDP(eps0=2.0)
    g = cal.guarantee(p, DataShape(n=20_007))
    assert g.lower == pytest.approx(0.9) and g.failure_probability == 0.001
    assert g.details["group_size"] == 2000 and g.details["unused_subjects"] == 7
    assert g.details["delta_S"] == score_slack(2000, 10, 2.0, 0.001)
    gn = cal.guarantee(p.model_copy(update={"nominal": True}), DataShape(n=20_007))
    assert gn.lower == pytest.approx(0.9 - g.details["delta_S"])
    # default rounds resolve deterministically from n (so audit can recompute)
    pd = LDPScoreParams(alpha=0.1, epsilon=2.0, bound="hoeffding")
    assert cal.guarantee(pd, DataShape(n=20_000)).details["rounds"] == best_rounds(20_000, 2.0)
    res = cal.calibrate(CalibrationInput(scores=np.linspace(0, 1, 20_000)), pd, random.Random(0))
    assert res.diagnostics["rounds"] == best_rounds(20_000, 2.0)
    # the default (exact binomial) bound: the same 1−α with a smaller recorded slack
    pe = LDPScoreParams(alpha=0.1, epsilon=2.0, rounds=10)
    ge = cal.guarantee(pe, DataShape(n=20_007))
    assert ge.lower == pytest.approx(0.9) and ge.details["bound"] == "exact"
    assert ge.details["delta_S"] == exact_slack(2000, 10, 0.1, 2.0, 0.001)
    assert 0 < ge.details["delta_S"] < g.details["delta_S"]
    gen_ = cal.guarantee(pe.model_copy(update={"nominal": True}), DataShape(n=20_007))
    assert 0.9 > gen_.lower == nominal_level(2000, 10, 0.1, 2.0, 0.001) > gn.lower
    pde = LDPScoreParams(alpha=0.1, epsilon=2.0)
    assert cal.guarantee(pde, DataShape(n=20_000)).details["rounds"] == best_rounds(
        20_000, 2.0, alpha=0.1, bound="exact"
    )
    assert len(res.diagnostics["history"]) == res.diagnostics["rounds_used"]
    with pytest.raises(ValueError):
        LDPScoreParams(alpha=0.1, epsilon=1.0, lower=1.0, upper=1.0)


def test_session_guarantee_matches_protocol() -> None:
    proto = LdpScoreProtocol.open(alpha=0.05, epsilon=1.5, rounds=6, group_size=3000, nominal=True)
    g = LDPScore().guarantee(proto.to_params(), DataShape(n=proto.rounds * proto.group_size))
    assert g.details["delta_S"] == proto.slack and g.details["group_size"] == 3000
    assert g.details["calibration_target"] == proto.target and g.lower == proto.guarantee_lower()


# --- statistical validity -------------------------------------------------------------
#
# Scores ~ U[0, 1], so the true coverage of threshold t is F(t) = min(t, 1) exactly and
# every round's estimate Z_j should be within Δ_S of F(q_j) = q_j. SPEC §7: with
# probability ≥ 1 − δ all are, hence coverage ≥ 1 − α (default) / ≥ 1 − α − Δ_S (nominal).
# Failures over TRIALS trials are ≤ Binomial(TRIALS, δ) — allowed up to its upper
# quantile at test level 1e-4.

TRIALS = 300
TEST_LEVEL = 1e-4


@pytest.mark.statistical
@pytest.mark.parametrize("bound", ["hoeffding", "exact"])
@pytest.mark.parametrize(
    ("n", "eps", "delta", "rounds"), [(20_000, 2.0, 0.05, None), (50_000, 1.0, 0.1, 8)]
)
def test_coverage_guarantee(
    n: int, eps: float, delta: float, rounds: int | None, bound: str
) -> None:
    allowed = int(stats.binom.isf(TEST_LEVEL, TRIALS, delta))
    gen = np.random.default_rng(n)
    p_def = LDPScoreParams(alpha=0.1, epsilon=eps, delta=delta, rounds=rounds, bound=bound)
    p_nom = p_def.model_copy(update={"nominal": True})
    fail_def = fail_nom = fail_est = 0
    for trial in range(TRIALS):
        s = gen.random(n)
        a = simulate(s, p_def, random.Random(trial))
        b = simulate(s, p_nom, random.Random(10_000 + trial))
        fail_def += min(a.threshold, 1.0) < 0.9
        fail_nom += min(b.threshold, 1.0) < b.guarantee_lower()
        fail_est += any(abs(r.estimate - r.query) > a.slack for r in a.history)
    if bound == "hoeffding":  # the exact bound is one-sided: it claims no two-sided Δ_S
        assert fail_est <= allowed, (fail_est, allowed)
    assert fail_def <= allowed, (fail_def, allowed)
    assert fail_nom <= allowed, (fail_nom, allowed)


@given(
    fractions=st.lists(st.floats(0, 1), min_size=1, max_size=12),
    rounds=st.integers(1, 10),
    nominal=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_protocol_invariants(fractions: list[float], rounds: int, nominal: bool) -> None:
    p = LdpScoreProtocol.open(
        alpha=0.1,
        epsilon=1.0,
        rounds=rounds,
        group_size=500,
        lower=-2.0,
        upper=6.0,
        nominal=nominal,
    )
    for f in fractions:
        if p.finished:
            break
        q = p.current_query()
        assert p.lo < q < p.hi
        p = p.advance(round(f * 500), 500)
        assert LdpScoreProtocol.model_validate_json(p.model_dump_json()) == p
    if p.finished:
        last = p.history[-1]
        if last.decision == "stop":
            assert p.threshold == last.query
        elif math.isinf(p.threshold):
            assert all(r.decision == "raise" for r in p.history)
        else:  # out of rounds: the last query that an estimate above target + w backed
            lowered = [r.query for r in p.history if r.decision == "lower"]
            assert p.threshold == lowered[-1] == p.hi
