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

from privcal.service.problems import Problem, forbidden, not_found, unauthenticated
from privcal.storage.tokens import TokenInfo

__all__ = ["ERROR_RESPONSES", "Principal", "allow", "bearer"]

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
        (422, "invalid input"),
        (503, "ledger unavailable or schema out of date"),
    )
}


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

    def check_dataset(self, name: str) -> None:
        """404 unless this principal may see dataset ``name`` (it may not exist at all)."""
        if not self.sees_all_datasets() and name not in self.token.datasets:
            raise not_found(f"unknown dataset {name!r}")

    def check_session(self, session_id: int) -> None:
        """404 unless this session-bound principal is bound to ``session_id``."""
        if self.token.session != session_id:
            raise not_found(f"unknown session {session_id}")


def _principal(request: Request) -> Principal:
    tok = request.scope.get("state", {}).get("principal")
    if tok is None:  # the middleware authenticates every /v1 request; defence in depth
        raise unauthenticated()
    return Principal(tok)


def allow(*roles: str, responses: dict[int | str, dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    """Route keyword arguments that allow exactly ``roles`` (and document it)."""
    allowed = frozenset(roles)

    def dep(request: Request,
            _cred: HTTPAuthorizationCredentials | None = Security(bearer)) -> Principal:
        p = _principal(request)
        if p.role not in allowed:
            raise forbidden(f"a {p.role} token may not call this route")
        request.state.p = p
        return p

    return {
        "dependencies": [Depends(dep)],
        "openapi_extra": {"x-privcal-roles": sorted(allowed)},
        "responses": {**ERROR_RESPONSES, **(responses or {})},
    }


def principal(request: Request) -> Principal:
    """The principal that :func:`allow` authorized (a dependency for handlers)."""
    p = getattr(request.state, "p", None)
    if p is None:
        raise unauthenticated()
    return p
