"""Who is calling: bearer tokens, roles and their bindings.

Authentication runs in :class:`privcal.service.app.ServiceMiddleware` before a body is
read (so an unauthenticated request is answered 401 whatever it carries); each route
declares the roles allowed with :func:`allow` — which both enforces them (403) and
records them in the route's OpenAPI ``x-privcal-roles`` (the role-matrix test reads
them there, and fails on a route that declares none). Resources a principal is not
granted answer 404, as if they did not exist.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from privcal.errors import with_article
from privcal.service.problems import Problem, forbidden, not_found, unauthenticated
from privcal.storage.token_checks import DeviceGrant
from privcal.storage.tokens import TokenInfo

__all__ = ["ERROR_RESPONSES", "DeferredPrincipal", "Principal", "allow", "bearer", "bearer_token",
           "device_problem", "resolve_deferred", "shown_text"]

#: how much of a caller's text (a dataset name, a path segment) an answer repeats
SHOWN_CHARS = 60

bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer pcl_<id>_<secret>`")

#: problem responses every authenticated route may give (documented for every route)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": what,
           "content": {"application/problem+json": {}}}
    for code, what in (
        (401, "no token, or an expired or revoked one"),
        (403, "the token's role may not call this route"),
        (404, "not found, or not granted to this principal"),
        (409, "conflict: budget refused, idempotency key reused, report conflict"),
        (413, "request body too large"),
        (415, "a body that is not application/json"),
        (422, "invalid input"),
        (503, "ledger unavailable or schema out of date"),
    )
}


def shown_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as an answer names it: its ``repr`` (one line, control characters escaped),
    cut to its first ``limit`` characters with an ellipsis — a 5000-character path segment
    is not echoed whole in a 404 (red team 8), as ``json_body.DuplicateKey`` cuts a key."""
    if len(text) <= limit:
        return repr(text)
    cut = repr(text[:limit])
    return f"{cut[:-1]}…{cut[-1]}"


def bearer_token(scope: Any) -> str | None:
    """The bearer token of the request's ``Authorization`` header, if there is exactly one
    such header (red team 18: with two, the last one authenticated, while proxies and loggers
    read the first — a request naming two callers is unauthenticated).

    The one rule of every path that reads a token: the middleware, and the lean paths
    answered before it (:mod:`privcal.service.device_reports`,
    :mod:`privcal.service.session_reads`), which took the last of two headers until red
    team 21 (service F2: a report with two device tokens was stored and charged to the
    second's subject, where the middleware answered 401)."""
    found = [v for k, v in scope["headers"] if k == b"authorization"]
    if len(found) != 1:
        return None
    scheme, _, presented = found[0].decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    return presented.strip()


class Principal:
    """The authenticated caller: its token record and what it may see."""

    def __init__(self, token: TokenInfo) -> None:
        self.token = token

    @property
    def id(self) -> str:
        """The token id (logged; it is not a secret)."""
        return self.token.id

    @property
    def role(self) -> str:
        return self.token.role

    @property
    def requester(self) -> str:
        """What the ledger records as ``requester``: ``role:name``."""
        return self.token.principal

    def sees_all_datasets(self) -> bool:
        return self.role in ("admin", "auditor")

    def sees_dataset(self, name: str) -> bool:
        """Whether this principal may see dataset ``name``."""
        return self.sees_all_datasets() or name in self.token.datasets

    def check_dataset(self, name: str) -> None:
        """404 unless this principal may see dataset ``name`` (it may not exist at all); the
        answer names at most its first 60 characters (:func:`shown_text`)."""
        if not self.sees_dataset(name):
            raise not_found(f"unknown dataset {shown_text(name)}")

    def check_session(self, session_id: int) -> None:
        """404 unless this session-bound principal is bound to ``session_id``."""
        if self.token.session != session_id:
            raise not_found(f"unknown session {session_id}")


class DeferredPrincipal:
    """A well-formed bearer token on a device's report PUT, not yet checked against the
    ledger: the report writer checks a whole write window's tokens with one read, just
    before it writes (:func:`device_problem` answers as :func:`allow` would: 401, 403, 404).
    """

    def __init__(self, presented: tuple[str, str]) -> None:
        self.presented = presented  # (token id, SHA-256 of the secret)

    @property
    def id(self) -> str:
        return self.presented[0]


def device_problem(info: TokenInfo | DeviceGrant | None, session_id: int | None) -> Any:
    """The problem a device-report token answers with (None: it may put to this session;
    ``session_id`` None: a malformed session id, whose 422 follows a valid device token)."""
    if info is None:
        return unauthenticated()
    if info.role != "device":
        return forbidden(f"{with_article(info.role)} token may not call this route")
    if session_id is not None and info.session != session_id:
        return not_found(f"unknown session {session_id}")
    return None


async def resolve_deferred(request: Request, session_id: int | None) -> None:
    """Check a deferred device token now (before answering an input error), raising its
    401/403/404 problem if it has one."""
    import anyio

    from privcal.storage.tokens import verify_presented

    p = request.scope.get("state", {}).get("deferred")
    if p is None:
        return
    ledger = request.app.state.accountant.ledger
    info = (await anyio.to_thread.run_sync(verify_presented, ledger, [p.presented]))[0]
    problem = device_problem(info, session_id)
    if problem is not None:
        raise problem


def _principal(request: Request) -> Principal | DeferredPrincipal:
    state = request.scope.get("state", {})
    tok = state.get("principal")
    if tok is not None:
        return Principal(tok)
    if state.get("deferred") is not None:
        return state["deferred"]
    raise unauthenticated()  # the middleware authenticates every /v1 request; defence in depth


def allow(*roles: str, responses: dict[int | str, dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    """Route keyword arguments that allow exactly ``roles`` (and document it)."""
    allowed = frozenset(roles)

    async def dep(request: Request,
                  _cred: HTTPAuthorizationCredentials | None = Security(bearer)) -> Any:
        p = _principal(request)
        if isinstance(p, DeferredPrincipal):  # only a device's report PUT; see the class
            request.state.p = p
            return p
        if p.role not in allowed:
            raise forbidden(f"{with_article(p.role)} token may not call this route")
        request.state.p = p
        return p

    return {
        "dependencies": [Depends(dep)],
        "openapi_extra": {"x-privcal-roles": sorted(allowed)},
        "responses": {**ERROR_RESPONSES, **(responses or {})},
    }


async def principal(request: Request) -> Any:
    """The principal that :func:`allow` authorized (a dependency for handlers; async, so it
    costs no thread hop)."""
    p = getattr(request.state, "p", None)
    if p is None:
        raise unauthenticated()
    return p
