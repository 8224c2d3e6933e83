"""API tokens and idempotency records of the HTTP service (``privcal serve``), and the few
reads the service needs that the library has no call for (a page of audit entries, one
subject's stored report: :mod:`privcal.storage.service_reads`, re-exported here).

**Tokens** are opaque bearer strings ``pcl_<id>_<secret>``: ``id`` is 16 hex digits
(public, the primary key), ``secret`` 256 random bits (``secrets.token_urlsafe(32)``).
Only ``SHA-256(secret)`` is stored; a presented token is checked with
:func:`hmac.compare_digest`, and a hash is computed even for an unknown id so that
the time taken does not say whether the id exists (the design of collector tokens in
the IETF DAP / Janus implementation, see ``shared/SERVICE.md``). A token carries one
role and its bindings; it expires (``expires_at``) and is revoked at once
(``revoked_at``): every request's token is read, nothing cached (reports: :mod:`.token_checks`).

**Idempotency records** remember, per principal and ``Idempotency-Key``, the route,
a fingerprint of the request and the response that was sent, so a retried request
gets the original answer and a key reused for another request is refused. A record is
first reserved (``pending``) in its own transaction and completed after the library
call; the library's own idempotency keys (charges, calibrations) make a crash between
the two safe to retry. A token created under a key completes the key's record in its
own transaction, with the token's id and never its secret (:func:`create_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import JSON, DateTime, Integer, String, Text, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from privcal.errors import BIDI_CONTROLS, InvalidInput, NotFound, invisible_char, utf8_problem
from privcal.errors import with_article as article
from privcal.storage.agent_slots import check_token_session
from privcal.storage.audit import now
from privcal.storage.models import Base
from privcal.storage.records import UTCDateTime
from privcal.storage.releases import MAX_STORED_ID
from privcal.storage.service_reads import (
    AuditEntryDoc,
    audit_entries,
    stored_report,
    stored_reports,
)
from privcal.storage.sessions import lock_for_revocation
from privcal.storage.token_secrets import (
    DUMMY_HASH,
    MAX_LIFETIME,
    TOKEN_ID,
    check_lifetime,
    check_name,
    is_token_id,
    new_secret,
    usable,
)

__all__ = ["MAX_LIFETIME", "ROLES", "SESSION_MAX", "ApiToken", "AuditEntryDoc", "IdemOutcome",
           "IdempotencyRecord", "NewToken", "TokenInfo", "audit_entries", "authenticate",
           "check_lifetime", "check_session_id", "create_token", "finish_idempotent",
           "forget_idempotent", "list_tokens", "presented_token", "reserve_idempotent",
           "revoke_token", "stored_report", "stored_reports", "token_texts", "verify_presented"]

Role = Literal["admin", "analyst", "auditor", "device", "agent", "ingestor"]
ROLES: tuple[str, ...] = ("admin", "analyst", "auditor", "device", "agent", "ingestor")
TOKEN_PREFIX = "pcl_"
_TOKEN_RE = re.compile(rf"^pcl_({TOKEN_ID})_([A-Za-z0-9_-]{{43}})$")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: the largest session id a token binds (a 32-bit INTEGER, as every row id of the ledger)
SESSION_MAX = MAX_STORED_ID
#: a pending reservation older than this is taken over by a retry (its request died)
PENDING_TTL = timedelta(minutes=5)


class ApiToken(Base):
    """One bearer token: its role, bindings, and only the SHA-256 of its secret."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    datasets: Mapped[list[str]] = mapped_column(JSON)
    session_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    subject: Mapped[str | None] = mapped_column(String(200), nullable=True)
    agent: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class IdempotencyRecord(Base):
    """The answer given to one (principal, Idempotency-Key)."""

    __tablename__ = "idempotency_records"

    principal: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    route: Mapped[str] = mapped_column(String(200))
    fingerprint: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # pending | done
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class TokenInfo(BaseModel):
    """A token as listed: never its secret."""

    model_config = ConfigDict(frozen=True)

    id: str
    role: str
    name: str
    datasets: list[str]
    session: int | None
    subject: str | None
    agent: str | None
    created_at: UTCDateTime
    expires_at: UTCDateTime | None
    revoked_at: UTCDateTime | None

    @property
    def principal(self) -> str:
        """Who this is in the ledger's ``requester`` fields: ``role:name``."""
        return f"{self.role}:{self.name}"


