"""The ledger: a SQL database (SQLite or PostgreSQL) holding budgets, charges, releases and
the hash-chained audit log. All of privcal's SQL is in this package.

``Ledger(url=None)`` opens ``url``, else ``$PRIVCAL_DATABASE_URL``, else the
embedded default, a SQLite file ``privcal.sqlite`` in ``$PRIVCAL_HOME`` or the
platform's user data directory — created and migrated on first use. A new SQLite
ledger named by URL (a file that does not exist yet or is empty, or ``sqlite://`` in
memory) is likewise created and migrated on first use, as MLflow does. Any other
ledger whose schema is not at the head revision — an existing SQLite file of an older
privcal, or a PostgreSQL database before ``privcal db upgrade`` — is refused with
:class:`~privcal.errors.SchemaOutOfDate` naming ``privcal db upgrade``.

A :class:`Ledger` is one object whose operations are grouped by concern, one module each:

- :mod:`~privcal.storage.schema` — the schema revision, migrations, first use;
- :mod:`~privcal.storage.transactions` — write/read transactions with retries,
  idempotency-key locks, and the audit append as the last step before COMMIT;
- :mod:`~privcal.storage.audit_queue` — the audit sequencer of PostgreSQL ledgers (entries
  committed with their rows, numbered into the chain under one advisory lock);
- :mod:`~privcal.storage.statements` — the hot path's Core statements, built once;
- :mod:`~privcal.storage.held_connections` — the connections the hot path keeps between
  writes;
- :mod:`~privcal.storage.optimistic` — a PostgreSQL charge in one round trip when the
  dataset row is as this process last left it (a compare-and-set in the writing statement);
- :mod:`~privcal.storage.datasets`, :mod:`~privcal.storage.charges`,
  :mod:`~privcal.storage.subject_spend`, :mod:`~privcal.storage.releases`,
  :mod:`~privcal.storage.session_store` — the named operations the accountant composes
  into its transactions (lock a dataset, insert a charge, bulk-charge subjects, insert a
  release, store a collection session's reports, …);
- :mod:`~privcal.storage.verify`, :mod:`~privcal.storage.verify_subjects` — the audit
  verification of the whole ledger.

The policy — what may be charged — is the accountant's (:mod:`privcal.accountant`);
storage never imports it, nor the calibrators.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy import Engine, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from privcal.errors import LedgerError
from privcal.storage import audit, key_locks, pseudonyms, schema
from privcal.storage.audit_queue import AuditSequencer
from privcal.storage.charges import ChargeStore
from privcal.storage.datasets import DatasetStore
from privcal.storage.engine import make_engine, parse_url, resolve_url, sqlite_file_hint
from privcal.storage.held_connections import HeldConnections
from privcal.storage.key_locks import BUSY, KeyLocks, key_lock_file
from privcal.storage.models import AuditEntry, LedgerSecret, read_ledger_secret
from privcal.storage.optimistic import OptimisticCharges
from privcal.storage.records import AuditHeadInfo
from privcal.storage.releases import ReleaseStore
from privcal.storage.schema import LedgerSchema
from privcal.storage.session_store import SessionStore
from privcal.storage.statements import HotSQL, HotStatements
from privcal.storage.subject_spend import SubjectSpendStore
from privcal.storage.transactions import MAX_ATTEMPTS, LedgerTransactions, statement_cancelled
from privcal.storage.verify import LedgerVerifier

__all__ = ["MAX_ATTEMPTS", "Ledger"]

#: every Ledger of this process, for the fork hook below (weak: a dropped one is forgotten)
_OPEN: weakref.WeakSet[Ledger] = weakref.WeakSet()


class Ledger(
    LedgerSchema,
    LedgerTransactions,
    KeyLocks,
    HeldConnections,
    AuditSequencer,
    HotStatements,
    DatasetStore,
    ChargeStore,
    OptimisticCharges,
    SubjectSpendStore,
    ReleaseStore,
    SessionStore,
    LedgerVerifier,
):
    """A privcal ledger at a database URL (see the module docstring)."""

    def __init__(self, url: str | None = None) -> None:
        raw, self.is_default = resolve_url(url)
        self._url = parse_url(raw)
        #: ``sqlite`` or ``postgresql`` (read a dozen times a charge: computed once)
        self._backend: str = self._url.get_backend_name()
        self._key_lock_file = key_lock_file(self._url, self._backend)  # before any chdir
        if self.is_default:
            path = Path(self._url.database or "")
            try:  # 0700: the ledger holds the pseudonyms' secret and every subject's spend
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise LedgerError(
                    f"cannot create the ledger directory {path.parent}: {exc}") from exc
        self.engine: Engine = make_engine(raw)
        self._schema_ok = False
        self._lock = threading.Lock()
        self._hot: HotSQL | None = None
        self._subject_key: bytes | None = None
        self._held, self._held_pid = [], os.getpid()
        #: why this ledger may no longer be used (an in-memory one closed, or copied by fork)
        self._gone: str | None = None
        _OPEN.add(self)

    # ------------------------------------------------------------------ basics
    @property
    def url(self) -> str:
        """The URL, password hidden."""
        if self._backend == "sqlite":  # no password; SQLAlchemy escapes "file:" to "file%3A"
            return unquote(self._url.render_as_string())
        return self._url.render_as_string(hide_password=True)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._backend

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def __reduce__(self) -> Any:
        """Refused with one line: a ledger holds database connections, locks and, in memory,
        the data itself, none of which another process can share (red team 11: pickling an
        Accountant for a ``spawn`` pool raised a bare AttributeError about a local object)."""
        raise TypeError("a privcal Ledger or Accountant holds database connections and cannot "
                        "be pickled, copied or sent to another process: pass the ledger's URL "
                        "and open Accountant(url) where another is needed")

    def close(self) -> None:
        """Release pooled connections (and those the hot path keeps: held_connections.py).
        A file or PostgreSQL ledger reopens on its next use; an in-memory one is gone."""
        self.close_held()
        self.close_key_locks()
        self.engine.dispose()
        if self._in_memory():
            self._gone = "this in-memory ledger (sqlite://) was closed: its data are gone"

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _after_fork(self) -> None:
        """In a forked child (os.register_at_fork, below): the pooled connections are the
        parent's — sharing one socket mixed the two processes' replies, and a charge read
        another's row (red team 11: totals below the logged charges, an overspend). They are
        dropped without being closed (SQLAlchemy's pool-and-fork recipe); a lock another
        thread held at the fork is never released here. An in-memory ledger in the child
        is a copy of the parent's budget: refused."""
        self._lock = threading.Lock()
        self.engine.dispose(close=False)
        self.close_key_locks(close=False)
        if self._in_memory():
            self._gone = ("an in-memory ledger (sqlite://) cannot be used in a forked process: "
                          "it would be a copy of the parent's, its budget spent twice — use a "
                          "file or PostgreSQL ledger")

    def _unreachable(self, exc: BaseException) -> LedgerError:
        first = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else ""
        if statement_cancelled(exc):  # red team 12
            step = ("this transaction was rolled back (an earlier step of the call that "
                    "committed, such as a calibration's charge, stands: retry with the same "
                    "idempotency key to complete it)")
            return LedgerError(f"the ledger at {self.url} cancelled a statement ({first}): a "
                               "statement_timeout on the server, role, database or URL is "
                               f"shorter than this call's work; {step}",
                               public="the ledger cancelled a statement of the request (a "
                               f"server timeout); {step}")
        return LedgerError(f"cannot reach the ledger at {self.url}: {first}{self.file_hint()}",
                           public="the ledger cannot be reached now; retry later")

    def file_hint(self) -> str:
        """:func:`~privcal.storage.engine.sqlite_file_hint` of this ledger's file ("" on
        PostgreSQL)."""
        return sqlite_file_hint(self._url.database) if self._backend == "sqlite" else ""

    def _checkout(self) -> Connection:
        """A connection from the pool (LedgerError if the database cannot be reached, or if
        every connection of the pool stayed in use for its whole timeout)."""
        if self._gone is not None:
            raise LedgerError(self._gone)
        try:
            return self.engine.connect()
        except DBAPIError as exc:
            raise self._unreachable(exc) from exc
        except PoolTimeout as exc:
            raise LedgerError(f"the ledger at {self.url} is busy: {exc}".splitlines()[0],
                              public=BUSY) from exc

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[Connection]:
        conn = self._checkout()
        try:
            if write:
                conn.execution_options(privcal_write=True)
            yield conn
        finally:
            conn.close()


    # ------------------------------------------------------------ subjects
    def subject_key(self) -> bytes:
        """The ledger's secret HMAC key of subject pseudonyms (:mod:`privcal.storage.pseudonyms`).

        Made by migration 0005; a ledger built without migrations gets one on first use.
        """
        if self._subject_key is not None:
            return self._subject_key
        with self.read() as s:
            secret = read_ledger_secret(s)
            if secret is None:
                self._refuse_lost_secret(s)
        if secret is None:
            def tx(s: Session) -> str:
                got = s.get(LedgerSecret, 1)
                if got is None:
                    self._refuse_lost_secret(s)
                    got = LedgerSecret(id=1, secret=pseudonyms.new_secret())
                    s.add(got)
                return got.secret

            secret = self.write(tx)
        if not (isinstance(secret, str) and len(secret) == 64
                and all(c in "0123456789abcdef" for c in secret)):
            raise LedgerError(f"the ledger at {self.url} holds a secret of subject pseudonyms "
                              "(table ledger_secret) that is not 64 hex digits (edited outside "
                              "privcal): restore it from a backup; nothing was written",
                              public="the ledger's secret of subject pseudonyms was edited "
                                     "outside privcal; nothing was written")
        self._subject_key = bytes.fromhex(secret)
        return self._subject_key

    def _refuse_lost_secret(self, s: Session) -> None:
        """LedgerError if the ledger already holds pseudonyms — a spend, a charge's members, a
        baseline, a session's report — while its secret is missing: a new secret would give
        every subject a fresh budget (red team 23, ledger F1: a deleted row, or a ledger
        restored from a dump made with ``--exclude-table=ledger_secret``, was given a new one
        silently, and every subject was charged past her cap)."""
        for table in ("subject_spend", "charge_members", "subject_baseline", "session_reports"):
            if s.execute(text(f"SELECT 1 FROM {table} LIMIT 1")).first() is not None:
                raise LedgerError(
                    f"the ledger at {self.url} has lost the secret of its subject pseudonyms "
                    f"(table ledger_secret is empty) but holds subjects charged under it "
                    f"({table}): restore the row from a backup of this ledger (a new secret "
                    "would give every subject a fresh budget); nothing was written",
                    public="the ledger has lost the secret of its subject pseudonyms: an "
                           "operator must restore it; nothing was written")

    def pseudonyms(self, subjects: Any) -> Any:
        """The stored pseudonym of each subject id (a NumPy array of hex strings)."""
        return pseudonyms.pseudonyms(self.subject_key(), [str(x) for x in subjects])


    # ----------------------------------------------------------------- reading
    def head(self) -> AuditHeadInfo:
        """The last entry of the audit log (seq 0 and 64 zeros for an empty log).

        Entries committed but still queued (PostgreSQL) are chained first
        (:meth:`sequence_audit`), so the head covers every committed write; on a ledger
        this connection may only read, the head of the chain as it stands.
        """
        self.sequence_audit(read_only_ok=True)
        with self.read() as s:
            last = s.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
            if last is None:
                return AuditHeadInfo(seq=0, entry_hash=audit.GENESIS)
            return AuditHeadInfo(seq=last.seq, entry_hash=last.entry_hash)

    def sign_head(self, private_key: Any, *, previous: Any = None,
                  cap_check: Any = None) -> Any:
        """The head of a log that verifies, signed with an Ed25519 key (a key or its PEM
        file): a :class:`~privcal.storage.signing.SignedHead`; see
        :mod:`privcal.storage.signing`.

        The log is verified first (:meth:`verify`; AuditFailed, nothing signed, if it does
        not) and the head signed is the one verified: a signature vouches for a log that
        verified when it was made (red team 18: a rewritten, even a broken, log was signed).
        ``previous``: the last head signed with this key (file, document or SignedHead):
        the log must contain it — a log rewritten or rolled back since is refused.
        The verification checks pure-ε and ρ-zCDP caps against the logged charges (red team
        24, ledger F2), and every dataset with ``cap_check`` (:meth:`verify`); without one, a
        log with an (ε, δ) cap — whose Rényi filter the storage cannot check — is refused
        (InvalidInput, nothing signed: red team 25, ledger F3); with or without one, so is a
        log whose ``releases_unchecked`` is not 0 (red team 26, payrule F1).
        :func:`privcal.accountant.verification.sign_head` passes the (ε, δ) check and
        recomputes every release's guarantees first (``privcal audit head --sign``)."""
        from privcal.storage import signing
        from privcal.storage.verify_caps import refuse_unchecked_cap, refuse_unchecked_releases

        check = cap_check if cap_check is not None else refuse_unchecked_cap
        return signing.sign_verified(refuse_unchecked_releases(partial(
            self.verify, cap_check=check)), private_key, previous)


def _after_fork_in_child() -> None:
    key_locks.after_fork_in_child()
    schema.after_fork_in_child()
    for led in list(_OPEN):
        led._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
