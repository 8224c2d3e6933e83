"""Red team 13 (r13 mutsvc, mutation audit): token storage rules that surviving mutants weakened
unnoticed. Library level (no server): SQLite and PostgreSQL via ``ledger_url``."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from privcal.errors import InvalidInput


def _ledger(url: str) -> Any:
    from privcal.accountant import Accountant
    from privcal.storage import Ledger

    led = Ledger(url)
    led.upgrade()
    return Accountant(led)


def test_revoking_twice_keeps_the_first_revocation_time(ledger_url: str) -> None:
    """Mutant T6 (``if row.revoked_at is None:`` dropped: each revoke moves revoked_at)."""
    from privcal.storage.tokens import create_token, revoke_token

    acct = _ledger(ledger_url)
    t = create_token(acct.ledger, "auditor")
    first = revoke_token(acct.ledger, t.id).revoked_at
    time.sleep(0.01)
    again = revoke_token(acct.ledger, t.id).revoked_at
    assert first is not None and again == first


def test_a_token_lifetime_must_be_positive(ledger_url: str) -> None:
    """Mutant S4 (``0 <`` → ``0 <=``): a zero lifetime makes a token born expired."""
    from privcal.storage.tokens import create_token

    acct = _ledger(ledger_url)
    with pytest.raises(InvalidInput):
        create_token(acct.ledger, "auditor", expires_in=timedelta(0))


def test_no_device_token_for_a_federated_session(ledger_url: str) -> None:
    """Mutant B2 (``_check_session_binding``'s device-for-federated refusal dropped)
    survived: nothing mints one. A device's report PUT is not checked against the session's
    method by the report writer, so such a token's bit 0/1 — both points of a [0, 1] grid —
    would land in the federated session as an agent's message."""
    from privcal.accountant.sessions import open_session
    from privcal.service.bound_tokens import create_bound_token

    acct = _ledger(ledger_url)
    acct.create_dataset("d", rho="1", subject_epsilon="10")
    fid = open_session(acct, "fedcp2-qq", dataset="d", alpha=0.2, epsilon=2.0, agents=3,
                       local_n=200, bins=20, smax=1.0, requester="analyst:ann").id
    with pytest.raises(InvalidInput, match="federated"):
        create_bound_token(acct, "device", name=None, datasets=[], session=fid,
                           subject="s1", agent=None, expires_in=None)


def test_no_agent_token_for_an_ldp_score_session(ledger_url: str) -> None:
    """B2's siblings (red team 13 left them unrun): an agent token binds an agent of a
    federated session; for an ldp-score session, shuffled or not, none is made — its
    messages would otherwise reach the session as reports of a subject named by the agent."""
    from privcal.accountant.sessions import open_session
    from privcal.service.bound_tokens import create_bound_token

    acct = _ledger(ledger_url)
    acct.create_dataset("d", approx_epsilon=20, approx_delta=1e-5, subject_epsilon=20)
    plain = open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=2,
                         group_size=3, requester="analyst:ann").id
    # (30 a round: a shuffled session whose rounds can never pass is refused, red team 23)
    shuffled = open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=2,
                            group_size=30, shuffled=True, requester="analyst:ann",
                            idempotency_key="open-shuffled").id
    for sid in (plain, shuffled):
        with pytest.raises(InvalidInput, match="agent tokens are for federated sessions"):
            create_bound_token(acct, "agent", name=None, datasets=[], session=sid,
                               subject=None, agent="a1", expires_in=None)
