"""Unknown query parameters of a writing route are refused, not ignored (red team 6).

A route that charges or writes (``POST``, ``PUT``, ``PATCH``, ``DELETE``) answers a query
parameter it does not declare with 422 ``invalid-input`` naming it, before its handler
runs: nothing is charged, nothing written. Otherwise ``POST /v1/datasets/{name}/sessions
?dry_run=true`` — a parameter only the calibration route takes — opened and charged a
session while the caller believed it was a dry run. The parameters a route accepts are
the ones FastAPI reads for it (its own and its dependencies' ``Query`` parameters), so a
route's accepted set is declared once, in its signature. Reads (``GET``) are unchanged.

:class:`privcal.service.json_body.JsonRoute` (every ``/v1`` route) calls
:func:`query_guard`; the lean report PUT (:mod:`privcal.service.device_reports`) leaves
any request with a query string to the route.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from privcal.service.problems import ProblemError

__all__ = ["WRITE_METHODS", "declared_query_names", "query_guard"]

#: a parameter name shown in the answer (anything else is not echoed)
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,40}")
#: the methods whose unknown query parameters are refused
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def declared_query_names(dependant: Any) -> frozenset[str]:
    """The query parameter names a route reads: its own and its dependencies' (by alias)."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(f.alias for f in d.query_params)
        todo.extend(d.dependencies)
    return frozenset(names)


async def query_guard(request: Request, accepted: frozenset[str]) -> None:
    """Raise the 422 problem if a writing request has a query parameter not in ``accepted``
    (a device's deferred token is checked first: 401/403/404 come before an input error, as
    on every report route)."""
    if request.method not in WRITE_METHODS or not request.scope.get("query_string"):
        return
    unknown = sorted({k for k in request.query_params if k not in accepted})
    if not unknown:
        return
    if request.scope.get("state", {}).get("deferred") is not None:
        from privcal.service.auth import resolve_deferred

        sid = request.scope.get("path_params", {}).get("sid")
        await resolve_deferred(request, int(sid) if str(sid).isdigit() else None)
    shown = [u if _NAME.fullmatch(u) else "(a name that is not shown)" for u in unknown[:5]]
    names = ", ".join(shown) + (", …" if len(unknown) > 5 else "")
    takes = ", ".join(sorted(accepted)) if accepted else "none"
    raise ProblemError(422, "invalid-input", "Invalid input",
                       f"unknown query parameter(s): {names} (this route takes: {takes}); "
                       "nothing was done",
                       errors=[{"loc": ["query", u], "msg": "unknown query parameter",
                                "type": "extra_forbidden"} for u in shown])
