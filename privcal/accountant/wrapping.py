"""From the caller's options — several levels α, a Mondrian group — to a wrapped calibrator.

``alpha=[0.05, 0.1]`` (``--alpha 0.05,0.1``) wraps the method in
:class:`~privcal.calibrators.levels.Levels`; ``mondrian="label"`` or ``mondrian="column"``
with ``groups=`` (``--mondrian label``, ``--groups FILE[:COL]``) in
:class:`~privcal.calibrators.mondrian.Mondrian`, which needs the caller's assertion
``public_groups=True`` (see that module for why). Everything here runs before anything is
charged; a bad option is a one-line :class:`~privcal.errors.InvalidInput`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from privcal.calibrators.base import Calibrator, CalibratorParams
from privcal.calibrators.levels import Levels, parse_alphas
from privcal.calibrators.mondrian import Mondrian
from privcal.calibrators.validation import check_labels, id_strings
from privcal.errors import InvalidInput, first_error

__all__ = ["MONDRIAN_BY", "Wrapping", "group_column", "wrapping"]

#: what ``mondrian=`` accepts: the label, or a group column the caller supplies
MONDRIAN_BY = ("label", "column")


@dataclass(frozen=True)
class Wrapping:
    """The wrapper options of one request, checked; ``None`` fields mean "not asked"."""

    alphas: tuple[float, ...] | None
    mondrian: str | None
    groups: Any
    public_groups: bool

    @property
    def wanted(self) -> bool:
        return self.alphas is not None or self.mondrian is not None


def wrapping(params: dict[str, Any], *, mondrian: str | None = None, groups: Any = None,
             public_groups: bool = False) -> tuple[Wrapping, dict[str, Any]]:
    """Check the wrapper options and return them with ``params`` as the inner method sees
    them (the first level α in place of a list). Nothing about the data is read."""
    alphas: tuple[float, ...] | None = None
    raw = params.get("alpha")
    if isinstance(raw, list | tuple) or (isinstance(raw, str) and "," in raw):
        alphas = parse_alphas(raw)
        params = {**params, "alpha": alphas[0]}
    if mondrian is not None and mondrian not in MONDRIAN_BY:
        raise InvalidInput(f"mondrian must be 'label' or 'column' (with groups), got "
                           f"{mondrian!r:.40}")
    if groups is not None and mondrian is None:
        mondrian = "column"
    if mondrian == "column" and groups is None:
        raise InvalidInput("Mondrian groups from a column: give the group of every row "
                           "(groups=…, --groups FILE[:COLUMN])")
    if mondrian == "label" and groups is not None:
        raise InvalidInput("give either mondrian='label' or a group column, not both")
    if not isinstance(public_groups, bool):
        raise InvalidInput("public_groups must be True or False")
    if public_groups and mondrian is None:
        raise InvalidInput("public_groups only matters for Mondrian calibration "
                           "(--mondrian label or --groups)")
    if mondrian is not None and not public_groups:
        raise InvalidInput(
            "Mondrian calibration is charged once (parallel composition) only if every "
            "record's group is public or fixed in advance — the group sizes are recorded "
            "and each group's method uses its n; assert it with public_groups=True "
            "(--public-groups) or calibrate without groups")
    return Wrapping(alphas, mondrian, groups, public_groups), params


def group_column(groups: Any, n: int) -> tuple[tuple[str, ...], np.ndarray]:
    """Group names (sorted distinct values, as text) and each row's index into them."""
    ids = id_strings(groups, "groups")
    if ids.shape[0] != n:
        raise InvalidInput(f"groups must give one group per row: {ids.shape[0]} for {n} rows")
    names, index = np.unique(ids.astype(str), return_inverse=True)
    return tuple(str(x) for x in names), index.reshape(-1).astype(np.int64)


def _validate(cal: Calibrator, values: dict[str, Any]) -> CalibratorParams:
    try:
        return cal.Params.model_validate(values)
    except ValidationError as exc:
        raise InvalidInput(f"{cal.name}: {first_error(exc).message}") from None


def wrap(cal: Calibrator, params: CalibratorParams, how: Wrapping, *, n: int, k: int | None,
         labels: Any, classes: Sequence[str] | None = None
         ) -> tuple[Calibrator, CalibratorParams, tuple[str, ...] | None, np.ndarray | None]:
    """The wrapped calibrator, its parameters, the group names and each row's group index
    (None, None without Mondrian). ``labels`` are the rows' class indices (label groups);
    label groups are named by ``classes``, the class names, when the run has them (red team
    19, coverage F6: named by column index, a release of classes "1", "2", "3" recorded
    "group '0'", and its group "2" was the class "3"), else by index."""
    values = params.model_dump(mode="python")
    if how.alphas is not None:
        cal = Levels(cal)
        values = {**values, "alpha": how.alphas}
        params = _validate(cal, values)
        values = params.model_dump(mode="python")
    names: tuple[str, ...] | None = None
    index: np.ndarray | None = None
    if how.mondrian == "label":
        if labels is None or k is None:
            raise InvalidInput("label groups need the probabilities and labels "
                               "(--probs, --labels, --score)")
        index = check_labels(labels, k).astype(np.int64)
        if index.shape[0] != n:
            raise InvalidInput(f"labels must give one label per row: {index.shape[0]} for {n}")
        names = (tuple(str(c) for c in classes) if classes is not None and len(classes) == k
                 else tuple(str(j) for j in range(k)))
    elif how.mondrian == "column":
        names, index = group_column(how.groups, n)
    if how.mondrian is not None:
        cal = Mondrian(cal)
        params = _validate(cal, {**values, "groups": names, "group_by": how.mondrian,
                                 "public_groups": how.public_groups})
    return cal, params, names, index


def with_groups(data: Any, index: np.ndarray | None, names: tuple[str, ...] | None) -> Any:
    """The calibration input with its group column (unchanged without Mondrian)."""
    if index is None or names is None:
        return data
    return dataclasses.replace(data, groups=index, group_count=len(names))
