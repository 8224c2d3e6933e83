"""``privcal session open|submit|status|close``: persistent collection sessions.

A thin skin over :mod:`privcal.accountant.sessions`. ``submit`` reads a report batch
(``.csv``, ``.parquet`` or ``.npz``) with columns ``subject``, ``bit`` and ``round``
(ldp-score: the round whose query each bit answers, required) or ``agent`` and ``value``
(federated; an optional ``round``, 0). It prints how many rows
were accepted and how many rejected per reason — never a subject id. A batch of which
nothing is accepted exits 1 (nothing was written) with the counts, in the JSON error
document under ``--json``.
"""

from __future__ import annotations

from typing import Any

import click
import numpy as np

from privcal.calibrators.bound_floats import float_text
from privcal.cli import progress
from privcal.cli.app import (
    FilePath,
    complete_dataset,
    emit,
    json_option,
    main,
    pass_settings,
    table,
)
from privcal.cli.method_options import SCORE_OPTION, parse_score_options
from privcal.cli.number_types import Integer, Number
from privcal.data.files import load_reports
from privcal.errors import InvalidInput, NothingAccepted


@main.group("session")
def session() -> None:
    """Collection sessions: interactive LDP-CP-S and one-round federated (FedCP²-QQ, FedCP-QQ)."""


def _describe(s: Any) -> str:
    rows: list[dict[str, Any]] = [
        {"field": "session", "value": s.id},
        {"field": "dataset", "value": s.dataset},
        {"field": "method", "value": s.method + (" (shuffled)" if s.shuffled else "")},
        {"field": "status", "value": s.status},
        {"field": "reports are", "value": s.reports_are},
        {"field": "score", "value": _score_text(s.score)},
    ]
    if s.method == "ldp-score":
        rows += [
            {"field": "round", "value": f"{s.round} of {s.rounds}"},
            {"field": "received / needed this round", "value": f"{s.received} / {s.needed}"},
            {"field": "interval [lo, hi]",
             "value": f"[{float_text(s.interval[0])}, {float_text(s.interval[1])}]"},
            {"field": "current query q", "value": "-" if s.query is None else float_text(s.query)},
        ]
        if s.trivial:  # red team 23, fedlocal F1
            rows += [{"field": "every release", "value": TRIVIAL}]
    else:
        p = s.plan or {}
        rows += [{"field": "agents answered / m", "value": f"{s.received} / {p.get('m')}"}]
        if s.method == "fedcp2-qq":
            rows += [
                {"field": "γ", "value": p.get("gamma")},
                {"field": "ℓ_γ, ℓ_cor, k_γ",
                 "value": f"{p.get('l_gamma')}, {p.get('l_cor')}, {p.get('k_gamma')}"},
                {"field": "agents answer at level q", "value": float_text(p["q"])},
                {"field": "bin grid", "value": f"{p.get('bins')} evenly spaced points on "
                                               f"[{float_text(p.get('lower', 0.0))}, "
                                               f"{float_text(p['smax'])}]"},
            ]
        else:
            rows += [{"field": "ℓ, k", "value": f"{p.get('l')}, {p.get('k')}"}]
    rows += [{"field": "reports stored", "value": s.total_reports},
             {"field": "release", "value": "-" if s.release_id is None else
              f"{s.release_id} (threshold {s.threshold})"}]
    return table(rows)


#: what a session whose rounds can never pass says (:attr:`SessionInfo.trivial`)
TRIVIAL = ("+inf whatever the reports: no round of this group size can pass its cut-off, yet "
           "each report charges its subject ε (abandon it; open one with a larger group size, "
           "ε, α or failure probability, or fewer rounds)")


def _score_text(score: dict[str, Any] | None) -> str:
    """The score a session's devices compute, as the status shows it."""
    if score is None:
        return "not recorded (predict on its release needs --score)"
    opts = ", ".join(f"{k}={v}" for k, v in (score.get("options") or {}).items())
    return f"{score.get('name')}" + (f" ({opts})" if opts else "")


@session.command("open")
@click.argument("method", type=click.Choice(["ldp-score", "fedcp2-qq", "fedcp-qq"]))
@click.option("--dataset", required=True, help="Dataset whose budgets are charged.",
              shell_complete=complete_dataset)
