"""What every ``/v1`` route checks of its URL before its handler runs (red teams 6 and 8):
:func:`query_guard`, called by :class:`privcal.service.json_body.JsonRoute` for every
request of every ``/v1`` route, before its body is read, its token's bindings are checked
or anything is charged. Each refusal is one line and leaves nothing done.

- **Integer path ids are canonical** (``/v1/sessions/{sid}``, ``/v1/releases/{release_id}``:
  every path parameter a route declares as ``int``): decimal digits without a sign, spaces,
  a decimal point or leading zeros (``^[1-9][0-9]{0,9}$``), at most 2³¹−1 — the largest id
  a ledger holds (:data:`privcal.storage.releases.MAX_STORED_ID`). Anything else names no
  resource: 404 ``not-found``, as ``/v1/releases/0`` or an id past 2³¹−1 always did (the
  route's 404 for an id that names nothing; a 422 would say the request is malformed,
  while ``/v1/sessions/01`` is a well-formed path that names no session). pydantic's lax
  parsing took ``1.0``, ``+1``, ``" 1"``, ``"1 "`` and ``01`` for 1 — a ``PUT
  /v1/sessions/01/reports/a`` stored and charged a report another spelling had stored.
- **A query parameter is given once**, on every route, reads included (no route takes a
  list-valued parameter; a read's ``?limit=1&limit=1000`` is as ambiguous as a write's):
  ``?dry_run=true&dry_run=false`` was a real calibration (FastAPI takes the last value)
  while a client, proxy or log reading the first value saw a dry run. 422
  ``invalid-input``: "query parameter dry_run given twice; nothing was done" — as a JSON
  key given twice is refused (:mod:`privcal.service.json_body`).
- **An Idempotency-Key header is given once** (red team 21, service F5): with two, FastAPI
  bound the request to the first while a proxy, log or client reading the last believed
  the other was used — a retry under it charged a second time. 422 ``invalid-input``:
  "Idempotency-Key given twice; nothing was done", as two ``Authorization`` headers are
  refused (:mod:`privcal.service.auth`); and without a blank at either end (red team 22,
  service F4: ``K`` and ``K␠␠`` were two keys, and a proxy trimming one attempt's value — as
  RFC 9110 lets it: the blanks are not part of a field's value — made a retry charge twice).
- **Unknown query parameters of a writing route are refused**, not ignored: a route that
  charges or writes (``POST``, ``PUT``, ``PATCH``, ``DELETE``) answers a query parameter it
  does not declare with 422 ``invalid-input`` naming it. Otherwise ``POST
  /v1/datasets/{name}/sessions?dry_run=true`` — a parameter only the calibration route
  takes — opened and charged a session while the caller believed it was a dry run. The
  parameters a route accepts are the ones FastAPI reads for it (its own and its
  dependencies' ``Query`` parameters), so a route's accepted set is declared once, in its
  signature. Reads (``GET``) may carry unknown ones.

On a device's report PUT, whose token is checked late (:class:`~privcal.service.auth.
DeferredPrincipal`), the token is checked first: 401/403 come before these answers, as on
every other route (the middleware authenticates them before routing). The lean report PUT
(:mod:`privcal.service.device_reports`) and the lean session read
(:mod:`privcal.service.session_reads`) take canonical ids only and leave any request with a
query string to the route.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from starlette.requests import Request

from privcal.service.common import IDEMPOTENCY_HEADER
from privcal.service.problems import ProblemError, not_found
from privcal.storage.releases import MAX_STORED_ID

__all__ = ["WRITE_METHODS", "declared_query_names", "int_path_names", "query_guard"]

#: the Idempotency-Key header as ASGI gives it (lower case)
_IDEM = IDEMPOTENCY_HEADER.lower().encode()
#: a parameter name shown in the answer (anything else is not echoed)
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,40}")
#: the methods whose unknown query parameters are refused
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: a canonical path id (its value is also at most MAX_STORED_ID)
_CANONICAL_ID = re.compile(r"[1-9][0-9]{0,9}")
#: what a path id names, in its 404 ("unknown session '01'")
_ID_NOUNS = {"sid": "session", "release_id": "release"}


def declared_query_names(dependant: Any) -> frozenset[str]:
    """The query parameter names a route reads: its own and its dependencies' (by alias)."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(f.alias for f in d.query_params)
        todo.extend(d.dependencies)
    return frozenset(names)


