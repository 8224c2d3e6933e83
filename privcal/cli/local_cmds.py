"""``privcal advise``: which local-DP calibrator (LDP-CP-L or LDP-CP-S) for this (n, k, ε)?

A thin skin over :func:`privcal.calibrators.advisor.advise` (seed 004, §4.1).
"""

from __future__ import annotations

import click

from privcal.cli.app import emit, json_option, main, table


def _fmt(x: float | int | None, spec: str = ".4g") -> str:
    return "—" if x is None else format(x, spec)


@main.command("advise")
@click.option("--n", "n", type=int, required=True, help="Number of calibration subjects.")
@click.option("--k", "k", type=int, required=True, help="Number of classes.")
@click.option("--epsilon", type=float, required=True, help="Local ε each subject spends.")
@click.option("--alpha", type=float, required=True, help="Miscoverage level α.")
@click.option(
    "--failure-probability",
    "failure_probability",
    type=float,
    default=None,
    help="Failure probability δ of the coverage bound (over the data and the users' "
    "randomized responses; not a DP δ)  [default: 0.001]",
)
@click.option("--delta", type=float, default=None, hidden=True,
              help="Deprecated spelling of --failure-probability.")
@click.option(
    "--slack",
    type=float,
    default=None,
    help="A slack Δ to reach: report the smallest ε and n for each method.",
)
@click.option(
    "--rounds",
    type=int,
    default=None,
    help="LDP-CP-S rounds T (default: the T minimising Δ_S(T) + 2^-T for this n).",
)
@json_option
def advise_cmd(
    n: int,
    k: int,
    epsilon: float,
    alpha: float,
    failure_probability: float | None,
    delta: float | None,
    slack: float | None,
    rounds: int | None,
    as_json: bool,
) -> None:
    """Compare LDP-CP-L (Δ_L) and LDP-CP-S (Δ_S) for N subjects, K classes and ε."""
    from privcal.calibrators.advisor import advise
    from privcal.errors import InvalidInput

    if delta is not None and failure_probability is not None:
        raise InvalidInput("give --failure-probability or its deprecated spelling --delta")
    delta = next((v for v in (failure_probability, delta) if v is not None), 0.001)
    adv = advise(n, k, epsilon, alpha, delta, slack=slack, rounds=rounds)

    def human() -> None:
        rows = []
        for m in (adv.label, adv.score):
            row = {
                "method": m.method,
                "slack Δ": _fmt(m.slack),
                "target 1−α+Δ": _fmt(m.target) + (" (trivial)" if m.trivial else ""),
                "rounds": _fmt(m.rounds, "d"),
                "privacy": m.privacy,
            }
            if adv.requested_slack is not None:
                row[f"min ε for Δ≤{adv.requested_slack:g}"] = _fmt(m.min_epsilon)
                row[f"min n for Δ≤{adv.requested_slack:g}"] = _fmt(m.min_n, "d")
            rows.append(row)
        click.echo(table(rows))
        click.echo("")
        click.echo(f"smaller slack (proven bounds): {adv.recommended}")
        click.echo(
            f"LDP-CP-S wins for k ≥ {_fmt(adv.crossover_k, 'd')} (proven Δ_L), "
            f"k ≥ {_fmt(adv.crossover_k_paper, 'd')} (paper's Δ, Δ_paper = "
            f"{_fmt(adv.label.details['delta_paper'])}); independent of n"
        )

    emit(adv, as_json=as_json, human=human)
