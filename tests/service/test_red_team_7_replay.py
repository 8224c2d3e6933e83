"""Red team 7, C-1, over HTTP on SQLite and PostgreSQL: a retry with the same
``Idempotency-Key`` after the server died between the library's commit and its own record
of the answer (the record left pending, then taken over) must get the original answer.

The crash is simulated as in tests/test_red_team_5_more.py: the service's record of the
answer fails to be written once (the client sees the connection drop or a 500), and the
pending record may be taken over at once (``PENDING_TTL`` 0) — what a restarted server
does five minutes later. Before the fix an ingestor batch's retry answered "subject already
reported" for every row the first attempt accepted, and a close's retry 409 "already closed".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

import privcal.storage.tokens as tokens
from privcal.accountant import sessions as S
from tests.service.conftest import Live, answer_fed, open_fed, open_ldp


@pytest.fixture
def crashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys whose answer the server "died" before recording (the first one only)."""
    keys: list[str] = []
    finish = tokens.finish_idempotent

    def die_once(ledger: Any, principal: str, key: str, *args: Any, **kw: Any) -> None:
        if not keys:
            keys.append(key)
            raise RuntimeError("the service died before recording its answer")
        finish(ledger, principal, key, *args, **kw)

    monkeypatch.setattr(tokens, "finish_idempotent", die_once)
    monkeypatch.setattr(tokens, "PENDING_TTL", timedelta(0))
    return keys


def _post_and_die(lv: Live, token: str, path: str, body: Any, key: str) -> None:
    """The first attempt: committed by the library, its answer lost (the server drops the
    connection or answers 500; the retry comes on a new connection)."""
    with lv.client(token=token) as c:
        try:
            r = c.post(path, json=body, headers={"Idempotency-Key": key})
            assert r.status_code == 500, r.text
        except httpx.HTTPError:
            pass


def _verified(lv: Live) -> None:
    with lv.client("auditor") as c:
        r = c.post("/v1/audit/verify", json={})
        assert r.status_code == 200 and r.json()["ok"] is True, r.text


def test_a_batch_retried_after_a_crash_answers_what_it_accepted(live: Live,
                                                               crashed: list[str]) -> None:
    sid = open_ldp(live, group_size=20, rounds=2)
    batch = {"reports": [{"subject": f"s{i}", "value": i % 2, "round": 0} for i in range(10)]}
    path = f"/v1/sessions/{sid}/batches"
    ingestor = live.token("ingestor", session=sid)
    _post_and_die(live, ingestor, path, batch, "b1")
    assert crashed == ["b1"]
    with live.client(token=ingestor) as c:
        r = c.post(path, json=batch, headers={"Idempotency-Key": "b1"})
        assert r.status_code == 200, r.text
        got = r.json()
        # the counts of the first attempt, which accepted and charged all 10
        assert (got["accepted"], got["rejected"], got["reasons"]) == (10, 0, {}), got
        assert got["charge_id"] is not None and got["replayed"] is True
        # once the answer is recorded, the service replays it
        again = c.post(path, json=batch, headers={"Idempotency-Key": "b1"})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == got
    info = S.session_status(live.accountant, sid)
    assert info.total_reports == 10 and info.received == 10  # stored and counted once
    assert live.accountant.budget("d").charges == 1  # the 10 subjects charged once
    _verified(live)


@pytest.mark.parametrize("fed", [False, True], ids=["abandon-ldp", "abandon-fed"])
def test_an_abandon_retried_after_a_crash_answers_the_closed_session(
        live: Live, crashed: list[str], fed: bool) -> None:
    sid = open_fed(live) if fed else open_ldp(live)
    _post_and_die(live, live.tokens["analyst"], f"/v1/sessions/{sid}/close",
                  {"abandon": True}, "c1")
    assert crashed == ["c1"]
    with live.client("analyst") as c:
        r = c.post(f"/v1/sessions/{sid}/close", json={"abandon": True},
                   headers={"Idempotency-Key": "c1"})
        assert r.status_code == 200, r.text  # was 409 "session … is already closed"
        assert r.json()["id"] == sid and r.json()["status"] == "closed"
        assert r.json()["release_id"] is None
        # another close of the closed session is still refused
        r = c.post(f"/v1/sessions/{sid}/close", json={"abandon": True},
                   headers={"Idempotency-Key": "c2"})
        assert r.status_code == 409 and "already closed" in r.text, r.text
    _verified(live)


