"""Red team 26, shuffle: amplification by shuffling and the records of shuffled releases.

F1. A session's amplified claim is computed once, when it opens, and stored in its state
(``privacy_extra``, ``central_cost``); its release copied it without asking the installed
code. A shuffled fedcp2-qq session opened by a privcal from before issue 14.6 (which then
accepted it) and finished after an upgrade was released as "(0.0530054, 1e-06)-DP over the
10000 agents" — a bound that does not hold for fedcp2-qq (amplification.py: δ ≥ 0.0709 at
that ε). Reproduced with the real old code (95b2824^ opens, the current code upgrades and
ingests); here the row such a privcal wrote is recreated by editing a session's columns.
Now every batch and every release of a shuffled session first recomputes its claim and
refuses (PlanRejected, nothing written) when the installed code does not make it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.accountant.privacy.shuffle import amplify
from privcal.errors import PlanRejected
from privcal.storage.sessions import CollectionSession


def _edit(acct: Accountant, sid: int, **columns: Any) -> None:
    def tx(s: Any) -> None:
        row = s.get(CollectionSession, sid)
        for name, value in columns.items():
            setattr(row, name, value(row) if callable(value) else value)

    acct.ledger.write(tx)


def _written(acct: Accountant, sid: int) -> tuple[Any, ...]:
    info = S.session_status(acct, sid)
    return acct.ledger.head(), len(acct.releases()), info.total_reports, info.status


def test_f1_legacy_shuffled_fedcp2_session_is_not_released_with_its_old_claim(
        accountant: Accountant) -> None:
    """The state a pre-14.6 privcal wrote for ``open_session("fedcp2-qq", shuffled=True)``:
    the row is shuffled and its ``privacy_extra`` is the generic clone bound over the m
    agents. Before the fix the last batch wrote a release whose privacy statement claimed
    it ("shuffled: (…)-DP over the 20 agents"); now the batch is refused and nothing is
    written, and the session can be abandoned."""
    acct = accountant
    acct.create_dataset("h", approx_epsilon=20, approx_delta=1e-5, delta=0.01,
                        subject_epsilon=20)
    m, eps = 20, 10.0
    info = S.open_session(acct, "fedcp2-qq", dataset="h", alpha=0.1, agents=m, local_n=200,
                          epsilon=eps)
    amp = amplify(eps, m, 0.01, "generic")
    assert amp.amplified  # the old record claimed something below ε0
    old_extra = {"shuffled": True, "scope": f"over the {m} agents", "n_shuffled": m,
                 "randomizer": "generic", "amplification": amp.model_dump(mode="json")}
    _edit(acct, info.id, shuffled=True,
          state=lambda row: {**row.state, "privacy_extra": old_extra})
    before = _written(acct, info.id)
    with pytest.raises(PlanRejected, match=r"does not make .*fedcp2-qq cannot be shuffled"):
        S.submit_reports(acct, info.id, [f"a{i}" for i in range(m)], [0.5] * m)
    assert _written(acct, info.id) == before
    assert not any("shuffled" in (r.privacy.get("statement") or "") for r in acct.releases())
    assert S.close_session(acct, info.id, abandon=True).status == "closed"


def test_f1_stale_ldp_score_amplification_is_refused_and_a_current_one_released(
        accountant: Accountant) -> None:
    """An ldp-score session whose recorded amplified ε is not what the installed code gives
    (an older computation's, here 10× smaller) takes no batch; a session whose record has
    the installed code's numbers (in other words) is released with them."""
    acct = accountant
    acct.create_dataset("a", approx_epsilon=20, approx_delta=1e-5, delta=1e-6,
                        subject_epsilon=20)
    opened = [S.open_session(acct, "ldp-score", dataset="a", alpha=0.1, epsilon=2.0,
                             rounds=1, group_size=3000, shuffled=True) for _ in range(2)]
    good, stale = opened[0].id, opened[1].id
    rec = S.session_status(acct, stale)
    assert rec.central_charge_id is not None

    def older(row: Any) -> dict[str, Any]:
        extra = dict(row.state["privacy_extra"])
        extra["amplification"] = {**extra["amplification"],
                                  "eps": extra["amplification"]["eps"] / 10}
        return {**row.state, "privacy_extra": extra}

    _edit(acct, stale, state=older)
    # only the claim's numbers count, not its wording (a reference's text may change)
    _edit(acct, good, state=lambda row: {**row.state, "privacy_extra": {
        **row.state["privacy_extra"], "amplification": {
            **row.state["privacy_extra"]["amplification"], "heuristic_label": "older words"}}})
    before = _written(acct, stale)
    bits = np.random.default_rng(26).integers(0, 2, 3000).tolist()
    ids = [f"u{i}" for i in range(3000)]
    with pytest.raises(PlanRejected, match="computes another amplified"):
        S.submit_reports(acct, stale, ids, bits, [0] * 3000)
    assert _written(acct, stale) == before
    r = S.submit_reports(acct, good, ids, bits, [0] * 3000)
    rel = acct.release(r.session.release_id)
    want = amplify(2.0, 3000, 1e-6, "binary-rr")
    assert rel.privacy["extra"]["amplification"]["eps"] == want.eps < 2.0
    assert rel.privacy["extra"]["amplification"]["heuristic_label"] == want.heuristic_label


def test_f2_more_than_1e9_reports_get_the_bound_at_1e9() -> None:
    """A shuffled view of n + 1 reports is a post-processing of the view of n, so the bound
    at 10⁹ holds for more. ``amplify`` refused n > 10⁹ ("n must be between 1 and 1e+09", also
    what ``session open --group-size 2000000000 --shuffled`` said); now it answers the bound
    at 10⁹, says so on every row, and reports the n it was asked about."""
    at = amplify(8.0, 10**9, 1e-3, "generic")
    big = amplify(8.0, 10**12, 1e-3, "generic")
    assert at.amplified and big.eps == at.eps and big.bound == at.bound
    assert big.n == 10**12 and big.heuristic_eps0_over_sqrt_n == 8.0 / 10**6
    assert all("evaluated at n = 1e+09" in (row.reason or "") for row in big.bounds)
    assert all("evaluated at" not in (row.reason or "") for row in at.bounds)
