"""HTTP clients of ``privcal serve`` for devices and federated agents (on httpx).

A device integration is three lines::

    from privcal.client import Reporter
    rep = Reporter("https://calib.example", token, memo="state/privcal-memo.json")
    rep.report(score)                                   # or rep.report(lambda q: score <= q)

:meth:`Reporter.report` reads the session's current round and query, computes the true
bit ``score ≤ q`` (or calls the given function with ``q``), randomizes it locally with
binary randomized response at the session's ε, drawing from the operating system's CSPRNG
(:func:`privcal.client.binary_rr`), and puts it. Only the randomized bit leaves the
device. A network failure is retried with the *same* report (same id, same bit: the
server answers "duplicate", the report counts once).

**One randomized answer per session.** The ledger charges a subject ε once per session,
which holds only if the server never sees two independently randomized answers of the same
subject: a majority over repeated draws recovers the true bit. So a device never draws a
second answer for a session it has already answered:

- *memo* (strongly recommended): ``Reporter(..., memo=PATH)`` / ``Agent(..., memo=PATH)``
  keeps a small JSON file on the device (written atomically, mode 0600; the file's
  directory is created) keyed by server URL, session, subject or agent, and round. The
  report (report id, round, value) is recorded *before* it is sent, its outcome after. A
  later call — after an app restart, a crash, a lost connection, a retry loop — resends
  exactly the recorded report if its outcome is unknown (no new randomness; the server
  answers "duplicate" if it had stored it), returns the recorded status if it was
  accepted, and raises :class:`~privcal.errors.PlanRejected` if it was refused (unless
  ``answer_again``, below). A ``report_id`` given by the caller that is already recorded
  resends its recorded value. **With a memo, no second randomized output leaves the device
  for the same session**, except with ``answer_again=True``. Keep the file with the app's
  data (not in a cache the system may clear); two processes must not share one file at
  the same time.
- *in memory*: every :class:`Reporter` / :class:`Agent` keeps the same records in memory,
  so repeated calls on one object never draw again either.
- *the server's answer*: every call first reads ``GET /v1/whoami``, which tells a device
  token whether its subject's report is already stored in its session
  (``reported_rounds``) and an agent token whether its message is (``sent``); if so, the
  call raises :class:`~privcal.errors.PlanRejected` and sends nothing (a subject reports
  once per session, so a new answer could only be refused). **Without a memo, repeated
  calls are safe only as far as the server's answer goes**: a report that was sent and
  *refused* (nothing stored) or lost before the server stored it is unknown to the server,
  and a new object without a memo draws a new answer.

**Privacy of a rejected report.** A report the server refuses (its round filled first, the
session closed) was still *sent*: it is an ε-LDP output the server saw, even though the
ledger charges accepted reports only. So ``report`` does not answer again by default;
``answer_again=True`` lets a device answer the next round's query after a refusal another
answer can get past (a closed, full or not yet open round), each sent answer costing the
device another ε (sequential composition), which the caller accepts.

:class:`Agent` does the same for a FedCP²-QQ (or FedCP-QQ) agent: it reads the public plan
and puts its message, computed locally from its scores (recorded in the memo the same way).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privcal.errors import InvalidInput, PlanRejected, PrivcalError

__all__ = ["Agent", "Reporter", "ServiceError"]

_RETRY_REASONS = ("closed round", "round full", "round not open")
_STORED = ("accepted", "duplicate")
_MEMO_VERSION = 1


class ServiceError(PrivcalError):
    """The service answered with a problem document (``status``, ``type``, ``detail``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


def _write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text``: a 0600 temporary file in its directory (created, 0700),
    synced, then ``os.replace`` — a reader sees the old file or the new one, never part."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable (not on every platform)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class _Memo:
    """A client's sent reports: records ``{slot: record}`` per key (server URL, session,
    subject or agent), in memory and, if ``path``, in a JSON file read afresh on each use."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else Path(path)
        self._mem: dict[str, dict[str, dict[str, Any]]] = {}

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            d = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"the report memo {self.path} is unreadable ({exc}); nothing "
                               "was sent (removing it lets this device answer again)") from exc
        if (not isinstance(d, dict) or d.get("version") != _MEMO_VERSION
                or not isinstance(d.get("sessions"), dict)):
            raise InvalidInput(f"{self.path} is not a privcal report memo; nothing was sent")
        return dict(d["sessions"])

    def records(self, key: str) -> dict[str, dict[str, Any]]:
        """The records of ``key``: the file's, and this object's where the file has none."""
        out = {slot: dict(rec) for slot, rec in self._read().get(key, {}).items()}
        for slot, rec in self._mem.get(key, {}).items():
            out.setdefault(slot, dict(rec))
        return out

    def put(self, key: str, slot: str, rec: dict[str, Any]) -> None:
        """Record ``rec`` (in memory, then in the file: an error if it cannot be written)."""
        self._mem.setdefault(key, {})[slot] = dict(rec)
        if self.path is None:
            return
        sessions = self._read()
        sessions.setdefault(key, {})[slot] = dict(rec)
        _write_atomic(self.path, json.dumps({"version": _MEMO_VERSION, "sessions": sessions},
                                            indent=1, sort_keys=True))


class _Base:
    _role = ""
    _path = ""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3,
                 client: Any = None, memo: str | os.PathLike[str] | None = None) -> None:
        import httpx

        self._url = url.rstrip("/")
        self._own = client is None
        self._http = client if client is not None else httpx.Client(
            base_url=self._url, timeout=timeout)
        self._auth = {"Authorization": f"Bearer {token}"}
        self.retries = retries
        self._session: int | None = None
        self._memo = _Memo(memo)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, headers=self._auth, **kw)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
                time.sleep(delay)
                delay *= 2
                continue
            if r.status_code == 503 and attempt < self.retries:
                time.sleep(delay)
                delay *= 2
                continue
            if r.status_code >= 400:
                try:
                    prob = r.json()
                except ValueError:
                    prob = {"detail": r.text}
                raise ServiceError(r.status_code, prob)
            return r
        raise AssertionError("unreachable")  # pragma: no cover

    def _whoami(self) -> dict[str, Any]:
        """``GET /v1/whoami``, read afresh; the session it is bound to is remembered."""
        who = dict(self._request("GET", "/v1/whoami").json())
        if who.get("session") is None:
            raise InvalidInput(f"a {who.get('role')} token is not bound to a session")
        self._session = int(who["session"])
        return who

    def session_id(self) -> int:
        """The session this token is bound to."""
        if self._session is None:
            self._whoami()
        assert self._session is not None
        return self._session

    def state(self) -> dict[str, Any]:
        """The session's public state (round, query, grid, plan, parameters)."""
        return dict(self._request("GET", f"/v1/sessions/{self.session_id()}").json())

    def _key(self, who: dict[str, Any]) -> str:
        """The memo key of this token's answers: server URL, session, subject or agent."""
        return json.dumps([self._url, int(who["session"]), self._role,
                           who.get("subject") if self._role == "device" else who.get("agent")])

    def _put(self, key: str, slot: str, rec: dict[str, Any]) -> dict[str, Any]:
        """Send a recorded report and record its outcome: ``accepted``/``duplicate``, or
        ``refused`` (409, with its reason). Another error leaves it ``pending`` (its outcome
        unknown: the next call resends it) and is raised."""
        body = {"value": rec["value"]}
        path = self._path.format(sid=self._session, rid=rec.get("report_id"))
        if "round" in rec:
            body = {"round": rec["round"], "value": rec["value"]}
        try:
            r = self._request("PUT", path, json=body)
        except ServiceError as exc:
            if exc.status != 409:
                raise
            rec = {**rec, "status": "refused",
                   "reason": str(exc.problem.get("reason") or exc.problem.get("detail") or exc)}
        else:
            rec = {**rec, "status": str(r.json()["status"])}
        self._memo.put(key, slot, rec)
        return rec

    def _replay(self, key: str, recs: dict[str, dict[str, Any]], answer_again: bool,
                chosen: tuple[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """What the recorded reports of this session decide, before any new draw: resend
        ``chosen`` (or a report whose outcome is unknown), return a stored one, or raise
        :class:`PlanRejected` for a refused one — unless ``answer_again`` and its refusal
        is one another answer can get past (None: draw a new answer)."""
        what = "report" if self._role == "device" else "message"
        resend = [chosen] if chosen is not None else []
        resend += [(s, r) for s, r in recs.items() if r.get("status") == "pending"
                   and (chosen is None or s != chosen[0])]
        for slot, old in resend:
            rec = self._put(key, slot, old)
            if rec["status"] in _STORED:
                return rec
            recs = {**recs, slot: rec}
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
        """Refuse to draw if the server already holds this token's answer (whoami)."""
        if who.get("reported_rounds") or who.get("sent"):
            raise PlanRejected(
                f"the server already holds this {self._role}'s answer in session "
                f"{who.get('session')} (one per session): no new randomized answer is drawn "
                "(keep a memo= file to get its status back)")


class Reporter(_Base):
    """A device of an LDP-CP-S (``ldp-score``) session (see the module docstring)."""

    _role = "device"
    _path = "/v1/sessions/{sid}/reports/{rid}"

    def report(self, value: float | Callable[[float], Any], *, report_id: str | None = None,
               answer_again: bool = False, rng: Any = None) -> dict[str, Any]:
        """Randomize and put this device's report, or resend or return the one recorded
        for this session (see the module docstring); returns its status (``accepted`` or
        ``duplicate``), round, randomized bit and report id. Raises :class:`PlanRejected`
        if the server refused it or already holds this subject's report."""
        from privcal.client import binary_rr

        who = self._whoami()
        key = self._key(who)
        recs = self._memo.records(key)
        chosen = next(((s, r) for s, r in recs.items() if report_id is not None
                       and r.get("report_id") == report_id), None)
        done = self._replay(key, recs, answer_again, chosen)
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
            truth = value(float(q)) if callable(value) else float(value) <= float(q)
            if not isinstance(truth, bool | int) or truth not in (0, 1, True, False):
                raise InvalidInput("the value function must return true/false")
            bit = int(binary_rr(bool(truth), eps, rng))
            rec = {"report_id": report_id or secrets.token_hex(16), "round": int(st["round"]),
                   "value": bit, "status": "pending", "reason": None}
            self._memo.put(key, str(rec["round"]), rec)  # before it leaves the device
            rec = self._put(key, str(rec["round"]), rec)
            if rec["status"] in _STORED:
                return self._result(rec)
            if answer_again and rec["reason"] in _RETRY_REASONS:
                report_id = None
                continue
            raise PlanRejected(f"report refused: {rec['reason']}")

    @staticmethod
    def _result(rec: dict[str, Any]) -> dict[str, Any]:
        return {"status": rec["status"], "round": int(rec["round"]), "value": int(rec["value"]),
                "report_id": rec["report_id"]}


class Agent(_Base):
    """A federated agent of a FedCP²-QQ or FedCP-QQ session (see the module docstring)."""

    _role = "agent"
    _path = "/v1/sessions/{sid}/messages"

    def send(self, scores: Any, *, rng: Any = None, answer_again: bool = False
             ) -> dict[str, Any]:
        """Compute this agent's message from its scores locally and put it, or resend or
        return the one recorded for this session (see the module docstring); returns its
        status and value. Raises :class:`PlanRejected` if the server refused it or already
        holds this agent's message."""
        import numpy as np

        from privcal.calibrators.fedplan import Fed2Plan, FedPlan
        from privcal.client import fedcp2_qq_message, fedcp_qq_message

        who = self._whoami()
        key = self._key(who)
        done = self._replay(key, self._memo.records(key), answer_again)
        if done is not None:
            return {"status": done["status"], "value": float(done["value"])}
        self._guard(who)
        st = self.state()
        if st.get("status") != "open" or st.get("plan") is None:
            raise PlanRejected(f"session {st.get('id')} is not collecting "
                               f"(status {st.get('status')})")
        s = np.asarray(scores, dtype=float)
        if st["method"] == "fedcp2-qq":
            msg = fedcp2_qq_message(s, Fed2Plan.model_validate(st["plan"]), rng)
        else:
            msg = fedcp_qq_message(s, FedPlan.model_validate(st["plan"]))
        rec: dict[str, Any] = {"value": float(msg), "status": "pending", "reason": None}
        self._memo.put(key, "message", rec)  # before it leaves the agent
        rec = self._put(key, "message", rec)
        if rec["status"] not in _STORED:
            raise PlanRejected(f"message refused: {rec['reason']}")
        return {"status": rec["status"], "value": float(rec["value"])}
