"""How what a caller gives becomes what the ledger stores: amounts, costs, text, JSON documents
and the digest of an idempotent request. Shared by every part of the accountant (and by
:mod:`privcal.accountant.verification`, which must store and compare values the same way).

Amounts are exact decimals limited to :data:`AMOUNT_PLACES` decimal places; a cost with
more digits (e.g. an amplified ε computed in floating point) is rounded *up* before it is
charged — charging slightly more is always safe. A cap with more places is rejected.
"""

from __future__ import annotations

import hashlib
import math
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from privcal.accountant import privacy as acc
from privcal.calibrators.bound_floats import count_text
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP, _np_float, fixed_context
from privcal.errors import InvalidInput, check_text, plain_number_text
from privcal.storage.audit import MAX_SAFE_INT, canonical, threshold_str

__all__ = [
    "AMOUNT_PLACES",
    "CENTRAL_KEY_SUFFIX",
    "DEFAULT_REPORTING_DELTA",
    "PART_KEY_SUFFIX",
    "AnyCost",
    "CentralCost",
    "cost_json",
    "idempotency_key",
    "json_safe",
    "normalize_cost",
    "optional_text",
    "parse_amount",
    "request_digest",
]

#: decimal places kept for every stored amount (see the module docstring)
AMOUNT_PLACES = 12
_QUANTUM = Decimal(1).scaleb(-AMOUNT_PLACES)
DEFAULT_REPORTING_DELTA = Decimal("1e-6")
#: a cost charged to a dataset; any cost (a local-DP one is charged per subject)
CentralCost = PureDP | ZCDP | ApproxDP
AnyCost = PureDP | ZCDP | ApproxDP | LocalDP


def _shown(value: object, text: bool = False) -> str:
    """``value`` for an error message, bounded: a container by its type and length only (a
    list of subject ids given where a number belongs was echoed in full: red team 11), any
    other value's repr (``text``: str) cut at 40 characters."""
    if not isinstance(value, str | bytes):
        try:
            n = len(value)  # type: ignore[arg-type]
        except Exception:  # a scalar (a 0-d array too: len() raises)
            pass
        else:
            return f"a {type(value).__name__} of {n} items"
    r = str(value) if text else repr(value)
    return r if len(r) <= 40 else r[:40] + "…"


def parse_amount(
    value: object, what: str, *, allow_zero: bool = False, below_one: bool = False
) -> Decimal:
    """Parse and validate a user-supplied amount (a float is the decimal a person typed; a
    ``str``/``Decimal`` subclass its characters/value, not its ``__str__``: red team 26, api F5)."""
    value = Decimal(value) if isinstance(value, Decimal) else plain_values(value)
    if isinstance(value, bool):
        raise InvalidInput(f"{what} must be a number, got {_shown(value)}")
    if isinstance(value, str) and not plain_number_text(value):
        # Decimal("1_0") is 10 and Decimal("１") 1: a typo or a fullwidth digit, not a number
        raise InvalidInput(f"{what} must be a number, got {_shown(value)}")
    try:
        d = (Decimal(repr(float(value))) if isinstance(value, float) or _np_float(value)
             else Decimal(str(value).strip()))
    except (InvalidOperation, ValueError) as exc:
        raise InvalidInput(f"{what} must be a number, got {_shown(value)}") from exc
    if not d.is_finite():
        raise InvalidInput(f"{what} must be finite, got {_shown(value)}")
    if d < 0 or (d == 0 and not allow_zero):
        raise InvalidInput(f"{what} must be {'≥' if allow_zero else '>'} 0, "
                           f"got {_shown(value, True)}")
    if below_one and d >= 1:
        raise InvalidInput(f"{what} must be < 1, got {_shown(value, True)}")
    if d >= Decimal("1e15"):
        raise InvalidInput(f"{what} is too large ({_shown(value, True)})")
    if d != d.quantize(_QUANTUM, rounding=ROUND_CEILING, context=_AMOUNTS):
        raise InvalidInput(f"{what} has more than {AMOUNT_PLACES} decimal places "
                           f"({_shown(value, True)})")
    return d


