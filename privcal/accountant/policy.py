"""The ledger's rows read as policy: a dataset row as the :class:`Policy` and
:class:`Spent`, its cap and guarantee, a charge row as its cost, and the result models built
from rows. No SQL: rows come from :mod:`privcal.storage` (ORM objects or Core rows — anything
with the columns as attributes).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from privcal.accountant import privacy as acc
from privcal.accountant.normalize import AnyCost, cost_json
from privcal.accountant.results import ChargeReceipt, DatasetInfo, GuaranteeReport
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import InvalidInput

__all__ = [
    "cap_of",
    "charge_cost",
    "dataset_info",
    "exact",
    "guarantee_report",
    "policy_of",
    "receipt_of",
    "renyi_orders_of",
    "spent_columns",
    "spent_of",
]

#: a ``datasets`` row (:class:`privcal.storage.models.Dataset` or a Core row of its table)
DatasetRow = Any
#: a ``charges`` row (:class:`privcal.storage.models.Charge` or a Core row of its table)
ChargeRow = Any


def renyi_orders_of(ds: DatasetRow) -> tuple[Decimal, ...] | None:
    """The (ε, δ) cap's Rényi grid: the row's, or the frozen grid of a migrated dataset."""
    if ds.notion != "approx":
        return None
    if ds.renyi_orders is None:
        return acc.MIGRATED_RENYI_ORDERS
    return tuple(Decimal(a) for a in ds.renyi_orders)


def policy_of(ds: DatasetRow) -> acc.Policy:
    """The dataset's cap as a :class:`~privcal.accountant.privacy.filters.Policy`."""
    return acc.Policy(ds.notion, ds.cap_epsilon, ds.cap_rho, ds.cap_delta,  # type: ignore[arg-type]
                      renyi_orders_of(ds))


def guarantee_report(ds: DatasetRow) -> GuaranteeReport:
    """The guarantee of the dataset's caps: its filter's (ε, δ) — plus its per-subject cap if
    it takes local-DP reports —, valid however requests adapt."""
    g = acc.filter_guarantee(policy_of(ds), ds.reporting_delta, ds.subject_epsilon,
                             nonprivate=bool(ds.allow_nonprivate), spent=spent_of(ds))
    if not g.established:
        return GuaranteeReport(epsilon=g.epsilon, delta=g.delta, rule=g.rule,
                               statement=g.statement, established=False,
                               nonprivate=g.nonprivate)
    return GuaranteeReport(epsilon=Decimal(acc.dstr(g.epsilon)), delta=Decimal(acc.dstr(g.delta)),
                           rule=g.rule, statement=g.statement, nonprivate=g.nonprivate)


def spent_of(ds: DatasetRow) -> acc.Spent:
    """The dataset's running totals as a
    :class:`~privcal.accountant.privacy.filters.Spent`."""
    return acc.Spent(ds.spent_pure_eps, ds.spent_pure_rho, ds.spent_zcdp_rho,
                     ds.spent_approx_eps, ds.spent_approx_delta)


def cap_of(ds: DatasetRow) -> dict[str, Decimal]:
    """The cap in the dataset's notion (ε; ρ; or ε and δ)."""
    if ds.notion == "pure":
        return {"epsilon": ds.cap_epsilon or Decimal(0)}
    if ds.notion == "zcdp":
        return {"rho": ds.cap_rho or Decimal(0)}
    return {"epsilon": ds.cap_epsilon or Decimal(0), "delta": ds.cap_delta or Decimal(0)}


def exact(d: dict[str, Decimal]) -> dict[str, Decimal]:
    """Amounts as the exact decimals reported (trailing zeros dropped)."""
    return {k: Decimal(acc.dstr(v)) for k, v in d.items()}


def dataset_info(ds: DatasetRow) -> DatasetInfo:
    """The dataset row as the :class:`DatasetInfo` the library returns."""
    return DatasetInfo(
        id=ds.id, name=ds.name, description=ds.description, notion=ds.notion, cap=exact(cap_of(ds)),
        reporting_delta=Decimal(acc.dstr(ds.reporting_delta)),
        subject_epsilon=(Decimal(acc.dstr(ds.subject_epsilon))
                         if ds.subject_epsilon is not None else None),
        allow_nonprivate=bool(ds.allow_nonprivate), created_at=ds.created_at,
        policy=policy_of(ds).describe(),
        renyi_orders=[Decimal(acc.dstr(a)) for a in o] if (o := renyi_orders_of(ds)) else None,
    )


def charge_cost(c: ChargeRow) -> AnyCost:
    """The cost a charge row recorded."""
    if c.notion == "pure":
        return PureDP(eps=c.epsilon)
    if c.notion == "zcdp":
        return ZCDP(rho=c.rho)
    if c.notion == "approx":
        return ApproxDP(eps=c.epsilon, delta=c.delta)
    return LocalDP(eps0=c.eps0)


def receipt_of(c: ChargeRow, ds: DatasetRow, *, replayed: bool) -> ChargeReceipt:
    """The receipt of a recorded charge (``replayed``: returned again for its idempotency key)."""
    return ChargeReceipt(
        charge_id=c.id, dataset=ds.name, scope=c.scope, cost=cost_json(charge_cost(c)),
        purpose=c.purpose, requester=c.requester, idempotency_key=c.idempotency_key,
        created_at=c.created_at, remaining=exact(acc.remaining(policy_of(ds), spent_of(ds))),
        replayed=replayed,
    )


#: a running total the ledger stores: NUMERIC(48, 30) holds 18 digits before the point
_MAX_TOTAL = Decimal("1e18")


def spent_columns(sp: acc.Spent) -> dict[str, Decimal]:
    """The dataset columns holding the running totals ``sp``; InvalidInput if one is past
    what the ledger stores (a pure ε of 10¹⁰ is a ρ of 5 × 10¹⁹: PostgreSQL raised a bare
    numeric overflow, SQLite stored it)."""
    cols = {"spent_pure_eps": sp.pure_eps, "spent_pure_rho": sp.pure_rho,
            "spent_zcdp_rho": sp.zcdp_rho, "spent_approx_eps": sp.approx_eps,
            "spent_approx_delta": sp.approx_delta}
    for v in cols.values():
        if v >= _MAX_TOTAL:
            raise InvalidInput(f"the cost is too large: a running total of the dataset would "
                               f"be {acc.dstr(v)}, past what the ledger stores (< 1e18)")
    return cols

