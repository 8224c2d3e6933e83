"""A device's report or an agent's message waiting in the report writer whose token is
revoked is refused 401, never stored or charged — also when the revocation commits after
the writer's token read and before its write transaction takes the session's lock (red team
21, flows M2: on PostgreSQL the write waited for the dataset row, locked by a concurrent
charge, while ``DELETE /v1/tokens/{id}`` answered 200; then the report was answered 201,
stored 1.3 s after ``revoked_at``, and its subject charged).

The tokens are checked again inside the write transaction, after its session lock, and a
revocation locks the token's session row first (storage/token_checks.tokens_not_in_force).
The tests put the revocation exactly in that gap: through the writer's own pre-check (both
backends), and, on PostgreSQL, by holding the dataset row from another connection until the
writer is seen waiting for it — no timing margin, no monkeypatching."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from privcal.storage.tokens import list_tokens, revoke_token
from tests.service.conftest import Live, open_fed, open_ldp


def _victim(lv: Live, who: str) -> tuple[int, str, str, str, dict[str, Any]]:
    """A session, a token of ``who`` (device or agent) named victim, its id, and the PUT
    (path, body) of its report."""
    if who == "device":
        sid = open_ldp(lv, group_size=3, rounds=2, epsilon=4.0)
        tok = lv.token("device", session=sid, subject="victim")
        path, body = f"/v1/sessions/{sid}/reports/r1", {"round": 0, "value": 1}
    else:
        sid = open_fed(lv, agents=3)
        tok = lv.token("agent", session=sid, agent="victim")
        with lv.client(token=tok) as c:
            g = c.get(f"/v1/sessions/{sid}").json()["grid"]
        path, body = f"/v1/sessions/{sid}/messages", {"value": g["lower"] + 3 * g["step"]}
    tid = next(t.id for t in list_tokens(lv.accountant.ledger)
               if "victim" in (t.subject, t.agent))
    return sid, tok, tid, path, body


def _nothing_stored(lv: Live, sid: int, who: str) -> None:
    with lv.client("auditor") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["received"] == 0
    if who == "device":  # an agent's charge is the session's ε, counted with its message
        assert lv.accountant.subject_spend("d", "victim") == 0


@contextmanager
def _held(live: Live, lock_sql: str) -> Iterator[Callable[[], bool]]:
    """A transaction of another connection holding ``lock_sql``'s row lock, committed at the
    end of the block (rolled back on an error); yields whether someone waits for it
    (``pg_blocking_pids``)."""
    engine = live.accountant.ledger.engine
    holder = engine.connect()
    try:
        tx = holder.begin()
        holder.exec_driver_sql(lock_sql)
        hpid = int(holder.exec_driver_sql("SELECT pg_backend_pid()").scalar())

        def blocked() -> bool:
            with engine.connect() as c:
                return bool(c.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity "
                    f"WHERE {hpid} = ANY(pg_blocking_pids(pid))").scalar())

        yield blocked
        tx.commit()
    finally:
        holder.close()


def _wait_for(cond: Callable[[], bool], what: str, limit: float = 30.0) -> None:
    """Poll ``cond`` (an event the server reports, not a guess of how long it takes)."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"never saw: {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("who", ["device", "agent"])
def test_a_revocation_after_the_writers_token_read_is_honoured(
        live: Live, who: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The revocation commits right after the writer's pre-write token read (its last
    chance before this fix), before its write transaction: 401, nothing stored, nothing
    charged. Both backends; the writer's own read is the clock."""
    import privcal.service.batcher as batcher_mod

    sid, tok, tid, path, body = _victim(live, who)
    read = batcher_mod.check_tokens
    revoked: list[Any] = []

    def read_then_revoke(ledger: Any, items: list[Any]) -> list[Any]:
        out = read(ledger, items)
        if not revoked:  # the admin's DELETE lands now, in the gap
            revoked.append(revoke_token(ledger, tid))
        return out

    monkeypatch.setattr(batcher_mod, "check_tokens", read_then_revoke)
    with live.client(token=tok) as c:
        r = c.put(path, json=body)
    assert revoked and revoked[0].revoked_at is not None
    assert r.status_code == 401, (r.status_code, r.text)
    _nothing_stored(live, sid, who)
    monkeypatch.undo()
    # the same path still takes a token in force
    other = (live.token("device", session=sid, subject="other") if who == "device"
             else live.token("agent", session=sid, agent="other"))
    with live.client(token=other) as c:
        assert c.put(path.replace("r1", "r2"), json=body).status_code == 201


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("who", ["device", "agent"])
def test_a_report_waiting_for_the_dataset_lock_is_refused_once_revoked(
        live: Live, who: str) -> None:
    """The finding's scenario, without a timing margin: another transaction holds dataset
    d's row (as any concurrent charge of d does); the report's write is seen waiting for it;
    the revocation answers 200 meanwhile (it does not wait for the dataset); then the
    lock is released and the report is refused 401, nothing stored, nothing charged."""
    sid, tok, tid, path, body = _victim(live, who)
    out: dict[str, Any] = {}

    def put() -> None:
        with live.client(token=tok) as c:
            out["r"] = c.put(path, json=body)

    p = threading.Thread(target=put)
    with _held(live, "SELECT id FROM datasets WHERE name = 'd' FOR UPDATE") as blocked:
        p.start()
        _wait_for(blocked, "the report's write waiting for the dataset lock")
        with live.client("admin") as c:
            assert c.delete(f"/v1/tokens/{tid}").status_code == 200  # revoked, answered
        assert "r" not in out  # the report is still waiting
    p.join(timeout=60)
    assert out["r"].status_code == 401, (out["r"].status_code, out["r"].text)
    _nothing_stored(live, sid, who)


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_a_revocation_waits_for_a_batch_holding_its_session(live: Live) -> None:
    """The other order: while a batch of the session holds the session's row, revoking a
    token of that session waits for it (so a report that batch stores was stored before the
    revocation answered, never after)."""
    sid, _, tid, _, _ = _victim(live, "device")
    done: dict[str, Any] = {}

    def revoke() -> None:
        with live.client("admin") as c:
            done["r"] = c.delete(f"/v1/tokens/{tid}")

    t = threading.Thread(target=revoke)
    with _held(live, f"SELECT id FROM collection_sessions WHERE id = {int(sid)} "
                     "FOR UPDATE") as blocked:
        t.start()
        _wait_for(blocked, "the revocation waiting for the session's lock")
        assert "r" not in done
    t.join(timeout=60)
    assert done["r"].status_code == 200


def test_submit_reports_checks_its_tokens_in_the_write_transaction(accountant: Any) -> None:
    """The library's side: ``submit_reports(tokens=…)`` writes nothing and names the tokens
    not in force for the batch's session — revoked, expired, bound to another session,
    unknown — and writes the batch when all are (both backends)."""
    from datetime import timedelta

    import privcal.accountant.sessions as S
    from privcal.accountant.sessions.records import TokensNotInForce
    from privcal.storage.tokens import create_token

    accountant.create_dataset("d", epsilon=1, subject_epsilon=4)
    one = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=1.5,
                         rounds=2, group_size=3).id
    two = S.open_session(accountant, "ldp-score", dataset="d", alpha=0.1, epsilon=1.5,
                         rounds=2, group_size=3).id
    led = accountant.ledger

    def device(subject: str, session: int = one, **kw: Any) -> str:
        return create_token(led, "device", session=session, subject=subject, **kw).id

    ok, gone, other = device("a"), device("b"), device("c", session=two)
    old = device("e", expires_in=timedelta(seconds=1))
    later = device("f", expires_in=timedelta(hours=1))  # in force: compared as times
    revoke_token(led, gone)
    time.sleep(1.1)  # ``old`` has expired
    head = led.head()
    for bad in (gone, other, old, "0123456789abcdef"):
        with pytest.raises(TokensNotInForce) as err:
            S.submit_reports(accountant, one, ["a", "x"], [1, 0], [0, 0], tokens=[ok, bad])
        assert err.value.tokens == {bad}
        assert led.head() == head  # nothing written, nothing charged
    assert accountant.subject_spend("d", "a") == 0
    res = S.submit_reports(accountant, one, ["a", "f"], [1, 0], [0, 0], tokens=[ok, later])
    assert res.accepted == 2 and accountant.subject_spend("d", "a") > 0


