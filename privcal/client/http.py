"""HTTP clients of ``privcal serve`` for devices and federated agents (on httpx).

A device integration is three lines::

    from privcal.client import Reporter
    rep = Reporter("https://calib.example", token, memo="state/privcal-memo.json",
                   max_epsilon=2.0)
    rep.report(score)                                   # or rep.report(lambda q: score <= q)

:meth:`Reporter.report` reads the session's current round and query, computes the true
bit ``score ≤ q`` (or calls the given function with ``q``), randomizes it locally with
binary randomized response at the session's ε, drawing from the operating system's CSPRNG
(:func:`privcal.client.binary_rr`), and puts it. Only the randomized bit leaves the
device. A network failure is retried with the *same* report (same id, same bit: the
server answers "duplicate", the report counts once).

**One randomized answer per session.** Under local DP the *server* is the party the
randomization protects against, and a majority over repeated independent draws recovers the
true bit; the ledger's "ε once per session" holds only if the device never sends two. So a
device never draws a second answer for a token it has already answered (a device or agent
token is bound to one session and one subject or agent):

- *memo* (strongly recommended): ``Reporter(..., memo=PATH)`` / ``Agent(..., memo=PATH)``
  keeps a small JSON file on the device (:mod:`privcal.client.memo`: written atomically, mode
  0600) keyed by what the client knows itself — the role and a SHA-256 of the token (not the
  URL: one server has many spellings) — never by what the server says. Every answer is recorded
  (its own id, round, value) *before* it is sent, its outcome after; no record is
  overwritten. A later call — after an app restart, a crash, a lost connection, a retry
  loop — resends exactly the recorded answer if its outcome is unknown (no new randomness;
  the server answers "duplicate" if it had stored it), returns the recorded status if it
  was accepted, and raises :class:`~privcal.errors.PlanRejected` if it was refused (unless
  ``answer_again``, below). A ``report_id`` given by the caller that is already recorded
  resends its recorded value. The memo also records what ``GET /v1/whoami`` said about the
  token (session, subject or agent); if the server later says otherwise, the call raises
  :class:`PlanRejected` and sends nothing. On POSIX every call holds an exclusive
  ``flock`` on ``PATH.lock`` from reading the memo to recording the outcome (network send
  included: a call waits for another's), so objects, threads and processes sharing one
  file answer one at a time. **With a memo, no second randomized answer leaves the device
  for a token, whatever the server answers**, except with ``answer_again=True``, nor for a
  token issued in its place (same session and subject or agent: the memo resends or counts
  the answers recorded under the earlier token — one revoked or expired in flight). Limits:
  the guarantee lasts as long as the file (keep it with the app's data, not in a cache the
  system may clear; a deleted file lets the device answer again); without :mod:`fcntl`
  (Windows) there is no lock across processes, so two processes must not share one file.
- *in memory*: every :class:`Reporter` / :class:`Agent` keeps the same records in memory
  (same key) and holds a lock across each call, so repeated or concurrent calls on one
  object (from any number of threads) never draw again either.
- *the server's answer*: every call first reads ``GET /v1/whoami``, which tells a device
  token whether its subject's report is already stored in its session
  (``reported_rounds``) and an agent token whether its message is (``sent``); if so, the
  call raises :class:`PlanRejected` and sends nothing. **Without a memo, a new object is
  safe only as far as the server's answer goes**: an answer that was sent and *refused*
  (nothing stored) or lost before the server stored it is unknown to the server, and a
  server that lies gets one new answer per new object.

**The server's ε.** The ε comes from the session's public state, which the server writes:
a malicious server could publish a huge ε, so that the randomized bit is (nearly) the true
one. ``max_epsilon=`` (recommended; on :class:`Reporter`, and on :class:`Agent` for the
FedCP²-QQ plan's ε) refuses, before drawing and sending nothing, a session whose ε exceeds
it; an :class:`Agent` with ``max_epsilon`` also refuses a FedCP-QQ session (unrandomized).

**Privacy of a rejected answer.** An answer the server refuses (its round filled first, the
session closed) was still *sent*: it is an ε-LDP output the server saw, even though the
ledger charges accepted reports only. So ``report`` does not answer again by default;
``answer_again=True`` lets a device answer after a refusal another answer can get past (a
closed, full or not yet open round), each sent answer costing the device another ε
(sequential composition), which the caller accepts — but only for a round strictly after
every round this token already answered (refused or not; the round must have moved on), and
never more answers than the session's number of rounds (the smallest ever published to the
token). The server chooses the rounds' queries, so that bound is the price.

:class:`Agent` does the same for a FedCP²-QQ (or FedCP-QQ) agent: it reads the public plan
and puts its message, computed locally from its scores (recorded in the memo the same way).
"""

