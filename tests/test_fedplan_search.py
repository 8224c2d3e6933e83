"""The FedCP²-QQ γ search (warm starts, exact pruning) returns the plan of the plain scan.

Reference: for every γ of the grid in order, Algorithm 1's selection from scratch on a
fresh table of M values, ℓ_cor by eq. (10), the criterion M_{ℓ_γ+ℓ_cor, k_γ}, the
smallest criterion winning (ties: the smaller γ), stopping only when the level itself
reaches the best criterion (Humbert et al. 2023, Alg. 3; SPEC §10). The planner must
return exactly that plan, field for field and bit for bit, over many parameter sets.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from privcal.calibrators.fedplan import (
    GAMMA_GRID,
    coverage_M,
    coverage_M_array,
    l_correction,
    plan_fedcp2_qq,
    plan_fedcp2_qq_pinned,
)
from privcal.calibrators.fedplan.coverage import FEAS_TOL, MTable
from privcal.calibrators.fedplan.gamma_search import certified_floor
from privcal.calibrators.fedplan.plan_qq2 import answer_budget
from privcal.calibrators.fedplan.selection import select
from privcal.errors import InfeasiblePlan


def _plain_scan(
    m: int, n: int, alpha: float, eps: float, bins: int, budget: int
) -> tuple[float, int, int, int, float] | None:
    """(γ, ℓ_γ, k_γ, ℓ_cor, criterion) of the unpruned, cold γ scan; None if no γ fits."""
    tab = MTable(m, n)  # not the planner's memo: every value computed afresh
    best: tuple[float, float, int, int, int] | None = None
    for gamma in GAMMA_GRID:
        target = (1 - alpha) / (1 - gamma * alpha)
        if best is not None and target - FEAS_TOL >= best[0]:
            break  # crit ≥ M_{ℓ_γ,k_γ} ≥ level − tolerance: no later γ can be smaller
        l_cor = l_correction(gamma, alpha, m, eps, bins)
        if l_cor >= budget:
            continue
        sel = select(tab, target)
        if sel is None:
            break
        l_g, k_g, _, _ = sel
        if l_g + l_cor > budget:
            continue
        crit = tab(l_g + l_cor, k_g)
        if best is None or crit < best[0]:
            best = (crit, gamma, l_g, k_g, l_cor)
    if best is None:
        return None
    crit, gamma, l_g, k_g, l_cor = best
    return gamma, l_g, k_g, l_cor, crit


def _cases() -> list[tuple[int, int, float, float, int, float | None]]:
    rng = random.Random(20261123)
    out = []
    while len(out) < 40:
        m = rng.choice([1, 2, 3, 5, 8, 13, 24, 40])
        n = rng.choice([60, 150, 400, 1000])
        alpha = rng.choice([0.05, 0.1, 0.2, 0.3])
        eps = rng.choice([1.0, 2.0, 5.0, 10.0, 50.0])
        bins = rng.choice([10, 100, 1000])
        q = rng.choice([None, None, 0.5, 0.9, 0.97])
        out.append((m, n, alpha, eps, bins, q))
    return out


@pytest.mark.parametrize(("m", "n", "alpha", "eps", "bins", "q"), _cases())
def test_gamma_search_equals_plain_scan(
    m: int, n: int, alpha: float, eps: float, bins: int, q: float | None
) -> None:
    budget = n - 1 if q is None else answer_budget(n, q)
    ref = _plain_scan(m, n, alpha, eps, bins, budget)
    if ref is None:
        with pytest.raises(InfeasiblePlan):
            if q is None:
                plan_fedcp2_qq(m, n, alpha, eps, bins=bins)
            else:
                plan_fedcp2_qq_pinned(m, n, alpha, eps, q, bins=bins)
        return
    if q is None:
        plan = plan_fedcp2_qq(m, n, alpha, eps, bins=bins)
    else:
        plan = plan_fedcp2_qq_pinned(m, n, alpha, eps, q, bins=bins)
    assert (plan.gamma, plan.l_gamma, plan.k_gamma, plan.l_cor, plan.M) == ref
    # the criterion is the coverage formula's value at that cell, to the bit
    assert plan.M == coverage_M(plan.l_gamma + plan.l_cor, plan.k_gamma, m, n)


def test_large_plan_equals_plain_scan() -> None:
    # the size the pruning is built for (many blocks of server orders): m = 150 agents
    m, n, alpha, eps, bins = 150, 1500, 0.1, 1.0, 100
    ref = _plain_scan(m, n, alpha, eps, bins, n - 1)
    plan = plan_fedcp2_qq(m, n, alpha, eps, bins=bins)
    assert ref is not None
    assert (plan.gamma, plan.l_gamma, plan.k_gamma, plan.l_cor, plan.M) == ref


def test_cell_value_does_not_depend_on_the_batch() -> None:
    # a plan must not depend on which cells the planner evaluated together
    rng = np.random.default_rng(3)
    for m, n in [(1000, 10000), (10, 50), (300, 2000)]:
        ls = rng.integers(1, n + 1, size=200)
        ks = rng.integers(1, m + 1, size=200)
        batch = coverage_M_array(ls, ks, m, n)
        alone = [float(coverage_M_array(int(a), int(b), m, n)) for a, b in zip(ls, ks, strict=True)]
        assert batch.tolist() == alone
        assert coverage_M_array(ls[:17], ks[:17], m, n).tolist() == alone[:17]


@pytest.mark.parametrize(("m", "n"), [(50, 500), (200, 2000), (7, 300)])
def test_certified_floor_is_below_the_staircase(m: int, n: int) -> None:
    # L_k ≤ ℓ_k(level) for every k, where ℓ_k comes from a search at the higher level
    alpha = 0.1
    tab = MTable(m, n)
    low = select(tab, (1 - alpha) / (1 - 0.01 * alpha))
    high = select(MTable(m, n), (1 - alpha) / (1 - 0.05 * alpha))
    assert low is not None and high is not None
    ks = np.array(sorted(high[3]))
    tgt = (1 - alpha) / (1 - 0.05 * alpha) - FEAS_TOL
    floors = certified_floor(tab, ks, low[3], tgt)
    exact = [high[3][int(k)] for k in ks]
    assert all(f <= e for f, e in zip(floors, exact, strict=True))
    # and the guesses are used: most floors rise above the lower level's ℓ_k
    assert sum(f > low[3].get(int(k), 1) for f, k in zip(floors, ks, strict=True)) > ks.size // 2
