"""One calibration request on the accountant side: prepare, check the shuffle claim, run.

:func:`calibrate` is what :meth:`Accountant.calibrate <privcal.accountant.Accountant.calibrate>`,
the CLI and the service call: it prepares the request
(:func:`privcal.accountant.prepare.prepare`: parameters, scores, shape — nothing charged),
refuses an unproven shuffle amplification, then hands the calibrator and data to
:meth:`Accountant.run`, which charges, calibrates and records the release.
:func:`dry_run` does the same from the data's shape only and writes nothing.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from privcal.accountant.prepare import prepare, prepare_shape, validate_params
from privcal.calibrators import registry
from privcal.calibrators.base import Calibrator, DataShape
from privcal.calibrators.score_range import resolve_score_range
from privcal.errors import InvalidInput

__all__ = ["calibrate", "dry_run"]


def calibrate(
    accountant: Any,
    method: str | Calibrator,
    params: dict[str, Any],
    *,
    dataset: str,
    scores: Any = None,
    probs: Any = None,
    labels: Any = None,
    score: str | None = None,
    score_options: dict[str, Any] | None = None,
    agents: Any = None,
    subjects: Any = None,
    classes: Any = None,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
    targets: Any = None,
    score_range: Any = None,
    mondrian: str | None = None,
    groups: Any = None,
    public_groups: bool = False,
    shuffled: bool = False,
    assume_unlinkable_features: bool = False,
    requester: str | None = None,
    idempotency_key: str | None = None,
    rng: random.Random | None = None,
) -> Any:
    """Validate, charge, calibrate and record one release (see :meth:`Accountant.calibrate`)."""
    from privcal.accountant.amplification import (
        check_shuffle_method,
        check_shuffled_dataset,
        shuffled_guarantee,
    )

    ds = accountant.dataset(dataset)  # an unknown dataset fails before any data work
    if not isinstance(shuffled, bool) or not isinstance(assume_unlinkable_features, bool):
        raise InvalidInput("shuffled and assume_unlinkable_features must be True or False")
    prep = prepare(
        method, params, scores=scores, probs=probs, labels=labels, score=score,
        score_options=score_options, agents=agents, subjects=subjects, classes=classes,
        preds=preds, lower_preds=lower_preds, upper_preds=upper_preds, targets=targets,
        score_range=score_range, mondrian=mondrian, groups=groups,
        public_groups=public_groups, rng=rng,
    )  # fmt: skip
    # the guarantee depends on public quantities only: Accountant.run computes it before
    # anything is charged, refusing an infeasible request (e.g. a FedCP²-QQ plan with ε too
    # small for n), and again for the subjects actually accepted, inside the charge
    shuffle = None
    if shuffled:
        name = prep.calibrator.name
        check_shuffle_method(name, assume_unlinkable_features=assume_unlinkable_features)

        def shuffle(shape: DataShape) -> tuple[Any, dict[str, Any]]:
            return shuffled_guarantee(
                name, prep.params, shape, ds.reporting_delta,
                assume_unlinkable_features=assume_unlinkable_features,
            )  # fmt: skip

        # refuse an unproven amplification claim (fedcp2-qq, ldp-label) and a cap that cannot
        # be charged it before anything is charged; the run recomputes the amplified cost for
        # the subjects actually accepted
        shuffle(prep.shape)
        check_shuffled_dataset(ds)
    elif assume_unlinkable_features:
        raise InvalidInput("--assume-unlinkable-features only matters with --shuffled")
    return accountant.run(
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
            # the public score range the method was told, where it came from, and what
            # happens to scores outside it (never clipped)
            **({"score_range": prep.score_range} if prep.score_range is not None else {}),
        } or None,
        classes=prep.shape.k,
    )


def dry_run(
    accountant: Any,
    method: str | Calibrator,
    params: dict[str, Any],
    *,
    dataset: str,
    scores: Any = None,
    probs: Any = None,
    labels: Any = None,
    agents: Any = None,
    subjects: Any = None,
    classes: Any = None,
    preds: Any = None,
    lower_preds: Any = None,
    upper_preds: Any = None,
    targets: Any = None,
    score_range: Any = None,
    mondrian: str | None = None,
    groups: Any = None,
    public_groups: bool = False,
    shuffled: bool = False,
    assume_unlinkable_features: bool = False,
    **_ignored: Any,
) -> Any:
    """The cost of a calibration and what would remain, from the data's *shape* only.

    Only the number of rows (and classes, and agents) is read, never a value — except, for
    Mondrian groups, each row's group (the label, or the group column): the caller asserts
    it is public (``public_groups=True``), and the group sizes set the cost.
    """
    from privcal.accountant.wrapping import wrap, wrapping

    how, params = wrapping(params, mondrian=mondrian, groups=groups,
                           public_groups=public_groups)
    reg = registry.get(method) if isinstance(method, str) else None
    cal = reg.calibrator if reg else method  # type: ignore[union-attr]
    if not isinstance(cal, Calibrator):
        raise InvalidInput(f"method must be a calibrator name, got {method!r:.60}")
    from privcal.accountant.amplification import check_shuffle_method, check_shuffled_dataset

    if not isinstance(params, dict):
        raise InvalidInput(f"params must be a dict, got {type(params).__name__}")
    params, _ = resolve_score_range(cal.name, cal.Params, params, score_range)
    p = validate_params(cal, params)  # type: ignore[arg-type]
    ds = accountant.dataset(dataset)
    shape = prepare_shape(cal, scores=scores, probs=probs, labels=labels, agents=agents,
                          subjects=subjects, classes=classes, preds=preds,
                          lower_preds=lower_preds, upper_preds=upper_preds, targets=targets)
    if not isinstance(shuffled, bool) or not isinstance(assume_unlinkable_features, bool):
        raise InvalidInput("shuffled and assume_unlinkable_features must be True or False")
    if shuffled:
        check_shuffle_method(cal.name, assume_unlinkable_features=assume_unlinkable_features)
        check_shuffled_dataset(ds)
    elif assume_unlinkable_features:
        raise InvalidInput("--assume-unlinkable-features only matters with --shuffled")
    if how.wanted:
        cal, p, names, index = wrap(cal, p, how, n=shape.n, k=shape.k, labels=labels)
        if index is not None and names is not None:
            shape = DataShape(n=shape.n, k=shape.k, group_sizes=tuple(
                int(c) for c in np.bincount(index, minlength=len(names))))
    return accountant.dry_run(cal, p, shape, dataset)
