"""The report write window: device reports and agent messages that arrive one request at a
time are written in batches.

One background writer thread takes every pending report (group commit: under load, all
that arrived while the previous batch was being written, so a batch grows with the load;
when the queue was empty it first waits a short window for company), checks the batch's
device tokens with one read (a token revoked or expired by then is refused: 401; another
role 403; another session 404 — see :class:`privcal.service.auth.DeferredPrincipal`) and
every token again in the write transaction, once it holds the session's lock (revoked
meanwhile: 401, nothing written — red team 21, flows M2), groups the reports per session,
writes each group with one :func:`privcal.accountant.sessions.submit_reports` call (one
transaction: one lock of the dataset and session rows, one bulk charge, one bulk
insert, one audit entry), instead of one locked transaction per report. Each request
waits for its own outcome (an async request awaits it without holding a thread; the
answers of a batch reach an event loop in one thread-safe call, not one wake-up each):

- ``accepted`` (201): stored by this batch;
- ``duplicate`` (200): this subject had already stored a report of this round and value (a
  retry — judged by the stored round and value: a report id is not stored or compared);
- ``rejected`` (409): not stored, with the library's reason (another value already
  stored, closed round, round full, subject budget exhausted, session closed, …);
- invalid input (422, nothing stored): a batch the library refuses as invalid (an id it
  does not take, from a token made before ids were checked) is written again in halves,
  down to one report, so that only the bad one fails, with a generic detail — never the
  library's message, which would name a subject's id (maybe another's);
- busy (503, nothing stored): a report the writer has not taken when its request's wait
  (60 s) is up is dropped; one it has taken is being written, and its request waits for
  the outcome (red team 9: a timeout was a bare 500 for a report then stored and charged).

Outcomes are read from the ledger, not guessed: the subjects' stored reports are read
before the batch, and after it unless every report of the batch was accepted (then each
was stored as sent). Two reports of one subject in one window are never put in one batch
(the second waits for the next), so a retry racing its original is answered
``duplicate``; with several workers (processes) the original may be written by another
one between the two reads, and a report found stored as sent after the batch is answered
``accepted`` or ``duplicate``, never ``rejected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from privcal.errors import InvalidInput, PrivcalError
from privcal.service.problems import ProblemError, problem_for, report_writer_busy, unauthenticated
from privcal.service.writer_tokens import check_tokens

__all__ = ["Outcome", "ReportBatcher"]

log = logging.getLogger("privcal.service")

_ROUND_REASONS = ("closed round", "round not open", "malformed round")


@dataclass(frozen=True)
class Outcome:
    """What happened to one report."""

    status: str  # accepted | duplicate | rejected
    reason: str | None
    session: Any  # SessionInfo after the batch (None when the batch failed)


@dataclass
class _Item:
    session_id: int
    subject: str | None  # None until its deferred device token is checked
    round: int | None
    value: Any
    token: tuple[str, str] | None = None  # a device's (token id, digest), checked in bulk
    #: the id of the token the report was sent under (an agent's, authenticated on arrival; a
    #: device's, once its deferred check passed): the writer re-checks it is still in force
    #: before the write and in the write transaction (revoked while it waited: 401)
    recheck: str | None = None
    future: Future[Outcome] | None = None  # a thread's waiter (submit)
    afuture: asyncio.Future[Outcome] | None = None  # a request's waiter (submit_async) ...
    loop: asyncio.AbstractEventLoop | None = None  # ... on this event loop
    outcome: Outcome | None = None
    error: BaseException | None = None
    #: (under ReportBatcher._claims) taken into a batch, or given up by its waiter first
    claimed: bool = False
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.error is not None

    def answer(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def fail(self, exc: BaseException) -> None:
        self.error = exc


def _settle(items: list[_Item]) -> None:
    """On the event loop: hand each request its answer (one call per batch and loop)."""
    for it in items:
        fut = it.afuture
        if fut is None or fut.done() or it.cancelled:  # its request went away or gave up
            continue
        if it.error is not None:
            fut.set_exception(it.error)
        else:
            fut.set_result(it.outcome)  # type: ignore[arg-type]


def _deliver(items: list[_Item]) -> None:
    """Answer the waiters of every answered item: a thread's future at once, the requests
    of each event loop with one thread-safe call (not one wake-up per report)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Item]] = defaultdict(list)
    for it in items:
        if not it.done:
            continue
        if it.loop is not None:
            by_loop[it.loop].append(it)
        elif it.future is not None and not it.future.done():
            if it.error is not None:
                it.future.set_exception(it.error)
            else:
                it.future.set_result(it.outcome)  # type: ignore[arg-type]
    for loop, its in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, its)


def _same(stored: tuple[int, str, int | None], rnd: int | None, value: Any) -> bool:
    """Whether a stored (round, value, batch) is this report: the same round and the same
    stored text — a device's bit as sent, an agent's message as the library stores it
    (:meth:`ReportBatcher._message_texts`); no tolerance (a FedCP-QQ message is a raw score:
    1.0 and 1.0000000000005 are two messages)."""
    srnd, sval = stored[0], stored[1]
    if rnd is not None and srnd != rnd:
        return False
    return value is not None and sval == str(value)


