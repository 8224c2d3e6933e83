"""Click options generated from a calibrator's pydantic parameter model.

Every field of ``Calibrator.Params`` becomes a ``--kebab-case`` option of
``privcal calibrate METHOD`` (and ``privcal session open METHOD``), so the CLI and the
Python API accept exactly the same parameters; a field's old names (validation aliases)
become hidden deprecated flags.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

import click

from privcal.cli.group_options import ALPHA_HELP, AlphaLevels
from privcal.cli.number_types import Integer, Number, NumberOrWord, NumberTexts, plain
from privcal.errors import InvalidInput, plain_number_text

__all__ = [
    "COMMON",
    "SCORE_OPTION",
    "Integer",
    "Levels",
    "Number",
    "apply_deprecated",
    "deprecated_aliases",
    "param_options",
    "parse_score_options",
    "regression_options",
]

#: options every ``calibrate`` subcommand has; a parameter of the same name is fed from them
COMMON = {
    "dataset", "scores", "probs", "labels", "score", "score_option", "agent_of", "subjects",
    "requester", "idempotency_key", "dry_run", "as_json", "simulate", "shuffled",
    "assume_unlinkable_features", "columns", "label_column", "classes",
    "preds", "lower_preds", "upper_preds", "targets", "score_range",
    "mondrian", "groups", "public_groups",
}  # fmt: skip


def _unwrap_optional(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return ann


class Levels(AlphaLevels):
    """``--alpha``: one level or several (``AlphaLevels``), in plain numbers."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        plain(value, param, ctx, self)
        return super().convert(value, param, ctx)


def _click_type(ann: Any) -> Any:
    ann = _unwrap_optional(ann)
    if typing.get_origin(ann) is Literal:
        return click.Choice([str(a) for a in typing.get_args(ann)])
    if ann is float:
        return Number()
    if ann is int:
        return Integer()
    return str


def deprecated_aliases(params_model: type) -> dict[str, str]:
    """{old name: field} for the old parameter names a model still accepts (validation aliases).

    Stored releases keep their old names (``audit verify`` reads them through the aliases);
    the CLI accepts the old flags hidden, as deprecated spellings of the new ones.
    """
    out: dict[str, str] = {}
    for name, field in params_model.model_fields.items():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str) and choice != name:
                out[choice] = name
    return out


def _alias_dest(old: str) -> str:
    return f"deprecated__{old}"


def apply_deprecated(params_model: type, kw: dict[str, Any], params: dict[str, Any]) -> None:
    """Move values given under a deprecated flag (e.g. ``--beta``) onto their field."""
    ctx = click.get_current_context(silent=True)
    for old, name in deprecated_aliases(params_model).items():
        value = kw.pop(_alias_dest(old), None)
        if value is None:
            continue
        source = ctx.get_parameter_source(name) if ctx is not None else None
        if source == click.core.ParameterSource.COMMANDLINE:
            new = "--" + name.replace("_", "-")
            raise InvalidInput(f"give {new} or its deprecated spelling --{old}, not both")
        params[name] = value


def param_options(params_model: type) -> list[click.Option]:
    """Click options for every field of a calibrator's parameter model (``--kebab-case``).

    A field's old names (validation aliases) become hidden deprecated flags.
    """
    opts: list[click.Option] = []
    for old, name in deprecated_aliases(params_model).items():
        if name in COMMON:
            continue
        field = params_model.model_fields[name]
        opts.append(
            click.Option(
                ["--" + old.replace("_", "-"), _alias_dest(old)],
                type=_click_type(field.annotation),
                hidden=True,
                help=f"deprecated spelling of --{name.replace('_', '-')}",
            )
        )
    for name, field in params_model.model_fields.items():
        if name in COMMON:
            continue
        flag = "--" + name.replace("_", "-")
        ann = _unwrap_optional(field.annotation)
        required = field.is_required()
        default = None if required else field.get_default(call_default_factory=True)
        help_text = (field.description or "").rstrip(".")
        if ann is bool:
            opts.append(
                click.Option(
                    [f"{flag}/--no-{name.replace('_', '-')}", name],
                    default=bool(default),
                    show_default=True,
                    help=help_text,
                )
            )
            continue
        # click >= 8.3 reads an explicit default=None as a value given: a required option
        # then never reports itself missing (red team 10), so a required one gets no default
        given = {} if required else {"default": default, "show_default": default is not None}
        if name == "alpha":  # several levels at once: --alpha 0.05,0.1 (issue 12B)
            opts.append(click.Option([flag, name], type=Levels(), required=required,
                                     help=help_text + ALPHA_HELP, **given))
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = (NumberOrWord(str(extra["cli_word"])) if "cli_word" in extra
                else _click_type(field.annotation))
        opts.append(click.Option([flag, name], type=kind, required=required, help=help_text,
                                 **given))
    return opts


class ScoreOptionText(click.ParamType):
    """``--score-option KEY=VALUE``: a malformed item (no ``=``, no key) is a usage error,
    exit 2, as a malformed number is (red team 26, newcomer F4); the key and value are
    checked by the score itself (exit 1)."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value)
        if "=" not in text or not text.split("=", 1)[0].strip():
            self.fail(f"takes KEY=VALUE, got {text!r}", param, ctx)
        return text


SCORE_OPTION = ScoreOptionText()


def parse_score_options(items: tuple[str, ...]) -> dict[str, Any]:
    """``--score-option KEY=VALUE`` items as a dict (true/false, int, float, else text)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InvalidInput(f"--score-option takes KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        low = raw.strip().lower()
        value: Any
        if low in ("true", "false"):
            value = low == "true"
        elif not plain_number_text(raw):  # int("1_0") is 10: such text stays text
            value = raw
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key.strip()] = value
    return out


def regression_options(ranged: bool) -> list[click.Option]:
    """``--preds``/``--lower-preds``/``--upper-preds``/``--targets`` (regression scores computed
    inside), and ``--score-range`` for a method with a public score range (``ranged``)."""
    from privcal.cli.app import FILE

    opts = [
        click.Option(["--preds"], type=FILE,
                     help="Regression predictions f(x), one per row (--score absolute); "
                     "FILE or FILE:COLUMN."),
        click.Option(["--lower-preds", "lower_preds"], type=FILE,
                     help="Lower quantile predictions (--score cqr); FILE or FILE:COLUMN."),
        click.Option(["--upper-preds", "upper_preds"], type=FILE,
                     help="Upper quantile predictions (--score cqr); FILE or FILE:COLUMN."),
        click.Option(["--targets"], type=FILE,
                     help="True regression targets y, one per row; FILE or FILE:COLUMN."),
    ]
    if ranged:
        opts.append(click.Option(
            ["--score-range", "score_range"], metavar="LO,HI", type=NumberTexts(
                "LO,HI", "--score-range takes two plain numbers LO,HI, got {value!r}", 2),
            help="Public range of the scores (sets --lower and --upper; recorded). Scores "
            "outside it are not clipped: they can only widen the interval or make it infinite."))
    return opts
