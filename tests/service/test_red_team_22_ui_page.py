"""Red team 22, ui F5: the auditor's page spelled numbers otherwise than ``budget show`` and
``release list`` (``5E-7`` for 0.0000005, ``inf`` for +inf), and left out the per-subject
local-DP spends — a dataset whose releases spent ε = 2 per subject showed an untouched bar."""

from __future__ import annotations

import numpy as np
import pytest

from privcal.costs import ZCDP
from tests.service.conftest import Live


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_the_page_spells_numbers_as_the_cli_and_shows_subject_spends(live: Live) -> None:
    acct = live.accountant
    acct.create_dataset("rd", approx_epsilon=2, approx_delta="0.000001",
                        renyi_orders=[2, 4, 8, 16])
    acct.charge("rd", ZCDP(rho="0.05"))
    acct.create_dataset("np", rho=1, subject_epsilon=5)
    g = np.random.default_rng(0)
    rel = acct.calibrate("ldp-label", dataset="np", probs=g.dirichlet(np.ones(3), 60),
                         labels=g.integers(0, 3, 60), subjects=[f"u{i}" for i in range(60)],
                         alpha=0.2, epsilon=2, classes=["a", "b", "c"])
    assert rel.threshold == float("inf")  # too few subjects: +inf
    with live.client(follow_redirects=False) as c:
        assert c.post("/ui/login", data={"token": live.tokens["auditor"]}).status_code == 303
        page = c.get("/ui/").text
    assert "5E-7" not in page and "0.0000005" in page
    assert "per-subject ε cap 5: 60 subjects charged, the largest spend 2, 0 at the cap" in page
    assert "<td>+inf</td>" in page and "<td>inf</td>" not in page
