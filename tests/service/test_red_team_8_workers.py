"""Red team 8 (K): the service with several workers (``privcal serve --workers 2``, one
process each) on one ledger. A device's retry racing its original on another worker was
answered 409 "subject already reported" for a report stored and charged: each worker's
batcher read the subject's stored report before its batch, found none, and its batch then
accepted nothing (the other worker had stored it) — and it read nothing back. Every pair
of identical concurrent PUTs must now be answered as stored (201 or 200), each subject
charged once. Until this test, no test ran more than one worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from privcal.accountant import Accountant
from privcal.accountant.sessions import session_status
from privcal.storage.token_bulk import create_device_tokens
from privcal.storage.tokens import create_token

PAIRS = 60


def _serve(url: str, workers: int) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PRIVCAL_DATABASE_URL": url}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from privcal.cli import main; main()", "serve", "--port", "0",
         "--workers", str(workers), "--log-level", "warning"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        start_new_session=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
    assert m, line
    base = m.group(1)
    deadline = time.monotonic() + 90
    ready = 0
    while ready < 8:  # every worker up: several answers in a row
        try:
            ready = ready + 1 if httpx.get(base + "/readyz").status_code == 200 else 0
        except httpx.TransportError:
            ready = 0
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.1)
    return proc, base


@pytest.mark.parametrize("kind", ["reports", "messages"])
def test_a_retry_racing_its_original_on_another_worker_is_not_rejected(
        ledger: Any, ledger_url: str, kind: str) -> None:
    acct = Accountant(ledger)
    acct.create_dataset("d", rho="1", subject_epsilon="100", allow_nonprivate=True)
    analyst = create_token(ledger, "analyst", name="an", datasets=["d"]).token
    proc, base = _serve(ledger_url, 2)
    try:
        auth = {"Authorization": f"Bearer {analyst}", "Idempotency-Key": "open-1"}
        if kind == "reports":
            body: dict[str, Any] = {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0,
                                    "rounds": 1, "group_size": 5000}
        else:
            body = {"method": "fedcp-qq", "alpha": 0.2, "agents": PAIRS, "local_n": 50}
        r = httpx.post(f"{base}/v1/datasets/d/sessions", headers=auth, json=body, timeout=60)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        if kind == "reports":
            tokens = create_device_tokens(ledger, sid, [f"dev{i}" for i in range(PAIRS)])
            rnd = httpx.get(f"{base}/v1/sessions/{sid}",
                            headers={"Authorization": f"Bearer {tokens[0]}"}).json()["round"]
        else:
            tokens = [create_token(ledger, "agent", session=sid, agent=f"ag{i}").token
                      for i in range(PAIRS)]

        def put(i: int, out: list[tuple[int, str]]) -> None:
            with httpx.Client(base_url=base, timeout=60) as c:  # a connection of its own
                h = {"Authorization": f"Bearer {tokens[i]}"}
                if kind == "reports":
                    rr = c.put(f"/v1/sessions/{sid}/reports/r{i}", headers=h,
                               json={"round": rnd, "value": i % 2})
                else:
                    rr = c.put(f"/v1/sessions/{sid}/messages", headers=h,
                               json={"value": i / PAIRS})
                doc = rr.json()
                out.append((rr.status_code, doc.get("reason") or doc.get("status") or ""))

        answers: Counter[tuple[int, str]] = Counter()
        for i in range(PAIRS):
            out: list[tuple[int, str]] = []
            threads = [threading.Thread(target=put, args=(i, out)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            answers.update(out)
        refused = {a: n for a, n in answers.items() if a[0] not in (200, 201)}
        assert not refused, (refused, answers)
        assert answers[(201, "accepted")] >= PAIRS  # each stored once, by one of the two
        assert session_status(acct, sid).total_reports == PAIRS
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    if kind == "reports":  # each subject charged once (ε = 1), none twice
        summary = acct.subject_summary("d")
        assert summary.subjects == PAIRS and float(summary.max) == 1.0


def test_a_report_this_batch_stored_is_accepted_and_another_writer_s_a_duplicate(
        accountant: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review R (F2): when another worker stored one report of a batch between the
    batcher's read and its write, every stored report of the batch was answered
    "duplicate" — the one this batch stored too. Each stored report records its batch."""
    import privcal.accountant.sessions as sessions
    from privcal.service.batcher import ReportBatcher, _Item

    acct: Accountant = accountant
    acct.create_dataset("d", rho="1", subject_epsilon="100")
    sid = sessions.open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0,
                                rounds=1, group_size=50).id
    rnd = session_status(acct, sid).round
    real = sessions.submit_reports

    def racing(acct_: Any, sid_: int, subjects: Any, values: Any, rounds: Any = None,
               **kw: Any) -> Any:
        real(acct_, sid_, ["A"], [1], [rnd])  # the other worker stores A's retry first
        return real(acct_, sid_, subjects, values, rounds, **kw)

    monkeypatch.setattr(sessions, "submit_reports", racing)
    items = [_Item(sid, "A", rnd, 1), _Item(sid, "B", rnd, 0)]
    ReportBatcher(acct)._write(sid, items)
    assert [(it.subject, it.outcome.status if it.outcome else it.error)
            for it in items] == [("A", "duplicate"), ("B", "accepted")]


