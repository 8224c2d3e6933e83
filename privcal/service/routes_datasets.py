"""Datasets, budgets and charges (calibrations: :mod:`privcal.service.routes_calibrations`)."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from privcal.accountant.normalize import SERVICE_KEY_PREFIX, ServiceKey
from privcal.errors import InvalidInput
from privcal.service.auth import Principal, allow, principal
from privcal.service.common import IDEMPOTENCY_HEADER, doc, idempotent
from privcal.service.json_body import JsonRoute

router = APIRouter(prefix="/v1", route_class=JsonRoute)

Amount = str | None


class DatasetCreate(BaseModel):
    """``POST /v1/datasets``: exactly one cap (``epsilon``, ``rho``, or both approx_*)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    epsilon: Amount = Field(default=None, max_length=60)
    rho: Amount = Field(default=None, max_length=60)
    approx_epsilon: Amount = Field(default=None, max_length=60)
    approx_delta: Amount = Field(default=None, max_length=60)
    delta: Amount = Field(default=None, max_length=60)
    subject_epsilon: Amount = Field(default=None, max_length=60)
    allow_nonprivate: bool = False
    description: str = Field(default="", max_length=10_000)
    #: (ε, δ) cap only: its Rényi orders as decimal strings, fixed for good (default grid if absent)
    renyi_orders: list[str] | None = Field(default=None, min_length=1, max_length=64)


class Cost(BaseModel):
    """A central cost as decimal strings: ``rho``, ``epsilon``, or ``epsilon`` + ``delta``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    rho: Amount = Field(default=None, max_length=60)
    epsilon: Amount = Field(default=None, max_length=60)
    delta: Amount = Field(default=None, max_length=60)

    def value(self) -> Any:
        from privcal.costs import ZCDP, ApproxDP, PureDP

        try:
            if self.rho is not None and self.epsilon is None and self.delta is None:
                return ZCDP(rho=self.rho)
            if self.epsilon is not None and self.rho is None:
                if self.delta is None:
                    return PureDP(eps=self.epsilon)
                return ApproxDP(eps=self.epsilon, delta=self.delta)
        except InvalidInput as exc:  # the cost's own one line (privcal.costs)
            raise InvalidInput(f"cost: {exc}") from None
        raise InvalidInput('cost must be {"rho": …}, {"epsilon": …} or {"epsilon": …, '
                           '"delta": …} (decimal strings)')


class ChargeBody(BaseModel):
    """``POST /v1/datasets/{name}/charges``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    cost: Cost
    purpose: str | None = Field(default=None, max_length=10_000)


def _lib_key(p: Principal, key: str) -> str:
    """The key given to the library: bound to the principal, of bounded length, in the key
    space only the service reaches (:class:`~privcal.accountant.normalize.ServiceKey`)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return ServiceKey(f"{SERVICE_KEY_PREFIX}{p.id}:{digest}")


def _acct(request: Request) -> Any:
    return request.app.state.accountant


@router.post("/datasets", status_code=201, **allow("admin"))
def dataset_create(body: DatasetCreate, request: Request) -> JSONResponse:
    """Create a dataset and its budget policy (201; Location: its URL, the name
    percent-encoded). A name the library refuses is 422, nothing created."""
    info = _acct(request).create_dataset(**body.model_dump())
    return JSONResponse(doc(info), status_code=201,
                        headers={"Location": f"/v1/datasets/{quote(info.name, safe='')}"})


@router.get("/datasets", **allow("admin", "auditor", "analyst"))
def dataset_list(request: Request, p: Principal = Depends(principal)) -> list[dict[str, Any]]:
    """Every dataset this principal may see."""
    out = _acct(request).datasets()
    return doc([d for d in out if p.sees_all_datasets() or d.name in p.token.datasets])


@router.get("/datasets/{name}", **allow("admin", "auditor", "analyst"))
def dataset_show(name: str, request: Request,
                 p: Principal = Depends(principal)) -> dict[str, Any]:
    """One dataset's policy and totals."""
    p.check_dataset(name)
    return doc(_acct(request).dataset(name))


@router.get("/datasets/{name}/budget", **allow("admin", "auditor", "analyst"))
def budget(name: str, request: Request, p: Principal = Depends(principal)) -> dict[str, Any]:
    """Cap, spent, remaining, the cap's guarantee and the realized spend (ε, δ) — the
    ``budget show --json`` document."""
    p.check_dataset(name)
    return doc(_acct(request).budget(name))


@router.get("/datasets/{name}/subjects", **allow("admin", "auditor"))
def subject_summary(name: str, request: Request) -> dict[str, Any]:
    """Per-subject local-DP spends in aggregate only (count, max, quantiles; never one subject)."""
    return doc(_acct(request).subject_summary(name))


@router.get("/datasets/{name}/spend-history", **allow("admin", "auditor"))
def spend_history(name: str, request: Request) -> dict[str, Any]:
    """The budget after each charge, in order: the points of the spend chart."""
    from privcal.accountant.report import audit_report

    rep = audit_report(_acct(request), name)[0]
    return doc({"dataset": rep.dataset, "policy": rep.policy, "guarantee": rep.guarantee,
                "points": [
        {"charge": t.charge, "at": t.at, "cost": t.cost, "used_after": t.used_after,
         "spent_dp_after": t.spent_dp_after, "subjects_charged": t.subjects_charged}
        for t in rep.timeline]})


@router.post("/datasets/{name}/charges", status_code=201, **allow("analyst"))
def charge(name: str, body: ChargeBody, request: Request,
           p: Principal = Depends(principal),
           idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER,
                                                max_length=200)) -> JSONResponse:
    """Charge a central cost; 201 with the receipt, 200 when replayed; 409 if refused."""
    p.check_dataset(name)
    cost = body.cost.value()

    def run() -> tuple[int, Any]:
        r = _acct(request).charge(name, cost, purpose=body.purpose, requester=p.requester,
                                  idempotency_key=_lib_key(p, idempotency_key or ""))
        # the receipt names the key the client sent, not the library's (red team 21, readme
        # F3: a client matching receipts by its key read "http:193cc3e8…")
        r = r.model_copy(update={"idempotency_key": idempotency_key})
        return (200 if r.replayed else 201), r  # a replay the library found: 200

    return idempotent(request, idempotency_key,
                      {"dataset": name, "cost": body.cost.model_dump(),
                       "purpose": body.purpose}, run)
