"""Red team 16, F9, over HTTP: ``POST /v1/datasets/{name}/sessions`` takes the score the
agents compute (``score``, ``score_options``); an agent reads it with the session's public
state, and the release records it (``GET /v1/releases/{id}``). A bad score is a one-line
422 and opens nothing."""

from __future__ import annotations

from privcal.calibrators.prediction_sets import release_score
from tests.service.conftest import Live, answer_fed, ledger_snapshot

OPEN = {"method": "fedcp2-qq", "alpha": 0.2, "epsilon": 2.0, "agents": 3, "local_n": 200,
        "bins": 20, "upper": 1.0}


def test_the_open_route_records_the_score_agents_read(live: Live) -> None:
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/sessions", json={**OPEN, "score": "raps",
                                                    "score_options": {"lam": 0.0}})
        assert r.status_code == 201, r.text
    raps = {"name": "raps", "options": {"randomized": True, "lam": 0.0, "k_reg": 5}}
    sid = r.json()["id"]
    assert r.json()["score"] == raps
    # an agent's view: the public fields only, whose params name the score it must compute
    with live.client(token=live.token("agent", session=sid, agent="a0")) as c:
        for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}?x=1"):  # lean read, route
            st = c.get(path).json()
            assert st["params"]["score"] == raps, st
    from privcal.client import Agent

    with Agent(live.url, live.token("agent", session=sid, agent="a1")) as agent:
        assert agent.score() == raps
    answer_fed(live, sid, ("a0", "a1", "a2"))
    with live.client("analyst") as c:
        info = c.get(f"/v1/sessions/{sid}").json()
        assert info["status"] == "released", info
        rel = c.get(f"/v1/releases/{info['release_id']}").json()
    assert rel["diagnostics"]["score"] == raps and "score" not in rel["params"]
    assert release_score(rel["diagnostics"]["score"]) == ("raps", raps["options"])
    with live.client("auditor") as c:
        r = c.post("/v1/audit/verify", json={})
        assert r.status_code == 200 and r.json()["ok"] is True, r.text


def test_a_bad_score_at_open_is_a_one_line_422(live: Live) -> None:
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for extra, words in (({"score": "nope"}, "unknown score 'nope'"),
                             ({"score": "aps", "score_options": {"lam": 1}}, "lam"),
                             ({"score_options": {"randomized": False}}, "need the score")):
            r = c.post("/v1/datasets/d/sessions", json={**OPEN, **extra})
            assert r.status_code == 422, r.text
            assert words in r.json()["detail"] and "\n" not in r.json()["detail"], r.text
    assert ledger_snapshot(live) == before
