"""HTTP clients of ``privcal serve`` for devices and federated agents (on httpx).

A device integration is three lines::

    from privcal.client import Reporter
    rep = Reporter("https://calib.example", token)      # a device token: session + subject
    rep.report(score)                                   # or rep.report(lambda q: score <= q)

:meth:`Reporter.report` reads the session's current round and query, computes the true
bit ``score ≤ q`` (or calls the given function with ``q``), randomizes it locally with
binary randomized response at the session's ε, drawing from the operating system's CSPRNG
(:func:`privcal.client.binary_rr`), and puts it. Only the randomized bit leaves the
device. A network failure is retried with the *same* report (same id, same bit: the
server answers "duplicate", the report counts once).

**Privacy of a rejected report.** A report the server refuses (its round filled first, the
session closed) was still *sent*: it is an ε-LDP output the server saw, even though the
ledger charges accepted reports only. So ``report`` does not answer again by default;
``answer_again=True`` lets a device answer the next round's query, each sent answer
costing the device another ε (sequential composition), which the caller accepts.

:class:`Agent` does the same for a FedCP²-QQ (or FedCP-QQ) agent: it reads the public plan
and puts its message, computed locally from its scores.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from privcal.errors import InvalidInput, PlanRejected, PrivcalError

__all__ = ["Agent", "Reporter", "ServiceError"]

_RETRY_REASONS = ("closed round", "round full", "round not open")


class ServiceError(PrivcalError):
    """The service answered with a problem document (``status``, ``type``, ``detail``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


class _Base:
    def __init__(self, url: str, token: str, *, timeout: float = 30.0, retries: int = 3,
                 client: Any = None) -> None:
        import httpx

        self._own = client is None
        self._http = client if client is not None else httpx.Client(
            base_url=url.rstrip("/"), timeout=timeout)
        self._auth = {"Authorization": f"Bearer {token}"}
        self.retries = retries
        self._session: int | None = None

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

    def session_id(self) -> int:
        """The session this token is bound to."""
        if self._session is None:
            who = self._request("GET", "/v1/whoami").json()
            if who.get("session") is None:
                raise InvalidInput(f"a {who.get('role')} token is not bound to a session")
            self._session = int(who["session"])
        return self._session

    def state(self) -> dict[str, Any]:
        """The session's public state (round, query, grid, plan, parameters)."""
        return dict(self._request("GET", f"/v1/sessions/{self.session_id()}").json())


class Reporter(_Base):
    """A device of an LDP-CP-S (``ldp-score``) session (see the module docstring)."""

    def report(self, value: float | Callable[[float], Any], *, report_id: str | None = None,
               answer_again: bool = False, rng: Any = None) -> dict[str, Any]:
        """Randomize and put this device's report; returns its status (``accepted`` or
        ``duplicate``), round, randomized bit and report id. Raises :class:`PlanRejected`
        if the server refused it."""
        from privcal.client import binary_rr

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
            rid = report_id or secrets.token_hex(16)
            try:
                r = self._request("PUT", f"/v1/sessions/{st['id']}/reports/{rid}",
                                  json={"round": int(st["round"]), "value": bit})
            except ServiceError as exc:
                reason = exc.problem.get("reason")
                if exc.status == 409 and answer_again and reason in _RETRY_REASONS:
                    report_id = None
                    continue
                if exc.status == 409:
                    raise PlanRejected(f"report refused: {reason or exc}") from None
                raise
            return {"status": r.json()["status"], "round": int(st["round"]), "value": bit,
                    "report_id": rid}


class Agent(_Base):
    """A federated agent of a FedCP²-QQ or FedCP-QQ session."""

    def send(self, scores: Any, *, rng: Any = None) -> dict[str, Any]:
        """Compute this agent's message from its scores locally and put it."""
        import numpy as np

        from privcal.calibrators.fedplan import Fed2Plan, FedPlan
        from privcal.client import fedcp2_qq_message, fedcp_qq_message

        st = self.state()
        if st.get("status") != "open" or st.get("plan") is None:
            raise PlanRejected(f"session {st.get('id')} is not collecting "
                               f"(status {st.get('status')})")
        s = np.asarray(scores, dtype=float)
        if st["method"] == "fedcp2-qq":
            msg = fedcp2_qq_message(s, Fed2Plan.model_validate(st["plan"]), rng)
        else:
            msg = fedcp_qq_message(s, FedPlan.model_validate(st["plan"]))
        try:
            r = self._request("PUT", f"/v1/sessions/{st['id']}/messages",
                              json={"value": float(msg)})
        except ServiceError as exc:
            if exc.status == 409:
                raise PlanRejected(f"message refused: {exc.problem.get('reason') or exc}"
                                   ) from None
            raise
        return {"status": r.json()["status"], "value": float(msg)}
