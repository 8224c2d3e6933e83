"""A CSV file separated by ``;`` or tabs (red team 26, newcomer F1): read with ``,``, each
line is one cell. :mod:`privcal.data.files` refuses it in one line, before anything is
charged."""

from __future__ import annotations

from pathlib import Path

from privcal.errors import InvalidInput

__all__ = ["check_delimiter"]


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
