"""The decimal context privcal computes in, whatever context the calling program has set.

Budgets, costs and totals are exact :class:`~decimal.Decimal` amounts, and their arithmetic
(a sum of costs, a cost rounded up to 12 places, ε + S of a dataset's guarantee) takes the
precision and the rounding of the *thread's current context*. A program that embeds privcal
and sets its own (``getcontext().prec = 5``, ``rounding = ROUND_DOWN``) made every
``create_dataset`` and ``charge`` raise a bare ``decimal.InvalidOperation``, and rounded a
dataset's stated guarantee *down*: (0.4938, 0)-DP for a true ε of 0.493827159387 (red team 6).

So the library's entry points — every public method of
:class:`~privcal.accountant.Accountant` and the collection sessions' operations — run in
:data:`LIBRARY_CONTEXT` (:func:`in_library_context`, :func:`library_context_methods`): the
results are those of Python's default context, and the caller's context is untouched on
return: a caller whose context is already the library's (the usual case) runs as it is, so
its flags record privcal's operations as they record its own; any other context is left with
no flag set by privcal. Pure functions that do arithmetic outside those entry
points (the filters, the costs' conversions) set their own exact context as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from decimal import (
    ROUND_HALF_EVEN,
    Context,
    DivisionByZero,
    InvalidOperation,
    Overflow,
    getcontext,
    localcontext,
)
from typing import Any, TypeVar

__all__ = ["LIBRARY_CONTEXT", "in_library_context", "library_context_methods"]

#: Python's default decimal context, spelled out (``decimal.DefaultContext`` is itself
#: mutable by any program): 28 digits, half-even, the usual traps
LIBRARY_CONTEXT = Context(prec=28, rounding=ROUND_HALF_EVEN, Emin=-999999, Emax=999999,
                          capitals=1, clamp=0, flags=[],
                          traps=[InvalidOperation, DivisionByZero, Overflow])

#: its traps, as a context's ``traps`` dict compares
_TRAPS = LIBRARY_CONTEXT.traps.copy()

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def in_library_context(fn: F) -> F:
    """``fn`` run in a copy of :data:`LIBRARY_CONTEXT` (the caller's context restored after)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        ctx = getcontext()
        if (ctx.prec == 28 and ctx.rounding == ROUND_HALF_EVEN and ctx.Emax == 999999
                and ctx.Emin == -999999 and not ctx.clamp and ctx.traps == _TRAPS):
            return fn(*args, **kwargs)  # already the library's (the usual case: a charge's hot
            # path saves the context's copy, issue 11)
        with localcontext(LIBRARY_CONTEXT):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def library_context_methods(cls: C) -> C:
    """Class decorator: every public method ``cls`` defines runs :func:`in_library_context`
    (properties, static and class methods are left as they are)."""
    for name, attr in list(vars(cls).items()):
        if (not name.startswith("_") and inspect.isfunction(attr)):
            setattr(cls, name, in_library_context(attr))
    return cls
