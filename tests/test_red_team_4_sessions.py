"""Red team, session 11: collection sessions. Each test is an attack that used to succeed; it
passes when the attack fails (refused with a one-line error and nothing written, or stored
so that it reveals nothing).

- an LDP-CP-S (``ldp-score``) batch without rounds was counted toward whatever round was open
  when it was written: 800 reports all answering q0 = 0.5, forwarded in two batches of 400,
  had the second counted as answers to round 1's query q1 = 0.25, and the session released
  0.25 recording coverage ≥ 0.8 where the true coverage was 0 — through the library API, the
  ingestor route and ``privcal session submit`` alike;
- the ingestor route stored, as its idempotency fingerprint, an unkeyed SHA-256 of the batch
  body (raw subject ids and their reports): whoever read the table could test "subject X
  reported v" by hashing guesses, which the keyed pseudonyms exist to prevent.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.cli import main
from privcal.errors import InvalidInput

P = "urn:privcal:problem:"
TABLES = ("charges", "subject_spend", "session_reports", "session_batches",
          "idempotency_records", "audit_log")


def _written(acct: Any) -> tuple[Any, ...]:
    """Everything a refused batch must leave as it was: row counts, spends, session states."""
    with acct.ledger.engine.connect() as conn:
        counts = tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())  # type: ignore[arg-type]
                       for t in TABLES)
        spends = tuple(conn.execute(text(
            "SELECT subject, spent_units FROM subject_spend ORDER BY subject")).all())
        states = tuple(conn.execute(text(
            "SELECT id, status, state FROM collection_sessions ORDER BY id")).all())
    return counts, spends, tuple((i, st, repr(s)) for i, st, s in states)


# ---------------------------------------------------------------- ldp-score batches need rounds
def test_ldp_score_batch_without_rounds_is_refused_and_writes_nothing(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=10)
    info = S.open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=2,
                          group_size=4)
    # a shuffler collected 8 reports answering round 0's query; the first 4 fill round 0
    r = S.submit_reports(acct, info.id, [f"u{i}" for i in range(4)], [1] * 4, [0] * 4)
    assert r.accepted == 4 and r.advanced and r.session.round == 1
    before = _written(acct)
    late = [f"u{i}" for i in range(4, 8)]
    for key in (None, "late"):  # the late 4, without rounds: not taken for answers to q1
        with pytest.raises(InvalidInput, match=r"ldp-score.*round") as exc:
            S.submit_reports(acct, info.id, late, [1] * 4, idempotency_key=key)
        assert "\n" not in str(exc.value)
        assert _written(acct) == before  # no charge, no report, no spend, no batch
        assert acct.subject_spend("d", "u4") == 0
    # with their round stated they are what they are: answers to a closed round
    r = S.submit_reports(acct, info.id, late, [1] * 4, [0] * 4, idempotency_key="late")
    assert r.accepted == 0 and r.reasons == {"closed round": 4}
    assert _written(acct) == before
    # reports answering round 1's query are counted for round 1
    r = S.submit_reports(acct, info.id, late, [1] * 4, [1] * 4, idempotency_key="late")
    assert r.accepted == 4 and r.session.status == "released"
    # a federated session has one round: its batches need none
    fed = S.open_session(acct, "fedcp2-qq", dataset="d", alpha=0.1, agents=5, local_n=200,
                         epsilon=10)
    r = S.submit_reports(acct, fed.id, ["a"], [fed.plan["smax"]])  # type: ignore[index]
    assert r.accepted == 1
    acct.verify()


# ---------------------------------------------------------------- the ingestor route
@pytest.fixture
def live(ledger_url: str) -> Iterator[Any]:
    from tests.service.conftest import serve

    with serve(ledger_url) as lv:
        yield lv


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == P + slug and body["status"] == status
    return body


def test_ingestor_batch_without_rounds_on_ldp_score_is_422_and_writes_nothing(live: Any
                                                                              ) -> None:
    from tests.service.conftest import open_fed, open_ldp

    sid = open_ldp(live, group_size=4, rounds=2)
    with live.client(token=live.token("ingestor", session=sid)) as c:
        q0 = c.get(f"/v1/sessions/{sid}").json()["query"]
        rows = [{"subject": f"u{i}", "value": 1, "round": 0} for i in range(4)]
        r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows},
                   headers={"Idempotency-Key": "b1"})
        assert r.status_code == 200 and r.json()["advanced"], r.text
        assert c.get(f"/v1/sessions/{sid}").json()["query"] != q0
        before = _written(live.accountant)
        # the reviewer's body: subject + value only, forwarded after round 0 filled
        late = [{"subject": f"u{i}", "value": 1} for i in range(4, 8)]
        body = _problem(c.post(f"/v1/sessions/{sid}/batches", json={"reports": late},
                               headers={"Idempotency-Key": "b2"}), 422, "invalid-input")
        assert "round" in body["detail"] and "\n" not in body["detail"]
        assert "u4" not in body["detail"]  # never a subject id
        assert _written(live.accountant) == before
        # the key was not used up: the same key with the rows' rounds is a new request
        r = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b2"},
                   json={"reports": [{**x, "round": 1} for x in late]})
        assert r.status_code == 200 and r.json()["accepted"] == 4, r.text
        assert r.json()["session"]["status"] == "released"
    fid = open_fed(live, agents=3)
    with live.client(token=live.token("ingestor", session=fid)) as c:
        r = c.post(f"/v1/sessions/{fid}/batches", headers={"Idempotency-Key": "f1"},
                   json={"reports": [{"subject": "h1", "value": 1.0}]})  # the grid's top
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    live.accountant.verify()


# ---------------------------------------------------------------- the CLI
def test_cli_ldp_score_batch_needs_a_round_column(ledger: Any, tmp_path: Path) -> None:
    url = ledger.engine.url.render_as_string(hide_password=False)
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=1, subject_epsilon=2)
    res = CliRunner().invoke(main, ["--db-url", url, "session", "open", "ldp-score",
                                    "--dataset", "d", "--alpha", "0.1", "--epsilon", "1",
                                    "--rounds", "2", "--group-size", "5", "--json"])
    assert res.exit_code == 0, res.output
    sid = str(json.loads(res.stdout)["id"])
    path = tmp_path / "round0.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([["subject", "bit"], ["a", 1], ["b", 0]])
    before = _written(acct)
    res = CliRunner().invoke(main, ["--db-url", url, "session", "submit", sid,
                                    "--reports", str(path)])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "'round' column" in res.output
    assert _written(acct) == before
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([["subject", "bit", "round"], ["a", 1, 0], ["b", 0, 0]])
    res = CliRunner().invoke(main, ["--db-url", url, "session", "submit", sid,
                                    "--reports", str(path), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["accepted"] == 2, res.output


# ---------------------------------------------------------------- the batch fingerprint
def test_batch_idempotency_fingerprint_cannot_be_tested_against_guesses(live: Any) -> None:
    from privcal.service.common import doc
    from tests.service.conftest import open_ldp

    sid = open_ldp(live, group_size=3, rounds=2)
    rows = [{"subject": "patient-0042", "value": 1, "round": 0}]
    with live.client(token=live.token("ingestor", session=sid)) as c:
        r = c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows},
                   headers={"Idempotency-Key": "k1"})
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        # idempotency as before: the same body replays, another body is 409
        again = c.post(f"/v1/sessions/{sid}/batches", json={"reports": rows},
                       headers={"Idempotency-Key": "k1"})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == {**r.json(), "replayed": True}  # the body says so too
        other = [{**rows[0], "value": 0}]
        _problem(c.post(f"/v1/sessions/{sid}/batches", json={"reports": other},
                        headers={"Idempotency-Key": "k1"}), 409, "idempotency-key-reused")
    with live.accountant.ledger.engine.connect() as conn:
        fp = conn.execute(text("SELECT fingerprint FROM idempotency_records "
                               "WHERE key = 'k1'")).scalar_one()
    assert len(fp) == 64
    # a dictionary attack on the stored row (the guesses include the truth, in every
    # encoding the route could have hashed) finds nothing without the ledger's secret
    hits = []
    for i in range(100):
        for v in (0, 1, 0.0, 1.0):
            for rnd in (None, 0):
                body = {"reports": [{"subject": f"patient-{i:04d}", "value": v, "round": rnd}]}
                h = hashlib.sha256(json.dumps(doc(body), sort_keys=True).encode()).hexdigest()
                if h == fp:
                    hits.append((i, v))
    assert hits == []
