"""The report writer's token checks, just before it writes a window of reports
(:mod:`privcal.service.batcher`): a device's deferred token checked in bulk (its subject
taken from it), and the token an agent's message was authenticated with on arrival checked
again — one revoked or expired while the message waited is refused 401, as a device's is
(red team 18: an agent's message was stored and its agent charged after the revocation
had answered 200).

This read only answers early what it can (a wrong token, role or session): a revocation
committed after it, while the write waits for the dataset's lock, is caught by the check
every token gets again inside the write transaction (``submit_reports(tokens=…)``, whose
lock order makes it race-free: :func:`privcal.storage.token_checks.tokens_not_in_force`;
red team 21, flows M2: that report was stored and charged after the revocation's 200)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_tokens"]


def check_tokens(ledger: Any, items: list[Any]) -> list[Any]:
    """The items (the batcher's ``_Item``) that may be written: every device token valid for
    its item's session (the item's subject set from it), every re-checked token still in
    force; the others are answered (``fail``) with their 401/403/404 problem, or with the
    ledger's error if it cannot be read."""
    from privcal.service.auth import device_problem
    from privcal.storage.token_checks import check_presented

    items = _recheck(ledger, items)
    deferred = [it for it in items if it.token is not None]
    if not deferred:
        return items
    try:
        infos = check_presented(ledger, [it.token for it in deferred])
    except Exception as exc:  # the ledger is unreachable: every waiter gets the error
        for it in deferred:
            it.fail(exc)
        return [it for it in items if it.token is None]
    for it, info in zip(deferred, infos, strict=True):
        problem = device_problem(info, it.session_id)
        if problem is not None:
            it.fail(problem)
        else:
            assert info is not None and info.subject is not None
            it.subject, it.token, it.recheck = info.subject, None, info.id  # checked again
    return [it for it in items if it.token is None and not it.done]


def _recheck(ledger: Any, items: list[Any]) -> list[Any]:
    """``items`` but those whose authenticated token (``recheck``) was revoked or expired
    since the request arrived, which are answered 401."""
    from privcal.service.auth import unauthenticated
    from privcal.storage.token_checks import still_active

    ids = [it.recheck for it in items if it.recheck is not None]
    if not ids:
        return items
    try:
        live = still_active(ledger, ids)
    except Exception as exc:  # the ledger is unreachable: those waiters get the error
        for it in items:
            if it.recheck is not None:
                it.fail(exc)
        return [it for it in items if it.recheck is None]
    for it in items:
        if it.recheck is not None and it.recheck not in live:
            it.fail(unauthenticated())
    return [it for it in items if not it.done]
