"""Calibrations: ``POST /v1/datasets/{name}/calibrations`` (JSON arrays or uploaded files,
see :mod:`privcal.service.uploads`), ``?dry_run=true`` for the cost only.

The body is the library's :class:`~privcal.accountant.calibration_request.CalibrationRequest`
(classification, regression with ``preds``/``targets`` and ``score_range``, Mondrian
``mondrian``/``groups`` with ``public_groups``, several levels as a list ``alpha``), so a
request is refused or charged exactly as ``privcal calibrate`` would refuse or charge it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Header, Query, Request
from starlette.responses import JSONResponse

from privcal.accountant.calibration_request import ARRAYS
from privcal.service.auth import Principal, allow, principal
from privcal.service.common import IDEMPOTENCY_HEADER, bound_in_library, doc, idempotent
from privcal.service.fed_limits import check_fed_work
from privcal.service.json_body import JsonRoute
from privcal.service.routes_datasets import _acct, _lib_key
from privcal.service.uploads import (
    CalibrationInput,
    calibration_input,
    load_arrays,
    request_body_openapi,
)

router = APIRouter(prefix="/v1", route_class=JsonRoute)

_route = allow("analyst", responses={
    415: {"description": "neither application/json nor multipart/form-data",
          "content": {"application/problem+json": {}}}})
_route["openapi_extra"]["requestBody"] = request_body_openapi()


@router.post("/datasets/{name}/calibrations", status_code=201, **_route)
def calibrate(name: str, request: Request,
              inp: CalibrationInput = Depends(calibration_input),
              p: Principal = Depends(principal),
              dry_run: bool = Query(default=False),
              idempotency_key: str | None = Header(default=None, alias=IDEMPOTENCY_HEADER,
                                                   max_length=200)) -> JSONResponse:
    """Charge, calibrate and release (201 + Location); ``?dry_run=true``: cost only, no write.

    The data come as JSON arrays or as uploaded ``.npy/.npz/.csv/.parquet`` files (a
    multipart form; read as the CLI reads them). A replay is matched on the method,
    parameters and the data's *shape* — never on the data values, of which the ledger
    stores no fingerprint (DESIGN.md).
    """
    from privcal.accountant import calibration

    p.check_dataset(name)
    body = inp.body
    arrays = load_arrays(inp, shape_only=dry_run)
    _check_fed_work(body.method, arrays.get("agents"), body.params.get("agents_planned"))
    req = body.request(arrays)
    if dry_run:
        rep = calibration.dry_run(_acct(request), req, dataset=name)
        return JSONResponse(doc(rep), status_code=200)

    def run() -> tuple[int, Any]:
        key = _lib_key(p, idempotency_key or "")
        request.state.replayed = bound_in_library(request, name, key)  # 200, not 201 (F1)
        rel = calibration.calibrate(_acct(request), req, dataset=name, requester=p.requester,
                                    idempotency_key=key)
        return (200 if request.state.replayed else 201), rel

    # a replay is matched on every option and the data's shape, never on data values
    shape = {k: list(np.shape(arrays[k])) for k in ARRAYS if arrays[k] is not None}
    resp = idempotent(request, idempotency_key,
                      {"dataset": name, **body.model_dump(exclude=set(ARRAYS)),
                       "classes": arrays["classes"], "shape": shape}, run)
    rid = json.loads(resp.body).get("id")
    if rid is not None:
        resp.headers["Location"] = f"/v1/releases/{rid}"
    return resp


def _check_fed_work(method: str, agents: Any, planned: Any) -> None:
    """A federated calibration plans as a session does: at most what
    :mod:`privcal.service.fed_limits` allows a request (422, nothing planned or charged) —
    for its agents, or for the ``agents_planned`` it asks the plan to be for (red team 15:
    one agent with agents_planned = 10 000 planned for minutes)."""
    if method not in ("fedcp-qq", "fedcp2-qq"):
        return
    a = np.asarray(agents) if agents is not None else None
    if a is None or a.ndim != 1 or a.size == 0:
        return  # the library's one-line error for missing or malformed agent ids
    _, sizes = np.unique(a.astype(str), return_counts=True)
    check_fed_work(_planned(planned), [int(c) for c in sizes], method == "fedcp2-qq")


def _planned(value: Any) -> int | None:
    """``agents_planned`` as the library reads it (lax: 1e4, "10000"; red team 15), or None
    for a value it refuses (its own one-line error)."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(int).validate_python(value) if value is not None else None
    except ValidationError:
        return None


__all__ = ["router"]
