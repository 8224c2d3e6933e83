"""Central charges: one cost charged to a dataset's cap atomically, or refused writing nothing.

One charge is one write transaction (:meth:`privcal.storage.Ledger.write_core`, a Core
connection: the hot path, issue 11):

1. lock the dataset row (:meth:`~privcal.storage.Ledger.dataset_row`);
2. with an idempotency key, find an earlier charge under it: the same request replays its
   receipt, any other is an error naming the key (:func:`check_replay`);
3. check the cost against the cap with the filter of :mod:`privcal.accountant.privacy.filters`
   (:func:`~privcal.accountant.privacy.filters.check_charge` — BudgetRefused writes nothing);
4. insert the charge with the dataset's new totals and append its audit entry, the write's
   last step before COMMIT (:meth:`~privcal.storage.Ledger.record_charge`; one statement on
   PostgreSQL).

On PostgreSQL a process that knows the dataset row as its last charge left it first tries
the *optimistic* charge (:func:`_optimistic`, :mod:`privcal.storage.optimistic`): steps 3
and 4 in one message whose UPDATE checks the cap against the totals as committed and adds
the cost to them, under the snapshot's policy (and the idempotency key's absence) — one
round trip, which is also the COMMIT, whatever other processes charge the dataset. If the
cost does not fit or the policy changed, nothing is written and the steps above run as
usual (they decide, and explain a refusal).

:func:`charge_in_session` is the same policy for a writer holding an ORM session (a
collection session charging its amplified cost when it opens).
"""

from __future__ import annotations

from typing import Any

from privcal.accountant import privacy as acc
from privcal.accountant.normalize import (
    PART_KEY_SUFFIX,
    CentralCost,
    bound_digest,
    cost_json,
    normalize_cost,
    optional_text,
)
from privcal.accountant.normalize import idempotency_key as idempotency_key_text
from privcal.accountant.policy import (
    charge_cost,
    exact,
    policy_of,
    receipt_of,
    spent_columns,
    spent_of,
)
from privcal.accountant.results import ChargeReceipt, construct_trusted
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP
from privcal.errors import BudgetRefused, InvalidInput, LedgerError, PrivcalError
from privcal.storage import Ledger
from privcal.storage.audit import charge_doc, now
from privcal.storage.optimistic import LOST, UNKNOWN

__all__ = ["charge", "charge_central", "charge_in_session", "charge_parts", "check_parts",
           "check_replay"]

#: the central costs' classes (a tuple: ``PureDP | ZCDP | ApproxDP`` builds a union per call)
_CENTRAL = (PureDP, ZCDP, ApproxDP)


def check_replay(old: Any, key: str, digest: str | None, *, scope: str,
                 same_cost: bool, legacy: tuple[str, ...] = (),
                 requester: str | None = None) -> None:
    """InvalidInput naming ``key`` unless ``old`` (a charge row) was charged for this very
    request (its ``request_digest``; before migration 0005, its scope and cost; recorded
    by an older privcal, one of ``legacy`` for the same ``requester``:
    :func:`~privcal.accountant.normalize.bound_digest`)."""
    if old.request_digest is not None:
        same = old.request_digest == digest or (
            old.request_digest in legacy and old.requester == requester)
    else:  # a charge from before migration 0005: only its scope and cost are known
        same = old.scope == scope and same_cost
    if not same:
        what = (f"a local-DP batch (ε0 {acc.dstr(old.eps0)})" if old.scope == "subjects"
                else f"{(old.purpose or 'a charge')!r}")
        raise InvalidInput(
            f"idempotency key {key!r} was already used for a different charge or request (charge "
            f"{old.id}: {what}); a key binds the whole request — kind, dataset, method, every "
            "parameter, the cost and the data's public shape: use a new key")



def _request_of(dataset: str, cost: CentralCost, purpose: str | None, requester: str | None,
                idempotency_key: str | None, request: dict[str, Any] | None
                ) -> tuple[str | None, str | None, str | None, Any, Any]:
    """A charge's texts checked (purpose, requester, key) and, under a key, the digest of its
    request (``request``, else a plain charge's) with the (normalized) ``cost``: what
    :func:`charge` and :func:`charge_parts` store and compare a retry with."""
    purpose = optional_text(purpose, "purpose", 10_000)
    requester = optional_text(requester, "requester")
    key = idempotency_key_text(idempotency_key)
    digest, earlier = None, ()
    if key is not None:
        req = request if request is not None else {"kind": "charge", "purpose": purpose}
        digest, earlier = bound_digest({**req, "dataset": dataset, "cost": cost_json(cost)},
                                      requester)
    return purpose, requester, key, digest, earlier

