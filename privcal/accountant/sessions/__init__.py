"""Persistent collection sessions: LDP-CP-S (``ldp-score``), FedCP²-QQ and FedCP-QQ collected
report by report through the ledger (issues 3 and 5; SPEC §7, §9, §10).

Every operation is one call with validated inputs returning a serializable pydantic
record (the HTTP API is a thin layer, as the CLI is): :func:`open_session`,
:func:`submit_reports`, :func:`session_status`, :func:`close_session`. All state lives
in the ledger (tables: :mod:`privcal.storage.sessions`), so a session survives restarts.

This package is the protocol — what is accepted, who is charged, when a round advances,
what is released; how its rows are read and written is
:class:`privcal.storage.session_store.SessionStore`'s (no SQL here). One module per step:

- :mod:`~privcal.accountant.sessions.records` — the records returned, the rejection reasons;
- :mod:`~privcal.accountant.sessions.state` — the protocol state stored on a session row;
- :mod:`~privcal.accountant.sessions.opening` — :func:`open_session`;
- :mod:`~privcal.accountant.sessions.ingest` — :func:`submit_reports`;
- :mod:`~privcal.accountant.sessions.parsing` — a batch's values and rounds, checked;
- :mod:`~privcal.accountant.sessions.release` — the release a finished session writes;
- :mod:`~privcal.accountant.sessions.closing` — :func:`close_session`;
- :mod:`~privcal.accountant.sessions.status` — :func:`session_status`, :func:`release_of`.

One batch is one transaction: lock the dataset row, then the session row; drop the
rows that cannot be used (each with a reason, counted — subject ids are never echoed
or logged); charge ε to each remaining subject against its per-subject cap with the
accountant's bulk SQL; store the reports; advance the protocol when the round is
full; write the release when it finishes. If no row is accepted nothing is written.

**Decisions**

- Row filters apply in this order: malformed value, wrong round (``closed round`` for
  an earlier round, ``round not open`` for a later one, ``malformed round`` for one that
  is no round of the session), subject already reported in
  this session, duplicate within the batch (the first valid occurrence is kept),
  subject budget exhausted, then (federated) an agent without an agent token for a slot
  a token-holding agent still waits for (red team 25, fedlocal2), then ``round full`` /
  extra agent (when a batch has more usable rows than
  the round needs, the rows kept are a uniformly random subset, drawn from the operating
  system's CSPRNG — never the first ones: a batch's order may depend on its values, a
  shuffler that outputs the sorted multiset or an export ``ORDER BY`` bit, and the
  protocols assume the round's group is a random sample; red team 6). Budget comes
  before fullness, so a round is never left short because an over-cap subject took a
  slot, and nobody is charged for a row that is then dropped. Across batches the order
  is the arrival order: whoever forwards reports must not sort them, nor cut a sorted
  stream into batches.
- A round's bits answer *that* round's query, so surplus rows are rejected, not
  carried over; and an ldp-score batch must say which round each row answers: one
  without rounds is refused whole (InvalidInput, nothing written — checked before an
  idempotency replay too), since counting it toward the round open when it is written
  would take answers to an earlier query for answers to the current one.
- ``--shuffled`` computes the amplified central (ε, δ) at open time (it depends only
  on the public plan) and, on an (ε, δ) dataset, charges it then: the published
  queries are already outputs, so the central charge precedes any data. Every batch and
  the release recompute that claim and refuse (nothing written) one the installed privcal
  does not make, e.g. a session opened by an older privcal (red team 26, shuffle F1).
- Closing an unfinished session without a release (``abandon``) keeps every charge:
  privacy spent on accepted reports is never refunded.
- ``--allow-missing`` (federated) releases for the agents that answered under the
  published plan, each missing agent's message counted as +∞ (``agents_planned`` = m in
  the release's params: the k-th smallest can only rise, so the plan's guarantee holds
  whatever the dropout). With ``--missing replan`` it releases with the plan recomputed
  for the agents that answered (valid only for a dropout independent of the data, which
  the recorded guarantee states): their messages are fixed (FedCP²-QQ: level q;
  FedCP-QQ: order ℓ) and only the server side is re-chosen (``replan_*_subset``). The
  release's params pin that agent side (``level`` / ``agent_order``), from which the
  calibrator's ``guarantee`` derives the same replanned plan, so ``audit verify``
  reproduces it. When no valid replan exists it refuses, writes nothing and the session
  stays open (see
  :func:`~privcal.accountant.sessions.release.subset_plan`).
"""

from __future__ import annotations

from privcal.accountant.sessions.closing import close_session
from privcal.accountant.sessions.ingest import submit_reports
from privcal.accountant.sessions.opening import open_session
from privcal.accountant.sessions.records import METHODS, SessionInfo, SubmitResult
from privcal.accountant.sessions.status import release_of, session_status

__all__ = [
    "METHODS",
    "SessionInfo",
    "SubmitResult",
    "close_session",
    "open_session",
    "release_of",
    "session_status",
    "submit_reports",
]
