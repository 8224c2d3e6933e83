"""From a method name and arrays to a calibrator, validated parameters and a ``CalibrationInput``.

This is the part of the flow of one calibration (DESIGN.md) that happens
before anything is charged: parameters are validated, data are checked and
turned into scores, and the public shape of the data is derived. Errors here
are :class:`~privcal.errors.InvalidInput` one-liners, and nothing is written.

It also holds what a released threshold is used for: prediction sets and
their evaluation on held-out data.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from scipy.stats import beta as beta_dist

from privcal.calibrators import registry
from privcal.calibrators.base import (
    CalibrationInput,
    Calibrator,
    CalibratorParams,
    DataShape,
)
from privcal.calibrators.scores import SCORES, label_scores, prediction_sets
from privcal.calibrators.validation import (
    check_labels,
    check_lengths,
    check_probs,
    check_scores,
    group_sizes,
    id_strings,
)
from privcal.errors import InvalidInput


@dataclass(frozen=True)
class Prepared:
    """Everything needed to charge and run one calibration."""

    registered: registry.Registered
    params: CalibratorParams
    data: CalibrationInput
    shape: DataShape
    score: dict[str, Any] | None
    classes: list[str] | None = None

    @property
    def calibrator(self) -> Calibrator:
        return self.registered.calibrator


def validate_params(calibrator: Calibrator, values: dict[str, Any]) -> CalibratorParams:
    """The calibrator's parameter model, or a one-line error naming the bad parameter."""
    try:
        return calibrator.Params.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "parameters"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"{calibrator.name} takes no parameter {where!r}"
            raise InvalidInput(msg) from None
        raise InvalidInput(f"{calibrator.name}: invalid {where}: {msg}") from None


def _ids(a: Any, what: str, n: int) -> np.ndarray:
    """``n`` ids as strings (:func:`~privcal.calibrators.validation.id_strings`: the CLI, the
    API and sessions key one person the same way; floats, None and empty ids refused)."""
    out = id_strings(a, what)
    if out.shape[0] != n:
        raise InvalidInput(f"{what} must be a 1-D array of {n} ids, got {out.shape[0]}")
    return out.astype(object)


def is_text_labels(labels: Any) -> bool:
    """Whether ``labels`` are class names (strings) rather than integer class indices."""
    if labels is None or isinstance(labels, str):
        return False
    try:
        arr = np.asarray(labels)
    except Exception:
        return False
    if arr.dtype.kind in "US":
        return True
    return arr.dtype.kind == "O" and arr.ndim == 1 and any(isinstance(v, str) for v in arr)


def check_classes(classes: Any, k: int | None) -> list[str]:
    """``k`` distinct, non-empty class names, in probability-column order."""
    if isinstance(classes, str) or not hasattr(classes, "__iter__"):
        raise InvalidInput("classes must be a list of class names, in probability-column order")
    names = list(classes)
    if not all(isinstance(c, str) and c.strip() for c in names):
        raise InvalidInput("classes must be non-empty strings (the class names)")
    if len(set(names)) != len(names):
        dup = next(c for c in names if names.count(c) > 1)
        raise InvalidInput(f"classes: {dup!r} is named twice")
    if k is not None and len(names) != k:
        raise InvalidInput(f"{len(names)} class names given, but the probabilities have "
                           f"{k} columns")
    return names


def encode_labels(labels: Any, classes: list[str] | None, k: int) -> tuple[Any, list[str] | None]:
    """Class-name labels as indices into the probability columns, and the class names.

    The rule (README, "String class labels"): the names are ``classes`` when given, in
    probability-column order; otherwise, only when every one of the ``k`` classes appears
    among the labels, the sorted distinct labels. A label that is not a class name is a
    one-line error naming its row. Integer labels are class indices, as before, and are
    returned unchanged (with ``classes`` recorded when given).
    """
    names = check_classes(classes, k) if classes is not None else None
    if not is_text_labels(labels):
        return labels, names
    arr = np.asarray(labels, dtype=object)
    if arr.ndim != 1:
        raise InvalidInput(f"labels must be a 1-D array, got shape {arr.shape}")
    bad_type = [i for i, v in enumerate(arr) if not isinstance(v, str)]
    if bad_type:
        i = bad_type[0]
        raise InvalidInput(f"labels: row {i} is {arr[i]!r}, not a class name (labels mix "
                           "names and other values)")
    if names is None:
        seen = sorted(set(arr.tolist()))
        if len(seen) != k:
            raise InvalidInput(
                f"labels are class names but {len(seen)} distinct names appear for {k} "
                "probability columns: give the class names in column order (classes=[...], "
                "--classes a,b,c)")
        names = seen
    index = {c: j for j, c in enumerate(names)}
    out = np.empty(arr.shape[0], dtype=np.int64)
    for i, v in enumerate(arr):
        j = index.get(v)
        if j is None:
            shown = ", ".join(names[:10]) + (", …" if len(names) > 10 else "")
            raise InvalidInput(f"labels: row {i} is {v!r}, not one of the classes ({shown})")
        out[i] = j
    return out, names


