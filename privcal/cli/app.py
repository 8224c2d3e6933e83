"""The root ``privcal`` command group and the conventions every command follows.

- ``--json`` writes exactly one JSON document to stdout; messages go to stderr.
- A :class:`privcal.errors.PrivcalError` becomes ``error: <message>`` on stderr
  and its exit code (1 error, 3 budget refused, 4 audit failed, 5 stale schema);
  click's usage errors exit 2.
- Commands are thin: parse, call the library, print.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import click

from privcal import __version__
from privcal.errors import PrivcalError


class PrivcalGroup(click.Group):
    """A group that turns library errors into one-line messages and stable exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PrivcalError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)


class Settings:
    """Per-invocation settings shared by subcommands through ``ctx.obj``."""

    def __init__(self, db_url: str | None) -> None:
        self.db_url = db_url
        self._ledger: Any = None

    def ledger(self) -> Any:
        """The ledger (opened, and created/migrated if it is the embedded default, on first use)."""
        if self._ledger is None:
            from privcal.storage import Ledger

            self._ledger = Ledger(self.db_url)
        return self._ledger

    def accountant(self) -> Any:
        from privcal.accountant import Accountant

        return Accountant(self.ledger())


pass_settings = click.make_pass_decorator(Settings)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Write one JSON document to stdout and nothing else."
)


def _default(o: Any) -> Any:
    if isinstance(o, Decimal):
        return str(o)
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


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
        sys.stdout.write(json.dumps(to_jsonable(data), default=_default, indent=2) + "\n")
    elif callable(human):
        human()
    elif human is not None:
        click.echo(human)
    else:
        click.echo(json.dumps(to_jsonable(data), default=_default, indent=2))


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A plain aligned text table."""
    if not rows:
        return "(none)"
    cols = columns or list(rows[0])
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)


def info(message: str) -> None:
    """A message for people, on stderr (never pollutes ``--json`` output)."""
    click.echo(message, err=True)


@click.group(cls=PrivcalGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db-url",
    envvar="PRIVCAL_DATABASE_URL",
    default=None,
    help="SQLAlchemy URL of the ledger (default: a SQLite file in the user data dir, "
    "or $PRIVCAL_HOME). Env: PRIVCAL_DATABASE_URL.",
)
@click.version_option(__version__, prog_name="privcal")
@click.pass_context
def main(ctx: click.Context, db_url: str | None) -> None:
    """privcal: differentially private conformal calibration with a privacy-budget ledger.

    Exit codes: 0 ok, 1 error, 2 usage, 3 budget refused, 4 audit verification
    failed, 5 ledger schema out of date (run `privcal db upgrade`).
    """
    ctx.obj = Settings(db_url)
    # library warnings (e.g. a plugin trying to shadow a built-in) as one line on stderr
    warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
