"""A release saved as JSON and loaded back, to serve a model without the ledger.

``Release.model_dump_json()`` writes every field of the stored release (threshold, score,
class names, parameters, coverage and privacy guarantees); ±∞ are written as the JSON
constants ``Infinity``/``-Infinity`` so that a +∞ threshold stays +∞ (never ``null``, never
a finite number). :func:`load_release` reads it back into a
:class:`~privcal.accountant.Release` whose prediction sets and intervals are identical.

A loaded release is a copy, and nothing is charged by using it. It is not checked against
the ledger it came from: a file edited by hand consistently (another threshold, another
order of the class names) loads as that edited release. What :func:`load_release` checks
is the file's internal consistency (:func:`consistency_problems`): no NaN threshold, the
class names distinct and one per probability column, the coverage guarantee and the
privacy record the ones the installed calibrator computes for the recorded parameters and
data shape (as ``privcal audit verify`` recomputes them; the privacy record at the
reporting δ it states, a release's only input from its dataset), a several-level or
Mondrian release's stored thresholds one per level and group as its wrapper records them,
and a threshold its own diagnostics give (P-COQS, ExponQ, FedCP²-QQ, each run of a wrapper
of them: :mod:`privcal.calibrators.threshold_records`; red team 16, F6).
To check a copy against the ledger, compare it with the ledger's record of the same id:
``acct.release(saved.id) == saved`` in Python (the record ``privcal release show ID
--json`` and ``GET /v1/releases/{id}`` print), and ``privcal audit verify`` for the
ledger's records themselves.
"""

from __future__ import annotations

import math
import os
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from privcal.errors import InvalidInput, first_error

__all__ = ["consistency_problems", "load_release"]

M = TypeVar("M", bound=BaseModel)


def load_release(cls: type[M], source: str | bytes | os.PathLike[str]) -> M:
    """A release from a JSON document or the path of a file holding one.

    A string starting with ``{`` is read as the document itself; any other string or path
    names a file. Errors are one-line :class:`~privcal.errors.InvalidInput`, also for a
    document that is not internally consistent (:func:`consistency_problems`; the module
    docstring says what is not checked: a copy is not compared with the ledger).
    """
    if isinstance(source, bytes):
        text = source.decode("utf-8", errors="replace")
        where = "the JSON given"
    elif isinstance(source, str) and source.lstrip().startswith("{"):
        text, where = source, "the JSON given"
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInput(f"no release file {str(path)!r:.200}") from None
        except (OSError, UnicodeError, ValueError) as exc:  # a NUL or lone surrogate in it
            raise InvalidInput(f"cannot read the release file {str(path)!r:.200}: {exc}"
                               ) from None
    else:
        raise InvalidInput("Release.load takes a JSON string or a file path, got "
                           f"{type(source).__name__}")
    try:
        rel = cls.model_validate_json(text)
    except ValidationError as exc:
        loc, msg, _ = first_error(exc)
        raise InvalidInput(f"{where} is not a saved release ({loc or 'document'}: {msg})"
                           ) from None
    problems = consistency_problems(rel)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidInput(f"{where} is not a consistent saved release: {problems[0]}{more}"
                           " (edited by hand? load the release from its ledger instead)")
    return rel