class NewToken(BaseModel):
    """A freshly created token: ``token`` is shown this once and stored only as a hash."""

    model_config = ConfigDict(frozen=True)

    id: str
    token: str = Field(repr=False)  # repr/str hide the secret (red team 11: logged objects)
    info: TokenInfo


def _info(t: ApiToken) -> TokenInfo:
    return TokenInfo(id=t.id, role=t.role, name=t.name, datasets=list(t.datasets or []),
                     session=t.session_id, subject=t.subject, agent=t.agent,
                     created_at=t.created_at, expires_at=t.expires_at, revoked_at=t.revoked_at)


def _text(v: Any, what: str, *, ident: bool = False, bidi_ok: bool = False) -> str | None:
    """``v`` if 1-200 characters, storable, no end blank; a name: no control character and
    no bidirectional control (:data:`privcal.errors.BIDI_CONTROLS`, the library's rule for
    names: one would reorder ``token list`` and the UI) unless ``bidi_ok``; an id: NFC;
    both: no character that reads as nothing (:func:`privcal.errors.invisible_char`, the
    rule ids meet when their reports arrive: refused here, before a device sends one)."""
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 200 or v != v.strip():
        raise InvalidInput(f"{what} must be 1 to 200 characters without surrounding spaces")
    bad = utf8_problem(v)
    if bad is None and not ident and _CONTROL.search(v):
        bad = "contains a control character"
    if bad is None and not (ident or bidi_ok) and (bidi := BIDI_CONTROLS.search(v)):
        bad = (f"contains the bidirectional control U+{ord(bidi.group()):04X}, which "
               "reorders the text around it on screen")
    if bad is None and not bidi_ok and (blank := invisible_char(v)) is not None:
        bad = (f"contains U+{ord(blank):04X} ({unicodedata.name(blank, 'unnamed')}), which "
               "reads as nothing: it would print as another")
    if bad is None and ident and not unicodedata.is_normalized("NFC", v):
        bad = "is not in Unicode NFC"
    if bad is not None:
        raise InvalidInput(f"{what} {bad}")
    return v


def token_texts(*, name: str | None, datasets: Sequence[str], subject: str | None,
                agent: str | None) -> tuple[str | None, list[str], str | None, str | None]:
    """A token's name, dataset names, subject and agent, checked (:func:`_text`). A dataset
    name binds an existing dataset (the callers check it exists): one made before names
    refused bidirectional controls keeps its name and can be granted; check_name: no token-<id>."""
    ds = [str(_text(str(d), "dataset name", bidi_ok=True)) for d in datasets]
    return (_text(check_name(name), "name"), ds, _text(subject, "subject", ident=True),
            _text(agent, "agent", ident=True))


def check_bindings(role: str, *, datasets: Sequence[str], session: int | None,
                   subject: str | None, agent: str | None) -> None:
    """Each role takes exactly its bindings (SERVICE.md, "Authentication and roles")."""
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r} (one of: {', '.join(ROLES)})")
    need = {"admin": set(), "auditor": set(), "analyst": {"dataset"}, "ingestor": {"session"},
            "device": {"session", "subject"}, "agent": {"session", "agent"}}[role]
    given = {k for k, v in (("dataset", list(datasets)), ("session", session),
                            ("subject", subject), ("agent", agent)) if v not in (None, [])}
    if given - need:
        raise InvalidInput(f"{article(role)} token takes no {', '.join(sorted(given - need))}")
    if need - given:
        raise InvalidInput(f"{role} tokens need {', '.join(sorted(need - given))}")


def check_session_id(session: Any) -> int:
    """``session`` if it is an ``int`` in [1, :data:`SESSION_MAX`] (what a token's session
    column holds), else InvalidInput."""
    if isinstance(session, bool) or not isinstance(session, int) or not 1 <= session <= SESSION_MAX:
        raise InvalidInput("session must be an integer in [1, 2³¹−1]")
    return session


