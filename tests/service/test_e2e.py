"""End to end over HTTP: an LDP-CP-S session fed by many devices, each with its own token,
reporting concurrently through :class:`privcal.client.Reporter`; retried reports count
once; the release verifies with ``privcal audit verify --expect-head`` on the same ledger.
And 8 analysts racing charges against one budget."""

from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from privcal.cli import main
from privcal.errors import PlanRejected
from tests.service.conftest import Live, open_ldp


def test_ldp_session_many_devices_concurrently(live: Live) -> None:
    from privcal.client import Reporter

    rounds, group = 3, 150
    sid = open_ldp(live, group_size=group, rounds=rounds, epsilon=2.0)
    n_dev = 2 * rounds * group
    toks = [live.token("device", session=sid, subject=f"dev-{i}") for i in range(n_dev)]
    truth = random.Random(7)
    scores = [truth.random() for _ in range(n_dev)]
    shared = httpx.Client(base_url=live.url, timeout=120,
                          limits=httpx.Limits(max_connections=32))
    out: dict[str, Any] = {"accepted": 0, "refused": 0, "dup": 0, "closed": 0}

    def device(i: int) -> str:
        rep = Reporter(live.url, toks[i], client=shared)
        try:
            r = rep.report(scores[i])
        except PlanRejected as exc:
            return "closed" if "not collecting" in str(exc) else "refused"
        assert r["status"] == "accepted"
        if i % 10 == 0:  # a retry of the very same report: answered duplicate
            again = shared.put(f"/v1/sessions/{sid}/reports/{r['report_id']}",
                               json={"round": r["round"], "value": r["value"]},
                               headers={"Authorization": f"Bearer {toks[i]}"})
            assert again.status_code == 200 and again.json()["status"] == "duplicate"
            return "dup"
        return "accepted"

    with ThreadPoolExecutor(max_workers=24) as pool:
        for res in pool.map(device, range(n_dev)):
            out[res] += 1
    shared.close()
    from privcal.accountant.sessions import session_status

    st = session_status(live.accountant, sid)
    assert st.status == "released" and st.total_reports == rounds * group
    assert out["accepted"] + out["dup"] == rounds * group  # every retry counted once
    assert out["refused"] + out["closed"] == n_dev - rounds * group
    summary = live.accountant.subject_summary("d")
    assert summary.subjects == rounds * group and summary.max == 2  # ε charged once each
    with live.client("auditor") as c:
        head = c.get("/v1/audit/head").json()["head"]
        rel = c.get(f"/v1/releases/{st.release_id}").json()
    assert rel["method"] == "ldp-score" and rel["shape"]["n"] == rounds * group
    r = CliRunner().invoke(main, ["--db-url", live.ledger_url, "audit", "verify",
                                  "--expect-head", head])
    assert r.exit_code == 0, r.output


def test_eight_analysts_race_one_budget(live: Live) -> None:
    analysts = [live.token("analyst", datasets=["d"], name=f"a{i}") for i in range(8)]
    cost = "0.15"  # cap ρ = 1: exactly ⌊1/0.15⌋ = 6 fit

    def charge(j: int) -> int:
        with httpx.Client(base_url=live.url, timeout=120, headers={
                "Authorization": f"Bearer {analysts[j % 8]}"}) as c:
            r = c.post("/v1/datasets/d/charges", json={"cost": {"rho": cost}},
                       headers={"Idempotency-Key": uuid.uuid4().hex})
            if r.status_code == 409:
                assert r.json()["type"] == "urn:privcal:problem:budget-refused"
            return r.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(charge, range(32)))
    assert codes.count(201) == 6 and codes.count(409) == 26, codes
    b = live.accountant.budget("d")
    assert str(b.spent["rho"]) == "0.9" and b.charges == 6
    with live.client("auditor") as c:
        v = c.post("/v1/audit/verify", json={"expect_head": c.get("/v1/audit/head").json()[
            "head"]}).json()
    assert v["ok"] is True and v["report"]["charges"] == 6


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_agent_client_sends_its_message(live: Live) -> None:
    import numpy as np

    from privcal.client import Agent
    from tests.service.conftest import open_fed

    fid = open_fed(live, agents=2)
    rng = np.random.default_rng(3)
    for a in ("h1", "h2"):
        with Agent(live.url, live.token("agent", session=fid, agent=a)) as ag:
            res = ag.send(rng.random(200))
            assert res["status"] == "accepted"
    with live.client("auditor") as c:
        assert c.get(f"/v1/sessions/{fid}").json()["status"] == "released"
