"""The body of ``POST /v1/datasets/{name}/calibrations``: a JSON document, or a multipart
form whose files are read exactly as the CLI reads its table inputs.

- ``application/json``: :class:`CalibrationBody` with the data as JSON arrays.
- ``multipart/form-data``: a ``request`` field holding the same JSON document (without
  the arrays), and the data as files named as the arrays (:data:`FILE_PARTS`: ``scores``,
  ``probs``, ``labels``, ``subjects``, ``agents``, ``preds``, ``lower_preds``,
  ``upper_preds``, ``targets``, ``groups``; ``.npy``, ``.npz``, ``.csv`` or ``.parquet``,
  told by the uploaded file name's suffix). The files are read by :func:`privcal.inputs.load_array`,
  so an upload is refused with the CLI's one-line error for that file (naming the
  uploaded file, never a server path). ``columns`` and ``label_column`` are the CLI's
  ``--columns`` and ``--label-column``; ``select`` names what to read inside one file
  (the CLI's ``FILE:NAME``: ``{"scores": "score"}`` reads column ``score``). A probs
  table whose header names its columns names the classes, as on the CLI
  (:mod:`privcal.data.label_columns`): ``classes``, if given, must name the same columns.

Bodies past the service's limit are refused (413) before any of this runs. A compressed
upload (``.npz``, ``.parquet``) whose arrays would take more than :data:`EXPANDED_LIMIT`
bytes once decompressed is refused (422) before it is read: a 16 MB ``.npz`` of deflated
zeros is 16 GB of floats, which would exhaust the server's memory, and a 48 KiB parquet
column of one long string, dictionary-encoded, is gigabytes of text once decoded (its text
is counted from the dictionary and the row indices, never expanded). A CSV upload counts
:data:`CSV_COLUMN_COST` bytes per column of its first line besides its own size (at most
``EXPANDED_LIMIT // CSV_COLUMN_COST`` columns, fewer with the text) and is refused (422)
before it is read past that: pyarrow's CSV reader holds about 10 KiB per column whatever
the rows, and an 8 MiB line of ``0,0,0,…`` (4 million columns) grew the server past 10 GB
(red team 25, service F2).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from privcal.accountant.calibration_request import (
    ARRAYS,
    INPUTS,
    CalibrationRequest,
    as_invalid_input,
)
from privcal.errors import InvalidInput
from privcal.service.calibration_json import as_array
from privcal.service.json_body import check_unique_keys, is_json_type
from privcal.service.problems import unsupported_media_type

__all__ = ["EXPANDED_LIMIT", "FILE_PARTS", "CalibrationBody", "CalibrationInput",
           "calibration_input", "request_body_openapi"]

#: the data a calibration takes, as JSON arrays or as uploaded files
FILE_PARTS = ARRAYS
_MAX = 5_000_000
#: the most bytes one request's compressed uploads may expand to (a ``.npz``'s members as
#: declared; a ``.parquet``'s uncompressed row groups, or 8 bytes a value if more, plus the
#: text its text columns decode to, dictionaries counted per row) — 1 GiB, 5 million rows
#: of 25 float64 columns
EXPANDED_LIMIT = 1 << 30
#: bytes counted per column of an uploaded CSV (pyarrow's reader holds ≈ 10 KiB a column
#: whatever the rows: 100 000 columns of one row took 1.1 GB and 6 s): at most
#: ``EXPANDED_LIMIT // CSV_COLUMN_COST`` = 65 536 columns (more: send .npy or .parquet)
CSV_COLUMN_COST = 16 * 1024
#: the most arrays an uploaded ``.npz`` may hold (a calibration reads one a part; ``np.load``
#: reads them all: 70 000 empty ones took 7.5 s — red team 25, service F4)
NPZ_MAX_MEMBERS = 1000

#: a list that stops at its first invalid item: a 422 names one, and one error per item
#: was built, converted and sent for every item of a 16 MB body, on the event loop (red team
#: 24, service F2: 1 MB of ``[]`` scores held every request 24 s for a 30 MB answer)
_FIRST = Field(fail_fast=True)
_Floats = Annotated[list[float], _FIRST]
_Ids = Annotated[list[str | int], _FIRST]


class CalibrationBody(CalibrationRequest):
    """A calibration: the library's :class:`CalibrationRequest` — method, parameters, the data
    (JSON arrays, or uploaded files) and the options — with JSON types, and the options that
    select inside uploaded files."""

    model_config = ConfigDict(strict=True, extra="forbid")

    method: str = Field(min_length=1, max_length=100, description="a registered calibrator")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the method's parameters; `alpha` may be a list of "
        "levels (one threshold each, the costs add up)")
    scores: _Floats | None = Field(default=None, max_length=_MAX)
    probs: Annotated[list[_Floats], _FIRST] | None = Field(default=None, max_length=_MAX)
    labels: Annotated[list[int], _FIRST] | Annotated[list[str], _FIRST] | None = Field(
        default=None, max_length=_MAX,
        description="class indices, or class names (with `classes`; a non-private method "
        "may instead have all k present)")
    classes: Annotated[list[str], _FIRST] | None = Field(
        default=None, min_length=2, max_length=100_000,
        description="the class names of the probability columns, in column order")
    subjects: _Ids | None = Field(default=None, max_length=_MAX)
    agents: _Ids | None = Field(default=None, max_length=_MAX)
    preds: _Floats | None = Field(
        default=None, max_length=_MAX, description="regression predictions f(x) (score absolute)")
    lower_preds: _Floats | None = Field(
        default=None, max_length=_MAX, description="lower quantile predictions (score cqr)")
    upper_preds: _Floats | None = Field(
        default=None, max_length=_MAX, description="upper quantile predictions (score cqr)")
    targets: _Floats | None = Field(
        default=None, max_length=_MAX, description="true regression targets y")
    groups: _Ids | None = Field(
        default=None, max_length=_MAX, description="the Mondrian group of every row (a public "
        "column; needs public_groups)")
    score: str | None = Field(default=None, max_length=100, description="lac, aps, raps "
                              "(probabilities) or absolute, cqr (regression); with `scores`, "
                              "the score they were computed with (recorded, with "
                              "`score_options`)")
    score_options: dict[str, bool | int | float | str] | None = Field(default=None,
                                                                      max_length=50)
    score_range: tuple[float, float] | None = Field(
        default=None, description="the public score range [lo, hi] of a method that bins or "
        "searches the score axis (pcoqs, exponq, fedcp2-qq, ldp-score); recorded")
    mondrian: Literal["label", "column"] | None = Field(
        default=None, description="one threshold per class (label) or per group of `groups` "
        "(column), charged once; needs public_groups")
    columns: str | None = Field(default=None, max_length=10_000,
                                description="uploads: the probability columns of `probs`")
    label_column: str | None = Field(default=None, max_length=1_000,
                                     description="uploads: the label column of `labels`, "
                                                 "or of the `probs` table")
    select: dict[str, str] | None = Field(default=None, max_length=len(FILE_PARTS),
                                          description="uploads: part → array or column")

    def request(self, arrays: dict[str, Any]) -> CalibrationRequest:
        """The library's request, with the arrays read from the body or the files."""
        return CalibrationRequest.checked({"method": self.method, "params": self.params,
                                           **{k: getattr(self, k) for k in INPUTS},
                                           **arrays})