@click.option("--alpha", type=Number(), required=True, help="Miscoverage α in (0, 1).")
@click.option("--epsilon", type=Number(), default=None, help="ε of each user's / agent's report.")
@click.option("--rounds", type=Integer(), default=None, help="ldp-score: T rounds.")
@click.option("--group-size", type=Integer(), default=None, help="ldp-score: n' reports per round.")
@click.option("--lower", type=Number(), default=None,
              help="Public score range: lower end (ldp-score, fedcp2-qq grid)  [default: 0]")
@click.option("--upper", type=Number(), default=None,
              help="Public score range: upper end (ldp-score; fedcp2-qq grid top S_max, "
                   "released as +inf)  [default: 1]")
@click.option("--range", "score_range", type=Number(), nargs=2, default=None, hidden=True,
              help="Deprecated: --lower LO --upper HI.")
@click.option("--failure-probability", "failure_probability", type=Number(), default=None,
              help="ldp-score: failure probability δ of the coverage guarantee (Δ_S), over the "
                   "data and the users' responses; not a DP δ  [default: 0.001]")
@click.option("--delta", type=Number(), default=None, hidden=True,
              help="Deprecated spelling of --failure-probability.")
@click.option("--nominal", is_flag=True, help="ldp-score: target 1−α (guarantee 1−α−Δ_S).")
@click.option("--agents", type=Integer(), default=None, help="Federated: number of agents m.")
@click.option("--local-n", type=Integer(), default=None, help="Federated: scores per agent n.")
@click.option("--bins", type=Integer(), default=None,
              help="fedcp2-qq: grid points B.  [default: 100]")
@click.option("--shuffled", is_flag=True,
              help="Reports go through a trusted shuffler: record the amplified (ε, δ).")
@click.option("--score", default=None,
              help="The score the devices/agents compute (lac, aps, raps, absolute, cqr): "
                   "recorded, and what predict/evaluate use on the release.")
@click.option("--score-option", "score_option", multiple=True, type=SCORE_OPTION,
              help="Option KEY=VALUE of --score (repeat), e.g. randomized=false.")
@click.option("--requester", default=None, help="Who opened the session (recorded).")
@click.option("--idempotency-key", default=None,
              help="Retrying with the same key returns the session opened (a --shuffled one "
                   "charged once); another request under the key is an error.")
@json_option
@pass_settings
def open_cmd(settings: Any, method: str, dataset: str, alpha: float, epsilon: float | None,
             rounds: int | None, group_size: int | None, lower: float | None,
             upper: float | None, score_range: tuple[float, float] | None,
             failure_probability: float | None, delta: float | None, nominal: bool,
             agents: int | None, local_n: int | None, bins: int | None, shuffled: bool,
             score: str | None, score_option: tuple[str, ...], requester: str | None,
             idempotency_key: str | None, as_json: bool) -> None:
    """Open a session: prints its id and round 0's query (ldp-score) or the plan (federated)."""
    from privcal.accountant.sessions import open_session

    kw: dict[str, Any] = {}
    if score_range is not None:
        if lower is not None or upper is not None:
            raise InvalidInput("give --lower/--upper or the deprecated --range, not both")
        lower, upper = score_range
    if lower is not None:
        kw["lower"] = lower
    if upper is not None:
        kw["upper"] = upper
    if delta is not None:
        if failure_probability is not None:
            raise InvalidInput("give --failure-probability or its deprecated spelling --delta")
        failure_probability = delta
    if failure_probability is not None:
        kw["failure_probability"] = failure_probability
    res = open_session(
        settings.accountant(existing="a dataset"), method, dataset=dataset, alpha=alpha,
        epsilon=epsilon, rounds=rounds, group_size=group_size, nominal=nominal, agents=agents,
        local_n=local_n, bins=bins, shuffled=shuffled, requester=requester,
        idempotency_key=idempotency_key, score=score,
        score_options=parse_score_options(score_option) if score_option else None, **kw)

    def human() -> None:
        click.echo(f"session {res.id} opened")
        click.echo(_describe(res))
        if res.query is not None:
            click.echo(f"round 0 query: q = {float_text(res.query)}")

    emit(res, as_json=as_json, human=human)


