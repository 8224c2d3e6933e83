"""How a release and a dry run are printed for people (``--json`` prints the models instead)."""

from __future__ import annotations

import math
from typing import Any

import click

from privcal.calibrators.bound_floats import float_text
from privcal.cli.output import at_least, at_most

__all__ = ["fmt_threshold", "render_dry_run", "render_release",
           "render_thresholds", "threshold_lines", "ties_note"]


def fmt_threshold(t: float, regression: bool = False) -> str:
    """A threshold for people: +inf says what it means (the trivial set or interval)."""
    if math.isinf(t) and t > 0:
        return "+inf (every interval is (−inf, +inf))" if regression else (
            "+inf (every label: the trivial set)")
    return float_text(t)


_RANGE_SOURCES = {"score_range": "--score-range", "parameters": "--lower/--upper"}


def guarantee_verdict(ev: Any, failure: float = 0.0, rel: Any = None) -> str:
    """How an evaluation's coverage (sets or intervals) compares with the release's guarantee;
    ``failure``: the guarantee's ``failure_probability`` β (P-COQS's holds given an event of
    probability ≥ 1−β, so its releases' mean coverage is at least (1−β)·lower); ``rel``: the
    release, whose rank gives a plain split or a P-COQS release's tail
    (:func:`~privcal.calibrators.shortfall.shortfall`). A Mondrian release's groups whose
    test rows are strong evidence against their own guarantee are named after it (red team
    19: "meets" was said of a release whose group was covered at 0.42 against 0.9): a
    group's result this low has probability at most 0.01/G under its guarantee, G the
    groups with test rows (so a valid release has a group named with probability ≤ 0.01,
    not one of its groups in twenty: the review of red team 19)."""
    verdict = _marginal_verdict(ev, failure, rel)
    groups = [g for g in (getattr(ev, "by_group", None) or ()) if g.n]
    low = [g.group for g in groups if g.consistent_with_guarantee is False and (
        not g.marginal or (g.shortfall_probability is not None
                           and g.shortfall_probability <= 0.01 / len(groups)))]
    if not low:
        return verdict
    return (f"{verdict} over all rows; but group{'s' if len(low) > 1 else ''} "
            f"{', '.join(low)} far below {'their' if len(low) > 1 else 'its'} own guarantee "
            f"(a result that low has probability at most 0.01/{len(groups)} under it: check "
            "the inputs; the group lines)")


def _marginal_verdict(ev: Any, failure: float, rel: Any) -> str:
    from privcal.calibrators.shortfall import shortfall  # not for commands that compute none

    if ev.meets_guarantee:
        verdict = "meets"
    elif ev.consistent_with_guarantee:
        upper = at_most(ev.coverage_upper_95, ".4f")  # never printed below what it is
        verdict = f"below, but consistent with (95% upper bound {upper})"
    elif (found := shortfall(ev, failure, rel)) is not None:  # one release, marginal bound
        # how likely a test result this low is under the guarantee (calibrators/shortfall.py:
        # Markov's inequality, or an order statistic for split and P-COQS)
        u, low = ev.coverage_upper_95, (1 - failure) * ev.guaranteed_lower
        odds, how = found
        weight = ("strong evidence against it: check the inputs (column order, score, "
                  "the data's distribution)" if odds <= 0.01
                  else "weak evidence against it" if odds < 1 else "no evidence against it")
        given = (f"; it holds given an event of probability ≥ {at_least(1 - failure, '.4g')}"
                 f", so the mean coverage is ≥ {at_least(low, '.4g')}" if failure > 0 else "")
        return (f"below on this test set (95% upper bound {at_most(u, '.4f')}); the recorded "
                f"guarantee is marginal — over calibration sets and test points{given} — and one "
                f"release may fall below it; a test result this low has probability at most "
                f"{at_most(odds, '.2g')} under it ({how}): {weight}")
    else:
        verdict = "BELOW and inconsistent with"
    return f"{verdict} the recorded guarantee"


