"""An agent's message waiting in the report writer when its token is revoked is refused, as a
device's report is (red team 18, httpsec F0: it was stored and its agent charged, 201)."""

from __future__ import annotations

import pytest

from privcal.service.problems import ProblemError
from privcal.storage.tokens import revoke_token
from tests.service.conftest import Live, open_fed


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_a_message_whose_token_was_revoked_while_it_waited_is_refused(live: Live) -> None:
    sid = open_fed(live, agents=2)
    tok = live.token("agent", session=sid, agent="h1")
    with live.client(token=tok) as c:
        me = c.get("/v1/whoami").json()
        grid = c.get(f"/v1/sessions/{sid}").json()["grid"]
    point = grid["lower"] + 5 * (grid["upper"] - grid["lower"]) / (grid["points"] - 1)
    batcher = live.app.state.batcher
    head = live.accountant.ledger.head()
    # the request was authenticated on arrival; its token is revoked before the writer runs
    revoke_token(live.accountant.ledger, me["id"])
    with pytest.raises(ProblemError) as err:
        batcher.submit(sid, "h1", None, point, recheck=me["id"])
    assert err.value.status == 401
    assert live.accountant.ledger.head() == head  # nothing stored, nothing charged
    with live.client("auditor") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["received"] == 0
    # a token still in force goes through the same path
    other = live.token("agent", session=sid, agent="h2")
    with live.client(token=other) as c:
        oid = c.get("/v1/whoami").json()["id"]
    assert batcher.submit(sid, "h2", None, point, recheck=oid).status == "accepted"
