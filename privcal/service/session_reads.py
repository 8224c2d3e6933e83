"""The lean path of a session-bound token's read of its session (``GET /v1/sessions/{sid}``):
the :class:`privcal.client.Reporter` reads it before each report, so 20 000 devices read it
20 000 times.

Through FastAPI that read costs the framework (routing, dependency solving, the
middleware stack), a token read with a :class:`~privcal.storage.tokens.TokenInfo`, two
session reads and the pydantic :class:`~privcal.accountant.sessions.SessionInfo` — per
device. :class:`privcal.service.app.PrivcalApp` answers it here instead when the answer is
a success: a well-formed bearer token that :func:`~privcal.storage.token_checks.check_presented`
finds valid (not revoked, not expired) *now*, of a device, agent or ingestor bound to this
very session, which exists. The token is checked on every request (revocation takes effect
at once); what is cached is the public JSON only, keyed by everything it is computed from
(:func:`~privcal.accountant.sessions.state.public_key`: method, status, shuffled, params and
the stored protocol or plan, read from the session row on every request) — so a new round,
or a closed or released session, is a different key: never served from an older state.

Anything else — no or a malformed token, an unknown, revoked or expired one, another role
(an analyst sees the whole state), another session, an unknown session, a query string, the
ledger unreachable — goes through the whole app, which answers it as before. The body and
headers of a lean answer are the route's (tests compare them).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Scope, Send

from privcal.service.problems import send_server_error
from privcal.service.response_headers import STANDARD_HEADERS
from privcal.storage.releases import MAX_STORED_ID

__all__ = ["SESSION_ROUTE", "PublicStates", "try_lean_get"]

#: the route template the access log names for a session read
SESSION_ROUTE = "/v1/sessions/{sid}"
_LEAN_GET = re.compile(r"^/v1/sessions/([1-9][0-9]{0,9})$")
_SID_MAX = MAX_STORED_ID  # the largest id a ledger holds
_BOUND_ROLES = frozenset({"device", "agent", "ingestor"})


class PublicStates:
    """The public JSON of sessions, per session the last one rendered and its key."""

    def __init__(self, limit: int = 4096) -> None:
        self._bodies: dict[int, tuple[Any, bytes]] = {}
        self._limit = limit
        self._lock = threading.Lock()
        self.rendered = 0  # how many times a body was computed (tests pin the cache)

    def body(self, ledger: Any, sid: int,
             allowed: Callable[[Any], bool] = lambda s: True) -> bytes | None:
        """The public JSON of session ``sid``, as the route renders it for a session-bound
        token (NotFound if there is none), in one read transaction that first asks
        ``allowed(s)`` (the token check; None if it says no): from the cache if the session
        row's public inputs are those it was rendered from, else rendered from this read."""
        from privcal.accountant.sessions.state import info_of, public_key
        from privcal.service.common import doc
        from privcal.service.routes_sessions import PUBLIC_FIELDS

        with ledger.read() as s:
            if not allowed(s):
                return None
            row = ledger.session_row(s, sid)
            key = public_key(row)
            with self._lock:
                hit = self._bodies.get(sid)
            if hit is not None and hit[0] == key:
                return hit[1]
            info = info_of(ledger, s, row, ledger.dataset_name(s, row.dataset_id))
        d = doc(info)
        body = bytes(JSONResponse({k: d.get(k) for k in PUBLIC_FIELDS}).body)
        with self._lock:
            if len(self._bodies) >= self._limit:
                self._bodies.clear()
            self._bodies[sid] = (key, body)
            self.rendered += 1
        return body


def _read(app: Any, presented: tuple[str, str], sid: int) -> bytes | None:
    """The body if the token is a valid one bound to session ``sid`` and the session exists
    (one read transaction); None: let the whole app answer."""
    from privcal.errors import PrivcalError
    from privcal.storage.token_checks import check_presented

    ledger = app.state.accountant.ledger

    def allowed(s: Any) -> bool:
        grant = check_presented(ledger, [presented], tx=s)[0]
        return grant is not None and grant.role in _BOUND_ROLES and grant.session == sid

    try:
        return app.state.public_states.body(ledger, sid, allowed)  # type: ignore[no-any-return]
    except PrivcalError:  # unknown session (404), ledger unreachable (503): the app says so
        return None


async def try_lean_get(scope: Scope, send: Send) -> int | None:
    """Answer ``scope`` if it is a session-bound token's successful read of its session:
    the status sent (200; 500, the whole app's problem document, for an unexpected error:
    red team 21, service F3); None: nothing sent, the app answers it."""
    import anyio

    from privcal.service.auth import DeferredPrincipal, bearer_token
    from privcal.storage.tokens import presented_token

    m = _LEAN_GET.match(scope["path"])
    if m is None or scope.get("query_string") or int(m.group(1)) > _SID_MAX:
        return None
    for k, _v in scope["headers"]:
        if k in (b"content-length", b"transfer-encoding"):
            return None  # a GET with a body: the middleware's limit and the route decide
    # the middleware's rule (two Authorization headers: none; red team 21, service F2)
    presented = presented_token(bearer_token(scope) or "")
    if presented is None:
        return None
    sid = int(m.group(1))
    try:
        body = await anyio.to_thread.run_sync(_read, scope["app"], presented, sid)
    except Exception as exc:  # the app's 500 (red team 21, service F3)
        await send_server_error(scope, send, exc)
        return 500
    if body is None:
        return None
    scope.setdefault("state", {})["deferred"] = DeferredPrincipal(presented)  # access log
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()),
                            (b"content-type", b"application/json"), *STANDARD_HEADERS]})
    await send({"type": "http.response.body", "body": body})
    return 200
