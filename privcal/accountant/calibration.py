"""One calibration request on the accountant side: prepare, check the shuffle claim, run.

:func:`calibrate` is what :meth:`Accountant.calibrate <privcal.accountant.Accountant.calibrate>`,
the CLI and the service call: it prepares the request
(:func:`privcal.accountant.prepare.prepare`: parameters, scores, shape — nothing charged),
refuses an unproven shuffle amplification, then hands the calibrator and data to
:meth:`Accountant.run`, which charges, calibrates and records the release.
:func:`dry_run` does the same from the data's shape only and writes nothing. Both take a
:class:`~privcal.accountant.calibration_request.CalibrationRequest` (or the method,
parameters and inputs as keywords, which build one).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from privcal.accountant import calibration_run
from privcal.accountant.calibration_request import CalibrationRequest, check_rng
from privcal.accountant.calibration_run import public
from privcal.accountant.prepare import prepare, prepare_shape, validate_params
from privcal.calibrators import registry
from privcal.calibrators.base import Calibrator, DataShape
from privcal.calibrators.score_range import resolve_score_range

__all__ = ["calibrate", "dry_run"]


def calibrate(
    accountant: Any,
    request: CalibrationRequest | str | Calibrator,
    params: dict[str, Any] | None = None,
    *,
    dataset: str,
    requester: str | None = None,
    idempotency_key: str | None = None,
    rng: random.Random | None = None,
    **inputs: Any,
) -> Any:
    """Validate, charge, calibrate and record one release (see :meth:`Accountant.calibrate`).

    ``request`` is a :class:`CalibrationRequest`, or the method with ``params`` and the
    inputs as keywords (its fields)."""
    from privcal.accountant.amplification import (
        check_shuffle_method,
        check_shuffled_dataset,
        shuffled_guarantee,
    )

    check_rng(rng)  # a bad one (rng=42) is refused before it scores or anything is charged
    req = CalibrationRequest.of(request, params, **inputs)
    ds = accountant.dataset(dataset)  # an unknown dataset fails before any data work
    prep = prepare(req, rng=rng)
    # the guarantee depends on public quantities only: Accountant.run computes it before
    # anything is charged, refusing an infeasible request (e.g. a FedCP²-QQ plan with ε too
    # small for n), and again for the subjects actually accepted, inside the charge
    shuffle = None
    unlinkable = req.assume_unlinkable_features
    if req.shuffled:
        name = prep.calibrator.name
        check_shuffle_method(name, assume_unlinkable_features=unlinkable)

        def amplify(shape: DataShape) -> tuple[Any, dict[str, Any]]:
            return shuffled_guarantee(
                name, prep.params, shape, ds.reporting_delta,
                assume_unlinkable_features=unlinkable,
            )  # fmt: skip

        shuffle = public(name, amplify)  # ε0 at the float range's edge: one line, no charge

        # refuse an unproven amplification claim (fedcp2-qq, ldp-label) and a cap that cannot
        # be charged it before anything is charged; the run recomputes the amplified cost for
        # the subjects actually accepted
        shuffle(prep.shape)
        check_shuffled_dataset(ds)
    return calibration_run.run(  # Accountant.run refuses a caller's shuffle (red team 16)
        accountant.ledger,
        prep.calibrator,
        prep.params,
        prep.data,
        dataset=dataset,
        requester=requester,
        idempotency_key=idempotency_key,
        rng=rng,
        registered=prep.registered,
        shuffle=shuffle,
        extra_diagnostics={
            **({"score": prep.score} if prep.score else {}),
            # public metadata: the class names in probability-column order
            **({"classes": prep.classes} if prep.classes is not None else {}),
            # the columns' own names, to match a later table by (red team 16), and whether
            # integer labels are class names (a header 1,2,3), for evaluate
            **({"columns": prep.columns} if prep.columns is not None else {}),
            **({"label_names": True} if prep.label_names else {}),
            # the public score range the method was told, where it came from, and what
            # happens to scores outside it (never clipped)
            **({"score_range": prep.score_range} if prep.score_range is not None else {}),
        } or None,
        classes=prep.shape.k,
    )


def dry_run(
    accountant: Any,
    request: CalibrationRequest | str | Calibrator,
    params: dict[str, Any] | None = None,
    *,
    dataset: str,
    **inputs: Any,
) -> Any:
    """The cost of a calibration and what would remain, from the data's *shape* only.

    Only the number of rows (and classes, and agents) is read, never a value — except, for
    Mondrian groups, each row's group (the label, or the group column): the caller asserts
    it is public (``public_groups=True``), and the group sizes set the cost. ``request`` as
    for :func:`calibrate`; what only a run uses (``requester``, ``idempotency_key``,
    ``rng``) is ignored here. The checks the run makes from the parameters and the shape
    before charging are made here by the same calls (a request refused for its parameters is
    refused here too), and a shuffled run is priced as the run charges it: ε0 per subject
    *and* the amplified central (ε, δ) against the dataset's cap
    (:func:`privcal.accountant.calibration_run.dry_run`).
    """
    from privcal.accountant.amplification import (
        check_shuffle_method,
        check_shuffled_dataset,
        shuffled_guarantee,
    )
    from privcal.accountant.calibration_run import dry_run as priced
    from privcal.accountant.prepare import check_score_request
    from privcal.accountant.wrapping import wrap, wrapping
    from privcal.calibrators.class_labels import encode_labels

    for run_only in ("requester", "idempotency_key", "rng"):
        inputs.pop(run_only, None)
    req = CalibrationRequest.of(request, params, **inputs)
    how, params = wrapping(req.params, mondrian=req.mondrian, groups=req.groups,
                           public_groups=req.public_groups)
    cal = registry.get(req.method).calibrator if isinstance(req.method, str) else req.method
    params, _ = resolve_score_range(cal.name, cal.Params, params, req.score_range)
    p = validate_params(cal, params)
    ds = accountant.dataset(dataset)
    shape = prepare_shape(cal, req)
    check_score_request(cal, req, shape.k)  # the score's options, as the run checks them
    if req.shuffled:
        check_shuffle_method(cal.name, assume_unlinkable_features=req.assume_unlinkable_features)
        check_shuffled_dataset(ds)
    labels, classes = req.labels, None
    if how.mondrian == "label" and req.classes is not None and shape.k is not None:
        # label groups by class name, as the run encodes them (the groups are public)
        labels, classes = encode_labels(labels, req.classes, shape.k)
    if how.wanted:
        cal, p, names, index = wrap(cal, p, how, n=shape.n, k=shape.k, labels=labels,
                                    classes=classes)
        if index is not None and names is not None:
            shape = DataShape(n=shape.n, k=shape.k, group_sizes=tuple(
                int(c) for c in np.bincount(index, minlength=len(names))))
    shuffle = None
    if req.shuffled:
        name, final, unlinkable = cal.name, p, req.assume_unlinkable_features

        def shuffle(shape: DataShape) -> tuple[Any, dict[str, Any]]:
            return shuffled_guarantee(name, final, shape, ds.reporting_delta,
                                      assume_unlinkable_features=unlinkable)

    return priced(accountant.ledger, cal, p, shape, dataset, shuffle=shuffle)