@dataclass
class CalibrationInput:
    """A parsed calibration request: its options and, for an upload, its files' bytes."""

    body: CalibrationBody
    files: dict[str, tuple[str, bytes]]  # part → (uploaded file name, content)


def _invalid(exc: ValidationError, where: str) -> Exception:
    """The library's one-line InvalidInput where a check of :class:`CalibrationRequest` failed
    (the CLI's message), else the field's validation error."""
    first = exc.errors(include_input=False)[0]
    if isinstance((first.get("ctx") or {}).get("error"), InvalidInput):
        return as_invalid_input(exc)
    return RequestValidationError([{**e, "loc": (where, *e.get("loc", ()))}
                                   for e in exc.errors(include_input=False)])


async def calibration_input(request: Request) -> CalibrationInput:
    """The calibration request, from a JSON body or a multipart form (a dependency)."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() == "multipart/form-data":
        return await _from_form(request)
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone mid-body (or cut by the body timer): one line, not an
        # "Exception in ASGI application" traceback in the log (red team 21, service F4)
        raise InvalidInput("the request body was cut off: the client disconnected") from None
    if raw and not is_json_type(ctype):  # as every JSON route: 415 (no type: 415 too)
        raise unsupported_media_type("application/json or multipart/form-data")
    import anyio

    from privcal.service.calibration_json import validate_calibration_json

    def parse() -> CalibrationBody:  # in a worker thread, long arrays in pieces (red team 26, F3)
        check_unique_keys(raw)
        return validate_calibration_json(CalibrationBody, raw, _invalid)  # type: ignore[no-any-return]

    return CalibrationInput(await anyio.to_thread.run_sync(parse), {})


async def _from_form(request: Request) -> CalibrationInput:
    try:
        form = await request.form(max_files=len(FILE_PARTS), max_fields=len(FILE_PARTS) + 1)
    except Exception as exc:  # a malformed multipart body
        first = (str(getattr(exc, "detail", exc)) or type(exc).__name__).splitlines()[0]
        raise InvalidInput(f"malformed multipart body: {first}") from None
    try:
        files: dict[str, tuple[str, bytes]] = {}
        text: str | None = None
        for key, value in form.multi_items():
            if key == "request" and isinstance(value, str) and text is None:
                text = value
            elif key in FILE_PARTS and not isinstance(value, str) and key not in files:
                name = Path(value.filename or "").name
                files[key] = (name, await value.read())
            else:
                raise InvalidInput(
                    f"unexpected form part {key[:60]!r}: send one 'request' field (the JSON "
                    f"options) and files named {', '.join(FILE_PARTS)}")
    finally:
        await form.close()
    if text is None:
        raise InvalidInput("the form has no 'request' field (the JSON options: method, params…)")
    check_unique_keys(text, "request")
    try:
        body = CalibrationBody.model_validate_json(text)
    except ValidationError as exc:
        raise _invalid(exc, "request") from None
    for part in files:
        if getattr(body, part) is not None:
            raise InvalidInput(f"{part} given twice: as a JSON array and as a file")
    return CalibrationInput(body, files)


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def load_arrays(inp: CalibrationInput, *, shape_only: bool) -> dict[str, Any]:
    """The arrays and class names of the request (files read like the CLI reads them).

    With ``shape_only`` (a dry run) only shapes are read — except, as in the CLI, the labels
    of a label-Mondrian request and a group column: their group sizes set the cost."""
    body = inp.body

    def arr(v: Any, dtype: Any = None) -> Any:
        return None if v is None else as_array(v, dtype)  # in pieces (red team 26, F3)

    if body.probs is not None and len({len(r) for r in body.probs}) > 1:  # before asarray
        raise InvalidInput("probs must be a matrix: every row the same length")
    out: dict[str, Any] = {
        **{part: arr(getattr(body, part), float) for part in _FLOATS},
        "labels": arr(body.labels), "classes": body.classes,
        **{part: arr(getattr(body, part), object) for part in _IDS}}
    if not inp.files:
        for opt in ("columns", "label_column", "select"):
            if getattr(body, opt) is not None:
                raise InvalidInput(f"{opt} selects inside uploaded files; this request has none")
        return out
    with tempfile.TemporaryDirectory(prefix="privcal-upload-") as tmp:
        try:
            return _load_files(inp, Path(tmp), out, shape_only)
        except InvalidInput as exc:  # the CLI's message, naming the uploaded file
            shown = re.sub(re.escape(tmp) + r"/(?:" + "|".join(FILE_PARTS) + r")/", "",
                           str(exc)).replace(tmp, "")
            raise InvalidInput(shown) from None


#: the parts read as numbers, and as ids (text: subjects, agents, groups)
_FLOATS = ("scores", "probs", "preds", "lower_preds", "upper_preds", "targets")
_IDS = ("subjects", "agents", "groups")


def _load_files(inp: CalibrationInput, tmp: Path, out: dict[str, Any],
                shape_only: bool) -> dict[str, Any]:
    from privcal.data.files import SUFFIXES, load_array
    from privcal.data.label_columns import header_classes, header_names, read_labels

    body = inp.body
    select = dict(body.select or {})
    if unknown := set(select) - set(inp.files):
        raise InvalidInput(f"select names {sorted(unknown)[0]!r}, which is not an uploaded file")
    specs: dict[str, str] = {}
    expanded = 0
    for part, (name, content) in inp.files.items():
        suffix = Path(name).suffix.lower()
        if suffix not in SUFFIXES:
            raise InvalidInput(f"{part}: unsupported file type {suffix or name!r:.40} "
                               f"(use {', '.join(SUFFIXES)})")
        shown = (_SAFE.sub("_", Path(name).stem)[:80] or part) + suffix
        (tmp / part).mkdir()
        path = tmp / part / shown
        path.write_bytes(content)
        expanded += _expanded_size(path, EXPANDED_LIMIT - expanded)
        if expanded > EXPANDED_LIMIT and suffix == ".csv":
            raise InvalidInput(f"{shown}: {_csv_columns(path)} columns: the uploaded files take "
                               f"more than {EXPANDED_LIMIT} bytes once read (the service's "
                               f"limit; its CSV reader holds {CSV_COLUMN_COST} bytes per "
                               "column besides the text): send a wide table as .npy or "
                               ".parquet, or fewer rows")
        if expanded > EXPANDED_LIMIT:
            raise InvalidInput(f"{shown}: the uploaded files expand to more than "
                               f"{EXPANDED_LIMIT} bytes once decompressed (the service's "
                               "limit); send fewer rows or uncompressed files")
        specs[part] = str(path) + (f":{select[part]}" if part in select else "")
    if body.columns is not None and "probs" not in specs:
        raise InvalidInput("columns selects the probability columns of the probs file")
    lc = body.label_column
    exclude = (lc,) if lc else ()
    for part in (*_FLOATS, *_IDS):
        if part in specs and part != "probs":
            # groups are read whole even in a dry run: their sizes set the cost
            out[part] = load_array(specs[part], part, shape_only=shape_only and part != "groups",
                                   ids=part in _IDS)
    names = None
    if "probs" in specs:
        out["probs"] = load_array(specs["probs"], "probs", matrix=True, columns=body.columns,
                                  exclude=exclude, shape_only=shape_only)
        names = header_names(specs["probs"], body.columns, lc)
    # label groups (mondrian label) are read even in a dry run: they set the cost
    labels_shape_only = shape_only and body.mondrian != "label"
    if lc is not None:
        source = specs.get("labels") or specs.get("probs")
        if source is None or "labels" in select or ("labels" not in specs and "probs" in select):
            raise InvalidInput("label_column names a column of the labels file or of the "
                               "probs table (and no select for it)")
        out["labels"] = read_labels(f"{source}:{lc}", names, shape_only=labels_shape_only)
    elif "labels" in specs:
        out["labels"] = read_labels(specs["labels"], names, shape_only=labels_shape_only)
    # a header naming the probability columns names the classes, as the CLI's --probs:
    # `classes` must name the same columns (their order is recorded), name labels match it
    # (read label groups as the run reads them: red team 20, coverage F3)
    out["classes"], labels = header_classes(
        names, out["classes"], None if labels_shape_only else out["labels"],
        f"probs {specs.get('probs')}")
    if out["classes"] is None and names is not None:  # matched by name at predict (red team 16)
        out["column_names"] = names
    if not labels_shape_only:
        out["labels"] = labels
    return out


def _expanded_size(path: Path, budget: int | None = None) -> int:
    """The bytes ``path`` expands to once decoded (its own size if not compressed): a
    ``.npz``'s members as its directory declares them (at most :data:`NPZ_MAX_MEMBERS`
    of them, else InvalidInput); a ``.parquet``'s as bounded by
    :func:`~privcal.service.upload_limits.parquet_decoded_size` (its footer, and the text
    its text columns refer to, counted without decoding them), past ``budget`` (default
    :data:`EXPANDED_LIMIT`) as soon as known; a ``.csv``'s size and
    :data:`CSV_COLUMN_COST` per column of its first line. A file that is not a zip / parquet
    file is left to the reader's error."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            import zipfile

            with zipfile.ZipFile(path) as z:
                members = z.infolist()
            if len(members) > NPZ_MAX_MEMBERS:
                raise InvalidInput(f"{path.name}: {len(members)} arrays; the service reads an "
                                   f".npz of at most {NPZ_MAX_MEMBERS} (a calibration reads "
                                   "one a part)")
            return sum(i.file_size for i in members)
        if suffix == ".parquet":
            from privcal.service.upload_limits import parquet_decoded_size

            return parquet_decoded_size(path, EXPANDED_LIMIT if budget is None else budget)
    except InvalidInput:
        raise  # too many arrays, or a parquet file whose text columns cannot be counted
    except Exception:  # not a zip / parquet file: load_array says so, naming it
        return path.stat().st_size
    if suffix == ".csv":  # the reader's memory per column (CSV_COLUMN_COST), besides the text
        return path.stat().st_size + _csv_columns(path) * CSV_COLUMN_COST
    return path.stat().st_size


def _csv_columns(path: Path) -> int:
    """An upper bound on the columns of a CSV file, as its reader will make them: one more
    than the commas of its first line that is not blank (a quoted comma counts too), read
    as bytes — never split into cells (4 million cells are 4 million strings)."""
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                return line.count(b",") + 1
    return 0


def request_body_openapi() -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of the route: the JSON document, or the multipart form."""
    schema = CalibrationBody.model_json_schema()
    form = {"type": "object", "required": ["request"], "properties": {
        "request": {"type": "string", "description": "the JSON options (CalibrationBody "
                    "without the arrays given as files)"},
        **{p: {"type": "string", "format": "binary"} for p in FILE_PARTS}}}
    return {"required": True, "content": {
        "application/json": {"schema": schema},
        "multipart/form-data": {"schema": form}}}
