"""``privcal quickstart``: the whole story on bundled data, each step explained.

It uses only the public Python API (the same calls a platform would make), always on
its own throw-away SQLite ledger: it never writes into a ledger the user named (with
``--db-url`` or ``PRIVCAL_DATABASE_URL``), and says so. ``--json`` prints one document
summarising the run instead of the narration.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path
from typing import Any

import click

from privcal.cli.app import emit, json_option, main, pass_settings
from privcal.cli.output import at_least
from privcal.cli.render import fmt_threshold
from privcal.errors import BudgetRefused, Interrupted

_quiet = False


def _say(message: str = "", **style: Any) -> None:
    if not _quiet:
        click.secho(message, **style)


def _step(n: int, title: str, why: str) -> None:
    _say(f"\n[{n}] {title}", bold=True)
    for line in why.strip().splitlines():
        _say(f"    {line.strip()}")


def _show_release(rel: Any) -> None:
    _say(f"    → release {rel.id}: threshold {fmt_threshold(rel.threshold)}")
    _say(f"      coverage: {rel.coverage.statement}")
    _say(f"      assuming: {rel.assumes}")
    _say(f"      privacy:  {rel.privacy.get('statement', rel.privacy)}")


@main.command("quickstart")
@click.option("--keep", is_flag=True, help="Keep the throw-away ledger and print where it is.")
@json_option
@pass_settings
def quickstart(settings: Any, keep: bool, as_json: bool) -> None:
    """Run a complete private calibration on bundled example data, explaining each step.

    It always works on its own throw-away ledger, never on one you named."""
    import os
    import shutil
    import sys

    tmp = tempfile.mkdtemp(prefix="privcal-quickstart-")
    try:
        _demo(settings, keep, as_json, tmp)
    except (KeyboardInterrupt, BrokenPipeError) as exc:
        # the demo's ledger is its own: removed, and said so — not the generic "what was
        # committed stays (`privcal audit report` lists it)", which names a ledger the
        # newcomer does not have (red team 21, readme F5); a closed pipe (`| head`) ends it
        # quietly, as other commands' output does
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, BrokenPipeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)  # 128 + SIGPIPE, as a shell reports a writer cut off by `head`
        raise Interrupted("interrupted (Ctrl-C): the demo's throw-away ledger was "
                          + ("kept at " + tmp if keep else "removed")
                          + "; nothing else was touched") from None


def _demo(settings: Any, keep: bool, as_json: bool, tmp: str) -> None:
    """The body of :func:`quickstart` on its throw-away directory ``tmp``."""
    import os

    from privcal import Accountant, Ledger
    from privcal.data import load_example

    global _quiet
    _quiet = as_json
    named = settings.db_url or os.environ.get("PRIVCAL_DATABASE_URL")
    url = f"sqlite:///{Path(tmp) / 'ledger.sqlite'}"
    if named:
        click.echo(f"note: quickstart never writes into the ledger you named; it runs on its "
                   f"own throw-away ledger ({url})", err=True)
    ledger = Ledger(url)  # a new SQLite file: created and migrated on first use
    acct = Accountant(ledger)
    summary: dict[str, Any] = {"ledger": url, "kept": keep, "dataset": "digits-demo"}
    ex = load_example("digits")
    name = "digits-demo"

    n_cal, n_test = ex.calib_probs.shape[0], ex.test_probs.shape[0]
    _step(
        1,
        "The data",
        f"""
        {ex.description}
        Calibration set: {n_cal} rows; held-out test set: {n_test} rows; k = {ex.k} classes.
        The calibration labels are the private part.""",
    )

    _step(
        2,
        "A protected dataset with a privacy budget",
        f"""
        We register the calibration set as dataset {name!r} with a zCDP budget ρ = 0.5
        (reported as (ε, δ) at δ = 1e-6). Non-private releases are not allowed on it.
        Ledger (throw-away, removed at the end unless --keep): {ledger.url}""",
    )
    acct.create_dataset(name, rho=0.5, delta=1e-6, description=ex.description)
    _say(f"    → {acct.budget(name).summary}")

    common = dict(
        dataset=name,
        probs=ex.calib_probs,
        labels=ex.calib_labels,
        score="lac",
        alpha=0.1,
        requester="quickstart",
    )

    _step(
        3,
        "Calibrate with P-COQS (central ρ-zCDP noisy binary search)",
        """
        Score: lac = 1 − p_y. The accountant charges ρ = 0.2 BEFORE the data are touched,
        then P-COQS runs 34 noisy counts (exact discrete Gaussian noise) and releases a
        threshold. Its guarantee: given an event E of the noise with P(E) ≥ 95%, coverage
        ≥ 90% on average over calibration sets and test points (marginal: not a promise
        about this one release; `evaluate` weighs a held-out shortfall).""",
    )
    r1 = acct.calibrate("pcoqs", rho=0.2, **common)
    _show_release(r1)

    _step(
        4,
        "Calibrate with ExponQ (central ε-DP exponential mechanism)",
        """
        ε = 0.5 pure DP. On a zCDP budget a pure-ε cost counts as ε²/2 = 0.125.""",
    )
    r2 = acct.calibrate("exponq", epsilon=0.5, **common)
    _show_release(r2)
    _say(f"    → {acct.budget(name).summary}")
    summary["releases"] = [r1, r2]
    summary["refused"] = []

    _step(
        5,
        "A non-private split-conformal release is refused",
        """
        Plain split conformal releases an exact order statistic of the private scores;
        this dataset does not allow non-private releases, so nothing is charged or written.""",
    )
    try:
        acct.calibrate("split", **common)
        _say("    → unexpectedly accepted")  # pragma: no cover - a bug if reached
    except BudgetRefused as exc:
        _say(f"    → refused (exit code {exc.exit_code}): {exc}")
        summary["refused"].append({"method": "split", "reason": str(exc)})

    _step(
        6,
        "Overspending is refused",
        """
        0.2 + 0.125 = 0.325 of ρ = 0.5 is spent. Another P-COQS run at ρ = 0.3 would
        exceed the cap: the accountant refuses it, and the ledger is unchanged.""",
    )
    before = ledger.head()
    try:
        acct.calibrate("pcoqs", rho=0.3, **common)
        _say("    → unexpectedly accepted")  # pragma: no cover
    except BudgetRefused as exc:
        _say(f"    → refused (exit code {exc.exit_code}): {exc}")
        summary["refused"].append({"method": "pcoqs", "rho": "0.3", "reason": str(exc)})
    summary["log_head_unchanged_after_refusals"] = ledger.head() == before
    _say(f"    → log head unchanged: {summary['log_head_unchanged_after_refusals']}")

    _step(
        7,
        "Predict and evaluate on held-out rows",
        """
        Each release turns into prediction sets {y : 1 − p_y ≤ threshold}; we measure
        coverage, mean set size and the fraction of singleton sets on the test rows.""",
    )
    summary["evaluations"] = {}
    for rel in (r1, r2):
        ev = rel.evaluate(ex.test_probs, ex.test_labels)
        summary["evaluations"][rel.method] = ev
        _say(
            f"    → {rel.method:7s} coverage {ev.coverage:.3f}"
            f" (guaranteed ≥ {at_least(ev.guaranteed_lower, '.3f')}),"
            f" mean set size {ev.mean_set_size:.2f},"
            f" singletons {ev.singleton_fraction:.2f}"
        )
    d, evs = r2.coverage.details, summary["evaluations"]
    if (evs["exponq"].mean_set_size > evs["pcoqs"].mean_set_size
            and isinstance(d.get("q_tilde"), float) and isinstance(d.get("sensitivity"), float)):
        _say(textwrap.fill(
            f"ExponQ's sets are the larger: to keep ≥ 90% under ε = {d['epsilon']:g} on "
            f"n = {d['n']} rows it aims at the q̃ = {d['q_tilde']:.3f} quantile, where its "
            f"exponential mechanism's score has sensitivity 1/(1 − q̃) = {d['sensitivity']:.1f}, "
            "so the threshold it draws is noisy; more rows or a larger ε narrow both "
            "(`privcal advise --method exponq` gives the n it needs to be finite).",
            width=88, initial_indent="    ", subsequent_indent="    "))

    _step(
        8,
        "Audit",
        """
        Every dataset, charge and release is an entry in a hash-chained log (RFC 8785
        payloads, RFC 9162-style hashes). Verification recomputes every hash and every
        recorded guarantee with the installed code.""",
    )
    report = acct.verify()
    _say(f"    → {report.summary}")
    _say(f"    → keep this head outside the database to detect truncation: {ledger.head()}")
    summary["budget"] = acct.budget(name)
    summary["verify"] = report
    summary["head"] = str(ledger.head())

    ledger.close()
    if keep:
        _say(f"ledger kept at {url}")
        _say(f"\nNext: `privcal --db-url {url} budget show --dataset digits-demo`, "
             f"`privcal --db-url {url} audit verify`, `privcal calibrate pcoqs --help`.")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        _say(f"the throw-away ledger {url} was removed (--keep keeps it)")
        # the demo's ledger is gone: point at the user's own (red team 14: the hint named
        # `budget show` of a dataset that no longer existed)
        _say("\nNext: `privcal dataset create --dataset NAME --rho 1`, then "
             "`privcal calibrate pcoqs --help` (or `privcal quickstart --keep` to explore "
             "this demo's ledger).")
    if as_json:
        emit(summary, as_json=True)
