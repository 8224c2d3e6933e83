"""The service's report writer's token check: a whole write window's device tokens with
one read, just before it writes (see :mod:`privcal.service.batcher`). The rules are
:func:`privcal.storage.tokens.verify_presented`'s; only the cost differs. And the web UI's
check of the token its session credential names (:func:`active_token`). And the writer's
second check, inside its write transaction after the session's lock
(:func:`tokens_not_in_force`: red team 21, flows M2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple

from sqlalchemy import select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from privcal.storage.audit import now
from privcal.storage.token_secrets import active, is_token_id, usable
from privcal.storage.tokens import ApiToken, TokenInfo, _info

__all__ = ["DeviceGrant", "active_token", "check_presented", "tokens_not_in_force"]

# PostgreSQL: a window's token ids (newline-joined) looked up one primary-key probe per id.
# `id IN (…)` on a tokens table never ANALYZEd was 3.7 ms per write window with 20 000
# tokens (a scan; bench/RESULTS.md, "Device reports at a session's size").
_CHECK_PG = ("SELECT k.id, k.secret_sha256, k.role, k.session_id, k.subject, k.expires_at, "
             "k.revoked_at FROM unnest(string_to_array(:ids, chr(10))) AS b(id) CROSS JOIN "
             "LATERAL (SELECT * FROM api_tokens WHERE id = b.id LIMIT 1) k")


# The report writer's re-check in its write transaction: the ids of a batch's tokens that are
# *not* in force for its session (none, but for a revocation). In force = the rule of
# :func:`~privcal.storage.token_secrets.active` (not revoked, not expired at ``at``) and bound
# to the session, said in SQL so that a batch of tokens in force returns no row to parse.
# PostgreSQL: a LATERAL … LIMIT 1 per id, as _CHECK_PG, forces one primary-key probe each (a
# plain NOT EXISTS was planned as a scan of a never-ANALYZEd table: 40 ms for 500 ids).
_IN_FORCE = ("SELECT 1 AS ok FROM api_tokens t WHERE t.id = {id} AND t.session_id = {p}sid{q} "
             "AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > {p}at{q})")
_NOT_IN_FORCE_PG = ("SELECT b.id FROM unnest(string_to_array(%(ids)s, chr(10))) AS b(id) "
                    "LEFT JOIN LATERAL (" + _IN_FORCE.format(id="b.id", p="%(", q=")s")
                    + " LIMIT 1) k ON true WHERE k.ok IS NULL")
_NOT_IN_FORCE_SQLITE = ("SELECT j.value FROM json_each(:ids) j WHERE NOT EXISTS ("
                        + _IN_FORCE.format(id="j.value", p=":", q="") + ")")


class DeviceGrant(NamedTuple):
    """What the report writer needs of a valid token: its id, role and bindings."""

    id: str
    role: str
    session: int | None
    subject: str | None


def check_presented(ledger: Any, presented: Sequence[tuple[str, str]], *,
                    tx: Session | None = None) -> list[DeviceGrant | None]:
    """:func:`verify_presented` at the cost of one Core read of the rows' few columns (no
    ORM objects, no :class:`TokenInfo` per token): the service's report writer checks a
    whole window's device tokens with it, just before it writes. The same rule,
    :func:`~privcal.storage.token_secrets.usable`: a token that does not open, is revoked or
    expired by now is refused (None). ``tx``: read in this open read transaction (else
    one of its own)."""
    t = ApiToken.__table__
    cols = (t.c.id, t.c.secret_sha256, t.c.role, t.c.session_id, t.c.subject,
            t.c.expires_at, t.c.revoked_at)
    ids = sorted({tid for tid, _ in presented})
    rows: dict[str, Any] = {}
    keyed = ledger.backend == "postgresql" and ids and all(
        x and "\n" not in x for x in ids)
    with ledger.read() if tx is None else nullcontext(tx) as s:
        if keyed:  # one primary-key probe per id (typed by the table's columns)
            for r in s.execute(text(_CHECK_PG).columns(*cols), {"ids": "\n".join(ids)}):
                rows[r[0]] = r
        else:
            rows.update((r[0], r) for r in _rows(s, cols, ids))
        at = now()
    out: list[DeviceGrant | None] = []
    for tid, digest in presented:
        r = rows.get(tid)
        if r is None:
            usable(digest, None, None, None, at)  # the same comparison as for a known id
            out.append(None)
        elif usable(digest, r[1], r[6], r[5], at):
            out.append(DeviceGrant(r[0], r[2], r[3], r[4]))
        else:
            out.append(None)
    return out


def still_active(ledger: Any, token_ids: Sequence[str]) -> set[str]:
    """Which of ``token_ids`` — tokens a request was authenticated with when it arrived —
    are still in force now (not revoked, not expired): one read, for the report writer to
    refuse a queued agent message whose token was revoked while it waited (red team 18)."""
    t = ApiToken.__table__
    ids = sorted({str(x) for x in token_ids})
    out: set[str] = set()
    with ledger.read() as s:
        at = now()
        for r in _rows(s, (t.c.id, t.c.revoked_at, t.c.expires_at), ids):
            if active(r[1], r[2], at):
                out.add(r[0])
    return out


def tokens_not_in_force(ledger: Any, conn: Connection, session_id: int,
                        token_ids: Sequence[str]) -> set[str]:
    """Those of ``token_ids`` not in force for session ``session_id`` now — unknown, revoked,
    expired, or bound to another session — read in the open write transaction on ``conn`` of
    a batch of that session, *after* it locked the session row
    (:meth:`~privcal.storage.Ledger.lock_batch_session`): one statement, a primary-key probe
    per id (red team 21, flows M2: the report writer's check before its write transaction
    missed a revocation committed while the write waited for the dataset's lock, and a
    revoked device's report was stored and charged after the revocation answered 200).

    Why nothing revoked is missed: :func:`~privcal.storage.tokens.revoke_token` locks the
    row of the token's session (``FOR UPDATE``) before it sets ``revoked_at``, and a token is
    in force here only if it is bound to ``session_id``, whose row this transaction holds.
    On PostgreSQL (READ COMMITTED: each statement reads what was committed when it began)
    either the revocation locked the session first — the batch's lock waited for its commit,
    and this later statement reads ``revoked_at`` — or the batch did, and the revocation
    waits for the batch's commit: the report was stored before the token was revoked.
    SQLite: both are write transactions begun ``IMMEDIATE``, serialized by the database's
    write lock. Expiry is a clock's: judged at this statement."""
    ids = sorted({str(x) for x in token_ids})
    if not ids:
        return set()
    at, params = now(), {"sid": session_id}
    if ledger.backend != "postgresql":  # the text SQLAlchemy stores a DateTime as
        at_text = at.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        sql, params = _NOT_IN_FORCE_SQLITE, {**params, "ids": json.dumps(ids), "at": at_text}
    elif all(x and "\n" not in x for x in ids):
        sql, params = _NOT_IN_FORCE_PG, {**params, "ids": "\n".join(ids), "at": at}
    else:  # not token ids (none is found): none is in force
        return set(ids)
    return {r[0] for r in ledger._sql(conn, sql, params).fetchall()}


def _rows(s: Any, cols: Sequence[Any], ids: Sequence[str]) -> Iterator[Any]:
    """The ``cols`` of the tokens ``ids`` (the first column the id), 500 ids a query."""
    t = ApiToken.__table__
    for i in range(0, len(ids), 500):
        yield from s.execute(select(*cols).where(t.c.id.in_(ids[i:i + 500])))


def active_token(ledger: Any, token_id: str) -> TokenInfo | None:
    """The record of token ``token_id`` if it exists and is in force now (not revoked, not
    expired: :func:`~privcal.storage.token_secrets.active`); else None. No secret is
    checked: the caller holds a credential the server itself issued for this id and has
    checked its MAC (the web UI's session cookie, :mod:`privcal.service.ui`), so a revoked
    or expired token ends that session at its next request."""
    tid = str(token_id)
    if not is_token_id(tid):
        return None
    with ledger.read() as s:
        row = s.get(ApiToken, tid)
        if row is None or not active(row.revoked_at, row.expires_at, now()):
            return None
        return _info(row)
