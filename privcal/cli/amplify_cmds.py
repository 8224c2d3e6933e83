"""``privcal amplify``: the proven (ε, δ) of n shuffled ε0-LDP reports.

A thin skin over :func:`privcal.accountant.privacy.shuffle.amplify` (SHUFFLE.md): every
bound valid for the randomizer, the one chosen, and the seed paper's ε0/√n shown
only as a labelled heuristic.
"""

from __future__ import annotations

import click

from privcal.cli.app import emit, json_option, main, table
from privcal.cli.number_types import Integer, Number


def _fmt(x: float | None) -> str:
    """A privacy figure exactly, as its shortest round-trip decimal (red team 16: rounded to
    six digits, to nearest, a δ(ε) just above δ was printed as "≤ δ")."""
    return "—" if x is None else repr(float(x))


@main.command("amplify")
@click.option("--epsilon0", "eps0", type=Number(), required=True,
              help="Local ε0 of each report's randomizer.")
@click.option("--n", "n", type=Integer(), required=True, help="Number of shuffled reports.")
@click.option("--delta", type=Number(), required=True, help="Target δ of the central guarantee.")
@click.option("--randomizer", type=click.Choice(["binary-rr", "krr", "generic"]),
              default="generic", show_default=True,
              help="binary-rr, krr (k-ary randomized response, needs --k) or generic "
              "(any ε0-LDP randomizer).")
@click.option("--k", "k", type=Integer(), default=None, help="Number of categories of k-RR.")
@json_option
def amplify_cmd(eps0: float, n: int, delta: float, randomizer: str, k: int | None,
                as_json: bool) -> None:
    """Central (ε, δ)-DP of N shuffled ε0-LDP reports, from proven amplification bounds."""
    from privcal.accountant.privacy.shuffle import amplify

    result = amplify(eps0, n, delta, randomizer, k)  # type: ignore[arg-type]

    def human() -> None:
        rows = [
            {
                "bound": row.name,
                "ε": _fmt(row.eps),
                "δ(ε) re-checked": _fmt(row.delta_at_eps),
                "certified": "yes" if row.certified else "no",
                "note": row.reason or row.reference,
            }
            for row in result.bounds
        ]
        click.echo(table(rows))
        click.echo("")
        what = f"k-RR, k = {result.k}" if randomizer == "krr" else randomizer
        click.echo(f"{n} shuffled reports, ε0 = {_fmt(eps0)} ({what}), δ = {_fmt(delta)}")
        if result.amplified:
            click.echo(f"chosen: {result.bound}: (ε = {_fmt(result.eps)}, δ = {_fmt(delta)})-DP"
                       f", certified (δ(ε) = {_fmt(result.delta_at_eps)} ≤ δ)")
        else:
            click.echo(f"chosen: {result.bound}: ε = ε0 = {_fmt(eps0)} (pure, δ = 0)")
        click.echo(f"ε0/√n = {result.heuristic_eps0_over_sqrt_n:.4g}: {result.heuristic_label}")

    emit(result, as_json=as_json, human=human)
