"""The keyed requests running in this process, their reservations kept fresh: one daemon
thread touches every running request's pending Idempotency-Key record each third of
:data:`~privcal.storage.tokens.PENDING_TTL` (:func:`privcal.storage.reservation_leases.
touch_pending`: one transaction per ledger), so a retry takes a record over only when the
process running its request died (no touch for a whole TTL), never while the request runs,
however long (red team 9).

A keyed request owes its record one more write once it ends — its answer (done), or, if it
failed, the record's removal — and the ledger may refuse that write too (locked, restarting:
red team 23, service F2). Such a write is kept (:func:`owe`), not lost: retried by the same
thread each second, and at once by :func:`settle` when a retry of the key reaches this
process; the record is touched meanwhile, as a running request's, so no retry takes it over
before the write is done — never answered "still running" for minutes after a 503, nor a
committed charge's retry left without its receipt."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["owe", "running", "settle"]

log = logging.getLogger("privcal.service")

_lock = threading.Lock()
_live: dict[tuple[int, str, str], tuple[Any, int]] = {}  # (ledger, principal, key) → count
_thread: threading.Thread | None = None
#: (ledger, principal, key) → (ledger, the write its record is owed): see :func:`owe`
_owed: dict[tuple[int, str, str], tuple[Any, Callable[[], None]]] = {}


def _interval() -> float:
    from privcal.storage import tokens

    return max(tokens.PENDING_TTL.total_seconds() / 3, 0.05)


def _run() -> None:
    from privcal.storage.reservation_leases import touch_pending

    last = time.monotonic()
    while True:
        time.sleep(min(_interval(), 1.0))  # a TTL changed meanwhile is seen within 1 s
        with _lock:
            owed = list(_owed)
        for ident in owed:
            _settle(ident)
        if time.monotonic() - last < _interval():
            continue
        last = time.monotonic()
        with _lock:
            by_ledger: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
            for (lid, principal, key), (ledger, _n) in [*_live.items(), *_owed.items()]:
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
    ident = (id(ledger), principal, key)
    with _lock:
        _live[ident] = (ledger, _live.get(ident, (ledger, 0))[1] + 1)
        _start_locked()
    try:
        yield
    finally:
        with _lock:
            left = _live[ident][1] - 1
            if left:
                _live[ident] = (ledger, left)
            else:
                del _live[ident]



def owe(ledger: Any, principal: str, key: str, write: Callable[[], None]) -> None:
    """Keep ``write`` — the record of (``principal``, ``key``)'s answer, or its removal —
    which the ledger refused: retried until it is done (see the module docstring)."""
    with _lock:
        _owed[(id(ledger), principal, key)] = (ledger, write)
        _start_locked()


def settle(ledger: Any, principal: str, key: str) -> bool:
    """Do now the write this process owes the record of (``principal``, ``key``), if any:
    True once it is done (the record then answers as it should: a replay, or free)."""
    return _settle((id(ledger), principal, key))


def _settle(ident: tuple[int, str, str]) -> bool:
    with _lock:
        item = _owed.get(ident)
    if item is None:
        return False
    try:
        item[1]()
    except Exception:  # still refused: the thread tries again
        return False
    with _lock:
        if _owed.get(ident) is item:
            del _owed[ident]
    return True


def _start_locked() -> None:
    """Start the thread if it is not running (``_lock`` held)."""
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_run, name="privcal-idempotency-leases", daemon=True)
        _thread.start()
