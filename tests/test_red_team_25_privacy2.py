"""Red team 25, privacy2 F1: a multi-level pure ε-DP release (``levels:exponq``) on a ρ-zCDP
cap was charged as one pure event of ε = kε₀, i.e. ρ = (kε₀)²/2, where its k independent
ε₀-DP runs are kε₀²/2-zCDP (Bun & Steinke 2016, Prop. 1.4 per run, Lemma 2.3 to compose):
3 levels at ε₀ = 1 were charged ρ = 4.5 for 1.5. Each level is now its own pure charge.

The expected totals below are computed by hand from those two rules, not by privcal."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from privcal import Accountant, PureDP
from privcal.accountant.calibration import dry_run
from privcal.calibrators.levels import Levels
from privcal.errors import BudgetRefused, InvalidInput
from tests.seeded import Seeded

LEVELS = [0.05, 0.1, 0.2]


def _data(n: int = 1500, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return rng.dirichlet(np.ones(k), n), rng.integers(0, k, n)


def _run(acct: Accountant, ds: str, eps: float = 1.0, seed: int = 1, **kw: Any) -> Any:
    probs, y = _data()
    return acct.calibrate("exponq", dataset=ds, probs=probs, labels=y, score="lac",
                          alpha=kw.pop("alpha", LEVELS), epsilon=eps, rng=Seeded(seed), **kw)


def test_levels_exponq_is_charged_k_eps_squared_over_2_on_a_zcdp_cap(
        accountant: Accountant) -> None:
    accountant.create_dataset("z", rho="10")
    accountant.create_dataset("p", epsilon="10")
    accountant.create_dataset("a", approx_epsilon="10", approx_delta="1e-6")
    for ds in ("z", "p", "a"):
        rel = _run(accountant, ds)
        assert rel.method == "levels:exponq"
        assert rel.privacy["cost"] == {"kind": "pure", "eps": "3"}  # what is recorded: 3-DP
        assert rel.privacy["statement"] == "3-DP (pure, central)"
    assert accountant.budget("z").spent == {"rho": Decimal("1.5")}  # 3 · 1²/2, not 3²/2
    assert accountant.budget("p").spent == {"epsilon": Decimal("3")}
    assert accountant.budget("a").spent["epsilon"] == Decimal("3")
    assert accountant.budget("a").spent["delta"] == 0
    # mondrian:levels: the classes' runs are parallel at each level, the 2 levels compose
    _run(accountant, "z", alpha=[0.1, 0.2], mondrian="label", public_groups=True, seed=2)
    assert accountant.budget("z").spent == {"rho": Decimal("2.5")}  # 1.5 + 2 · 1²/2
    assert accountant.verify().guarantees_recomputed == 4


def test_a_cap_the_composed_cost_fits_is_spent_and_priced_so(accountant: Accountant) -> None:
    accountant.create_dataset("z", rho="1.5")
    probs, y = _data()
    rep = dry_run(accountant, "exponq", {"alpha": LEVELS, "epsilon": 1}, dataset="z",
                  probs=probs, labels=y, score="lac")
    assert rep.allowed and rep.remaining_after == {"rho": Decimal(0)}
    assert rep.cost == {"kind": "pure", "eps": "3"}
    rel = _run(accountant, "z")
    assert len(rel.charge_ids) == 3
    assert accountant.budget("z").spent == {"rho": Decimal("1.5")}
    accountant.create_dataset("y", rho="1.49")
    with pytest.raises(BudgetRefused, match=r"3 runs composed.*remaining rho=1\.49"):
        _run(accountant, "y")
    b = accountant.budget("y")
    assert b.charges == 0 and b.spent == {"rho": Decimal(0)}
    assert accountant.verify().guarantees_recomputed == 1


def test_a_retry_finds_every_part(accountant: Accountant,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    accountant.create_dataset("z", rho="10")
    r1 = _run(accountant, "z", idempotency_key="job")
    r2 = _run(accountant, "z", idempotency_key="job", seed=9)
    assert r1.id == r2.id and r1.threshold == r2.threshold
    assert accountant.budget("z").charges == 3
    # a crash between the charges and the release: the retry calibrates under them
    with monkeypatch.context() as m:
        m.setattr(Levels, "calibrate", lambda *a, **k: (_ for _ in ()).throw(OSError("x")))
        with pytest.raises(OSError):
            _run(accountant, "z", eps=0.5, idempotency_key="job2")
    assert accountant.budget("z").spent == {"rho": Decimal("1.875")}  # + 3 · 0.5²/2
    r3 = _run(accountant, "z", eps=0.5, idempotency_key="job2")
    assert accountant.budget("z").charges == 6 and len(r3.charge_ids) == 3
    assert accountant.budget("z").spent == {"rho": Decimal("1.875")}
    assert accountant.verify().guarantees_recomputed == 2


def test_a_run_charged_whole_before_the_fix_still_replays(
        accountant: Accountant, monkeypatch: pytest.MonkeyPatch) -> None:
    accountant.create_dataset("z", rho="10")
    with monkeypatch.context() as m:  # as every run was charged before: one pure charge
        m.setattr("privcal.calibrators.cost_parts.cost_parts", lambda *a: None)
        old = _run(accountant, "z", idempotency_key="job")
    assert accountant.budget("z").spent == {"rho": Decimal("4.5")}
    again = _run(accountant, "z", idempotency_key="job")
    assert again.id == old.id and accountant.budget("z").charges == 1
    assert accountant.verify().guarantees_recomputed == 1  # such a release still verifies


def test_the_part_keys_are_reserved(accountant: Accountant) -> None:
    accountant.create_dataset("z", rho="10")
    with pytest.raises(InvalidInput, match="reserved"):
        accountant.charge("z", PureDP(0.1), idempotency_key="job#part2")
    assert accountant.budget("z").charges == 0


def test_a_part_key_taken_before_it_was_reserved_refuses_the_run(
        accountant: Accountant, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    accountant.create_dataset("z", rho="10")
    with monkeypatch.context() as m:  # a ledger written before the suffix was reserved
        m.setattr("privcal.accountant.normalize.PART_KEY", re.compile("(?!)"))
        accountant.charge("z", PureDP(0.1), idempotency_key="job#part2")
    with pytest.raises(InvalidInput, match="'job#part2', this run's part's, is already"):
        _run(accountant, "z", idempotency_key="job")
    assert accountant.budget("z").charges == 1  # nothing written
