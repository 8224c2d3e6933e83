"""One exception hierarchy for privcal; every error carries the CLI exit code it maps to.

Exit codes (stable, documented in the README): 0 ok, 1 error, 2 usage, 3 budget refused,
4 audit verification failed, 5 ledger schema out of date (130: interrupted).

It also holds the argument checks every layer runs before a value reaches a database
(:func:`check_text`, :func:`check_row_id`, :func:`utf8_problem`), so that a malformed
name, free text or row id is an :class:`InvalidInput` (or :class:`NotFound`) with one
line on every backend — never a driver error (PostgreSQL refuses NUL bytes, no UTF-8
codec encodes a lone surrogate, and no SQL integer holds 2⁷⁰).
"""

from __future__ import annotations

import re
import reprlib
import unicodedata
from bisect import bisect_right
from collections.abc import Callable
from functools import wraps
from typing import Any, NamedTuple, ParamSpec, TypeVar


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
        PrivcalError.__init__(self, message)  # (also SchemaOutOfDate's)
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
    """The ledger's schema is older (or newer) than this privcal expects; ``public``: the
    message without the ledger's URL or file, as :class:`LedgerError`'s (red team 20)."""

    exit_code = 5
    __init__ = LedgerError.__init__  # type: ignore[assignment]


class Interrupted(PrivcalError):
    """The command was interrupted (Ctrl-C): what it committed before stays (exit 130, the
    shell's code for SIGINT)."""

    exit_code = 130


class InfeasiblePlan(InvalidInput):
    """No valid protocol plan exists for these parameters (e.g. ε too small for n)."""


