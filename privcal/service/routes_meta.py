"""Health, identity, the calibrator catalogue, and token administration."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from privcal.errors import InvalidInput, PrivcalError
from privcal.service.auth import Principal, allow, principal
from privcal.service.common import doc, public
from privcal.service.json_body import JsonRoute
from privcal.service.problems import ProblemError, problem_for, problem_response

router = APIRouter(route_class=JsonRoute)

ALL_ROLES = ("admin", "analyst", "auditor", "device", "agent", "ingestor")


@router.get("/healthz", **public())
def healthz() -> dict[str, str]:
    """The process is up (no ledger access)."""
    return {"status": "ok"}


@router.get("/readyz", **public(), responses={503: {"description": "ledger not ready"}})
def readyz(request: Request) -> Any:
    """The ledger is reachable and its schema is current; else 503."""
    try:
        rev = request.app.state.accountant.ledger.check()
    except PrivcalError as exc:
        return problem_response(problem_for(exc))
    return {"status": "ready", "schema": rev}


@router.get("/v1/whoami", **allow(*ALL_ROLES))
def whoami(request: Request, p: Principal = Depends(principal)) -> dict[str, Any]:
    """The caller's token id, role, name and grants (never its secret).

    A device token's answer also says in which round its subject's report was stored in
    its session (``reported_rounds``: empty, or that one round — a subject reports once per
    session), an agent token's whether its message was stored (``sent``), so that a client
    that lost its local state does not draw and send a second randomized answer
    (:mod:`privcal.client.http`). One primary-key read of the ledger, for those two roles
    only."""
    t = p.token
    out = {"id": t.id, "principal": p.requester, "role": t.role, "datasets": t.datasets,
           "session": t.session, "subject": t.subject, "agent": t.agent,
           "expires_at": t.expires_at}
    who = t.subject if t.role == "device" else t.agent if t.role == "agent" else None
    if t.session is not None and who is not None:
        from privcal.storage.tokens import stored_reports

        stored = stored_reports(request.app.state.accountant.ledger, t.session, [who])
        if t.role == "device":
            out["reported_rounds"] = sorted(int(r) for r, _ in stored.values())
        else:
            out["sent"] = bool(stored)
    return doc(out)


@router.get("/v1/methods", **allow(*ALL_ROLES))
def methods() -> list[dict[str, Any]]:
    """Every calibrator with its parameter schema."""
    from privcal.calibrators import registry

    out = []
    for name in registry.names():
        reg = registry.get(name)
        cal = reg.calibrator
        out.append({"name": name, "version": cal.version,
                    "privacy_model": getattr(cal, "privacy_model", None),
                    "inputs": list(getattr(cal, "inputs", ())),
                    "params": cal.Params.model_json_schema()})
    return doc(out)


class TokenCreate(BaseModel):
    """``POST /v1/tokens``: a role and its bindings."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["admin", "analyst", "auditor", "device", "agent", "ingestor"]
    name: str | None = Field(default=None, min_length=1, max_length=200)
    dataset: str | None = Field(default=None, min_length=1, max_length=200)
    datasets: list[str] | None = Field(default=None, max_length=1000)
    session: int | None = Field(default=None, ge=1)
    subject: str | None = Field(default=None, min_length=1, max_length=200)
    agent: str | None = Field(default=None, min_length=1, max_length=200)
    expires_in: int | None = Field(default=None, ge=1, le=10 * 366 * 86400)


def create_bound_token(acct: Any, role: str, *, name: str | None, datasets: list[str],
                       session: int | None, subject: str | None, agent: str | None,
                       expires_in: timedelta | None) -> Any:
    """Check the token's texts (a subject or agent id by the library's rule for ids,
    :func:`~privcal.calibrators.validation.id_strings`: NFC, no NUL, no blank at its ends;
    a name or dataset name without control characters) and that what it is bound to
    exists, then create it (API and CLI). A bad input writes nothing (422)."""
    from privcal.storage.tokens import check_bindings, create_token, token_texts

    for v, what in ((subject, "subject"), (agent, "agent")):
        if v is not None:
            _check_id(v, what)
    name, datasets, subject, agent = token_texts(name=name, datasets=datasets,
                                                 subject=subject, agent=agent)
    check_bindings(role, datasets=datasets, session=session, subject=subject, agent=agent)
    for d in datasets:
        acct.dataset(d)  # NotFound
    if session is not None:
        _check_session_binding(acct, role, session)
    return create_token(acct.ledger, role, name=name, datasets=datasets, session=session,
                        subject=subject, agent=agent, expires_in=expires_in)