def charge(
    ledger: Ledger,
    dataset: str,
    cost: CentralCost,
    *,
    purpose: str | None = None,
    requester: str | None = None,
    idempotency_key: str | None = None,
    request: dict[str, Any] | None = None,
) -> ChargeReceipt:
    """:meth:`privcal.accountant.Accountant.charge` (see the module docstring for the steps)."""
    if isinstance(cost, LocalDP):
        raise InvalidInput("a local-DP cost is charged per subject: use charge_subjects")
    if not isinstance(cost, _CENTRAL):
        raise InvalidInput(f"not a privacy cost: {cost!r}")
    cost = normalize_cost(cost)  # type: ignore[assignment]
    purpose, requester, key, digest, earlier = _request_of(
        dataset, cost, purpose, requester, idempotency_key, request)

    expect = None
    snap = ledger.charge_snapshot(dataset)
    if snap is not None:
        done, lost = _optimistic(ledger, snap, cost, purpose, requester, key, digest)
        if done is not None:
            return done
        if lost and key is None:  # the locked path decides whether it was recorded
            expect = snap

    def tx(conn: Any) -> ChargeReceipt:
        ds = ledger.dataset_row(conn, dataset)
        if expect is not None and ds != expect:
            raise LedgerError(
                "the connection to the ledger was lost during the charge's commit and the "
                f"dataset {dataset!r} has changed since: the charge may or may not have been "
                "recorded, so it was not retried (it could be recorded twice); check the "
                "ledger (privcal budget show, audit head) or retry with an idempotency key")
        if key is not None:
            old = ledger.charge_by_key(conn, ds.id, key)
            if old is not None:
                check_replay(old, key, digest, scope="dataset",
                             same_cost=cost_json(charge_cost(old)) == cost_json(cost),
                             legacy=earlier, requester=requester)
                return receipt_of(old, ds, replayed=True)
        return charge_central(ledger, conn, ds, cost, purpose, requester, key, digest)

    return ledger.write_core(tx)


def _optimistic(ledger: Ledger, snap: Any, cost: CentralCost, purpose: str | None,
                requester: str | None, key: str | None, digest: str | None
                ) -> tuple[ChargeReceipt | None, bool]:
    """The charge in one round trip, checked by its own statement against the dataset's
    row as committed, under the policy of ``snap`` — the dataset row as this process last
    saw it (:mod:`privcal.storage.optimistic`): (the receipt, False) if it was recorded;
    (None, False) if nothing was written and the locked path must run — the cost does not
    fit the committed totals or the policy changed (the locked path decides and explains),
    or the check refused against the snapshot, which is not authoritative; (None, True) if
    the connection was lost while it ran and its server process has ended (recorded or
    not: the locked path decides). A LedgerError if even that is unknown."""
    pol = _policy(snap)
    try:
        acc.check_charge(pol, spent_of(snap), cost, scope=f"dataset {snap.name!r}")
    except PrivcalError:
        return None, False
    try:
        increments = spent_columns(_NOTHING.add(cost))
    except InvalidInput:  # past what the ledger stores: the locked path names the total
        return None, False  # (red team 18: this named the increment, on PostgreSQL only)
    values = _values(snap.id, cost, purpose, requester, key, digest)
    done = ledger.cas_record_charge(snap, values, cost.kind, increments)
    if done == UNKNOWN:
        raise LedgerError(
            f"the connection to the ledger was lost during a charge of dataset {snap.name!r} "
            "and the server may still record it: it was not retried (it could be recorded "
            "twice); check the ledger (privcal budget show, audit head) or retry with an "
            "idempotency key")
    if done is None or done == LOST:
        return None, done == LOST
    cid, new = done
    return _receipt(int(cid), snap.name, cost, values, pol, spent_of(new)), False


