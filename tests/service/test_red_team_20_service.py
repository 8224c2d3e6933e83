"""Red team 20, service F1: a score option JSON cannot hold exactly (a whole number past
2**53 − 1) was a 500 on session open and on calibrate — the release or the request digest
failed to be written — and, through the Python API, a P-COQS run was charged first. Now a
422 naming the option, and nothing is charged or written."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

BIG = 10**40


def _written(lv: Live) -> tuple[int, int, int]:
    b = lv.accountant.budget("d")
    return b.charges, b.releases, lv.accountant.verify().entries


@pytest.mark.parametrize("options", [{"lam": BIG}, {"lam": 2**60}, {"k_reg": 2**53}])
def test_a_score_option_json_cannot_hold_is_a_422_that_writes_nothing(
        live: Live, options: dict[str, int]) -> None:
    before = _written(live)
    probs = [[0.5, 0.5]] * 50
    with live.client("analyst") as c:
        for method, params in (("pcoqs", {"alpha": 0.1, "rho": 0.1}), ("split", {"alpha": 0.1})):
            r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": method},
                       json={"method": method, "params": params, "probs": probs,
                             "labels": [0, 1] * 25, "score": "raps", "score_options": options})
            assert r.status_code == 422, r.text
            assert "2**53 − 1" in r.json()["detail"]
        r = c.post("/v1/datasets/d/sessions", headers={"Idempotency-Key": "s"}, json={
            "method": "ldp-score", "alpha": 0.1, "epsilon": 2, "rounds": 3, "group_size": 50,
            "score": "raps", "score_options": options})
        assert r.status_code == 422, r.text
        assert "2**53 − 1" in r.json()["detail"]
        assert c.get("/v1/datasets/d").status_code == 200  # the connection still serves
    assert _written(live) == before


def test_a_label_mondrian_dry_run_reads_the_class_names_as_the_run_does(live: Live) -> None:
    """Red team 20, coverage F3: an upload whose header names the classes, with name
    labels, and label groups — ``?dry_run=true`` said 422 "labels must be numeric" where the
    run answered 201. Now the dry run prices what the run then charges."""
    import io
    import json
    import uuid

    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    g = np.random.default_rng(0)
    p = g.dirichlet(np.ones(3), size=3000)
    y = np.array([g.choice(3, p=q) for q in p])
    names = ["cat", "dog", "emu"]
    buf = io.BytesIO()
    pcsv.write_csv(pa.table({**{nm: p[:, j] for j, nm in enumerate(names)},
                             "label": np.array(names)[y]}), buf)
    req = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.5}, "score": "lac",
           "label_column": "label", "mondrian": "label", "public_groups": True}
    got = {}
    with live.client("analyst") as c:
        for dry in (True, False):
            r = c.post("/v1/datasets/d/calibrations" + ("?dry_run=true" if dry else ""),
                       data={"request": json.dumps(req)},
                       files={"probs": ("calib.csv", buf.getvalue())},
                       headers={"Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == (200 if dry else 201), r.text
            got[dry] = r.json()
    assert got[True]["guarantee"] == got[False]["coverage"]["statement"]
    assert got[True]["cost"] == got[False]["privacy"]["cost"]


@pytest.mark.parametrize("sql", ["update datasets set cap_rho='sNaN' where name='other'",
                                 "update audit_head set seq='x'"])
def test_verify_answers_ok_false_for_a_value_of_the_wrong_form(live: Live, sql: str) -> None:
    """Red team 20, service F2: ``POST /v1/audit/verify`` was a 500 internal error on a
    ledger whose rows an operator edited into values of the wrong form; it now answers
    ``ok: false`` naming what failed, as for any other edit."""
    import sqlite3

    path = live.ledger_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    with live.client("auditor") as c:
        r = c.post("/v1/audit/verify", json={})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is False and "cannot read" in r.json()["error"]


@pytest.mark.parametrize(("sql", "said"), [
    (["update alembic_version set version_num = '0005'"], "the ledger is at revision 0005"),
    (["update alembic_version set version_num = '9999'"], "the ledger is at schema revision"),
    (["drop table alembic_version"], "no privcal schema revision"),
    (["drop table alembic_version", "create table payroll (salary int)"],
     "no privcal schema revision"),
])
def test_readyz_names_no_ledger_file_when_the_schema_is_not_this_privcals(
        live: Live, sql: list[str], said: str) -> None:
    """Red team 20, service F4 (and its review): the unauthenticated ``/readyz`` answered a
    stale, unknown or missing schema with the ledger's URL and file (and the database's
    table names) in its 503; it now says what to do without them (the log has them)."""
    import sqlite3

    import httpx

    path = live.ledger_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        for statement in sql:
            conn.execute(statement)
    r = httpx.get(live.url + "/readyz", timeout=60)
    assert r.status_code == 503, r.text
    detail = r.json()["detail"]
    assert "sqlite" not in r.text.lower() and path not in r.text and "payroll" not in r.text
    assert said in detail, detail


def test_the_services_key_space_is_the_services_own(live: Live) -> None:
    """Red team 20, service F3's review: a writer of the same ledger through the library or
    the CLI gave the key the service derives for an analyst (``http:<token id>:<hash>``, the
    token id public in the audit log) and the analyst's name as requester; the analyst's
    first request under that key was answered with that charge, nothing charged for it.
    Keys beginning ``http:`` are now the service's alone."""
    import hashlib

    from click.testing import CliRunner

    from privcal.cli import main
    from privcal.costs import ZCDP
    from privcal.errors import InvalidInput

    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", headers={"Idempotency-Key": "warm"},
                   json={"cost": {"rho": "0.001"}, "purpose": "warm"})
        assert r.status_code == 201, r.text
        requester = r.json()["requester"]
    tid = live.tokens["analyst"].split("_")[1]
    forged = f"http:{tid}:" + hashlib.sha256(b"pre-1").hexdigest()[:32]
    with pytest.raises(InvalidInput, match="reserved for the keys privcal's HTTP service"):
        live.accountant.charge("d", ZCDP(rho="0.001"), purpose="count", requester=requester,
                               idempotency_key=forged)
    res = CliRunner().invoke(main, ["--db-url", live.ledger_url, "charge", "--dataset", "d",
                                    "--rho", "0.001", "--purpose", "count", "--requester",
                                    requester, "--idempotency-key", forged])
    assert res.exit_code != 0 and "reserved for the keys privcal's HTTP service" in res.output
    before = live.accountant.budget("d").charges
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/charges", headers={"Idempotency-Key": "pre-1"},
                   json={"cost": {"rho": "0.001"}, "purpose": "count"})
        assert r.status_code == 201 and not r.json()["replayed"], r.text
        again = c.post("/v1/datasets/d/charges", headers={"Idempotency-Key": "pre-1"},
                       json={"cost": {"rho": "0.001"}, "purpose": "count"})
        assert again.status_code == 200 and again.json()["charge_id"] == r.json()["charge_id"]
    assert live.accountant.budget("d").charges == before + 1