def test_an_agent_message_near_zero_is_not_the_stored_zero(accountant: Any) -> None:
    """Review R (F3): messages were compared with an absolute tolerance of 1e-12, so a
    FedCP-QQ agent's second, different raw score (0.0 after 1e-13) was answered
    "duplicate" — stored — when it is another message (refused)."""
    import privcal.accountant.sessions as sessions
    from privcal.service.batcher import ReportBatcher, _Item

    acct: Accountant = accountant
    acct.create_dataset("d", rho="1", allow_nonprivate=True)
    sid = sessions.open_session(acct, "fedcp-qq", dataset="d", alpha=0.2, agents=3,
                                local_n=50).id
    batcher = ReportBatcher(acct)
    answers = []
    for v in (1e-13, 1e-13, 0.0, -5e-13):
        it = _Item(sid, "a1", None, v)
        batcher._write(sid, [it])
        assert it.outcome is not None
        answers.append(it.outcome.status)
    assert answers == ["accepted", "duplicate", "rejected", "rejected"]


def test_a_retried_message_is_compared_as_the_library_stores_it(accountant: Any) -> None:
    """Review R2 (F1, F2): a FedCP²-QQ message is stored as its grid point (a value within
    the grid's tolerance), so the same text sent again was "rejected: another report"
    (compared with the sent text within 10⁻¹²), and a FedCP-QQ score 5·10⁻¹³ away was
    "duplicate". Now each is compared with the library's own stored text, exactly."""
    import privcal.accountant.sessions as sessions
    from privcal.service.batcher import ReportBatcher, _Item

    acct: Accountant = accountant
    acct.create_dataset("d", epsilon="10", subject_epsilon="10", allow_nonprivate=True)
    fed2 = sessions.open_session(acct, "fedcp2-qq", dataset="d", alpha=0.1, epsilon=2.0,
                                 agents=5, local_n=200, bins=4, upper=1.0).id
    fed = sessions.open_session(acct, "fedcp-qq", dataset="d", alpha=0.2, agents=3,
                                local_n=50).id
    batcher = ReportBatcher(acct)

    def send(sid: int, agent: str, value: Any) -> str:
        it = _Item(sid, agent, None, value)
        batcher._write(sid, [it])
        assert it.outcome is not None, it.error
        return it.outcome.status

    # grid {0, 1/3, 2/3, 1}: "0.3333333333" and 1e-10 are grid points 1/3 and 0
    assert [send(fed2, "a1", "0.3333333333") for _ in range(2)] == ["accepted", "duplicate"]
    assert [send(fed2, "a2", 1e-10) for _ in range(2)] == ["accepted", "duplicate"]
    assert send(fed2, "a2", 1 / 3) == "rejected"  # another grid point than the stored one
    assert [send(fed, "f1", v) for v in (1.0, 1.0, 1.0 + 5e-13)] == [
        "accepted", "duplicate", "rejected"]


def test_a_replayed_batch_says_the_batch_that_stored_it(accountant: Any) -> None:
    """Review R2 (F5): a keyed batch's replay answered ``batch: None``, not the original's."""
    import privcal.accountant.sessions as sessions

    acct: Accountant = accountant
    acct.create_dataset("d", rho="1", allow_nonprivate=True)
    sid = sessions.open_session(acct, "fedcp-qq", dataset="d", alpha=0.2, agents=3,
                                local_n=50).id
    first = sessions.submit_reports(acct, sid, ["f2"], [2.0], idempotency_key="k")
    again = sessions.submit_reports(acct, sid, ["f2"], [2.0], idempotency_key="k")
    assert again.replayed and first.batch is not None and again.batch == first.batch
