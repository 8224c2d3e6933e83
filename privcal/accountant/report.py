"""``privcal audit report``: what an auditor reads first.

Per dataset: its budget policy and the guarantee of its cap (the filter's
(ε, δ), valid however the requests adapt), its releases in order (method, α,
threshold, coverage guarantee, privacy cost), and the budget consumed over time —
each charge replayed through the same exact composition rules the accountant
enforces (:mod:`privcal.accountant.privacy.filters`), with the realized spend after it,
labelled as such: it is not a guarantee under adaptive use (issue 14). For a dataset that
takes local-DP reports the realized spend includes the largest per-subject Σε0 (a bound on
it before the last charge: :func:`audit_report`).
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Any

from pydantic import BaseModel, ConfigDict

from privcal.accountant import privacy as acc
from privcal.accountant.datasets import largest_subject_spend
from privcal.accountant.policy import charge_cost, guarantee_report, policy_of, renyi_orders_of
from privcal.costs import LocalDP, fixed_context
from privcal.storage.records import UTCDateTime

#: the context of the replay's running Σε0 (exact for any amounts the ledger holds)
_EXACT = fixed_context(80)  # every field given: nothing from decimal.DefaultContext


class TimelineEntry(BaseModel):
    """One charge and the dataset's budget after it."""

    model_config = ConfigDict(frozen=True)

    charge: int
    at: UTCDateTime
    purpose: str | None
    requester: str | None
    cost: str
    subjects_charged: int | None
    used_after: dict[str, Decimal]
    #: the realized spend after this charge: not a guarantee under adaptive use (None when
    #: the report was asked without it: ``audit_report(..., realized=False)``)
    spent_dp_after: str | None = None


class ReleaseLine(BaseModel):
    """A release as the report lists it."""

    model_config = ConfigDict(frozen=True)

    release: int
    at: UTCDateTime
    method: str
    #: the release's miscoverage level, or its levels in order for a several-level release
    alpha: float | list[float] | None
    threshold: float
    coverage: str
    #: what the coverage guarantee assumes of the data (the installed method's wording,
    #: :func:`~privcal.calibrators.assumptions.release_assumption`; None: method unknown here)
    assumes: str | None
    privacy: str


class DatasetReport(BaseModel):
    """One dataset's story."""

    model_config = ConfigDict(frozen=True)

    dataset: str
    policy: str
    reporting_delta: Decimal
    #: the cap's guarantee for everything ever charged, however the requests adapt
    guarantee: str
    renyi_orders: list[Decimal] | None = None
    releases: list[ReleaseLine]
    timeline: list[TimelineEntry]


def audit_report(accountant: Any, dataset: str | None = None, *,
                 realized: bool = True) -> list[DatasetReport]:
    """The report for one dataset, or for all of them in creation order. ``realized=False``
    leaves out each charge's realized (ε, δ) (``spent_dp_after``: None) — the budget used
    after each charge is all a spend chart needs, and converting a zCDP or Rényi spend to ε
    after each of 10⁴ charges is most of the report's time."""
    names = [dataset] if dataset is not None else [d.name for d in accountant.datasets()]
    for name in names:
        accountant.dataset(name)  # NotFound for an unknown name, before any work
    out: list[DatasetReport] = []
    for name in names:
        ledger = accountant.ledger
        with ledger.read() as s:
            ds = ledger.get_dataset(s, name)
            policy = policy_of(ds)
            charges = ledger.charges_of(s, ds.id)
            spent = acc.Spent()
            # local-DP reports are charged per subject, in no central total: the realized
            # spend adds the largest per-subject Σε0 (red team 7, F-2). Replayed, it is at
            # most the batches' running Σε0 (each charges a subject at most once) and at
            # most today's largest spend (spends only grow), so labelled "≤"; after the last
            # charge it is today's, exactly (as `budget show` prints it)
            today = largest_subject_spend(ledger, s, ds)
            local = Decimal(0)
            timeline = []
            for i, c in enumerate(charges):
                cost = charge_cost(c)
                if not isinstance(cost, LocalDP):
                    spent = spent.add(cost)
                elif c.subjects_accepted != 0:
                    with localcontext(_EXACT):  # exact: a rounded-down sum would under-report
                        local += cost.eps0
                last = i == len(charges) - 1
                subj = None if today is None else today if last else min(local, today)
                realized_after = None
                if realized:
                    rep = acc.spent_epsilon(policy, spent, ds.reporting_delta, subj,
                                            subject_bound=subj is not None and not last)
                    realized_after = (f"spent so far ε={acc.dstr(rep.epsilon)}, "
                                      f"δ={acc.dstr(rep.delta)} "
                                      f"[{rep.rule}; not a guarantee under adaptive use]")
                timeline.append(
                    TimelineEntry(
                        charge=c.id,
                        at=c.created_at,
                        purpose=c.purpose,
                        requester=c.requester,
                        cost=cost.describe(),
                        subjects_charged=c.subjects_accepted,
                        used_after=acc.used(policy, spent),
                        spent_dp_after=realized_after,
                    )
                )
            reporting_delta = ds.reporting_delta
            guarantee = guarantee_report(ds).statement
            orders = renyi_orders_of(ds)
        from privcal.calibrators.assumptions import release_assumption

        releases = [
            ReleaseLine(
                release=r.id,
                at=r.created_at,
                method=r.method,
                alpha=r.params.get("alpha"),
                threshold=r.threshold,
                coverage=r.coverage.get("statement", ""),
                assumes=release_assumption(r.method, r.diagnostics),
                privacy=(r.privacy or {}).get("statement", ""),
            )
            for r in accountant.ledger.releases(dataset=name)
        ]
        out.append(
            DatasetReport(
                dataset=name,
                policy=policy.describe(),
                reporting_delta=reporting_delta,
                guarantee=guarantee,
                renyi_orders=[Decimal(acc.dstr(a)) for a in orders] if orders else None,
                releases=releases,
                timeline=timeline,
            )
        )
    return out
