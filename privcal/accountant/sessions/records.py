"""What the session calls return (pydantic records) and the stable strings they carry.

Every record is serializable as is: the CLI prints it, the HTTP service returns it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from privcal.errors import PrivcalError
from privcal.storage.records import UTCDateTime

__all__ = [
    "METHODS",
    "REPORTS_ARE",
    "Method",
    "SessionInfo",
    "SubmitResult",
    "TokensNotInForce",
]

METHODS = ("ldp-score", "fedcp2-qq", "fedcp-qq")
Method = Literal["ldp-score", "fedcp2-qq", "fedcp-qq"]

# rejection reasons (stable strings: clients may match on them)
MALFORMED_BIT = "malformed bit"
MALFORMED_VALUE = "malformed value"
OFF_GRID = "value off the published grid"
MALFORMED_ROUND = "malformed round"
CLOSED_ROUND = "closed round"
FUTURE_ROUND = "round not open"
ALREADY = "subject already reported in this session"
DUPLICATE = "duplicate subject in batch"
OVER_CAP = "subject budget exhausted"
ROUND_FULL = "round full"
EXTRA_AGENT = "all agents have answered (extra agent beyond m)"
RESERVED = "the free slots are kept for the agents holding agent tokens (agent beyond m)"
LATE = "late: session is {status}"


class TokensNotInForce(PrivcalError):
    """A batch given the service tokens it was sent under (``submit_reports(tokens=…)``) of
    which ``tokens`` were not in force — revoked, expired, or not bound to its session —
    when its write transaction had locked the session: nothing was written, nothing charged
    (red team 21, flows M2). The service answers their reports 401 and writes the others."""

    def __init__(self, tokens: set[str]) -> None:
        super().__init__(f"{len(tokens)} token(s) of the batch are no longer in force: "
                         "nothing was written")
        self.tokens = frozenset(tokens)


class SessionInfo(BaseModel):
    """A session's public state: what ``session status`` shows and every call returns."""

    model_config = ConfigDict(frozen=True)

    id: int
    dataset: str
    method: str
    status: str
    shuffled: bool
    requester: str | None
    params: dict[str, Any]
    created_at: UTCDateTime
    updated_at: UTCDateTime
    round: int
    rounds: int
    received: int
    needed: int
    total_reports: int
    interval: tuple[float, float] | None = None
    query: float | None = None
    plan: dict[str, Any] | None = None
    grid: dict[str, Any] | None = None
    release_id: int | None = None
    threshold: float | None = None
    central_charge_id: int | None = None
    #: what the stored reports are (FedCP-QQ: raw order statistics — not private)
    reports_are: str = ""
    #: the score the devices or agents compute (``{"name", "options"}``, as in
    #: ``params["score"]``), recorded in the release; None when the session was opened
    #: without one (its release then needs ``--score`` at predict)
    score: dict[str, Any] | None = None
    #: ldp-score: no round of the session's group size can pass its cut-off, so every release
    #: is +∞ whatever the reports (each accepted report still charges its subject ε); said
    #: from the open on (red team 23, fedlocal F1). False for the federated methods
    trivial: bool = False


#: what ``session_reports.value`` holds, per method (issue 16 item 6: said in every record)
REPORTS_ARE = {
    "ldp-score": "randomized bits (each ε-local DP for its subject)",
    "fedcp2-qq": "grid points (each ε-DP for its agent's data)",
    "fedcp-qq": "each agent's raw order statistic of its own scores (not private: stored as "
                "received, and revealed by the release)",
}


class SubmitResult(BaseModel):
    """The outcome of one batch: counts per rejection reason, never subject ids."""

    model_config = ConfigDict(frozen=True)

    session_id: int
    batch_round: int
    accepted: int
    rejected: int
    reasons: dict[str, int]
    charge_id: int | None
    epsilon: str | None
    advanced: bool
    session: SessionInfo
    replayed: bool = False
    #: the session batch number that stored this batch's accepted reports (each stored
    #: report records its batch; a replay says the original's); None when none was accepted
    batch: int | None = None