def create_token(
    ledger: Any, role: str, *, name: str | None = None, datasets: Sequence[str] = (),
    session: int | None = None, subject: str | None = None, agent: str | None = None,
    expires_in: timedelta | None = None, idempotency: tuple[str, str] | None = None,
) -> NewToken:
    """Create a token; the caller checks that the named datasets/session exist (a session's
    being open, and an agent's being one of its m, again in the token's transaction:
    :func:`~privcal.storage.agent_slots.check_token_session`; red team 25, fedlocal2).

    ``idempotency``: the (principal, key) of a reservation of :func:`reserve_idempotent`,
    completed (201) in the token's own transaction with the token's id only — never its
    secret, which is shown once — so no crash leaves a token under a key still pending (a
    retry would make a second); InvalidInput, nothing written, if it is not pending."""
    name, datasets, subject, agent = token_texts(name=name, datasets=datasets,
                                                 subject=subject, agent=agent)
    if session is not None:
        check_session_id(session)
    check_bindings(role, datasets=datasets, session=session, subject=subject, agent=agent)
    check_lifetime(expires_in)
    tid, secret, digest = new_secret()
    t0 = now()

    def tx(s: Session) -> TokenInfo:
        if session is not None:
            check_token_session(s, session, role, agent)
        row = ApiToken(
            id=tid, secret_sha256=digest, role=role,
            name=name or f"token-{tid}", datasets=sorted(set(datasets)), session_id=session,
            subject=subject, agent=agent, created_at=t0,
            expires_at=t0 + expires_in if expires_in is not None else None, revoked_at=None)
        s.add(row)
        s.flush()
        if idempotency is not None:
            _complete_reserved(s, *idempotency, status_code=201, response={"id": tid})
        return _info(row)

    info = ledger.write(tx)
    return NewToken(id=tid, token=f"{TOKEN_PREFIX}{tid}_{secret}", info=info)


def list_tokens(ledger: Any) -> list[TokenInfo]:
    """Every token, by creation time as the clock said (then id; no secrets: only hashes)."""
    with ledger.read() as s:
        rows = s.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id))
        return [_info(t) for t in rows]


def revoke_token(ledger: Any, token_id: str) -> TokenInfo:
    """Revoke now (idempotent: the row, read ``FOR UPDATE``, keeps its first revocation time);
    a session-bound token locks its session's row too, which orders it with the session's
    batches (:func:`~privcal.storage.sessions.lock_for_revocation`; red team 21, flows M2)."""
    def tx(s: Session) -> TokenInfo:
        tid = str(token_id)
        row = s.get(ApiToken, tid, with_for_update=True) if is_token_id(tid) else None
        if row is None:
            raise NotFound(f"unknown token {token_id!r}")
        if row.revoked_at is None:
            lock_for_revocation(s, row.session_id)  # token row, then session row: no cycle
            row.revoked_at = now()
        s.flush()
        return _info(row)

    return ledger.write(tx)


def presented_token(presented: str) -> tuple[str, str] | None:
    """(id, SHA-256 of the secret) of a well-formed ``pcl_<id>_<secret>``; else None.

    Nothing is read: the check against the stored row is :func:`verify_presented`.
    """
    m = _TOKEN_RE.match(presented or "")
    if not m:
        return None
    return m.group(1), hashlib.sha256(m.group(2).encode()).hexdigest()


def _valid(row: ApiToken | None, digest: str, at: datetime) -> TokenInfo | None:
    """The row's record if ``digest`` opens it at ``at`` (:func:`usable`), else None."""
    if row is None:
        usable(digest, None, None, None, at)  # the same comparison as for a known id
        return None
    ok = usable(digest, row.secret_sha256, row.revoked_at, row.expires_at, at)
    return _info(row) if ok else None


def authenticate(ledger: Any, presented: str) -> TokenInfo | None:
    """The token's record if ``presented`` is a valid, unexpired, unrevoked token; else None."""
    tok = presented_token(presented)
    if tok is None:
        hmac.compare_digest(hashlib.sha256((presented or "").encode("utf-8", "replace"))
                            .hexdigest(), DUMMY_HASH)
        return None
    with ledger.read() as s:
        return _valid(s.get(ApiToken, tok[0]), tok[1], now())


