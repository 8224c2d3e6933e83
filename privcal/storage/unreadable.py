"""Stored values of the wrong form, read while verifying the ledger: an edit like any other.

An operator who edits a row outside privcal may leave a value no privcal wrote — an amount
``sNaN``, JSON that is not, a timestamp that is not ISO, text that is not UTF-8. Reading it
raises a Python or driver error; :func:`unreadable` turns it into the
:class:`~privcal.errors.AuditFailed` of any other edit, naming the row when it can
(:func:`first_unreadable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from privcal.errors import AuditFailed, PrivcalError

__all__ = ["first_unreadable", "unreadable"]

_READ_ERRORS = (ValueError, TypeError, ArithmeticError, KeyError, RecursionError)


@contextmanager
def unreadable(where: str, locate: Callable[[], str | None] | None = None) -> Iterator[None]:
    """A stored value of the wrong form — an amount 'sNaN' or 'abc', JSON that is not (or
    nested past the recursion limit), a timestamp that is not ISO, text that is not UTF-8, a
    head seq that is text: edited outside privcal — as the AuditFailed (exit 4,
    ``ok: false``) of any other edit, naming ``where``, not a traceback or a 500 (red team
    20, service F2). A privcal error passes through as itself, and so does a database that
    cannot be reached. Only around the reading of rows: a caller's wrong argument is the
    caller's error, never an edited row (the review of red team 20). ``locate``, called
    only then, names the row instead of ``where`` if it finds it (:func:`first_unreadable`:
    an auditor is told which row to look at, not "the log or its rows")."""
    try:
        yield
    except PrivcalError:
        raise  # InvalidInput is a ValueError; an AuditFailed says its own
    except _READ_ERRORS as exc:
        raise AuditFailed(f"{_where(where, locate)}: a stored value privcal cannot read (a row "
                          f"edited outside privcal): {type(exc).__name__}: "
                          f"{_first_line(exc)}") from None
    except OperationalError as exc:
        if not _undecodable(exc):
            raise
        raise AuditFailed(f"{_where(where, locate)}: a stored text that is not UTF-8 (a row "
                          f"edited outside privcal): {_first_line(exc.orig)}") from None


def first_unreadable(read: Callable[[], AbstractContextManager[Session]],
                     models: Sequence[Any], chunk: int = 1024) -> str | None:
    """The first row of ``models`` (mapped classes, in order) that cannot be loaded —
    ``"charges row 7"`` — or None if every row loads (the value was unreadable only to a
    later check). Each table's keys are read first, then its rows ``chunk`` keys at a time,
    a failing chunk halved down to its row, each attempt in a new session of ``read`` (a
    failed statement may end a PostgreSQL transaction). Only on the failure path."""
    for model in models:
        table = model.__table__
        keys = list(table.primary_key.columns)
        try:
            with read() as s:
                ids = [tuple(r) for r in s.execute(select(*keys).order_by(*keys))]
        except (*_READ_ERRORS, OperationalError):
            return f"{table.name} (its keys)"
        for start in range(0, len(ids), chunk):
            bad = _first_bad(read, model, keys, ids[start:start + chunk])
            if bad is not None:
                shown = bad[0] if len(bad) == 1 else bad
                return f"{table.name} row {shown}" if table.name != "audit_log" else (
                    f"audit entry {shown}")
    return None


def _first_bad(read: Callable[[], AbstractContextManager[Session]], model: Any,
               keys: list[Any], ids: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    if not ids:
        return None
    try:
        with read() as s:
            s.scalars(select(model).where(tuple_(*keys).in_(ids))).all()
        return None
    except (*_READ_ERRORS, OperationalError) as exc:
        if isinstance(exc, OperationalError) and not _undecodable(exc):
            raise
    if len(ids) == 1:
        return ids[0]
    half = len(ids) // 2
    bad = _first_bad(read, model, keys, ids[:half])
    return bad if bad is not None else _first_bad(read, model, keys, ids[half:])


def _where(where: str, locate: Callable[[], str | None] | None) -> str:
    if locate is None:
        return where
    try:
        return locate() or where
    except Exception:  # naming the row is a courtesy: the failure is reported regardless
        return where


def _undecodable(exc: OperationalError) -> bool:
    return "decode" in str(exc.orig).lower()  # SQLite: "Could not decode to UTF-8 …"


def _first_line(exc: BaseException) -> str:
    if type(exc).__name__ == "InvalidOperation" and str(exc).startswith("[<class"):
        return "not a decimal number"  # Decimal('sNaN') compared, Decimal('abc')
    return (str(exc).splitlines() or [""])[0][:200]
