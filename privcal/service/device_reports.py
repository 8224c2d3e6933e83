"""The lean path of a device's report PUT (``PUT /v1/sessions/{sid}/reports/{report_id}``),
the service's hot path: thousands of devices each putting one small JSON body.

FastAPI's routing, dependency solving and pydantic validation, and Starlette's middleware
stack, cost ≈ 1 ms of CPU per request, more than the whole batched write of the report.
So :class:`privcal.service.app.PrivcalApp` answers a *well-formed* device report before
the framework (:func:`try_lean`): a JSON content type, a Content-Length within
:data:`REPORT_BODY_LIMIT`, a well-formed bearer token, valid session and report ids, and a
body that is exactly a valid :class:`privcal.service.routes_sessions.ReportBody` (a JSON object with
exactly ``round``, an integer in [0, 10⁶], and ``value``, the integer 0 or 1 — strict:
``true``/``1.0`` are refused). It hands the report to the report writer with the token
still unchecked (the writer checks the batch's tokens in bulk just before it writes:
revoked/expired 401, other role 403, other session 404) and sends the outcome (201
accepted, 200 duplicate, 409 problem).

Anything else — a query string, a missing or malformed token, a malformed session id or report id,
another content type, a body that is not exactly a valid report — goes, its body
replayed, through the whole app (:class:`privcal.service.app.ServiceMiddleware` and the
FastAPI route), which answers it as before (the route's OpenAPI entry documents the
route; its problem documents the errors). So the lean path changes the cost of a valid
report, never an answer.

A report's body is at most :data:`REPORT_BODY_LIMIT` bytes, on either path (the
middleware answers a longer one 413 before reading past the limit): its token is checked
only after the body is read, so a larger limit let anyone with a made-up token of the
right shape have the server read and parse megabytes before its 401.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from privcal.errors import PrivcalError
from privcal.service.problems import (
    ProblemError,
    problem_for,
    problem_response,
    send_server_error,
)
from privcal.service.response_headers import with_standard_headers
from privcal.storage.releases import MAX_STORED_ID

__all__ = ["REPORT_BODY_LIMIT", "REPORT_ROUTE", "lean_target", "parse_report", "put_report",
           "try_lean"]

#: the body limit of a device's report PUT, in bytes: a valid report,
#: ``{"round": 1000000, "value": 1}``, is under 40, even generously spaced
REPORT_BODY_LIMIT = 1024

#: the route template the access log names for a device report
REPORT_ROUTE = "/v1/sessions/{sid}/reports/{report_id}"
_LEAN_PATH = re.compile(r"^/v1/sessions/([1-9][0-9]{0,9})/reports/[A-Za-z0-9._~-]{1,128}$")
_SID_MAX = MAX_STORED_ID  # the largest id a ledger holds
_HEADERS_JSON = (b"content-type", b"application/json")


def lean_target(scope: Scope) -> int | None:
    """The session id of a report PUT the lean path may answer (a valid session id and
    report id, a JSON content type, no query string); None: leave it to the FastAPI route
    (which refuses a query parameter it does not declare: :mod:`privcal.service.query_params`)."""
    m = _LEAN_PATH.match(scope["path"])
    if m is None or scope.get("query_string"):
        return None
    sid = int(m.group(1))
    if sid > _SID_MAX:
        return None
    ctype = b""
    for k, v in scope["headers"]:
        if k == b"content-type":
            ctype = v
            break
    main = ctype.split(b";", 1)[0].strip().lower()
    if main != b"application/json" and not (main.startswith(b"application/")
                                            and main.endswith(b"+json")):
        return None  # FastAPI (strict content type) refuses it: let it say so
    return sid


def parse_report(body: bytes) -> tuple[int, int] | None:
    """(round, value) if ``body`` is exactly a valid ``ReportBody``; else None.

    The same rules as the pydantic model (``strict=True, extra="forbid"``, round in
    [0, 1 000 000], value in {0, 1}); ``json.loads`` is what FastAPI parses with. A key
    given twice is not a valid report (the app answers it 422,
    :mod:`privcal.service.json_body`): two keys whose values are numbers are exactly four
    ``"`` in the body, and a third key (a repeat) would add its own.
    """
    try:
        d = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # `[[[…`: the app's 422
        return None
    if type(d) is not dict or len(d) != 2 or body.count(b'"') != 4:
        return None
    rnd, value = d.get("round"), d.get("value")
    if type(rnd) is not int or type(value) is not int:  # bool and float are refused
        return None
    if not 0 <= rnd <= 1_000_000 or value not in (0, 1):
        return None
    return rnd, value


async def try_lean(scope: Scope, receive: Receive, send: Send, *,
                   body_limit: int) -> int | bytes | None:
    """Answer ``scope`` if it is a valid device report: the status sent. None: not one,
    nothing read (the app answers it); bytes: not one, this body was read (the app answers
    it with the body replayed). A Content-Length over ``body_limit`` or
    :data:`REPORT_BODY_LIMIT` is not read here."""
    from privcal.service.auth import DeferredPrincipal, bearer_token
    from privcal.storage.tokens import presented_token

    sid = lean_target(scope)
    if sid is None:
        return None
    length = None
    for k, v in scope["headers"]:
        if k == b"content-length":
            length = v
    limit = min(body_limit, REPORT_BODY_LIMIT)
    if length is None or not length.isdigit() or int(length) > limit:
        return None  # over the limit: the middleware answers 413, nothing read
    # the middleware's rule (two Authorization headers: none; red team 21, service F2)
    presented = presented_token(bearer_token(scope) or "")
    if presented is None:
        return None
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return 0  # the client went away: nothing to answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    parsed = parse_report(body)
    if parsed is None:
        return body
    scope.setdefault("state", {})["deferred"] = DeferredPrincipal(presented)
    status = {"code": 0}

    async def send_noted(message: Message) -> None:
        if message["type"] == "http.response.start":
            status["code"] = message["status"]
            message["headers"] = with_standard_headers(list(message.get("headers", ())))
        await send(message)

    await put_report(scope, send_noted, sid, *parsed)
    return status["code"]


async def put_report(scope: Scope, send: Send, sid: int, rnd: int, value: int) -> None:
    """Queue the report for the writer (its token unchecked: ``scope``'s deferred principal)
    and send the outcome: 201/200 JSON, or the problem document."""
    from privcal.service.auth import DeferredPrincipal

    deferred: DeferredPrincipal = scope["state"]["deferred"]
    batcher = scope["app"].state.batcher
    try:
        out = await batcher.submit_async(sid, None, rnd, value, token=deferred.presented)
    except ProblemError as p:
        await _send_problem(scope, send, p)
        return
    except PrivcalError as exc:
        await _send_problem(scope, send, problem_for(exc))
        return
    except Exception as exc:  # the app's 500 (red team 21, service F3)
        await send_server_error(scope, send, exc)
        return
    if out.status == "rejected":
        await _send_problem(scope, send, ProblemError(
            409, "report-rejected", "Report rejected", out.reason or "rejected",
            reason=out.reason))
        return
    status = 201 if out.status == "accepted" else 200
    body = b'{"status":"%s","session":%d}' % (out.status.encode(), sid)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), _HEADERS_JSON]})
    await send({"type": "http.response.body", "body": body})


async def _send_problem(scope: Scope, send: Send, p: ProblemError) -> None:
    async def _nothing() -> Any:
        return {"type": "http.disconnect"}

    await problem_response(p)(scope, _nothing, send)
