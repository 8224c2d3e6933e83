"""``POST /v1/sessions/{sid}/close`` with agents missing: by default each missing agent's
message counts as +∞ under the published plan (tests/test_sessions_missing.py), ``"missing":
"replan"`` asks for the replan; a bad ``missing`` is a one-line 422 that changes nothing."""

from __future__ import annotations

from tests.service.conftest import Live, answer_fed, ledger_snapshot, open_fed, open_ldp

P = "urn:privcal:problem:"


def test_close_counts_the_missing_agents_as_infinity(live: Live) -> None:
    sid = open_fed(live, agents=3)
    answer_fed(live, sid)  # 2 of 3
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for bad, says in (({"missing": "replan"}, "missing goes with allow_missing"),
                          ({"allow_missing": True, "missing": "zero"}, "infinite")):
            r = c.post(f"/v1/sessions/{sid}/close", json=bad,
                       headers={"Idempotency-Key": "bad"})
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["type"] == P + "invalid-input" and "\n" not in body["detail"]
            assert "Value error" not in body["detail"], body["detail"]
            assert says in body["detail"], body["detail"]
        assert ledger_snapshot(live) == before  # nothing written, the key not kept
        r = c.post(f"/v1/sessions/{sid}/close", json={"allow_missing": True},
                   headers={"Idempotency-Key": "c1"})
        assert r.status_code == 200, r.text
        rid = r.json()["release_id"]
        again = c.post(f"/v1/sessions/{sid}/close", json={"allow_missing": True},
                       headers={"Idempotency-Key": "c1"})
        assert again.status_code == 200 and again.json()["release_id"] == rid
        other = c.post(f"/v1/sessions/{sid}/close",
                       json={"allow_missing": True, "missing": "replan"},
                       headers={"Idempotency-Key": "c1"})
        assert other.status_code == 409, other.text  # the key was used for another request
    with live.client("auditor") as c:
        rel = c.get(f"/v1/releases/{rid}").json()
        assert rel["params"]["agents_planned"] == 3
        assert rel["diagnostics"]["missing"] == {"m_planned": 3, "m_answered": 2,
                                                 "counted_as": "+inf"}
        assert "2 of the 3 planned agents answered" in rel["coverage"]["statement"]
        r = c.post("/v1/audit/verify", json={})
        assert r.status_code == 200 and r.json()["ok"] is True, r.text


def test_close_can_still_replan(live: Live) -> None:
    sid = open_fed(live, agents=3)
    answer_fed(live, sid)
    with live.client("analyst") as c:
        r = c.post(f"/v1/sessions/{sid}/close",
                   json={"allow_missing": True, "missing": "replan"},
                   headers={"Idempotency-Key": "c2"})
        assert r.status_code == 200, r.text
        rid = r.json()["release_id"]
    with live.client("auditor") as c:
        rel = c.get(f"/v1/releases/{rid}").json()
    assert rel["diagnostics"]["replanned"] == {"m_planned": 3, "m_answered": 2}
    assert "not chosen by their data" in rel["coverage"]["statement"]


def test_a_calibration_cannot_plan_for_more_agents_than_a_request_may(live: Live) -> None:
    """The service's planning limit counted agents from the agent ids only: one agent with
    ``agents_planned`` = 10 000 planned for seconds to minutes (red team 15)."""
    before = ledger_snapshot(live)
    with live.client("analyst") as c:
        for method, extra, limit in (("fedcp-qq", {}, 1000), ("fedcp2-qq", {"epsilon": 1}, 50)):
            # the library reads the count laxly: 10000.0 and "10000" are 10 000 agents too
            for i, planned in enumerate((10_000, 10_000.0, "10000")):
                r = c.post("/v1/datasets/d/calibrations", json={
                    "method": method, "params": {"alpha": 0.1, "agents_planned": planned,
                                                 **extra},
                    "scores": [i / 20 for i in range(20)], "agents": ["a"] * 20},
                    headers={"Idempotency-Key": f"big-{method}-{i}"})
                assert r.status_code == 422, r.text
                assert f"for at most {limit} agents, got 10000" in r.json()["detail"]
    assert ledger_snapshot(live) == before


def test_a_device_report_for_no_round_of_the_session_is_a_malformed_round(live: Live) -> None:
    """A batch said "malformed round" for a round the session does not have, the device
    route still "round not open" (red team 15)."""
    sid = open_ldp(live, group_size=2, rounds=2)
    dev = live.token("device", session=sid, subject="s-1")
    with live.client(token=dev) as c:
        for rnd, reason in ((2, "malformed round"), (10**6, "malformed round"),
                            (1, "round not open")):
            r = c.put(f"/v1/sessions/{sid}/reports/r{rnd}", json={"round": rnd, "value": 1})
            assert r.status_code == 409 and r.json()["reason"] == reason, (rnd, r.text)
        assert c.put(f"/v1/sessions/{sid}/reports/ok", json={"round": 0, "value": 1}
                     ).status_code == 201
