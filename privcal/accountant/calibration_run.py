"""The calibration run — charge, calibrate, release — and the dry run that only prices it.

:func:`run` is the flow of DESIGN.md, "The flow of one calibration", one call per step:

1. validate the parameters, the data (``check_data``: whatever the calibrator's
   ``calibrate`` would refuse, by its ``check_inputs``) and its public shape
   (:mod:`privcal.accountant.run_inputs`: ``params_of``, ``check_data``, ``shape_of``; and
   ``rng``), and everything that needs only those (``calibrator.guarantee``, e.g. an
   infeasible plan) — before anything is charged;
2. the cost, from the parameters and the shape alone: ``calibrator.cost(params, shape)``;
3. charge it and COMMIT: :func:`privcal.accountant.charges.charge` (central), or
   :func:`privcal.accountant.subject_charges.charge_subjects` (local DP: per subject; the
   rows of refused subjects are dropped, counted by reason in ``diagnostics["dropped_rows"]``,
   and the guarantee is re-checked for the rows accepted, inside the charge transaction);
   a non-private method runs only if the dataset allows it;
4. ``calibrator.calibrate(data, params, rng)`` — the only step that touches the data;
5. :func:`privcal.accountant.releases.record_release` with the privacy record of
   :func:`privcal.accountant.release_privacy.privacy_record`, in its own transaction.

A crash between 3 and 5 leaves a charge without a release, never the reverse. With an
idempotency key the run holds the key's lock (:meth:`privcal.storage.Ledger.key_lock`)
from 3 to 5; a replayed charge returns its release, or — if the first run crashed —
calibrates again under the same charge, so only one output is ever released for it.
A shuffled run is refused unless the dataset has an (ε, δ) cap that is charged the
amplified cost (:func:`privcal.accountant.amplification.check_shuffled_dataset`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import wraps
from typing import Any

import numpy as np
from pydantic import ValidationError

from privcal.accountant import privacy as acc
from privcal.accountant.calibration_request import check_rng
from privcal.accountant.charges import charge_parts, check_parts
from privcal.accountant.datasets import get_dataset
from privcal.accountant.normalize import (
    CentralCost,
    bound_digest,
    cost_json,
    json_safe,
    normalize_cost,
)
from privcal.accountant.normalize import idempotency_key as idempotency_key_text
from privcal.accountant.policy import exact, policy_of, spent_of
from privcal.accountant.release_privacy import privacy_record
from privcal.accountant.releases import nonprivate_replay, record_release, release_for_charge
from privcal.accountant.results import ChargeReceipt, DryRun, Release
from privcal.accountant.run_inputs import check_data, params_of, rows_of, shape_of, snapshot
from privcal.accountant.subject_charges import charge_subjects
from privcal.calibrators import registry
from privcal.calibrators.base import (
    CalibrationInput,
    Calibrator,
    DataShape,
    default_rng,
    only_infinite,
    unpredictable,
)
from privcal.calibrators.validation import id_strings
from privcal.costs import ApproxDP, LocalDP
from privcal.errors import BudgetRefused, InvalidInput, first_error, numeric_edge
from privcal.storage import Ledger

__all__ = ["check_data", "dry_run", "params_of", "public", "rows_of", "run", "shape_of"]

#: the amplified central cost of a shuffled run for a shape, and what to record about it
Shuffle = Callable[[DataShape], tuple[ApproxDP | None, dict[str, Any]]]


def public(what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, a computation on public numbers (a cost, a guarantee, a plan), whose failure on
    accepted inputs at the edge of the float range (ε = 5e-324, ε = 1e308) is a one-line
    :class:`InvalidInput` naming ``what`` (:func:`~privcal.errors.numeric_edge`), as is a
    value a cost's or a guarantee's model refuses; nothing is charged when it fires."""

    @wraps(fn)
    def one_line(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            where, msg, _ = first_error(exc)
            raise InvalidInput(f"{what}: {'.'.join(filter(None, (exc.title, where)))} {msg}"
                               ) from None

    return numeric_edge(what)(one_line)


def run(
    ledger: Ledger,
    calibrator: Calibrator,
    params: Any,
    data: CalibrationInput,
    *,
    dataset: str,
    requester: str | None = None,
    idempotency_key: str | None = None,
    rng: random.Random | None = None,
    registered: Any = None,
    privacy_extra: dict[str, Any] | None = None,
    central_cost: CentralCost | None = None,
    extra_diagnostics: dict[str, Any] | None = None,
    shuffle: Shuffle | None = None,
    classes: int | None = None,
) -> Release:
    """:meth:`privcal.accountant.Accountant.run`: charge, calibrate, release (DESIGN.md,
    "The flow of one calibration"; the steps and parameters are documented there)."""
    check_rng(rng)  # before anything is charged
    if idempotency_key is None:
        return _run(ledger, calibrator, params, data, dataset=dataset, requester=requester,
                    idempotency_key=None, rng=rng, registered=registered,
                    privacy_extra=privacy_extra, central_cost=central_cost,
                    extra_diagnostics=extra_diagnostics, shuffle=shuffle, classes=classes)
    key = idempotency_key_text(idempotency_key)  # KEY#central is privcal's: refused
    assert key is not None
    with ledger.key_lock(dataset, key):
        return _run(ledger, calibrator, params, data, dataset=dataset, requester=requester,
                    idempotency_key=key, rng=rng, registered=registered,
                    privacy_extra=privacy_extra, central_cost=central_cost,
                    extra_diagnostics=extra_diagnostics, shuffle=shuffle, classes=classes)


def _run(
    ledger: Ledger,
    calibrator: Calibrator,
    params: Any,
    data: CalibrationInput,
    *,
    dataset: str,
    requester: str | None,
    idempotency_key: str | None,
    rng: random.Random | None,
    registered: Any,
    privacy_extra: dict[str, Any] | None,
    central_cost: CentralCost | None,
    extra_diagnostics: dict[str, Any] | None,
    shuffle: Shuffle | None,
    classes: int | None,
) -> Release:
    """:func:`run` once the idempotency key (if any) is locked: steps 1 to 5."""
    if not isinstance(calibrator, Calibrator):
        raise InvalidInput(f"not a calibrator: {calibrator!r:.60}")
    if not isinstance(data, CalibrationInput):
        raise InvalidInput("data must be a CalibrationInput")
    registered = registry.provenance(calibrator, registered)  # a stand-in is refused here
    p = params_of(calibrator, params)
    data = snapshot(data)  # read once: every step below reads this copy (red team 26, api F1)
    check_data(calibrator, data, p)  # what calibrate would refuse, refused before the charge
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int)
                                or classes < 2):
        raise InvalidInput(f"classes must be an integer ≥ 2, got {classes!r}")
    shape = shape_of(data, k=classes)
    # cost and guarantee from public numbers (a numeric failure: one line, nothing charged)
    cost = public(calibrator.name, calibrator.cost)(p, shape)
    request = {"kind": "calibrate", "method": calibrator.name,
               "params": p.model_dump(mode="python"), "shape": shape.model_dump(mode="python"),
               "shuffled": shuffle is not None or central_cost is not None}
    json_safe(request)  # what the release will record, refused now if it cannot be
    if (central_cost is not None or shuffle is not None) and not isinstance(cost, LocalDP):
        raise InvalidInput("central_cost applies only to local-DP methods (e.g. a shuffled "
                           "run); a central method's cost is charged as declared")
    if cost is not None:  # a private run's noise no one can predict (red team 20, privacy F2)
        rng = unpredictable(rng, "a private run")
    ds = get_dataset(ledger, dataset)
    if shuffle is not None:
        from privcal.accountant.amplification import check_shuffled_dataset

        check_shuffled_dataset(ds)  # what is recorded must be what is charged (14.5)
    # every check that needs only the parameters and the public shape runs before the
    # charge (issue 16.2); the local-DP branch repeats it for the rows actually accepted
    public(calibrator.name, calibrator.guarantee)(p, shape)
    rng = rng if rng is not None else default_rng()
    charge_ids: list[int] = []
    shuffled: dict[str, Any] = {}
    central_receipt: ChargeReceipt | None = None
    release_key: tuple[str, str] | None = None
    dropped: dict[str, int] | None = None
    purpose = f"release: {calibrator.name}"
    if cost is None:
        if not ds.allow_nonprivate:
            raise BudgetRefused(
                f"non-private release refused: {calibrator.name} is not differentially "
                f"private and dataset {dataset!r} does not allow non-private releases "
                "(create it with --allow-nonprivate)",
                scope=f"dataset {dataset!r}", asked="non-private", remaining="",
            )
        if idempotency_key is not None:  # no charge carries the key: release_keys does
            digest, was = bound_digest({**request, "dataset": dataset, "cost": None}, requester)
            done = nonprivate_replay(ledger, dataset, idempotency_key, digest, was, requester)
            if done is not None:
                return done
            release_key = (idempotency_key, digest)
    elif isinstance(cost, LocalDP):
        # a federated agent holds many rows but is one subject, charged once
        per_agent = calibrator.privacy_model == "federated"
        subjects = data.agents if per_agent else data.subjects  # (check_data: the same ids)
        if subjects is None:
            raise InvalidInput(
                f"{calibrator.name} is local DP: give the subject id of each row")
        sids = id_strings(subjects, "subject ids", people=True)
        charged, row_of = (np.unique(sids, return_inverse=True) if per_agent
                           else (sids, None))

        def central(accepted: np.ndarray) -> CentralCost | None:
            # runs inside the charge transaction, once refused subjects are known: a
            # request infeasible for the accepted rows (e.g. ldp-score with most subjects
            # at their cap) raises here and rolls every subject charge back (16.2)
            row_mask = accepted[row_of].reshape(-1) if row_of is not None else accepted
            kept = shape
            if not row_mask.all():  # the full shape was checked before the charge
                kept = shape_of(rows_of(data, row_mask), k=classes)
                _refuse_newly_trivial(calibrator, p, kept, dataset,
                                      lambda: _listed_shape(data, sids, row_of, shape, classes))
            if shuffle is None:
                return central_cost
            amplified, record = shuffle(kept)
            shuffled.clear()
            shuffled.update(record)
            return amplified

        res = charge_subjects(ledger, dataset, cost, charged, central_cost=central,
                              purpose=purpose, requester=requester,
                              idempotency_key=idempotency_key, request=request)
        if res.replayed:
            done = release_for_charge(ledger, res.charge_id)
            if done is not None:
                return done
            if res.accepted_mask is None:
                raise InvalidInput(
                    f"idempotency key {idempotency_key!r}: the local-DP batch was charged "
                    "before privcal recorded who it charged, and was not released; its "
                    "accepted rows are unknown")
            if shuffle is not None:  # the record of the crashed run, for the same rows
                m = res.accepted_mask
                shuffled.update(shuffle(shape_of(rows_of(
                    data, m[row_of] if row_of is not None else m)))[1])
        charge_ids.append(res.charge_id)
        if res.central is not None:
            charge_ids.append(res.central.charge_id)
            central_receipt = res.central
        mask = res.accepted_mask
        assert mask is not None
        if row_of is not None:
            mask = mask[row_of].reshape(-1)
            dropped = {"duplicate_subject": 0, "subject_over_cap": int((~mask).sum())}
        else:
            dropped = {"duplicate_subject": res.rejected_duplicate,
                       "subject_over_cap": res.rejected - res.rejected_duplicate}
        if not mask.all():
            data = rows_of(data, mask)
            shape = shape_of(data, k=classes)
    else:
        # each pure part its own event, in one transaction (red team 25, privacy2 F1)
        from privcal.calibrators.cost_parts import cost_parts

        receipts = charge_parts(ledger, dataset, cost, cost_parts(calibrator, p, shape, cost),
                                purpose=purpose, requester=requester,
                                idempotency_key=idempotency_key, request=request)
        if receipts[0].replayed:
            done = release_for_charge(ledger, receipts[0].charge_id)
            if done is not None:
                return done
        charge_ids.extend(r.charge_id for r in receipts)
    # ---- the charge is committed; from here on the data is touched
    result = calibrator.calibrate(data, p, rng)
    guarantee = public(calibrator.name, calibrator.guarantee)(p, shape)
    privacy = privacy_record(cost, ds, {**(privacy_extra or {}), **shuffled} or None,
                             calibrator)
    if central_receipt is not None:
        privacy["central_cost"] = central_receipt.cost
    return record_release(
        ledger, dataset, method=calibrator.name, calibrator_version=calibrator.version,
        threshold=float(result.threshold), params=p.model_dump(mode="python"),
        shape=shape.model_dump(mode="python"), coverage=guarantee,
        privacy=privacy, diagnostics={
            **result.diagnostics, **(extra_diagnostics or {}),
            # rows left out of the calibration, by reason: counts only, never ids (14.4)
            **({"dropped_rows": dropped} if dropped is not None else {}),
        },
        distribution=registered.distribution, distribution_version=registered.distribution_version,
        requester=requester, charge_ids=charge_ids, _as_computed=True, _key=release_key,
        _calibrator=calibrator,
    )


