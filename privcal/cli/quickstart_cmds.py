"""``privcal quickstart``: the whole story on bundled data, each step explained.

It uses only the public Python API (the same calls a platform would make), on a
throw-away SQLite ledger unless ``--db-url`` names one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from privcal.cli.app import main, pass_settings
from privcal.cli.calibrate_cmds import fmt_threshold
from privcal.errors import BudgetRefused


def _step(n: int, title: str, why: str) -> None:
    click.secho(f"\n[{n}] {title}", bold=True)
    for line in why.strip().splitlines():
        click.echo(f"    {line.strip()}")


def _show_release(rel: Any) -> None:
    click.echo(f"    → release {rel.id}: threshold {fmt_threshold(rel.threshold)}")
    click.echo(f"      coverage: {rel.coverage.statement}")
    click.echo(f"      privacy:  {rel.privacy.get('statement', rel.privacy)}")


@main.command("quickstart")
@click.option("--keep", is_flag=True, help="Keep the throw-away ledger and print where it is.")
@pass_settings
def quickstart(settings: Any, keep: bool) -> None:
    """Run a complete private calibration on bundled example data, explaining each step."""
    from privcal import Accountant, Ledger
    from privcal.data import load_example

    tmp = None
    url = settings.db_url
    if url is None:
        tmp = tempfile.mkdtemp(prefix="privcal-quickstart-")
        url = f"sqlite:///{Path(tmp) / 'ledger.sqlite'}"
    ledger = Ledger(url)
    if tmp is not None:
        ledger.upgrade()  # a fresh throw-away file: create the schema with the migrations
    acct = Accountant(ledger)
    ex = load_example("digits")
    name = "digits-demo"

    _step(
        1,
        "The data",
        f"""
        {ex.description}
        Calibration set: {ex.calib_probs.shape[0]} rows; held-out test set: {ex.test_probs.shape[0]}
        rows; k = {ex.k} classes. The calibration labels are the private part.""",
    )

    _step(
        2,
        "A protected dataset with a privacy budget",
        f"""
        We register the calibration set as dataset {name!r} with a zCDP budget ρ = 0.5
        (reported as (ε, δ) at δ = 1e-6). Non-private releases are not allowed on it.
        Ledger: {ledger.url}""",
    )
    acct.create_dataset(name, rho=0.5, delta=1e-6, description=ex.description)
    click.echo(f"    → {acct.budget(name).summary}")

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
        threshold. Its guarantee: coverage ≥ 90% with probability ≥ 95% over the noise.""",
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
    click.echo(f"    → {acct.budget(name).summary}")

    _step(
        5,
        "A non-private split-conformal release is refused",
        """
        Plain split conformal releases an exact order statistic of the private scores;
        this dataset does not allow non-private releases, so nothing is charged or written.""",
    )
    try:
        acct.calibrate("split", **common)
        click.echo("    → unexpectedly accepted")  # pragma: no cover - a bug if reached
    except BudgetRefused as exc:
        click.echo(f"    → refused (exit code {exc.exit_code}): {exc}")

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
        click.echo("    → unexpectedly accepted")  # pragma: no cover
    except BudgetRefused as exc:
        click.echo(f"    → refused (exit code {exc.exit_code}): {exc}")
    click.echo(f"    → log head unchanged: {ledger.head() == before}")

    _step(
        7,
        "Predict and evaluate on held-out rows",
        """
        Each release turns into prediction sets {y : 1 − p_y ≤ threshold}; we measure
        coverage, mean set size and the fraction of singleton sets on the test rows.""",
    )
    for rel in (r1, r2):
        ev = rel.evaluate(ex.test_probs, ex.test_labels)
        click.echo(
            f"    → {rel.method:7s} coverage {ev.coverage:.3f}"
            f" (guaranteed ≥ {ev.guaranteed_lower:.3f}), mean set size {ev.mean_set_size:.2f},"
            f" singletons {ev.singleton_fraction:.2f}"
        )

    _step(
        8,
        "Audit",
        """
        Every dataset, charge and release is an entry in a hash-chained log (RFC 8785
        payloads, RFC 9162-style hashes). Verification recomputes every hash and every
        recorded guarantee with the installed code.""",
    )
    report = acct.verify()
    click.echo(f"    → {report.summary}")
    click.echo(f"    → keep this head outside the database to detect truncation: {ledger.head()}")

    click.echo(
        "\nNext: `privcal calibrate pcoqs --help`, `privcal budget show NAME`, "
        "`privcal audit verify`."
    )
    ledger.close()
    if tmp is not None:
        if keep:
            click.echo(f"ledger kept at {url}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
