"""RFC 9457 problem documents (``application/problem+json``) with a stable ``type`` per error.

Every privcal error maps to one status and one ``type`` (:data:`PROBLEM_TYPES`); clients
match on ``type``, never on ``detail``. A budget refusal carries ``scope``, ``asked`` and
``remaining``. Validation errors list where the request was wrong but never echo the
submitted value (it may be a score, a report, a token).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse

from privcal.errors import (
    AlreadyExists,
    AuditFailed,
    BudgetRefused,
    InfeasiblePlan,
    InvalidInput,
    LedgerError,
    NotFound,
    PlanRejected,
    PrivcalError,
    SchemaOutOfDate,
)

__all__ = ["PROBLEM_TYPES", "Problem", "ProblemError", "problem_for", "problem_response",
           "report_writer_busy", "send_server_error", "server_error_response"]

log = logging.getLogger("privcal.service")

MEDIA_TYPE = "application/problem+json"
_BASE = "urn:privcal:problem:"

#: (status, type slug, title) per error; the most specific class first
PROBLEM_TYPES: list[tuple[type[PrivcalError], int, str, str]] = [
    (BudgetRefused, 409, "budget-refused", "Budget refused"),
    (InfeasiblePlan, 422, "infeasible-plan", "No valid plan for these parameters"),
    (PlanRejected, 409, "rejected", "Rejected by the collection session"),
    (InvalidInput, 422, "invalid-input", "Invalid input"),
    (NotFound, 404, "not-found", "Not found"),
    (AlreadyExists, 409, "already-exists", "Already exists"),
    (SchemaOutOfDate, 503, "schema-out-of-date", "Ledger schema out of date"),
    (LedgerError, 503, "ledger-unavailable", "Ledger unavailable"),
    (AuditFailed, 409, "audit-failed", "Audit verification failed"),
    (PrivcalError, 422, "error", "Request failed"),
]


class Problem(BaseModel):
    """An RFC 9457 problem document (extension members allowed)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None


class ProblemError(Exception):
    """Raised by the service itself (auth, idempotency, limits) to answer with a problem."""

    def __init__(self, status: int, slug: str, title: str, detail: str = "",
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail or title)
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers or {}
        self.extra = extra


def problem_for(exc: PrivcalError) -> ProblemError:
    """The problem a library error answers with.

    A :class:`~privcal.errors.LedgerError` whose ``public`` text is set answers with that
    text, never its message (which names the ledger's URL or file, or the driver's error:
    for the operator only, even an unauthenticated ``/readyz`` gets this 503); the full
    message is logged at warning level on the ``privcal.service`` logger."""
    for cls, status, slug, title in PROBLEM_TYPES:
        if isinstance(exc, cls):
            extra: dict[str, Any] = {}
            if isinstance(exc, BudgetRefused):
                extra = {"scope": exc.scope, "asked": exc.asked, "remaining": exc.remaining,
                         **getattr(exc, "details", {})}
            detail = str(exc)
            if isinstance(exc, LedgerError | SchemaOutOfDate):
                public = getattr(exc, "public", None)
                if public is not None:
                    log.warning("ledger unavailable: %s", detail)
                    detail = public
            return ProblemError(status, slug, title, detail, **extra)
    raise AssertionError("PrivcalError is the last entry")  # pragma: no cover


#: the most characters of a problem's ``detail`` sent (the rest cut, with "…"): a message
#: naming what the request held — every array of an upload, every column of a table — grew
#: with it (red team 25, service F4: 479 KB naming 70 000 members of an .npz)
DETAIL_CHARS = 2000


def problem_response(p: ProblemError, instance: str | None = None) -> JSONResponse:
    """The JSON response of a problem (its detail cut to :data:`DETAIL_CHARS`)."""
    body: dict[str, Any] = {"type": _BASE + p.slug, "title": p.title, "status": p.status}
    if p.detail:
        body["detail"] = (p.detail if len(p.detail) <= DETAIL_CHARS
                          else p.detail[:DETAIL_CHARS - 1] + "…")
    if instance:
        body["instance"] = instance
    body.update(p.extra)
    return JSONResponse(body, status_code=p.status, headers=p.headers, media_type=MEDIA_TYPE)


def unauthenticated(detail: str = "a valid bearer token is required") -> ProblemError:
    """401 with ``WWW-Authenticate: Bearer``."""
    return ProblemError(401, "unauthenticated", "Unauthenticated", detail,
                        headers={"WWW-Authenticate": 'Bearer realm="privcal"'})


def forbidden(detail: str) -> ProblemError:
    """403: authenticated, but the role may not do this."""
    return ProblemError(403, "forbidden", "Forbidden for this role", detail)


def not_found(detail: str) -> ProblemError:
    """404: missing, or not granted to this principal (indistinguishable on purpose)."""
    return ProblemError(404, "not-found", "Not found", detail)


def unsupported_media_type(accepted: str) -> ProblemError:
    """415: a body in another format than the route reads."""
    return ProblemError(415, "unsupported-media-type", "Unsupported media type",
                        f"send the body as {accepted}")


def report_writer_busy() -> ProblemError:
    """503 for a device report or agent message the report writer had not taken into a
    batch when its request stopped waiting (:mod:`privcal.service.batcher`): it was not
    stored, and never will be."""
    return ProblemError(
        503, "report-writer-busy", "Report writer busy",
        "the ledger did not take this report in time; it was not stored: send it again, "
        "with the same report id and the same value", headers={"Retry-After": "1"})


def server_error_response(_request: Any, _exc: Exception) -> JSONResponse:
    """The 500 of an exception no handler took: a problem document saying nothing of the
    exception (the server's log has it), with the standard headers set here — Starlette
    sends it from its outermost middleware, outside the one that adds them to every other
    answer (:mod:`privcal.service.response_headers`; the review of red team 19)."""
    from privcal.service.response_headers import STANDARD_HEADERS

    resp = problem_response(ProblemError(500, "internal-error", "Internal server error",
                                         "the server failed; its log says why"))
    for name, value in STANDARD_HEADERS:
        resp.headers[name.decode()] = value.decode()
    return resp


async def send_server_error(scope: Any, send: Any, exc: Exception) -> None:
    """Send :func:`server_error_response`'s 500 for ``exc`` (logged with its traceback on the
    ``privcal.service`` logger, as uvicorn logs one that reaches the whole app's handler):
    the lean paths answered before the app (:mod:`privcal.service.device_reports`,
    :mod:`privcal.service.session_reads`) let an unexpected error escape to uvicorn, a bare
    ``text/plain`` or empty 500 without the standard headers (red team 21, service F3)."""
    log.error("unexpected error answering a %s request", scope.get("method"), exc_info=exc)

    async def _nothing() -> Any:
        return {"type": "http.disconnect"}

    await server_error_response(None, exc)(scope, _nothing, send)
