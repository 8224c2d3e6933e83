"""Red team 10, L-2, over HTTP on SQLite and PostgreSQL: a subject past its per-subject cap
sent a freshly randomized bit to every new session — refused only on arrival, after the
server saw it — even from ``Reporter(…, memo=…, max_epsilon=…)``. ``GET /v1/whoami`` now
says whether the subject (agent) still has the session's ε left of its cap
(``within_cap``), and the client draws and sends nothing when it has not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from privcal.client import Reporter
from privcal.errors import PlanRejected
from tests.service.conftest import Live, open_fed, open_ldp


def _client(lv: Live, sent: list[str]) -> httpx.Client:
    """An httpx client of the server that notes every PUT it sends."""

    def hook(req: httpx.Request) -> None:
        if req.method == "PUT":
            sent.append(req.url.path)

    return httpx.Client(base_url=lv.url, timeout=60, event_hooks={"request": [hook]})


def test_a_device_past_its_cap_draws_and_sends_nothing(live: Live, tmp_path: Path) -> None:
    # dataset d: per-subject cap 10; three sessions at ε = 4 (the third would reach 12)
    sids = [open_ldp(live, group_size=4, rounds=1, epsilon=4.0) for _ in range(3)]
    sent: list[str] = []
    memo = tmp_path / "memo.json"
    with _client(live, sent) as http:
        for sid in sids[:2]:
            tok = live.token("device", session=sid, subject="patient-42")
            with live.client(token=tok) as c:
                assert c.get("/v1/whoami").json()["within_cap"] is True
            out = Reporter(live.url, tok, client=http, memo=memo, max_epsilon=4).report(0.3)
            assert out["status"] == "accepted"
        assert len(sent) == 2
        tok = live.token("device", session=sids[2], subject="patient-42")
        with live.client(token=tok) as c:
            who = c.get("/v1/whoami").json()
        assert who["within_cap"] is False and who["reported_rounds"] == []
        with pytest.raises(PlanRejected, match=r"per-subject ε cap \(or is no longer a valid "
                                               r"id\): its answer would be refused on arrival"):
            Reporter(live.url, tok, client=http, memo=memo, max_epsilon=4).report(0.3)
        with pytest.raises(PlanRejected, match="per-subject ε cap"):  # no memo either
            Reporter(live.url, tok, client=http).report(0.3)
    assert len(sent) == 2  # nothing left the device for the third session
    recs = json.loads(memo.read_text())["tokens"]
    assert sum(len(e["reports"]) for e in recs.values()) == 2  # and nothing was drawn
    # another subject of the same session is within its cap
    other = live.token("device", session=sids[2], subject="patient-7")
    with live.client(token=other) as c:
        assert c.get("/v1/whoami").json()["within_cap"] is True


def test_whoami_within_cap_of_an_agent_and_of_other_roles(live: Live) -> None:
    fid = open_fed(live, agents=2)
    with live.client(token=live.token("agent", session=fid, agent="h1")) as c:
        who: dict[str, Any] = c.get("/v1/whoami").json()
    assert who["within_cap"] is True and who["sent"] is False
    with live.client("analyst") as c:
        assert "within_cap" not in c.get("/v1/whoami").json()


def test_a_token_made_before_the_id_rule_draws_nothing(live: Live, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A device token minted before the invisible-character rule for ``alice\\ufe0f``: its
    reports are refused on arrival, so whoami says ``within_cap: false`` and nothing is
    drawn or sent (r10rev 8b)."""
    from privcal.storage import tokens

    sid = open_ldp(live, group_size=4, rounds=1, epsilon=1.0)
    with monkeypatch.context() as m:  # the code before
        m.setattr(tokens, "invisible_char", lambda v: None)
        tok = str(tokens.create_token(live.accountant.ledger, "device", session=sid,
                                      subject="alice\ufe0f").token)
    with live.client(token=tok) as c:
        assert c.get("/v1/whoami").json()["within_cap"] is False
    sent: list[str] = []
    with _client(live, sent) as http, pytest.raises(PlanRejected, match="no longer a valid id"):
        Reporter(live.url, tok, client=http).report(0.3)
    assert sent == []
