"""Row-aligned inputs as privcal reads them: each once, into a copy of its own, and paired by
position only when no two of them say otherwise.

Two rules every entry point taking several inputs of one row each (scores and subject ids,
probabilities and labels, a batch's ids, values and rounds) keeps:

- **read once** (:func:`own_copy`): a caller's array or list is copied before the first
  check; every check, digest, charge and stored row reads the copy. A list another thread
  changes, an ``ndarray`` subclass or an object whose ``__array__`` answers differently at
  each read cannot make privcal store or release rows it did not check (red team 26, api F1
  for :meth:`~privcal.accountant.Accountant.run`, api F6 for a session's batch).
- **paired by position, never silently against an index** (:func:`same_index`): privcal,
  like NumPy and scikit-learn, pairs the i-th row of each input. A pandas ``Series`` or
  ``DataFrame`` carries its own index, and a pandas user may expect two of them to be
  aligned on it: given two pandas inputs whose indexes differ (another order, other labels),
  privcal refuses — a one-line :class:`~privcal.errors.InvalidInput`, nothing charged —
  rather than pair each label with another row's probabilities (red team 26, api F9). Align
  them first (``labels.loc[probs.index]``) or pass plain arrays (``.to_numpy()``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from privcal.calibrators.validation import unmasked
from privcal.errors import InvalidInput

__all__ = ["own_copy", "same_index"]


def _pandas_index(a: Any) -> Any:
    """The index of a pandas Series or DataFrame (pandas already imported by the caller: an
    object of it exists), else None."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(a, pd.Series | pd.DataFrame):
        return None
    return a.index


def same_index(inputs: Mapping[str, Any]) -> None:
    """InvalidInput if two of ``inputs`` (name → a row-aligned input; None ones skipped) are
    pandas objects whose indexes are not equal, element by element and in order (module
    docstring): their rows would be paired by position while their indexes pair them
    otherwise."""
    first: tuple[str, Any] | None = None
    for name, a in inputs.items():
        index = _pandas_index(a)
        if index is None:
            continue
        if first is None:
            first = (name, index)
            continue
        if not first[1].equals(index):
            raise InvalidInput(
                f"{first[0]} and {name} are pandas objects with different indexes: privcal "
                "pairs rows by position, not by index, and will not guess; align them first "
                f"(e.g. {name}.loc[{first[0]}.index]) or pass arrays (.to_numpy())")


def own_copy(a: Any, what: str) -> np.ndarray:
    """``a`` read once into a read-only array of privcal's own (module docstring): a NumPy
    array's data copied as a plain ``ndarray`` (a subclass's methods are never asked; a
    masked array refused if any entry is masked, :func:`~privcal.calibrators.validation.
    unmasked`); any other value through ``np.array(a, dtype=object)`` (read item by item,
    as :func:`~privcal.calibrators.validation.id_strings` reads ids). A value that is no
    array (ragged) is a one-line InvalidInput naming ``what``."""
    a = unmasked(a, what)
    try:
        out = (np.array(a, copy=True, subok=False) if isinstance(a, np.ndarray)
               else np.array(a, dtype=object))
    except (ValueError, TypeError) as exc:  # a ragged list
        raise InvalidInput(f"{what} are not an array: {str(exc).splitlines()[0]}") from None
    out.flags.writeable = False
    return out
