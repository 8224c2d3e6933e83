"""At most m agents of a federated session: the cap on its agent tokens (red team 25, fedlocal2).

A FedCP-QQ / FedCP²-QQ session uses the first m agents to answer and turns later ones away.
With more than m agents able to answer, which m are used is decided by arrival, and an
arrival that tracks the data lowers the coverage with every agent honest (ten agents for
m = 5 arriving in the order of their messages covered 0.865 against a recorded 0.9; red team
25, fedlocal F4). On the agent-token path the server decides who may answer, so it enforces
that no selection is left to make: a session's agent tokens are for at most its plan's m
distinct agents. An agent counts from its first token for the session on — revoked or
expired tokens included, since its message may already be in or a replacement chosen after
a dropout would again select by arrival — together with the agents whose message a batch
(ingestor, CLI, library) already stored; a second token for an agent already counted is
free. Missing agents are the close's business (``allow_missing``: +∞ or a replan). A
batch's agents without a token take only the slots no token holder still waits for
(:func:`token_agents`, read by :mod:`privcal.accountant.sessions.ingest`).

Race-safe: the count runs in the token's own write transaction after the session's row is
locked ``FOR UPDATE`` on PostgreSQL (READ COMMITTED: the count after the lock sees every
token committed before it), so two concurrent mints are ordered; SQLite's write
transactions begin ``IMMEDIATE`` and are serial.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import column, func, select, table
from sqlalchemy.orm import Session

from privcal.errors import InvalidInput, NotFound
from privcal.storage.models import read_ledger_secret
from privcal.storage.pseudonyms import pseudonym
from privcal.storage.sessions import (
    CollectionSession,
    SessionReport,
    check_session_open,
    refuse_unless_open,
)

__all__ = ["check_agent_slot", "check_token_session", "token_agents"]

#: the columns of ``api_tokens`` the count reads (the model lives in :mod:`.tokens`, which
#: imports this module)
_TOKENS = table("api_tokens", column("session_id"), column("role"), column("agent"),
                column("created_at"))


def check_token_session(s: Session, session: int, role: str, agent: str | None) -> None:
    """In a session-bound token's write transaction: the session is still open
    (:func:`~privcal.storage.sessions.check_session_open`), and an agent's token is within
    the session's m agents (:func:`check_agent_slot`)."""
    if role == "agent" and agent is not None:
        check_agent_slot(s, session, agent)
    else:
        check_session_open(s, session)


def check_agent_slot(s: Session, session: int, agent: str) -> None:
    """In an agent token's write transaction: lock session ``session``'s row, check it is
    open (NotFound / InvalidInput as :func:`~privcal.storage.sessions.check_session_open`),
    and refuse (InvalidInput, nothing written) a token for an agent beyond the session's
    plan's m: one not yet counted (holding a token for it, or having a stored message) when
    m agents already are. A session without a federated plan is left to the caller's role
    check."""
    row = s.execute(select(CollectionSession.status, CollectionSession.release_id,
                           CollectionSession.state)
                    .where(CollectionSession.id == session).with_for_update()).first()
    if row is None:
        raise NotFound(f"unknown session {session}")
    refuse_unless_open(session, row.status, row.release_id)
    plan: Any = (row.state or {}).get("plan")
    if not isinstance(plan, dict) or "m" not in plan:
        return
    m = int(plan["m"])
    holders = set(s.scalars(select(_TOKENS.c.agent).distinct().where(
        _TOKENS.c.session_id == session, _TOKENS.c.role == "agent")))
    if agent in holders:
        return
    reported = set(s.scalars(select(SessionReport.subject)
                             .where(SessionReport.session_id == session)))
    counted = len(holders)
    if reported:  # stored under keyed pseudonyms (storage/pseudonyms.py): compare those
        secret = read_ledger_secret(s)
        key = bytes.fromhex(secret) if secret is not None else b""
        if pseudonym(key, agent) in reported:
            return  # it has answered: a token for it adds no agent
        counted = len(reported | {pseudonym(key, a) for a in holders})
    if counted >= m:
        raise InvalidInput(
            f"session {session} is planned for m = {m} agent{'s' if m != 1 else ''} and "
            f"counts {counted} already (holding an agent token or having answered): a token "
            "for another agent would let the session choose its agents by arrival (a missing "
            "agent is handled when the session is closed: allow_missing)")


def token_agents(conn: Any, session_id: int, first: int | None = None) -> list[str]:
    """The distinct agent ids of session ``session_id``'s agent tokens (revoked and expired
    included: the agents invited), read on ``conn`` — a Core connection or ORM session — in
    a batch's write transaction after it locked the session row.

    ``first``: only the ``first`` agents invited, in the order of their first token (then
    id). A session holds at most m token agents since red team 25 (fedlocal2), but one whose
    tokens were minted before may hold more, and its m slots then went to whichever invited
    agents answered first — the selection by arrival the cap exists to prevent (red team 26,
    fedlocal L2): with ``first`` = m the slots are the first m invited, an order fixed when
    they were invited, whatever their data."""
    if first is None:
        return [str(a) for a in conn.execute(select(_TOKENS.c.agent).distinct().where(
            _TOKENS.c.session_id == session_id, _TOKENS.c.role == "agent")).scalars()]
    rows = conn.execute(select(_TOKENS.c.agent).where(
        _TOKENS.c.session_id == session_id, _TOKENS.c.role == "agent")
        .group_by(_TOKENS.c.agent)
        .order_by(func.min(_TOKENS.c.created_at), _TOKENS.c.agent).limit(first)).scalars()
    return [str(a) for a in rows]
