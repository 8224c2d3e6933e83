"""One randomized answer per device (or agent) per session, over HTTP: a repeated
``Reporter.report`` / ``Agent.send`` — a new object after an app restart, a retry after a
lost connection, the same report id again — never sends a second, independently randomized
answer of the same subject (the ledger charges ε once). The device's memo file resends the
recorded report when its outcome is unknown, returns it when it was stored, refuses when it
was refused; without a memo, ``GET /v1/whoami`` tells the client that its answer is stored.
Nor can a server that lies (about the token's session, a full round, its ε) or two threads or
objects sharing one memo get a second answer out of the device."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
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


def _records(memo: Path) -> list[dict[str, Any]]:
    """Every answer recorded in a memo file, over all its tokens."""
    return [r for e in json.loads(memo.read_text())["tokens"].values()
            for r in e["reports"].values()]


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
    # recorded before it was sent
    assert [r["status"] for r in _records(memo)] == ["pending"]
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
        recs = _records(memo)
        seen.append(recs)
        assert recs == [{"report_id": req.url.path.rsplit("/", 1)[1], "round": body["round"],
                         "rounds": 2, "value": body["value"], "status": "pending",
                         "reason": None}]

    sent: list[dict[str, Any]] = []
    with _client(live, sent, on_put=on_put) as http:
        out = Reporter(live.url, tok, client=http, memo=memo).report(0.5, report_id="r-1")
    assert seen and out["status"] == "accepted" and out["report_id"] == "r-1"
    # keyed by the token (a hash of it, never the token), one record per report id
    [entry] = json.loads(memo.read_text())["tokens"].values()
    assert tok not in memo.read_text() and entry["session"] == sid
    assert entry["subject"] == "alice"
    assert entry["reports"]["r-1"]["status"] == "accepted"
    assert entry["reports"]["r-1"]["value"] == out["value"]
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
    assert len(sent) == 3 and len(json.loads(memo.read_text())["tokens"]) == 2


class _Fake:
    """A scripted (possibly lying) server: ``whoami(n)`` answers the n-th whoami, ``state(n)``
    the n-th session read, ``put`` every PUT (status, document); the PUT bodies in ``puts``."""

    def __init__(self, *, whoami: Callable[[int], dict[str, Any]] | None = None,
                 state: Callable[[int], dict[str, Any]] | None = None,
                 put: tuple[int, dict[str, Any]] = (201, {"status": "accepted"})) -> None:
        self.puts: list[dict[str, Any]] = []
        self.n = {"who": 0, "state": 0}
        self.whoami = whoami or (lambda n: {"role": "device", "session": 1, "subject": "alice",
                                            "reported_rounds": []})
        self.state = state or (lambda n: {"id": 1, "method": "ldp-score", "status": "open",
                                          "round": 0, "rounds": 5, "query": 0.5,
                                          "params": {"epsilon": 1.0}})
        self.put = put

    def handle(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/whoami":
            self.n["who"] += 1
            return httpx.Response(200, json=self.whoami(self.n["who"]))
        if req.method == "GET":
            self.n["state"] += 1
            return httpx.Response(200, json=self.state(self.n["state"]))
        self.puts.append({"path": req.url.path, **json.loads(req.content)})
        if len(self.puts) > 20:  # a client that would answer forever
            raise AssertionError(f"{len(self.puts)} answers sent")
        return httpx.Response(self.put[0], json=self.put[1])

    def client(self) -> httpx.Client:
        return httpx.Client(base_url="https://calib.example",
                            transport=httpx.MockTransport(self.handle))


def test_a_server_that_changes_its_answer_about_the_token_gets_no_second_answer(
        tmp_path: Path) -> None:
    # the server names a new session on every whoami: the memo is keyed by the token
    fake = _Fake(whoami=lambda n: {"role": "device", "session": n, "subject": "alice",
                                   "reported_rounds": []})
    memo = tmp_path / "memo.json"
    assert Reporter("https://calib.example", "tok", client=fake.client(),
                    memo=memo).report(0.3)["status"] == "accepted"
    for _ in range(20):  # relaunches
        with pytest.raises(PlanRejected, match="the server's answer about this token changed"):
            Reporter("https://calib.example", "tok", client=fake.client(), memo=memo).report(0.3)
    rep = Reporter("https://calib.example", "tok", client=fake.client())  # in memory too
    rep.report(0.3)
    with pytest.raises(PlanRejected, match="changed"):
        rep.report(0.3)
    assert len(fake.puts) == 2  # one per memo; never a second one
    # another subject for the same token is refused the same way
    fake.whoami = lambda n: {"role": "device", "session": 1, "subject": "bob",
                             "reported_rounds": []}
    with pytest.raises(PlanRejected, match="changed"):
        Reporter("https://calib.example", "tok", client=fake.client(), memo=memo).report(0.3)
    assert len(fake.puts) == 2


@SQLITE
def test_concurrent_calls_send_one_answer(live: Live, tmp_path: Path) -> None:
    class Slow(httpx.HTTPTransport):  # a slow session read: both threads are in it at once
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "GET" and request.url.path.startswith("/v1/sessions/"):
                time.sleep(0.3)
            return super().handle_request(request)

    def race(calls: list[Callable[[], dict[str, Any]]]) -> list[Any]:
        out: list[Any] = []
        ts = [threading.Thread(target=lambda f=f: out.append(f()["status"])) for f in calls]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    sid = open_ldp(live, group_size=4, rounds=2)
    sent: list[dict[str, Any]] = []
    # one object, no memo file, two threads
    with _client(live, sent, transport=Slow()) as http:
        rep = Reporter(live.url, live.token("device", session=sid, subject="alice"),
                       client=http)
        statuses = race([lambda: rep.report(0.3)] * 2)
    assert len(sent) == 1 and statuses == ["accepted", "accepted"]
    # two objects (as two processes would) sharing one memo file: the file's lock
    sent.clear()
    tok, memo = live.token("device", session=sid, subject="bob"), tmp_path / "memo.json"
    with _client(live, sent, transport=Slow()) as http:
        reps = [Reporter(live.url, tok, client=http, memo=memo) for _ in range(2)]
        statuses = race([lambda r=r: r.report(0.3) for r in reps])
    assert len(sent) == 1 and statuses == ["accepted", "accepted"]
    assert len(_records(memo)) == 1
    assert (tmp_path / "memo.json.lock").exists()


def test_answer_again_answers_only_a_later_round_and_at_most_rounds_times(
        tmp_path: Path) -> None:
    # a server that answers "round full" forever while its round stays at 0
    fake = _Fake(put=(409, {"reason": "round full", "detail": "round 0 is full"}))
    memo = tmp_path / "memo.json"
    with pytest.raises(PlanRejected, match="round 0 was already answered"):
        Reporter("https://calib.example", "tok", client=fake.client(),
                 memo=memo).report(0.3, answer_again=True)
    for _ in range(5):
        with pytest.raises(PlanRejected, match="already answered"):
            Reporter("https://calib.example", "tok", client=fake.client(),
                     memo=memo).report(0.3, answer_again=True)
    assert len(fake.puts) == 1 and [r["status"] for r in _records(memo)] == ["refused"]
    # a server whose round moves on at every read, forever, of a 3-round session
    fake = _Fake(put=(409, {"reason": "round full", "detail": "full"}),
                 state=lambda n: {"id": 1, "method": "ldp-score", "status": "open",
                                  "round": n, "rounds": 3, "query": 0.5,
                                  "params": {"epsilon": 1.0}})
    memo = tmp_path / "memo2.json"
    with pytest.raises(PlanRejected, match="3 round"):
        Reporter("https://calib.example", "tok", client=fake.client(),
                 memo=memo).report(0.3, answer_again=True)
    assert len(fake.puts) == 3  # no more answers than rounds, none of them overwritten
    assert sorted(r["round"] for r in _records(memo)) == [1, 2, 3]
    assert len({p["path"] for p in fake.puts}) == 3


@SQLITE
def test_max_epsilon_refuses_a_session_with_a_larger_epsilon(live: Live) -> None:
    sid = open_ldp(live, group_size=4, rounds=2, epsilon=1.0)
    tok = live.token("device", session=sid, subject="alice")
    sent: list[dict[str, Any]] = []
    with _client(live, sent) as http:
        with pytest.raises(PlanRejected, match="max_epsilon"):
            Reporter(live.url, tok, client=http, max_epsilon=0.5).report(0.3)
        assert sent == []  # nothing drawn or sent
        out = Reporter(live.url, tok, client=http, max_epsilon=1.0).report(0.3)
        assert out["status"] == "accepted" and len(sent) == 1
        fid = open_fed(live, agents=3)  # its plan's ε is 2
        atok = live.token("agent", session=fid, agent="h1")
        scores = np.random.default_rng(0).random(200)
        with pytest.raises(PlanRejected, match="max_epsilon"):
            Agent(live.url, atok, client=http, max_epsilon=1.0).send(scores)
        assert len(sent) == 1
        assert Agent(live.url, atok, client=http, max_epsilon=2.0).send(scores)[
            "status"] == "accepted"
    # a lying server's huge ε
    fake = _Fake(state=lambda n: {"id": 1, "method": "ldp-score", "status": "open", "round": 0,
                                  "rounds": 2, "query": 0.5, "params": {"epsilon": 1e9}})
    with pytest.raises(PlanRejected, match="max_epsilon"):
        Reporter("https://calib.example", "tok", client=fake.client(),
                 max_epsilon=2.0).report(0.3)
    # FedCP-QQ's message is a score, not randomized: refused by an agent with max_epsilon
    fake = _Fake(whoami=lambda n: {"role": "agent", "session": 1, "agent": "h1", "sent": False},
                 state=lambda n: {"id": 1, "method": "fedcp-qq", "status": "open",
                                  "plan": {"method": "fedcp-qq"}})
    with pytest.raises(PlanRejected, match="not randomized"):
        Agent("https://calib.example", "tok", client=fake.client(), max_epsilon=2.0).send(
            np.random.default_rng(0).random(200))
    assert fake.puts == []


def test_an_unexpected_status_is_a_refusal_and_a_second_answer_needs_answer_again(
        tmp_path: Path) -> None:
    """A server answering 200 with a status that is neither accepted nor duplicate, its round
    moving on, got a new answer at every call (the record was neither stored nor refused)."""
    fake = _Fake(put=(200, {"status": "queued"}),
                 state=lambda n: {"id": 1, "method": "ldp-score", "status": "open",
                                  "round": n, "rounds": 5, "query": 0.5,
                                  "params": {"epsilon": 1.0}})
    memo = tmp_path / "memo.json"
    for _ in range(6):
        with pytest.raises(PlanRejected, match="unexpected status 'queued'"):
            Reporter("https://calib.example", "tok", client=fake.client(), memo=memo,
                     max_epsilon=2).report(0.3)
    assert len(fake.puts) == 1


def test_the_memo_is_the_tokens_whatever_the_servers_spelling(tmp_path: Path) -> None:
    """The same token under another spelling of the same server found no records: after a
    refusal, a fresh draw without answer_again."""
    fake = _Fake(put=(409, {"reason": "closed round", "detail": "closed"}),
                 state=lambda n: {"id": 1, "method": "ldp-score", "status": "open",
                                  "round": n, "rounds": 5, "query": 0.5,
                                  "params": {"epsilon": 1.0}})
    memo = tmp_path / "memo.json"
    for url in ("https://calib.example", "https://calib.example:443", "https://CALIB.example"):
        with pytest.raises(PlanRejected, match="closed round"):
            Reporter(url, "tok", client=fake.client(), memo=memo).report(0.3)
    assert len(fake.puts) == 1
