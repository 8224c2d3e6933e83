"""Creating tokens bound to a role, datasets, a session, a subject or an agent: the checks
made before a token is written, shared by ``POST /v1/tokens`` and ``privcal token create``.

No FastAPI here (red team 7): the CLI mints tokens on a base install, without the
``server`` extra that only ``privcal serve`` needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from privcal.errors import InvalidInput, NotFound

__all__ = ["create_bound_device_tokens", "create_bound_token"]


def create_bound_token(acct: Any, role: str, *, name: str | None, datasets: list[str],
                       session: int | None, subject: str | None, agent: str | None,
                       expires_in: timedelta | None,
                       idempotency: tuple[str, str] | None = None) -> Any:
    """Check the token's texts (a subject or agent id by the library's rule for ids,
    :func:`~privcal.calibrators.validation.id_strings`: NFC, no NUL, no blank at its ends;
    a name or dataset name without control or bidirectional control characters) and that
    what it is bound to exists — a session also still open (:func:`_check_session_binding`)
    — then create it (API and CLI). A bad input writes nothing (422). ``idempotency``: the
    (principal, key) reservation the token's transaction completes (``POST /v1/tokens``,
    :func:`privcal.storage.tokens.create_token`)."""
    from privcal.storage.tokens import check_bindings, create_token, token_texts

    for v, what in ((subject, "subject"), (agent, "agent")):
        if v is not None:
            _check_id(v, what)
    name, datasets, subject, agent = token_texts(name=name, datasets=datasets,
                                                 subject=subject, agent=agent)
    check_bindings(role, datasets=datasets, session=session, subject=subject, agent=agent)
    for d in datasets:
        acct.dataset(d)  # NotFound
    if session is not None:
        _check_session_binding(acct, role, session)
    return create_token(acct.ledger, role, name=name, datasets=datasets, session=session,
                        subject=subject, agent=agent, expires_in=expires_in,
                        idempotency=idempotency)


def create_bound_device_tokens(acct: Any, session: int, subjects: Sequence[str],
                               expires_in: timedelta | None) -> list[str]:
    """One device token per subject (distinct ids) of an existing, open, unshuffled
    ldp-score session, in one transaction (CLI ``token create --count``); the tokens in the
    order of ``subjects``, shown this once."""
    from privcal.calibrators.validation import id_strings
    from privcal.storage.token_bulk import create_device_tokens

    _check_session_binding(acct, "device", session)
    id_strings(list(subjects), "subject ids", people=True)  # the library's id rule (InvalidInput)
    return create_device_tokens(acct.ledger, session, subjects, expires_in=expires_in)


def _check_id(v: Any, what: str) -> None:
    """InvalidInput unless ``v`` is one id by the library's rule (the one a session applies
    to the ids it is sent: a token whose subject it refuses could never report)."""
    from privcal.calibrators.validation import id_strings

    if not isinstance(v, str):
        raise InvalidInput(f"{what} must be text")
    try:
        id_strings([v], what, people=True)
    except InvalidInput as exc:
        raise InvalidInput(str(exc).replace(f"{what}: row 0 ", f"{what} ", 1)) from None


def _check_session_binding(acct: Any, role: str, session: Any) -> None:
    """The session exists (NotFound; so for an id beyond 2³¹−1, which no session has), is
    open — a token for a session abandoned, released or otherwise closed could never report
    (InvalidInput, red team 8) — and takes tokens of ``role``: device tokens for an
    ldp-score session, agent tokens for a federated one, neither for a shuffled one."""
    from privcal.accountant.sessions import session_status
    from privcal.storage.sessions import refuse_unless_open
    from privcal.storage.tokens import SESSION_MAX

    if isinstance(session, bool) or not isinstance(session, int) or session < 1:
        raise InvalidInput("session must be a positive integer")
    if session > SESSION_MAX:  # no session has it (nor can a token's column hold it)
        raise NotFound(f"unknown session {session}")
    info = session_status(acct, session)
    refuse_unless_open(session, info.status, info.release_id)
    fed = info.method != "ldp-score"
    if role == "device" and fed:
        raise InvalidInput(f"session {session} is federated ({info.method}): give its "
                           "agents agent tokens, not device tokens")
    if role == "agent" and not fed:
        raise InvalidInput(f"session {session} is {info.method}: agent tokens are for "
                           "federated sessions")
    if role in ("device", "agent") and info.shuffled:
        raise InvalidInput(f"session {session} is shuffled: reports reach it only through "
                           "its ingestor (create an ingestor token)")