def create_bound_device_tokens(acct: Any, session: int, subjects: Sequence[str],
                               expires_in: timedelta | None) -> list[str]:
    """One device token per subject (distinct ids) of an existing, unshuffled ldp-score
    session, in one transaction (CLI ``token create --count``); the tokens in the order of
    ``subjects``, shown this once."""
    from privcal.calibrators.validation import id_strings
    from privcal.storage.token_bulk import create_device_tokens

    if isinstance(session, bool) or not isinstance(session, int) or session < 1:
        raise InvalidInput("session must be a positive integer")
    id_strings(list(subjects), "subject ids")  # the library's rule for ids (InvalidInput)
    _check_session_binding(acct, "device", session)
    return create_device_tokens(acct.ledger, session, subjects, expires_in=expires_in)


def _check_id(v: Any, what: str) -> None:
    """InvalidInput unless ``v`` is one id by the library's rule (the one a session applies
    to the ids it is sent: a token whose subject it refuses could never report)."""
    from privcal.calibrators.validation import id_strings

    if not isinstance(v, str):
        raise InvalidInput(f"{what} must be text")
    try:
        id_strings([v], what)
    except InvalidInput as exc:
        raise InvalidInput(str(exc).replace(f"{what}: row 0 ", f"{what} ", 1)) from None


def _check_session_binding(acct: Any, role: str, session: int) -> None:
    """The session exists (NotFound) and takes tokens of ``role``: device tokens for an
    ldp-score session, agent tokens for a federated one, neither for a shuffled one."""
    from privcal.accountant.sessions import session_status

    info = session_status(acct, session)
    fed = info.method != "ldp-score"
    if role == "device" and fed:
        raise InvalidInput(f"session {session} is federated ({info.method}): give its "
                           "agents agent tokens, not device tokens")
    if role == "agent" and not fed:
        raise InvalidInput(f"session {session} is {info.method}: agent tokens are for "
                           "federated sessions")
    if role in ("device", "agent") and info.shuffled:
        raise InvalidInput(f"session {session} is shuffled: reports reach it only through "
                           "its ingestor (create an ingestor token)")


@router.post("/v1/tokens", status_code=201, **allow("admin"))
def token_create(body: TokenCreate, request: Request) -> JSONResponse:
    """Create a token; the token string is in this response only."""
    ds = list(body.datasets or []) + ([body.dataset] if body.dataset else [])
    new = create_bound_token(
        request.app.state.accountant, body.role, name=body.name, datasets=ds,
        session=body.session, subject=body.subject, agent=body.agent,
        expires_in=timedelta(seconds=body.expires_in) if body.expires_in else None)
    return JSONResponse(doc({"id": new.id, "token": new.token, "info": new.info}),
                        status_code=201, headers={"Location": f"/v1/tokens/{new.id}",
                                                  "Cache-Control": "no-store"})


@router.get("/v1/tokens", **allow("admin"))
def token_list(request: Request) -> list[dict[str, Any]]:
    """Every token (ids, roles, bindings, expiry, revocation; no secrets)."""
    from privcal.storage.tokens import list_tokens

    return doc(list_tokens(request.app.state.accountant.ledger))


@router.delete("/v1/tokens/{token_id}", **allow("admin"))
def token_revoke(token_id: str, request: Request) -> dict[str, Any]:
    """Revoke a token now."""
    from privcal.storage.tokens import revoke_token

    if not re.fullmatch("[0-9a-f]{16}", token_id):  # not a token id (a NUL, …): none such
        raise ProblemError(404, "not-found", "Not found", "unknown token")
    return doc(revoke_token(request.app.state.accountant.ledger, token_id))