def int_path_names(dependant: Any) -> list[str]:
    """The path parameters a route (or one of its dependencies) declares as ``int``."""
    names: list[str] = []
    todo = [dependant]
    while todo:
        d = todo.pop()
        names += [f.alias for f in d.path_params if f.field_info.annotation is int]
        todo.extend(d.dependencies)
    return names


def _canonical_id(raw: str) -> bool:
    """Whether ``raw`` is a canonical id: ``^[1-9][0-9]{0,9}$`` and at most 2³¹−1."""
    return _CANONICAL_ID.fullmatch(raw) is not None and int(raw) <= MAX_STORED_ID


async def _token_first(request: Request) -> None:
    """A device's deferred token is checked before an answer about the URL (401/403)."""
    if request.scope.get("state", {}).get("deferred") is not None:
        from privcal.service.auth import resolve_deferred

        sid = str(request.scope.get("path_params", {}).get("sid", ""))
        await resolve_deferred(request, int(sid) if _canonical_id(sid) else None)


async def _check_path_ids(request: Request, int_paths: tuple[str, ...]) -> None:
    """404 for an ``int`` path parameter (``int_paths``) that is not a canonical id (module
    docstring)."""
    params = request.scope.get("path_params", {})
    for name in int_paths:
        raw = str(params.get(name, ""))
        if _canonical_id(raw):
            continue
        await _token_first(request)
        from privcal.service.auth import shown_text

        what = _ID_NOUNS.get(name, name)
        if re.fullmatch(r"0|[1-9][0-9]{0,29}", raw):  # a plain number: 0 or too large
            raise not_found(f"unknown {what} {raw}")
        raise not_found(f"unknown {what} {shown_text(raw, 40)} (an id is written in decimal "
                        f"digits, 1 to {MAX_STORED_ID}, without sign, spaces, point or "
                        "leading zeros)")


async def query_guard(request: Request, accepted: frozenset[str],
                      int_paths: tuple[str, ...] = ()) -> None:
    """Refuse, before the handler runs, a request whose ``int`` path id (one of
    ``int_paths``: :func:`int_path_names` of its route) is not canonical (404), with a
    query parameter given more than once (422, any method) or, on a writing method, a
    query parameter not in ``accepted`` (422); see the module docstring."""
    await _check_path_ids(request, int_paths)
    given = [v for k, v in request.scope.get("headers", ()) if k == _IDEM]
    keys = len(given)
    bad = None
    if keys > 1:
        bad = (f"given {'twice' if keys == 2 else f'{keys} times'}",
               "header given more than once", "duplicate")
    elif keys == 1 and given[0] != given[0].strip(b" \t"):
        bad = ("has a blank at its start or end (a proxy may trim it, making a retry another "
               "key)", "blank at an end", "value_error")
    if bad is not None:
        await _token_first(request)
        raise ProblemError(422, "invalid-input", "Invalid input",
                           f"{IDEMPOTENCY_HEADER} {bad[0]}; nothing was done",
                           errors=[{"loc": ["header", IDEMPOTENCY_HEADER], "msg": bad[1],
                                    "type": bad[2]}])
    if not request.scope.get("query_string"):
        return
    counts = Counter(k for k, _ in request.query_params.multi_items())
    repeated = sorted(k for k, n in counts.items() if n > 1)
    if repeated:
        await _token_first(request)
        shown = [u if _NAME.fullmatch(u) else "(a name that is not shown)" for u in repeated]
        if len(shown) == 1:
            n = counts[repeated[0]]
            detail = f"query parameter {shown[0]} given {'twice' if n == 2 else f'{n} times'}"
        else:
            detail = (f"query parameters {', '.join(shown[:5])}{', …' if len(shown) > 5 else ''}"
                      " given more than once")
        raise ProblemError(422, "invalid-input", "Invalid input",
                           f"{detail}; nothing was done",
                           errors=[{"loc": ["query", u], "msg": "query parameter given more "
                                    "than once", "type": "duplicate"} for u in shown[:5]])
    if request.method not in WRITE_METHODS:
        return
    unknown = sorted({k for k in counts if k not in accepted})
    if not unknown:
        return
    await _token_first(request)
    shown = [u if _NAME.fullmatch(u) else "(a name that is not shown)" for u in unknown[:5]]
    names = ", ".join(shown) + (", …" if len(unknown) > 5 else "")
    takes = ", ".join(sorted(accepted)) if accepted else "none"
    raise ProblemError(422, "invalid-input", "Invalid input",
                       f"unknown query parameter(s): {names} (this route takes: {takes}); "
                       "nothing was done",
                       errors=[{"loc": ["query", u], "msg": "unknown query parameter",
                                "type": "extra_forbidden"} for u in shown])
