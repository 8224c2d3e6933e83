"""One exception hierarchy for privcal; every error carries the CLI exit code it maps to.

Exit codes (stable, documented in the README):
0 ok, 1 error, 2 usage, 3 budget refused, 4 audit verification failed,
5 ledger schema out of date.
"""

from __future__ import annotations


class PrivcalError(Exception):
    """Base class. ``str(err)`` is a one-line message fit for a user."""

    exit_code: int = 1


class InvalidInput(PrivcalError, ValueError):
    """A parameter or a data file is malformed (NaN, wrong shape, α outside (0, 1), ε ≤ 0, …)."""


class NotFound(PrivcalError, LookupError):
    """A named dataset, release, session or calibrator does not exist."""


class AlreadyExists(PrivcalError):
    """A dataset (or another uniquely named object) of that name exists already."""


class LedgerError(PrivcalError):
    """The ledger cannot be reached or opened (malformed URL, server down, …)."""


class BudgetRefused(PrivcalError):
    """A charge was refused: it would exceed a scope's cap, or the notions are incompatible."""

    exit_code = 3

    def __init__(
        self, message: str, *, scope: str = "", asked: str = "", remaining: str = ""
    ) -> None:
        super().__init__(message)
        self.scope = scope
        self.asked = asked
        self.remaining = remaining


class NothingAccepted(PrivcalError):
    """A batch of reports of which no row was accepted; ``details`` holds the counts
    (``accepted``, ``rejected``, ``reasons``: rows per reason, never an id)."""

    def __init__(self, message: str, *, details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.details = dict(details or {})


class AuditFailed(PrivcalError):
    """The audit log, or a recorded guarantee, does not verify."""

    exit_code = 4


class SchemaOutOfDate(PrivcalError):
    """The ledger's schema is older (or newer) than this version of privcal expects."""

    exit_code = 5


class InfeasiblePlan(InvalidInput):
    """No valid protocol plan exists for these parameters (e.g. ε too small for n)."""


class PlanRejected(InvalidInput):
    """A report or message was rejected by a collection session (closed round, duplicate, …)."""
