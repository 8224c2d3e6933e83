"""Verifying that a dataset's logged charges stay within its logged cap — for pure-ε and ρ-zCDP
caps, whose filters are exact sums the storage can check itself.

Part of :meth:`privcal.storage.verify.LedgerVerifier.verify`, after the running totals are
found equal to the sums of the logged charges. Every charge privcal accepts keeps its dataset
within its cap, but a cap raised around a charge and put back (or totals lowered around one
and restored) leaves every row equal to its entry and the budget overspent (red team 23,
ledger F7). The accountant's verification checked it, but ``Ledger.verify`` — and so
``Ledger.sign_head`` — did not: a signature vouched for an overspent log (red team 24,
ledger F2). An (ε, δ) cap's filter (a Rényi conversion over its grid of orders) is the
accountant's mathematics: :func:`privcal.accountant.verification.check_cap` checks it, with
the same sentence, passed in as ``Ledger.verify``'s ``cap_check`` so that it runs on the rows
of the snapshot verified (red team 25, ledger F3); ``Ledger.sign_head`` without it refuses a
log with such a cap (:func:`refuse_unchecked_cap`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from privcal.costs import fixed_context
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage.audit import dec
from privcal.storage.models import Dataset

__all__ = ["check_central_cap", "grid_check", "refuse_unchecked_cap", "refuse_unchecked_releases",
           "unchecked_caps"]

_ZERO = Decimal(0)
#: exact for any two totals the ledger stores (NUMERIC(48, 30)), whatever the caller's context
_EXACT = fixed_context(100)


def check_central_cap(ds: Dataset,
                      cap_check: Callable[[Dataset], None] | None = None) -> None:
    """AuditFailed naming the dataset if its stored totals (just found equal to its logged
    charges) spend more than its pure-ε or ρ-zCDP cap allows — the rule of
    :func:`privcal.accountant.privacy.filters.within_cap` — or charge a kind the cap refuses;
    an (ε, δ) cap is left to the accountant (module docstring), whose check is
    ``cap_check`` (called here, in the verification's own snapshot: red team 25, ledger F3)."""
    if cap_check is not None:
        cap_check(ds)
    if ds.notion == "pure":
        cap, used, unit = ds.cap_epsilon or _ZERO, ds.spent_pure_eps, "epsilon"
        others = (ds.spent_zcdp_rho, ds.spent_approx_eps, ds.spent_approx_delta)
        what = f"ε ≤ {dec(cap)} (pure DP)"
    elif ds.notion == "zcdp":
        cap, unit = ds.cap_rho or _ZERO, "rho"
        used = _EXACT.add(ds.spent_pure_rho, ds.spent_zcdp_rho)
        others = (ds.spent_approx_eps, ds.spent_approx_delta)
        what = f"ρ ≤ {dec(cap)} (zCDP)"
    else:
        return
    if used <= cap and not any(others):
        return
    raise AuditFailed(
        f"dataset {ds.id} ({ds.name!r}): its logged charges spend {unit}={dec(used)} of its "
        f"cap {what}, more than the cap's filter allows: a cap or running totals edited around "
        "a charge, or a charge accepted past its budget")


def grid_check(cap_check: Callable[[Dataset, bool], None] | None, charges: Mapping[int, Any],
               logged: Mapping[int, int], migration: tuple[int, Any] | None,
               unchecked: list[int] | None = None) -> Callable[[Dataset], None]:
    """``cap_check(ds, under_grid)`` as :func:`check_central_cap` calls it: ``under_grid`` is
    whether the dataset's totals were last charged under its cap's filter — always, unless
    the row has no Rényi grid (an (ε, δ) dataset made before migration 0004) and its last
    central charge was logged before the 0005 ``migration`` entry (charged under the
    pre-0004 rule, it may be past the filter; a charge logged after it was accepted by the
    filter on the frozen grid, which the totals through it — the current ones, it being the
    last — must then satisfy: red team 25, ledger F7, a cap edited around charges made after
    the upgrade verified ok). ``logged``: charge id → its entry's seq; ``migration``: the
    ``migration`` entry (seq, data), if any. Without ``cap_check``: :func:`unchecked_caps`
    (``unchecked``, the ids of the (ε, δ) datasets left unchecked)."""
    if cap_check is None:
        cap_check = unchecked_caps([] if unchecked is None else unchecked)
    since = migration[0] if migration is not None else 0
    last: dict[int, int] = {}
    for cid, c in charges.items():
        if c.notion in ("pure", "zcdp", "approx"):  # central (a local-DP one has no filter)
            last[c.dataset_id] = max(last.get(c.dataset_id, 0), logged.get(cid, 0))

    def check(ds: Dataset) -> None:
        cap_check(ds, ds.renyi_orders is not None or last.get(ds.id, 0) > since)
    return check


def refuse_unchecked_cap(ds: Dataset, under_grid: bool = True) -> None:
    """The ``cap_check`` of :meth:`privcal.storage.Ledger.sign_head` when its caller gives
    none: InvalidInput, nothing signed, for a dataset whose (ε, δ) cap has a Rényi grid —
    a cap the storage cannot check, so a signature would vouch for a log overspent past it
    (red team 25, ledger F3) — also one made before the grid existed if charged under the
    filter since (``under_grid``: :func:`grid_check`)."""
    if ds.notion == "approx" and under_grid:
        raise InvalidInput(
            f"dataset {ds.id} ({ds.name!r}) has an (ε, δ) cap, whose Rényi filter the storage "
            "cannot check: sign with privcal.accountant.verification.sign_head (`privcal audit "
            "head --sign`), which checks it, or pass its check as cap_check; nothing signed")


def unchecked_caps(found: list[int]) -> Callable[[Dataset, bool], None]:
    """The ``cap_check`` of :meth:`privcal.storage.Ledger.verify` when its caller gives none:
    it checks nothing, and appends to ``found`` the id of each dataset whose (ε, δ) cap it
    leaves unchecked — one :func:`refuse_unchecked_cap` refuses to sign — so that the report
    says so (``VerifyReport.caps_unchecked``): a log overspent past such a cap verified with
    a report that did not say its caps were not checked (red team 26, ledger F10)."""
    def count(ds: Dataset, under_grid: bool = True) -> None:
        if ds.notion == "approx" and under_grid:
            found.append(ds.id)
    return count


def refuse_unchecked_releases(verify: Callable[..., Any]) -> Callable[..., Any]:
    """``verify`` (the storage's), whose report must leave no release unchecked: the verify
    :meth:`privcal.storage.Ledger.sign_head` signs after. A pure-cost release on a ρ-zCDP
    cap whose pure charges count less than its whole ε²/2 is paid for only if it composes
    separately charged runs — the calibrators' to say, not the storage's
    (:func:`~privcal.storage.verify_releases.check_release_charges`): InvalidInput, nothing
    signed (red team 26, payrule F1: a 3-DP release paid by three PureDP(1) charges, its cap
    fed ρ = 1.5 for 4.5, was signed)."""
    def checked(*args: Any, **kwargs: Any) -> Any:
        rep = verify(*args, **kwargs)
        if rep.releases_unchecked:
            raise InvalidInput(
                f"{rep.releases_unchecked} pure-cost release(s) on a ρ-zCDP cap are paid by "
                "pure charges counting less than their whole ε²/2, which the storage cannot "
                "tell are paid for: sign with privcal.accountant.verification.sign_head "
                "(`privcal audit head --sign`), which checks them; nothing signed")
        return rep
    return checked
