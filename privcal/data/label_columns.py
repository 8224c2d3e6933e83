"""Class names from the header of a probability table, and the labels read to match them:
the one rule of the CLI (``--probs``/``--classes``/``--labels``/``--label-column``) and of
the service's uploads, which is :func:`privcal.calibrators.class_labels.column_classes` —
the rule :func:`~privcal.calibrators.group_sets.align_columns` applies at predict time.

- A table whose selected probability columns are named (a CSV/parquet header) names the
  classes: ``--classes`` must name the same columns (any order; the release records the
  header's order, in which the probabilities are read), and name labels are matched to
  the header — never sorted.
- When a column name is a number other than its index (sklearn's header ``1,2,3`` for
  ``classes_ = [1, 2, 3]``, codes ``01,02``), the labels are read as text and matched to
  the names (:func:`read_labels`); a header of non-numbers or of exactly ``0,1,…,k-1``
  keeps integer labels as column indices (``p0:p9`` with labels 0–9).
- Arrays and headerless CSV files have no names: their columns are taken by position.
"""

from __future__ import annotations

from typing import Any

from privcal.data.files import load_array, prob_column_names

__all__ = ["header_classes", "header_names", "read_labels"]


def header_names(probs: str | None, columns: str | None,
                 label_column: str | None) -> list[str] | None:
    """The names of the probability columns selected from ``probs`` (``--columns``, or all
    but the label column), or None for an array, a headerless CSV or no ``probs``."""
    if not probs:
        return None
    return prob_column_names(probs, columns, (label_column,) if label_column else ())


def read_labels(spec: str, names: list[str] | None, *, shape_only: bool) -> Any:
    """The labels at ``spec`` (``FILE`` or ``FILE:COLUMN``): as stored, or — when the
    probability columns' ``names`` are numbers other than their indices
    (:func:`~privcal.calibrators.class_labels.names_are_numbers`) — as text, integers as
    their spelling (:func:`~privcal.calibrators.class_labels.label_names`), to be matched
    to the names."""
    # imported here: the CLI imports this module, and `privcal --help` loads no calibrator
    from privcal.calibrators.class_labels import label_names, names_are_numbers

    if names is None or shape_only or not names_are_numbers(names):
        return load_array(spec, "labels", shape_only=shape_only)
    return label_names(load_array(spec, "labels", text=True))


def header_classes(names: list[str] | None, classes: list[str] | None, labels: Any,
                   where: str) -> tuple[list[str] | None, Any]:
    """The classes to record and the labels to encode, given the probability columns'
    ``names`` (None: no header, ``classes`` as given) — see the module docstring."""
    if names is None:
        return classes, labels
    from privcal.calibrators.class_labels import column_classes

    return column_classes(names, classes, labels, where)
