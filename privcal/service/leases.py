"""The keyed requests running in this process, their reservations kept fresh: one daemon
thread touches every running request's pending Idempotency-Key record each third of
:data:`~privcal.storage.tokens.PENDING_TTL` (:func:`privcal.storage.reservation_leases.
touch_pending`: one transaction per ledger), so a retry takes a record over only when the
process running its request died (no touch for a whole TTL), never while the request runs,
however long (red team 9)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["running"]

log = logging.getLogger("privcal.service")

_lock = threading.Lock()
_live: dict[tuple[int, str, str], tuple[Any, int]] = {}  # (ledger, principal, key) → count
_thread: threading.Thread | None = None


def _interval() -> float:
    from privcal.storage import tokens

    return max(tokens.PENDING_TTL.total_seconds() / 3, 0.05)


def _run() -> None:
    from privcal.storage.reservation_leases import touch_pending

    last = time.monotonic()
    while True:
        time.sleep(min(_interval(), 1.0))  # a TTL changed meanwhile is seen within 1 s
        if time.monotonic() - last < _interval():
            continue
        last = time.monotonic()
        with _lock:
            by_ledger: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
            for (lid, principal, key), (ledger, _n) in _live.items():
                by_ledger.setdefault(lid, (ledger, []))[1].append((principal, key))
        for ledger, keys in by_ledger.values():
            try:
                touch_pending(ledger, keys)
            except Exception:  # the ledger unreachable: the next round tries again
                log.warning("could not refresh %d pending Idempotency-Key records", len(keys),
                            exc_info=True)


@contextmanager
def running(ledger: Any, principal: str, key: str) -> Iterator[None]:
    """While the body runs, the pending record of (``principal``, ``key``) is touched."""
    global _thread
    ident = (id(ledger), principal, key)
    with _lock:
        _live[ident] = (ledger, _live.get(ident, (ledger, 0))[1] + 1)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="privcal-idempotency-leases",
                                       daemon=True)
            _thread.start()
    try:
        yield
    finally:
        with _lock:
            left = _live[ident][1] - 1
            if left:
                _live[ident] = (ledger, left)
            else:
                del _live[ident]

