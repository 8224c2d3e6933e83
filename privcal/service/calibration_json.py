"""A calibration's JSON body, parsed and validated in a worker thread, its long arrays a
piece at a time (red team 26, service F3).

The body was validated on the event loop by one ``CalibrationBody.model_validate_json``
call: 10 MB of ``"scores": [0, 0, …]`` (5 million numbers) held every other request,
``/healthz`` and device reports included, for 2.7 s — and a pydantic call holds the GIL for
its whole length, so a worker thread alone would not have helped (red team 25, service F5,
for an ingestor's batch). Here the text is parsed once by :func:`json.loads` (C, several
times faster than the validation), each long array (more than :data:`PIECE` items) is
validated :data:`PIECE` items at a time — by the field's own type, in JSON mode, so it
accepts and refuses exactly what the whole body's validation did (an error's location is
the item's index in the body) — and the rest of the body by the model, as before. Class
labels (``list[int] | list[str]``: the union is the whole list's) and anything that is not
such a list go through the model whole, as before.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import ConfigDict, TypeAdapter, ValidationError

__all__ = ["PIECE", "as_array", "validate_calibration_json"]

#: the most items of an array one validation (or conversion) call takes
PIECE = 65_536
#: the arrays validated a piece at a time (numbers, rows of numbers, ids)
_PIECED = ("scores", "probs", "preds", "lower_preds", "upper_preds", "targets", "subjects",
           "agents", "groups")
_adapters: dict[str, TypeAdapter[Any]] = {}


def _adapter(model: Any, name: str) -> TypeAdapter[Any]:
    if name not in _adapters:
        field = model.model_fields[name]
        # the field's list type and its items' rules (``fail_fast``), not its length bounds:
        # the whole list's length is checked by the caller, as the field would
        inner = next(a for a in field.annotation.__args__ if a is not type(None))
        _adapters[name] = TypeAdapter(inner, config=ConfigDict(strict=True))
    return _adapters[name]


def validate_calibration_json(model: Any, raw: bytes, invalid: Any) -> Any:
    """``model.model_validate_json(raw)`` (``model``: the route's ``CalibrationBody``), its long
    arrays a piece at a time; ``invalid(exc, "body")`` is the error of a ValidationError (as
    the route gave it). Runs in a worker thread."""
    from pydantic_core import from_json

    try:  # the parser the model's validation uses (its numbers read the same); a key given
        # twice was refused before (json_body.check_unique_keys)
        data = from_json(raw, allow_inf_nan=True) if raw else None
    except (ValueError, RecursionError):
        data = None  # the model's own error, as before
    longest = {name: model.model_fields[name].metadata for name in _PIECED}
    pieced = {name: v for name, v in (data.items() if isinstance(data, dict) else ())
              if name in longest and isinstance(v, list) and len(v) > PIECE
              and len(v) <= _max_length(longest[name])}
    text = raw or b"null"
    if pieced:
        try:
            text = json.dumps({k: v for k, v in data.items() if k not in pieced}).encode()
        except ValueError:  # an integer past Python's 4 300 digits: the whole body, as before
            text, pieced = raw, {}
    body = _whole(model, text, invalid)
    try:
        update = {name: _pieces(model, name, v) for name, v in pieced.items()}
    except ValueError:  # an id of 4 300+ digits (json.dumps): the whole body, as before
        return _whole(model, raw, invalid)
    return body.model_copy(update=update) if update else body


def _whole(model: Any, raw: bytes, invalid: Any) -> Any:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid(exc, "body") from None


def _max_length(metadata: list[Any]) -> int:
    return min([int(m.max_length) for m in metadata if getattr(m, "max_length", None)]
               or [2**62])


def _pieces(model: Any, name: str, values: list[Any]) -> list[Any]:
    adapter = _adapter(model, name)
    out: list[Any] = []
    for i in range(0, len(values), PIECE):
        try:
            out += adapter.validate_json(json.dumps(values[i:i + PIECE]))
        except ValidationError as exc:  # the first invalid item, by its index in the body
            raise RequestValidationError([
                {**e, "loc": ("body", name, e["loc"][0] + i, *e["loc"][1:])}
                for e in exc.errors(include_input=False)]) from None
    return out


def as_array(values: list[Any], dtype: Any) -> np.ndarray:
    """``np.asarray(values, dtype)``, :data:`PIECE` items at a time (one conversion of 5
    million numbers held the GIL 0.6 s)."""
    if len(values) <= PIECE:
        return np.asarray(values, dtype=dtype)
    return np.concatenate([np.asarray(values[i:i + PIECE], dtype=dtype)
                           for i in range(0, len(values), PIECE)])
