"""The service's report writer's token check: a whole write window's device tokens with
one read, just before it writes (see :mod:`privcal.service.batcher`). The rules are
:func:`privcal.storage.tokens.verify_presented`'s; only the cost differs. And the web UI's
check of the token its session credential names (:func:`active_token`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from privcal.storage.audit import now
from privcal.storage.token_secrets import active, is_token_id, usable
from privcal.storage.tokens import ApiToken, TokenInfo, _info

__all__ = ["DeviceGrant", "active_token", "check_presented"]

# PostgreSQL: a window's token ids (newline-joined) looked up one primary-key probe per id.
# `id IN (…)` on a tokens table never ANALYZEd was 3.7 ms per write window with 20 000
# tokens (a scan; bench/RESULTS.md, "Device reports at a session's size").
_CHECK_PG = ("SELECT k.id, k.secret_sha256, k.role, k.session_id, k.subject, k.expires_at, "
             "k.revoked_at FROM unnest(string_to_array(:ids, chr(10))) AS b(id) CROSS JOIN "
             "LATERAL (SELECT * FROM api_tokens WHERE id = b.id LIMIT 1) k")


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
