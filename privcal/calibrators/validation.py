"""Input checks shared by the scores, the calibrators and the CLI loaders.

Each check returns a clean contiguous array (float64 or int64) or raises
:class:`privcal.errors.InvalidInput` with one line naming the problem and,
where there is one, the first offending row (DESIGN.md, "Bad input gets a
clear error and changes nothing").
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

import numpy as np

from privcal.errors import (
    READS_AS_NOTHING,
    InvalidInput,
    invisible_char,
    plain_number_text,
    utf8_problem,
)

__all__ = [
    "PROB_ROUNDING",
    "PROB_SUM_TOL",
    "check_labels",
    "check_lengths",
    "check_probs",
    "check_scores",
    "check_targets",
    "id_strings",
    "number_text",
    "prob_sum_tolerance",
    "unmasked",
]

#: rows of a probability matrix must sum to 1 within this absolute tolerance, plus
#: :data:`PROB_ROUNDING` per class
PROB_SUM_TOL = 1e-6
#: what rounding adds to a row sum per probability: a file that writes each probability with
#: 6 decimals (pandas' ``float_format="%.6f"``, spreadsheets, R) moves a row of k by up to
#: k·5e-7 (red team 7: such a 3-class CSV was refused as summing to 0.999999)
PROB_ROUNDING = 5e-7


def prob_sum_tolerance(k: int) -> float:
    """How far from 1 a row of ``k`` probabilities may sum: :data:`PROB_SUM_TOL` plus
    6-decimal rounding of each entry. The scores' guarantees do not rest on it (conformal
    coverage holds for any score function); it only catches a matrix that is not one of
    probabilities (logits, percentages, a shifted column)."""
    return PROB_SUM_TOL + k * PROB_ROUNDING


def number_text(v: str | bytes) -> float | None:
    """The number the text ``v`` reads as under the one rule for numbers read from text
    (:func:`privcal.errors.plain_number_text`: ASCII, no ``_``), or None — ``float()`` alone
    reads "1_0" as 10 and every script's digits (red team 22, flows F1: a session's round
    and a FedCP-QQ message took whatever it reads)."""
    if isinstance(v, bytes):
        try:
            v = v.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not plain_number_text(v):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def unmasked(a: object, what: str) -> object:
    """``a``, or the data of a NumPy masked array with no masked entry; InvalidInput if any
    entry is masked. A mask marks entries missing, and ``np.asarray`` silently drops it:
    the hidden values under it were calibrated on as data (red team 11)."""
    if not isinstance(a, np.ma.MaskedArray):
        return a
    masked = int(np.ma.count_masked(a))
    if masked:
        raise InvalidInput(f"{what}: {masked} of {a.size} entries are masked (missing); a "
                           "masked array's hidden values are not data: drop or fill them first "
                           "(.compressed(), .filled(...))")
    return np.ma.getdata(a)


def table_array(a: Any) -> Any:
    """A pandas DataFrame of numeric columns of pandas' nullable or pyarrow dtypes (what
    ``convert_dtypes()`` or ``dtype_backend=`` give) as a float64 array, NaN where a value is
    missing: ``np.asarray`` made it an object array, refused as "must be numeric" (red team
    23, coverage F5). Anything else is returned as it is."""
    dtypes, ndim = getattr(a, "dtypes", None), getattr(a, "ndim", None)
    if dtypes is None or ndim != 2 or not callable(getattr(a, "to_numpy", None)):
        return a
    try:
        kinds = {np.dtype(getattr(d, "numpy_dtype", d)).kind for d in dtypes}
    except TypeError:
        return a
    if not kinds or not kinds <= set("iuf") or all(isinstance(d, np.dtype) for d in dtypes):
        return a
    return a.to_numpy(dtype=np.float64, na_value=np.nan)


def array_shape(a: Any, what: str = "probabilities") -> tuple[int, ...]:
    """``np.shape(a)``; rows of unequal length (NumPy's ValueError, a traceback: red team 23,
    coverage F1) are a one-line InvalidInput naming ``what``."""
    try:
        return tuple(np.shape(a))
    except ValueError:
        raise InvalidInput(f"{what} are not an n×k array (rows of unequal length?)") from None


def _numeric(a: object, what: str) -> np.ndarray:
    a = unmasked(a, what)
    try:
        arr = np.asarray(table_array(a))
    except Exception as exc:  # ragged lists and the like
        raise InvalidInput(f"{what} is not an array: {exc}") from exc
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise InvalidInput(f"{what} must be numeric, got dtype {arr.dtype}")
    return arr


def _min_rows(n: int, what: str, min_rows: int) -> None:
    if n < min_rows:
        raise InvalidInput(f"{what} needs at least {min_rows} rows, got {n}")


def check_scores(a: object, *, min_rows: int = 2, allow_inf: bool = False) -> np.ndarray:
    """A 1-D float64 array of scores: no NaN, no ±inf unless ``allow_inf``, ≥ ``min_rows`` rows."""
    arr = _numeric(a, "scores")
    if arr.ndim != 1:
        raise InvalidInput(f"scores must be a 1-D array, got shape {arr.shape}")
    _min_rows(arr.shape[0], "scores", min_rows)
    out = np.ascontiguousarray(arr, dtype=np.float64)
    # A finite sum proves every value finite in one cheap pass; only otherwise (a NaN,
    # an inf, or an overflowing sum) locate the offending row.
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(out.sum())
    if math.isfinite(total):
        return out
    bad = np.isnan(out) if allow_inf else ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(f"scores: row {i} is {out[i]} (scores must be finite numbers)")
    return out


def check_targets(a: object, *, min_rows: int = 2, what: str = "targets") -> np.ndarray:
    """Regression targets or predictions (named ``what`` in errors): a 1-D finite float64 array."""
    arr = _numeric(a, what)
    if arr.ndim != 1:
        raise InvalidInput(f"{what} must be a 1-D array, got shape {arr.shape}")
    _min_rows(arr.shape[0], what, min_rows)
    out = np.ascontiguousarray(arr, dtype=np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(f"{what}: row {i} is {out[i]} (must be a finite number)")
    return out


def check_probs(p: object, *, min_rows: int = 2) -> np.ndarray:
    """An n×k float64 probability matrix: finite, ≥ 0, rows summing to 1 within
    :func:`prob_sum_tolerance` (1e-6 + k·5e-7), k ≥ 2."""
    arr = _numeric(p, "probabilities")
    if arr.ndim != 2:
        raise InvalidInput(f"probabilities must be a 2-D n×k array, got shape {arr.shape}")
    _min_rows(arr.shape[0], "probabilities", min_rows)
    if arr.shape[1] < 2:
        raise InvalidInput(f"probabilities need at least 2 classes (columns), got {arr.shape[1]}")
    out = np.ascontiguousarray(arr, dtype=np.float64)
    # Fast path, two passes and no n×k temporaries: the minimum is ≥ 0 (false for NaN, −inf
    # or a negative entry) and every row sum (einsum) is within the tolerance less a margin
    # far above any rounding difference (so NaN/+inf rows fail it). A matrix that does not
    # pass is checked below, entry by entry, for the exact error — same verdicts as before.
    tol = prob_sum_tolerance(out.shape[1])
    sums = np.einsum("ij->i", out)
    if out.min() >= 0 and bool((np.abs(sums - 1.0) <= tol - 1e-12).all()):
        return out
    bad = ~np.isfinite(out)
    if bad.any():
        i, j = np.unravel_index(int(np.argmax(bad)), out.shape)
        raise InvalidInput(f"probabilities: row {i}, column {j} is {out[i, j]} (must be finite)")
    neg = out < 0
    if neg.any():
        i, j = np.unravel_index(int(np.argmax(neg)), out.shape)
        raise InvalidInput(f"probabilities: row {i}, column {j} is negative ({out[i, j]})")
    sums = out.sum(axis=1)
    off = np.abs(sums - 1.0) > tol
    if off.any():
        i = int(np.argmax(off))
        raise InvalidInput(
            f"probabilities: row {i} sums to {float(sums[i]):.15g}, not 1 (tolerance {tol:.3g} "
            f"for {out.shape[1]} classes: 1e-6 plus 6-decimal rounding of each)"
        )
    return out


def check_labels(y: object, k: int, *, min_rows: int = 2) -> np.ndarray:
    """A 1-D int64 array of class labels in [0, k).

    Float arrays are accepted when every value is integral (CSV files load as
    floats); 2.5 or NaN is an error naming the row.
    """
    arr = _numeric(y, "labels")
    if arr.ndim != 1:
        raise InvalidInput(f"labels must be a 1-D array, got shape {arr.shape}")
    _min_rows(arr.shape[0], "labels", min_rows)
    if np.issubdtype(arr.dtype, np.floating):
        nonint = ~np.isfinite(arr) | (arr != np.round(arr))
        if nonint.any():
            i = int(np.argmax(nonint))
            raise InvalidInput(f"labels: row {i} is {arr[i]}, not an integer")
        # values beyond int64 are out of [0, k) anyway; clip before casting to avoid overflow
        arr = np.clip(arr, -1, k)
    out = np.ascontiguousarray(arr, dtype=np.int64)
    bad = (out < 0) | (out >= k)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(f"labels: row {i} is {np.asarray(y)[i]}, outside [0, {k})")
    return out


def check_lengths(**arrays: np.ndarray) -> int:
    """All arrays have the same number of rows; returns it. Names appear in the error."""
    lengths = {name: int(np.shape(a)[0]) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{name} has {m}" for name, m in lengths.items())
        raise InvalidInput(f"length mismatch: {desc} rows")
    return next(iter(lengths.values()))


def id_strings(values: object, what: str = "ids", *, people: bool = False) -> np.ndarray:
    """Subject or agent ids as strings: the one normalisation used by the CLI, the API and
    collection sessions (issue 14.4), so that one person has one key everywhere.

    Strings are kept exactly as given (``"000007"`` stays ``"000007"``); integers (Python or
    numpy, any size) become their decimal spelling. Floats are refused — a 64-bit id that
    went through a float has already been rounded, merging distinct people — and so are
    ``None``, bools, empty ids, ids longer than 200 characters, ids that no backend can
    store (a NUL byte, a lone surrogate), and ids that read as another id: a blank at either
    end (``" 7"``), an invisible or blank character anywhere (``"alice\u200b"``, a no-break
    space: any character Python does not call printable, the ASCII space excepted, or that
    renders as nothing — :func:`privcal.errors.invisible_char` — but the zero-width joiners
    U+200C/U+200D where they shape a joining or virama script or join two emoji), or not in
    Unicode NFC — refused, never stripped or normalised. ``people``: the ids of subjects or
    agents (each with its own per-subject budget), where an integer spelled as a float
    (``"7.0"``) is refused too (:func:`check_not_float_spelled`); a group's label is no
    person (``"5.0"`` stays a group). Returns a 1-D array of ``str`` (dtype ``U``).
    """
    values = unmasked(values, what)
    try:
        # a Python sequence is read item by item: numpy's fixed-width strings would drop a
        # trailing NUL and spell True as "True"
        arr = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=object)
    except Exception as exc:  # ragged nested sequences
        raise InvalidInput(f"{what} are not a 1-D sequence: {exc}") from exc
    if arr.ndim != 1:
        raise InvalidInput(f"{what} must be a 1-D sequence, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind in "iu":  # the common bulk case, vectorised
        return arr.astype(str)
    if kind == "U":  # a copy, checked and returned: never the caller's array (red team 26)
        out = np.array(arr, copy=True, subok=False)
    elif kind == "O":
        items = arr.tolist()
        for i, v in enumerate(items):
            if isinstance(v, str):
                continue
            if isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_):
                items[i] = str(v)
                continue
            kind_of = ("missing" if v is None else "not floats (a float cannot hold every "
                       "64-bit id: read ids as text)" if isinstance(v, float | np.floating)
                       else f"not {type(v).__name__}")
            raise InvalidInput(f"{what}: row {i} is {v!r:.40}; ids must be strings or "
                               f"integers, {kind_of}")
        for i, v in enumerate(items):  # before numpy's fixed-width strings drop a trailing NUL
            if "\x00" in v:
                raise InvalidInput(f"{what}: row {i} contains a NUL byte")
        out = np.array(items, dtype=str) if items else np.zeros(0, dtype="U1")
    elif kind == "f":
        raise InvalidInput(f"{what} must be strings or integers, not floats (a float cannot "
                           "hold every 64-bit id: read ids as text)")
    else:
        raise InvalidInput(f"{what} must be strings or integers, got dtype {arr.dtype}")
    if out.size == 0:
        return out.astype(str)
    lengths = np.char.str_len(out)
    if (lengths == 0).any():
        raise InvalidInput(f"{what}: row {int(np.argmax(lengths == 0))} is an empty id")
    if lengths.max() > 200:
        raise InvalidInput(f"{what}: row {int(np.argmax(lengths > 200))} is longer than "
                           "200 characters")
    items = out.tolist()
    joined = "".join(items)
    if utf8_problem(joined) is not None:
        for i, v in enumerate(items):
            problem = utf8_problem(v)
            if problem is not None:
                raise InvalidInput(f"{what}: row {i} {problem}")
    _check_spelling(items, what)
    if people and not MISSING_SPELLINGS.isdisjoint(items):
        i = next(i for i, v in enumerate(items) if v in MISSING_SPELLINGS)
        raise InvalidInput(f"{what}: row {i} is {items[i]!r}, a missing value as R, Excel or "
                           "pandas write one; every row needs its subject's id")
    # every float spelling has a point or a signed exponent: most batches have neither
    if people and ("." in joined or "e+" in joined or "e-" in joined or "E+" in joined
                   or "E-" in joined):
        check_not_float_spelled(items, what)
    return out


#: a missing id as R (``NA``), Excel (``#N/A``), SQL exports (``NULL``), pyarrow's null
#: spellings and pandas' ``astype(str)`` (``nan``, ``None``, ``<NA>``) write it: one subject
#: for every row without an id, charged in no person's name (red team 26, newcomer F2)
MISSING_SPELLINGS = frozenset({
    "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null", "None", "<NA>"})

#: an id that is a number as programs write floats: integer-valued with a fraction of zeros
#: ("7.0", "7.") or in exponent notation with a fraction ("1.2345678901234568e+18", Excel's
#: "1.23457E+18", Java's and Spark's "1.0E7") or a sign ("1e+18"); a hexadecimal id ("00e5",
#: "1e18") has neither and is not one
_FLOAT_SPELLING = re.compile(r"[+-]?(?:\d+\.0*|\d\.\d+[eE][+-]?\d+|\d[eE][+-]\d+)")


def check_not_float_spelled(ids: list[str], what: str) -> None:
    """Refuse people's ids (:func:`id_strings` with ``people``) that spell a number as a
    float: ``"7.0"``, ``"1.2345678901234568e+18"`` — what pandas writes for an integer column
    with a missing value, and its ``astype(str)`` gives. Such an id is another id than
    ``"7"`` (one person with two per-subject budgets: red team 14 for files; red team 22,
    flows F2, for a plain list of ids, the Python API and the service), and a 64-bit id that
    went through a float is already rounded; refused as float arrays are, never
    rewritten."""
    for i, v in enumerate(ids):
        c = v[:1]
        if ((c.isdigit() or c in ("+", "-")) and ("." in v or "+" in v or "-" in v)
                and _FLOAT_SPELLING.fullmatch(v) is not None):  # (every float spelling has one)
            raise InvalidInput(
                f"{what}: row {i} is {v!r:.40}, an integer written as a float (as pandas "
                "writes an integer column with a missing value); it would be another person "
                "than the integer: write the ids as text or integers")


def _check_spelling(items: list[str], what: str) -> None:
    """Refuse ids that look like another id: a blank at either end (``" 7"`` is not ``"7"``)
    or a spelling not in Unicode NFC (``"café"`` typed two ways). Never silently fixed: a
    strip or a normalisation would merge ids a caller may have meant distinct."""
    for i, v in enumerate(items):
        if v != v.strip():
            raise InvalidInput(f"{what}: row {i} is {v!r:.40}, with a blank at its start or "
                               "end; ids are kept as written, so it would be another person "
                               "than the id without it: remove the blanks (e.g. write the "
                               "CSV with ',' separators, not ', ')")
    # invisible or blank characters anywhere (U+200B, U+FEFF, U+2060, a soft hyphen, NBSP,
    # a tab, a line separator: Unicode's non-printable categories but the ASCII space;
    # and the printable ones that render as nothing, errors.READS_AS_NOTHING): "alice\u200b"
    # (red team 6) and "alice\ufe0f" (red team 10) read as "alice" and were other people
    joined = "".join(items)
    if not joined.isprintable() or READS_AS_NOTHING.search(joined) is not None:
        for i, v in enumerate(items):
            bad = invisible_char(v)
            if bad is not None:
                raise InvalidInput(
                    f"{what}: row {i} is {v!r:.40}, with the invisible or blank character "
                    f"U+{ord(bad):04X} ({unicodedata.name(bad, 'unnamed')}); it would read as "
                    "another id: remove it (only the ASCII space may appear inside an id)")
    # "\n" never composes with a neighbour: the joined text is NFC iff every id is
    if not unicodedata.is_normalized("NFC", "\n".join(items)):
        for i, v in enumerate(items):
            if not unicodedata.is_normalized("NFC", v):
                raise InvalidInput(f"{what}: row {i} is {v!r:.40}, not in Unicode NFC; the "
                                   "same text in another normalisation would be another "
                                   "person: normalise the ids to NFC "
                                   "(unicodedata.normalize('NFC', id)) first")


def agent_index(agents: object) -> tuple[np.ndarray, np.ndarray]:
    """(distinct agent ids, the index of each row's agent) in the one agent order that
    ``DataShape.group_sizes`` and the federated calibrators share: ids as strings, sorted."""
    distinct, inverse = np.unique(id_strings(agents), return_inverse=True)
    return distinct, inverse.reshape(-1)


def group_sizes(agents: object) -> tuple[int, ...]:
    """How many rows each agent holds, in :func:`agent_index` order."""
    distinct, inverse = agent_index(agents)
    return tuple(int(c) for c in np.bincount(inverse, minlength=distinct.size))

