"""JSON request bodies, parsed one way on every route: a key given twice in one object, at
any depth, is invalid JSON here (422), never "the last one wins" — ``{"cost": {"rho":
"0.01"}, "cost": {"rho": "0.5"}}`` would otherwise charge what a reader of the body's
first half does not expect.

Every router of the service makes its routes with :class:`JsonRoute`, whose requests parse
their JSON with :func:`loads_strict` (the one parse FastAPI makes of a body: FastAPI turns
its error into a 422 ``invalid-input`` problem, see :func:`invalid_json_detail`). A body
sent with another content type than JSON is answered 415 by the app's validation-error
handler (:func:`sent_as_bytes`). The routes that parse a body themselves — the calibration
route, the device report's lean path — use :func:`check_unique_keys` or an equivalent check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from privcal.errors import InvalidInput

__all__ = ["MAX_OBJECT_KEYS", "JsonRequest", "JsonRoute", "check_unique_keys",
           "invalid_json_detail", "is_json_type", "loads_strict", "sent_as_bytes"]


class DuplicateKey(json.JSONDecodeError):
    """A key given twice in one JSON object (a :class:`json.JSONDecodeError`, so that FastAPI
    answers it as it answers any invalid JSON: a 422 validation error)."""

    def __init__(self, key: str, doc: str | bytes) -> None:
        text = doc if isinstance(doc, str) else doc.decode("utf-8", "replace")
        super().__init__(f"duplicate key {key!r:.60} in one object (give each key once)",
                         text, 0)


#: the most keys one JSON object of a request may have: no route's body has an object of more
#: than a few dozen (a calibration's ``score_options``: 50), and each key past a model's own
#: is one validation error, built and sent one by one (red team 24, service F2: a 1 MB body of
#: 100 000 keys held the event loop 4 s and was answered with a 9 MB 422)
MAX_OBJECT_KEYS = 1000
TOO_MANY_KEYS = f"an object with more than {MAX_OBJECT_KEYS} keys"


class _TooManyKeys(ValueError):
    pass


class _Dup(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len(pairs) > MAX_OBJECT_KEYS:
        raise _TooManyKeys()
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Dup(k)
            seen.add(k)
    return d


def loads_strict(raw: str | bytes) -> Any:
    """``json.loads`` that refuses a key given twice in one object (:class:`DuplicateKey`), and
    an object of more than :data:`MAX_OBJECT_KEYS` keys. Bytes must be UTF-8 (a leading BOM
    aside; else UnicodeDecodeError): ``json.loads`` of bytes also reads UTF-16 and UTF-32,
    which RFC 8259 §8.1 excludes and the calibration route's parser refuses — a UTF-16 charge
    was charged (red team 26, service F5)."""
    if isinstance(raw, bytes | bytearray):
        raw = bytes(raw).decode("utf-8-sig")
    try:
        return json.loads(raw, object_pairs_hook=_pairs)
    except _Dup as exc:
        raise DuplicateKey(exc.key, raw) from None
    except _TooManyKeys:
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise json.JSONDecodeError(TOO_MANY_KEYS, text, 0) from None
    except RecursionError:  # nested past the interpreter's stack: invalid here, not a 500
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except ValueError as exc:  # an integer past Python's 4 300 digits (red team 18: a 400)
        if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
            raise
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        raise json.JSONDecodeError("a number with too many digits", text, 0) from None


#: every string token of a JSON text (group 2: followed by ':', i.e. an object key)
_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:)?', re.DOTALL)
_FEW_STRINGS = 20_000


def check_unique_keys(raw: str | bytes, what: str = "body") -> None:
    """Refuse (InvalidInput) a JSON text with a key given twice in one object; a text that
    is not JSON passes (its parser refuses it). A calibration body is mostly numbers, which
    :func:`json.loads` parses slowly: when the text has few strings and no key spelled twice
    anywhere (read from its string tokens, C-fast; a valid JSON text's tokens are read
    in order, each string whole), it cannot have a duplicate; else it is parsed with
    :func:`loads_strict` (so is one with more than :data:`MAX_OBJECT_KEYS` keys in all, which
    that parse refuses if one object holds them)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b'"') <= 2 * _FEW_STRINGS:
        keys = [k for k, colon in _STRING.findall(raw) if colon]
        # an escape can spell one key two ways ("a", "\\u0061"): then parse
        if len(set(keys)) == len(keys) <= MAX_OBJECT_KEYS \
                and not any(b"\\" in k for k in keys):
            return
    try:
        loads_strict(raw)
    except DuplicateKey as exc:
        raise InvalidInput(f"{what}: invalid JSON: {exc.msg}") from None
    except json.JSONDecodeError as exc:
        if exc.msg in ("nested too deeply", TOO_MANY_KEYS):
            raise InvalidInput(f"{what}: invalid JSON: {exc.msg}") from None
        return  # not JSON at all: the model's parser says so
    except ValueError:
        return


def is_json_type(content_type: str | bytes | None) -> bool:
    """``application/json`` or ``application/*+json`` (parameters such as charset aside)."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    main = (content_type or "").split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/")
                                          and main.endswith("+json"))


def invalid_json_detail(errors: list[dict[str, Any]]) -> str | None:
    """The one-line detail of FastAPI's error for a body that is not (strict) JSON."""
    for e in errors:
        if e.get("type") == "json_invalid":
            why = str((e.get("ctx") or {}).get("error") or "malformed")
            return f"body: invalid JSON: {why}"
    return None


def sent_as_bytes(errors: list[dict[str, Any]]) -> bool:
    """Whether FastAPI validated a JSON route's body as raw bytes: it does that for a body
    whose content type is not JSON (or missing) — a 415, not a 422."""
    return any(tuple(e.get("loc", ()))[:1] == ("body",) and isinstance(e.get("input"), bytes)
               for e in errors)


class JsonRequest(Request):
    """A request whose JSON body is parsed by :func:`loads_strict`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = loads_strict(body)
            except UnicodeDecodeError:  # FastAPI would answer 400: it is invalid JSON, 422
                raise json.JSONDecodeError("the body is not UTF-8 text", "", 0) from None
        return self._json


class JsonRoute(APIRoute):
    """An API route whose handler reads its JSON body as a :class:`JsonRequest`, and whose
    writing methods refuse a query parameter the route does not declare (422, before the
    handler runs: :mod:`privcal.service.query_params`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        from privcal.service.query_params import (
            declared_query_names,
            int_path_names,
            query_guard,
        )

        handle = super().get_route_handler()
        accepted = declared_query_names(self.dependant)  # both once per route, not per request
        int_paths = tuple(int_path_names(self.dependant))

        async def handler(request: Request) -> Response:
            await query_guard(request, accepted, int_paths)
            return await handle(JsonRequest(request.scope, request.receive))

        return handler