def prepare(
    method: str | Calibrator,
    params: dict[str, Any],
    *,
    scores: Any = None,
    probs: Any = None,
    labels: Any = None,
    score: str | None = None,
    score_options: dict[str, Any] | None = None,
    agents: Any = None,
    subjects: Any = None,
    classes: Any = None,
    rng: random.Random | None = None,
) -> Prepared:
    """Validate everything about one calibration request, touching no ledger.

    Scores come either precomputed (``scores``) or from ``probs`` + ``labels``
    with a score function named by ``score`` (SPEC §1). ``ldp-label`` takes the
    probabilities and the users' noisy labels directly. Local-DP methods need a
    subject id per row (``subjects``; default: the row number); federated ones
    an agent id per score (``agents``), and their agents are the subjects.

    Labels may be class names (strings): see :func:`encode_labels` for how they map to
    probability columns; the names are recorded in the release (``diagnostics["classes"]``).
    """
    if isinstance(method, str):
        reg = registry.get(method)
    elif isinstance(method, Calibrator):
        reg = registry.Registered(method, type(method).__module__.split(".")[0], "unknown")
    else:
        raise InvalidInput(f"method must be a calibrator name, got {method!r:.60}")
    if not isinstance(params, dict):
        raise InvalidInput(f"params must be a dict, got {type(params).__name__}")
    if score is not None and not isinstance(score, str):
        raise InvalidInput(f"score must be a score name, got {score!r:.60}")
    if score_options is not None and not isinstance(score_options, dict):
        raise InvalidInput("score_options must be a dict of option names to values")
    cal = reg.calibrator
    if score is not None and "score" in cal.Params.model_fields:
        # a method whose parameters name the score (ldp-label) takes ``score=`` in every form
        if params.get("score", score) != score:
            raise InvalidInput(
                f"{cal.name}: score given twice ({params['score']!r} and {score!r})"
            )
        params = {**params, "score": score}
        score = None
    p = validate_params(cal, params)
    needs = set(cal.inputs)
    score_record: dict[str, Any] | None = None
    names: list[str] | None = None
    if classes is not None or is_text_labels(labels):
        if probs is None or labels is None:
            raise InvalidInput("class names label probability columns: give --probs and --labels")
        pshape = np.shape(probs)
        if len(pshape) != 2:
            raise InvalidInput(f"probs must be a 2-D array (n×k), got shape {pshape}")
        labels, names = encode_labels(labels, classes, int(pshape[1]))

    if "probs" in needs:
        if probs is None or labels is None:
            raise InvalidInput(
                f"{cal.name} needs --probs and --labels (n×k probabilities, n labels)"
            )
        if scores is not None:
            raise InvalidInput(f"{cal.name} works on probabilities, not precomputed --scores")
        pr = check_probs(probs)
        y = check_labels(labels, pr.shape[1])
        check_lengths(probs=pr, labels=y)
        data_scores = None
        k: int | None = pr.shape[1]
    else:
        pr, y = None, None
        k = None
        if scores is not None:
            if probs is not None or labels is not None:
                raise InvalidInput("give either --scores, or --probs with --labels, not both")
            data_scores = check_scores(scores)
        elif probs is not None and labels is not None:
            if score is None:
                raise InvalidInput("with --probs and --labels, name a score: --score lac|aps|raps")
            if score not in SCORES:
                raise InvalidInput(f"unknown score {score!r} (known: {', '.join(SCORES)})")
            opts = dict(score_options or {})
            data_scores = check_scores(label_scores(score, probs, labels, rng=rng, **opts))
            score_record = {"name": score, "options": {**SCORES[score].options, **opts}}
            if SCORES[score].kind == "classification":
                k = int(np.asarray(probs).shape[1])
        else:
            raise InvalidInput(f"{cal.name} needs --scores, or --probs with --labels and --score")
    n = int(data_scores.shape[0]) if data_scores is not None else int(y.shape[0])  # type: ignore[union-attr]

    agent_ids = None
    sizes: tuple[int, ...] | None = None
    if "agents" in needs:
        if agents is None:
            raise InvalidInput(f"{cal.name} needs the agent of every score (--agent-of FILE)")
        agent_ids = _ids(agents, "agent ids", n)
        sizes = group_sizes(agent_ids)
    elif agents is not None:
        raise InvalidInput(f"{cal.name} is not federated; it takes no agent ids")

    subject_ids = None
    if cal.privacy_model == "local":
        subject_ids = (
            _ids(subjects, "subject ids", n)
            if subjects is not None
            else np.array([str(i) for i in range(n)], dtype=object)
        )
    elif cal.privacy_model == "federated" and agent_ids is not None:
        subject_ids = agent_ids
    elif subjects is not None:
        raise InvalidInput(f"{cal.name} is not a local-DP method; it takes no subject ids")

    if getattr(p, "k", None) is not None and k is not None and p.k != k:  # type: ignore[attr-defined]
        raise InvalidInput(f"{cal.name}: k={p.k} but the probabilities have {k} columns")  # type: ignore[attr-defined]
    if score_record is None and getattr(p, "score", None) is not None:
        score_record = {"name": p.score, "options": dict(SCORES[p.score].options)}  # type: ignore[attr-defined]

    data = CalibrationInput(
        scores=data_scores,
        probs=pr,
        labels=y,
        agents=agent_ids,
        subjects=subject_ids,
        score_name=score_record["name"] if score_record else None,
    )
    shape = DataShape(n=n, k=k, group_sizes=sizes)
    return Prepared(reg, p, data, shape, score_record, names)


