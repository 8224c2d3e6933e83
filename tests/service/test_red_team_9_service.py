"""Red team 9 (the service): races between routes — a check made in one transaction and
the write it allows in another."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.conftest import Live, open_ldp
from tests.service.test_red_team_8_tokens import _count, _refused


def _abandon_after_the_check(lv: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's check of the session's state passes (the session is open), and the
    session is abandoned right after it, before the token's transaction: the interleaving
    of a ``POST /v1/tokens`` and a ``POST /v1/sessions/{id}/close`` racing."""
    from privcal.accountant.sessions.closing import close_session
    from privcal.service import bound_tokens

    check = bound_tokens._check_session_binding

    def check_then_abandon(acct: Any, role: str, session: Any) -> None:
        check(acct, role, session)
        close_session(acct, session, abandon=True)

    monkeypatch.setattr(bound_tokens, "_check_session_binding", check_then_abandon)


def test_a_token_for_a_session_abandoned_after_the_check_is_refused(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a session is abandoned between the token route's check that it is open and
    the token's INSERT (two transactions): 201, a live device token for an abandoned
    session. Now the token's own transaction reads the session (``FOR SHARE`` on
    PostgreSQL) and refuses: 422, no token written, the Idempotency-Key free for a retry;
    the same for the CLI's ``--count`` (many tokens in one transaction)."""
    from privcal.service.bound_tokens import create_bound_device_tokens

    sid = open_ldp(live)
    before = _count(live)
    _abandon_after_the_check(live, monkeypatch)
    with live.client("admin") as c:
        r = c.post("/v1/tokens", json={"role": "device", "session": sid, "subject": "s"},
                   headers={"Idempotency-Key": "race-1"})
        _refused(r, 422, "invalid-input", f"session {sid} is abandoned",
                 "could never report")
    assert _count(live) == before
    monkeypatch.undo()
    other = open_ldp(live)
    _abandon_after_the_check(live, monkeypatch)
    from privcal.errors import InvalidInput

    with pytest.raises(InvalidInput, match=f"session {other} is abandoned"):
        create_bound_device_tokens(live.accountant, other, ["a", "b"], None)
    assert _count(live) == before
    monkeypatch.undo()
    with live.client("admin") as c:  # the key was not spent on the refusal
        third = open_ldp(live)
        r = c.post("/v1/tokens", json={"role": "device", "session": third, "subject": "s"},
                   headers={"Idempotency-Key": "race-1"})
        assert r.status_code == 201, r.text
    assert _count(live) == before + 1


def test_the_library_refuses_a_token_for_a_closed_session(live: Live) -> None:
    """:func:`privcal.storage.tokens.create_token` and the bulk writer check the session in
    their own transaction, whatever their caller checked."""
    from privcal.accountant.sessions.closing import close_session
    from privcal.errors import InvalidInput, NotFound
    from privcal.storage.token_bulk import create_device_tokens
    from privcal.storage.tokens import create_token

    sid = open_ldp(live)
    close_session(live.accountant, sid, abandon=True)
    before = _count(live)
    led = live.accountant.ledger
    with pytest.raises(InvalidInput, match=f"session {sid} is abandoned"):
        create_token(led, "device", session=sid, subject="x")
    with pytest.raises(InvalidInput, match=f"session {sid} is abandoned"):
        create_device_tokens(led, sid, ["x", "y"])
    with pytest.raises(NotFound, match="unknown session 999999"):
        create_token(led, "ingestor", session=999999)
    assert _count(live) == before


def _refingerprint(lv: Live, key: str) -> None:
    """The record of ``key`` as an earlier privcal left it: another fingerprint for the
    same request (0008 keyed the 6a8d801 HMACs again; a calibration's fingerprint gained
    fields since 0003)."""
    from sqlalchemy import update

    from privcal.storage.tokens import IdempotencyRecord

    with lv.accountant.ledger.engine.begin() as conn:
        n = conn.execute(update(IdempotencyRecord).where(IdempotencyRecord.key == key)
                         .values(fingerprint="k:" + "0" * 62)).rowcount
    assert n == 1


