"""The calibration run's inputs, checked before anything is charged (step 1 of
:func:`privcal.accountant.calibration_run.run`): the parameters (:func:`params_of`), the data
(:func:`check_data`), its public shape (:func:`shape_of`), and the rows kept once refused
subjects are known (:func:`rows_of`). A bad input is a one-line
:class:`~privcal.errors.InvalidInput`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from pydantic import ValidationError

from privcal.calibrators.base import CalibrationInput, Calibrator, DataShape
from privcal.calibrators.validation import check_scores, group_sizes, id_strings
from privcal.errors import InvalidInput

__all__ = ["check_data", "params_of", "rows_of", "shape_of"]


def rows_of(data: CalibrationInput, mask: np.ndarray) -> CalibrationInput:
    """The calibration input restricted to the rows in ``mask``."""
    return dataclasses.replace(data, **{
        f: np.asarray(getattr(data, f))[mask]
        for f in ("scores", "probs", "labels", "agents", "subjects", "groups")
        if getattr(data, f) is not None
    })


def shape_of(data: CalibrationInput, n: int | None = None, k: int | None = None) -> DataShape:
    """The public shape of the data (n, k, group sizes): what costs and guarantees may use."""
    if data.probs is not None and np.ndim(data.probs) == 2:
        k = int(np.shape(data.probs)[1])
    groups = group_sizes(data.agents) if data.agents is not None else None
    if data.groups is not None:  # Mondrian groups (ints in [0, group_count)), in order
        groups = _mondrian_sizes(data)
    try:
        return DataShape(n=data.n if n is None else n, k=k, group_sizes=groups)
    except (ValidationError, ValueError) as exc:
        raise InvalidInput(f"unusable calibration data: {exc}") from exc


def _mondrian_sizes(data: CalibrationInput) -> tuple[int, ...]:
    """Each Mondrian group's row count, or a one-line InvalidInput for a group column that is
    not one integer index in [0, ``group_count``) per row (a hand-built input; refused before
    anything is charged)."""
    g, count = np.asarray(data.groups), data.group_count
    if count is not None and (isinstance(count, bool) or not isinstance(count, int | np.integer)
                              or count < 1):
        raise InvalidInput(f"group_count must be an integer ≥ 1, got {count!r}")
    if g.ndim != 1 or g.dtype.kind not in "iu":
        raise InvalidInput("groups must be a 1-D array of integer group indices")
    if g.shape[0] != data.n:
        raise InvalidInput(f"groups has {g.shape[0]} rows, the calibration data {data.n}")
    if g.size and (int(g.min()) < 0 or (count is not None and int(g.max()) >= count)):
        raise InvalidInput("group indices must lie in [0, "
                           + (f"{int(count)})" if count is not None else "∞)"))
    return tuple(int(c) for c in np.bincount(g.astype(np.int64), minlength=int(count or 0)))


def params_of(calibrator: Calibrator, params: Any) -> Any:
    """The calibrator's parameters validated (a one-line InvalidInput naming the first bad one);
    an instance is validated again (``model_construct`` builds one that skipped it)."""
    if isinstance(params, calibrator.Params):
        params = params.model_dump(mode="python")
    if isinstance(params, dict):
        try:
            return calibrator.Params.model_validate(params)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            what = f"parameter {where}" if where else "parameters"
            raise InvalidInput(f"invalid {calibrator.name} {what}: {first.get('msg')}") from exc
    raise InvalidInput(f"params must be a {calibrator.Params.__name__} or a dict")


def check_data(calibrator: Calibrator, data: CalibrationInput) -> None:
    """Generic checks before anything is charged (calibrators check the rest themselves;
    the scores of a method that declares ``min_scores`` as its ``calibrate`` will)."""
    for field in calibrator.inputs:
        arr = getattr(data, field, None)
        if arr is None:
            raise InvalidInput(f"{calibrator.name} needs {field!r} data")
        arr = np.asarray(arr)
        if arr.shape[0] == 0:
            raise InvalidInput(f"{field} is empty")
        if arr.dtype.kind == "f" and np.isnan(arr).any():
            raise InvalidInput(f"{field} contains NaN")
    rows = getattr(calibrator, "min_scores", None)
    if rows is not None and "scores" in calibrator.inputs:
        check_scores(data.scores, min_rows=rows)  # what its calibrate refuses: not after the charge
    lengths = {f: int(np.asarray(getattr(data, f)).shape[0])
               for f in ("scores", "probs", "labels", "agents", "subjects")
               if getattr(data, f) is not None}
    if len(set(lengths.values())) > 1:
        raise InvalidInput(f"calibration arrays differ in length: {lengths}")
    if (calibrator.privacy_model == "federated" and data.subjects is not None
            and (data.agents is None
                 or not np.array_equal(id_strings(data.subjects, "subject ids"),
                                       id_strings(data.agents, "agent ids")))):
        # one message per agent is released, and each agent is charged once for it: other
        # subjects would charge one ε0 for several messages (one person behind five agents,
        # charged once for five releases of ε0)
        raise InvalidInput(f"{calibrator.name} is federated: its subjects are its agents "
                           "(each agent is charged once for its message); give no subject "
                           "ids, or the agent ids")