from __future__ import annotations

import numbers
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

from privcal.client.memo import Memo, token_key
from privcal.client.transport import ServiceError, check_options, positive_number, request
from privcal.errors import InvalidInput, PlanRejected, with_article

__all__ = ["Agent", "Reporter", "ServiceError"]

_RETRY_REASONS = ("closed round", "round full", "round not open")
_STORED = ("accepted", "duplicate")
_WHO = {"subject": "device's subject", "agent": "agent"}  # whose cap a refusal names


class _Base:
    _role = ""
    _who = ""
    _path = ""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3,
                 client: Any = None, memo: str | os.PathLike[str] | None = None,
                 max_epsilon: float | None = None) -> None:
        try:
            import httpx
        except ImportError:  # a base install: one line saying what to install
            raise InvalidInput("the privcal HTTP client needs httpx: pip install "
                               "'privcal[client]' (from a clone: pip install '.[client]')"
                               ) from None

        if client is not None and not isinstance(client, httpx.Client):
            raise InvalidInput("client must be a synchronous httpx.Client; from async code run "
                               "report() in a thread: await asyncio.to_thread(rep.report, score)")
        timeout, retries = check_options(timeout, retries)
        if max_epsilon is not None and not positive_number(max_epsilon):
            raise InvalidInput(f"max_epsilon must be a positive number, not {max_epsilon!r}")
        self._url = url.rstrip("/")
        self._own = client is None
        self._http = client if client is not None else httpx.Client(
            base_url=self._url, timeout=timeout)
        self._auth = {"Authorization": f"Bearer {token}"}
        self.retries = retries
        self.max_epsilon = None if max_epsilon is None else float(max_epsilon)
        self._session: int | None = None
        self._memo = Memo(memo, server=self._url)
        self._key = token_key(self._role, token)
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        return request(self._http, method, path, self._auth, self.retries, **kw)

    def _whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``, read afresh; the session it is bound to is remembered."""
        who = dict(self._request("GET", "/v1/whoami").json())
        if who.get("session") is None:
            raise InvalidInput(f"{with_article(str(who.get('role')))} token is not bound to a "
                               "session")
        self._session = int(who["session"])
        return who

    def session_id(self) -> int:
        """The session this token is bound to."""
        if self._session is None:
            self._whoami()
        return self._session  # type: ignore[return-value]  # set by _whoami

    def state(self) -> dict[str, Any]:
        """The session's public state (round, query, grid, plan, parameters)."""
        return dict(self._request("GET", f"/v1/sessions/{self.session_id()}").json())

    def score(self) -> dict[str, Any] | None:
        """The score this device or agent must compute, as the session's public params record
        it (``params["score"]``, e.g. ``{"name": "aps", "options": {"randomized": True}}``:
        compute it with ``label_scores(name, probs, labels, **options)`` or
        ``regression_scores``), or None if the session was opened without one (red team 16,
        F9)."""
        sc = (self.state().get("params") or {}).get("score")
        return dict(sc) if isinstance(sc, dict) else None

    def _begin(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
        """whoami, this token's binding (session, subject or agent) and its records, after
        checking the binding against the recorded one."""
        who = self._whoami()
        bind = {"session": int(who["session"]), self._who: who.get(self._who)}
        return who, bind, self._memo.reports(self._key, bind)

    def _put(self, bind: dict[str, Any], rid: str, rec: dict[str, Any]) -> dict[str, Any]:
        """Send a recorded answer and record its outcome: ``accepted``/``duplicate``, or
        ``refused`` (409, with its reason). Another error leaves it ``pending`` (its outcome
        unknown: the next call resends it) and is raised."""
        body: dict[str, Any] = ({"round": rec["round"], "value": rec["value"]}
                                if self._role == "device" else {"value": rec["value"]})
        try:
            r = self._request("PUT", self._path.format(sid=self._session, rid=rid), json=body)
        except ServiceError as exc:
            if exc.status != 409:
                raise
            rec = {**rec, "status": "refused",
                   "reason": str(exc.problem.get("reason") or exc.problem.get("detail") or exc)}
        else:
            status = str(r.json().get("status"))
            rec = ({**rec, "status": status} if status in _STORED else
                   {**rec, "status": "refused", "reason": f"unexpected status {status!r:.40}"})
        self._memo.put(self._key, bind, rid, rec)
        return rec

    def _replay(self, bind: dict[str, Any], recs: dict[str, dict[str, Any]],
                answer_again: bool, chosen: str | None = None) -> dict[str, Any] | None:
        """What the recorded answers of this token decide, before any new draw: resend
        ``chosen`` (or an answer whose outcome is unknown), return a stored one, or raise
        :class:`PlanRejected` for a refused one — unless ``answer_again`` and its refusal
        is one another answer can get past (None: a new answer may be drawn)."""
        what = "report" if self._role == "device" else "message"
        resend = [chosen] if chosen is not None else []
        resend += [s for s, r in recs.items() if r.get("status") == "pending" and s != chosen]
        for rid in resend:
            rec = self._put(bind, rid, recs[rid])
            if rec["status"] in _STORED:
                return rec
            recs = {**recs, rid: rec}
        for rec in recs.values():
            if rec.get("status") in _STORED:
                return rec
        for rec in recs.values():
            if rec.get("status") == "refused" and not (answer_again
                                                       and rec.get("reason") in _RETRY_REASONS):
                raise PlanRejected(f"{what} refused: {rec.get('reason')} (recorded; "
                                   f"answer_again=True answers again at another ε)")
        return None

    def _guard(self, who: dict[str, Any]) -> None:
        """Refuse to draw if the server holds this token's answer or its cap is spent."""
        if who.get("reported_rounds") or who.get("sent"):
            raise PlanRejected(
                f"the server already holds this {self._role}'s answer in session "
                f"{who.get('session')} (one per session): no new randomized answer is drawn "
                "(keep a memo= file to get its status back)")
        if who.get("within_cap") is False:
            raise PlanRejected(f"this {_WHO[self._who]} has less than session {who['session']}'s "
                               "ε left of its per-subject ε cap (or is no longer a valid id): "
                               "its answer would be refused on arrival; nothing was drawn")

    def _check_epsilon(self, eps: float, sid: Any) -> None:
        """Refuse, before drawing, a session whose ε exceeds ``max_epsilon``."""
        if self.max_epsilon is not None and not (eps <= self.max_epsilon):
            raise PlanRejected(f"session {sid} asks ε = {eps}, over this {self._role}'s "
                               f"max_epsilon = {self.max_epsilon}: nothing was drawn or sent")

    def _round_to_answer(self, recs: dict[str, dict[str, Any]], st: dict[str, Any],
                         answer_again: bool) -> tuple[int, int]:
        """The round a new answer would answer and the session's number of rounds; refuses
        (:class:`PlanRejected`) a second answer without ``answer_again``, and unless that
        round is after every round this token answered and fewer answers than rounds were
        sent (the smallest number of rounds ever seen)."""
        if recs and not answer_again:
            raise PlanRejected(f"this {self._role} already sent {len(recs)} answer(s) to "
                               f"session {st.get('id')}: not answering again without "
                               "answer_again=True")
        rnd = int(st.get("round") or 0)
        rounds = min([int(st.get("rounds") or 1)]
                     + [int(r["rounds"]) for r in recs.values() if r.get("rounds") is not None])
        if recs:
            last = max(int(r.get("round") or 0) for r in recs.values())
            if rnd <= last:
                raise PlanRejected(f"session {st.get('id')} is at round {rnd}, and round "
                                   f"{last} was already answered: not answering again")
        if len(recs) >= rounds:
            raise PlanRejected(f"{len(recs)} answer(s) already sent for the session's "
                               f"{rounds} round(s): not answering again")
        return rnd, rounds


class Reporter(_Base):
    """A device of an LDP-CP-S (``ldp-score``) session (see the module docstring)."""

    _role = "device"
    _who = "subject"
    _path = "/v1/sessions/{sid}/reports/{rid}"

    def report(self, value: float | Callable[[float], Any], *, report_id: str | None = None,
               answer_again: bool = False, rng: Any = None) -> dict[str, Any]:
        """Randomize and put this device's report, or resend or return the one recorded
        for this session (see the module docstring); returns its status (``accepted`` or
        ``duplicate``), round, randomized bit and report id. Raises :class:`PlanRejected`
        if the server refused it or already holds this subject's report, if the session's
        ε is over ``max_epsilon``, or if the server's answer about the token changed."""
        if isinstance(value, float | int) and not isinstance(value, bool):  # one reading (rt 26)
            value = float.__float__(value) if isinstance(value, float) else int.__int__(value)
        if not callable(value) and (isinstance(value, bool) or not isinstance(
                value, numbers.Real) or value != value):  # before anything is asked or drawn
            raise InvalidInput("report() takes a score (a real number, not NaN or a bool) or a "
                               f"function of the query returning true/false, got {value!r:.40}")
        from privcal.calibrators.base import unpredictable
        rng = unpredictable(rng, "what this device sends")
        with self._lock, self._memo.locked():
            return self._report(value, report_id, answer_again, rng)

    def _report(self, value: Any, report_id: str | None, answer_again: bool, rng: Any
                ) -> dict[str, Any]:
        import numpy as np

        from privcal.client import binary_rr

        who, bind, recs = self._begin()
        chosen = report_id if report_id is not None and report_id in recs else None
        done = self._replay(bind, recs, answer_again, chosen)
        if done is not None:
            return self._result(done)
        self._guard(who)
        if chosen is not None:  # the caller's id is taken by a refused report
            report_id = None
        while True:
            st = self.state()
            if st.get("method") != "ldp-score":
                raise InvalidInput(f"session {st.get('id')} is {st.get('method')}: devices "
                                   "report to ldp-score sessions")
            q = st.get("query")
            if st.get("status") != "open" or q is None:
                raise PlanRejected(f"session {st.get('id')} is not collecting "
                                   f"(status {st.get('status')})")
            eps = float(st["params"]["epsilon"])
            self._check_epsilon(eps, st.get("id"))
            rnd, rounds = self._round_to_answer(self._memo.reports(self._key, bind), st,
                                                answer_again)
            truth = value(float(q)) if callable(value) else bool(value <= float(q))
            if isinstance(truth, np.bool_) or (  # NumPy's bool: score <= q of a NumPy score
                    isinstance(truth, numbers.Integral) and truth in (0, 1)):
                truth = bool(truth)
            if not isinstance(truth, bool):  # NaN, None, 0.5, ...: nothing drawn or sent
                raise InvalidInput("the value function must return true/false (or 0/1), got "
                                   f"{truth!r:.40}")
            bit = int(binary_rr(truth, eps, rng))
            rid = report_id or secrets.token_hex(16)
            rec = {"report_id": rid, "round": rnd, "rounds": rounds, "value": bit,
                   "status": "pending", "reason": None}
            self._memo.put(self._key, bind, rid, rec)  # before it leaves the device
            rec = self._put(bind, rid, rec)
            if rec["status"] in _STORED:
                return self._result(rec)
            if answer_again and rec["reason"] in _RETRY_REASONS:
                report_id = None
                continue  # the next draw only for a later round (_round_to_answer)
            raise PlanRejected(f"report refused: {rec['reason']}")

    @staticmethod
    def _result(rec: dict[str, Any]) -> dict[str, Any]:
        return {"status": rec["status"], "round": int(rec["round"]), "value": int(rec["value"]),
                "report_id": rec["report_id"]}


class Agent(_Base):
    """A federated agent of a FedCP²-QQ or FedCP-QQ session (see the module docstring)."""

    _role = "agent"
    _who = "agent"
    _path = "/v1/sessions/{sid}/messages"

    def send(self, scores: Any, *, rng: Any = None, answer_again: bool = False
             ) -> dict[str, Any]:
        """Compute this agent's message from its scores locally and put it, or resend or
        return the one recorded for this session (see the module docstring); returns its
        status and value. Raises :class:`PlanRejected` if the server refused it or already
        holds this agent's message, if the plan's ε is over ``max_epsilon`` (or the session
        is FedCP-QQ, unrandomized, with ``max_epsilon``), or if the server's answer about
        the token changed; InvalidInput for scores not the session's score (float32, …)."""
        from privcal.calibrators.base import unpredictable
        rng = unpredictable(rng, "what this device sends")
        with self._lock, self._memo.locked():
            return self._send(scores, rng, answer_again)

    def _send(self, scores: Any, rng: Any, answer_again: bool) -> dict[str, Any]:
        import numpy as np

        from privcal.calibrators.fedplan import Fed2Plan, FedPlan
        from privcal.calibrators.validation import unmasked
        from privcal.client import fedcp2_qq_message, fedcp_qq_message

        scores = np.array(unmasked(scores, "scores"))  # masked: refused; read once (rt 26 F6)
        who, bind, recs = self._begin()
        done = self._replay(bind, recs, answer_again)
        if done is not None:
            return {"status": done["status"], "value": float(done["value"])}
        self._guard(who)
        st = self.state()
        if st.get("status") != "open" or st.get("plan") is None:
            raise PlanRejected(f"session {st.get('id')} is not collecting "
                               f"(status {st.get('status')})")
        rnd, rounds = self._round_to_answer(self._memo.reports(self._key, bind), st,
                                            answer_again)
        from privcal.accountant.sessions.score import check_agent_scores
        check_agent_scores(st.get("params"), scores)  # before anything is sent (red team 24)
        s = np.asarray(scores, dtype=float)
        if st["method"] == "fedcp2-qq":
            plan = Fed2Plan.model_validate(st["plan"])
            self._check_epsilon(float(plan.epsilon), st.get("id"))
            msg = fedcp2_qq_message(s, plan, rng)
        else:
            if self.max_epsilon is not None:
                raise PlanRejected(f"session {st.get('id')} is {st['method']}, whose message "
                                   "(a score) is not randomized, and this agent has a "
                                   "max_epsilon: nothing was sent")
            msg = fedcp_qq_message(s, FedPlan.model_validate(st["plan"]))
        rid = secrets.token_hex(16)
        rec: dict[str, Any] = {"round": rnd, "rounds": rounds, "value": float(msg),
                               "status": "pending", "reason": None}
        self._memo.put(self._key, bind, rid, rec)  # before it leaves the agent
        rec = self._put(bind, rid, rec)
        if rec["status"] not in _STORED:
            raise PlanRejected(f"message refused: {rec['reason']}")
        return {"status": rec["status"], "value": float(rec["value"])}
