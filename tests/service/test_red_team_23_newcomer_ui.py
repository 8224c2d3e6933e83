"""Red team 23, newcomer F5: the auditor's page rounded a budget's spent share to nearest —
ρ = 0.0004 of 1 read "(0.0%)" and ε = 1.99995 of 2 "(100.0%)" beside "0.00005 left". It is
rounded up now (a spend is never shown smaller), and a cap not used up never reads 100 %."""

from __future__ import annotations

from decimal import Decimal

import pytest

from privcal.costs import ZCDP, PureDP
from privcal.service.ui import spent_percent
from tests.service.conftest import Live


def test_the_spent_share_is_rounded_up_and_short_of_the_whole_cap() -> None:
    d = Decimal
    assert spent_percent(d("0.0004"), d(1)) == "0.1"
    assert spent_percent(d("0.1004"), d(1)) == "10.1"
    assert spent_percent(d("0.25"), d(1)) == "25.0"
    assert spent_percent(d("1.99995"), d(2)) == ">99.9"
    assert spent_percent(d(2), d(2)) == "100.0"
    assert spent_percent(d(0), d(2)) == "0"


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_page_never_shows_a_spend_as_nothing_or_a_cap_as_used_up(live: Live) -> None:
    acct = live.accountant
    acct.create_dataset("tiny", rho=1)
    acct.charge("tiny", ZCDP(rho="0.0004"))
    acct.create_dataset("nearly", epsilon=2)
    acct.charge("nearly", PureDP(epsilon="1.99995"))
    with live.client(follow_redirects=False) as c:
        assert c.post("/ui/login", data={"token": live.tokens["auditor"]}).status_code == 303
        page = c.get("/ui/").text
    assert "rho: 0.0004 of 1 (0.1%), 0.9996 left" in page
    assert "epsilon: 1.99995 of 2 (&gt;99.9%), 0.00005 left" in page
    assert "(0.0%)" not in page and "(100.0%)" not in page