def _nan_thresholds(node: Any, where: str = "diagnostics") -> list[str]:
    """Every NaN under a ``threshold``/``threshold_raw`` key of the stored diagnostics."""
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}"
            if key in ("threshold", "threshold_raw") and isinstance(value, float) \
                    and math.isnan(value):
                out.append(f"{here} is NaN")
            else:
                out += _nan_thresholds(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _nan_thresholds(value, f"{where}[{i}]")
    return out


def consistency_problems(rel: Any) -> list[str]:
    """Why release ``rel`` (a :class:`~privcal.accountant.Release` read from a file) is not
    one privcal could have recorded, as far as can be told without its ledger: a NaN
    threshold; class names that are not distinct strings, one per probability column (the
    shape's k); a coverage guarantee or a privacy record other than the one the installed
    calibrator computes for its parameters and shape (numbers and, for the installed
    version, sentences: :func:`_privacy_problems`); a wrapper's stored thresholds not one
    per level and group (its ``check_record``); a version of an installed method that the
    installed code does not know. A method not installed here, or another package's method
    of that name, leaves the guarantees unchecked."""
    from privcal.accountant.record_compare import coverage_as_recorded, plain, same
    from privcal.calibrators import registry
    from privcal.calibrators.threshold_records import threshold_problems
    from privcal.errors import PrivcalError

    out: list[str] = []
    if math.isnan(rel.threshold):
        out.append("threshold is NaN")
    diag = rel.diagnostics or {}
    out += _nan_thresholds(diag)
    k = (rel.shape or {}).get("k")
    for key in ("classes", "columns"):  # the names predict matches a table's columns to
        names = diag.get(key)
        if names is None:
            continue
        what = "class" if key == "classes" else "column"
        if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
            out.append(f"diagnostics.{key} is not a list of {what} names")
        elif len(set(names)) != len(names):
            out.append(f"diagnostics.{key} names a {what} twice")
        elif isinstance(k, int) and len(names) != k:
            out.append(f"diagnostics.{key} names {len(names)} {key}, but the release was "
                       f"calibrated on k = {k} probability columns")
    if diag.get("columns") is not None and diag.get("classes") is not None:
        out.append("diagnostics.columns and diagnostics.classes: one names the columns")
    try:
        reg = registry.get(rel.method)
    except PrivcalError:
        return out  # a method not installed here: its guarantee cannot be recomputed
    cal = reg.calibrator
    legacy = getattr(cal, "legacy_params", {}).get(rel.calibrator_version)
    # privcal's own methods (wrapped or not) cannot be shadowed by a plugin (registry), so
    # a file naming one can be checked whatever its labels say (red team 14: an edited
    # coverage loaded once the version, the method's name or the distribution was changed)
    own = rel.method.rsplit(":", 1)[-1] in registry.BUILTINS
    if rel.distribution != reg.distribution:
        if own:
            return [*out, f"{rel.method} is privcal's own method, but the file says "
                          f"{rel.distribution!r:.40} made it"]
        return out  # another package's method of that name: its guarantee is its own
    if rel.calibrator_version != cal.version and legacy is None:
        if not own:  # a plugin's version its installed release does not declare
            return out
        return [*out, f"{rel.method} version {rel.calibrator_version!r:.40} is not one this "
                      f"privcal knows (installed {cal.version}): its guarantees cannot be "
                      "recomputed; load it with the privcal that made it"]
    try:
        params, shape, new = coverage_as_recorded(cal, rel)
    except (PrivcalError, ValidationError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [*out, f"its guarantee cannot be recomputed from its parameters and shape: "
                      f"{text}"]
    recorded = plain(rel.coverage.model_dump(mode="json"))
    recomputed = plain(new.model_dump(mode="json"))
    # every sentence too, an older version's as that version worded it: a file has no
    # ledger vouching for it, so wording this privcal does not reproduce is refused, never
    # counted as "not compared" as `audit verify` counts a ledger's own old records (red
    # team 14: relabelled as the previous version, any sentence loaded)
    for key in sorted(set(recorded) | set(recomputed)):
        if not same(recorded.get(key), recomputed.get(key)):
            out.append(f"coverage.{key}: recorded {recorded.get(key)!r:.120}, recomputed "
                       f"{recomputed.get(key)!r:.120}")
    if hasattr(cal, "check_record"):  # a levels/Mondrian wrapper: its stored thresholds
        try:
            out += cal.check_record(params, shape, rel.threshold, diag)
        except (PrivcalError, AttributeError, KeyError, TypeError, ValueError):
            out.append("diagnostics: not the per-level or per-group thresholds its method "
                       "records")
    try:  # a threshold its own diagnostics contradict (red team 16: P-COQS, ExponQ edited)
        out += threshold_problems(cal, params, shape, rel.threshold, diag)
    except (PrivcalError, ValidationError, AttributeError, KeyError, TypeError, ValueError,
            ArithmeticError):
        out.append("threshold: its diagnostics are not what its method records")
    return out + _privacy_problems(cal, rel)


def _privacy_problems(cal: Any, rel: Any) -> list[str]:
    """The privacy record against the one the installed code derives from the recorded
    parameters and shape (cost, ε, δ, rule, statement; a shuffled record's amplification),
    as ``audit verify`` recomputes it, at the reporting δ the record itself states — a
    release's only input from its dataset (red team 14: a copy whose ε was cut from 2.14 to
    0.1, or whose cost contradicted its ρ, loaded)."""
    from privcal.accountant.record_compare import plain
    from privcal.accountant.verification import privacy_problems, recompute
    from privcal.errors import PrivcalError

    recorded = plain(rel.privacy or {})
    extra = recorded.get("extra") if isinstance(recorded.get("extra"), dict) else {}
    amp = extra.get("amplification") or {}
    stated = amp.get("delta") if isinstance(amp, dict) else None
    if stated is None and recorded.get("model") == "central":
        stated = recorded.get("delta")
    try:
        delta = Decimal(str(stated)) if stated is not None else Decimal("1e-6")
    except ArithmeticError:
        return [f"privacy: its δ {stated!r:.60} is not a number"]
    # the dataset's notion matters only to a shuffled release's central charge, and a
    # shuffled run exists only on an (ε, δ) cap (amplification.check_shuffled_dataset): its
    # central charge cannot be dropped from a copy
    shuffled = "central_cost" in recorded or bool(extra.get("shuffled"))
    ds = SimpleNamespace(reporting_delta=delta, notion="approx" if shuffled else None)
    try:
        _, _, recomputed = recompute(rel, ds)
    except (PrivcalError, ValidationError, ArithmeticError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [f"its privacy record cannot be recomputed from its parameters and shape: "
                f"{text}"]
    problems, _ = privacy_problems(cal, rel, recorded, recomputed, lenient=False)
    return problems