def test_a_device_or_agent_refuses_a_seeded_generator_before_sending(live: Live) -> None:
    """The review of red team 20: ``Agent.send(rng=random.Random(seed))`` — two agents with
    the same scores sent the same message, recorded as ε-DP. What leaves the device takes
    the OS CSPRNG or a SystemRandom; nothing is sent with a seeded one."""
    import random
    import secrets

    import numpy as np

    from privcal.client import Agent, Reporter
    from privcal.errors import InvalidInput
    from tests.service.conftest import open_fed, open_ldp

    sid = open_ldp(live, group_size=50, rounds=2, epsilon=0.5)
    tok = live.token("device", session=sid, subject="alice")
    with pytest.raises(InvalidInput, match="what this device sends needs noise no one can"):
        Reporter(live.url, tok).report(0.3, rng=random.Random(1))
    fid = open_fed(live, agents=3)
    atok = live.token("agent", session=fid, agent="h1")
    scores = np.random.default_rng(0).random(200)
    with pytest.raises(InvalidInput, match="what this device sends needs noise no one can"):
        Agent(live.url, atok).send(scores, rng=random.Random(1))
    with live.client(token=tok) as c:
        assert c.get("/v1/whoami").json()["reported_rounds"] == []  # nothing was sent
    assert Reporter(live.url, tok).report(0.3, rng=secrets.SystemRandom())["status"] \
        == "accepted"
    assert Agent(live.url, atok).send(scores)["status"] == "accepted"
