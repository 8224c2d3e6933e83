"""Reading data files — the CLI's paths and the service's uploads: ``.npy``, ``.npz``,
``.csv`` and ``.parquet``.

Tables (CSV and parquet) are read with pyarrow (imported only when a table is read):
column types are pyarrow's, ids are read as text (never through a float), a pandas
index column (``df.to_csv()``'s unnamed first column, parquet's ``__index_level_0__``)
is ignored. Every failure is an :class:`~privcal.errors.InvalidInput` with one line
naming the file and the problem. Shape and content checks (NaN, rows summing to 1,
labels in range) are the library's (:mod:`privcal.calibrators.validation`), so the
Python API, the CLI and the service refuse the same inputs.

Selecting data inside a file:

- ``FILE:NAME`` — one array of a ``.npz``, one column of a table (``reports.csv:bit``);
- ``FILE:FIRST:LAST`` or ``--columns FIRST:LAST`` — the columns from FIRST to LAST in the
  file's order (``calib.csv:p0:p9``); ``A,B,C`` lists columns; both combine (``a,c:e``);
- a single-array file, or a table whose columns are all wanted, needs no name.

A CSV file whose first row holds any non-numeric cell has a header; otherwise its
columns are named ``c0``, ``c1``, …. A first row that spells column numbers — ``0``, or
0, 1, …, k-1 in any order and any plain decimal spelling (``0,1``, ``1,0``, ``2,0,1``,
``0.0,1.0``, ``00,01``) — is pandas' header for unnamed or number-labelled columns, or
data, and is refused: name the columns, or remove that row. Any other header of numbers
(a column named ``1``, quantile levels ``0.05,0.95``) cannot be told from data: it is read
as a row — give files with named columns. Blank or whitespace-only lines before the
first row are skipped; a first row spanning lines (a quoted line break), or one field holding
``;`` or a tab (:mod:`privcal.data.csv_cells`: another separator), is refused.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np

from privcal.calibrators.validation import id_strings
from privcal.data.csv_cells import check_delimiter
from privcal.errors import InvalidInput

SUFFIXES = (".npy", ".npz", ".csv", ".parquet")
#: names pandas gives its default index column when a frame is written with it
_INDEX_NAMES = ("", "Unnamed: 0")


def _split_key(spec: str) -> tuple[Path, str | None]:
    # "C:\x.npy" never reaches us on POSIX; the key is what follows the first ':' after a suffix
    for suffix in SUFFIXES:
        marker = suffix + ":"
        if marker in spec:
            head, key = spec.split(marker, 1)
            return Path(head + suffix), key or None
    return Path(spec), None


def _is_number(s: str) -> bool:
    if "_" in s:  # float("1_0") is 10: a typo is not a number here
        return False
    try:
        float(s)
    except ValueError:
        return False
    return True


def _index_spelling(cells: list[str]) -> bool:
    """Whether ``cells`` spell column numbers: the header pandas writes for unnamed columns,
    or for columns labelled by integer or float class labels (sklearn's ``classes_ =
    [0., 1.]`` gives ``0.0,1.0``). Two or more cells: 0, 1, …, k-1 in any order (``0,1``,
    ``1,0`` — to_csv of a reordered frame, a binary row summing to 1 that shifted every set
    by a row: red team 16 — ``2,0,1``, ``0.0,1.0``, ``00,01``), in a plain decimal spelling
    — exponent spellings (``np.savetxt``'s ``0.000e+00``) are data. One cell counts only as
    ``0``: a column of scores, predictions or labels may start with any other number (a
    header ``1`` over floats is read as data: name the column)."""
    cells = [c.strip() for c in cells]
    if len(cells) == 1:
        return cells == ["0"]
    if not all(re.fullmatch(r"[0-9]+(?:\.[0-9]*)?", c) for c in cells):
        return False
    return sorted(float(c) for c in cells) == [float(i) for i in range(len(cells))]


def _first_row(path: Path) -> list[str] | None:
    """The first non-blank row (to tell a header from data; pyarrow reads the rest). A row
    spelling 0,1,…,k-1 (:func:`_index_spelling`) is refused: it is pandas' header for
    unnamed or number-labelled columns, or data."""
    found = _first_row_at(path)
    return None if found is None else found[0]


def _first_row_at(path: Path) -> tuple[list[str], int, int] | None:
    """The first row with a non-blank cell, and the physical lines before it and through it
    (blank or whitespace-only lines may precede it). A first row that spans several lines
    (a quoted line break) is refused: pyarrow, told how many lines to skip, would cut it."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        before = 0
        for row in reader:
            if row and any(c.strip() for c in row):
                if reader.line_num != before + 1:
                    raise InvalidInput(
                        f"{path}: its first row spans lines {before + 1}-{reader.line_num} "
                        "(a quoted line break): put the header or first row on one line")
                check_delimiter(path, row)
                if _index_spelling(row):
                    shown = ",".join(row) if len(row) <= 4 else f"{row[0]},{row[1]},…,{row[-1]}"
                    raise InvalidInput(
                        f"{path}: its first row {shown!r} is what pandas writes as a header "
                        "for unnamed or number-labelled columns, or data: give the columns "
                        "names (e.g. to_csv of a named Series/DataFrame, header 'score', "
                        "'p0,p1'; a headerless file whose first row is data: add such a "
                        "header) or remove that row")
                return row, before, reader.line_num
            before = reader.line_num
    return None


def _ragged_line(path: Path, width: int) -> str:
    """The error-path message for a row of the wrong width, with its line number."""
    with path.open(newline="", encoding="utf-8-sig") as fh:
        for i, row in enumerate(csv.reader(fh), start=1):
            if row and any(c.strip() for c in row) and len(row) != width:
                return f"line {i} has {len(row)} fields, expected {width}"
    return "a row has the wrong number of fields"


def _read_csv(path: Path, *, text: bool | frozenset[str] = False) -> dict[str, np.ndarray]:
    """Columns of a CSV file, read by pyarrow. Columns in ``text`` (``True``: all) are read
    as strings exactly as written; the others get pyarrow's inferred type (int64, double,
    or string when a cell is not a number)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    found = _first_row_at(path)
    if found is None:
        raise InvalidInput(f"{path}: the file is empty")
    first, before, through = found
    has_header = any(not _is_number(c.strip()) for c in first)
    names = [c.strip() for c in first] if has_header else [f"c{i}" for i in range(len(first))]
    if len(set(names)) != len(names):
        raise InvalidInput(f"{path}: the header names a column twice ({', '.join(names)})")
    wanted = set(names) if text is True else set(text or ())
    types = {n: pa.string() for n in names if n in wanted}
    try:
        tab = pcsv.read_csv(
            path,
            # pyarrow skips physical lines: the blank lines before the first row, and the header
            read_options=pcsv.ReadOptions(column_names=names,
                                          skip_rows=through if has_header else before),
            convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False),
            # one column: an empty line is how pyarrow, polars or Excel write a missing value —
            # read as one (NaN, an empty id: refused with its row), never skipped, which
            # shifted every later row against the other files' (red team 25, newcomer F1)
            parse_options=pcsv.ParseOptions(ignore_empty_lines=len(names) > 1),
        )
    except pa.ArrowInvalid as exc:
        if "columns, got" in str(exc):
            raise InvalidInput(f"{path}: {_ragged_line(path, len(names))}") from exc
        raise
    if tab.num_rows == 0:  # a header alone: "must be numeric, got dtype object" said nothing
        raise InvalidInput(f"{path}: a header and no row")
    out = {n: _numpy(tab.column(n)) for n in tab.column_names}
    if has_header and names[0] in _INDEX_NAMES and len(names) > 1:
        out.pop(names[0])  # pandas' default index column
    return out


def _numpy(col: Any) -> np.ndarray:
    import pyarrow as pa

    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return np.array(col.to_pylist(), dtype=object)
    if col.null_count and (pa.types.is_integer(col.type) or pa.types.is_boolean(col.type)):
        col = col.cast(pa.float64())  # a missing cell is NaN, which the library refuses
    return col.to_numpy(zero_copy_only=False)


def _read_parquet(path: Path, *, text: bool | frozenset[str] = False) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        if name.startswith("__index_level_"):
            continue  # pandas' index, stored as a column
        col = table.column(name)
        if text is True or (not isinstance(text, bool) and name in text):
            if pa.types.is_floating(col.type):
                out[name] = col.to_numpy(zero_copy_only=False)  # id_strings refuses floats
                continue
            col = col.cast(pa.string())
        out[name] = _numpy(col)
    return out


def _check_parquet_ids(path: Path, column: str, what: str) -> None:
    """Refuse a parquet id column that is not text or integers: a decimal(10, 2) 7 reads as
    "7.00" (another person than an int64 7), a bool as "true"/"false" (red team 10); as
    :func:`~privcal.calibrators.validation.id_strings` refuses floats and bools elsewhere."""
    if path.suffix.lower() != ".parquet":
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = {f.name: f.type for f in pq.read_schema(path)}.get(column)
    if found is None:
        return
    inner = found.value_type if pa.types.is_dictionary(found) else found
    if not (pa.types.is_integer(inner) or pa.types.is_string(inner)
            or pa.types.is_large_string(inner)):
        raise InvalidInput(f"{path}: {what} column {column!r} is of type {found}: ids must be "
                           "text or integers (write the column as strings or int64)")


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
            return _read_parquet(path, text=text)
    except InvalidInput:
        raise
    except Exception as exc:
        if suffix in (".npy", ".npz") and ("pickled" in str(exc) or "Object arrays" in str(exc)):
            # numpy's own message advises allow_pickle: an unsafe load privcal never makes
            raise InvalidInput(f"{path}: not a NumPy {suffix} file of numbers (another format "
                               "named so, or an object array, which privcal does not unpickle: "
                               "write the array with numpy.save)") from exc
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InvalidInput(f"{path}: cannot read it ({type(exc).__name__}: {first})") from exc
    raise InvalidInput(f"{path}: unsupported file type {suffix!r} (use {', '.join(SUFFIXES)})")


def select_columns(names: list[str], spec: str, where: str) -> list[str]:
    """The columns ``spec`` names, in file order for a range: ``a``, ``a,b``, ``p0:p9``,
    ``a,c:e``. An unknown name is an error listing the columns the file has."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part in names:
            out.append(part)
            continue
        if ":" in part:
            lo, hi = (s.strip() for s in part.split(":", 1))
            for end in (lo, hi):
                if end not in names:
                    raise InvalidInput(f"{where}: no column {end!r} (has: {', '.join(names)})")
            i, j = names.index(lo), names.index(hi)
            if i > j:
                raise InvalidInput(f"{where}: column {lo!r} comes after {hi!r}")
            out.extend(names[i : j + 1])
            continue
        raise InvalidInput(f"{where}: no column {part!r} (has: {', '.join(names)})")
    if not out:
        raise InvalidInput(f"{where}: no column selected by {spec!r}")
    return out


def _matrix(tab: dict[str, np.ndarray], cols: list[str], path: Path, what: str) -> np.ndarray:
    for c in cols:
        if np.asarray(tab[c]).dtype.kind not in "iufb":
            raise InvalidInput(f"{path}: {what} must be numeric (column {c!r} holds text)")
    return np.column_stack([np.asarray(tab[c], dtype=np.float64) for c in cols])


#: the id arrays that name people (each with a per-subject budget): their ids may not be
#: integers spelled as floats (:func:`~privcal.calibrators.validation.check_not_float_spelled`)
_PEOPLE = frozenset({"subjects", "agents"})


def array_file(spec: str) -> bool:
    """Whether ``spec`` (``FILE``, ``FILE:NAME``…) names a file :func:`load_array` reads —
    by its suffix, as :func:`load_array` tells its type."""
    return _split_key(spec)[0].suffix.lower() in SUFFIXES


def load_array(
    spec: str,
    what: str,
    *,
    matrix: bool = False,
    shape_only: bool = False,
    ids: bool = False,
    columns: str | None = None,
    exclude: tuple[str, ...] = (),
    text: bool = False,
) -> np.ndarray:
    """Read one array from ``spec`` (``FILE``, ``FILE:NAME`` or ``FILE:FIRST:LAST``).

    ``what`` names the array in messages and is also the default name looked up
    in a multi-array file (e.g. ``probs`` in an ``.npz``). ``matrix=True`` reads the
    columns of a CSV/parquet table as an n×k matrix: those ``columns`` selects (see
    :func:`select_columns`), else every column but ``exclude`` (e.g. the label column).
    ``shape_only=True`` memory-maps ``.npy`` files so that only their header is read
    (for ``--dry-run``). ``ids=True`` reads subject or agent ids: table cells as text (a
    parquet column must be text or integers), everything through
    :func:`~privcal.calibrators.validation.id_strings`. ``text=True``
    reads table cells as text exactly as written (labels matched to class names: ``01``
    stays ``01``); arrays are returned as stored.
    """
    path, key = _split_key(spec)
    tab = _table(path, shape_only=shape_only, text=ids or text)
    table_file = path.suffix.lower() in (".csv", ".parquet")
    if columns is not None and key is not None:
        raise InvalidInput(f"{spec}: name the columns once, as FILE:COLUMNS or with --columns")
    if matrix and table_file:
        sel = key if key is not None else columns
        if sel is not None:
            cols = select_columns(list(tab), sel, str(path))
        else:
            cols = [c for c in tab if c not in exclude]
        return _matrix(tab, cols, path, what)
    if columns is not None:
        raise InvalidInput(f"--columns selects columns of a .csv/.parquet table, not {path.name}")
    if key is not None:
        if key not in tab:
            kind = "column" if table_file else "array"
            raise InvalidInput(f"{path}: no {kind} named {key!r} (has: {', '.join(tab)})")
        name = key
    elif len(tab) == 1:
        name = next(iter(tab))
    elif what in tab:
        name = what
    else:
        raise InvalidInput(
            f"{path}: holds several arrays ({', '.join(tab)}); name one as {path}:NAME")
    if not ids:
        return tab[name]
    _check_parquet_ids(path, name, what)
    # a group's label is no person: "5.0" stays a group (red team 14)
    return id_strings(tab[name], f"{path}: {what}", people=what in _PEOPLE)


def prob_column_names(spec: str, columns: str | None, exclude: tuple[str, ...]) -> list[str] | None:
    """The names of the probability columns :func:`load_array` selects from a table with a
    header (class names), or None for arrays and headerless CSV (columns ``c0``, ``c1``, …)."""
    path, key = _split_key(spec)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        return None
    if suffix == ".csv":
        if not path.exists():
            raise InvalidInput(f"{path}: no such file")
        first = _first_row(path)
        if first is None or all(_is_number(c.strip()) for c in first):
            return None
        names = [c.strip() for c in first]  # the header, as _read_csv names the columns
        if names[0] in _INDEX_NAMES and len(names) > 1:
            names = names[1:]
    else:
        names = list(_table(path))
    sel = key if key is not None else columns
    if sel is not None:
        return select_columns(names, sel, str(path))
    return [c for c in names if c not in exclude]


def column_names(spec: str) -> list[str]:
    """The column names of a table file (``[]`` for ``.npy``/``.npz``), for class names."""
    path, key = _split_key(spec)
    if path.suffix.lower() not in (".csv", ".parquet"):
        return []
    names = list(_table(path))
    return select_columns(names, key, str(path)) if key else names


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
    _check_parquet_ids(path, id_column, "id")
    ids = id_strings(tab[id_column], f"{path}: {id_column}", people=True)
    return ids, tab[value_column], tab.get("round")
