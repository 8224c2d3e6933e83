"""One exception hierarchy for privcal; every error carries the CLI exit code it maps to.

Exit codes (stable, documented in the README):
0 ok, 1 error, 2 usage, 3 budget refused, 4 audit verification failed,
5 ledger schema out of date.

It also holds the argument checks every layer runs before a value reaches a database
(:func:`check_text`, :func:`check_row_id`, :func:`utf8_problem`), so that a malformed
name, free text or row id is an :class:`InvalidInput` (or :class:`NotFound`) with one
line on every backend — never a driver error (PostgreSQL refuses NUL bytes, no UTF-8
codec encodes a lone surrogate, and no SQL integer holds 2⁷⁰).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar


class PrivcalError(Exception):
    """Base class. ``str(err)`` is a one-line message fit for a user."""

    exit_code: int = 1


class InvalidInput(PrivcalError, ValueError):
    """A parameter or a data file is malformed (NaN, wrong shape, α outside (0, 1), ε ≤ 0, …)."""


class NotFound(PrivcalError, LookupError):
    """A named dataset, release, session or calibrator does not exist."""


class AlreadyExists(PrivcalError):
    """A dataset (or another uniquely named object) of that name exists already."""


class LedgerError(PrivcalError):
    """The ledger cannot be reached or opened (malformed URL, server down, …).

    ``public``: what a remote client may be told, where the message names what only the
    operator should see — the ledger's URL or file, the driver's own error (the service
    answers its 503 with it and logs the message; red team 6). None: the message itself."""

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public


class BudgetRefused(PrivcalError):
    """A charge was refused: it would exceed a scope's cap, or the notions are incompatible."""

    exit_code = 3

    def __init__(
        self, message: str, *, scope: str = "", asked: str = "", remaining: str = ""
    ) -> None:
        super().__init__(message)
        self.scope = scope
        self.asked = asked
        self.remaining = remaining


class NothingAccepted(PrivcalError):
    """A batch of reports of which no row was accepted; ``details`` holds the counts
    (``accepted``, ``rejected``, ``reasons``: rows per reason, never an id)."""

    def __init__(self, message: str, *, details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})


class AuditFailed(PrivcalError):
    """The audit log, or a recorded guarantee, does not verify."""

    exit_code = 4


class SchemaOutOfDate(PrivcalError):
    """The ledger's schema is older (or newer) than this version of privcal expects."""

    exit_code = 5


class InfeasiblePlan(InvalidInput):
    """No valid protocol plan exists for these parameters (e.g. ε too small for n)."""


class PlanRejected(InvalidInput):
    """A report or message was rejected by a collection session (closed round, duplicate, …)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def numeric_edge(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a computation on public numbers (advise, amplify, a plan) so that a numeric
    failure inside the accepted bounds — an overflow, a division by zero, a degenerate pair at
    the edge of the float range, e.g. ε = 5e-324 — is a one-line :class:`InvalidInput` naming
    ``what``, not a traceback. Privcal errors pass through unchanged; nothing is computed or
    claimed when this fires."""

    def deco(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @wraps(fn)
        def inner(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(*args, **kwargs)
            except PrivcalError:
                raise
            except (ArithmeticError, ValueError) as exc:
                raise InvalidInput(
                    f"{what}: these inputs are outside the range the bounds can be computed "
                    f"for ({type(exc).__name__}: {exc})"
                ) from None

        return inner

    return deco


# ------------------------------------------ argument checks: storable everywhere, or an error above
#: the largest id an SQL ``BIGINT`` (and SQLite's INTEGER) holds
MAX_ROW_ID = 2**63 - 1


#: the characters that reorder text on screen (Unicode's bidirectional embeddings,
#: overrides, isolates and marks): in a name (a dataset's, a token's) they would make it
#: print as another (``"\u202eadmin"`` shows reversed, and so does what follows it in a
#: table, the audit report or the web UI), so names refuse them (red team 8)
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def bidi_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name because of a bidirectional control, or None."""
    found = BIDI_CONTROLS.search(value)
    if found is None:
        return None
    return (f"contains the bidirectional control U+{ord(found.group()):04X}, which reorders "
            "the text around it on screen")


#: characters that render as nothing although Python calls them printable: Unicode's
#: Default_Ignorable_Code_Point set (DerivedCoreProperties.txt: the soft hyphen, the
#: combining grapheme joiner, the Hangul fillers, the Khmer inherent vowels, the Mongolian
#: and other variation selectors, zero-width characters, tags, …) and U+2800 BRAILLE
#: PATTERN BLANK. ``"alice\ufe0f"`` prints as ``alice`` and was another subject with a cap
#: of its own (red team 10; red team 6 had refused the non-printable ones)
READS_AS_NOTHING = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")

#: zero-width (non-)joiners: part of the spelling of Persian, Indic scripts and emoji
#: sequences (``علی‌رضا``), allowed between two visible characters not both ASCII
_JOINERS = frozenset("\u200c\u200d")


def _visible(c: str) -> bool:
    return c.isprintable() and c != " " and READS_AS_NOTHING.match(c) is None


def invisible_char(v: str) -> str | None:
    """The first character of ``v`` that reads as nothing or as a blank — one Python does
    not call printable (the ASCII space excepted) or one of :data:`READS_AS_NOTHING` — if
    any: a name or an id holding one prints as another (the one rule for subject and agent
    ids, dataset names and token names). A zero-width (non-)joiner is allowed between two
    visible characters not both ASCII (between two ASCII letters it changes nothing a
    reader sees)."""
    if v.isprintable() and READS_AS_NOTHING.search(v) is None:
        return None
    for i, c in enumerate(v):
        if c in _JOINERS and 0 < i < len(v) - 1 and _visible(v[i - 1]) and \
                _visible(v[i + 1]) and not (v[i - 1].isascii() and v[i + 1].isascii()):
            continue
        if c.isprintable() and READS_AS_NOTHING.match(c) is None:
            continue
        return c
    return None


def utf8_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text in every backend, or None if it can."""
    if "\x00" in value:
        return "contains a NUL byte"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def check_text(value: Any, what: str, *, limit: int = 200, allow_empty: bool = False) -> str:
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


def check_row_id(value: Any, what: str) -> int:
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