def verify_presented(ledger: Any, presented: Sequence[tuple[str, str]]
                     ) -> list[TokenInfo | None]:
    """:func:`authenticate` for many (id, digest) pairs of :func:`presented_token` with one
    read (the service's report writer checks a window's device tokens at once, just before
    it writes: a token revoked or expired by then is refused)."""
    ids = sorted({tid for tid, _ in presented})
    rows: dict[str, ApiToken] = {}
    with ledger.read() as s:
        for i in range(0, len(ids), 500):
            for r in s.scalars(select(ApiToken).where(ApiToken.id.in_(ids[i:i + 500]))):
                rows[r.id] = r
        at = now()
        return [_valid(rows.get(tid), digest, at) for tid, digest in presented]


# ----------------------------------------------------------------- idempotency
class IdemOutcome(BaseModel):
    """What a reservation found: ``new`` (go ahead), a ``replay`` of a finished request, or
    a key used for another request (``mismatch``: its ``route``, and its answer once it
    finished) or still running (``pending``)."""

    model_config = ConfigDict(frozen=True)

    state: Literal["new", "replay", "mismatch", "pending"]
    status_code: int | None = None
    response: Any = None
    route: str | None = None


def reserve_idempotent(ledger: Any, principal: str, key: str, route: str,
                       fingerprint: str) -> IdemOutcome:
    """Reserve ``key`` for this request, or say what it was already used for."""
    if not isinstance(key, str) or not 1 <= len(key) <= 200 or not key.isprintable():
        raise InvalidInput("Idempotency-Key must be 1 to 200 printable characters")

    pg = ledger.backend == "postgresql"

    def tx(s: Session) -> IdemOutcome:
        row = s.get(IdempotencyRecord, (principal, key))
        if row is None:  # PostgreSQL: the server's clock, which every host shares (red team 11)
            s.add(IdempotencyRecord(principal=principal, key=key, route=route,
                                    fingerprint=fingerprint, state="pending",
                                    created_at=func.now() if pg else now()))
            s.flush()
            return IdemOutcome(state="new")
        if row.route != route or not hmac.compare_digest(row.fingerprint, fingerprint):
            done = row.state == "done"
            return IdemOutcome(state="mismatch", route=row.route,
                               status_code=row.status_code if done else None,
                               response=json.loads(row.response or "null") if done else None)
        if row.state == "done":
            return IdemOutcome(state="replay", status_code=row.status_code,
                               response=json.loads(row.response or "null"))
        created = row.created_at if row.created_at.tzinfo else row.created_at.replace(
            tzinfo=now().tzinfo)
        at = s.scalar(select(func.now())) if pg else now()
        if at - created > PENDING_TTL:  # its request died: take it over
            row.created_at = at
            return IdemOutcome(state="new")
        return IdemOutcome(state="pending")

    try:
        return ledger.write(tx)
    except IntegrityError:  # a concurrent first use of the same key won the insert
        return reserve_idempotent(ledger, principal, key, route, fingerprint)


def finish_idempotent(ledger: Any, principal: str, key: str, status_code: int,
                      response: Any) -> None:
    """Record the response sent for a reserved key."""
    def tx(s: Session) -> None:
        row = s.get(IdempotencyRecord, (principal, key))
        if row is not None:
            row.state, row.status_code = "done", int(status_code)
            row.response = json.dumps(response, sort_keys=True)

    ledger.write(tx)


def _complete_reserved(s: Session, principal: str, key: str, *, status_code: int,
                       response: Any) -> None:
    """Complete, in the caller's transaction, the pending record of (principal, key)."""
    row = s.get(IdempotencyRecord, (principal, key), with_for_update=True)
    if row is None or row.state != "pending":
        raise InvalidInput(f"no pending request under Idempotency-Key {key!r} (already answered)")
    row.state, row.status_code = "done", int(status_code)
    row.response = json.dumps(response, sort_keys=True)


def forget_idempotent(ledger: Any, principal: str, key: str) -> None:
    """Drop a pending reservation whose request failed (nothing was written: it may be retried)."""
    ledger.write(lambda s: s.execute(delete(IdempotencyRecord).where(
        IdempotencyRecord.principal == principal, IdempotencyRecord.key == key,
        IdempotencyRecord.state == "pending")))