def _read_batch(spec: str, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    id_col, val_col = ("subject", "bit") if method == "ldp-score" else ("agent", "value")
    ids, values, rounds = load_reports(spec, id_col, val_col, label=f"{method} ")
    if method == "ldp-score" and rounds is None:  # refused before reading the ledger further
        raise InvalidInput(f"{spec}: ldp-score reports need a 'round' column (the round whose "
                           "query each bit answers): columns subject,bit,round")
    return ids, values, rounds


@session.command("submit")
@click.argument("session_id", type=Integer())
@click.option("--reports", required=True,
              type=FilePath(),
              help="Batch file: subject,bit,round (ldp-score) or agent,value (federated). A "
                   "malformed value or round in any row refuses the whole file (exit 1, "
                   "nothing written); a subject already reported, over its cap or repeated "
                   "is counted per row.")
@click.option("--idempotency-key",
              help="Retrying the same batch with the same key records it once; another batch "
                   "with that key is an error.")
@json_option
@pass_settings
def submit_cmd(settings: Any, session_id: int, reports: str, idempotency_key: str | None,
               as_json: bool) -> None:
    """Ingest a batch of reports for the current round (charging each subject once)."""
    from privcal.accountant.sessions import session_status, submit_reports

    acct = settings.accountant(existing="a session")
    method = session_status(acct, session_id).method
    ids, values, rounds = _read_batch(reports, method)
    with progress.task(f"ingesting {len(ids)} reports", None, size=len(ids)):
        res = submit_reports(acct, session_id, ids, values, rounds,
                             idempotency_key=idempotency_key, strict=True)
    why = ", ".join(f"{k}: {v}" for k, v in res.reasons.items()) or "none"
    if res.accepted == 0 and not res.replayed:
        raise NothingAccepted(
            f"nothing was accepted: rejected {res.rejected} ({why}); the ledger is unchanged",
            details={"accepted": 0, "rejected": res.rejected, "reasons": dict(res.reasons)})

    def human() -> None:
        if res.replayed:
            click.echo("already recorded under this idempotency key:")
        click.echo(f"accepted {res.accepted}, rejected {res.rejected} ({why})")
        s = res.session
        if s.release_id is not None:
            click.echo(f"session {s.id} released: release {s.release_id}, "
                       f"threshold {s.threshold}")
        elif s.method == "ldp-score":
            click.echo(f"round {s.round} of {s.rounds}: {s.received} / {s.needed} reports; "
                       f"query q = {float_text(s.query)}" if s.query is not None else
                       f"round {s.round}: {s.status}")
        else:
            click.echo(f"{s.received} of {(s.plan or {}).get('m')} agents have answered")

    emit(res, as_json=as_json, human=human)


@session.command("status")
@click.argument("session_id", type=Integer())
@json_option
@pass_settings
def status_cmd(settings: Any, session_id: int, as_json: bool) -> None:
    """Method, status, round, counts, current interval and query, release id."""
    from privcal.accountant.sessions import session_status

    res = session_status(settings.accountant(existing=True), session_id)
    emit(res, as_json=as_json, human=lambda: click.echo(_describe(res)))


@session.command("close")
@click.argument("session_id", type=Integer())
@click.option("--allow-missing", is_flag=True,
              help="Federated: release for the agents that answered (see --missing).")
@click.option("--missing", type=click.Choice(["infinite", "replan"]), default=None,
              help="With --allow-missing: 'infinite' (default) counts each missing agent's "
                   "message as +inf under the published plan, valid whatever the dropout; "
                   "'replan' recomputes the server side for the agents that answered, often "
                   "smaller but valid only if which agents answered does not depend on their "
                   "data (the recorded guarantee says so).")
@click.option("--abandon", is_flag=True,
              help="Close without a release (charges already made stay spent).")
@click.option("--requester", default=None,
              help="Who closes the session (recorded as closed_by, and as the requester of "
                   "a release --allow-missing makes).")
@click.option("--idempotency-key", default=None,
              help="Retrying the same close with the same key prints the closed session (and "
                   "its release) instead of 'already closed'; other options under the key are "
                   "an error.")
@json_option
@pass_settings
def close_cmd(settings: Any, session_id: int, allow_missing: bool, missing: str | None,
              abandon: bool, requester: str | None, idempotency_key: str | None,
              as_json: bool) -> None:
    """Close a session: federated with agents missing (--allow-missing), or abandon it."""
    from privcal.accountant.sessions import close_session

    if missing is not None and not allow_missing:
        raise click.UsageError("--missing goes with --allow-missing")
    acct = settings.accountant(existing="a session")
    res = close_session(acct, session_id, allow_missing=allow_missing,
                        missing=missing or "infinite", abandon=abandon, requester=requester,
                        idempotency_key=idempotency_key)  # type: ignore[arg-type]
    emit(res, as_json=as_json, human=lambda: click.echo(_describe(res)))
