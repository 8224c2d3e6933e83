"""Locks of idempotency keys: a keyed run holds its key's lock from its charge to its release.

:meth:`KeyLocks.key_lock` is held by :meth:`privcal.accountant.Accountant.run` (issue 16
item 1), so a concurrent retry with the same key waits, then finds the release; the lock
dies with its holder, so a crashed run's retry takes it and re-runs once.

- PostgreSQL: a session-level advisory lock, on a connection of a *pool of its own*
  (:data:`KEY_LOCK_CONNECTIONS`). It was a connection of the ledger's shared pool, held for
  the whole run: about a dozen concurrent keyed calibrations held every connection of the
  pool and each waited for one more to read the dataset, so none finished until the pool's
  30 s timeout — a 500, and a charge without its release (red team 6). A run now waits for
  a lock connection holding nothing else, and the runs holding them need only the shared
  pool's connections, which every other user gives back.
- SQLite: a lock within the process, plus (file databases, POSIX) an ``fcntl`` byte-range
  lock on ``<database>.keylocks`` beside the file (its real path: a symlink to it, or
  another spelling of its path, takes the same locks), which the OS releases when the
  process dies. A ledger named by SQLite's URI (``file:/path?uri=true``) locks its file's
  path; a read-only or immutable one (``mode=ro``, ``immutable=1``), which refuses every
  write, takes no lock file (a read-only directory has no room for one).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from privcal.errors import LedgerError
from privcal.storage.engine import make_engine
from privcal.storage.sqlite_uri import sqlite_uri
from privcal.storage.transactions import _dropped

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: SQLite key locks are per process only
    fcntl = None  # type: ignore[assignment]

__all__ = ["BUSY", "KEY_LOCK_CONNECTIONS", "KEY_LOCK_WAIT_S", "KeyLocks"]

#: keyed runs that may hold their key's lock at once, per process and PostgreSQL ledger
KEY_LOCK_CONNECTIONS = 16
#: how long a keyed run waits for one of them before a LedgerError (a 503 in the service)
KEY_LOCK_WAIT_S = 60
#: what a remote client is told when the ledger's connections stay busy
BUSY = "the ledger is busy (all its connections stayed in use); retry later"

#: in-process locks of idempotency keys (fcntl locks do not exclude threads of one process)
_KEY_LOCKS: dict[tuple[str, int], threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
#: per ``.keylocks`` file, the one handle this process locks it through and how many key locks
#: use it (guarded by ``_KEY_LOCKS_GUARD``): POSIX record locks belong to the process, and
#: closing *any* descriptor of a file releases all of them — a handle per key lock, closed
#: when its run ended, freed the locks other threads still held (red team 26, ledger F3)
_LOCK_FILES: dict[str, list[Any]] = {}


def after_fork_in_child() -> None:
    """A forked child's key locks are all free: a thread of the parent that held one (a keyed
    run in progress) is not in the child, which would wait for it forever (red team 11). The
    parent's lock file handles hold no lock of the child's: closed here."""
    global _KEY_LOCKS_GUARD
    _KEY_LOCKS.clear()
    _KEY_LOCKS_GUARD = threading.Lock()
    for fh, _users in _LOCK_FILES.values():
        fh.close()
    _LOCK_FILES.clear()


@contextmanager
def _lock_file(path: str) -> Iterator[Any]:
    """This process's one open handle of lock file ``path`` (:data:`_LOCK_FILES`), closed when
    no key lock of the process uses it any more."""
    with _KEY_LOCKS_GUARD:
        entry = _LOCK_FILES.get(path)
        if entry is None:
            # 0600 whatever the umask: a user who can open it can hold a read lock that blocks
            # every keyed run (red team 26, ledger F12), as the ledger itself is 0600
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            entry = _LOCK_FILES[path] = [os.fdopen(fd, "a+b"), 0]
        entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _KEY_LOCKS_GUARD:
            entry[1] -= 1
            if entry[1] == 0 and _LOCK_FILES.get(path) is entry:
                del _LOCK_FILES[path]
                entry[0].close()


def _lock_path(url: URL) -> str | None:
    """The real path of the SQLite file ``url`` names, whose ``.keylocks`` file holds its
    keys' locks — the same file reached through a symlink, another relative spelling or
    SQLite's URI (``file:/path?uri=true``) takes the same locks; None in memory, and for a
    read-only or immutable URI (every write is refused: no lock file is made)."""
    path = url.database
    uri = sqlite_uri(url)  # its arguments as SQLite decodes them (red team 26, ledger F1)
    if uri is not None:
        if uri.read_only() or "memory" in uri.values("mode"):
            return None
        path = uri.path
    if path in (None, "", ":memory:"):
        return None
    return os.path.realpath(path)


def key_lock_file(url: URL, backend: str) -> str | None:
    """The ``.keylocks`` file of ledger ``url`` (:func:`_lock_path`), resolved once, when the
    Ledger is made: a relative path resolved at each keyed run followed the process's
    ``os.chdir`` while SQLite kept the file it opened, so a keyed run of the process and one of
    another process with the same key locked two files and both ran (red team 26, sqlitefile
    F3). None: no lock file (PostgreSQL, in memory, read-only)."""
    file = _lock_path(url) if backend != "postgresql" else None
    return None if file is None else f"{file}.keylocks"


def _lockf_waiting(fh: Any, offset: int) -> None:
    """The byte ``offset`` of lock file ``fh`` locked, waiting as long as another holds it.

    The kernel's deadlock detection sees processes, not threads: process A's thread holding
    key K1 while another of its threads waits for K2, held by process B whose other thread
    waits for K1, is a cycle to it — a raw ``OSError: [Errno 35] Resource deadlock avoided``
    for a keyed run that only had to wait (red team 26, ledger F9). A thread holds one key's
    lock at a time (one keyed run), so no real cycle exists: the wait is resumed, polled."""
    pause = 0.001
    while True:
        try:
            fcntl.lockf(fh, fcntl.LOCK_EX, 1, offset)
            return
        except OSError as exc:
            if exc.errno != errno.EDEADLK:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class KeyLocks:
    """The idempotency-key locks of a :class:`~privcal.storage.ledger.Ledger`."""

    # set by Ledger.__init__ / the Ledger's: ``_url``, ``_key_lock_file``, ``url``, ``backend``,
    # ``_lock``, ``_unreachable``
    _url: URL
    _key_lock_file: str | None
    _lock: threading.Lock
    _lock_engine: Engine | None = None

    @contextmanager
    def key_lock(self, dataset: str, key: str) -> Iterator[None]:
        """Hold the lock of idempotency key ``key`` of ``dataset`` (module docstring)."""
        digest = hashlib.sha256(f"privcal key\x00{dataset}\x00{key}".encode(
            "utf-8", "surrogatepass")).digest()
        lock_id = int.from_bytes(digest[:8], "big", signed=True)
        file = self._key_lock_file
        with _KEY_LOCKS_GUARD:
            local = _KEY_LOCKS.setdefault((file or self.url, lock_id), threading.Lock())  # type: ignore[attr-defined]
        with local:
            if self.backend == "postgresql":  # type: ignore[attr-defined]
                with self._pg_key_lock(lock_id):
                    yield
                return
            if fcntl is None or file is None:
                yield
                return
            offset = lock_id & 0x7FFF_FFFF_FFFF
            with _lock_file(file) as fh:
                _lockf_waiting(fh, offset)
                try:
                    yield
                finally:
                    fcntl.lockf(fh, fcntl.LOCK_UN, 1, offset)

    def _key_lock_engine(self) -> Engine:
        """The pool of the advisory locks' connections (module docstring), made on first use."""
        engine = self._lock_engine
        if engine is None:
            with self._lock:
                engine = self._lock_engine
                if engine is None:
                    engine = self._lock_engine = make_engine(
                        self._url, pool_size=KEY_LOCK_CONNECTIONS, max_overflow=0,
                        pool_timeout=KEY_LOCK_WAIT_S)
        return engine

    def close_key_locks(self, *, close: bool = True) -> None:
        """Close the advisory locks' pool (:meth:`~privcal.storage.ledger.Ledger.close`), or,
        ``close=False`` in a forked child, drop the parent's connections without closing them."""
        engine, self._lock_engine = self._lock_engine, None
        if engine is not None:
            engine.dispose(close=close)

    @contextmanager
    def _pg_key_lock(self, lock_id: int) -> Iterator[None]:
        """The advisory lock of :meth:`key_lock` on a connection of the locks' own pool. Taken
        once more on a fresh connection if the server had dropped the first (a dead session
        held no lock); if the connection is dropped while the lock is held, the server
        released the lock with the session, so there is nothing to unlock. Else one-line
        LedgerError."""
        for attempt in (1, 2):
            try:
                conn: Any = self._key_lock_engine().connect()
            except DBAPIError as exc:
                raise self._unreachable(exc) from exc  # type: ignore[attr-defined]
            except PoolTimeout as exc:
                raise LedgerError(
                    f"{KEY_LOCK_CONNECTIONS} keyed runs held their keys' locks on the ledger at "
                    f"{self.url} for {KEY_LOCK_WAIT_S} s; retry with the same key",  # type: ignore[attr-defined]
                    public=BUSY) from exc
            with conn:
                try:
                    conn.execute(select(func.pg_advisory_lock(lock_id)))
                    conn.commit()
                except DBAPIError as exc:
                    if getattr(exc.orig, "sqlstate", None) in ("55P03", "57014"):
                        raise LedgerError(  # red team 25, ledger F2: a traceback before
                            "another run with the same idempotency key held its lock past the "
                            f"ledger's lock_timeout or statement_timeout ({self.url}); nothing "  # type: ignore[attr-defined]
                            "was charged: retry with the same key", public=BUSY) from exc
                    if not _dropped(exc):
                        raise
                    if attempt == 1:
                        continue
                    raise self._unreachable(exc) from exc  # type: ignore[attr-defined]
                try:
                    yield
                finally:
                    try:
                        conn.rollback()
                        conn.execute(select(func.pg_advisory_unlock(lock_id)))
                        conn.commit()
                    except DBAPIError as exc:
                        if not _dropped(exc):
                            raise  # (the lock went with the dropped session)
                return
