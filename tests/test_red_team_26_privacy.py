"""Red team 26, privacy: findings on the privacy guarantees (see each test's docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal import PureDP
from privcal.errors import AuditFailed, InvalidInput
from tests.seeded import Seeded


def _exponq(accountant: Any, dataset: str, eps: float, **kw: Any) -> Any:
    rng = np.random.default_rng(1)
    probs, y = rng.dirichlet(np.ones(3), 1500), rng.integers(0, 3, 1500)
    return accountant.calibrate("exponq", dataset=dataset, probs=probs, labels=y, score="lac",
                                epsilon=eps, rng=Seeded(1), **kw)


def _record(accountant: Any, dataset: str, rel: Any, ids: list[int]) -> Any:
    return accountant.record_release(
        dataset, method=rel.method, calibrator_version=rel.calibrator_version,
        threshold=rel.threshold, params=rel.params, shape=rel.shape, coverage=rel.coverage,
        privacy=rel.privacy, charge_ids=ids)


def _underpaid_as_before(accountant: Any, monkeypatch: pytest.MonkeyPatch, rel: Any) -> Any:
    """``rel`` (a 3-DP release) recorded on dataset ``z`` (a ρ-zCDP cap) paid by three
    PureDP(1) charges, as the rule before F1 accepted it (Σε only): a ledger written then."""
    from privcal.accountant import releases
    from privcal.storage.verify_releases import shortfall

    monkeypatch.setattr(releases, "shortfall", lambda *a, **k: shortfall(*a))  # the old rule
    ids = [accountant.charge("z", PureDP(1)).charge_id for _ in range(3)]
    bad = _record(accountant, "z", rel, ids)
    monkeypatch.undo()
    return bad


def test_one_pure_release_is_not_paid_by_smaller_pure_charges_on_a_zcdp_cap(
        accountant: Any) -> None:
    """F1: one 3-DP ExponQ release (a single mechanism) recorded on a ρ-zCDP cap with three
    PureDP(1) charges passed the "paid for" rule (Σε = 3 ≥ 3), but the cap counted them
    ρ = 3 · 1²/2 = 1.5, where a 3-DP mechanism is only known to be 3²/2 = 4.5-zCDP (Bun &
    Steinke 2016, Prop. 1.4): the cap's filter (and its stated guarantee) was fed a third
    of the release's ρ. Refused now, nothing written; the same charges pay on a pure-ε cap
    (Σε is what it counts), and one PureDP(3) pays on the ρ-zCDP cap."""
    accountant.create_dataset("src", epsilon="10")
    rel = _exponq(accountant, "src", 3.0, alpha=0.1)
    assert rel.method == "exponq" and rel.privacy["cost"] == {"kind": "pure", "eps": "3"}
    accountant.create_dataset("z", rho="2")
    ids = [accountant.charge("z", PureDP(1)).charge_id for _ in range(3)]
    with pytest.raises(InvalidInput, match=r"ρ = 4\.5 on its ρ-zCDP cap.*count ρ = 1\.5"):
        _record(accountant, "z", rel, ids)
    assert accountant.releases("z") == []
    accountant.create_dataset("p", epsilon="10")
    _record(accountant, "p", rel, [accountant.charge("p", PureDP(1)).charge_id
                                   for _ in range(3)])
    accountant.create_dataset("z5", rho="5")
    _record(accountant, "z5", rel, [accountant.charge("z5", PureDP(3)).charge_id])
    assert accountant.verify().guarantees_recomputed == 3


def test_verify_fails_a_pure_release_paid_by_smaller_pure_charges_on_a_zcdp_cap(
        accountant: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """F1, on a ledger written before the fix (recorded here with the old rule, Σε only):
    ``audit verify`` said ok; it now fails naming the release, and still passes a
    ``levels:exponq`` release on a ρ-zCDP cap paid by its parts (3 levels at ε = 1:
    charged 3 · ½ = 1.5, its three runs are 1.5-zCDP)."""
    accountant.create_dataset("src", epsilon="10")
    rel = _exponq(accountant, "src", 3.0, alpha=0.1)
    accountant.create_dataset("z", rho="10")
    lv = _exponq(accountant, "z", 1.0, alpha=[0.05, 0.1, 0.2])
    assert lv.method == "levels:exponq" and len(lv.charge_ids) == 3
    assert accountant.verify().guarantees_recomputed == 2
    bad = _underpaid_as_before(accountant, monkeypatch, rel)
    with pytest.raises(AuditFailed, match=rf"release {bad.id} .*count ρ = 1\.5"):
        accountant.verify()
