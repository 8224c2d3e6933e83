"""Red team 11 (time): a device or agent token revoked or expired while its answer is in
flight. The server received the randomized answer and refused it (401, nothing stored); the
memo keeps it ``pending`` under that token. The token an admin issues in its place for the
same session and subject (agent) must resend that answer — never draw a second, independent
one: the server would hold two randomized answers of one subject, the ledger charging ε once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import privcal.client as client_mod
from privcal.client import Agent, Reporter
from privcal.errors import PlanRejected
from privcal.storage.tokens import revoke_token
from tests.service.conftest import Live, open_fed, open_ldp


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Every call of ``privcal.client.<name>`` (a randomized draw), noted."""
    calls: list[Any] = []
    real = getattr(client_mod, name)

    def wrapped(*a: Any, **kw: Any) -> Any:
        out = real(*a, **kw)
        calls.append(out)
        return out

    monkeypatch.setattr(client_mod, name, wrapped)
    return calls


def _client(lv: Live, sent: list[dict[str, Any]], revoke: str | None = None) -> httpx.Client:
    """Notes every PUT's body; with ``revoke``, revokes that token as the first PUT leaves
    (the answer reaches the server with a token no longer valid)."""

    def hook(req: httpx.Request) -> None:
        if req.method == "PUT":
            sent.append({"path": req.url.path, **json.loads(req.content)})
            if revoke is not None and len(sent) == 1:
                revoke_token(lv.accountant.ledger, revoke.split("_")[1])

    return httpx.Client(base_url=lv.url, timeout=60, event_hooks={"request": [hook]})


def _revoked_in_flight(live: Live, tmp_path: Path, subject: str
                       ) -> tuple[int, Path, list[dict[str, Any]]]:
    """An ldp-score session whose ``subject``'s device token is revoked as its report
    leaves (401: the server received the bit, stored nothing): (session, memo, PUT bodies)."""
    sid = open_ldp(live, group_size=4, rounds=1)
    memo, sent = tmp_path / "memo.json", []
    old = live.token("device", session=sid, subject=subject)
    with pytest.raises(client_mod.ServiceError) as err:
        Reporter(live.url, old, memo=memo, client=_client(live, sent, revoke=old)).report(0.3)
    assert err.value.status == 401
    return sid, memo, sent


def test_a_device_token_revoked_in_flight_its_replacement_resends_the_same_bit(
        live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = _counting(monkeypatch, "binary_rr")
    sid, memo, sent = _revoked_in_flight(live, tmp_path, "phone-17")
    assert len(sent) == 1 and len(draws) == 1
    new = live.token("device", session=sid, subject="phone-17")
    out = Reporter(live.url, new, memo=memo, client=_client(live, sent)).report(0.3)
    assert out["status"] == "accepted"
    assert len(draws) == 1  # no second randomized answer
    assert [s["value"] for s in sent] == [sent[0]["value"]] * 2
    assert sent[0]["path"] == sent[1]["path"]  # the same report id
    # and a later call of either token sends nothing new
    n = len(sent)
    assert Reporter(live.url, new, memo=memo, client=_client(live, sent)).report(0.3)[
        "status"] == "accepted"
    assert len(sent) == n and len(draws) == 1


def test_a_device_refused_under_an_earlier_token_is_not_asked_again(
        live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal recorded under the earlier token (its round closed) counts for the
    replacement: it sent an answer of the subject, so no new draw without answer_again."""
    draws = _counting(monkeypatch, "binary_rr")
    sid = open_ldp(live, group_size=4, rounds=1)
    memo = tmp_path / "memo.json"
    old = live.token("device", session=sid, subject="phone-18")
    Reporter(live.url, old, memo=memo).report(0.3)
    data = json.loads(memo.read_text())
    (entry,) = data["tokens"].values()
    (rec,) = entry["reports"].values()
    rec.update(status="refused", reason="round full")  # as a full round would answer
    memo.write_text(json.dumps(data))
    new = live.token("device", session=sid, subject="phone-18")
    with pytest.raises(PlanRejected, match="refused: round full"):
        Reporter(live.url, new, memo=memo).report(0.3)
    assert len(draws) == 1


def test_another_subjects_token_in_the_same_memo_draws_its_own(
        live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = _counting(monkeypatch, "binary_rr")
    sid, memo, sent = _revoked_in_flight(live, tmp_path, "phone-19")
    other = live.token("device", session=sid, subject="phone-20")
    assert Reporter(live.url, other, memo=memo, client=_client(live, sent)).report(0.3)[
        "status"] == "accepted"
    assert len(draws) == 2 and sent[0]["path"] != sent[1]["path"]


def test_an_agent_token_revoked_in_flight_its_replacement_resends_the_same_message(
        live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = _counting(monkeypatch, "fedcp2_qq_message")
    sid = open_fed(live, agents=2)
    memo, sent = tmp_path / "memo.json", []
    scores = np.random.default_rng(0).random(200)
    old = live.token("agent", session=sid, agent="h1")
    with pytest.raises(client_mod.ServiceError) as err:
        Agent(live.url, old, memo=memo, client=_client(live, sent, revoke=old)).send(scores)
    assert err.value.status == 401
    new = live.token("agent", session=sid, agent="h1")
    out = Agent(live.url, new, memo=memo, client=_client(live, sent)).send(scores)
    assert out["status"] == "accepted" and len(draws) == 1
    assert [s["value"] for s in sent] == [sent[0]["value"]] * 2


def test_advise_tol_over_http_is_the_clis(live: Live) -> None:
    from tests.service.test_plan_routes import _cli_json, _same

    with live.client("analyst") as c:
        r = c.post("/v1/advise", json={"method": "pcoqs", "alpha": 0.1, "rho": 0.1,
                                       "tol": 2.0**-12})
        assert r.status_code == 200, r.text
        assert r.json()["min_n"] == 209
        _same(r.json(), _cli_json(live, "advise", "--method", "pcoqs", "--alpha", "0.1",
                                  "--rho", "0.1", "--tol", "0.000244140625"))
        for body in ({"method": "exponq", "alpha": 0.1, "epsilon": 1.0, "tol": 0.01},
                     {"n": 100, "k": 3, "epsilon": 1.0, "alpha": 0.1, "tol": 0.01}):
            r = c.post("/v1/advise", json=body)
            assert r.status_code == 422 and "tol" in r.text, r.text