#: the context of an amount's rounding (every field given: not the caller's, whose precision
#: would make a 12-place amount an InvalidOperation; 28 digits hold any amount below 10¹⁵)
_AMOUNTS = fixed_context(28)
#: no amount at or above this is stored (a larger one is a typo, and 10¹⁵ with 12 decimal
#: places is the most a 28-digit decimal context holds exactly)
_MAX_AMOUNT = Decimal("1e15")


def _up(d: Decimal, what: str, *, zero_ok: bool = False) -> Decimal:
    """``d`` rounded up to :data:`AMOUNT_PLACES` places; InvalidInput if it is too large or
    not positive (≥ 0 where ``zero_ok``). A cost's own validators check the sign too, but a
    cost built without them (pydantic's ``model_construct``) reaches here as it is: a
    negative amount would have been charged as a refund of the budget."""
    if type(d) is not Decimal:
        raise InvalidInput(f"{what} must be a Decimal, got {_shown(d)} (a cost built without "
                           "validation?)")
    # by the exponent, not abs(d): abs() of 1e999999999 overflows the decimal context
    if not d.is_finite() or (d != 0 and d.adjusted() >= _MAX_AMOUNT.adjusted()):
        raise InvalidInput(f"privacy amount {d} is too large (must be < {_MAX_AMOUNT:.0E})")
    if d < 0 or (d == 0 and not zero_ok):
        raise InvalidInput(f"{what} must be {'≥' if zero_ok else '>'} 0, got {d}")
    return d.quantize(_QUANTUM, rounding=ROUND_CEILING, context=_AMOUNTS).normalize(_AMOUNTS)


def _same(a: Decimal, b: Decimal) -> bool:
    """``a`` and ``b`` are the very same decimal (value *and* digits: 0.10 is not 0.1)."""
    return a.as_tuple() == b.as_tuple()


def normalize_cost(cost: AnyCost) -> AnyCost:
    """The cost with every amount rounded *up* to 12 decimal places (what is stored).

    A cost already in that form is returned as is (costs are frozen): no second validation
    on the charge's hot path (issue 11). Only the four cost classes themselves are costs: a
    subclass could answer the filter's ``cost.rho`` with one amount while its record
    (:func:`cost_json`, its fields) says another (red team 26, api F4: ρ = 0.9 recorded
    twice against a cap of 1, 2e-12 spent)."""
    if type(cost) not in (PureDP, ZCDP, ApproxDP, LocalDP):
        raise InvalidInput(f"not a privacy cost: {_shown(cost)} (a cost is a PureDP, ZCDP, "
                           "ApproxDP or LocalDP itself, not a subclass)")
    if isinstance(cost, PureDP):
        eps = _up(cost.eps, "ε")
        return cost if _same(eps, cost.eps) else PureDP(eps=eps)
    if isinstance(cost, ZCDP):
        rho = _up(cost.rho, "ρ")
        return cost if _same(rho, cost.rho) else ZCDP(rho=rho)
    if isinstance(cost, ApproxDP):
        delta = _up(cost.delta, "δ", zero_ok=True)
        if delta >= 1:
            raise InvalidInput(f"δ must be < 1, got {cost.delta}")
        return ApproxDP(eps=_up(cost.eps, "ε", zero_ok=True), delta=delta)
    if isinstance(cost, LocalDP):
        return LocalDP(eps0=_up(cost.eps0, "ε0"))
    raise InvalidInput(f"not a privacy cost: {_shown(cost)}")


def cost_json(cost: AnyCost) -> dict[str, Any]:
    """A cost as stored in receipts and release records: its fields, amounts as exact text."""
    # the model's fields (``model_dump`` of these flat models, without its serializer: a
    # charge's hot path, issue 11)
    return {k: acc.dstr(v) if isinstance(v, Decimal) else v for k, v in vars(cost).items()}


#: the integers JSON (RFC 8785, the audit log's canonical form) records exactly: up to this
MAX_JSON_INT = MAX_SAFE_INT


