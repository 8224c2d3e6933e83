"""Click types for the numbers typed on the command line: plain ASCII, no ``_``.

click's INT and FLOAT (Python's ``int``/``float``) read ``1_0`` as 10 and a fullwidth ``１``
as 1, so ``session submit 1_0`` went to session 10 and ``advise --epsilon 0_5`` advised for
ε = 5 (red team 10). These types refuse such text first, by the library's one rule
(:func:`privcal.errors.check_number_text`), as a usage error (exit 2), then read it as
click would. Light on purpose: every command module imports it, ``privcal --help`` too.
"""

from __future__ import annotations

from typing import Any

import click

from privcal.cli.app import AmountType
from privcal.errors import check_number_text

__all__ = ["FloatRange", "IntList", "IntRange", "Integer", "Number", "NumberOrWord", "NumberTexts",
           "plain"]


def plain(value: Any, param: Any, ctx: Any, kind: click.ParamType) -> None:
    """A usage error for a number's text the library refuses (``0_5``, a fullwidth ``１``)."""
    if isinstance(value, str):
        try:
            check_number_text(value, "it")
        except ValueError:
            kind.fail(f"{value!r} is not a plain number (ASCII digits, no '_')", param, ctx)


class Number(AmountType):
    """A float: read as the cost options read an amount (``AmountType``: no ``_``, ASCII,
    finite), given to the library as a float."""

    name = "float"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, float | int) and not isinstance(value, bool):
            return value
        plain(value, param, ctx, self)
        return float(super().convert(value, param, ctx))


class NumberOrWord(Number):
    """A :class:`Number`, or one word the parameter takes for its null (``--band paper``),
    passed on as that word for the parameter model to read."""

    def __init__(self, word: str) -> None:
        self.word = word
        self.name = f"FLOAT|{word}"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value == self.word:
            return value
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is neither a plain number nor {self.word!r}", param, ctx)


class Integer(click.types.IntParamType):
    """An int (an id, a count): click's INT, but not ``1_0`` or non-ASCII digits."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        plain(value, param, ctx, self)
        return super().convert(value, param, ctx)


class IntRange(click.IntRange):
    """click's IntRange (the range checked as there), in plain ASCII digits."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        plain(value, param, ctx, self)
        return super().convert(value, param, ctx)


class FloatRange(click.FloatRange):
    """click's FloatRange (the range checked as there), in plain ASCII digits."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        plain(value, param, ctx, self)
        return super().convert(value, param, ctx)


class IntList(click.ParamType):
    """An integer or a comma list of integers, kept as its text (the command splits it):
    refused here if it is not plain ASCII or holds a ``_`` (``--local-n 2_00``)."""

    name = "N[,N…]"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        plain(value, param, ctx, self)
        return value


class NumberTexts(click.ParamType):
    """Comma-separated plain numbers, kept as the text for the library to read and range-check
    (``--score-range LO,HI``: exactly ``count`` of them; ``--renyi-orders``: any number, blanks
    between commas skipped as the library skips them). A malformed number is a usage error
    (exit 2) here, in the library's words, as for every other number option; it was the
    library's bad input, exit 1 (red team 25, newcomer F4). A value out of range (``4,0``, an
    order 0.5) stays the library's, exit 1."""

    def __init__(self, metavar: str, bad: str, count: int | None = None) -> None:
        self.name = metavar
        self.bad = bad  # the message, formatted with the whole text ``value`` and ``part``
        self.count = count

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, str):
            return value
        parts = value.split(",")
        if self.count is not None and len(parts) != self.count:
            self.fail(self.bad.format(value=value, part=""), param, ctx)
        for part in parts:
            if self.count is None and not part.strip():
                continue
            try:
                check_number_text(part, "it")
                float(part)
            except ValueError:
                self.fail(self.bad.format(value=value, part=part), param, ctx)
        return value
