"""The body of ``POST /v1/sessions/{sid}/batches`` (an ingestor's batch), parsed and
validated off the event loop (red team 25, service F5).

FastAPI validates a body declared as a model on the event loop, before a sync handler's
thread starts: an ingestor's batch of 330 000 rows (16 MB) — the shuffler forwarding what it
shuffled — held every other request, ``/healthz`` included, for 3.2 s. :func:`batch_body`
is a sync dependency (FastAPI runs it in a worker thread) over the raw bytes, and validates
the rows a few thousand at a time, since pydantic holds the GIL for a whole call. Its
errors are the ones FastAPI gave (422 ``invalid-input``, locations ``body.reports.N.…``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from privcal.errors import InvalidInput

__all__ = ["MAX_BATCH_ROWS", "BatchBody", "BatchRow", "batch_body", "dumped", "openapi_schema",
           "raw_json"]

#: the most rows of one batch
MAX_BATCH_ROWS = 1_000_000


class BatchRow(BaseModel):
    """One row of an ingestor batch. ``round`` (the round whose query the report answers)
    is required on every row of an ldp-score batch — a batch without it is 422, nothing
    written — and may be left out for a federated session (one round)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    subject: str = Field(min_length=1, max_length=200)
    #: finite, as an agent's own message (``MessageBody``): JSON's ``Infinity`` or an
    #: overflowing ``1e400`` (+inf to Python's parser) was stored as a FedCP-QQ message +∞
    #: (red team 25, fedlocal F3); 422, nothing written
    value: float = Field(allow_inf_nan=False)
    round: int | None = Field(default=None, ge=0, le=1_000_000)


class BatchBody(BaseModel):
    """``POST /v1/sessions/{sid}/batches``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    #: stops at its first invalid row (red team 24, service F2: one 422 error per row)
    reports: Annotated[list[BatchRow], Field(fail_fast=True)] = Field(min_length=1,
                                                                      max_length=MAX_BATCH_ROWS)


async def raw_json(request: Request) -> bytes:
    """The request's body, read (a JSON content type, else 415 as on every JSON route)."""
    from starlette.requests import ClientDisconnect

    from privcal.service.json_body import is_json_type
    from privcal.service.problems import unsupported_media_type

    try:
        raw = await request.body()
    except ClientDisconnect:  # gone mid-body: one line, no traceback (as a calibration's)
        raise InvalidInput("the request body was cut off: the client disconnected") from None
    if not is_json_type(request.headers.get("content-type")):
        raise unsupported_media_type("application/json")
    return raw


def batch_body(raw: bytes = Depends(raw_json)) -> BatchBody:
    """The batch, parsed and validated in a worker thread (a sync dependency): FastAPI
    validates a declared body on the event loop, and 330 000 rows (16 MB) held every other
    request 3.2 s (red team 25, service F5). Errors as FastAPI gives them (422, ``body.…``)."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from privcal.service.json_body import loads_strict

    try:
        data = loads_strict(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "the body is not UTF-8 text"
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else exc.start
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", pos),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": msg}}]) from None
    rows = data.get("reports") if isinstance(data, dict) and set(data) == {"reports"} else None
    if isinstance(rows, list) and 1 <= len(rows) <= MAX_BATCH_ROWS:
        # the rows a few thousand at a time: pydantic holds the GIL for a whole call (1.4 s
        # for 330 000 rows), so the event loop runs between the pieces
        out: list[BatchRow] = []
        for i in range(0, len(rows), _PIECE):
            try:
                out += _ROWS.validate_python(rows[i:i + _PIECE])
            except ValidationError as exc:  # the first invalid row, by its index in the body
                raise RequestValidationError([
                    {**e, "loc": ("body", "reports", e["loc"][0] + i, *e["loc"][1:])}
                    for e in exc.errors(include_input=False)]) from None
        return BatchBody.model_construct(reports=out)
    try:  # not an object of a non-empty list of rows: the model's own errors
        return BatchBody.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors(include_input=False)]) from None


def dumped(body: BatchBody) -> dict[str, Any]:
    """``body.model_dump()``, the rows a few thousand at a time (one pydantic call holds the
    GIL for all of them: red team 26, service F1) — the batch's idempotency fingerprint."""
    rows = body.reports
    return {"reports": [d for i in range(0, len(rows), _PIECE)
                        for d in _ROWS.dump_python(rows[i:i + _PIECE])]}


#: the rows of a batch, validated a piece at a time (:func:`batch_body`)
_ROWS: TypeAdapter[list[BatchRow]] = TypeAdapter(
    Annotated[list[BatchRow], Field(fail_fast=True)])
_PIECE = 4096


def openapi_schema() -> dict[str, Any]:
    """:class:`BatchBody`'s JSON schema with its ``$defs`` inlined (the route's OpenAPI
    ``requestBody``: a ``#/$defs/…`` reference would point at the OpenAPI document's root)."""
    schema = BatchBody.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(x: Any) -> Any:
        if isinstance(x, dict):
            if "$ref" in x:
                return inline(defs[x["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in x.items()}
        if isinstance(x, list):
            return [inline(v) for v in x]
        return x

    return dict(inline(schema))
