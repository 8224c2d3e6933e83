"""Health, identity, the calibrator catalogue, and token administration."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from privcal.errors import InvalidInput, PrivcalError
from privcal.service.auth import Principal, allow, principal
from privcal.service.bound_tokens import create_bound_token
from privcal.service.common import (
    IDEMPOTENCY_HEADER,
    doc,
    forget_or_owe,
    public,
    refuse_reused_or_running,
    request_fingerprint,
    reserve,
)
from privcal.service.json_body import JsonRoute
from privcal.service.problems import ProblemError, problem_for, problem_response
from privcal.storage.releases import MAX_STORED_ID
from privcal.storage.token_secrets import MAX_LIFETIME, is_token_id

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
    (:mod:`privcal.client.http`); and, for both, whether the subject or agent still has
    the session's ε0 left under its dataset's per-subject ε cap (``within_cap``; null if
    the session charges none): a report past the cap is refused only after it was sent —
    a randomized answer the server saw and the ledger does not count — so a client draws
    nothing when it is false (false also for a token whose subject the id rule refuses, made
    before the rule: its reports are refused on arrival). Primary-key reads of the ledger in
    one transaction (:func:`~privcal.storage.service_reads.subject_standing`), for those two
    roles only."""
    t = p.token
    out = {"id": t.id, "principal": p.requester, "role": t.role, "datasets": t.datasets,
           "session": t.session, "subject": t.subject, "agent": t.agent,
           "expires_at": t.expires_at}
    who = t.subject if t.role == "device" else t.agent if t.role == "agent" else None
    if t.session is not None and who is not None:
        from privcal.calibrators.validation import id_strings
        from privcal.storage.service_reads import subject_standing

        rnd, allowed = subject_standing(request.app.state.accountant.ledger, t.session, who)
        if t.role == "device":
            out["reported_rounds"] = [] if rnd is None else [int(rnd)]
        else:
            out["sent"] = rnd is not None
        try:  # a subject the id rule now refuses (a token made before it): refused on arrival
            id_strings([who], "id", people=True)
            out["within_cap"] = allowed
        except InvalidInput:
            out["within_cap"] = False
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
    #: a session id: the ledger's session ids are 32-bit (``SessionId`` of the session routes)
    session: int | None = Field(default=None, ge=1, le=MAX_STORED_ID)
    subject: str | None = Field(default=None, min_length=1, max_length=200)
    agent: str | None = Field(default=None, min_length=1, max_length=200)
    expires_in: int | None = Field(default=None, ge=1, le=int(MAX_LIFETIME.total_seconds()))


@router.post("/v1/tokens", status_code=201, **allow("admin"))
def token_create(body: TokenCreate, request: Request, p: Principal = Depends(principal),
                 idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER,
                                                      max_length=200)) -> JSONResponse:
    """Create a token; the token string is in this response only.

    An ``Idempotency-Key`` (optional) makes the create happen once: the key's record is
    completed in the token's own transaction and holds the token's id, never its secret
    (the ledger keeps no bearer secret). So a retry with the same key and body is answered
    409 ``token-already-created`` naming that token — its secret was shown once: if that
    answer was lost, revoke the token and create another under a new key — and the same
    key with another body 409 ``idempotency-key-reused``. A refused create leaves the key unused."""
    ds = list(body.datasets or []) + ([body.dataset] if body.dataset else [])
    acct = request.app.state.accountant
    keyed = (p.id, idempotency_key) if idempotency_key else None
    if keyed is not None:
        _reserve(request, keyed, body)
    try:
        new = create_bound_token(
            acct, body.role, name=body.name, datasets=ds, session=body.session,
            subject=body.subject, agent=body.agent, idempotency=keyed,
            expires_in=timedelta(seconds=body.expires_in) if body.expires_in else None)
    except BaseException:
        if keyed is not None:
            forget_or_owe(acct.ledger, *keyed)
        raise
    return JSONResponse(doc({"id": new.id, "token": new.token, "info": new.info}),
                        status_code=201, headers={"Location": f"/v1/tokens/{new.id}",
                                                  "Cache-Control": "no-store"})


def _reserve(request: Request, keyed: tuple[str, str], body: TokenCreate) -> None:
    """Reserve (principal, key) for this create, or raise the 409 saying why not: the key
    already created a token (named by its id: its record holds nothing else), was used for
    another request, or its request is still running."""
    ledger = request.app.state.accountant.ledger
    fp = request_fingerprint(ledger.subject_key(), body.model_dump())
    out = reserve(ledger, *keyed, f"POST {request.scope['route'].path}", fp)
    if out.state == "replay":
        tid = (out.response or {}).get("id") if isinstance(out.response, dict) else None
        raise ProblemError(409, "token-already-created", "Token already created",
                           f"a token was already created under this Idempotency-Key: token "
                           f"{tid}; its secret was shown once (if it was lost, revoke that "
                           "token and create another under a new Idempotency-Key)",
                           token_id=tid)
    refuse_reused_or_running(out)


@router.get("/v1/tokens", **allow("admin"))
def token_list(request: Request) -> list[dict[str, Any]]:
    """Every token (ids, roles, bindings, expiry, revocation; no secrets)."""
    from privcal.storage.tokens import list_tokens

    return doc(list_tokens(request.app.state.accountant.ledger))


@router.delete("/v1/tokens/{token_id}", **allow("admin"))
def token_revoke(token_id: str, request: Request) -> dict[str, Any]:
    """Revoke a token now."""
    from privcal.storage.tokens import revoke_token

    if not is_token_id(token_id):  # not a token id (a NUL, …): none such
        raise ProblemError(404, "not-found", "Not found", "unknown token")
    return doc(revoke_token(request.app.state.accountant.ledger, token_id))
