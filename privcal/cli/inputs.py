"""The CLI's data options: ``--labels``/``--label-column`` and ``--classes`` (the files
themselves are read by :mod:`privcal.data.files`, shared with the service; the class
names of a ``--probs`` header by :mod:`privcal.data.label_columns`)."""

from __future__ import annotations

from typing import Any

import click

from privcal.data.label_columns import header_classes, header_names, read_labels
from privcal.errors import InvalidInput


def _columns_option() -> str | None:
    """``--columns`` of the running command (the probability columns of ``--probs``)."""
    ctx = click.get_current_context(silent=True)
    value = ctx.params.get("columns") if ctx is not None else None
    return value if isinstance(value, str) else None


def labels_in_probs(labels: str | None, label_column: str | None,
                    probs: str | None) -> tuple[str | None, str | None]:
    """``(--labels, --label-column)``, with ``--labels T:COL`` naming a column of the
    ``--probs`` table ``T`` itself read as ``--label-column COL``: else the label column was
    read as one more probability column ("row 0 sums to 6 … for 11 classes"; red team 26,
    newcomer F3)."""
    from privcal.data.files import _split_key

    if labels is None or label_column is not None or not probs:
        return labels, label_column
    (lpath, key), (ppath, pkey) = _split_key(labels), _split_key(probs)
    if key is None or pkey is not None or lpath.suffix.lower() not in (".csv", ".parquet"):
        return labels, label_column
    if lpath.resolve() != ppath.resolve():
        return labels, label_column
    return None, key


def load_labels(spec: str | None, label_column: str | None, probs: str | None,
                shape_only: bool, columns: str | None = None) -> Any:
    """The labels: ``--labels FILE[:COLUMN]``, ``--labels TABLE --label-column C``, or the
    column ``--label-column`` of the ``--probs`` table. When the ``--probs`` header names
    its columns by numbers other than 0 … k-1 (``1,2,3``), the labels are read as text, to
    be matched to those names (:func:`privcal.data.label_columns.read_labels`).
    ``columns`` is ``--columns`` (default: the running command's)."""
    if columns is None:
        columns = _columns_option()
    if label_column is not None:
        if spec is None and probs:
            # the --probs table itself, whichever columns FILE:FIRST:LAST takes as
            # probabilities (refused as "give the label column once": red team 26, F7)
            from privcal.data.files import _split_key

            spec = str(_split_key(probs)[0])
        if spec is None:
            raise InvalidInput("--label-column names a column of --labels or of --probs")
        if ".csv:" in spec or ".parquet:" in spec or ".npz:" in spec:
            raise InvalidInput(f"give the label column once: {spec} or --label-column")
        spec = f"{spec}:{label_column}"
    if not spec:
        return None
    names = header_names(probs, columns, label_column)
    return read_labels(spec, names, shape_only=shape_only)


def class_names(spec: str | None, probs: str | None, columns: str | None,
                label_column: str | None, labels: Any,
                labels_shape_only: bool) -> list[str] | None:
    """The class names: with a ``--probs`` table whose header names its columns, those
    names (``--classes``, if given, must name the same columns, in any order; the header's
    order is recorded: the probabilities are read in it) when ``--classes`` is given or the
    labels are names (:func:`privcal.calibrators.class_labels.column_classes`); without a
    header, ``--classes a,b,c``; else None — then a private method refuses name labels
    (its class names are never read from the labels), and only a non-private one falls
    back to the sorted distinct labels when all k appear. ``labels_shape_only``: the labels
    were not read (a dry run without label groups), so only ``--classes`` can name them."""
    given = None
    if spec is not None:
        if not probs:
            raise InvalidInput("--classes names the probability columns of --probs")
        given = [c.strip() for c in spec.split(",")]
    if not probs or (labels_shape_only and given is None):
        return None
    names = header_names(probs, columns, label_column)
    classes, _ = header_classes(names, given, None if labels_shape_only else labels,
                                f"--probs {probs}")
    return classes


def check_id_count(spec: str | None, ids: Any, arrays: dict[str, Any], what: str) -> None:
    """A one-column CSV of ids (``--subjects``, ``--agent-of``) one id short of the data's
    rows: its first line was read as the column's name (a CSV's first line is its header),
    which the later count check ("got 1999") did not say (red team 14)."""
    import numpy as np

    from privcal.data.files import column_names

    if spec is None or ids is None or not spec.lower().endswith(".csv"):
        return
    rows = [int(np.shape(a)[0]) for k, a in arrays.items()
            if k not in ("subjects", "agents", "classes", "column_names") and a is not None
            and np.ndim(a) >= 1]
    if not rows or int(np.shape(ids)[0]) != rows[0] - 1:
        return
    names = column_names(spec)
    if len(names) == 1:
        n = rows[0]
        raise InvalidInput(
            f"{spec}: got {n - 1} {what} instead of {n} (a 1-D array of {n} ids, one per row); "
            f"if the file has no header line, its first line {names[0]!r:.60} was read as the "
            f"column's name (a CSV's first line is its header): add one, e.g. 'subject'")