def json_safe(obj: Any) -> Any:
    """A value storable in a JSON column: numpy → Python, ±inf/NaN → strings, Decimal →
    string. An integer JSON cannot record exactly (past ±(2⁵³ − 1)) is a one-line
    InvalidInput (red team 20, service F1: a raps λ of 2**60 was charged, then failed to be
    recorded; the run checks its request with this before the charge)."""
    if type(obj) not in (str, int, float) and isinstance(obj, str | int | float):
        obj = plain_values(obj)  # a subclass's value: its own methods serialize it otherwise
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        if -MAX_JSON_INT <= obj <= MAX_JSON_INT:
            return obj
        raise InvalidInput(f"the whole number {count_text(obj)} is past ±(2**53 − 1), the "
                           "largest a JSON record holds exactly: give it as a float (e.g. 1e40) "
                           "or a smaller number")
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else threshold_str(obj) if not math.isnan(obj) else "NaN"
    if isinstance(obj, Decimal):
        return acc.dstr(obj)
    if isinstance(obj, dict):  # (read by dict's own methods, not a subclass's)
        return {str.__str__(k) if isinstance(k, str) else str(k): json_safe(v)
                for k, v in dict.items(obj)}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in (list if isinstance(obj, list) else tuple).__iter__(obj)]
    if hasattr(obj, "model_dump"):
        return json_safe(obj.model_dump(mode="python"))
    if hasattr(obj, "tolist"):
        return json_safe(obj.tolist())
    raise InvalidInput(f"cannot store a {type(obj).__name__} in a release")