class Evaluation(BaseModel):
    """Held-out metrics of a released threshold (P-COQS paper, Definition 3)."""

    model_config = ConfigDict(frozen=True)

    n: int
    coverage: float
    mean_set_size: float
    singleton_fraction: float
    empty_fraction: float
    guaranteed_lower: float
    meets_guarantee: bool
    coverage_upper_95: float
    consistent_with_guarantee: bool
    note: str


def sets_for(
    score: dict[str, Any] | None,
    threshold: float,
    probs: Any,
    *,
    rng: random.Random | None = None,
    score_name: str | None = None,
) -> np.ndarray:
    """Prediction sets (boolean n×k) for a released threshold and the score it was calibrated on."""
    name = score_name or (score or {}).get("name")
    if name is None:
        raise InvalidInput(
            "this release was calibrated on precomputed scores; say which score they were (--score)"
        )
    options = dict((score or {}).get("options", {})) if (score or {}).get("name") == name else {}
    return prediction_sets(name, probs, threshold, rng=rng, **options)


def evaluate_sets(
    sets: np.ndarray, labels: Any, lower: float, *, classes: list[str] | None = None
) -> Evaluation:
    """Empirical coverage, mean set size and singleton fraction, against the guaranteed ``lower``.

    ``consistent_with_guarantee`` asks whether the test sample could come from a
    coverage ≥ lower: the one-sided 95% Clopper–Pearson upper bound of the
    empirical coverage is at least ``lower``. Class-name labels need the release's
    ``classes``.
    """
    if is_text_labels(labels):
        if not classes:
            raise InvalidInput("these labels are class names, but the release records none; "
                               "give integer labels (probability-column indices)")
        labels, _ = encode_labels(labels, classes, sets.shape[1])
    y = check_labels(labels, sets.shape[1], min_rows=1)
    check_lengths(sets=sets, labels=y)
    hits = sets[np.arange(y.shape[0]), y]
    n = int(y.shape[0])
    covered = int(hits.sum())
    sizes = sets.sum(axis=1)
    upper = 1.0 if covered == n else float(beta_dist.ppf(0.95, covered + 1, n - covered))
    cov = covered / n
    return Evaluation(
        n=n,
        coverage=cov,
        mean_set_size=float(sizes.mean()),
        singleton_fraction=float((sizes == 1).mean()),
        empty_fraction=float((sizes == 0).mean()),
        guaranteed_lower=lower,
        meets_guarantee=cov >= lower,
        coverage_upper_95=upper,
        consistent_with_guarantee=upper >= lower or math.isclose(upper, lower),
        note=(
            "empirical coverage on a finite test set fluctuates around the true coverage; "
            "'consistent' means the 95% upper confidence bound reaches the guaranteed level"
        ),
    )


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
        score_options=score_options, agents=agents, subjects=subjects, classes=classes, rng=rng,
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
        } or None,
        classes=prep.shape.k,
    )


