"""Releases and the audit log: head, paged entries (canonical payloads and hashes, so a
third party can recompute the chain offline), verification."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from privcal.errors import AuditFailed, InvalidInput
from privcal.service.auth import Principal, allow, principal
from privcal.service.common import doc
from privcal.service.json_body import JsonRoute
from privcal.storage.releases import MAX_STORED_ID

router = APIRouter(prefix="/v1", route_class=JsonRoute)


def _acct(request: Request) -> Any:
    return request.app.state.accountant


#: the most bytes of JSON one page of releases or audit entries holds: a page stops before
#: the item that would take it past this (it always holds one item, however large), so an
#: empty page, never a short one, is the end (red team 26, service F2: a Mondrian release of
#: 10 000 named groups is 22.5 MB, and the default page of 100 such was 2.25 GB of JSON,
#: built whole in the server's memory)
PAGE_BYTES = 8 * 1024 * 1024
#: the items read first for a page (then as many as the largest seen leaves room for)
_FIRST_READ = 8


def byte_page(fetch: Callable[[int, int], list[Any]], cursor: Callable[[Any], int],
              after: int, limit: int) -> Response:
    """A JSON array of at most ``limit`` items after ``after``, read ``fetch(after, n)`` at a
    time, stopped before :data:`PAGE_BYTES` (one item at least); ``cursor(item)`` is the
    ``after`` of the next read. The bytes are those FastAPI sends for the list (Starlette's
    ``JSONResponse`` rendering of :func:`doc`); few items are held at once."""
    parts: list[bytes] = []
    size, largest, want = 2, 1, min(limit, _FIRST_READ)
    while want > 0:
        items = fetch(after, want)
        for item in items:
            part = json.dumps(doc(item), ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode("utf-8")
            if parts and size + len(part) + 1 > PAGE_BYTES:
                return _array(parts)
            parts.append(part)
            size, largest, after = size + len(part) + 1, max(largest, len(part)), cursor(item)
        if len(items) < want:
            break
        want = min(limit - len(parts), max(1, (PAGE_BYTES - size) // largest))
    return _array(parts)


def _array(parts: list[bytes]) -> Response:
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")


@router.get("/releases", response_model=list[dict[str, Any]],
            **allow("admin", "auditor", "analyst"))
def release_list(request: Request, p: Principal = Depends(principal),
                 dataset: str | None = Query(default=None, max_length=200),
                 after: int = Query(default=0, ge=0, le=MAX_STORED_ID),
                 limit: int = Query(default=100, ge=1, le=1000)) -> Response:
    """Releases with ``id > after`` (≤ 2³¹−1, the largest id), oldest first (an analyst sees
    its granted datasets); the page is read as such (not every release, then filtered), at
    most ``limit`` releases and :data:`PAGE_BYTES` of JSON (:func:`byte_page`: page on from
    the last id until a page is empty)."""
    if dataset is not None:
        p.check_dataset(dataset)
    from privcal.accountant.releases import list_releases

    among = None if p.sees_all_datasets() else list(p.token.datasets)
    ledger = _acct(request).ledger
    return byte_page(lambda a, n: list_releases(ledger, dataset, after=a, limit=n, among=among),
                     lambda r: int(r.id), after, limit)


@router.get("/releases/{release_id}", **allow("admin", "auditor", "analyst"))
def release_show(request: Request, p: Principal = Depends(principal),
                 release_id: int = Path(ge=1, le=MAX_STORED_ID)) -> dict[str, Any]:
    """One release with its coverage and privacy guarantees. ``release_id`` is a canonical
    decimal id, 1 … 2³¹−1: any other spelling (``01``, ``+1``, ``1.0``) or a larger value is
    404 before this runs (:mod:`privcal.service.query_params`; the library's lookup answers
    NotFound for one out of range too)."""
    # one read: 404 unless visible to this principal, then served as its audit entry
    # recorded it, or 409 (checked once visible: a 409 would otherwise say that a release of
    # another dataset exists)
    return doc(_acct(request).release(release_id, visible=p.sees_dataset))


@router.get("/audit/head", **allow("admin", "auditor"))
def audit_head(request: Request) -> dict[str, Any]:
    """The head of the log: keep ``f"{seq}:{hash}"`` outside the database."""
    h = _acct(request).ledger.head()
    return {"seq": h.seq, "hash": h.entry_hash, "head": str(h)}


#: the largest audit sequence number a ledger holds (a 32-bit integer column on PostgreSQL)
SEQ_MAX = MAX_STORED_ID


@router.get("/audit/entries", response_model=list[dict[str, Any]], **allow("admin", "auditor"))
def audit_entries(request: Request, after: int = Query(default=0, ge=0, le=SEQ_MAX),
                  limit: int = Query(default=100, ge=1, le=1000)) -> Response:
    """Entries with ``seq > after`` (``after`` ≤ 2³¹−1, the largest sequence number):
    canonical payload, previous hash, entry hash; at most ``limit`` entries and
    :data:`PAGE_BYTES` of JSON (:func:`byte_page`)."""
    from privcal.storage.tokens import audit_entries as page

    ledger = _acct(request).ledger
    return byte_page(lambda a, n: page(ledger, after=a, limit=n), lambda e: int(e.seq),
                     after, limit)


class VerifyBody(BaseModel):
    """``POST /v1/audit/verify``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    expect_head: str | None = Field(default=None, max_length=200)
    #: more kept heads SEQ:HASH: each must be in the log (heads kept on other days, or by
    #: other auditors). The server verifies itself: an auditor who does not trust the
    #: operator fetches /v1/audit/entries and checks them with its own code (README)
    expect_heads: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list,
                                                                      max_length=1000)
    #: heads signed with ``privcal audit head --sign`` (each document as that command writes
    #: it), checked with ``trusted_key`` (the Ed25519 public key's PEM text): as
    #: ``audit verify --signed-head FILE --trusted-key PUB``
    signed_heads: list[dict[str, Any]] = Field(default_factory=list, max_length=1000)
    trusted_key: str | None = Field(default=None, max_length=1000)
    #: entries after the newest signed head are counted (``unsigned_entries``), not refused
    allow_unsigned_tail: bool = False


@router.post("/audit/verify", **allow("admin", "auditor"))
def audit_verify(request: Request, body: VerifyBody) -> dict[str, Any]:
    """Recompute the chain and every release's guarantees: ``ok`` and the first failure."""
    from privcal.storage.signing import public_key_from_pem, read_signed_head

    heads = ([body.expect_head] if body.expect_head is not None else []) + body.expect_heads
    if (body.trusted_key is None) != (not body.signed_heads):
        raise InvalidInput("signed_heads and trusted_key go together: a signed head is "
                           "checked with the key that signed it")
    signed = [read_signed_head(d) for d in body.signed_heads]  # 422 before any work if bad
    key = None if body.trusted_key is None else public_key_from_pem(body.trusted_key.encode())
    try:
        rep = _acct(request).verify(expect_head=heads, signed_head=signed, trusted_key=key,
                                    allow_unsigned_tail=body.allow_unsigned_tail)
    except AuditFailed as exc:
        return {"ok": False, "error": str(exc), "head": str(_acct(request).ledger.head())}
    return {"ok": True, "report": doc(rep)}