def test_a_batch_with_one_revoked_token_writes_the_others(live: Live) -> None:
    """A write window holding a report whose token was revoked after the writer's read and
    a report whose token is in force: the first is answered 401 and not stored, the second
    is written (the batch again without it)."""
    from concurrent.futures import Future

    from privcal.service.batcher import _Item
    from privcal.service.problems import ProblemError

    sid, _, tid, _, _ = _victim(live, "device")
    live.token("device", session=sid, subject="other")
    oid = next(t.id for t in list_tokens(live.accountant.ledger) if t.subject == "other")
    items = [_Item(sid, "victim", 0, 1, recheck=tid, future=Future()),
             _Item(sid, "other", 0, 1, recheck=oid, future=Future())]
    revoke_token(live.accountant.ledger, tid)  # after the read that set their subjects
    live.app.state.batcher._write(sid, items)
    assert isinstance(items[0].error, ProblemError) and items[0].error.status == 401
    assert items[1].outcome is not None and items[1].outcome.status == "accepted"
    assert live.accountant.subject_spend("d", "victim") == 0
    assert live.accountant.subject_spend("d", "other") > 0
    with live.client("auditor") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["received"] == 1


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgresql"], indirect=True)
def test_an_ingestors_batch_waiting_for_the_dataset_lock_is_refused_once_revoked(
        live: Live) -> None:
    """The review of red team 21 (R1): the fix covered device reports and agent messages;
    an ingestor's batch authenticated before its write waited for dataset d's lock, its
    token was revoked (200) meanwhile, and the batch was then stored and its subjects
    charged. Its token is re-checked in the write too: 401, nothing stored or charged."""
    sid = open_ldp(live, group_size=3, rounds=2, epsilon=4.0)
    tok = live.token("ingestor", session=sid, name="victim-ingestor")
    tid = next(t.id for t in list_tokens(live.accountant.ledger) if t.name == "victim-ingestor")
    out: dict[str, Any] = {}

    def post() -> None:
        with live.client(token=tok) as c:
            out["r"] = c.post(f"/v1/sessions/{sid}/batches", json={"reports": [
                {"subject": f"s{i}", "value": 1, "round": 0} for i in range(3)]},
                headers={"Idempotency-Key": "k1"})

    p = threading.Thread(target=post)
    with _held(live, "SELECT id FROM datasets WHERE name = 'd' FOR UPDATE") as blocked:
        p.start()
        _wait_for(blocked, "the batch's write waiting for the dataset lock")
        with live.client("admin") as c:
            assert c.delete(f"/v1/tokens/{tid}").status_code == 200
        assert "r" not in out
    p.join(timeout=60)
    assert out["r"].status_code == 401, (out["r"].status_code, out["r"].text)
    assert live.accountant.subject_spend("d", "s0") == 0
    with live.client("auditor") as c:
        assert c.get(f"/v1/sessions/{sid}").json()["received"] == 0
