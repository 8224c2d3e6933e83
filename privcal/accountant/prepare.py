"""Step one of a calibration (DESIGN.md, "The flow of one calibration"): prepare.

From a :class:`~privcal.accountant.calibration_request.CalibrationRequest` (a method name,
parameters and arrays) to a calibrator, validated parameters and a
:class:`~privcal.calibrators.base.CalibrationInput` with its public
:class:`~privcal.calibrators.base.DataShape` — before anything is charged. Parameters
are validated, data are checked and turned into scores, and the public shape of the
data is derived. Errors here are :class:`~privcal.errors.InvalidInput` one-liners, and
nothing is written. :mod:`privcal.accountant.calibration` then charges and runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from privcal.accountant.calibration_request import (
    CalibrationRequest,
    label_score_options,
    method_score_options,
    precomputed_score,
)
from privcal.accountant.regression_request import is_regression, regression_request_scores
from privcal.calibrators import registry
from privcal.calibrators.base import (
    CalibrationInput,
    Calibrator,
    CalibratorParams,
    DataShape,
)
from privcal.calibrators.class_labels import (
    check_classes,
    column_classes,
    encode_labels,
    is_text_labels,
)
from privcal.calibrators.group_sets import frame_names
from privcal.calibrators.score_range import range_record, resolve_score_range
from privcal.calibrators.scores import SCORES, label_scores
from privcal.calibrators.validation import (
    array_shape,
    check_labels,
    check_lengths,
    check_probs,
    check_scores,
    group_sizes,
    id_strings,
    table_array,
)
from privcal.calibrators.wrapped import validation_message
from privcal.errors import InvalidInput, first_error

__all__ = ["Prepared", "check_score_request", "prepare", "prepare_shape", "validate_params"]


@dataclass(frozen=True)
class Prepared:
    """Everything needed to charge and run one calibration."""

    registered: registry.Registered
    params: CalibratorParams
    data: CalibrationInput
    shape: DataShape
    score: dict[str, Any] | None
    classes: list[str] | None = None
    #: the public score range the method was told, and its source (methods with a range only)
    score_range: dict[str, Any] | None = None
    #: the probability columns' own names when they are not the classes (red team 16), and
    #: whether the labels were read as class names (integer labels then too, at evaluate)
    columns: list[str] | None = None
    label_names: bool = False

    @property
    def calibrator(self) -> Calibrator:
        return self.registered.calibrator


def validate_params(calibrator: Calibrator, values: dict[str, Any]) -> CalibratorParams:
    """The calibrator's parameter model, or a one-line error naming the bad parameter."""
    try:
        return calibrator.Params.model_validate(values)
    except ValidationError as exc:
        # an unknown parameter first: `epsilon=` given to pcoqs said "invalid rho: Field
        # required" (red team 14)
        raise InvalidInput(validation_message(exc, calibrator.name)) from None


def _ids(a: Any, what: str, n: int) -> np.ndarray:
    """``n`` ids as strings (:func:`~privcal.calibrators.validation.id_strings`: the CLI, the
    API and sessions key one person the same way; floats, None and empty ids refused)."""
    out = id_strings(a, what, people=True)
    if out.shape[0] != n:
        raise InvalidInput(f"{what} must be a 1-D array of {n} ids, got {out.shape[0]}")
    return out.astype(object)