#: the totals of a dataset charged nothing: ``_NOTHING.add(cost)`` is the cost's increments
_NOTHING = acc.Spent()


def _values(dataset_id: int, cost: CentralCost, purpose: str | None, requester: str | None,
            key: str | None, digest: str | None) -> dict[str, Any]:
    """The charge row's columns (all but ``id``) for a central charge."""
    # the cost's fields (a frozen model's __dict__): ``getattr(cost, "eps", None)`` of a field
    # the cost lacks goes through pydantic's __getattr__ and an AttributeError (issue 11)
    fields = vars(cost)
    return {
        "dataset_id": dataset_id, "scope": "dataset", "notion": cost.kind,
        "epsilon": fields.get("eps"), "delta": fields.get("delta"),
        "rho": fields.get("rho"), "eps0": None, "subjects_accepted": None,
        "subjects_rejected": None, "purpose": purpose, "requester": requester,
        "idempotency_key": key, "created_at": now(),
        "request_digest": digest if key is not None else None, "members_digest": None,
    }


def _receipt(cid: int, name: str, cost: CentralCost, values: dict[str, Any],
             pol: acc.Policy, after: acc.Spent) -> ChargeReceipt:
    """The receipt of a recorded central charge.

    Every field is already of its type (an int id, text checked by the caller, an aware
    UTC datetime, exact decimals): built without a second validation (issue 11;
    tests/test_hot_path.py checks it equals the validated receipt)."""
    return construct_trusted(ChargeReceipt, {
        "charge_id": cid, "dataset": name, "scope": "dataset", "cost": cost_json(cost),
        "purpose": values["purpose"], "requester": values["requester"],
        "idempotency_key": values["idempotency_key"], "created_at": values["created_at"],
        "remaining": exact(acc.remaining(pol, after)), "replayed": False,
    })


def charge_central(ledger: Ledger, conn: Any, ds: Any, cost: CentralCost,
                   purpose: str | None, requester: str | None,
                   key: str | None, digest: str | None = None) -> ChargeReceipt:
    """Check ``cost`` against the cap of ``ds`` (the dataset row locked on the Core
    connection ``conn``) and record it: steps 3 and 4 of the module docstring.

    Hot path: the budget check and the audit document are built in Python between the
    dataset lock and the audit append; one INSERT (with the totals UPDATE) writes it.
    """
    pol = _policy(ds)
    after = acc.check_charge(pol, spent_of(ds), cost, scope=f"dataset {ds.name!r}")
    values = _values(ds.id, cost, purpose, requester, key, digest)
    cid = ledger.record_charge(conn, values, spent_columns(after), ds.name)
    return _receipt(cid, ds.name, cost, values, pol, after)


#: dataset policy columns → its Policy (frozen; a few distinct caps per process)
_POLICIES: dict[tuple[Any, ...], acc.Policy] = {}
_MAX_POLICIES = 4096


def _policy(ds: Any) -> acc.Policy:
    """:func:`~privcal.accountant.policy.policy_of`, memoised on the columns it reads (it
    depends only on the cap, never on the totals)."""
    orders = ds.renyi_orders
    key = (ds.notion, ds.cap_epsilon, ds.cap_rho, ds.cap_delta,
           tuple(orders) if orders is not None else None)
    pol = _POLICIES.get(key)
    if pol is None:
        if len(_POLICIES) >= _MAX_POLICIES:
            _POLICIES.clear()
        pol = _POLICIES[key] = policy_of(ds)
    return pol


def charge_in_session(ledger: Ledger, s: Any, ds: Any, cost: CentralCost,
                      purpose: str | None, requester: str | None, key: str | None,
                      digest: str | None = None) -> Any:
    """:func:`charge_central` in an ORM session ``s`` whose dataset row ``ds`` (an ORM object)
    is locked; returns the charge row (its ``id`` is set)."""
    after = acc.check_charge(policy_of(ds), spent_of(ds), cost, scope=f"dataset {ds.name!r}")
    c = ledger.add_charge(s, ds, {
        "dataset_id": ds.id, "scope": "dataset", "notion": cost.kind,
        "epsilon": getattr(cost, "eps", None), "delta": getattr(cost, "delta", None),
        "rho": getattr(cost, "rho", None), "purpose": purpose, "requester": requester,
        "idempotency_key": key, "created_at": now(), "request_digest": digest if key else None,
    }, spent_columns(after))
    ledger.append_audit(s, "charge", charge_doc(c, ds.name))
    return c


