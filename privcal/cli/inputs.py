"""Reading the CLI's input files: ``.npy``, ``.npz``, ``.csv`` and (with pyarrow) ``.parquet``.

Every failure is an :class:`~privcal.errors.InvalidInput` with one line naming
the file and the problem. Shape and content checks (NaN, rows summing to 1,
labels in range) are the library's (:mod:`privcal.calibrators.validation`), so
the Python API and the CLI refuse the same inputs.

A ``.npz`` with several arrays, or a table with several columns, is read with
``FILE:NAME`` (``calib.npz:probs``, ``reports.csv:bit``); a single-array file
needs no name.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from privcal.calibrators.validation import id_strings
from privcal.errors import InvalidInput

SUFFIXES = (".npy", ".npz", ".csv", ".parquet")


def _split_key(spec: str) -> tuple[Path, str | None]:
    # "C:\x.npy" never reaches us on POSIX; the key is what follows the last ':' after a suffix
    for suffix in SUFFIXES:
        marker = suffix + ":"
        if marker in spec:
            head, key = spec.rsplit(marker, 1)
            return Path(head + suffix), key or None
    return Path(spec), None


def _read_csv(path: Path, *, text: bool | frozenset[str] = False) -> dict[str, np.ndarray]:
    """Columns of a CSV file. A column is numeric (float64) when every value is a number,
    unless it is read as ``text`` (``True``: every column; or a set of column names): ids
    stay exactly as written, never through a float (issue 14.4: a float merges 64-bit ids
    and turns ``000007`` into ``7``). A UTF-8 byte-order mark is not part of the first cell.
    """
    with path.open(newline="", encoding="utf-8-sig") as fh:
        rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    if not rows:
        raise InvalidInput(f"{path}: the file is empty")
    first = rows[0]
    has_header = any(not _is_number(c) for c in first)
    header = [c.strip() for c in first] if has_header else [f"c{i}" for i in range(len(first))]
    body = rows[1:] if has_header else rows
    width = len(header)
    for i, r in enumerate(body):
        if len(r) != width:
            line = i + (2 if has_header else 1)
            raise InvalidInput(f"{path}: line {line} has {len(r)} fields, expected {width}")
    cols = list(zip(*body, strict=True)) if body else [() for _ in header]
    out: dict[str, np.ndarray] = {}
    for name, col in zip(header, cols, strict=True):
        values = [c.strip() for c in col]
        as_text = text is True or (not isinstance(text, bool) and name in text)
        if not as_text and values and all(_is_number(v) for v in values):
            out[name] = np.array([float(v) for v in values], dtype=np.float64)
        else:
            out[name] = np.array(values, dtype=object)
    return out


def _is_number(s: str) -> bool:
    # Python's float() reads "1_0" as 10: a typo is not a number here
    if "_" in s:
        return False
    try:
        float(s)
    except ValueError:
        return False
    return True


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InvalidInput(
            f"{path}: reading .parquet needs pyarrow (pip install 'privcal[parquet]')"
        ) from exc
    table = pq.read_table(path)
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def _table(
    path: Path, *, shape_only: bool = False, text: bool | frozenset[str] = False
) -> dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if not path.exists():
        raise InvalidInput(f"{path}: no such file")
    try:
        if suffix == ".npy":
            # a memory map reads the header only: enough to know the shape, no value is read
            return {"": np.load(path, allow_pickle=False, mmap_mode="r" if shape_only else None)}
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if suffix == ".csv":
            return _read_csv(path, text=text)
        if suffix == ".parquet":
            return _read_parquet(path)
    except InvalidInput:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InvalidInput(f"{path}: cannot read it ({type(exc).__name__}: {first})") from exc
    raise InvalidInput(f"{path}: unsupported file type {suffix!r} (use {', '.join(SUFFIXES)})")


def load_array(
    spec: str, what: str, *, matrix: bool = False, shape_only: bool = False, ids: bool = False
) -> np.ndarray:
    """Read one array from ``spec`` (``FILE`` or ``FILE:NAME``).

    ``what`` names the array in messages and is also the default name looked up
    in a multi-array file (e.g. ``probs`` in an ``.npz``). ``matrix=True`` reads
    every column of a CSV/parquet table as an n×k matrix. ``shape_only=True`` memory-maps
    ``.npy`` files so that only their header is read (for ``--dry-run``). ``ids=True`` reads
    subject or agent ids: CSV cells as text, everything through
    :func:`~privcal.calibrators.validation.id_strings` (strings; floats refused).
    """
    path, key = _split_key(spec)
    tab = _table(path, shape_only=shape_only, text=ids)
    if matrix and path.suffix.lower() in (".csv", ".parquet") and key is None:
        cols = list(tab.values())
        if any(np.asarray(v).dtype.kind not in "iuf" for v in cols):
            raise InvalidInput(f"{path}: {what} must be numeric (a column holds text)")
        return np.column_stack([np.asarray(v, dtype=np.float64) for v in cols])
    if key is not None:
        if key not in tab:
            raise InvalidInput(f"{path}: no array named {key!r} (has: {', '.join(tab)})")
        arr = tab[key]
    elif len(tab) == 1:
        arr = next(iter(tab.values()))
    elif what in tab:
        arr = tab[what]
    else:
        raise InvalidInput(
            f"{path}: holds several arrays ({', '.join(tab)}); name one as {path}:NAME")
    return id_strings(arr, f"{path}: {what}") if ids else arr


def load_reports(
    spec: str, id_column: str, value_column: str, *, label: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Read a report batch: the id column (as strings, see
    :func:`~privcal.calibrators.validation.id_strings`), the value column, and the optional
    ``round`` column (``None`` when absent). ``label`` names the kind of report in errors."""
    path, _ = _split_key(spec)
    tab = _table(path, text=frozenset({id_column}))
    if id_column not in tab or value_column not in tab:
        cols = ", ".join(tab) or "(none)"
        raise InvalidInput(
            f"{path}: {label}reports need columns {id_column!r} and {value_column!r} "
            f"(has: {cols})"
        )
    return id_strings(tab[id_column], f"{path}: {id_column}"), tab[value_column], tab.get("round")
