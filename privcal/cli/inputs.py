"""The CLI's data options: ``--labels``/``--label-column`` and ``--classes`` (the files
themselves are read by :mod:`privcal.data.files`, shared with the service)."""

from __future__ import annotations

from typing import Any

from privcal.data.files import load_array, prob_column_names
from privcal.errors import InvalidInput


def load_labels(spec: str | None, label_column: str | None, probs: str | None,
            shape_only: bool) -> Any:
    """The labels: ``--labels FILE[:COLUMN]``, ``--labels TABLE --label-column C``, or the
    column ``--label-column`` of the ``--probs`` table."""
    if label_column is not None:
        source = spec or probs
        if source is None:
            raise InvalidInput("--label-column names a column of --labels or of --probs")
        if ".csv:" in source or ".parquet:" in source or ".npz:" in source:
            raise InvalidInput(f"give the label column once: {source} or --label-column")
        return load_array(f"{source}:{label_column}", "labels", shape_only=shape_only)
    return load_array(spec, "labels", shape_only=shape_only) if spec else None


def class_names(spec: str | None, probs: str | None, columns: str | None,
              label_column: str | None, labels: Any, shape_only: bool) -> list[str] | None:
    """The class names: ``--classes a,b,c``; else, for labels that are names, the selected
    column names of a ``--probs`` table with a header; else None — then a private method
    refuses name labels (its class names are never read from the labels), and only a
    non-private one falls back to the sorted distinct labels when all k appear."""
    from privcal.calibrators.class_labels import is_text_labels  # only when calibrating

    if spec is not None:
        if not probs:
            raise InvalidInput("--classes names the probability columns of --probs")
        return [c.strip() for c in spec.split(",")]
    if not probs or shape_only or not is_text_labels(labels):
        return None
    return prob_column_names(probs, columns, (label_column,) if label_column else ())