def render_release(rel: Any, budget: Any | None = None) -> None:
    """Print a release for people."""
    cov = rel.coverage
    click.echo(
        f"Release {rel.id} on dataset {rel.dataset!r}: {rel.method} {rel.calibrator_version}"
    )
    diag = rel.diagnostics or {}
    score = diag.get("score") if isinstance(diag.get("score"), dict) else None
    regression = bool(score) and score.get("name") in ("absolute", "cqr")
    click.echo(f"  threshold           {fmt_threshold(rel.threshold, regression)}")
    if score:
        hint = {"absolute": "  (intervals: privcal predict --preds …)",
                "cqr": "  (intervals: privcal predict --lower-preds … --upper-preds …)"}
        click.echo(f"  score               {score.get('name')}{hint.get(score.get('name'), '')}")
    ranged = diag.get("score_range")
    if isinstance(ranged, dict):
        click.echo(f"  score range         [{ranged.get('lower')}, {ranged.get('upper')}] "
                   f"({_RANGE_SOURCES.get(ranged.get('source'), ranged.get('source'))}); "
                   f"{ranged.get('outside')}")
    n = rel.shape.get("n") if isinstance(rel.shape, dict) else getattr(rel.shape, "n", None)
    click.echo(f"  n                   {n}" + (f"   rank {cov.rank}" if cov.rank else ""))
    click.echo(f"  coverage guarantee  {cov.statement}")
    if (assumes := rel.assumes) is not None:
        click.echo(f"  assuming            {assumes}")
    if (ties := ties_note(rel)) is not None:
        click.echo(f"  ties                {ties}")
    from privcal.calibrators.prediction_sets import outside_note

    if (band := outside_note(rel)) is not None:
        click.echo(f"  upper bound         {band}")
    priv = rel.privacy or {}
    click.echo(f"  privacy             {priv.get('statement') or priv.get('summary') or priv}")
    render_thresholds(rel)
    dropped = (rel.diagnostics or {}).get("dropped_rows")
    if dropped is not None:
        click.echo(f"  rows dropped        {dropped.get('duplicate_subject', 0)} duplicate "
                   f"subject, {dropped.get('subject_over_cap', 0)} subject past its cap")
    if budget is not None:
        click.echo(f"  budget left         {getattr(budget, 'summary', budget)}")


def ties_note(rel: Any) -> str | None:
    """Why the release's upper coverage bound does not apply, when a non-private method saw
    calibration scores tied at its threshold (its ``tied_at_threshold`` diagnostic; of the
    headline level for several levels); else None."""
    diag = rel.diagnostics or {}
    levels = diag.get("levels")
    if isinstance(levels, list) and levels and isinstance(levels[0], dict):
        # several levels: the headline (and its upper bound) is the first level's
        diag = levels[0].get("diagnostics") or {}
    tied = diag.get("tied_at_threshold") if isinstance(diag, dict) else None
    upper = rel.coverage.upper
    if isinstance(tied, int) and tied > 0 and upper is not None and upper < 1:
        return (f"{tied} other calibration scores equal the threshold: the upper bound "
                f"{upper:.6g} (no ties) does not apply to these scores")
    return None


def threshold_lines(rel: Any) -> list[tuple[str, str]]:
    """(where, what) of each group's and level's n, threshold and guaranteed bound — for
    levels/Mondrian releases only (none for others): what ``calibrate`` and ``release show``
    print (red team 23, newcomer F2: ``release show`` printed the headline threshold alone)."""
    from privcal.calibrators.group_sets import is_wrapped, threshold_rows

    if not is_wrapped(rel.method):
        return []
    return [(f"group {r['group']} (n={r['n']})" if r["group"] is not None else "level",
             f"α={r['alpha']:g}: threshold {fmt_threshold(r['threshold'])}, "
             f"coverage ≥ {at_least(r['lower'], '.6g')}{_holds(r['failure_probability'])}")
            for r in threshold_rows(rel)]


def _holds(failure: float) -> str:
    """`` w.p. ≥ 1 − β`` (rounded down) of a bound that can fail, as ``release list`` says it
    (red team 24, coverage F2: a P-COQS level's row read "coverage ≥ 0.9" unconditionally);
    nothing for a bound that always holds, or an older record without the figure."""
    if not failure > 0:  # (NaN: not recorded)
        return ""
    from fractions import Fraction

    from privcal.calibrators.bound_floats import text_at_most

    return f" w.p. ≥ {text_at_most(1 - failure, 1 - Fraction(repr(float(failure))))}"


def render_thresholds(rel: Any) -> None:
    """Each group's and level's n, threshold and guaranteed bound (levels/Mondrian only)."""
    for where, what in threshold_lines(rel):
        click.echo(f"  {where:<19} {what}")


def render_dry_run(report: Any) -> None:
    """Print a dry run for people."""
    cost = dict(report.cost or {"kind": "none (non-private)"})
    central = cost.pop("central_cost", None)  # a shuffled run's charge to the dataset's cap
    click.echo(f"dry run on dataset {report.dataset!r}: no score used, nothing written")
    click.echo(f"  cost        {_amounts(cost)}")
    if isinstance(central, dict):
        click.echo(f"  central     {_amounts(central)} (the amplified cost, against the "
                   "dataset's cap)")
    click.echo(f"  allowed     {'yes' if report.allowed else 'NO'} ({report.reason})")
    if report.trivial:
        click.echo(f"  release     +inf only, whatever the data — {report.guarantee}; "
                   "`privcal advise` says how many rows a finite threshold needs")
    click.echo(f"  remaining   {_amounts(report.remaining_before)} now")
    if report.remaining_after is not None:
        click.echo(f"              {_amounts(report.remaining_after)} after")


def _amounts(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "(no cap)"
