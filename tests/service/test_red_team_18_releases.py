"""``GET /v1/releases`` reads the page it answers (red team 18, httpsec F4: it read every
release of every dataset, then filtered by grant and ``after`` and cut ``limit``: an analyst
of an empty dataset cost O(all releases) a request)."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def test_a_page_of_releases_reads_that_page(live: Live) -> None:
    acct = live.accountant
    scores = [i / 50 for i in range(50)]
    for ds in ("d", "other", "d", "other", "other", "d"):
        acct.calibrate("pcoqs", dataset=ds, scores=scores, alpha=0.2, rho=0.01)
    mine = [r.id for r in acct.releases("d")]
    everyone = [r.id for r in acct.releases()]

    with live.client("analyst") as c:  # granted d only
        assert [r["id"] for r in c.get("/v1/releases").json()] == mine
        assert [r["id"] for r in c.get(f"/v1/releases?after={mine[0]}&limit=1").json()] \
            == mine[1:2]
        assert c.get("/v1/releases?after=2147483648").status_code == 422
    with live.client("auditor") as c:
        assert [r["id"] for r in c.get("/v1/releases?limit=4").json()] == everyone[:4]
        assert [r["id"] for r in c.get(f"/v1/releases?after={everyone[-2]}").json()] \
            == everyone[-1:]
    # the store is asked for the page: the grant, after and limit are in the query
    led = acct.ledger
    seen: list[str] = []
    event.listen(led.engine, "before_cursor_execute",
                 lambda *a: seen.append(a[2]) if "releases" in a[2] else None)
    page = led.releases(None, after=mine[0], limit=1, among=["d"])
    assert [r.id for r in page] == mine[1:2]
    assert any("LIMIT" in q and "IN (" in q for q in seen), seen