def _listed_shape(data: Any, sids: np.ndarray, row_of: np.ndarray | None, shape: DataShape,
                 classes: int | None) -> DataShape:
    """The shape of a local-DP run with every listed subject accepted, as its dry run counts
    it (one row per subject: :func:`~privcal.accountant.prepare.prepare_shape`); a federated
    run's agents keep all their rows."""
    if row_of is not None:
        return shape
    first = np.zeros(sids.shape[0], dtype=bool)
    first[np.unique(sids, return_index=True)[1]] = True
    return shape if first.all() else shape_of(rows_of(data, first), k=classes)


def _refuse_newly_trivial(calibrator: Calibrator, p: Any, kept: DataShape, dataset: str,
                          listed: Callable[[], DataShape]) -> None:
    """In the charge transaction of a local-DP run some of whose rows were left out: the
    guarantee for the rows kept (the run's own checks), and a BudgetRefused — every subject
    charge rolled back — when those rows could only give +∞ and the ``listed`` rows (one per
    subject, all accepted, as the dry run prices them) could not (red team 21, coverage F1:
    3 800 of 4 000 listed subjects at their cap; the dry run, which sees no one's spend,
    previewed a finite release; the run charged the other 200 ε0 each for +∞). A request
    already trivial for every listed subject runs as the dry run said it would."""
    name = calibrator.name
    g = public(name, calibrator.guarantee)(p, kept)
    if not public(name, only_infinite)(calibrator, p, kept, g):
        return
    shape = listed()
    if shape.n > kept.n and not public(name, only_infinite)(
            calibrator, p, shape, public(name, calibrator.guarantee)(p, shape)):
        raise BudgetRefused(
            f"budget refused on the subjects of dataset {dataset!r}: {kept.n} of the "
            f"{shape.n} subjects listed have room under the per-subject cap, and "
            f"for them {name} could only release +∞ (every label, every interval) — nothing "
            "charged (a dry run prices every listed subject: it does not see who is at the "
            "cap)",
            scope=f"dataset {dataset!r} subjects", asked=f"{name} on {shape.n} subjects",
            remaining=f"room for {kept.n} of {shape.n} subjects")


