"""Datasets and their budgets: create one with its cap, read it, report what is spent and left.

A dataset has exactly one cap — pure ε, zCDP ρ, or (ε, δ) with its Rényi orders fixed at
creation — a reporting δ, and optionally a per-subject ε cap for local-DP charges. Creating
one writes its row and its audit entry in one transaction; the reports read one snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from privcal.accountant import privacy as acc
from privcal.accountant.normalize import DEFAULT_REPORTING_DELTA, optional_text, parse_amount
from privcal.accountant.policy import (
    cap_of,
    dataset_info,
    exact,
    guarantee_report,
    policy_of,
    renyi_orders_of,
    spent_of,
)
from privcal.accountant.results import BudgetReport, DatasetInfo, SpentReport, SubjectSummary
from privcal.calibrators.validation import id_strings
from privcal.errors import InvalidInput, bidi_problem, check_text, invisible_char
from privcal.storage import Ledger
from privcal.storage.audit import dataset_doc, now
from privcal.storage.models import MAX_SUBJECT_UNITS, SUBJECT_UNIT, cap_units, units_eps

__all__ = [
    "budget_report",
    "create_dataset",
    "get_dataset",
    "largest_subject_spend",
    "list_datasets",
    "subject_spend",
    "subject_summary",
]

Amount = float | str | Decimal


def create_dataset(
    ledger: Ledger,
    name: str,
    *,
    epsilon: Amount | None = None,
    rho: Amount | None = None,
    approx_epsilon: Amount | None = None,
    approx_delta: Amount | None = None,
    delta: Amount | None = None,
    subject_epsilon: Amount | None = None,
    allow_nonprivate: bool = False,
    description: str = "",
    renyi_orders: Sequence[Amount] | str | None = None,
) -> DatasetInfo:
    """:meth:`privcal.accountant.Accountant.create_dataset`: validate the policy, then write
    the row and its audit entry in one transaction (AlreadyExists if the name is taken)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidInput("dataset name must be 1 to 200 characters")
    check_text(name, "dataset name")
    if not isinstance(allow_nonprivate, bool | np.bool_):  # 'no' is not False
        raise InvalidInput(f"allow_nonprivate must be True or False, got {allow_nonprivate!r}")
    if name != name.strip():
        raise InvalidInput(f"dataset name {name!r} has leading or trailing spaces")
    _check_addressable(name)
    given = [epsilon is not None, rho is not None,
             approx_epsilon is not None or approx_delta is not None]
    if sum(given) != 1:
        raise InvalidInput("give exactly one budget: epsilon, rho, or approx_epsilon with "
                           "approx_delta")
    cap_e = cap_r = cap_d = None
    if epsilon is not None:
        notion, cap_e = "pure", parse_amount(epsilon, "ε")
    elif rho is not None:
        notion, cap_r = "zcdp", parse_amount(rho, "ρ")
    else:
        if approx_epsilon is None or approx_delta is None:
            raise InvalidInput("an (ε, δ) budget needs both approx_epsilon and approx_delta")
        notion = "approx"
        cap_e = parse_amount(approx_epsilon, "ε")
        cap_d = parse_amount(approx_delta, "δ", below_one=True)
    if renyi_orders is not None and notion != "approx":
        raise InvalidInput("Rényi orders apply only to an (ε, δ) budget "
                           "(approx_epsilon with approx_delta)")
    grid = (None if notion != "approx" else
            [acc.dstr(a) for a in (acc.renyi_orders(renyi_orders) if renyi_orders is not None
                                   else acc.DEFAULT_RENYI_ORDERS)])
    if delta is not None:
        rep = parse_amount(delta, "reporting δ", below_one=True)
    else:
        rep = cap_d if cap_d is not None else DEFAULT_REPORTING_DELTA
    subj = parse_amount(subject_epsilon, "subject ε") if subject_epsilon is not None else None
    top = units_eps(MAX_SUBJECT_UNITS)
    if subj is not None and subj > top:
        raise InvalidInput(f"subject ε must be at most {acc.dstr(top)} (per-subject spends "
                           f"are 64-bit counts of 1e-12), got {subject_epsilon}")
    desc = optional_text(description or "", "description", 10_000) or ""
    zero = Decimal(0)
    values: dict[str, Any] = {
        "name": name, "description": desc, "notion": notion, "cap_epsilon": cap_e,
        "cap_rho": cap_r, "cap_delta": cap_d, "reporting_delta": rep, "subject_epsilon": subj,
        "allow_nonprivate": bool(allow_nonprivate), "renyi_orders": grid,
        "spent_pure_eps": zero, "spent_pure_rho": zero, "spent_zcdp_rho": zero,
        "spent_approx_eps": zero, "spent_approx_delta": zero, "charge_count": 0,
    }

    def tx(s: Any) -> DatasetInfo:
        ds = ledger.insert_dataset(s, {**values, "created_at": now()})
        ledger.append_audit(s, "dataset", dataset_doc(ds))
        return dataset_info(ds)

    return ledger.write(tx)


def list_datasets(ledger: Ledger) -> list[DatasetInfo]:
    """Every dataset, by name."""
    with ledger.read() as s:
        return [dataset_info(d) for d in ledger.all_datasets(s)]


def get_dataset(ledger: Ledger, name: str) -> DatasetInfo:
    """One dataset (NotFound if it does not exist)."""
    with ledger.read() as s:
        return dataset_info(ledger.get_dataset(s, name))