def prepare(
    request: CalibrationRequest | str | Calibrator,
    params: dict[str, Any] | None = None,
    *,
    rng: random.Random | None = None,
    **inputs: Any,
) -> Prepared:
    """Validate everything about one calibration request, touching no ledger.

    ``request`` is a :class:`~privcal.accountant.calibration_request.CalibrationRequest`, or
    the method with ``params`` and the inputs as keywords (its fields).

    Scores come either precomputed (``scores``) or from ``probs`` + ``labels``
    with a score function named by ``score`` (SPEC §1). ``ldp-label`` takes the
    probabilities and the users' noisy labels directly. Local-DP methods need a
    subject id per row (``subjects``: each subject is charged against the dataset's
    per-subject cap by its id, across runs); federated ones an agent id per score
    (``agents``), and their agents are the subjects.

    Labels may be class names (strings): see :func:`encode_labels` for how they map to
    probability columns; the names are recorded in the release (``diagnostics["classes"]``).
    A private method takes them from ``classes`` only, never from the labels
    (:func:`_no_classes`). A pandas DataFrame of probabilities whose columns are named
    has its names read as the classes (:func:`~privcal.calibrators.class_labels.
    column_classes`: ``classes`` must name the same columns; number labels are matched to
    number names), as :func:`~privcal.calibrators.group_sets.align_columns` reads them at
    predict time.

    Regression: ``targets`` with ``preds`` (``score="absolute"``) or ``lower_preds`` and
    ``upper_preds`` (``score="cqr"``); the scores are computed here
    (:func:`~privcal.calibrators.scores.regression_scores`). ``score_range=(lo, hi)`` is the
    public score range of a method that takes one (:mod:`privcal.calibrators.score_range`);
    the range used and its source are recorded (``diagnostics["score_range"]``).

    Several levels (``alpha`` a list) and Mondrian groups (``mondrian``, ``groups``,
    ``public_groups``) wrap the method: :mod:`privcal.accountant.wrapping`.
    """
    from privcal.accountant import wrapping as wr

    req = CalibrationRequest.of(request, params, **inputs)
    scores, probs, labels, score = req.scores, req.probs, req.labels, req.score
    how, params = wr.wrapping(req.params, mondrian=req.mondrian, groups=req.groups,
                              public_groups=req.public_groups)
    if isinstance(req.method, str):
        reg = registry.get(req.method)
    else:
        reg = registry.provenance(req.method)
    cal = reg.calibrator
    if score is not None and "score" in cal.Params.model_fields:
        # a method whose parameters name the score (ldp-label) takes ``score=`` in every form
        if params.get("score", score) != score:
            raise InvalidInput(
                f"{cal.name}: score given twice ({params['score']!r} and {score!r})"
            )
        params = {**params, "score": score}
        score = None
    if "score" in cal.Params.model_fields:
        params = method_score_options(cal, params, req.score_options)
    params, range_source = resolve_score_range(cal.name, cal.Params, params, req.score_range)
    p = validate_params(cal, params)
    needs = set(cal.inputs)
    score_record: dict[str, Any] | None = None
    names: list[str] | None = None
    classes = req.classes
    columns = req.column_names
    if columns is not None and probs is None:
        raise InvalidInput("column_names names the probability columns: give probs")
    if (framed := frame_names(probs)) is not None:
        # a DataFrame's column names are the classes, as at predict time (align_columns)
        if columns is not None and list(columns) != framed:
            raise InvalidInput("column_names: the table's own column names are "
                               f"{', '.join(framed[:6])}: give one or the other")
        columns = framed
        classes, labels = column_classes(columns, classes, labels)
        probs = np.asarray(table_array(probs))
    label_names = is_text_labels(labels)  # names (integer labels then too, at evaluate)
    if classes is not None or label_names:
        if probs is None or labels is None:
            raise InvalidInput("class names label probability columns: give --probs and --labels")
        pshape = array_shape(probs)
        if len(pshape) != 2:
            raise InvalidInput(f"probs must be a 2-D array (n×k), got shape {pshape}")
        if classes is None and _charges(cal, p, labels, int(pshape[1])):
            raise _no_classes(cal.name)
        labels, names = encode_labels(labels, classes, int(pshape[1]))

    regression = is_regression(req)
    if regression:
        scores = regression_request_scores(cal, req, scores=scores, probs=probs, labels=labels)
        score_record = {"name": score, "options": {}}
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
            score_record = precomputed_score(score, req.score_options, scores, not regression)
            data_scores = check_scores(scores)
        elif probs is not None and labels is not None:
            opts = label_score_options(score, req.score_options, array_shape(probs))
            data_scores = check_scores(label_scores(score, probs, labels, rng=rng, **opts))
            score_record = {"name": score, "options": {**SCORES[score].options, **opts}}
            if SCORES[score].kind == "classification":
                k = int(np.asarray(probs).shape[1])
        else:
            raise InvalidInput(f"{cal.name} needs --scores, or --probs with --labels and --score")
    n = int(data_scores.shape[0]) if data_scores is not None else int(y.shape[0])  # type: ignore[union-attr]

    agent_ids = None
    sizes: tuple[int, ...] | None = None
    agents, subjects = req.agents, req.subjects
    if "agents" in needs:
        if agents is None:
            raise InvalidInput(f"{cal.name} needs the agent of every score (--agent-of FILE)")
        agent_ids = _ids(agents, "agent ids", n)
        sizes = group_sizes(agent_ids)
    elif agents is not None:
        raise InvalidInput(f"{cal.name} is not federated; it takes no agent ids")

    subject_ids = None
    if cal.privacy_model == "local":
        if subjects is None:
            raise _no_subjects(cal.name)
        subject_ids = _ids(subjects, "subject ids", n)
    elif cal.privacy_model == "federated" and agent_ids is not None:
        subject_ids = agent_ids
    elif subjects is not None:
        raise InvalidInput(f"{cal.name} is not a local-DP method; it takes no subject ids")

    if getattr(p, "k", None) is not None and k is not None and p.k != k:  # type: ignore[attr-defined]
        raise InvalidInput(f"{cal.name}: k={p.k} but the probabilities have {k} columns")  # type: ignore[attr-defined]
    if score_record is None and getattr(p, "score", None) is not None:
        # the options the method computes its scores with: its own (if it takes them), or
        # the score's defaults (other options were refused by method_score_options)
        given = getattr(p, "score_options", None) or {}
        score_record = {"name": p.score, "options": {**SCORES[p.score].options, **given}}  # type: ignore[attr-defined]

    ranged = range_record(p, range_source) if range_source is not None else None
    data = CalibrationInput(
        scores=data_scores,
        probs=pr,
        labels=y,
        agents=agent_ids,
        subjects=subject_ids,
        score_name=score_record["name"] if score_record else None,
    )
    shape = DataShape(n=n, k=k, group_sizes=sizes)
    if how is not None and how.wanted:
        cal_w, p, group_names, index = wr.wrap(cal, p, how, n=n, k=k, labels=labels,
                                               classes=names)
        reg = registry.Registered(cal_w, reg.distribution, reg.distribution_version)
        data = wr.with_groups(data, index, group_names)
        if index is not None:
            shape = DataShape(n=n, k=k, group_sizes=tuple(
                int(c) for c in np.bincount(index, minlength=len(group_names or ()))))
    if columns is not None:  # names to match a later table by (not the classes: recorded)
        columns = check_classes(columns, np.shape(probs)[1], "column_names")
    return Prepared(reg, p, data, shape, score_record, names, ranged,
                    columns if names is None else None, bool(label_names and names))