def dry_run(ledger: Ledger, calibrator: Calibrator, params: Any, shape: DataShape,
            dataset: str, *, shuffle: Shuffle | None = None) -> DryRun:
    """The cost of a run and what would remain after it; writes nothing. The run's checks
    from the parameters and the shape are made by the same calls (cost, guarantee; never
    "allowed" for a request the run refuses). ``shuffle``: the shuffled run's amplified
    central cost, as the run computes it, checked against the dataset's cap as its charge
    is, and reported as ``cost["central_cost"]`` (for every row: the run recomputes it for
    the subjects accepted, fewer if some are at their cap). The guarantee the run would
    record is reported too, and ``trivial`` when it can only release +∞ — every label, every
    interval — whatever the data (red team 19, newcomer F4: "allowed yes", then a charge for
    the trivial set)."""
    p = params_of(calibrator, params)
    cost = public(calibrator.name, calibrator.cost)(p, shape)
    g = public(calibrator.name, calibrator.guarantee)(p, shape)
    from privcal.calibrators.cost_parts import cost_parts  # (not for commands that compute none)

    parts = public(calibrator.name, cost_parts)(calibrator, p, shape, cost)
    out = _priced(ledger, calibrator.name, cost, shape, dataset, shuffle, parts)
    trivial = public(calibrator.name, only_infinite)(calibrator, p, shape, g)
    return out.model_copy(update={"guarantee": g.statement, "trivial": trivial})


