"""One randomized answer per device (or agent) per session, over HTTP: a repeated
``Reporter.report`` / ``Agent.send`` — a new object after an app restart, a retry after a
lost connection, the same report id again — never sends a second, independently randomized
answer of the same subject (the ledger charges ε once). The device's memo file resends the
recorded report when its outcome is unknown, returns it when it was stored, refuses when it
was refused; without a memo, ``GET /v1/whoami`` tells the client that its answer is stored."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from privcal.client import Agent, Reporter
from privcal.errors import PlanRejected
from tests.service.conftest import Live, open_fed, open_ldp

SQLITE = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


class _Lose(httpx.BaseTransport):
    """Fails the next PUT with a transport error: after the server answered it (``forward``:
    the answer is lost) or before it left (the app died first)."""

    def __init__(self, *, forward: bool) -> None:
        self.inner, self.forward, self.armed = httpx.HTTPTransport(), forward, True

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" and self.armed:
            self.armed = False
            if self.forward:
                resp = self.inner.handle_request(request)
                resp.read()
                resp.close()
            raise httpx.ReadError("connection lost", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def _client(lv: Live, sent: list[dict[str, Any]], *, transport: Any = None,
            on_put: Callable[[httpx.Request], None] | None = None) -> httpx.Client:
    """An httpx client of the server that notes the body of every PUT it sends."""

    def hook(req: httpx.Request) -> None:
        if req.method == "PUT":
            sent.append({"path": req.url.path, **json.loads(req.content)})
            if on_put is not None:
                on_put(req)

    return httpx.Client(base_url=lv.url, timeout=60, transport=transport,
                        event_hooks={"request": [hook]})


def test_whoami_tells_a_device_and_an_agent_whether_their_answer_is_stored(live: Live) -> None:
    sid = open_ldp(live, group_size=4, rounds=2)
    dev = live.token("device", session=sid, subject="alice")
    fid = open_fed(live, agents=2)
    ag = live.token("agent", session=fid, agent="h1")
    with live.client(token=dev) as c:
        who = c.get("/v1/whoami").json()
        assert who["role"] == "device" and who["reported_rounds"] == []
        assert c.put(f"/v1/sessions/{sid}/reports/r1",
                     json={"round": 0, "value": 1}).status_code == 201
        assert c.get("/v1/whoami").json()["reported_rounds"] == [0]
    with live.client(token=live.token("device", session=sid, subject="bob")) as c:
        assert c.get("/v1/whoami").json()["reported_rounds"] == []  # its own subject only
    with live.client(token=ag) as c:
        assert c.get("/v1/whoami").json()["sent"] is False
        plan = c.get(f"/v1/sessions/{fid}").json()["plan"]
        from privcal.calibrators.fedplan import Fed2Plan
        from privcal.client import fedcp2_qq_message

        msg = fedcp2_qq_message(np.linspace(0, 1, 200), Fed2Plan.model_validate(plan))
        assert c.put(f"/v1/sessions/{fid}/messages", json={"value": float(msg)}
                     ).status_code == 201
        assert c.get("/v1/whoami").json()["sent"] is True
    with live.client("analyst") as c:
        who = c.get("/v1/whoami").json()
        assert "reported_rounds" not in who and "sent" not in who


def test_repeated_launches_without_a_memo_send_one_answer(live: Live) -> None:
    sid = open_ldp(live, group_size=50, rounds=2, epsilon=0.5)
    tok = live.token("device", session=sid, subject="alice")
    sent: list[dict[str, Any]] = []
    http = _client(live, sent)
    first = Reporter(live.url, tok, client=http).report(0.3)
    assert first["status"] == "accepted"
    for _ in range(6):  # the app restarts: a new Reporter, no local state
        with pytest.raises(PlanRejected, match="already holds"):
            Reporter(live.url, tok, client=http).report(0.3)
        with pytest.raises(PlanRejected, match="already holds"):  # the same report id
            Reporter(live.url, tok, client=http).report(0.3, report_id=first["report_id"])
    http.close()
    assert len(sent) == 1 and sent[0]["value"] == first["value"]
    fid = open_fed(live, agents=3)
    atok = live.token("agent", session=fid, agent="h1")
    sent.clear()
    http = _client(live, sent)
    scores = np.random.default_rng(0).random(200)
    assert Agent(live.url, atok, client=http).send(scores)["status"] == "accepted"
    for _ in range(3):
        with pytest.raises(PlanRejected, match="already holds"):
            Agent(live.url, atok, client=http).send(scores)
    http.close()
    assert len(sent) == 1


@pytest.mark.parametrize("forward", [True, False], ids=["answer-lost", "never-sent"])
def test_memo_resends_the_recorded_report_after_a_lost_connection(
        live: Live, tmp_path: Path, forward: bool) -> None:
    sid = open_ldp(live, group_size=4, rounds=2)
    tok = live.token("device", session=sid, subject="alice")
    memo = tmp_path / "app" / "state" / "memo.json"
    sent: list[dict[str, Any]] = []
    http = _client(live, sent, transport=_Lose(forward=forward))
    with pytest.raises(httpx.TransportError):
        Reporter(live.url, tok, client=http, retries=0, memo=memo).report(0.5)
    rec = json.loads(memo.read_text())  # recorded before it was sent
    assert [r["status"] for s in rec["sessions"].values() for r in s.values()] == ["pending"]
    for _ in range(4):  # relaunches with the memo: the same report, no new draw
        out = Reporter(live.url, tok, client=http, memo=memo).report(0.5)
        assert out["status"] == ("duplicate" if forward else "accepted")
        assert out["report_id"] == sent[0]["path"].rsplit("/", 1)[1]
        assert out["value"] == sent[0]["value"]
    http.close()
    # one resend (the outcome then known); later launches send nothing
    assert len(sent) == 2 and sent[0] == sent[1]
    assert stat.S_IMODE(os.stat(memo).st_mode) == 0o600
    assert live.accountant.subject_summary("d").subjects == 1


@SQLITE
def test_memo_is_written_before_the_report_leaves(live: Live, tmp_path: Path) -> None:
    sid = open_ldp(live, group_size=4, rounds=2)
    tok = live.token("device", session=sid, subject="alice")
    memo = tmp_path / "memo.json"
    seen: list[Any] = []

    def on_put(req: httpx.Request) -> None:
        body = json.loads(req.content)
        recs = [r for s in json.loads(memo.read_text())["sessions"].values() for r in s.values()]
        seen.append(recs)
        assert recs == [{"report_id": req.url.path.rsplit("/", 1)[1], "round": body["round"],
                         "value": body["value"], "status": "pending", "reason": None}]

    sent: list[dict[str, Any]] = []
    with _client(live, sent, on_put=on_put) as http:
        out = Reporter(live.url, tok, client=http, memo=memo).report(0.5, report_id="r-1")
    assert seen and out["status"] == "accepted" and out["report_id"] == "r-1"
    [rec] = json.loads(memo.read_text())["sessions"].values()
    assert rec["0"]["status"] == "accepted" and rec["0"]["value"] == out["value"]
    # the caller's report id again (another score): its recorded value, answered duplicate
    with _client(live, sent) as http:
        again = Reporter(live.url, tok, client=http, memo=memo).report(99.0, report_id="r-1")
    assert again == {**out, "status": "duplicate"}
    assert len(sent) == 2 and sent[0] == sent[1]


@SQLITE
def test_a_refused_report_is_not_answered_again(live: Live, tmp_path: Path) -> None:
    sid = open_ldp(live, group_size=1, rounds=2)
    tok = live.token("device", session=sid, subject="alice")
    other = live.token("device", session=sid, subject="bob")
    memo = tmp_path / "memo.json"

    def fill_round(req: httpx.Request) -> None:  # another device fills round 0 first
        if len(sent) == 1:
            with live.client(token=other) as c:
                assert c.put(f"/v1/sessions/{sid}/reports/b", json={"round": 0, "value": 1}
                             ).status_code == 201

    sent: list[dict[str, Any]] = []
    with _client(live, sent, on_put=fill_round) as http:
        rep = Reporter(live.url, tok, client=http, memo=memo)
        with pytest.raises(PlanRejected, match="closed round"):
            rep.report(0.5)
        with pytest.raises(PlanRejected, match="refused"):  # the same object: in memory
            rep.report(0.5)
        with pytest.raises(PlanRejected, match="refused"):  # a relaunch: the memo file
            Reporter(live.url, tok, client=http, memo=memo).report(0.5)
        assert len(sent) == 1
        # the documented opt-in: answer the next round's query, at another ε
        out = Reporter(live.url, tok, client=http, memo=memo).report(0.5, answer_again=True)
        assert out["status"] == "accepted" and out["round"] == 1 and len(sent) == 2
        assert Reporter(live.url, tok, client=http, memo=memo).report(0.5) == out
    assert len(sent) == 2


@SQLITE
def test_a_refused_report_without_a_memo_is_remembered_by_its_object(live: Live) -> None:
    sid = open_ldp(live, group_size=1, rounds=2)
    tok = live.token("device", session=sid, subject="alice")
    other = live.token("device", session=sid, subject="bob")

    def fill_round(req: httpx.Request) -> None:
        if len(sent) == 1:
            with live.client(token=other) as c:
                c.put(f"/v1/sessions/{sid}/reports/b", json={"round": 0, "value": 1})

    sent: list[dict[str, Any]] = []
    with _client(live, sent, on_put=fill_round) as http:
        rep = Reporter(live.url, tok, client=http)
        for _ in range(3):
            with pytest.raises(PlanRejected):
                rep.report(0.5)
    assert len(sent) == 1  # the server stored nothing of alice's; the object remembers


@SQLITE
def test_agent_memo_resends_its_message_and_keys_by_session(live: Live, tmp_path: Path) -> None:
    fid = open_fed(live, agents=3)
    tok = live.token("agent", session=fid, agent="h1")
    memo = tmp_path / "memo.json"
    sent: list[dict[str, Any]] = []
    scores = np.random.default_rng(1).random(200)
    http = _client(live, sent, transport=_Lose(forward=True))
    with pytest.raises(httpx.TransportError):
        Agent(live.url, tok, client=http, retries=0, memo=memo).send(scores)
    for _ in range(3):
        out = Agent(live.url, tok, client=http, memo=memo).send(scores * 0.1)
        assert out == {"status": "duplicate", "value": sent[0]["value"]}
    assert len(sent) == 2 and sent[0] == sent[1]
    # another session with the same memo file: its own answer
    fid2 = open_fed(live, agents=3)
    tok2 = live.token("agent", session=fid2, agent="h1")
    assert Agent(live.url, tok2, client=http, memo=memo).send(scores)["status"] == "accepted"
    http.close()
    assert len(sent) == 3 and len(json.loads(memo.read_text())["sessions"]) == 2
