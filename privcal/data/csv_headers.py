"""A CSV header of numbers that names a release's classes (red team 21, readme F4).

:mod:`privcal.data.files` reads a first row of numbers as data (it cannot be told from a
header); ``predict`` and ``evaluate`` know the release's class names, and say in one line
when the first row spells them rather than "row 0 sums to 6".
"""

from __future__ import annotations

from privcal.data.files import _first_row, _is_number, _split_key

__all__ = ["numbers_header"]


def numbers_header(spec: str, names: list[str]) -> str | None:
    """The first line of CSV ``spec`` if it spells exactly ``names`` (a release's class
    names: ``1,2,3``, any order) in numbers — a header that cannot be told from data, which
    :func:`~privcal.data.files.load_array` reads as a row — else None. For ``predict`` and
    ``evaluate`` to say so in one line, not "row 0 sums to 6" (red team 21, readme F4)."""
    path = _split_key(spec)[0]
    if path.suffix.lower() != ".csv" or not path.exists() or len(names) < 2:
        return None
    first = _first_row(path)
    if first is None or not all(_is_number(c.strip()) for c in first):
        return None
    cells = [c.strip() for c in first]
    return ",".join(cells) if sorted(cells) == sorted(str(n) for n in names) else None