class PlanRejected(InvalidInput):
    """A report or message was rejected by a collection session (closed round, duplicate, …)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


class FirstError(NamedTuple):
    """The first problem of a pydantic ``ValidationError`` (:func:`first_error`)."""

    #: the dotted location of the bad value ("" for the model itself)
    where: str
    #: pydantic's message on one line, without the "Value error, " of a validator's ValueError
    message: str
    #: pydantic's error type ("extra_forbidden" for an unknown field)
    kind: str


def first_error(exc: Any) -> FirstError:
    """The problem of a pydantic ``ValidationError`` a one-line error names: an unknown field
    first (it is why the others went unmatched: ``epsilon=`` given to P-COQS), else the first.
    Every layer's one-line message about a model's input is built from it (red teams 5, 11
    and 14: pydantic's text spans lines, and a validator's message starts "Value error, ")."""
    return first_of(exc.errors(include_url=False))


#: a short repr of a bad input, whatever its size (:func:`first_of`)
_SHORT = reprlib.Repr()  # (Python 3.11's takes no keywords)
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict, _SHORT.maxset = 2, 8, 8, 4, 4
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 42


def first_of(errors: Any) -> FirstError:
    """:func:`first_error` of a list of pydantic error dicts (FastAPI's
    ``RequestValidationError.errors()``)."""
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    # (a value's repr may span lines: a 2-D array given as an amount)
    message = " ".join(str(err.get("msg", "")).removeprefix("Value error, ").split())
    kind = str(err.get("type", ""))
    if "input" in err and kind not in ("missing", "extra_forbidden", "value_error"):
        # pydantic's own constraint messages omit the value ("Input should be greater than
        # 0"); privcal's validators name it (red team 17). reprlib bounds the work: a
        # 3·10⁶-element list is not written out to show 60 characters of it
        shown = " ".join(_SHORT.repr(err["input"]).split())
        message += f", got {shown[:60]}{'…' if len(shown) > 60 else ''}"
    return FirstError(".".join(str(p) for p in err.get("loc", ())), message, kind)


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

#: zero-width (non-)joiners: U+200C (ZWNJ) and U+200D (ZWJ) are part of the spelling of
#: Persian (``علی‌رضا``), of the Indic scripts (``क्‍ष``: a half form) and of emoji
#: sequences (``👩‍💻``), but everywhere else they render as nothing: ``caf\u200cé`` read as
#: ``café`` and was another subject with a cap of its own (red team 10 review). A joiner is
#: therefore allowed only where it can change what is drawn, see :func:`_joiner_counts`
_JOINERS = frozenset("\u200c\u200d")

#: the scripts where a ZWNJ/ZWJ changes the shapes around it, as (first, last, script)
#: code-point ranges (Unicode blocks): the joining scripts (letters take a joined or an
#: unjoined form: ArabicShaping.txt) and the scripts with a virama (a joiner after it asks
#: for a half form, a ligature or a visible virama). Sorted by first code point
_JOINER_SCRIPTS: tuple[tuple[int, int, str], ...] = (
    (0x0600, 0x06FF, "Arabic"), (0x0700, 0x074F, "Syriac"), (0x0750, 0x077F, "Arabic"),
    (0x07C0, 0x07FF, "Nko"), (0x0840, 0x085F, "Mandaic"), (0x0860, 0x086F, "Syriac"),
    (0x0870, 0x08FF, "Arabic"), (0x0900, 0x097F, "Devanagari"), (0x0980, 0x09FF, "Bengali"),
    (0x0A00, 0x0A7F, "Gurmukhi"), (0x0A80, 0x0AFF, "Gujarati"), (0x0B00, 0x0B7F, "Oriya"),
    (0x0B80, 0x0BFF, "Tamil"), (0x0C00, 0x0C7F, "Telugu"), (0x0C80, 0x0CFF, "Kannada"),
    (0x0D00, 0x0D7F, "Malayalam"), (0x0D80, 0x0DFF, "Sinhala"), (0x0F00, 0x0FFF, "Tibetan"),
    (0x1000, 0x109F, "Myanmar"), (0x1700, 0x171F, "Tagalog"), (0x1720, 0x173F, "Hanunoo"),
    (0x1780, 0x17FF, "Khmer"), (0x1800, 0x18AF, "Mongolian"), (0x1A20, 0x1AAF, "Tai Tham"),
    (0x1B00, 0x1B7F, "Balinese"), (0x1B80, 0x1BBF, "Sundanese"), (0x1BC0, 0x1BFF, "Batak"),
    (0x1CD0, 0x1CFF, "Devanagari"), (0xA800, 0xA82F, "Syloti Nagri"),
    (0xA840, 0xA87F, "Phags-pa"), (0xA880, 0xA8DF, "Saurashtra"),
    (0xA8E0, 0xA8FF, "Devanagari"), (0xA930, 0xA95F, "Rejang"), (0xA980, 0xA9DF, "Javanese"),
    (0xA9E0, 0xA9FF, "Myanmar"), (0xAA60, 0xAA7F, "Myanmar"), (0xAAE0, 0xAAFF, "Meetei Mayek"),
    (0xABC0, 0xABFF, "Meetei Mayek"), (0xFB50, 0xFDFF, "Arabic"), (0xFE70, 0xFEFE, "Arabic"),
    (0x10A00, 0x10A5F, "Kharoshthi"), (0x10AC0, 0x10AFF, "Manichaean"),
    (0x10B80, 0x10BAF, "Psalter Pahlavi"), (0x10D00, 0x10D3F, "Hanifi Rohingya"),
    (0x10EC0, 0x10EFF, "Arabic"), (0x10F30, 0x10F6F, "Sogdian"),
    (0x10F70, 0x10FAF, "Old Uyghur"), (0x10FB0, 0x10FDF, "Chorasmian"),
    (0x11000, 0x1107F, "Brahmi"), (0x11080, 0x110CF, "Kaithi"), (0x11100, 0x1114F, "Chakma"),
    (0x11180, 0x111DF, "Sharada"), (0x11200, 0x1124F, "Khojki"), (0x112B0, 0x112FF, "Khudawadi"),
    (0x11300, 0x1137F, "Grantha"), (0x11400, 0x1147F, "Newa"), (0x11480, 0x114DF, "Tirhuta"),
    (0x11580, 0x115FF, "Siddham"), (0x11600, 0x1165F, "Modi"), (0x11680, 0x116CF, "Takri"),
    (0x11700, 0x1174F, "Ahom"), (0x11800, 0x1184F, "Dogra"), (0x11900, 0x1195F, "Dives Akuru"),
    (0x119A0, 0x119FF, "Nandinagari"), (0x11A00, 0x11A4F, "Zanabazar Square"),
    (0x11A50, 0x11AAF, "Soyombo"), (0x11C00, 0x11C6F, "Bhaiksuki"),
    (0x11D00, 0x11D5F, "Masaram Gondi"), (0x11D60, 0x11DAF, "Gunjala Gondi"),
    (0x1E900, 0x1E95F, "Adlam"),
)
_JOINER_STARTS = [first for first, _, _ in _JOINER_SCRIPTS]
#: the joining scripts among them: there a ZWJ between two letters asks them to join,
#: which they do anyway (``س\u200dلام`` reads as ``سلام``) unless the first never joins the
#: next — then it shapes the second as joined, a way to show a letter's forms, not to spell
#: a name — so only the ZWNJ is allowed between two of their letters
_CURSIVE = frozenset({"Arabic", "Syriac", "Nko", "Mandaic", "Mongolian", "Phags-pa",
                      "Manichaean", "Psalter Pahlavi", "Hanifi Rohingya", "Sogdian",
                      "Old Uyghur", "Chorasmian", "Adlam"})

#: Extended_Pictographic (emoji-data.txt), the characters a ZWJ sequence is made of
#: (``👩‍💻``, ``👨‍👩‍👧``, ``🐻‍❄``); regional indicators (flags) are not, and tag
#: sequences hold tags, which read as nothing anyway
_EMOJI = (
    "\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328\u2388"
    "\u23cf\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe\u2600-\u2605"
    "\u2607-\u2612\u2614-\u2685\u2690-\u2705\u2708-\u2712\u2714\u2716\u271d\u2721\u2728"
    "\u2733\u2734\u2744\u2747\u274c\u274e\u2753-\u2755\u2757\u2763-\u2767\u2795-\u2797"
    "\u27a1\u27b0\u27bf\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d\u3297"
    "\u3299\U0001f000-\U0001f0ff\U0001f10d-\U0001f10f\U0001f12f\U0001f16c-\U0001f171"
    "\U0001f17e\U0001f17f\U0001f18e\U0001f191-\U0001f19a\U0001f1ad-\U0001f1e5"
    "\U0001f201-\U0001f20f\U0001f21a\U0001f22f\U0001f232-\U0001f23a\U0001f23c-\U0001f23f"
    "\U0001f249-\U0001f3fa\U0001f400-\U0001f53d\U0001f546-\U0001f64f\U0001f680-\U0001f6ff"
    "\U0001f774-\U0001f77f\U0001f7d5-\U0001f7ff\U0001f80c-\U0001f80f\U0001f848-\U0001f84f"
    "\U0001f85a-\U0001f85f\U0001f888-\U0001f88f\U0001f8ae-\U0001f8ff\U0001f90c-\U0001f93a"
    "\U0001f93c-\U0001f945\U0001f947-\U0001faff\U0001fc00-\U0001fffd")
_ZWJ_AFTER = re.compile(f"[{_EMOJI}]")
#: before a ZWJ: an emoji, or the skin-tone modifier that ends one (``👩🏽‍💻``)
_ZWJ_BEFORE = re.compile(f"[{_EMOJI}\U0001f3fb-\U0001f3ff]")


def _joiner_script(c: str) -> str | None:
    """The script of ``c`` if it is a letter or a mark of a joining or virama script."""
    o = ord(c)
    i = bisect_right(_JOINER_STARTS, o) - 1
    if i < 0 or o > _JOINER_SCRIPTS[i][1] or unicodedata.category(c)[0] not in "LM":
        return None
    return _JOINER_SCRIPTS[i][2]


def _joiner_counts(v: str, i: int) -> bool:
    """Whether the joiner ``v[i]`` can change how ``v`` is drawn, so that ``v`` does not
    read as ``v`` without it: a ZWNJ between two letters or marks of one joining or virama
    script (:data:`_JOINER_SCRIPTS`), a ZWJ between two of one virama script (not of a
    joining script: :data:`_CURSIVE`), or a ZWJ between two emoji. Both neighbours
    are asked for: a ZWNJ only separates two letters that would join, and in the virama
    scripts the joiner sits inside one cluster (after the virama, or before it in Sinhala
    and Bengali); a joiner next to a digit, a punctuation mark, a Latin, Cyrillic, Greek or
    CJK letter is drawn as nothing, and one at either end is refused (so is an old-style
    Malayalam chillu, consonant + virama + ZWJ, at the end of an id). Where it is allowed
    it may still change nothing (a ZWNJ after an Arabic letter that never joins the next,
    a joiner between two Devanagari letters without a virama, a ZWJ between two emoji
    that form no sequence, ``🍕‍🍕``): no joining-type, font or emoji-sequence tables here
    to tell — such an id and the one without the joiner are two subjects (README)."""
    if not 0 < i < len(v) - 1:
        return False
    before, after = v[i - 1], v[i + 1]
    if v[i] == "\u200d" and _ZWJ_BEFORE.match(before) and _ZWJ_AFTER.match(after):
        return True
    script = _joiner_script(before)
    return script is not None and script == _joiner_script(after) and \
        (v[i] == "\u200c" or script not in _CURSIVE)


def invisible_char(v: str) -> str | None:
    """The first character of ``v`` that reads as nothing or as a blank — one Python does
    not call printable (the ASCII space excepted) or one of :data:`READS_AS_NOTHING` — if
    any: a name or an id holding one prints as another (the one rule for subject and agent
    ids, dataset names and token names). A zero-width (non-)joiner is allowed only where it
    can change what is drawn (:func:`_joiner_counts`): a ZWNJ between two letters or marks
    of one joining or virama script (Persian ``علی‌رضا``), a ZWJ between two of one virama
    script (Hindi ``क्‍ष``), or a ZWJ between two emoji (``👩‍💻``; not with U+FE0F, a
    variation selector, in the sequence)."""
    if v.isprintable() and READS_AS_NOTHING.search(v) is None:
        return None
    for i, c in enumerate(v):
        if c in _JOINERS and _joiner_counts(v, i):
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
    """``value`` if it is a ``str`` storable everywhere, at most ``limit`` characters long, as
    an exact ``str`` (a subclass's ``strip``/``endswith`` could lie: red team 26, api F3)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be text, got {type(value).__name__}")
    value = str.__str__(value)  # its characters, in a str of privcal's
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


def plain_number_text(text: str) -> bool:
    """Whether the text of a number may be read as one: ASCII, no ``_`` (the rule of
    :func:`check_number_text`, for callers that word their own refusal)."""
    return "_" not in text and text.isascii()


def check_number_text(text: str, what: str) -> None:
    """Refuse (ValueError) the text of a number that is not plain ASCII or holds a ``_``.

    The one rule every number read from text follows: the cost parsers (:mod:`privcal.costs`,
    :func:`privcal.accountant.normalize.parse_amount`), the parameter models
    (:class:`privcal.calibrators.base.CalibratorParams`) and the CLI's number types
    (:mod:`privcal.cli.number_types`). ``Decimal("1_0")`` and ``float("0_5")`` read a digit
    separator, so a typo became ρ = 5 and was charged (red team 10); ``float("１")`` (a
    fullwidth digit) is 1, which no number here is meant to be written as. Everything else
    (spaces around, ``1e-3``, …) is left to the number's own parser."""
    if not plain_number_text(text):
        raise ValueError(f"{what} must be a plain number (ASCII digits, no '_'), "
                         f"got {text!r}")


def with_article(word: str) -> str:
    """``word`` after its indefinite article: "a device", "an auditor" (messages naming a
    role: "a auditor token" read wrong, red team 14)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
