"""What a service token's secret is and when a presented one opens a stored token: the one
rule that every token check applies (:func:`privcal.storage.tokens.authenticate` and
``verify_presented`` for the routes, :func:`privcal.storage.token_checks.check_presented`
for the report writer), how a new secret is made (``create_token``, and
:func:`privcal.storage.token_bulk.create_device_tokens`) and how long a token may live
(:func:`check_lifetime`, the library's, CLI's and service's one rule). No database here.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from privcal.errors import InvalidInput

__all__ = ["DUMMY_HASH", "MAX_LIFETIME", "TOKEN_ID", "active", "check_lifetime", "check_name",
           "is_token_id", "new_secret", "usable"]

#: compared against a presented secret whose token id is unknown, so that the time taken
#: does not say whether the id exists
DUMMY_HASH = hashlib.sha256(b"privcal: no such token").hexdigest()


#: a token id's form (:func:`new_secret`: 8 random bytes in lower-case hex), as a pattern
TOKEN_ID = "[0-9a-f]{16}"
_TOKEN_ID = re.compile(TOKEN_ID)


#: the name of a token made without one: ``token-<its id>``
_DEFAULT_NAME = re.compile(f"token-{TOKEN_ID}")


def check_name(name: str | None) -> str | None:
    """``name``, unless it has the form of a default name, ``token-<16 hex digits>``: the
    ledger records a token's requester as ``role:name``, so that name would record another
    token's default requester (red team 23, service F3: two tokens wrote
    ``analyst:token-40441d8b472aaaae``, and an auditor blamed the wrong one). InvalidInput."""
    if name is not None and _DEFAULT_NAME.fullmatch(name):
        raise InvalidInput(f"name {name!r} has the form of a default name, token-<token id>, "
                           "the name of a token made without one (it would record another "
                           "token as the requester): choose another name")
    return name


def is_token_id(text: str) -> bool:
    """Whether ``text`` has a token id's form: anything else (a NUL, which PostgreSQL
    refuses in text, …) names no token and is never looked up."""
    return _TOKEN_ID.fullmatch(text) is not None


def new_secret() -> tuple[str, str, str]:
    """A new token's id, secret, and the secret's SHA-256 (all that is stored)."""
    tid, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    return tid, secret, hashlib.sha256(secret.encode()).hexdigest()


def usable(digest: str, stored: str | None, revoked_at: datetime | None,
           expires_at: datetime | None, at: datetime) -> bool:
    """The one rule of every token check: ``digest`` matches ``stored`` (constant time; a
    dummy hash if the id is unknown, ``stored`` None) and it is neither revoked nor expired."""
    ok = hmac.compare_digest(digest, stored if stored is not None else DUMMY_HASH)
    if not ok or stored is None:
        return False
    return active(revoked_at, expires_at, at)


def active(revoked_at: datetime | None, expires_at: datetime | None, at: datetime) -> bool:
    """Whether a token is in force at ``at``: not revoked, and not expired (the part of
    :func:`usable` that the web UI's own credential also needs: it names a token, see
    :mod:`privcal.service.ui`)."""
    if revoked_at is not None:
        return False
    if expires_at is not None and expires_at.tzinfo is None:  # SQLite gives naive UTC
        expires_at = expires_at.replace(tzinfo=UTC)
    return expires_at is None or expires_at > at


#: the longest lifetime of a token: 10 years (a date near year 9999 overflows; red team 5, 11)
MAX_LIFETIME = timedelta(days=10 * 366)


def check_lifetime(expires_in: Any) -> None:
    """A token's ``expires_in``: None (never) or a timedelta in (0, :data:`MAX_LIFETIME`]."""
    if expires_in is not None and not (isinstance(expires_in, timedelta)
                                       and timedelta(0) < expires_in <= MAX_LIFETIME):
        raise InvalidInput("a token's lifetime must be a timedelta in (0, 10 years] or None "
                           f"(never expires), not {expires_in!r}")
