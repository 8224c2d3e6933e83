"""``privcal predict`` and ``privcal evaluate``: what a stored release is used for.

Thin: load the inputs, call :mod:`privcal.calibrators.prediction_sets` and
:mod:`privcal.calibrators.evaluation` on the release, print or write the result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from privcal.cli.app import (
    FILE,
    check_out,
    emit,
    info,
    json_option,
    main,
    pass_settings,
)
from privcal.cli.group_options import (
    ALPHA_OPTION,
    GROUPS_OPTION,
    echo_groups,
    emit_all_levels,
    load_groups,
    one_level,
)
from privcal.cli.inputs import labels_in_probs, load_labels
from privcal.cli.number_types import Integer
from privcal.cli.output import at_least
from privcal.cli.render import guarantee_verdict
from privcal.data.csv_headers import numbers_header
from privcal.data.files import load_array, prob_column_names
from privcal.errors import InvalidInput


def _regression_given(preds: str | None, lower_preds: str | None, upper_preds: str | None,
                      probs: str | None) -> bool:
    """Whether the request is for intervals (regression predictions) rather than sets."""
    regression = any(p is not None for p in (preds, lower_preds, upper_preds))
    if regression and probs is not None:
        raise InvalidInput("give --probs (a classification release) or --preds / "
                           "--lower-preds/--upper-preds (a regression release), not both")
    if not regression and probs is None:
        raise InvalidInput("give --probs (classification) or --preds, or --lower-preds and "
                           "--upper-preds (regression)")
    return regression


def _load_probs(rel: Any, probs: str, columns: str | None,
                exclude: tuple[str, ...] = ()) -> np.ndarray:
    """The --probs matrix, its columns in the release's class order: a table with a header
    is matched by column name when the release records class names (a missing or extra
    class is an error; a header of column numbers other than 0 … k-1 in order, without
    names to match, is refused); a headerless CSV or an array is taken by position."""
    from privcal.calibrators.group_sets import align_columns
    from privcal.calibrators.prediction_sets import release_classes

    classes = release_classes(rel)
    if classes is not None and (line := numbers_header(probs, list(classes))) is not None:
        raise InvalidInput(
            f"--probs {probs}: its first line {line!r} spells the release's class names, but "
            "a CSV header of numbers cannot be told from a row of data: remove that line and "
            f"give the columns in the release's order ({','.join(map(str, classes))}), or "
            "save the table as .parquet, whose column names are text")
    p = load_array(probs, "probs", matrix=True, columns=columns, exclude=exclude)
    names = prob_column_names(probs, columns, exclude)
    return np.asarray(align_columns(rel, p, names, where=f"--probs {probs}"))


PROBS_COLUMNS_HELP = (" A header is matched to the release's class names (any order; a "
                      "missing or extra class is an error); without a header, by position.")


def _regression_options(f: Any) -> Any:
    for opt in reversed((
        click.option("--preds", default=None, type=FILE,
                     help="Regression predictions f(x) (a release on score absolute)."),
        click.option("--lower-preds", default=None, type=FILE,
                     help="Lower quantile predictions (a release on score cqr)."),
        click.option("--upper-preds", default=None, type=FILE,
                     help="Upper quantile predictions (a release on score cqr)."),
    )):
        f = opt(f)
    return f


def _interval_level(alpha: str | None) -> float | None:
    """The one level of a regression request (``--alpha all`` is for prediction sets)."""
    if alpha is not None and alpha.strip().lower() == "all":
        raise InvalidInput("--alpha all writes prediction sets; for intervals choose one "
                           "level (--alpha A)")
    return one_level(alpha)


def _write_sets(sets: np.ndarray, out: str | None, as_json: bool,
                classes: list[str] | None = None) -> None:
    """Write the n×k boolean sets: ``.npy``/``.npz`` as the matrix, ``.json`` as lists of
    labels, ``.csv``/``.parquet`` as a table with one 0/1 column per class (named by the
    release's class names, else ``0`` … ``k-1``) and the set ``size``."""
    if out is None:
        return
    path, suffix = check_out(out)
    try:
        _write_sets_to(sets, path, suffix, classes)
    except OSError as exc:
        raise InvalidInput(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
    if not as_json:
        info(f"wrote {sets.shape[0]} prediction sets to {path}")


def _formula(name: str) -> bool:
    """Whether a spreadsheet reads CSV cell ``name`` as a formula (OWASP's CSV injection:
    a leading ``=``, ``+``, ``-``, ``@``, tab or CR), a number such as ``-1`` excepted."""
    if name[:1] not in ("=", "+", "-", "@", "\t", "\r"):
        return False
    try:
        float(name)
    except ValueError:
        return True
    return False


def _write_sets_to(sets: np.ndarray, path: Path, suffix: str,
                   classes: list[str] | None) -> None:
    from privcal.calibrators.prediction_sets import set_labels

    if suffix == ".npy":
        np.save(path, sets)
    elif suffix == ".npz":
        np.savez_compressed(path, sets=sets)
    elif suffix == ".json":
        import json

        path.write_text(json.dumps(set_labels(sets, classes)))
    else:
        import pyarrow as pa

        names = classes if classes is not None else [str(j) for j in range(sets.shape[1])]
        if "size" in names:
            raise InvalidInput("a class is named 'size', the column of set sizes; "
                               "write --out .json or .npy")
        if suffix == ".csv" and (bad := next((c for c in names if _formula(c)), None)):
            raise InvalidInput(f"the class name {bad!r:.40} begins with {bad[0]!r}: a spreadsheet "
                               "opening the CSV would run its header as a formula (red team 26, "
                               "F5); write --out .parquet, .json or .npy")
        cols = {names[j]: pa.array(sets[:, j].astype(np.int8)) for j in range(sets.shape[1])}
        cols["size"] = pa.array(sets.sum(axis=1).astype(np.int64))
        tab = pa.table(cols)
        if suffix == ".csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(tab, path)
        else:
            import pyarrow.parquet as pq

            pq.write_table(tab, path)


@main.command("predict")
@click.option("--release", "release_id", type=Integer(), required=True, help="Release id.")
@click.option("--probs", default=None, type=FILE,
              help="n×k probabilities of the points to predict (FILE:FIRST:LAST picks columns)."
              + PROBS_COLUMNS_HELP)
@_regression_options
@click.option("--columns", default=None, help="The probability columns of a --probs table.")
@click.option("--score", default=None,
              help="Score name, if the release records none (made from --scores without "
                   "--score, or by a session opened without --score): used with its "
                   "default options. A recorded score is used; another one is refused.")
@ALPHA_OPTION
@GROUPS_OPTION
@click.option(
    "--out", default=None, type=FILE,
    help="Write the sets to .npy/.npz (boolean n×k), .json (lists), or .csv/.parquet (one 0/1 "
    "column per class, and the size); intervals as n×2 [lower, upper] (columns lower, upper); "
    "with --alpha all: .json or .npz, one entry per level.",
)
@json_option
@pass_settings
def predict(
    settings: Any, release_id: int, probs: str | None, preds: str | None,
    lower_preds: str | None, upper_preds: str | None, columns: str | None, score: str | None,
    alpha: str | None, groups: str | None, out: str | None, as_json: bool
) -> None:
    """Prediction sets {y : S(x, y) ≤ threshold} of a released threshold; for a regression
    release (score absolute or cqr), the intervals [lower, upper] (±inf when it is +inf).

    A Mondrian release uses each row's threshold: label groups test each label y against
    its class's threshold; column groups need --groups. A release with several levels takes
    --alpha (one level, or 'all')."""
    from privcal.calibrators.group_sets import release_sets
    from privcal.calibrators.prediction_sets import release_classes, set_labels

    regression = _regression_given(preds, lower_preds, upper_preds, probs)
    # as its audit entry recorded it
    rel = settings.ledger(existing=True).release(release_id, checked=True)
    if regression:
        from privcal.calibrators.intervals import release_intervals
        from privcal.cli.interval_output import emit_intervals, load_regression_inputs

        iv = release_intervals(rel, score_name=score, alpha=_interval_level(alpha),
                               groups=load_groups(groups),
                               **load_regression_inputs(preds, lower_preds, upper_preds))
        emit_intervals(rel, iv, out, as_json)
        return
    assert probs is not None
    p = _load_probs(rel, probs, columns)
    if alpha is not None and alpha.strip().lower() == "all":
        emit_all_levels(rel, p, score, load_groups(groups), out, as_json)
        return
    sets = release_sets(rel, p, score_name=score, alpha=one_level(alpha),
                        groups=load_groups(groups))
    classes = release_classes(rel)
    _write_sets(sets, out, as_json, classes)
    lists = set_labels(sets, classes)
    sizes = sets.sum(axis=1)

    def human() -> None:
        if out is None:
            for i, s in enumerate(lists[:20]):
                click.echo(f"{i}\t{s}")
            if len(lists) > 20:
                click.echo(f"… {len(lists) - 20} more (use --out FILE or --json)")
        click.echo(f"{len(lists)} sets, mean size {sizes.mean():.3f}", err=out is None)

    doc: dict[str, Any] = {"release": rel.id, "threshold": rel.threshold, "sets": lists}
    if alpha is not None:
        doc["alpha"] = one_level(alpha)
    if classes is not None:
        doc["classes"] = classes
    emit(doc, as_json=as_json, human=human)


@main.command("evaluate")
@click.option("--release", "release_id", type=Integer(), required=True, help="Release id.")
@click.option("--probs", default=None, type=FILE,
              help="n×k probabilities of held-out points." + PROBS_COLUMNS_HELP)
@_regression_options
@click.option("--targets", default=None, type=FILE,
              help="True regression targets of held-out points (with --preds, or "
              "--lower-preds/--upper-preds).")
@click.option("--columns", default=None, help="The probability columns of a --probs table.")
@click.option("--labels", default=None, type=FILE, help="Their true labels (FILE or FILE:COLUMN).")
@click.option("--label-column", default=None,
              help="The labels' column, of --labels or of the --probs table.")
@click.option("--score", default=None,
              help="Score name, if the release records none (made from --scores without "
                   "--score, or by a session opened without --score): used with its "
                   "default options. A recorded score is used; another one is refused.")
@ALPHA_OPTION
@GROUPS_OPTION
@json_option
@pass_settings
def evaluate(
    settings: Any, release_id: int, probs: str | None, preds: str | None,
    lower_preds: str | None, upper_preds: str | None, targets: str | None,
    columns: str | None, labels: str | None, label_column: str | None, score: str | None,
    alpha: str | None, groups: str | None, as_json: bool
) -> None:
    """Empirical coverage, mean set size and singleton fraction on held-out data (and, for a
    Mondrian release, per group against each group's guarantee); for a regression release,
    coverage and interval length (infinite intervals counted)."""
    if _regression_given(preds, lower_preds, upper_preds, probs):
        from privcal.cli.interval_output import emit_evaluation, load_regression_inputs

        if targets is None:
            raise click.UsageError("give the true targets: --targets FILE")
        rel = settings.accountant(existing=True).release(release_id)
        level = _interval_level(alpha)
        grouped = load_groups(groups)  # the files in the order they were always read
        inputs = load_regression_inputs(preds, lower_preds, upper_preds)
        ev = rel.evaluate_interval(load_array(targets, "targets"), score_name=score,
                                   alpha=level, groups=grouped, **inputs)
        emit_evaluation(rel, ev, as_json)
        return
    if targets is not None:
        raise InvalidInput("--targets are regression targets; with --probs give --labels")
    assert probs is not None
    labels, label_column = labels_in_probs(labels, label_column, probs)
    if labels is None and label_column is None:
        raise click.UsageError("give the true labels: --labels FILE or --label-column COLUMN")
    rel = settings.accountant(existing=True).release(release_id)  # coverage typed (.lower)
    exclude = (label_column,) if label_column else ()
    ev = rel.evaluate(_load_probs(rel, probs, columns, exclude),
                      load_labels(labels, label_column, probs, False, columns), score_name=score,
                      alpha=one_level(alpha), groups=load_groups(groups))

    def human() -> None:
        click.echo(f"release {rel.id} ({rel.method}), {ev.n} held-out points")
        lower = at_least(ev.guaranteed_lower, ".4f")
        click.echo(f"  coverage            {at_least(ev.coverage, '.4f')}   (guaranteed ≥ {lower})")
        click.echo(f"  mean set size       {ev.mean_set_size:.3f}")
        click.echo(f"  singleton fraction  {ev.singleton_fraction:.3f}")
        verdict = guarantee_verdict(ev, rel.coverage.failure_probability, rel)
        click.echo(f"  guarantee           {verdict}")
        echo_groups(ev)

    emit(ev, as_json=as_json, human=human)
