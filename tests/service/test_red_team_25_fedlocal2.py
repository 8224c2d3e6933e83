"""Red team 25 (second wave), fedlocal2 F1 over HTTP: ``POST /v1/tokens`` refuses an agent
token for a federated session beyond its plan's m agents (422, nothing written, the
Idempotency-Key left unused), so a session can no longer choose its m agents by arrival
among more; an agent counted already gets a second token."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def test_post_tokens_refuses_an_agent_beyond_m(live: Live) -> None:
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json={"method": "fedcp-qq", "alpha": 0.2,
                                                    "agents": 2, "local_n": 20})
        assert r.status_code == 201, r.text
        sid = int(r.json()["id"])
    with live.client("admin") as c:
        for a in ("a0", "a1"):
            r = c.post("/v1/tokens", json={"role": "agent", "session": sid, "agent": a})
            assert r.status_code == 201, r.text
        r = c.post("/v1/tokens", json={"role": "agent", "session": sid, "agent": "a2"},
                   headers={"Idempotency-Key": "third"})
        assert r.status_code == 422, r.text
        assert "planned for m = 2 agents" in r.json()["detail"]
        r = c.post("/v1/tokens", json={"role": "agent", "session": sid, "agent": "a0"},
                   headers={"Idempotency-Key": "third"})  # the key was left unused
        assert r.status_code == 201, r.text
    from privcal.storage.tokens import list_tokens

    agents = [t.agent for t in list_tokens(live.accountant.ledger)
              if t.role == "agent" and t.session == sid]
    assert sorted(agents) == ["a0", "a0", "a1"]  # nothing written for a2