def check_score_request(cal: Calibrator, req: CalibrationRequest, k: int | None) -> None:
    """What the run checks of a label score before any label is read (for a dry run): the
    score and its options, when the request computes scores from ``probs`` and ``labels``."""
    regression = is_regression(req)
    if regression:  # the run's checks on zeros of the inputs' shapes (red team 25, service F3)
        regression_request_scores(cal, req, scores=req.scores, probs=req.probs,
                                  labels=req.labels, blank=True)
        return
    if req.scores is not None and "probs" not in cal.inputs and not regression:
        precomputed_score(req.score, req.score_options, req.scores)  # as the run checks
        return
    if "score" in cal.Params.model_fields:
        method_score_options(cal, {**req.params, **({"score": req.score} if req.score else {})},
                              req.score_options)
        return
    if ("probs" in cal.inputs or regression or req.scores is not None or req.probs is None
            or req.labels is None):
        return
    label_score_options(req.score, req.score_options, (0, k) if k is not None else ())


def _charges(cal: Calibrator, params: CalibratorParams, labels: Any, k: int) -> bool:
    """Whether ``cal`` is private (charges a cost): its class names may not come from the
    labels. When the cost cannot be told from a placeholder shape, it is taken as private."""
    if cal.privacy_model == "none":
        return False
    try:
        return cal.cost(params, DataShape(n=max(1, len(labels)), k=k)) is not None
    except Exception:  # cannot tell: the stricter rule
        return True


def _no_classes(method: str) -> InvalidInput:
    """The error of class-name labels without the class names, for a private method. The
    names are not taken from the labels: a release would carry a label value only one record
    has, and a class that no record has would be refused, uncharged — both depend on one
    record."""
    return InvalidInput(
        f"{method} is private: its class names are never read from the labels; give them in "
        "probability-column order (classes=[...] in Python and the API, --classes a,b,c or a "
        "--probs table whose header names the columns on the CLI)")


def _no_subjects(method: str) -> InvalidInput:
    """The error of a local-DP request without subject ids. There is no default: the
    per-subject cap follows a person across runs by their id, and a row number names a
    different person in every run (row 5 today, row 4 000 tomorrow), which would let one
    person spend past the cap with every key within it."""
    return InvalidInput(
        f"{method} is local DP: give the subject id of every row (--subjects FILE; "
        "subjects= in Python): each subject is charged against the per-subject cap by its "
        "id, across runs")


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


def prepare_shape(cal: Calibrator, req: CalibrationRequest) -> DataShape:
    """The public shape of a request from its inputs' *shapes* only (for a dry run): the
    number of rows (classes, agents), never a data value; ids and class names are checked
    (they are public). A local-DP run's n is its distinct subjects, as the run keeps one row
    each (review of red team 19); those past their cap, which only the run knows, count."""
    probs, agents, subjects = req.probs, req.agents, req.subjects
    rows = {}
    for what, ndim in (("scores", 1), ("labels", 1), ("probs", 2), ("preds", None),
                       ("lower_preds", 1), ("upper_preds", 1), ("targets", 1)):
        if (a := getattr(req, what)) is not None:
            rows[what] = _rows_of(a, what, ndim=ndim)
    if not rows:
        raise InvalidInput(
            "a dry run needs the input file to know n (--scores, --probs/--labels or "
            "--preds/--targets)"
        )
    if len(set(rows.values())) > 1:
        raise InvalidInput(f"inputs differ in length: {rows}")
    n = next(iter(rows.values()))
    k = int(np.shape(probs)[1]) if probs is not None else None
    if (columns := frame_names(probs)) is not None:
        column_classes(columns, req.classes, None)  # a frame's names against the classes
    if req.classes is not None:
        check_classes(req.classes, k)  # names are public; the labels themselves are not read
    sizes = None
    if agents is not None:
        sizes = group_sizes(_ids(agents, "agent ids", n))
    if subjects is not None:
        if cal.privacy_model != "local":
            raise InvalidInput(f"{cal.name} is not a local-DP method; it takes no subject ids")
        n = int(np.unique(_ids(subjects, "subject ids", n)).shape[0])  # one row each
    elif cal.privacy_model == "local":
        raise _no_subjects(cal.name)
    try:
        return DataShape(n=n, k=k, group_sizes=sizes)
    except ValidationError as exc:
        raise InvalidInput(f"unusable input shape: {first_error(exc).message}") from None
