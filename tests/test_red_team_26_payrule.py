"""Red team 26, payrule: how a release is paid for by its charges (see each test's docstring)."""

from __future__ import annotations

from typing import Any

import pytest

from privcal import PureDP
from privcal.errors import AuditFailed, InvalidInput
from tests.test_red_team_26_privacy import _exponq, _record, _underpaid_as_before


def test_storage_sign_head_refuses_a_pure_release_underpaid_on_a_zcdp_cap(
        accountant: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """F1: a ledger written before red team 26 privacy F1 (recorded here with the old rule,
    Σε only): a 3-DP ExponQ release on a ρ-zCDP cap paid by three PureDP(1) charges — its cap
    counted ρ = 3 · 1²/2 = 1.5 for a mechanism only known to be 3²/2 = 4.5-zCDP (Bun &
    Steinke 2016, Prop. 1.4). ``Accountant.verify`` fails it, but the storage's
    ``Ledger.verify`` said ok and ``Ledger.sign_head`` signed it (with or without the
    accountant's ``cap_check``). The storage cannot tell a single mechanism from a wrapper's
    separately charged runs, so it now counts such a release in ``releases_unchecked`` and
    ``Ledger.sign_head`` refuses, nothing signed; a release paid by one PureDP(3) is decided
    (0) and signed."""
    from privcal.accountant import verification
    from privcal.storage import signing

    accountant.create_dataset("src", epsilon="10")
    rel = _exponq(accountant, "src", 3.0, alpha=0.1)
    accountant.create_dataset("z", rho="10")
    _record(accountant, "z", rel, [accountant.charge("z", PureDP(3)).charge_id])
    priv, _pub, _ = signing.generate_keypair(tmp_path / "k")
    assert accountant.ledger.verify().releases_unchecked == 0
    accountant.ledger.sign_head(priv)  # decided by the storage: signed
    bad = _underpaid_as_before(accountant, monkeypatch, rel)
    with pytest.raises(AuditFailed, match=rf"release {bad.id} .*count ρ = 1\.5"):
        accountant.verify()
    assert accountant.ledger.verify().releases_unchecked == 1
    head = accountant.ledger.head()
    for kw in ({}, {"cap_check": verification.check_cap}):
        with pytest.raises(InvalidInput, match=r"1 pure-cost release.*ρ-zCDP.*nothing signed"):
            accountant.ledger.sign_head(priv, **kw)
    assert accountant.ledger.head() == head  # nothing written


def test_a_levels_release_paid_by_its_parts_is_left_to_the_accountant(
        accountant: Any, tmp_path: Any) -> None:
    """F1: a ``levels:exponq`` run on a ρ-zCDP cap (3 levels at ε = 1, three PureDP(1)
    charges: its three runs are 1.5-zCDP, paid) — the storage cannot decide it (counted in
    ``releases_unchecked``, ``Ledger.sign_head`` refuses); ``Accountant.verify`` recomputes
    its parts (``releases_unchecked`` 0) and the accountant's sign_head signs it."""
    from privcal.accountant import verification
    from privcal.storage import signing

    accountant.create_dataset("z", rho="10")
    lv = _exponq(accountant, "z", 1.0, alpha=[0.05, 0.1, 0.2])
    assert lv.method == "levels:exponq" and len(lv.charge_ids) == 3
    assert accountant.ledger.verify().releases_unchecked == 1
    rep = accountant.verify()
    assert rep.releases_unchecked == 0 and rep.guarantees_recomputed == 1
    priv, _pub, _ = signing.generate_keypair(tmp_path / "k")
    with pytest.raises(InvalidInput, match="nothing signed"):
        accountant.ledger.sign_head(priv)
    assert verification.sign_head(accountant, priv).seq == rep.entries