def test_a_retry_across_an_upgrade_that_changed_its_fingerprint_learns_it_was_done(
        live: Live) -> None:
    """Attack (review r9b): a calibration and a charge under Idempotency-Keys, the ledger
    upgraded by a privcal whose request fingerprint differs, the same requests retried:
    409 "used for a different request" and nothing else — the client lost its release id
    and receipt, and the answer's advice (a new key) would run and charge them again. Now
    the 409 names the route, the recorded status and id, and carries the recorded answer;
    nothing is charged."""
    import numpy as np

    body = {"method": "split", "params": {"alpha": 0.1},
            "scores": np.linspace(0, 1, 101).tolist()}
    with live.client("analyst") as c:
        rel = c.post("/v1/datasets/d/calibrations", json=body,
                     headers={"Idempotency-Key": "cal"})
        assert rel.status_code == 201, rel.text
        ch = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}},
                    headers={"Idempotency-Key": "chg"})
        assert ch.status_code == 201, ch.text
        _refingerprint(live, "cal")
        _refingerprint(live, "chg")
        spent = live.accountant.budget("d").spent
        r = c.post("/v1/datasets/d/calibrations", json=body,
                   headers={"Idempotency-Key": "cal"})
        detail = _refused(r, 409, "idempotency-key-reused", "different request",
                          "POST /v1/datasets/{name}/calibrations",
                          f"answered 201: release {rel.json()['id']}", "do not resend")
        assert "\n" not in detail
        rec = r.json()["recorded"]
        assert rec["status"] == 201 and rec["response"]["id"] == rel.json()["id"]
        assert rec["response"]["threshold"] == rel.json()["threshold"]
        r = c.post("/v1/datasets/d/charges", json={"cost": {"rho": "0.01"}},
                   headers={"Idempotency-Key": "chg"})
        _refused(r, 409, "idempotency-key-reused",
                 f"answered 201: charge {ch.json()['charge_id']}")
        assert r.json()["recorded"]["response"]["charge_id"] == ch.json()["charge_id"]
    assert live.accountant.budget("d").spent == spent


class _WriteLock:
    """The ledger's write lock held from outside the service (a backup, an admin's shell):
    SQLite ``BEGIN IMMEDIATE``, PostgreSQL the session row ``FOR UPDATE``."""

    def __init__(self, lv: Live, sid: int) -> None:
        self.engine = lv.accountant.ledger.engine
        self.sid = sid

    def __enter__(self) -> _WriteLock:
        from sqlalchemy import text

        self.conn = self.engine.connect()
        if self.engine.dialect.name == "sqlite":
            self.conn.connection.driver_connection.execute("BEGIN IMMEDIATE")
        else:
            self.conn.execute(text("SELECT 1 FROM collection_sessions WHERE id = :s "
                                   "FOR UPDATE"), {"s": self.sid})
        return self

    def __exit__(self, *exc: object) -> None:
        if self.engine.dialect.name == "sqlite":
            self.conn.connection.driver_connection.execute("ROLLBACK")
        else:
            self.conn.rollback()
        self.conn.close()


def test_a_report_whose_wait_ran_out_is_never_stored_after_its_answer(live: Live) -> None:
    """Attack (review r9c): the ledger's write lock held from outside past a report
    request's wait: the request was answered a bare 500 and its report stayed queued —
    stored and its subject charged once the lock went, so a device told "failed" (and
    ``whoami`` saying it had not reported) sent a second randomized answer. Now a report
    the writer had not taken when its wait ran out is answered 503
    ``report-writer-busy`` and dropped — never stored, never charged; the report the
    writer had taken (blocked in its write) is waited for and answered as stored."""
    import threading
    import time

    from privcal.storage.service_reads import stored_reports

    sid = open_ldp(live, group_size=4, rounds=1)
    toks = {s: live.token("device", session=sid, subject=s) for s in ("a", "b")}
    live.app.state.batcher.wait = 0.6
    got: dict[str, Any] = {}

    def put(subject: str) -> None:
        with live.client(token=toks[subject]) as c:
            got[subject] = c.put(f"/v1/sessions/{sid}/reports/{subject}-1",
                                 json={"round": 0, "value": 1})

    with _WriteLock(live, sid):
        first = threading.Thread(target=put, args=("a",))
        first.start()
        time.sleep(0.25)  # the writer has taken a's report and waits for the lock
        put("b")  # queued behind it; its wait runs out
        time.sleep(0.6)  # a's wait has run out too, while its write is blocked
    first.join(timeout=60)
    b = got["b"]
    assert b.status_code == 503, b.text
    assert b.json()["type"] == "urn:privcal:problem:report-writer-busy"
    assert "not stored" in b.json()["detail"] and b.headers.get("retry-after") == "1"
    assert got["a"].status_code == 201, got["a"].text
    time.sleep(0.3)  # the writer's next cycle: b's item, dropped
    led = live.accountant.ledger
    assert set(stored_reports(led, sid, ["a", "b"])) == {"a"}
    assert live.accountant.subject_spend("d", "b") == 0
    assert live.accountant.subject_spend("d", "a") > 0
    with live.client(token=toks["b"]) as c:
        assert c.get("/v1/whoami").json()["reported_rounds"] == []
        again = c.put(f"/v1/sessions/{sid}/reports/b-1", json={"round": 0, "value": 1})
        assert again.status_code == 201, again.text


