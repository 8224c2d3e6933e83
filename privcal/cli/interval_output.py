"""``privcal predict`` / ``privcal evaluate`` for a regression release: intervals out.

Thin: read the predictions, call :mod:`privcal.calibrators.intervals`, write or print.
±∞ bounds (a +∞ threshold) are kept: ``.npy``/``.npz``/``.csv``/``.parquet`` hold IEEE
infinities, ``.json`` and ``--json`` write them as the strings ``"Infinity"`` /
``"-Infinity"`` (as every privcal JSON document does), and people are told how many
intervals are infinite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from privcal.calibrators.bound_floats import float_text
from privcal.cli.app import OUT_SUFFIXES, check_out, emit, info, to_jsonable
from privcal.cli.group_options import echo_groups
from privcal.cli.output import at_least
from privcal.cli.render import guarantee_verdict
from privcal.data.files import load_array
from privcal.errors import InvalidInput

__all__ = ["emit_evaluation", "emit_intervals", "load_regression_inputs", "write_intervals"]


def load_regression_inputs(preds: str | None, lower_preds: str | None,
                           upper_preds: str | None) -> dict[str, Any]:
    """The prediction arrays named on the command line (absent ones are None)."""
    return {
        "preds": load_array(preds, "preds") if preds else None,
        "lower_preds": load_array(lower_preds, "lower_preds") if lower_preds else None,
        "upper_preds": load_array(upper_preds, "upper_preds") if upper_preds else None,
    }


def write_intervals(iv: np.ndarray, out: str | None, as_json: bool) -> None:
    """Write the n×2 intervals: ``.npy``/``.npz`` as the matrix, ``.json`` as [lo, hi] pairs,
    ``.csv``/``.parquet`` as a table with columns ``lower``, ``upper``."""

    if out is None:
        return
    path, suffix = check_out(out)
    try:
        if suffix == ".npy":
            np.save(path, iv)
        elif suffix == ".npz":
            np.savez_compressed(path, intervals=iv)
        elif suffix == ".json":
            path.write_text(json.dumps(to_jsonable(iv.tolist())))
        elif suffix in OUT_SUFFIXES:
            _write_table(iv, path, suffix)
    except OSError as exc:
        raise InvalidInput(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
    if not as_json:
        info(f"wrote {iv.shape[0]} intervals to {path}")


def _write_table(iv: np.ndarray, path: Path, suffix: str) -> None:
    import pyarrow as pa

    tab = pa.table({"lower": pa.array(iv[:, 0]), "upper": pa.array(iv[:, 1])})
    if suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(tab, path)
    else:
        import pyarrow.parquet as pq

        pq.write_table(tab, path)


def _infinite(iv: np.ndarray) -> int:
    return int((~(np.isfinite(iv[:, 0]) & np.isfinite(iv[:, 1]))).sum())


def emit_intervals(rel: Any, iv: np.ndarray, out: str | None, as_json: bool) -> None:
    """Print the intervals (first 20 for people) or the ``--json`` document."""
    write_intervals(iv, out, as_json)
    n_inf = _infinite(iv)

    def human() -> None:
        if out is None:
            for i, (lo, hi) in enumerate(iv[:20]):
                click.echo(f"{i}\t[{float_text(lo)}, {float_text(hi)}]")
            if iv.shape[0] > 20:
                click.echo(f"… {iv.shape[0] - 20} more (use --out FILE or --json)")
        lengths = iv[:, 1] - iv[:, 0]
        summary = (f"{iv.shape[0]} intervals, mean length {float(np.mean(lengths)):.6g}"
                   if n_inf == 0 else
                   f"{iv.shape[0]} intervals, {n_inf} of them (−inf, +inf) (threshold +inf)")
        click.echo(summary, err=out is None)

    doc = {"release": rel.id, "threshold": rel.threshold, "intervals": iv.tolist(),
           "infinite_count": n_inf}
    emit(doc, as_json=as_json, human=human)


def emit_evaluation(rel: Any, ev: Any, as_json: bool) -> None:
    """Print an interval evaluation (coverage, lengths, how many infinite) or its JSON."""

    def human() -> None:
        click.echo(f"release {rel.id} ({rel.method}), {ev.n} held-out points")
        lower = at_least(ev.guaranteed_lower, ".4f")
        click.echo(f"  coverage            {at_least(ev.coverage, '.4f')}   (guaranteed ≥ {lower})")
        if ev.infinite_count:
            finite = ("none finite" if ev.mean_finite_length is None
                      else f"mean of the finite ones {ev.mean_finite_length:.6g}")
            click.echo(f"  mean length         +inf: {ev.infinite_count} of {ev.n} intervals "
                       f"are (−inf, +inf); {finite}")
        else:
            click.echo(f"  mean length         {ev.mean_length:.6g}")
        click.echo(f"  median length       {ev.median_length:.6g}")
        echo_groups(ev)
        verdict = guarantee_verdict(ev, rel.coverage.failure_probability, rel)
        click.echo(f"  guarantee           {verdict}")

    emit(ev, as_json=as_json, human=human)