def test_a_release_at_close_retried_after_a_crash_answers_its_release(
        live: Live, crashed: list[str]) -> None:
    sid = open_fed(live, agents=3)
    answer_fed(live, sid)
    _post_and_die(live, live.tokens["analyst"], f"/v1/sessions/{sid}/close",
                  {"allow_missing": True}, "rel")
    assert crashed == ["rel"]
    with live.client("analyst") as c:
        r = c.post(f"/v1/sessions/{sid}/close", json={"allow_missing": True},
                   headers={"Idempotency-Key": "rel"})
        assert r.status_code == 200, r.text  # was 409 "session … is already released"
    got = r.json()
    assert got["status"] == "released" and got["release_id"] is not None
    info = S.session_status(live.accountant, sid)
    assert got["release_id"] == info.release_id and got["threshold"] == info.threshold
    with live.client("auditor") as c:
        rel = c.get(f"/v1/releases/{got['release_id']}")
        assert rel.status_code == 200 and rel.json()["diagnostics"]["session_id"] == sid
        entries = c.get("/v1/audit/entries", params={"limit": 1000}).json()
    assert sum(e["kind"] == "release" for e in entries) == 1  # one release, made once
    _verified(live)


def test_an_open_retried_after_a_crash_answers_the_session_it_opened(
        live: Live, crashed: list[str]) -> None:
    """Not shuffled (charged nothing when it opens): the retry opened a second session."""
    body = {"method": "ldp-score", "alpha": 0.1, "epsilon": 2, "rounds": 3, "group_size": 50}
    _post_and_die(live, live.tokens["analyst"], "/v1/datasets/d/sessions", body, "o1")
    assert crashed == ["o1"]
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "o1"})
        # the library's replay: 200 with Idempotent-Replayed (red team 25, service F1: 201)
        assert r.status_code == 200 and r.headers["Idempotent-Replayed"] == "true", r.text
        assert r.json()["id"] == 1 and r.headers["Location"] == "/v1/sessions/1"
        with pytest.raises(Exception, match="unknown session 2"):
            S.session_status(live.accountant, 2)  # no second session
        # another analyst's same header key is her own request
        carol = live.token("analyst", name="carol", datasets=["d"])
    with live.client(token=carol) as c:
        r = c.post("/v1/datasets/d/sessions", json=body, headers={"Idempotency-Key": "o1"})
        assert r.status_code == 201 and r.json()["id"] == 2, r.text
    _verified(live)


def test_a_non_private_calibration_retried_after_a_crash_is_not_calibrated_again(
        live: Live, crashed: list[str]) -> None:
    """r12crash F5 (red team 12): a non-private calibration charges nothing, so no charge
    carried its key and only the service's own record bound it — a server that died between
    the release and that record let the retry calibrate again, a second release. Since
    migration 0010 the library binds the key in the release's transaction (``release_keys``)."""
    body = {"method": "split", "params": {"alpha": 0.1},
            "scores": [i / 100 for i in range(101)]}
    path = "/v1/datasets/d/calibrations"
    _post_and_die(live, live.tokens["analyst"], path, body, "np1")
    assert crashed == ["np1"]
    first = live.accountant.releases("d")
    assert len(first) == 1
    with live.client("analyst") as c:
        r = c.post(path, json=body, headers={"Idempotency-Key": "np1"})
        assert r.status_code in (200, 201), r.text
        assert r.json()["id"] == first[0].id
        again = c.post(path, json=body, headers={"Idempotency-Key": "np1"})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["id"] == first[0].id
    assert [x.id for x in live.accountant.releases("d")] == [first[0].id]
    _verified(live)