def test_a_request_running_past_the_reservation_ttl_is_not_run_again(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack (review r9c): a keyed non-private calibration still running when its
    reservation's five minutes (``PENDING_TTL``) are up — a long run, a ledger lock — and
    its retry under the same key took the record over and ran it again: two releases for
    one key and body, both 201. Now a running request's record is touched while it runs
    (:mod:`privcal.service.leases`): its retries are 409 ``idempotency-in-progress`` however
    long it runs, then replay its answer; one release."""
    import threading
    import time
    from datetime import timedelta

    import numpy as np

    import privcal.storage.tokens as tokens
    from privcal.accountant import calibration

    monkeypatch.setattr(tokens, "PENDING_TTL", timedelta(seconds=1.5))
    real = calibration.calibrate
    entered = threading.Event()

    def slow(*a: Any, **kw: Any) -> Any:
        entered.set()
        time.sleep(5.0)  # a run longer than the TTL, and than the retries below
        return real(*a, **kw)

    monkeypatch.setattr(calibration, "calibrate", slow)
    body = {"method": "split", "params": {"alpha": 0.1},
            "scores": np.linspace(0, 1, 101).tolist()}
    got: dict[str, Any] = {}

    def first() -> None:
        with live.client("analyst") as c:
            got["first"] = c.post("/v1/datasets/d/calibrations", json=body,
                                  headers={"Idempotency-Key": "long"})

    t = threading.Thread(target=first)
    t.start()
    # the clock starts when the first request runs (on a loaded machine it may reach the
    # server late); both retries come past the TTL and ≥ 1.5 s before the run ends
    assert entered.wait(timeout=60)
    with live.client("analyst") as c:
        for wait in (2.0, 1.5):  # past the TTL, the first still running
            time.sleep(wait)
            r = c.post("/v1/datasets/d/calibrations", json=body,
                       headers={"Idempotency-Key": "long"})
            _refused(r, 409, "idempotency-in-progress", "still running")
        t.join(timeout=60)
        assert got["first"].status_code == 201, got["first"].text
        again = c.post("/v1/datasets/d/calibrations", json=body,
                       headers={"Idempotency-Key": "long"})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["id"] == got["first"].json()["id"]
    assert [r.id for r in live.accountant.releases("d")] == [got["first"].json()["id"]]


def test_an_agent_message_whose_wait_ran_out_is_never_stored(live: Live) -> None:
    """The same for agent messages (the writer's synchronous path): the message taken into
    a batch blocked by the lock is answered as stored; the one queued behind it, 503 and
    never stored."""
    import threading
    import time

    from tests.service.conftest import open_fed

    sid = open_fed(live, agents=3)
    toks = {a: live.token("agent", session=sid, agent=a) for a in ("a0", "a1")}
    with live.client(token=toks["a0"]) as c:
        grid = c.get(f"/v1/sessions/{sid}").json()["grid"]
    value = grid["lower"] + 10 * grid["step"]
    live.app.state.batcher.wait = 0.6
    got: dict[str, Any] = {}

    def put(agent: str) -> None:
        with live.client(token=toks[agent]) as c:
            got[agent] = c.put(f"/v1/sessions/{sid}/messages", json={"value": value})

    with _WriteLock(live, sid):
        first = threading.Thread(target=put, args=("a0",))
        first.start()
        time.sleep(0.25)
        put("a1")
        time.sleep(0.6)
    first.join(timeout=60)
    assert got["a1"].status_code == 503, got["a1"].text
    assert got["a1"].json()["type"] == "urn:privcal:problem:report-writer-busy"
    assert got["a0"].status_code == 201, got["a0"].text
    time.sleep(0.3)
    from privcal.accountant.sessions import session_status

    assert session_status(live.accountant, sid).received == 1
