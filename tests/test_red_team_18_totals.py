"""A cost whose running total would pass what the ledger stores names that total on every
backend (red team 18, stateful F1: PostgreSQL's one-round-trip charge named the cost's own
increment, SQLite the total)."""

from __future__ import annotations

from typing import Any

import pytest

from privcal.costs import PureDP
from privcal.errors import InvalidInput


def test_the_refusal_names_the_total(accountant: Any) -> None:
    accountant.create_dataset("big", epsilon="100000000000000")  # 1e14 (< 1e15)
    accountant.charge("big", PureDP(eps="1000000000"))  # pure ρ 5e17
    head = accountant.ledger.head()
    with pytest.raises(InvalidInput, match="would be 2500000000000000000, past"):
        accountant.charge("big", PureDP(eps="2000000000"))  # + 2e18
    assert accountant.ledger.head() == head
