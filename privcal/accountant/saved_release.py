"""A release saved as JSON and loaded back, to serve a model without the ledger.

``Release.model_dump_json()`` writes every field of the stored release (threshold, score,
class names, parameters, coverage and privacy guarantees); ±∞ are written as the JSON
constants ``Infinity``/``-Infinity`` so that a +∞ threshold stays +∞ (never ``null``, never
a finite number). :func:`load_release` reads it back into a
:class:`~privcal.accountant.Release` whose prediction sets and intervals are identical.

A loaded release is a copy: it is not re-verified against the audit log (use
``privcal audit verify`` on the ledger for that), and nothing is charged by using it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from privcal.errors import InvalidInput

__all__ = ["load_release"]

M = TypeVar("M", bound=BaseModel)


def load_release(cls: type[M], source: str | bytes | os.PathLike[str]) -> M:
    """A release from a JSON document or the path of a file holding one.

    A string starting with ``{`` is read as the document itself; any other string or path
    names a file. Errors are one-line :class:`~privcal.errors.InvalidInput`.
    """
    if isinstance(source, bytes):
        text = source.decode("utf-8", errors="replace")
        where = "the JSON given"
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        text, where = source, "the JSON given"
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInput(f"no release file {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read the release file {path}: {exc}") from None
    else:
        raise InvalidInput("Release.load takes a JSON string or a file path, got "
                           f"{type(source).__name__}")
    try:
        return cls.model_validate_json(text)
    except ValidationError as exc:
        err: dict[str, Any] = dict(exc.errors()[0])
        loc = ".".join(str(p) for p in err.get("loc", ())) or "document"
        raise InvalidInput(f"{where} is not a saved release ({loc}: {err.get('msg')})") from None
