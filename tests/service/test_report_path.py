"""The device report PUT's lean path and the report writer's group commit (issue 10):
the lean path accepts exactly the bodies the route's model accepts, a burst is written in
few batches and every report is counted once, a token revoked while its report waits in
the queue is refused and nothing is stored, a ledger that cannot be read is 503."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.service.conftest import Live, open_ldp

pytest.importorskip("fastapi", reason="the server extra is part of the test extra")


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert doc["type"] == "urn:privcal:problem:" + slug and doc["status"] == status, doc
    return dict(doc)


class Gate:
    """Holds the report writer at the start of its next cycle (its reports already taken
    off the queue, their tokens not yet checked) until released."""

    def __init__(self, batcher: Any) -> None:
        self.batcher, self.reached, self.go = batcher, threading.Event(), threading.Event()
        self._orig = batcher._cycle
        batcher._cycle = self._cycle

    def _cycle(self, pending: list[Any]) -> Any:
        self.reached.set()
        assert self.go.wait(60)
        return self._orig(pending)

    def queued(self, n: int) -> None:
        """Wait until ``n`` more reports wait in the queue behind the held cycle."""
        deadline = time.monotonic() + 60
        while self.batcher._q.qsize() < n:
            assert time.monotonic() < deadline, "the reports did not reach the writer"
            time.sleep(0.01)

    def release(self) -> None:
        self.batcher._cycle = self._orig
        self.go.set()


_VALUES: list[Any] = [0, 1, 2, -1, 1_000_000, 1_000_001, True, False, 1.0, 0.0, "1", None,
                      [], {}]


def test_lean_parser_accepts_exactly_what_the_model_accepts() -> None:
    from pydantic import ValidationError

    from privcal.service.device_reports import parse_report
    from privcal.service.routes_sessions import ReportBody

    bodies: list[Any] = [[], "x", 1, None, {}]
    for rnd, val in itertools.product(_VALUES, repeat=2):
        bodies += [{"round": rnd, "value": val}, {"value": val, "round": rnd},
                   {"round": rnd}, {"value": val}, {"round": rnd, "value": val, "x": 1}]
    for body in bodies:
        raw = json.dumps(body).encode()
        try:
            m = ReportBody.model_validate(json.loads(raw))  # what FastAPI runs
            want: Any = (m.round, m.value)
        except ValidationError:
            want = None
        assert parse_report(raw) == want, body
    assert parse_report(b"{not json") is None
    # a key given twice is not a report: the app answers it (422, json_body.loads_strict)
    assert parse_report(b'{"round": 0, "value": 1, "round": 2}') is None
    assert parse_report(b'{"round": 0, "value": 1, "\\u0072ound": 2}') is None


def test_lean_path_answers_as_the_route(live: Live) -> None:
    sid = open_ldp(live, group_size=50, rounds=1)
    dev = live.token("device", session=sid, subject="s-1")
    url = f"/v1/sessions/{sid}/reports/r1"
    with live.client(token=dev) as c:
        # not a valid report: the FastAPI route answers (strict content type: 415, as on
        # every JSON route; strict model and duplicate keys: 422)
        for content, ctype in ((b'{"round":0,"value":1}', "text/plain"),
                               (b'{"round":0,"value":1}', None)):
            headers = {"content-type": ctype} if ctype else {}
            _problem(c.put(url, content=content, headers=headers), 415,
                     "unsupported-media-type")
        for content in (b'{"round":0,"value":1.0}', b'{"round":0,"value":true}', b'[0, 1]',
                        b'{"round":0,"value":1,"value":0}'):
            _problem(c.put(url, content=content, headers={"content-type": "application/json"}),
                     422, "invalid-input")
        _problem(c.put(f"/v1/sessions/{sid}/reports/bad%20id", json={"round": 0, "value": 1}),
                 422, "invalid-input")
        r = c.put(url, content=b'{"round":0,"value":1}',
                  headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 201 and r.json() == {"status": "accepted", "session": sid}
        assert r.headers["content-type"] == "application/json"
        r = c.put(url, json={"value": 1, "round": 0})
        assert r.status_code == 200 and r.json() == {"status": "duplicate", "session": sid}
        p = _problem(c.put(url, json={"round": 0, "value": 0}), 409, "report-rejected")
        assert "already reported" in p["detail"]
    with live.client(token=dev[:-1] + ("A" if dev[-1] != "A" else "B")) as c:  # forged secret
        r = _problem(c.put(url, json={"round": 0, "value": 1}), 401, "unauthenticated")
    from privcal.accountant.sessions import session_status

    assert session_status(live.accountant, sid).total_reports == 1
    live.accountant.verify()


def test_a_burst_is_written_in_few_batches_and_counted_once(live: Live) -> None:
    """Group commit: reports that arrive while the writer is busy go into its next batch;
    retries racing their original (same value: 200 duplicate; another value: 409) in the
    same burst are counted once, charged once."""
    from privcal.accountant.sessions import session_status

    n = 30
    sid = open_ldp(live, group_size=n, rounds=1)
    toks = [live.token("device", session=sid, subject=f"s-{i}") for i in range(n)]
    batcher = live.app.state.batcher
    gate = Gate(batcher)
    reqs = [(i, 1) for i in range(n)] + [(i, 1) for i in range(0, n, 2)] \
        + [(i, 0) for i in range(1, n, 6)]
    first, rest = reqs[0], reqs[1:]

    def put(req: tuple[int, int]) -> tuple[int, int, int]:
        i, v = req
        with live.client(token=toks[i]) as c:
            r = c.put(f"/v1/sessions/{sid}/reports/r{v}", json={"round": 0, "value": v})
            return i, v, r.status_code

    batches0 = batcher.batches
    with ThreadPoolExecutor(len(reqs)) as pool:
        futs = [pool.submit(put, first)]
        assert gate.reached.wait(60)
        futs += [pool.submit(put, q) for q in rest]
        gate.queued(len(rest))
        gate.release()
        got = [f.result() for f in futs]
    # the held report, then the burst (one batch per round of same-subject retries)
    assert batcher.batches - batches0 <= 4, batcher.batches - batches0
    by: dict[int, list[tuple[int, int]]] = {}
    for i, v, code in got:
        by.setdefault(i, []).append((v, code))
    for i, answers in by.items():
        codes = sorted(code for _, code in answers)
        assert codes.count(201) == 1, (i, answers)
        won = next(v for v, code in answers if code == 201)
        for v, code in answers:
            if code != 201:
                assert code == (200 if v == won else 409), (i, answers)
    st = session_status(live.accountant, sid)
    assert st.total_reports == n and st.status == "released"
    assert all(live.accountant.subject_spend("d", f"s-{i}") == 1 for i in range(n))
    live.accountant.verify()


def test_a_token_revoked_while_its_report_waits_is_refused_and_nothing_stored(
        live: Live) -> None:
    from privcal.accountant.sessions import session_status
    from privcal.storage.tokens import audit_entries

    sid = open_ldp(live, group_size=4, rounds=2)
    other = open_ldp(live, group_size=4, rounds=2)
    held = live.token("device", session=sid, subject="s-0")
    revoked = live.token("device", session=sid, subject="s-1")
    wrong = live.token("device", session=other, subject="s-2")
    ok = live.token("device", session=sid, subject="s-3")
    gate = Gate(live.app.state.batcher)
    head0 = live.accountant.ledger.head().seq

    def put(tok: str) -> Any:
        with live.client(token=tok) as c:
            return c.put(f"/v1/sessions/{sid}/reports/r", json={"round": 0, "value": 1})

    with ThreadPoolExecutor(4) as pool:
        f0 = pool.submit(put, held)
        assert gate.reached.wait(60)
        fs = [pool.submit(put, t) for t in (revoked, wrong, ok)]
        gate.queued(3)
        with live.client("admin") as admin:  # revoked after its report was queued
            assert admin.delete(f"/v1/tokens/{revoked.split('_')[1]}").status_code == 200
        gate.release()
        assert f0.result().status_code == 201
        _problem(fs[0].result(), 401, "unauthenticated")
        _problem(fs[1].result(), 404, "not-found")
        assert fs[2].result().status_code == 201
    st = session_status(live.accountant, sid)
    assert st.total_reports == 2
    assert live.accountant.subject_spend("d", "s-1") == 0
    assert live.accountant.subject_spend("d", "s-2") == 0
    # the two accepted reports were written (the held one, then s-3), nothing else
    kinds = [e.kind for e in audit_entries(live.accountant.ledger, after=head0, limit=1000)]
    assert kinds.count("session_batch") == 2 and kinds.count("charge") == 2, kinds
    live.accountant.verify()


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_device_put_with_an_unreadable_ledger_is_503(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    import privcal.storage.token_checks as checks
    from privcal.accountant.sessions import session_status
    from privcal.errors import LedgerError

    sid = open_ldp(live)
    dev = live.token("device", session=sid, subject="s-1")

    def down(*a: Any, **k: Any) -> Any:
        raise LedgerError("database is locked")

    monkeypatch.setattr(checks, "check_presented", down)
    with live.client(token=dev) as c:
        _problem(c.put(f"/v1/sessions/{sid}/reports/r", json={"round": 0, "value": 1}), 503,
                 "ledger-unavailable")
    assert session_status(live.accountant, sid).total_reports == 0


def test_device_tokens_in_bulk_are_tokens_like_any_other(ledger_url: str) -> None:
    from privcal.accountant import Accountant
    from privcal.accountant.sessions import open_session
    from privcal.errors import InvalidInput
    from privcal.storage import Ledger
    from privcal.storage.token_bulk import create_device_tokens
    from privcal.storage.tokens import authenticate, list_tokens

    led = Ledger(ledger_url)
    led.upgrade()
    try:
        acct = Accountant(led)
        acct.create_dataset("d", rho="1", subject_epsilon="10")
        sid = open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=2.0, rounds=1,
                           group_size=3).id
        toks = create_device_tokens(led, sid, ["a", "b", "c"])
        assert len(set(toks)) == 3
        infos = [authenticate(led, t) for t in toks]
        assert [(i.role, i.session, i.subject) for i in infos if i is not None] == [
            ("device", sid, "a"), ("device", sid, "b"), ("device", sid, "c")]
        assert authenticate(led, toks[0][:-1] + ("A" if toks[0][-1] != "A" else "B")) is None
        stored = {t.id for t in list_tokens(led)}
        for bad in (["x", "x"], ["ok", " spaced"], [""]):
            with pytest.raises(InvalidInput):
                create_device_tokens(led, sid, bad)
        with pytest.raises(InvalidInput):
            create_device_tokens(led, 0, ["z"])
        assert {t.id for t in list_tokens(led)} == stored  # a refused call wrote nothing
    finally:
        led.close()
