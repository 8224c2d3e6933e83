"""Many device tokens in one transaction: a deployment (or a benchmark) issuing one token
per device of a session — 20 000 of them — would otherwise pay one committed transaction
per token. Each token is made exactly as :func:`privcal.storage.tokens.create_token` makes
one (its own id and 256-bit secret, only the secret's SHA-256 stored) and shown once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from privcal.errors import InvalidInput
from privcal.storage.audit import now
from privcal.storage.sessions import check_session_open
from privcal.storage.token_secrets import check_lifetime, new_secret
from privcal.storage.tokens import TOKEN_PREFIX, ApiToken, _text, check_session_id

__all__ = ["create_device_tokens"]


def create_device_tokens(ledger: Any, session: int, subjects: Sequence[str], *,
                         expires_in: timedelta | None = None) -> list[str]:
    """One device token per subject of ``subjects`` (distinct ids), bound to ``session``,
    created in one transaction, expiring after ``expires_in`` (default: never); the tokens,
    in the order of ``subjects`` (shown this once). The caller checks that the session
    exists and takes reports, as for ``create_token``; that it is still open is checked
    again in the tokens' transaction (:func:`~privcal.storage.sessions.check_session_open`)."""
    check_session_id(session)  # an int in [1, 2³¹−1], what the column holds
    subs = [_text(str(x), "subject", ident=True) for x in subjects]
    if len(set(subs)) != len(subs):
        raise InvalidInput("subjects must be distinct (one device token per subject)")
    check_lifetime(expires_in)
    t0 = now()
    expires_at = t0 + expires_in if expires_in is not None else None
    rows: list[dict[str, Any]] = []
    out: list[str] = []
    for sub in subs:
        tid, secret, digest = new_secret()
        rows.append({"id": tid, "secret_sha256": digest,
                     "role": "device", "name": f"token-{tid}", "datasets": [],
                     "session_id": session, "subject": sub, "agent": None, "created_at": t0,
                     "expires_at": expires_at, "revoked_at": None})
        out.append(f"{TOKEN_PREFIX}{tid}_{secret}")

    def tx(s: Session) -> None:
        check_session_open(s, session)  # still open, in this transaction
        for i in range(0, len(rows), 5000):
            s.execute(insert(ApiToken), rows[i:i + 5000])

    if rows:
        ledger.write(tx)
    return out
