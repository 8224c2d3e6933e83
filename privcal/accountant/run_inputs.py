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

from privcal.calibrators.base import CalibrationInput, Calibrator, DataShape, check_inputs
from privcal.calibrators.validation import group_sizes, id_strings
from privcal.errors import InvalidInput, first_error

__all__ = ["check_data", "params_of", "rows_of", "shape_of", "snapshot"]

#: the fields holding one value per row; ``agents`` and ``subjects`` are ids
_ROWS = ("scores", "probs", "labels", "agents", "subjects", "groups")


def snapshot(data: CalibrationInput) -> CalibrationInput:
    """``data`` with every array replaced by a read-only copy of its own, taken once, before
    the run's first check: the checks, the shape, the cost, the charge and ``calibrate`` all
    read this copy, never the caller's objects again (red team 26, api F1: a list another
    thread extended after the charge was calibrated on — 4 400 rows, 4 000 of their subjects
    never charged — under a release recorded for n = 400; a NaN written into the caller's
    array after the checks made ``calibrate`` refuse after every subject was charged; an
    ``__array__`` answered differently each time). Each copy is a plain ``ndarray`` (a
    subclass's own ``copy`` or ``__getitem__`` is never asked); a masked array is refused
    if any entry is masked (:func:`~privcal.calibrators.validation.unmasked`, red team 11),
    else its data are copied; a Python sequence of ids is read item by item, as
    :func:`~privcal.calibrators.validation.id_strings` reads it; a sequence that is no
    array (ragged) is a one-line InvalidInput, as :func:`check_data` has it. Two pandas inputs
    indexed differently are refused (:func:`~privcal.accountant.row_inputs.same_index`)."""
    from privcal.accountant.row_inputs import same_index
    from privcal.calibrators.validation import table_array, unmasked

    same_index({f: getattr(data, f) for f in _ROWS})  # by position (red team 26, api F9)
    fields: dict[str, Any] = {}
    for f in _ROWS:
        a = getattr(data, f)
        if a is None:
            continue
        a = unmasked(a, f)
        try:
            if f in ("agents", "subjects") and not isinstance(a, np.ndarray):
                a = np.array(a, dtype=object)
            else:
                a = np.array(table_array(a), copy=True, subok=False)
        except (ValueError, TypeError) as exc:  # a ragged list
            raise InvalidInput(f"{f} is not an array: {str(exc).splitlines()[0]}") from None
        a.flags.writeable = False
        fields[f] = a
    count = data.group_count
    if isinstance(count, int | np.integer) and not isinstance(count, bool):
        fields["group_count"] = int(count)
    return dataclasses.replace(data, **fields)


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
    except ValidationError as exc:  # one line: the first error (k = 1 column, n = 0, …)
        where, msg, _ = first_error(exc)
        raise InvalidInput(f"unusable calibration data: {where} {msg}") from None
    except ValueError as exc:
        raise InvalidInput(f"unusable calibration data: {exc}") from exc


def _mondrian_sizes(data: CalibrationInput) -> tuple[int, ...]:
    """Each Mondrian group's row count, or a one-line InvalidInput for a group column that is
    not one integer index in [0, ``group_count``) per row (a hand-built input; refused before
    anything is charged)."""
    g, count = np.asarray(data.groups), data.group_count
    # the count is required: Mondrian's calibrate refuses groups without it, after the charge
    # (red team 7: the sizes read off the indices had the number of groups the cost needs)
    if count is None:
        raise InvalidInput("groups need group_count, the number of groups (indices in "
                           "[0, group_count))")
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
        raise InvalidInput(f"group_count must be an integer ≥ 1, got {count!r}")
    if g.ndim != 1 or g.dtype.kind not in "iu":
        raise InvalidInput("groups must be a 1-D array of integer group indices")
    if g.shape[0] != data.n:
        raise InvalidInput(f"groups has {g.shape[0]} rows, the calibration data {data.n}")
    if g.size and (int(g.min()) < 0 or int(g.max()) >= count):
        raise InvalidInput(f"group indices must lie in [0, {int(count)})")
    return tuple(int(c) for c in np.bincount(g.astype(np.int64), minlength=int(count)))


def params_of(calibrator: Calibrator, params: Any) -> Any:
    """The calibrator's parameters validated (a one-line InvalidInput naming the first bad one);
    an instance is validated again (``model_construct`` builds one that skipped it)."""
    if isinstance(params, calibrator.Params):
        params = params.model_dump(mode="python")
    if isinstance(params, dict):
        try:
            return calibrator.Params.model_validate(params)
        except ValidationError as exc:
            where, msg, _ = first_error(exc)
            what = f"parameter {where}" if where else "parameters"
            raise InvalidInput(f"invalid {calibrator.name} {what}: {msg}") from exc
    raise InvalidInput(f"params must be a {calibrator.Params.__name__} or a dict")


def check_data(calibrator: Calibrator, data: CalibrationInput, params: Any) -> None:
    """Every check of the data before anything is charged: generic ones (each input an array
    of rows, of one length; no NaN; a group column for a Mondrian method only), then what
    the calibrator's ``calibrate`` would refuse (:func:`~privcal.calibrators.base.
    check_inputs`, with the validated ``params``): a refusal after the charge would spend
    every subject's ε0 on no release (red team 7)."""
    rows: dict[str, int] = {}
    for field in ("scores", "probs", "labels", "agents", "subjects"):
        if getattr(data, field) is None:
            if field in calibrator.inputs:
                raise InvalidInput(f"{calibrator.name} needs {field!r} data")
            continue
        try:
            arr = np.asarray(getattr(data, field))
        except (ValueError, TypeError) as exc:  # a ragged list
            raise InvalidInput(f"{field} is not an array: {str(exc).splitlines()[0]}") from None
        if arr.ndim == 0:
            raise InvalidInput(f"{field} is a single value, not an array of rows")
        if arr.shape[0] == 0:
            raise InvalidInput(f"{field} is empty")
        if field in calibrator.inputs and arr.dtype.kind == "f" and np.isnan(arr).any():
            raise InvalidInput(f"{field} contains NaN")
        rows[field] = int(arr.shape[0])
    if len(set(rows.values())) > 1:
        raise InvalidInput(f"calibration arrays differ in length: {rows}")
    from privcal.calibrators.mondrian import Mondrian  # here: `privcal --help` loads none

    if (data.groups is not None or data.group_count is not None) and not isinstance(
            calibrator, Mondrian):
        # shape_of reads group sizes off this column: a federated method's shape would
        # record a plan for these groups, not for the agents it ran on (red team 7)
        raise InvalidInput(f"groups (a Mondrian group column) are for a mondrian: method, "
                           f"not {calibrator.name}")
    check_inputs(calibrator, params, data)  # the calibrator's own rules, as calibrate has them
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
