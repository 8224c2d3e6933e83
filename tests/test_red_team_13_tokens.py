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
