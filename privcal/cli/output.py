"""How the CLI prints: one JSON document under ``--json`` (±inf and NaN as strings, decimals
exact), aligned tables and plain cells for people, messages on stderr."""

from __future__ import annotations

import io
import json
import math
import shutil
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import click

__all__ = ["at_least", "at_most", "cell", "emit", "info", "json_default", "table",
           "to_jsonable"]


def json_default(o: Any) -> Any:
    if isinstance(o, Decimal):
        return str(o)
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def at_least(x: float, spec: str) -> str:
    """A lower bound ``x`` printed with the format ``spec`` (``.4f``, ``.6g``, ``g``…), rounded
    *down* where rounding to nearest would print more than ``x`` (red team 19: a recorded
    0.89996 was printed "guaranteed ≥ 0.9000", and 0.99996 "≥ 1.0000", beside a measured
    1.0000 said to be below it). A printed bound never states more than was proven, as the
    recorded statements (:mod:`privcal.calibrators.bound_floats`); ``x`` is the number a
    release records, its shortest ``repr`` read as a decimal (0.3 is 0.3)."""
    return _bound_text(x, spec, up=False)


def at_most(x: float, spec: str) -> str:
    """An upper bound ``x`` (a probability at most so much) printed with ``spec``, rounded
    *up* where rounding to nearest would print less (the review of red team 19: 0.0104
    printed "at most 0.01" beside "weak evidence", whose cut-off is 0.01)."""
    return _bound_text(x, spec, up=True)


def _bound_text(x: float, spec: str, *, up: bool) -> str:
    from decimal import ROUND_CEILING, ROUND_FLOOR, Context
    from fractions import Fraction

    x = float(x)  # a numpy float's repr is not a number (numpy 2: "np.float64(…)")
    text = format(x, spec)
    if not math.isfinite(x) or (Fraction(text) >= Fraction(repr(x)) if up
                                else Fraction(text) <= Fraction(repr(x))):
        return text
    kind = spec[-1]
    places = int(spec[1:-1]) if spec.startswith(".") else 6
    rounding = ROUND_CEILING if up else ROUND_FLOOR
    if kind == "f":
        return format(Decimal(repr(x)).quantize(Decimal(1).scaleb(-places), rounding=rounding),
                      f".{places}f")
    return format(Context(prec=places, rounding=rounding).plus(Decimal(repr(x))), "g")


def to_jsonable(data: Any) -> Any:
    """Floats that are ±inf/NaN become "Infinity"/"-Infinity"/"NaN" strings (valid JSON)."""
    if isinstance(data, float):
        if math.isinf(data):
            return "Infinity" if data > 0 else "-Infinity"
        if math.isnan(data):
            return "NaN"
        return data
    if isinstance(data, dict):
        return {str(k): to_jsonable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [to_jsonable(v) for v in data]
    if hasattr(data, "model_dump"):
        return to_jsonable(data.model_dump(mode="json"))
    return data


def emit(data: Any, *, as_json: bool, human: Callable[[], None] | str | None = None) -> None:
    """Print ``data`` as one JSON document (``--json``) or call ``human`` to print for people."""
    if as_json:
        sys.stdout.write(json.dumps(to_jsonable(data), default=json_default, indent=2) + "\n")
    elif callable(human):
        human()
    elif human is not None:
        click.echo(human)
    else:
        click.echo(json.dumps(to_jsonable(data), default=json_default, indent=2))


def _width() -> int:
    """The terminal's width; not a terminal (a pipe, a file): no wrapping."""
    if sys.stdout.isatty():
        return max(40, shutil.get_terminal_size().columns)
    return 100_000


def table(rows: list[dict[str, Any]], columns: list[str] | None = None,
          title: str | None = None) -> str:
    """An aligned text table for people (rich): columns wrapped to the terminal's width."""
    if not rows:
        return "(none)"
    from rich import box
    from rich.console import Console
    from rich.table import Table

    cols = columns or list(rows[0])
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False)
    for c in cols:
        t.add_column(str(c), overflow="fold")
    for r in rows:
        t.add_row(*(cell(r.get(c, "")) for c in cols))
    buf = io.StringIO()
    Console(file=buf, width=_width(), color_system=None, highlight=False,
            emoji=False, markup=False, soft_wrap=False).print(t)
    return "\n".join(line.rstrip() for line in buf.getvalue().strip("\n").splitlines())


def cell(value: Any) -> str:
    """A value as people read it: no Python reprs (``None`` → ``-``, dicts as k=v, decimals
    plain, floats in 10 significant digits, ``inf`` as ``+inf``)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Decimal):
        from privcal.costs import plain

        return plain(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "+inf" if value > 0 else "-inf"
        return f"{value:.10g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value) or "-"
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ", timespec="seconds")
    return inert(str(value))


def inert(text: str) -> str:
    """``text`` with each character that would act on a terminal (:data:`~privcal.accountant.
    normalize.TERMINAL_CONTROLS`: ESC, CR, bidi overrides …) written as its escape (``\\x1b``),
    so that a free-text field stored before the library refused them prints inert (red team
    22, ui F1)."""
    if text.isprintable():  # the usual case: no import, no scan
        return text
    from privcal.accountant.normalize import TERMINAL_CONTROLS

    return TERMINAL_CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


def info(message: str) -> None:
    """A message for people, on stderr (never pollutes ``--json`` output)."""
    click.echo(message, err=True)
