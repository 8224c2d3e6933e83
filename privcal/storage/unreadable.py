"""Stored values of the wrong form, read while verifying the ledger: an edit like any other.

An operator who edits a row outside privcal may leave a value no privcal wrote — an amount
``sNaN``, JSON that is not, a timestamp that is not ISO, text that is not UTF-8. Reading it
raises a Python or driver error; :func:`unreadable` turns it into the
:class:`~privcal.errors.AuditFailed` of any other edit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import OperationalError

from privcal.errors import AuditFailed, PrivcalError

__all__ = ["unreadable"]


@contextmanager
def unreadable(where: str) -> Iterator[None]:
    """A stored value of the wrong form — an amount 'sNaN' or 'abc', JSON that is not (or
    nested past the recursion limit), a timestamp that is not ISO, text that is not UTF-8, a
    head seq that is text: edited outside privcal — as the AuditFailed (exit 4,
    ``ok: false``) of any other edit, naming ``where``, not a traceback or a 500 (red team
    20, service F2). A privcal error passes through as itself, and so does a database that
    cannot be reached. Only around the reading of rows: a caller's wrong argument is the
    caller's error, never an edited row (the review of red team 20)."""
    try:
        yield
    except PrivcalError:
        raise  # InvalidInput is a ValueError; an AuditFailed says its own
    except (ValueError, TypeError, ArithmeticError, KeyError, RecursionError) as exc:
        raise AuditFailed(f"{where}: a stored value privcal cannot read (a row edited outside "
                          f"privcal): {type(exc).__name__}: {_first_line(exc)}") from None
    except OperationalError as exc:
        if "decode" not in str(exc.orig).lower():  # SQLite: "Could not decode to UTF-8 …"
            raise
        raise AuditFailed(f"{where}: a stored text that is not UTF-8 (a row edited outside "
                          f"privcal): {_first_line(exc.orig)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]
