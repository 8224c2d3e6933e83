"""``privcal advise``: which local-DP calibrator (LDP-CP-L or LDP-CP-S) for this (n, k, ε)?
And, with ``--method pcoqs|exponq``, from which n a central method can be finite.

A thin skin over :func:`privcal.calibrators.advisor.advise` (seed 004, §4.1) and
:func:`privcal.calibrators.advisor_central.advise_central` (issue 13).
"""

from __future__ import annotations

import click

from privcal.cli.app import emit, json_option, main, table
from privcal.cli.number_types import Integer, Number


def _fmt(x: float | int | None, spec: str = ".4g") -> str:
    return "—" if x is None else format(x, spec)


@main.command("advise")
@click.option(
    "--method",
    type=click.Choice(["local", "pcoqs", "exponq"]),
    default="local",
    show_default=True,
    help="local: compare LDP-CP-L and LDP-CP-S (needs --n, --k, --epsilon); pcoqs (--rho) "
    "or exponq (--epsilon): the smallest n with a finite threshold (and, with --n, whether "
    "this n reaches it).",
)
@click.option("--n", "n", type=Integer(), default=None, help="Number of calibration subjects.")
@click.option("--k", "k", type=Integer(), default=None, help="Number of classes (local).")
@click.option("--epsilon", type=Number(), default=None, help="ε (local: per subject; exponq).")
@click.option("--rho", type=Number(), default=None, help="pcoqs: ρ (zCDP).")
@click.option("--alpha", type=Number(), required=True, help="Miscoverage level α.")
@click.option("--nominal", is_flag=True, default=False, help="pcoqs: the paper's nominal rank.")
@click.option(
    "--failure-probability",
    "failure_probability",
    type=Number(),
    default=None,
    help="Failure probability of the coverage bound (local: δ over the data and the users' "
    "randomized responses; pcoqs: β over the noise; not a DP δ)  [default: 0.001 local, "
    "0.05 pcoqs]",
)
@click.option("--delta", type=Number(), default=None, hidden=True,
              help="Deprecated spelling of --failure-probability.")
@click.option(
    "--slack",
    type=Number(),
    default=None,
    help="A slack Δ to reach: report the smallest ε and n for each method.",
)
@click.option(
    "--rounds",
    type=Integer(),
    default=None,
    help="LDP-CP-S rounds T (default: the T minimising Δ_S(T) + 2^-T for this n and α).",
)
@click.option("--tol", type=Number(), default=None,
              help="pcoqs: the search's resolution (default 1e-10): a coarser one needs fewer "
              "noisy steps, so a smaller τ and n_min.")
@json_option
def advise_cmd(
    method: str,
    n: int | None,
    k: int | None,
    epsilon: float | None,
    rho: float | None,
    alpha: float,
    nominal: bool,
    failure_probability: float | None,
    delta: float | None,
    slack: float | None,
    rounds: int | None,
    tol: float | None,
    as_json: bool,
) -> None:
    """Compare LDP-CP-L (Δ_L) and LDP-CP-S (Δ_S) for N subjects, K classes and ε; or, with
    --method pcoqs/exponq, the smallest n at which that central method can be finite."""
    from privcal.calibrators.advisor import advise
    from privcal.errors import InvalidInput

    if delta is not None and failure_probability is not None:
        raise InvalidInput("give --failure-probability or its deprecated spelling --delta")
    fp = next((v for v in (failure_probability, delta) if v is not None), None)
    need = {"local": (("--n", n), ("--k", k), ("--epsilon", epsilon)),
            "pcoqs": (("--rho", rho),), "exponq": (("--epsilon", epsilon),)}[method]  # fmt: skip
    for name, v in need:
        if v is None:  # a usage error (exit 2), as for any missing required option
            raise click.UsageError(f"advise --method {method} needs {name}")
    # an option of another method was dropped, answering a question not asked (red team 24,
    # newcomer F1; --tol, --epsilon and --rho: red team 22)
    only = {"--tol": (tol, ("pcoqs",)), "--nominal": (nominal or None, ("pcoqs",)),
            "--failure-probability": (fp, ("local", "pcoqs")), "--k": (k, ("local",)),
            "--slack": (slack, ("local",)), "--rounds": (rounds, ("local",))}
    for name, (v, methods) in only.items():
        if v is not None and method not in methods:
            raise click.UsageError(f"{name} applies to advise --method "
                                   f"{' or '.join(methods)}, not {method}")
    # a budget of the other method's kind was ignored: an answer for a question not asked
    # (red team 22, newcomer F5)
    if method == "pcoqs" and epsilon is not None:
        raise click.UsageError("advise --method pcoqs takes --rho (zCDP), not --epsilon")
    if method != "pcoqs" and rho is not None:
        raise click.UsageError(f"advise --method {method} takes --epsilon, not --rho")
    if method != "local":
        _advise_central(method, n, epsilon, rho, alpha, nominal, fp, as_json, tol)
        return
    delta = fp if fp is not None else 0.001
    adv = advise(n, k, epsilon, alpha, delta, slack=slack, rounds=rounds)  # type: ignore[arg-type]

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
        for note in adv.notes:
            if note.startswith("near the crossover"):
                click.echo(note)
        click.echo(
            f"LDP-CP-S wins for k ≥ {_fmt(adv.crossover_k, 'd')} (proven Δ_L), "
            f"k ≥ {_fmt(adv.crossover_k_paper, 'd')} (paper's Δ, Δ_paper = "
            f"{_fmt(adv.label.details['delta_paper'])}) at n = {adv.n}, with "
            f"T = {adv.score.rounds} rounds chosen for this n (LDP-CP-S's exact slack depends "
            "on n)"
        )
        click.echo(adv.notes[-1])

    emit(adv, as_json=as_json, human=human)


def _advise_central(
    method: str, n: int | None, epsilon: float | None, rho: float | None, alpha: float,
    nominal: bool, fp: float | None, as_json: bool, tol: float | None = None,
) -> None:  # fmt: skip
    from privcal.calibrators.advisor_central import advise_central

    adv = advise_central(method, alpha, n=n, rho=rho, epsilon=epsilon, nominal=nominal,
                         failure_probability=fp if fp is not None else 0.05, tol=tol)  # fmt: skip

    def human() -> None:
        budget = f"ρ = {rho:g}" if method == "pcoqs" else f"ε = {epsilon:g}"
        click.echo(f"{method} at α = {alpha:g}, {budget}: finite threshold possible from "
                   f"n = {adv.min_n}")  # fmt: skip
        if n is not None:
            verdict = "yes" if adv.finite_possible else "no: the release would be +inf"
            click.echo(f"at n = {n}: {verdict}")
        for key, val in adv.details.items():
            click.echo(f"  {key} = {val:.6g}" if isinstance(val, float) else f"  {key} = {val}")
        for note in adv.notes:
            click.echo(note)

    emit(adv, as_json=as_json, human=human)
