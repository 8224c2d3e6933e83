"""Argument checks shared by the storage layer, the accountant and the CLI.

Every public call that takes a name, a piece of free text or a row id runs it
through one of these before it reaches the database, so a malformed argument
is an :class:`~privcal.errors.InvalidInput` (or :class:`~privcal.errors.NotFound`)
with one line on every backend — never a driver error (PostgreSQL refuses NUL
bytes, no UTF-8 codec encodes a lone surrogate, and no SQL integer holds 2⁷⁰).
This module imports nothing from privcal but :mod:`privcal.errors`.
"""

from __future__ import annotations

from typing import Any

from privcal.errors import InvalidInput, NotFound

__all__ = ["MAX_ROW_ID", "row_id", "text", "utf8_problem"]

#: the largest id an SQL ``BIGINT`` (and SQLite's INTEGER) holds
MAX_ROW_ID = 2**63 - 1


def utf8_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text in every backend, or None if it can."""
    if "\x00" in value:
        return "contains a NUL byte"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def text(value: Any, what: str, *, limit: int = 200, allow_empty: bool = False) -> str:
    """``value`` if it is a ``str`` storable everywhere, at most ``limit`` characters long."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be text, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise InvalidInput(f"{what} is empty")
    if len(value) > limit:
        raise InvalidInput(f"{what} is longer than {limit} characters")
    problem = utf8_problem(value)
    if problem is not None:
        raise InvalidInput(f"{what} {problem}")
    return value


def row_id(value: Any, what: str) -> int:
    """A database row id given by a caller: an ``int`` (not a bool, not a string).

    An id outside 1 … 2⁶³−1 cannot name a row: :class:`NotFound`, like any other
    id that names nothing.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        import numpy as np

        if isinstance(value, np.integer):
            value = int(value)
        else:
            raise InvalidInput(f"{what} must be an integer, got {value!r:.60}")
    if not 1 <= value <= MAX_ROW_ID:
        raise NotFound(f"unknown {what} {value}")
    return value