def budget_report(ledger: Ledger, name: str) -> BudgetReport:
    """:meth:`privcal.accountant.Accountant.budget`, from one snapshot of the ledger."""
    with ledger.read() as s:
        ds = ledger.get_dataset(s, name)
        n_rel = ledger.release_count(s, ds.id)
        pol, sp = policy_of(ds), spent_of(ds)
        # local-DP reports are in no central total: the worst subject's Σε0 is added (F-2)
        se = acc.spent_epsilon(pol, sp, ds.reporting_delta, largest_subject_spend(ledger, s, ds))
        g = guarantee_report(ds)  # its short forms know what the statement excludes (F-1)
        return BudgetReport(
            dataset=ds.name, notion=ds.notion, policy=pol.describe(), cap=exact(cap_of(ds)),
            spent=exact(acc.used(pol, sp)), remaining=exact(acc.remaining(pol, sp)),
            reporting_delta=Decimal(acc.dstr(ds.reporting_delta)),
            guarantee=g,
            spent_dp=SpentReport(
                epsilon=Decimal(acc.dstr(se.epsilon)), delta=Decimal(acc.dstr(se.delta)),
                rule=se.rule, candidates=se.candidates, note=se.note,
                central_epsilon=_opt(se.central_epsilon), subject_max=_opt(se.subject_max)),
            renyi_orders=[Decimal(acc.dstr(a)) for a in o] if (o := renyi_orders_of(ds)) else None,
            charges=ds.charge_count, releases=n_rel,
            subject_epsilon=(Decimal(acc.dstr(ds.subject_epsilon))
                             if ds.subject_epsilon is not None else None),
        )


def largest_subject_spend(ledger: Ledger, s: Any, ds: Any) -> Decimal | None:
    """The largest Σε0 one subject has spent on ``ds``'s local-DP reports, read in the
    snapshot ``s`` (0 if none yet); None if the dataset takes no local-DP reports (no
    per-subject cap: they are refused)."""
    if ds.subject_epsilon is None:
        return None
    return _eps(ledger.subject_units_max(s, ds.id))


def _opt(d: Decimal | None) -> Decimal | None:
    """An optional amount as the exact decimal reported."""
    return None if d is None else Decimal(acc.dstr(d))


def _eps(units: float | int) -> Decimal:
    """Spent units (of :data:`~privcal.storage.models.SUBJECT_UNIT`) as an exact ε."""
    return Decimal(acc.dstr(units_eps(int(units))))


def subject_spend(ledger: Ledger, name: str, subject_id: Any) -> Decimal:
    """ε0 spent so far by one subject of ``name`` (0 if never charged), by its pseudonym."""
    # the one id normalisation, a person's (people=True): "7.0" is no id a charge takes, so
    # "spent 0" for it misled beside the 2 person 7 spent (red team 23, privacy F4 and
    # newcomer F4)
    sid = str(id_strings([subject_id], "subject id", people=True)[0])
    with ledger.read() as s:
        ds = ledger.get_dataset(s, name)
        return _eps(ledger.subject_units(s, ds.id, ledger.pseudonyms([sid])[0]))


def subject_summary(ledger: Ledger, name: str) -> SubjectSummary:
    """Count, maximum, mean and quantiles of per-subject spends, and how many are at the cap."""
    with ledger.read() as s:
        ds = ledger.get_dataset(s, name)
        units = ledger.subject_units_all(s, ds.id)
        cap = ds.subject_epsilon
    if units.size == 0:
        return SubjectSummary(dataset=name, subject_epsilon=(Decimal(acc.dstr(cap)) if cap
                                                             is not None else None),
                              subjects=0, at_cap=0,
                              max=Decimal(0), mean=0.0, quantiles={})
    cap_u = cap_units(cap) if cap is not None else None
    qs = {f"{q:g}": _eps(np.quantile(units, q, method="higher")) for q in (0.5, 0.9, 0.99)}
    return SubjectSummary(
        dataset=name, subject_epsilon=Decimal(acc.dstr(cap)) if cap is not None else None,
        subjects=int(units.size),
        at_cap=int((units >= cap_u).sum()) if cap_u is not None else 0,
        max=_eps(units.max()), mean=float(units.mean()) * float(SUBJECT_UNIT), quantiles=qs,
    )


def _check_addressable(name: str) -> None:
    """A new dataset's name must name it everywhere it is used: as one path segment of the
    service's ``/v1/datasets/{name}`` (no ``/``, not ``.`` or ``..``), in a header and a
    one-line message (no control characters, no bidirectional controls: they would make
    it print as another name, red team 8), and as one spelling (NFC, as subject ids:
    ``é`` typed two ways would be two datasets that print alike) (red team 5)."""
    import unicodedata

    if "/" in name or name in (".", ".."):
        raise InvalidInput(f"dataset name {name!r} cannot contain '/' or be '.' or '..' "
                           "(it is one segment of the service's URLs)")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise InvalidInput(f"dataset name {name!r} contains a control character")
    if (bidi := bidi_problem(name)) is not None:
        raise InvalidInput(f"dataset name {name!r:.60} {bidi}")
    if (blank := invisible_char(name)) is not None:  # "d\ufe0f" prints as "d" (red team 10)
        raise InvalidInput(f"dataset name {name!r:.60} contains U+{ord(blank):04X} "
                           f"({unicodedata.name(blank, 'unnamed')}), which reads as nothing: "
                           "it would print as another name")
    if unicodedata.normalize("NFC", name) != name:
        raise InvalidInput(f"dataset name {name!r} is not in Unicode NFC: write it composed")
