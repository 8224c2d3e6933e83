"""CLI options for several levels and Mondrian groups (issue 12 part B).

``--alpha 0.05,0.1,0.2`` (every calibrate command), ``--mondrian label`` / ``--groups
FILE[:COLUMN]`` with ``--public-groups`` (central methods), and ``--alpha A|all`` /
``--groups`` for ``predict`` and ``evaluate``. Thin: the library decides
(:mod:`privcal.accountant.wrapping`, :mod:`privcal.calibrators.group_sets`).
"""

from __future__ import annotations

from typing import Any

import click

from privcal.cli.app import FILE
from privcal.cli.output import at_least, at_most
from privcal.data.files import load_array
from privcal.errors import InvalidInput, check_number_text

__all__ = ["ALPHA_HELP", "ALPHA_OPTION", "GROUPS_OPTION", "AlphaLevels", "echo_groups",
           "emit_all_levels", "group_args", "group_options", "load_groups", "one_level"]

ALPHA_HELP = ("; several at once: 0.05,0.1,0.2 (one threshold per level, the costs add up)")


class AlphaLevels(click.ParamType):
    """A level α, or several separated by commas (a list)."""

    name = "ALPHA[,ALPHA…]"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, float | list | tuple):
            return value
        text = str(value)
        try:
            parts = [float(x) for x in text.split(",")]
        except ValueError:
            self.fail(f"{text!r} is not a number or a comma-separated list of numbers",
                      param, ctx)
        return parts[0] if len(parts) == 1 else parts


def group_options(cal: Any) -> list[click.Option]:
    """``--mondrian``, ``--groups``, ``--public-groups`` for a method that can be wrapped."""
    from privcal.calibrators.wrapped import WRAPPABLE

    if cal.privacy_model not in WRAPPABLE or getattr(cal, "interactive", False):
        return []
    return [
        click.Option(["--mondrian"], type=click.Choice(["label", "column"]),
                     help="One threshold per class (label: label-conditional sets) or per "
                     "group of --groups (column), each by this method, charged once. Needs "
                     "--public-groups."),
        click.Option(["--groups"], type=FILE,
                     help="The group of every row (FILE or FILE:COLUMN), for --mondrian column "
                     "(implied)."),
        click.Option(["--public-groups"], is_flag=True,
                     help="Assert that every record's group (for --mondrian label: its class) "
                     "is public or fixed in advance: the group sizes are recorded, and the "
                     "single charge (parallel composition) rests on it."),
    ]


def group_args(kw: dict[str, Any]) -> dict[str, Any]:
    """The library's ``mondrian``/``groups``/``public_groups`` from the parsed options."""
    out: dict[str, Any] = {}
    if kw.get("mondrian") is not None:
        out["mondrian"] = kw["mondrian"]
    if kw.get("groups"):
        out["groups"] = load_groups(kw["groups"])
    if kw.get("public_groups"):
        out["public_groups"] = True
    return out


ALPHA_OPTION = click.option(
    "--alpha", default=None,
    help="The level α of a release with several levels; predict also takes 'all'.")
GROUPS_OPTION = click.option(
    "--groups", default=None, type=FILE,
    help="The group of every row (FILE or FILE:COLUMN), for a release with one threshold per "
    "group of a column (--mondrian column); label groups need none.")


def load_groups(spec: str | None) -> Any:
    """The rows' groups of ``--groups FILE[:COLUMN]`` (as text), or None."""
    return load_array(spec, "groups", ids=True) if spec else None


def one_level(alpha: str | None) -> float | None:
    """``--alpha A`` as a number (None when not given)."""
    if alpha is None:
        return None
    try:  # float("0_1") is 1.0 and float("０.1") 0.1 (red team 10)
        check_number_text(alpha, "--alpha")
        return float(alpha)
    except ValueError:
        raise InvalidInput(f"--alpha takes a level of the release (or, for predict, 'all'), "
                           f"got {alpha!r}") from None


def emit_all_levels(rel: Any, probs: Any, score: str | None, groups: Any, out: str | None,
                    as_json: bool) -> None:
    """``predict --alpha all``: the sets at every level of the release; ``--out`` .json
    ({α: lists}) or .npz (one n×k array per level, ``alpha=0.1``)."""
    from pathlib import Path

    import numpy as np

    from privcal.calibrators.group_sets import level_sets
    from privcal.calibrators.prediction_sets import release_classes, set_labels
    from privcal.cli.app import emit, info

    levels = (rel.params or {}).get("alpha")
    if not isinstance(levels, list):
        raise InvalidInput(f"release {rel.id} has one level α = {levels}: give no --alpha all")
    by_level = level_sets(rel, probs, score_name=score, groups=groups)  # nested: one draw
    classes = release_classes(rel)
    if out is not None:
        path = Path(out)
        if path.suffix.lower() not in (".json", ".npz"):
            raise InvalidInput("--alpha all writes one set list per level: --out .json or .npz")
        if not path.parent.is_dir():
            raise InvalidInput(f"--out {out}: the directory {path.parent} does not exist")
        try:
            if path.suffix.lower() == ".json":
                import json

                path.write_text(json.dumps({f"{a:g}": set_labels(s, classes)
                                            for a, s in by_level}))
            else:
                np.savez_compressed(path, **{f"alpha={a:g}": s for a, s in by_level})
        except OSError as exc:
            raise InvalidInput(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
        if not as_json:
            info(f"wrote {len(by_level)} levels of prediction sets to {path}")

    def human() -> None:
        for a, s in by_level:
            click.echo(f"α={a:g}: {s.shape[0]} sets, mean size {s.sum(axis=1).mean():.3f}")

    doc: dict[str, Any] = {"release": rel.id,
                           "levels": {f"{a:g}": set_labels(s, classes) for a, s in by_level}}
    if classes is not None:
        doc["classes"] = classes
    emit(doc, as_json=as_json, human=human)


def echo_groups(ev: Any) -> None:
    """Per-group lines of a Mondrian release's evaluation (nothing for others): coverage
    against the group's own bound, its mean set size or interval length, and whether the
    group's test rows are below its guarantee."""
    for g in ev.by_group or ():
        cov = "-" if g.coverage is None else at_least(g.coverage, '.4f')
        if g.mean_length is not None:
            size = f"mean length {g.mean_length:.6g}"
        else:
            size = f"mean set size {'-' if g.mean_set_size is None else f'{g.mean_set_size:.3f}'}"
        below = ("" if g.consistent_with_guarantee is not False else
                 f"; below its guarantee (95% upper bound {at_most(g.coverage_upper_95, '.4f')}"
                 + ("" if g.shortfall_probability is None else
                    f"; a result this low has probability at most "
                    f"{at_most(g.shortfall_probability, '.2g')} under it") + ")")
        click.echo(f"  group {g.group:<13} n={g.n:<6} coverage {cov} (guaranteed ≥ "
                   f"{at_least(g.guaranteed_lower, '.4f')}), {size}{below}")