def check_parts(pol: acc.Policy, spent: acc.Spent, parts: list[CentralCost], *,
                scope: str) -> acc.Spent:
    """The totals after ``parts`` (normalized costs), each charged as its own event
    (:mod:`privcal.calibrators.cost_parts`), or one BudgetRefused naming all of them and
    what was left before the first (a part's own refusal would name one part)."""
    if len(parts) == 1:
        return acc.check_charge(pol, spent, parts[0], scope=scope)
    after = spent
    try:
        for part in parts:
            after = acc.check_charge(pol, after, part, scope=scope)
    except BudgetRefused:
        left = ", ".join(f"{k}={acc.dstr(v)}" for k, v in acc.remaining(pol, spent).items())
        asked = f"{len(parts)} runs composed: " + " + ".join(p.describe() for p in parts)
        err = BudgetRefused(f"budget refused on {scope}: asked {asked}, it would exceed the "
                            f"cap; remaining {left}", scope=scope, asked=asked, remaining=left)
        err.details = {"cost": [cost_json(p) for p in parts],  # type: ignore[attr-defined]
                       "remaining_before": exact(acc.remaining(pol, spent))}
        raise err from None
    return after


def charge_parts(ledger: Ledger, dataset: str, cost: CentralCost,
                 parts: list[CentralCost] | None, *, purpose: str | None = None,
                 requester: str | None = None, idempotency_key: str | None = None,
                 request: dict[str, Any] | None = None) -> list[ChargeReceipt]:
    """A run's ``cost`` charged as :func:`charge` does, or — given its ``parts``
    (:func:`privcal.calibrators.cost_parts.cost_parts`) — each part as its own event, all in
    one write transaction or none (BudgetRefused writes nothing). The first part carries the
    run's idempotency key, part j ≥ 2 the key + ``#part<j>`` (reserved), each the request's
    digest, computed as :func:`charge`'s from the whole ``cost``: a retry finds them all, and
    a retry of a run charged whole before parts existed replays that one charge."""
    if not parts:
        return [charge(ledger, dataset, cost, purpose=purpose, requester=requester,
                       idempotency_key=idempotency_key, request=request)]
    whole = normalize_cost(cost)
    parts = [normalize_cost(c) for c in parts]  # type: ignore[misc]
    purpose, requester, key, digest, earlier = _request_of(
        dataset, whole, purpose, requester, idempotency_key, request)
    keys = [key] + [f"{key}{PART_KEY_SUFFIX}{j}" if key is not None else None
                    for j in range(2, len(parts) + 1)]

    def tx(s: Any) -> list[ChargeReceipt]:
        ds = ledger.lock_dataset(s, dataset)
        conn = s.connection()
        if key is not None:
            old = ledger.charge_by_key(conn, ds.id, key)
            if old is not None:
                check_replay(old, key, digest, scope="dataset", same_cost=cost_json(
                    charge_cost(old)) in (cost_json(whole), cost_json(parts[0])),
                    legacy=earlier, requester=requester)
                rows = [old] + [r for k in keys[1:]
                                if (r := ledger.charge_by_key(conn, ds.id, k)) is not None
                                and r.request_digest == old.request_digest]
                return [receipt_of(r, ds, replayed=True) for r in rows]
            for k in keys[1:]:  # a caller's key from before the suffix was reserved
                taken = ledger.charge_by_key(conn, ds.id, k)  # type: ignore[arg-type]
                if taken is not None:
                    raise InvalidInput(f"idempotency key {k!r}, this run's part's, is already "
                                       f"charge {taken.id}'s: use another key")
        check_parts(policy_of(ds), spent_of(ds), parts, scope=f"dataset {ds.name!r}")
        rows = [charge_in_session(ledger, s, ds, part, purpose, requester, k, digest)
                for part, k in zip(parts, keys, strict=True)]
        return [receipt_of(r, ds, replayed=False) for r in rows]

    return ledger.write(tx)