def plain_values(obj: Any) -> Any:
    """``obj`` with every ``str``, ``int``, ``float``, ``dict``, ``list`` and ``tuple`` in it
    — subclasses too (``np.float64``) — an exact builtin holding the same value; anything
    else as it is. A subclass's own ``__float__``, ``__str__`` or ``items`` can answer each
    reader differently: a raps λ whose ``__float__`` said 0 was computed with 0 and recorded
    as 5, and the release row and its audit entry disagreed (red team 26, api F8). Read once
    here, every later reader sees one value."""
    if obj is None or isinstance(obj, bool):
        return obj
    if isinstance(obj, str):
        return str.__str__(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, dict):
        return {plain_values(k): plain_values(v) for k, v in dict.items(obj)}
    if isinstance(obj, list | tuple):
        items = [plain_values(v) for v in (list.__iter__ if isinstance(obj, list)
                                           else tuple.__iter__)(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def request_digest(request: dict[str, Any]) -> str:
    """SHA-256 (hex) of the RFC 8785 canonical JSON of an idempotent request (issue 16.1)."""
    return hashlib.sha256(canonical(json_safe(request)).encode("utf-8")).hexdigest()


#: calibrator parameters added after idempotency keys existed, each with the value that does
#: what a request without it did: a request digested before the parameter existed is the same
#: request (FedCP-QQ 1.3.0 / FedCP²-QQ 1.4.0 added ``agents_planned``; red team 26, upgrade F1)
LATE_PARAMS: dict[str, Any] = {"agents_planned": None}


def bound_digest(request: dict[str, Any],
                 requester: str | None) -> tuple[str, tuple[str, ...]]:
    """(the digest of an idempotent ``request`` with its requester bound, the digests older
    privcal recorded for the same request: before the requester was bound, and before a
    :data:`LATE_PARAMS` parameter at its default existed). Another requester's key is never
    its replay (red team 20, service F3: bob's charge under alice's key was answered with
    alice's receipt and not recorded); an earlier digest lets a retry of a request recorded
    before an upgrade, by the same requester, still replay
    (:func:`~privcal.accountant.charges.check_replay`) — refused, its error said to use a new
    key, which ran and charged it again (red team 26, upgrade F1)."""
    params = request.get("params")
    params = params if isinstance(params, dict) else {}
    late = {k for k, v in LATE_PARAMS.items() if k in params and params[k] == v}
    forms = [request] if requester is not None else []
    if late:
        forms.append({**request, "params": {k: v for k, v in params.items() if k not in late}})
    earlier = tuple(request_digest(f) for f in forms)
    if requester is None:
        return request_digest(request), earlier
    return request_digest({**request, "requester": requester}), earlier


#: characters that act on the terminal that prints them rather than print: C0 and C1 controls
#: but the tab and the line feed (ESC begins CSI/OSC sequences: erase a line, write the
#: clipboard; CR returns to a line's start to overwrite it) and the bidi embeddings,
#: overrides and isolates (U+202E shows a text reversed)
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def optional_text(value: str | None, what: str, limit: int = 200) -> str | None:
    """A free-text field (purpose, requester, key …) that is storable text of at most ``limit``
    characters (:func:`privcal.errors.check_text`) holding no :data:`TERMINAL_CONTROLS` (red
    team 22, ui F1: an analyst's charge purpose erased its own row of the auditor's ``privcal
    audit report`` on a terminal and wrote the auditor's clipboard), or None."""
    if value is None:
        return None
    text = check_text(value, what, limit=limit, allow_empty=True)
    bad = TERMINAL_CONTROLS.search(text)
    if bad is not None:
        raise InvalidInput(f"{what} holds the control character U+{ord(bad.group()):04X}, "
                           "which would act on a terminal printing it: remove it")
    return text


#: the suffix of the key a keyed local-DP batch gives its central charge
#: (:mod:`privcal.accountant.subject_charges`): reserved, never a caller's key
CENTRAL_KEY_SUFFIX = "#central"


#: the suffix (then the part's number, 2 …) of the keys of a run's further parts, charged with
#: its first under the run's key (:func:`privcal.accountant.charges.charge_parts`): reserved
PART_KEY_SUFFIX = "#part"
PART_KEY = re.compile(re.escape(PART_KEY_SUFFIX) + r"[0-9]+\Z")


#: what begins the keys the HTTP service derives for its callers (:class:`ServiceKey`)
SERVICE_KEY_PREFIX = "http:"


class ServiceKey(str):
    """An idempotency key the HTTP service derived from the key a caller sent and the token
    it authenticated (``http:TOKEN-ID:HASH``): the only way into that key space. A caller of
    the library or the CLI who wrote ``http:<an analyst's token id>:<hash>`` — the token id
    is in every audit entry — held the analyst's next request's key, and that request was
    answered with the caller's charge, unrecorded (red team 20, service F3 and its review)."""

    __slots__ = ()


def idempotency_key(value: str | None) -> str | None:
    """A caller's idempotency key (:func:`optional_text`), or None. Keys ending in
    :data:`CENTRAL_KEY_SUFFIX` are privcal's own: a keyed local-DP run charges its central
    cost under ``KEY#central``, and a caller's charge under that key would be taken, on a
    replay, for the run's (red team 5); keys beginning with :data:`SERVICE_KEY_PREFIX` are
    the service's (:class:`ServiceKey`). An empty or blank key is refused, as the service
    refuses an empty ``Idempotency-Key``: it is what ``--idempotency-key "$JOB"`` sends when
    ``JOB`` is unset, and it bound every such run to the first one's charge, each later
    (real) mechanism run answered "already recorded" and charged nothing (red team 24,
    newcomer F2)."""
    key = optional_text(value, "idempotency key")
    if key is not None and not key.strip():
        raise InvalidInput("idempotency key is empty: give a non-blank key (one per logical "
                           "request, reused on its retries), or none")
    if key is not None and key.endswith(CENTRAL_KEY_SUFFIX):
        raise InvalidInput(f"idempotency keys ending in {CENTRAL_KEY_SUFFIX!r} are reserved "
                           "for privcal's own central charges: choose another key")
    if key is not None and PART_KEY.search(key):
        raise InvalidInput(f"idempotency keys ending in {PART_KEY_SUFFIX!r} and a number are "
                           "reserved for the parts of privcal's own charges: choose another key")
    if key is not None and key.startswith(SERVICE_KEY_PREFIX) \
            and not isinstance(value, ServiceKey):
        raise InvalidInput(f"idempotency keys beginning with {SERVICE_KEY_PREFIX!r} are "
                           "reserved for the keys privcal's HTTP service derives: choose "
                           "another key")
    # the text checked (check_text's exact str), still the service's where it was
    return ServiceKey(key) if key is not None and isinstance(value, ServiceKey) else key