def _priced(ledger: Ledger, name: str, cost: Any, shape: DataShape, dataset: str,
            shuffle: Shuffle | None, parts: list[Any] | None = None) -> DryRun:
    """:func:`dry_run`'s budget: what the run of method ``name`` would charge (``cost``),
    and what would remain."""
    central = None
    if shuffle is not None:
        if not isinstance(cost, LocalDP):
            raise InvalidInput("a shuffled run applies only to local-DP methods")
        amplified = public(name, shuffle)(shape)[0]
        central = normalize_cost(amplified) if amplified is not None else None
    with ledger.read() as s:
        ds = ledger.get_dataset(s, dataset)
        pol, sp = policy_of(ds), spent_of(ds)
        before = exact(acc.remaining(pol, sp))
        if cost is None:
            ok = bool(ds.allow_nonprivate)
            return DryRun(dataset=dataset, cost=None, allowed=ok,
                          reason="non-private; " + ("allowed" if ok else
                                                    "the dataset does not allow it"),
                          remaining_before=before, remaining_after=before if ok else None)
        cost = normalize_cost(cost)
        if isinstance(cost, LocalDP):
            ok = ds.subject_epsilon is not None and cost.eps0 <= ds.subject_epsilon
            report = cost_json(cost)
            reason = ("charged per subject against the per-subject cap (the guarantee and "
                      "`trivial` are for every listed row: the run leaves out subjects at "
                      "their cap, and refuses if the rest could only give +∞)" if ok
                      else "ε0 exceeds the per-subject cap (or none set)")
            after = sp
            if central is not None:  # the shuffled run's charge to the dataset's cap
                report["central_cost"] = cost_json(central)
                try:
                    after = acc.check_charge(pol, sp, central, scope=f"dataset {dataset!r}")
                except BudgetRefused as exc:
                    return DryRun(dataset=dataset, cost=report, allowed=False,
                                  reason=str(exc), remaining_before=before,
                                  remaining_after=None)
                reason += f", and the amplified {central.describe()} against the dataset cap"
            return DryRun(dataset=dataset, cost=report, allowed=ok, reason=reason,
                          remaining_before=before,
                          remaining_after=exact(acc.remaining(pol, after)) if ok else before)
        try:  # as the run charges it: its pure parts one by one (cost_parts)
            after = check_parts(pol, sp, [normalize_cost(c) for c in parts or [cost]],
                                scope=f"dataset {dataset!r}")
        except BudgetRefused as exc:
            return DryRun(dataset=dataset, cost=cost_json(cost), allowed=False,
                          reason=str(exc), remaining_before=before, remaining_after=None)
        return DryRun(dataset=dataset, cost=cost_json(cost), allowed=True, reason="fits",
                      remaining_before=before,
                      remaining_after=exact(acc.remaining(pol, after)))