def _rows_of(a: Any, what: str, *, ndim: int | None = None) -> int:
    """The number of rows of an input, from its shape only (nothing is read)."""
    shape = np.shape(a)
    if len(shape) == 0:
        raise InvalidInput(f"{what} is a single value, not an array of rows")
    if ndim is not None and len(shape) != ndim:
        raise InvalidInput(f"{what} must be a {ndim}-D array, got shape {shape}")
    if shape[0] == 0:
        raise InvalidInput(f"{what} has no rows")
    return int(shape[0])


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
    shuffled: bool = False,
    assume_unlinkable_features: bool = False,
    **_ignored: Any,
) -> Any:
    """The cost of a calibration and what would remain, from the data's *shape* only.

    Only the number of rows (and classes, and agents) is read, never a value.
    """
    reg = registry.get(method) if isinstance(method, str) else None
    cal = reg.calibrator if reg else method  # type: ignore[union-attr]
    if not isinstance(cal, Calibrator):
        raise InvalidInput(f"method must be a calibrator name, got {method!r:.60}")
    from privcal.accountant.amplification import check_shuffle_method, check_shuffled_dataset

    p = validate_params(cal, params)  # type: ignore[arg-type]
    ds = accountant.dataset(dataset)
    rows = {}
    for what, a, ndim in (("scores", scores, 1), ("labels", labels, 1), ("probs", probs, 2)):
        if a is not None:
            rows[what] = _rows_of(a, what, ndim=ndim)
    if not rows:
        raise InvalidInput(
            "a dry run needs the input file to know n (--scores or --probs/--labels)"
        )
    if len(set(rows.values())) > 1:
        raise InvalidInput(f"inputs differ in length: {rows}")
    n = next(iter(rows.values()))
    k = int(np.shape(probs)[1]) if probs is not None else None
    if classes is not None:
        check_classes(classes, k)  # names are public; the labels themselves are not read
    sizes = None
    if agents is not None:
        sizes = group_sizes(_ids(agents, "agent ids", n))
    if subjects is not None:
        if cal.privacy_model != "local":
            raise InvalidInput(f"{cal.name} is not a local-DP method; it takes no subject ids")
        _ids(subjects, "subject ids", n)  # the ids are checked; no data value is read
    if not isinstance(shuffled, bool) or not isinstance(assume_unlinkable_features, bool):
        raise InvalidInput("shuffled and assume_unlinkable_features must be True or False")
    if shuffled:
        check_shuffle_method(cal.name, assume_unlinkable_features=assume_unlinkable_features)
        check_shuffled_dataset(ds)
    elif assume_unlinkable_features:
        raise InvalidInput("--assume-unlinkable-features only matters with --shuffled")
    try:
        shape = DataShape(n=n, k=k, group_sizes=sizes)
    except ValidationError as exc:
        raise InvalidInput(f"unusable input shape: {exc.errors()[0].get('msg')}") from None
    return accountant.dry_run(cal, p, shape, dataset)


def release_sets(
    release: Any, probs: Any, *, score_name: str | None = None, rng: random.Random | None = None
) -> np.ndarray:
    """Prediction sets of a stored release for new probabilities (boolean n×k).

    A release calibrated on probabilities records their number of classes k; probabilities
    with another number of columns are refused (the threshold means nothing for them).
    """
    score = (release.diagnostics or {}).get("score")
    shape = release.shape if isinstance(release.shape, dict) else {}
    k = shape.get("k")
    got = np.shape(probs)
    if k is not None and len(got) == 2 and got[1] != k:
        raise InvalidInput(f"release {release.id} was calibrated on {k} classes; these "
                           f"probabilities have {got[1]} columns")
    return sets_for(score, release.threshold, probs, rng=rng, score_name=score_name)


def release_classes(release: Any) -> list[str] | None:
    """The class names a release records (probability-column order), or None."""
    names = (release.diagnostics or {}).get("classes")
    return list(names) if isinstance(names, list) else None


def set_labels(sets: np.ndarray, classes: list[str] | None) -> list[list[Any]]:
    """Each prediction set as a list: of class names when known, else of column indices."""
    if classes is None:
        return [np.flatnonzero(r).tolist() for r in sets]
    return [[classes[j] for j in np.flatnonzero(r)] for r in sets]