class ReportBatcher:
    """A writer thread batching reports per session within ``window`` seconds."""

    def __init__(self, accountant: Any, *, window: float = 0.004, max_batch: int = 10_000) -> None:
        self.accountant = accountant
        self.window = window
        self.max_batch = max_batch
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="privcal-report-writer",
                                        daemon=True)
        self._stopped = False
        self._claims = threading.Lock()  # an item's claimed / cancelled (its waiter's timeout)
        self.wait = 60.0  # seconds a request waits for the writer to take its report
        self.batches = 0
        self.reports = 0

    def start(self) -> None:
        """Import what the writer runs (the session protocol pulls in SciPy: seconds on a
        busy machine, which the first reports would otherwise wait for), then start it."""
        import privcal.accountant.sessions  # noqa: F401

        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._q.put(None)
        self._thread.join(timeout=10)

    def submit(self, session_id: int, subject: str, rnd: int | None, value: Any,
               timeout: float | None = None, *, recheck: str | None = None) -> Outcome:
        """Queue one report and wait for its outcome (library errors are re-raised).
        ``recheck``: the id of the token the request was authenticated with, refused (401)
        if it is revoked or expires before the write."""
        if self._stopped:
            raise RuntimeError("the report writer is stopped")
        item = _Item(session_id, subject, rnd, value, future=Future(), recheck=recheck)
        self._q.put(item)
        assert item.future is not None
        try:
            return item.future.result(timeout=self.wait if timeout is None else timeout)
        except FutureTimeout:
            self._give_up(item)  # 503, never written; or taken: its outcome, however long
            return item.future.result()

    async def submit_async(self, session_id: int, subject: str | None, rnd: int | None,
                           value: Any, *, token: tuple[str, str] | None = None,
                           timeout: float | None = None, recheck: str | None = None
                           ) -> Outcome:
        """:meth:`submit` for a request on the event loop (no thread held while it waits).
        ``token``: a device's unchecked (id, digest) for ``subject`` None — the writer
        checks it and takes the subject from it, or answers its problem; ``recheck``: as
        :meth:`submit`'s, for a device's token already checked."""
        if self._stopped:
            raise RuntimeError("the report writer is stopped")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        item = _Item(session_id, subject, rnd, value, token, recheck, afuture=fut, loop=loop)
        self._q.put(item)
        try:
            async with asyncio.timeout(self.wait if timeout is None else timeout):
                return await asyncio.shield(fut)  # a timeout leaves ``fut`` to be answered
        except TimeoutError:
            self._give_up(item)
            return await fut

    def _give_up(self, item: _Item) -> None:
        """A waiter's timeout: 503 for an item not taken (never written, then); none for one
        taken (its waiter waits for the outcome)."""
        with self._claims:
            if not item.claimed:
                item.cancelled = True
                raise report_writer_busy()

    # ---------------------------------------------------------------- writer
    def _run(self) -> None:
        carry: list[_Item] = []
        while True:
            if not carry:
                first = self._q.get()
                if first is None:
                    return
                pending = [first]
                if self._q.empty():  # a quiet moment: wait a window for company
                    time.sleep(self.window)
            else:
                pending = carry
            # group commit: everything that arrived meanwhile (while the previous batch was
            # being written, under load) goes into this batch
            stop = False
            while len(pending) < self.max_batch:
                try:
                    it = self._q.get_nowait()
                except queue.Empty:
                    break
                if it is None:
                    stop = True
                    break
                pending.append(it)
            carry = []
            try:
                carry = self._cycle(pending)
            except Exception as exc:  # a fault of the writer itself: answer, do not hang
                log.exception("report writer cycle failed")
                for it in pending:
                    if not it.done:
                        it.fail(exc)
            _deliver(pending)
            if stop:
                for it in carry:
                    it.fail(RuntimeError("the report writer is stopped"))
                _deliver(carry)
                return

    def _cycle(self, pending: list[_Item]) -> list[_Item]:
        """Check tokens and write one batch per session; the items left for the next batch
        (a second report of a subject already in this one)."""
        carry: list[_Item] = []
        pending = check_tokens(self.accountant.ledger, pending)
        groups: dict[int, list[_Item]] = defaultdict(list)
        seen: set[tuple[int, str | None]] = set()
        with self._claims:  # what is written now is claimed; what a waiter gave up, dropped
            for it in pending:
                if it.cancelled:
                    continue
                if (it.session_id, it.subject) in seen:
                    carry.append(it)  # same subject twice: the next batch answers it
                else:
                    seen.add((it.session_id, it.subject))
                    groups[it.session_id].append(it)
                    it.claimed = True
        for sid, items in groups.items():
            self._write_each(sid, items)
        return carry

    def _write_each(self, sid: int, items: list[_Item]) -> None:
        """:meth:`_write`, answering its failure: a batch the library refuses as invalid
        input (one report's id — a token made before ids were checked — refuses the whole
        batch) is written again in halves, down to single reports, so that only the bad one
        fails; its
        waiter gets a generic detail, never the library's message (which names an id: in a
        batch, maybe another report's subject)."""
        try:
            self._write(sid, items)
        except InvalidInput as exc:
            todo = [it for it in items if not it.done]
            if len(todo) > 1:  # halves, not one write per report: ~2·log2(n) writes a bad one
                half = len(todo) // 2
                self._write_each(sid, todo[:half])
                self._write_each(sid, todo[half:])
                return
            p = problem_for(exc)
            if p.slug == "invalid-input":
                log.warning("report writer: session %s refused a report as invalid input", sid)
                p = ProblemError(422, "invalid-input", "Invalid input", "this report was "
                                 "refused as invalid input: the subject or agent id of its "
                                 "token is not a valid id")
            for it in todo:
                it.fail(p)
        except Exception as exc:  # every waiter gets the error, the writer goes on
            for it in items:
                if not it.done:
                    it.fail(exc)
            if not isinstance(exc, PrivcalError):
                log.exception("report batch for session %s failed", sid)

    def _message_texts(self, sid: int, items: list[_Item]) -> dict[int, str | None]:
        """An agent message (an item without a round) as the library would store it —
        :func:`~privcal.accountant.sessions.parsing.parse_messages` under the session's
        plan: a FedCP²-QQ value within the grid's tolerance is its grid point, a FedCP-QQ
        score its own float's text; None if the library would refuse it — by item id; so a
        retry is compared with the stored text exactly, never within a tolerance."""
        msgs = [it for it in items if it.round is None]
        if not msgs:
            return {}
        import numpy as np

        from privcal.accountant.sessions import parsing, session_status
        from privcal.calibrators.fedplan import Fed2Plan, FedPlan

        info = session_status(self.accountant, sid)
        if info.plan is None:
            return {}
        plan = (Fed2Plan if info.method == "fedcp2-qq" else FedPlan).model_validate(info.plan)
        ok, texts = parsing.parse_messages(
            info.method, np.asarray([it.value for it in msgs], dtype=object), plan)
        return {id(it): (t if good else None)
                for it, good, t in zip(msgs, ok.tolist(), texts, strict=True)}

    def _write(self, sid: int, items: list[_Item]) -> None:
        from privcal.accountant.sessions import submit_reports
        from privcal.accountant.sessions.records import TokensNotInForce
        from privcal.storage.tokens import stored_reports

        ledger = self.accountant.ledger
        before = stored_reports(ledger, sid, [it.subject for it in items])
        as_stored = self._message_texts(sid, items)
        todo: list[_Item] = []
        for it in items:
            old = before.get(it.subject)
            if old is None:
                todo.append(it)
            elif _same(old, it.round, as_stored.get(id(it), it.value)):
                it.answer(Outcome("duplicate", None, None))
            else:
                it.answer(Outcome(
                    "rejected", "subject already reported in this session (another report)",
                    None))
        if not todo:
            return
        try:  # the tokens again, in the write transaction (red team 21, flows M2)
            res = submit_reports(self.accountant, sid, [it.subject for it in todo],
                                 [it.value for it in todo],
                                 # device reports carry a round, agent messages none
                                 None if todo[0].round is None else [it.round for it in todo],
                                 tokens=[it.recheck for it in todo if it.recheck is not None])
        except TokensNotInForce as gone:  # revoked while waiting: 401, nothing written
            for it in todo:
                if it.recheck in gone.tokens:
                    it.fail(unauthenticated())
            rest = [it for it in todo if not it.done]
            if len(rest) == len(todo):  # cannot be: the error names only tokens it was given
                raise
            if rest:
                self._write(sid, rest)
            return
        self.batches += 1
        self.reports += res.accepted
        if res.accepted == len(todo):  # every report stored as sent: nothing to read back
            for it in todo:
                it.answer(Outcome("accepted", None, res.session))
            return
        # read back even when this batch stored nothing: another worker (process) may have
        # stored the very same report since ``before`` (a retry racing its original across
        # workers) — it is stored, not rejected (red team 8)
        after = stored_reports(ledger, sid, [it.subject for it in todo])
        for it in todo:
            got = after.get(it.subject)
            if got is not None and _same(got, it.round, as_stored.get(id(it), it.value)):
                # each stored report records the batch that stored it: this one's is
                # "accepted", another writer's (the original this request retries) "duplicate"
                mine = res.batch is not None and got[2] == res.batch
                it.answer(Outcome("accepted" if mine else "duplicate", None, res.session))
        other = {k: v for k, v in res.reasons.items() if k not in _ROUND_REASONS}
        for it in todo:
            if it.done:
                continue
            r = it.round
            if r is not None and r != res.batch_round and res.session.method == "ldp-score":
                reason = ("malformed round" if not 0 <= r < res.session.rounds  # as in a batch
                          else "closed round" if r < res.batch_round else "round not open")
            else:
                reason = next(iter(other)) if len(other) == 1 else "; ".join(sorted(other)) \
                    or "rejected"
            it.answer(Outcome("rejected", reason, res.session))

