"""Two CSV spellings that read as something else than what was meant (red team 26,
newcomer): a file separated by ``;`` or tabs (read with ``,``, each line is one cell),
and a missing id written as R, Excel or pandas write a missing value (``NA``, ``#N/A``).
:mod:`privcal.data.files` refuses both, in one line, before anything is charged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privcal.errors import InvalidInput

__all__ = ["MISSING_SPELLINGS", "check_delimiter", "check_missing_ids"]

#: how R (``NA``), Excel (``#N/A``), SQL exports (``NULL``) and pandas (``nan``, ``<NA>``)
#: write a missing value: pyarrow's default null spellings, with pandas' ``None``/``<NA>``
MISSING_SPELLINGS = frozenset({
    "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null", "None", "<NA>"})


def check_delimiter(path: Path, first: list[str]) -> None:
    """Refuse a first row that is one field holding ``;`` or a tab: a file written with
    another separator (Excel in most European locales writes ``;``). Read with ``,``, every
    line was one cell, and ids such as ``"0;alice"`` (pandas' index and the id) were a new
    person in each file, past the per-subject cap (red team 26, newcomer F1)."""
    if len(first) != 1:
        return
    sep = next((c for c in ";\t" if c in first[0]), None)
    if sep is not None:
        raise InvalidInput(
            f"{path}: its first row {first[0]!r:.60} is one field holding "
            f"{'a semicolon' if sep == ';' else 'a tab'}: privcal reads comma-separated "
            "files (write with to_csv(sep=','), or save as .parquet)")


def check_missing_ids(ids: np.ndarray, path: Path, what: str) -> np.ndarray:
    """``ids`` (read from ``path``), refused if one is spelled as a missing value in a CSV
    file (``NA``: R's ``write.csv`` of a missing id): every such row was one subject
    ``"NA"``, charged in no person's name, so a person listed later under their own id
    started from zero (red team 26, newcomer F2). A parquet file has real nulls, refused
    as missing (:func:`~privcal.calibrators.validation.id_strings`)."""
    if path.suffix.lower() != ".csv":
        return ids
    for i, v in enumerate(ids.tolist()):
        if v in MISSING_SPELLINGS:
            raise InvalidInput(f"{path}: {what}: row {i} is {v!r}, a missing value as R, "
                               "Excel or pandas write one; every row needs its subject's id")
    return ids
