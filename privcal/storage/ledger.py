"""The ledger: a SQL database (SQLite or PostgreSQL) holding budgets, charges, releases and
the hash-chained audit log.

``Ledger(url=None)`` opens ``url``, else ``$PRIVCAL_DATABASE_URL``, else the
embedded default, a SQLite file ``privcal.sqlite`` in ``$PRIVCAL_HOME`` or the
platform's user data directory — created and migrated on first use. A new SQLite
ledger named by URL (a file that does not exist yet or is empty, or ``sqlite://`` in
memory) is likewise created and migrated on first use, as MLflow does. Any other
ledger whose schema is not at the head revision — an existing SQLite file of an older
privcal, or a PostgreSQL database before ``privcal db upgrade`` — is refused with
:class:`~privcal.errors.SchemaOutOfDate` naming ``privcal db upgrade``.

Write transactions go through :meth:`Ledger.write` (an ORM session) or
:meth:`Ledger.write_core` (a Core connection, for the hot charge path), which
retry transient lock and serialization failures — and a connection found dead —
a bounded number of times. Within one, the accountant locks the dataset row
(:meth:`Ledger.lock_dataset`, :meth:`Ledger.dataset_row`) and queues its audit
entries (:meth:`Ledger.append_audit`, which canonicalises the entry at once).
The queued entries are appended as the *last* step before COMMIT, under the
lock of the single ``audit_head`` row: so the log stays one gap-free, fork-free
sequence in commit order, while the global lock is held only for that append
and the commit — charges to different datasets run their checks in parallel.
Locks are always taken dataset rows first, head last, so writers cannot deadlock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import Engine, Row, bindparam, func, insert, inspect, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from privcal import checks, progress
from privcal.errors import AuditFailed, InvalidInput, LedgerError, NotFound, SchemaOutOfDate
from privcal.storage import audit, pseudonyms
from privcal.storage import sessions as _sessions
from privcal.storage.engine import make_engine, parse_url, resolve_url
from privcal.storage.models import (
    SUBJECT_UNIT,
    AuditEntry,
    AuditHead,
    Charge,
    ChargeMembers,
    Dataset,
    LedgerSecret,
    ReleaseRow,
    SubjectBaseline,
    SubjectSpend,
)
from privcal.storage.records import AuditHeadInfo, ReleaseRecord, VerifyReport, parse_threshold
from privcal.storage.session_store import SessionStore

__all__ = ["MAX_ATTEMPTS", "Ledger"]

T = TypeVar("T")

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: SQLite key locks are per process only
    fcntl = None  # type: ignore[assignment]

#: in-process locks of idempotency keys (fcntl locks do not exclude threads of one process)
_KEY_LOCKS: dict[tuple[str, int], threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()

#: attempts of one write transaction before a transient failure is reported
MAX_ATTEMPTS = 12
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: the audit append on PostgreSQL: lock the head, number the entry, hash it (SHA-256 in the
#: server, the same bytes as :func:`privcal.storage.audit.chain_hash`), insert it and move the
#: head — one statement, so the head lock is held for one round trip and the commit
_PG_APPEND = (
    "WITH h AS (SELECT seq + 1 AS seq, entry_hash AS prev FROM audit_head WHERE id = 1 "
    "FOR UPDATE), "
    "e AS (SELECT h.seq, h.prev, %(prefix)s || h.seq::text || '}' AS payload FROM h), "
    "x AS (SELECT e.seq, e.prev, e.payload, encode(sha256('\\x01'::bytea || decode(e.prev, 'hex')"
    " || sha256('\\x00'::bytea || convert_to(e.payload, 'UTF8'))), 'hex') AS hash FROM e), "
    "i AS (INSERT INTO audit_log (seq, kind, payload, prev_hash, entry_hash) "
    "SELECT x.seq, %(kind)s, x.payload, x.prev, x.hash FROM x) "
    "UPDATE audit_head SET seq = x.seq, entry_hash = x.hash FROM x WHERE audit_head.id = 1"
)
_PENDING = "privcal_audit_pending"
_SPENT_COLUMNS = ("spent_pure_eps", "spent_pure_rho", "spent_zcdp_rho", "spent_approx_eps",
                  "spent_approx_delta")

#: key of the PostgreSQL advisory lock held during schema upgrades ("privcal" in ASCII)
_UPGRADE_LOCK_KEY = 0x70726976_63616C


_REVISION_LINE = re.compile(
    r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(None|['\"]([^'\"]+)['\"])\s*$", re.M)


@functools.cache
def _scan_head() -> str | None:
    """The single head of the migration files (a revision no other one revises), or None
    if the files do not say so plainly (then Alembic decides)."""
    revs: set[str] = set()
    downs: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = {m.group(1): m.group(3) for m in _REVISION_LINE.finditer(path.read_text())}
        if "revision" not in found:
            continue
        if found["revision"] is None or "down_revision" not in found:
            return None
        revs.add(found["revision"])
        if found["down_revision"] is not None:
            downs.add(found["down_revision"])
    heads = revs - downs
    return heads.pop() if len(heads) == 1 else None


def _is_transient(exc: BaseException) -> bool:
    """A lock timeout, deadlock or serialization failure: the transaction may simply be retried."""
    if isinstance(exc, OperationalError | DBAPIError):
        orig = getattr(exc, "orig", None)
        msg = str(orig).lower()
        if "database is locked" in msg or "database is busy" in msg:
            return True
        sqlstate = getattr(orig, "sqlstate", None)
        # serialization_failure, deadlock_detected, lock_not_available
        return sqlstate in ("40001", "40P01", "55P03")
    return False


def _check_head_row(head_row: AuditHead | None, last: int, last_hash: str) -> None:
    """The ``audit_head`` row must name the last entry of the chain; say what differs."""
    if head_row is None:
        raise AuditFailed("audit head: the audit_head row is missing (deleted outside privcal)")
    if head_row.seq > last:
        raise AuditFailed(
            f"audit entry {last + 1}: the audit_head row says the log ends at entry "
            f"{head_row.seq} but it ends at {last}: entries were deleted from the end (log "
            "truncated) or the head row's seq was edited")
    if head_row.seq < last:
        raise AuditFailed(
            f"audit head: the audit_head row says the log ends at entry {head_row.seq} but "
            f"entries continue to {last}: the head row's seq was edited (or entries were "
            "appended outside privcal)")
    if head_row.entry_hash != last_hash:
        raise AuditFailed(
            f"audit head: the audit_head row's hash differs from entry {last}'s hash: the head "
            "row was edited")


def _s32(hex_ids: list[str]) -> np.ndarray:
    """Hex pseudonyms as 32-byte NumPy strings (a malformed one fails verification)."""
    try:
        raw = bytes.fromhex("".join(hex_ids))
    except ValueError as exc:
        raise AuditFailed("a stored subject is not a pseudonym (row edited)") from exc
    if len(raw) != len(hex_ids) * pseudonyms.PSEUDONYM_BYTES:
        raise AuditFailed("a stored subject is not a pseudonym (row edited)")
    return np.frombuffer(raw, dtype="S32")


def _sum_by_key(keys: list[np.ndarray], units: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, summed units per key): exact int64 sums."""
    if not keys:
        return np.zeros(0, dtype="S32"), np.zeros(0, dtype=np.int64)
    k = np.concatenate(keys)
    u = np.concatenate(units)
    uniq, inv = np.unique(k, return_inverse=True)
    sums = np.zeros(uniq.shape[0], dtype=np.int64)
    np.add.at(sums, inv.ravel(), u)
    return uniq, sums


def _members_hex(s: Session, charge_id: int) -> set[str]:
    """The pseudonyms (hex) stored for one local-DP charge (only read to explain a failure)."""
    blob = s.scalar(select(ChargeMembers.members).where(ChargeMembers.charge_id == charge_id))
    h, w = bytes(blob or b"").hex(), 2 * pseudonyms.PSEUDONYM_BYTES
    return {h[i:i + w] for i in range(0, len(h), w)}


class Ledger(SessionStore):
    """A privcal ledger at a database URL (see the module docstring)."""

    def __init__(self, url: str | None = None) -> None:
        raw, self.is_default = resolve_url(url)
        self._url = parse_url(raw)
        if self.is_default:
            path = Path(self._url.database or "")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerError(
                    f"cannot create the ledger directory {path.parent}: {exc}") from exc
        self.engine: Engine = make_engine(raw)
        self._schema_ok = False
        self._lock = threading.Lock()
        self._stmts: dict[str, Any] = {}
        self._subject_key: bytes | None = None

    # ------------------------------------------------------------------ basics
    @property
    def url(self) -> str:
        """The URL, password hidden."""
        return self._url.render_as_string(hide_password=True)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._url.get_backend_name()

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    def _unreachable(self, exc: BaseException) -> LedgerError:
        first = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else ""
        return LedgerError(f"cannot reach the ledger at {self.url}: {first}")

    @contextmanager
    def _connect(self, *, write: bool) -> Iterator[Connection]:
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            raise self._unreachable(exc) from exc
        try:
            if write:
                conn.execution_options(privcal_write=True)
            yield conn
        finally:
            conn.close()

    # ------------------------------------------------------------------ schema
    def _alembic_config(self, conn: Connection | None = None) -> Any:
        from alembic.config import Config

        cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        if conn is not None:
            cfg.attributes["connection"] = conn
        return cfg

    def head_revision(self) -> str:
        """The schema revision this version of privcal expects.

        Read from the migration files' ``revision``/``down_revision`` lines (no Alembic
        import on every command's start-up); Alembic itself is asked only if the files
        do not name exactly one head (tests check the two agree).
        """
        head = _scan_head()
        if head is not None:
            return head
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(self._alembic_config()).get_current_head()
        assert head is not None
        return head

    def current(self) -> str | None:
        """The ledger's schema revision (None for an empty database)."""
        with self._connect(write=False) as conn:
            try:
                if not inspect(conn).has_table("alembic_version"):
                    return None
                heads = conn.execute(
                    text("SELECT version_num FROM alembic_version")).scalars().all()
            except DBAPIError as exc:
                raise self._unreachable(exc) from exc
        if len(heads) > 1:  # Alembic's own message for a branched ledger
            from alembic.runtime.migration import MigrationContext

            with self._connect(write=False) as conn:
                return MigrationContext.configure(conn).get_current_revision()
        return heads[0] if heads else None

    def check(self) -> str:
        """The revision if it is the head; else SchemaOutOfDate naming ``privcal db upgrade``."""
        cur, head = self.current(), self.head_revision()
        if cur != head:
            what = "empty (no privcal schema)" if cur is None else f"at revision {cur}"
            raise SchemaOutOfDate(
                f"ledger {self.url} is {what}, this privcal needs revision {head}: "
                "run `privcal db upgrade`"
            )
        return cur

    def upgrade(self, revision: str = "head") -> str:
        """Migrate the schema to ``revision`` under a lock; returns the resulting revision.

        PostgreSQL: a session-level advisory lock; SQLite: the migration runs inside
        one ``BEGIN IMMEDIATE`` transaction. Concurrent upgraders wait, then find
        nothing to do.
        """
        from alembic import command

        with self._connect(write=True) as conn:
            try:
                if self.backend == "postgresql":
                    conn.execute(select(func.pg_advisory_lock(_UPGRADE_LOCK_KEY)))
                    conn.commit()
                try:
                    command.upgrade(self._alembic_config(conn), revision)
                    if conn.in_transaction():
                        conn.commit()
                finally:
                    if self.backend == "postgresql":
                        conn.rollback()
                        conn.execute(select(func.pg_advisory_unlock(_UPGRADE_LOCK_KEY)))
                        conn.commit()
            except DBAPIError as exc:
                raise self._unreachable(exc) from exc
        self._schema_ok = False
        cur = self.current()
        return cur or ""

    def downgrade(self, revision: str) -> None:
        """Migrate down (for tests and operators; never called by privcal itself)."""
        from alembic import command

        with self._connect(write=True) as conn:
            command.downgrade(self._alembic_config(conn), revision)
            if conn.in_transaction():
                conn.commit()
        self._schema_ok = False

    def _sqlite_file(self) -> Path | None:
        """The SQLite file of this ledger (None in memory or on PostgreSQL)."""
        if self.backend != "sqlite" or self._url.database in (None, "", ":memory:"):
            return None
        return Path(self._url.database)

    def exists(self) -> bool:
        """False only for a SQLite file that does not exist yet (nothing is created)."""
        path = self._sqlite_file()
        return path is None or path.exists()

    def _is_new_sqlite(self) -> bool:
        """A SQLite ledger with nothing in it yet: in memory, a missing file, or an empty one."""
        if self.backend != "sqlite":
            return False
        path = self._sqlite_file()
        if path is not None and (not path.exists() or path.stat().st_size == 0):
            if not path.parent.is_dir():
                raise LedgerError(f"cannot create the ledger {path}: no such directory "
                                  f"{path.parent}")
            return True
        from sqlalchemy import inspect

        with self._connect(write=False) as conn:
            return not inspect(conn).get_table_names()

    def ensure_schema(self) -> None:
        """Before any ledger operation: create and migrate the embedded default and any new
        SQLite ledger; refuse every other ledger whose schema is not current (exit 5)."""
        if self._schema_ok:
            return
        with self._lock:
            if self._schema_ok:
                return
            if self.is_default and self.current() != self.head_revision():
                self.upgrade()
            elif self._is_new_sqlite():
                self.upgrade()
            self.check()
            self._schema_ok = True

    # ------------------------------------------------------------ transactions
    def write(self, fn: Callable[[Session], T], *, attempts: int = MAX_ATTEMPTS) -> T:
        """Run ``fn(session)`` in one write transaction and commit; retry transient failures.

        SQLite: the transaction begins ``IMMEDIATE`` (the write lock is held from the first
        read). PostgreSQL: ``fn`` locks the rows it reads (``FOR UPDATE``). The audit
        entries ``fn`` queued are appended last (see the module docstring). On a transient
        failure everything is rolled back and ``fn`` runs again, up to ``attempts`` times.
        """

        def run(conn: Connection) -> T:
            with Session(bind=conn, expire_on_commit=False) as session:
                with session.begin():
                    result = fn(session)
                    session.flush()
                    self._append_pending(conn)
                return result

        return self._retry(run, attempts)

    def write_core(self, fn: Callable[[Connection], T], *,
                   attempts: int = MAX_ATTEMPTS) -> T:
        """:meth:`write` with a Core connection instead of an ORM session (no unit of work,
        no identity map: the hot path of a charge)."""

        def run(conn: Connection) -> T:
            with conn.begin():
                result = fn(conn)
                self._append_pending(conn)
            return result

        return self._retry(run, attempts)

    def _retry(self, run: Callable[[Connection], T], attempts: int) -> T:
        self.ensure_schema()
        delay = 0.01
        for attempt in range(1, attempts + 1):
            try:
                with self._connect(write=True) as conn:
                    conn.info[_PENDING] = []
                    try:
                        return run(conn)
                    finally:
                        conn.info.pop(_PENDING, None)
            except (OperationalError, DBAPIError) as exc:
                # a pooled connection the server closed (no pre-ping: see engine.py) is
                # invalidated by SQLAlchemy; nothing was committed, so run again on a fresh one
                dead = bool(getattr(exc, "connection_invalidated", False))
                if attempt < attempts and (_is_transient(exc) or dead):
                    if not dead:
                        time.sleep(delay * (1 + random.random()))
                        delay = min(delay * 2, 1.0)
                    continue
                if isinstance(exc, IntegrityError):
                    raise
                if _is_transient(exc):
                    raise LedgerError(
                        f"the ledger stayed locked after {attempts} attempts; try again"
                    ) from exc
                if dead or "connect" in str(exc).lower():
                    raise self._unreachable(exc) from exc
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session on one consistent snapshot."""
        self.ensure_schema()
        with self._connect(write=False) as conn:
            if self.backend == "postgresql":
                # READ COMMITTED would give each statement its own snapshot, and `verify` could
                # see a charge row committed after it read the log
                conn.execution_options(isolation_level="REPEATABLE READ")
            with Session(bind=conn, expire_on_commit=False) as session:
                with session.begin():
                    yield session

    @contextmanager
    def key_lock(self, dataset: str, key: str) -> Iterator[None]:
        """Hold the lock of idempotency key ``key`` of ``dataset`` (issue 16 item 1).

        Held by :meth:`privcal.accountant.Accountant.run` from the charge to the release,
        so a concurrent retry with the same key waits, then finds the release. The lock
        dies with its holder, so a crashed run's retry takes it and re-runs once.
        PostgreSQL: a session-level advisory lock on a connection of its own. SQLite: a
        lock within the process, plus (file databases, POSIX) an ``fcntl`` byte-range
        lock on ``<database>.keylocks`` beside the file, which the OS releases when the
        process dies.
        """
        digest = hashlib.sha256(f"privcal key\x00{dataset}\x00{key}".encode(
            "utf-8", "surrogatepass")).digest()
        lock_id = int.from_bytes(digest[:8], "big", signed=True)
        with _KEY_LOCKS_GUARD:
            local = _KEY_LOCKS.setdefault((self.url, lock_id), threading.Lock())
        with local:
            if self.backend == "postgresql":
                with self._connect(write=True) as conn:
                    conn.execute(select(func.pg_advisory_lock(lock_id)))
                    conn.commit()
                    try:
                        yield
                    finally:
                        conn.rollback()
                        conn.execute(select(func.pg_advisory_unlock(lock_id)))
                        conn.commit()
                return
            path = self._url.database
            if fcntl is None or path in (None, "", ":memory:"):
                yield
                return
            offset = lock_id & 0x7FFF_FFFF_FFFF
            with open(f"{path}.keylocks", "a+b") as fh:
                fcntl.lockf(fh, fcntl.LOCK_EX, 1, offset)
                try:
                    yield
                finally:
                    fcntl.lockf(fh, fcntl.LOCK_UN, 1, offset)

    def subject_key(self) -> bytes:
        """The ledger's secret HMAC key of subject pseudonyms (:mod:`privcal.storage.pseudonyms`).

        Made by migration 0005; a ledger built without migrations gets one on first use.
        """
        if self._subject_key is not None:
            return self._subject_key
        with self.read() as s:
            row = s.get(LedgerSecret, 1)
            secret = row.secret if row is not None else None
        if secret is None:
            def tx(s: Session) -> str:
                got = s.get(LedgerSecret, 1)
                if got is None:
                    got = LedgerSecret(id=1, secret=pseudonyms.new_secret())
                    s.add(got)
                return got.secret

            secret = self.write(tx)
        self._subject_key = bytes.fromhex(secret)
        return self._subject_key

    def pseudonyms(self, subjects: Any) -> Any:
        """The stored pseudonym of each subject id (a NumPy array of hex strings)."""
        return pseudonyms.pseudonyms(self.subject_key(), [str(x) for x in subjects])

    def lock_dataset(self, session: Session, name: str) -> Dataset:
        """The dataset row, locked for the rest of the transaction; NotFound if there is none."""
        checks.text(name, "dataset name")
        stmt = select(Dataset).where(Dataset.name == name)
        if self.backend == "postgresql":
            stmt = stmt.with_for_update()
        ds = session.scalars(stmt).one_or_none()
        if ds is None:
            raise NotFound(f"unknown dataset {name!r}")
        return ds

    def _stmt(self, name: str) -> Any:
        """The Core statements of the hot path, built once per ledger (a statement object
        reused keeps its cache key: SQLAlchemy compiles it once)."""
        st = self._stmts.get(name)
        if st is not None:
            return st
        pg = self.backend == "postgresql"
        dt, ct = Dataset.__table__, Charge.__table__
        ht, et = AuditHead.__table__, AuditEntry.__table__
        if name == "dataset":
            st = select(dt).where(dt.c.name == bindparam("name"))
            st = st.with_for_update() if pg else st
        elif name == "by_key":
            st = select(ct).where(ct.c.dataset_id == bindparam("d"),
                                  ct.c.idempotency_key == bindparam("k"))
        elif name == "count":
            st = update(dt).where(dt.c.id == bindparam("d")).values(
                charge_count=dt.c.charge_count + 1)
        elif name == "count_spent":
            st = update(dt).where(dt.c.id == bindparam("d")).values(
                charge_count=dt.c.charge_count + 1,
                **{c: bindparam(f"s_{c}", type_=dt.c[c].type) for c in _SPENT_COLUMNS})
        elif name.startswith("charge"):  # charge / charge+count / charge+count_spent
            # bind names differ from every column name: parameters named like a column would
            # otherwise be added to the statement's SET / VALUES clause
            st = insert(ct).values(
                {c.name: bindparam(f"c_{c.name}", type_=c.type) for c in ct.c if c.name != "id"}
            ).returning(ct.c.id)
            if "+" in name:
                st = st.add_cte(self._stmt(name.split("+")[1]).cte("upd"))
        elif name == "head":
            st = select(ht.c.seq, ht.c.entry_hash).where(ht.c.id == 1)
        elif name == "entry":
            st = insert(et)
        elif name == "move_head":
            st = update(ht).where(ht.c.id == 1).values(seq=bindparam("s"),
                                                       entry_hash=bindparam("h"))
        else:  # pragma: no cover
            raise KeyError(name)
        self._stmts[name] = st
        return st

    def dataset_row(self, conn: Connection, name: str) -> Row[Any]:
        """:meth:`lock_dataset` for :meth:`write_core`: the locked row's columns (Core)."""
        checks.text(name, "dataset name")  # a driver error on PostgreSQL otherwise (NUL)
        row = conn.execute(self._stmt("dataset"), {"name": name}).one_or_none()
        if row is None:
            raise NotFound(f"unknown dataset {name!r}")
        return row

    def charge_by_key(self, conn: Connection, dataset_id: int, key: str) -> Row[Any] | None:
        """The charge of ``dataset_id`` recorded under idempotency ``key``, if any (Core)."""
        return conn.execute(self._stmt("by_key"), {"d": dataset_id, "k": key}).first()

    def insert_charge(self, conn: Connection, values: dict[str, Any],
                      spent: dict[str, Any] | None = None) -> int:
        """Insert a charge row (every column but ``id``) and count it on its dataset, whose
        row the caller has locked, setting the dataset's running totals to ``spent``
        (column → value) if given. Returns the charge id. PostgreSQL: one statement (the
        UPDATE as a CTE); SQLite: two."""
        upd = "count_spent" if spent is not None else "count"
        cparams = {f"c_{k}": v for k, v in values.items()}
        uparams = {"d": values["dataset_id"], **{f"s_{k}": v for k, v in (spent or {}).items()}}
        if self.backend == "postgresql":
            return int(conn.execute(self._stmt(f"charge+{upd}"),
                                    {**cparams, **uparams}).scalar_one())
        conn.execute(self._stmt(upd), uparams)
        return int(conn.execute(self._stmt("charge"), cparams).scalar_one())

    def insert_members(self, conn: Connection, charge_id: int, blob: bytes) -> None:
        """Store the sorted pseudonyms a local-DP charge charged (``charge_members``)."""
        conn.execute(insert(ChargeMembers.__table__), {"charge_id": charge_id, "members": blob})

    def append_audit(self, tx: Session | Connection, kind: str, data: dict[str, Any]) -> None:
        """Queue one entry for the chain in ``tx``'s write transaction.

        The entry is canonicalised now (once); it is numbered, hashed and appended under
        the head-row lock as the transaction's last step (:meth:`_append_pending`).
        """
        conn = tx.connection() if isinstance(tx, Session) else tx
        pending = conn.info.get(_PENDING)
        if pending is None:
            raise LedgerError("audit entries are appended only inside Ledger.write")
        pending.append((kind, audit.entry_prefix(kind, data)))

    def _append_pending(self, conn: Connection) -> None:
        """Append the queued entries, in order, under the ``audit_head`` row lock."""
        pending: list[tuple[str, str]] = conn.info.get(_PENDING) or []
        if not pending:
            return
        if self.backend == "postgresql":
            for kind, prefix in pending:
                conn.exec_driver_sql(_PG_APPEND, {"prefix": prefix, "kind": kind})
        else:
            # SQLite: the BEGIN IMMEDIATE transaction already holds the database write lock
            seq, prev = conn.execute(self._stmt("head")).one()
            rows = []
            for kind, prefix in pending:
                seq += 1
                payload = audit.payload_at(prefix, seq)
                entry_hash = audit.chain_hash(prev, payload)
                rows.append({"seq": seq, "kind": kind, "payload": payload,
                             "prev_hash": prev, "entry_hash": entry_hash})
                prev = entry_hash
            conn.execute(self._stmt("entry"), rows)
            conn.execute(self._stmt("move_head"), {"s": seq, "h": prev})
        pending.clear()

    # ----------------------------------------------------------------- reading
    def head(self) -> AuditHeadInfo:
        """The last entry of the audit log (seq 0 and 64 zeros for an empty log)."""
        with self.read() as s:
            last = s.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
            if last is None:
                return AuditHeadInfo(seq=0, entry_hash=audit.GENESIS)
            return AuditHeadInfo(seq=last.seq, entry_hash=last.entry_hash)

    def sign_head(self, private_key: Any) -> Any:
        """The current head signed with an Ed25519 key (a key or its PEM file), a
        :class:`~privcal.storage.signing.SignedHead`; see :mod:`privcal.storage.signing`."""
        from privcal.storage import signing

        key = private_key if hasattr(private_key, "sign") else \
            signing.load_private_key(private_key)
        return signing.sign_head(self.head(), key)

    def _release_record(self, row: ReleaseRow, dataset_name: str) -> ReleaseRecord:
        return ReleaseRecord(
            id=row.id, dataset=dataset_name, method=row.method,
            calibrator_version=row.calibrator_version, distribution=row.distribution,
            distribution_version=row.distribution_version, params=row.params, shape=row.shape,
            threshold=parse_threshold(row.threshold), coverage=row.coverage, privacy=row.privacy,
            diagnostics=row.diagnostics, requester=row.requester, created_at=row.created_at,
            charge_id=row.charge_id, charge_ids=list(row.charge_ids or []),
        )

    def releases(self, dataset: str | None = None) -> list[ReleaseRecord]:
        """Every release, oldest first, optionally of one dataset (NotFound if there is none)."""
        if dataset is not None:
            checks.text(dataset, "dataset name")
        with self.read() as s:
            stmt = select(ReleaseRow, Dataset.name).join(
                Dataset, Dataset.id == ReleaseRow.dataset_id)
            if dataset is not None:
                if s.scalars(select(Dataset.id).where(Dataset.name == dataset)).first() is None:
                    raise NotFound(f"unknown dataset {dataset!r}")
                stmt = stmt.where(Dataset.name == dataset)
            rows = s.execute(stmt.order_by(ReleaseRow.id)).all()
            return [self._release_record(r, n) for r, n in rows]

    def release(self, release_id: int) -> ReleaseRecord:
        """One release by id (NotFound if there is none)."""
        release_id = checks.row_id(release_id, "release")
        with self.read() as s:
            row = s.execute(
                select(ReleaseRow, Dataset.name)
                .join(Dataset, Dataset.id == ReleaseRow.dataset_id)
                .where(ReleaseRow.id == release_id)
            ).first()
            if row is None:
                raise NotFound(f"unknown release {release_id}")
            return self._release_record(row[0], row[1])

    # ------------------------------------------------------------------ verify
    def verify(self, expect_head: str | None = None, *, signed_head: Any = None,
               trusted_key: Any = None, allow_unsigned_tail: bool = False) -> VerifyReport:
        """Recompute the whole chain and cross-check every row against its entry.

        Raises AuditFailed naming the first entry (or row) that does not verify:
        a broken hash or link, a gap in the sequence (a deleted entry), a payload
        that is not canonical, a dataset/charge/release row that differs from what
        its entry recorded (an edited threshold or amount) or has no entry, running
        totals that do not equal the sum of the charges, per-subject spends that the
        logged local-DP charges (and the 0005 baseline) do not add up to subject by
        subject, session status/state or reports that differ from what their entries
        committed, a replaced ledger secret, and — with ``expect_head="SEQ:HASH"`` — a log
        truncated before SEQ or rewritten up to it.

        ``signed_head`` (a :class:`~privcal.storage.signing.SignedHead`, its document or
        file) with ``trusted_key`` (an Ed25519 public key or its PEM file): the signature
        must verify, the log must contain the signed head, and every later entry is one
        the key holder did not sign — a failure naming the first, unless
        ``allow_unsigned_tail`` (then counted in ``unsigned_entries``).
        """
        signed = None
        if signed_head is not None or trusted_key is not None:
            from privcal.storage import signing

            if signed_head is None or trusted_key is None:
                raise InvalidInput("a signed head is verified with a trusted public key: give "
                                   "both (--signed-head FILE --trusted-key PUBFILE)")
            signed = signing.read_signed_head(signed_head)
            signing.verify_signed_head(signed, trusted_key)
        want: tuple[int, str] | None = None
        wants: list[tuple[int, str, str]] = []
        if expect_head is not None:
            if not isinstance(expect_head, str):
                raise InvalidInput("expect_head must be SEQ:HASH text (an integer and 64 hex "
                                   f"digits), got {type(expect_head).__name__}")
            try:
                seq_s, hash_s = expect_head.strip().split(":", 1)
                want = (int(seq_s), hash_s.lower())
                bytes.fromhex(want[1])
                if len(want[1]) != 64 or want[0] < 0:
                    raise ValueError
            except ValueError as exc:
                raise InvalidInput(
                    "--expect-head must be SEQ:HASH (an integer and 64 hex digits), "
                    f"got {expect_head!r}"
                ) from exc
        if want is not None:
            wants.append((want[0], want[1], "expected head"))
        if signed is not None:
            wants.append((signed.seq, signed.hash.lower(), "signed head"))
        with self.read() as s:
            datasets = {d.id: d for d in s.scalars(select(Dataset))}
            charges = {c.id: c for c in s.scalars(select(Charge))}
            releases = {r.id: r for r in s.scalars(select(ReleaseRow))}
            names = {i: d.name for i, d in datasets.items()}
            seen: dict[str, set[int]] = defaultdict(set)
            prev = audit.GENESIS
            expected = 1
            count = 0
            head_row = s.get(AuditHead, 1)
            coll = {c.id: c for c in s.scalars(select(_sessions.CollectionSession))}
            tally = _sessions.SessionTally()
            charge_seq: dict[int, int] = {}
            migration: tuple[int, dict[str, Any]] | None = None
            for e in progress.iterate(s.scalars(select(AuditEntry).order_by(AuditEntry.seq)),
                                      "verifying the audit log", head_row.seq if head_row else 0):
                if e.seq != expected:
                    raise AuditFailed(
                        f"audit entry {expected} is missing (the log jumps from {expected - 1} "
                        f"to {e.seq}): a row was deleted"
                    )
                if e.prev_hash != prev:
                    raise AuditFailed(
                        f"audit entry {e.seq}: prev_hash does not link to entry {e.seq - 1}")
                try:
                    doc = json.loads(e.payload)
                    canonical_ok = audit.canonical(doc) == e.payload
                except (ValueError, TypeError):
                    canonical_ok, doc = False, {}
                if not canonical_ok:
                    raise AuditFailed(f"audit entry {e.seq}: payload is not canonical JSON")
                if audit.chain_hash(prev, e.payload) != e.entry_hash:
                    raise AuditFailed(f"audit entry {e.seq}: hash does not match its payload "
                                      "(entry altered)")
                if doc.get("seq") != e.seq or doc.get("kind") != e.kind:
                    raise AuditFailed(f"audit entry {e.seq}: payload records seq {doc.get('seq')} "
                                      f"kind {doc.get('kind')!r} (entries reordered)")
                if e.kind in _sessions.SESSION_KINDS:
                    _sessions.check_entry(e.seq, e.kind, doc.get("data") or {}, coll, names,
                                          tally)
                elif e.kind == "migration":
                    if migration is not None:
                        raise AuditFailed(f"audit entry {e.seq}: a second migration entry")
                    migration = (e.seq, doc.get("data") or {})
                    _sessions.check_migration(e.seq, migration[1], coll, tally)
                else:
                    if e.kind == "charge":
                        cid = (doc.get("data") or {}).get("charge_id")
                        if isinstance(cid, int):
                            charge_seq[cid] = e.seq
                    self._check_row(e.seq, e.kind, doc.get("data") or {}, datasets, charges,
                                    releases, names, seen)
                prev = e.entry_hash
                expected += 1
                count += 1
                for w_seq, w_hash, w_what in wants:
                    if e.seq == w_seq and e.entry_hash != w_hash:
                        raise AuditFailed(f"audit entry {e.seq}: hash differs from the {w_what} "
                                          "(log rewritten)")
            last = count
            _check_head_row(head_row, last, prev)
            for w_seq, w_hash, w_what in wants:
                if w_seq > last:
                    raise AuditFailed(f"audit entry {last + 1}: missing; the {w_what} is "
                                      f"entry {w_seq} but the log ends at {last} "
                                      "(log truncated)")
                if w_seq == 0 and w_hash != audit.GENESIS:
                    raise AuditFailed(f"audit entry 0: the {w_what}'s hash is not the genesis "
                                      "hash")
            unsigned = 0
            if signed is not None:
                unsigned = last - signed.seq
                if unsigned > 0 and not allow_unsigned_tail:
                    raise AuditFailed(
                        f"audit entry {signed.seq + 1}: not signed by the trusted key (the signed "
                        f"head is entry {signed.seq}, signed {signed.time}; {unsigned} later "
                        "entr" + ("y is" if unsigned == 1 else "ies are") + " unsigned: "
                        "appended since, or forged)")
            for kind, rows in (("dataset", datasets), ("charge", charges), ("release", releases)):
                missing = sorted(set(rows) - seen[kind])
                if missing:
                    raise AuditFailed(f"{kind} {missing[0]} has no audit entry (row inserted "
                                      "outside privcal, or its entry deleted)")
            _sessions.check_sessions(s, coll, tally)
            self._check_totals(s, datasets, charges)
            self._check_subjects(s, datasets, charges, charge_seq, migration)
            return VerifyReport(entries=count, head=f"{last}:{prev}", datasets=len(datasets),
                                charges=len(charges), releases=len(releases),
                                signed_through=signed.seq if signed is not None else None,
                                unsigned_entries=unsigned)

    @staticmethod
    def _check_row(
        seq: int, kind: str, data: dict[str, Any], datasets: dict[int, Dataset],
        charges: dict[int, Charge], releases: dict[int, ReleaseRow], names: dict[int, str],
        seen: dict[str, set[int]],
    ) -> None:
        if kind == "dataset":
            rid = data.get("dataset_id")
            row_d = datasets.get(rid) if isinstance(rid, int) else None
            if row_d is None:
                raise AuditFailed(f"audit entry {seq}: dataset {rid} is missing from the ledger")
            if audit.dataset_doc(row_d) != data:
                raise AuditFailed(f"audit entry {seq}: dataset {rid} ({row_d.name!r}) differs "
                                  "from what the log recorded (row edited)")
        elif kind == "charge":
            rid = data.get("charge_id")
            row_c = charges.get(rid) if isinstance(rid, int) else None
            if row_c is None:
                raise AuditFailed(f"audit entry {seq}: charge {rid} is missing from the ledger "
                                  "(row deleted)")
            if audit.charge_doc(row_c, names.get(row_c.dataset_id, "?")) != data:
                raise AuditFailed(f"audit entry {seq}: charge {rid} differs from what the log "
                                  "recorded (row edited)")
        elif kind == "release":
            rid = data.get("release_id")
            row_r = releases.get(rid) if isinstance(rid, int) else None
            if row_r is None:
                raise AuditFailed(f"audit entry {seq}: release {rid} is missing from the ledger "
                                  "(row deleted)")
            if audit.release_doc(row_r, names.get(row_r.dataset_id, "?")) != data:
                raise AuditFailed(f"audit entry {seq}: release {rid} differs from what the log "
                                  "recorded (threshold or another field edited)")
        else:
            raise AuditFailed(f"audit entry {seq}: unknown kind {kind!r}")
        if rid in seen[kind]:
            raise AuditFailed(f"audit entry {seq}: {kind} {rid} is logged twice")
        seen[kind].add(rid)

    @staticmethod
    def _check_subjects(s: Session, datasets: dict[int, Dataset], charges: dict[int, Charge],
                        charge_seq: dict[int, int],
                        migration: tuple[int, dict[str, Any]] | None) -> None:
        """Recompute every per-subject spend from the chain (issue 16 item 3).

        Expected units of (dataset, pseudonym) = its baseline (committed by the 0005
        ``migration`` entry) + ε0 of every local-DP charge whose committed members include
        it. Any difference from ``subject_spend`` — a renamed subject, moved, added or
        deleted units — fails naming the dataset and the pseudonym.
        """
        secret = s.get(LedgerSecret, 1)
        kid = pseudonyms.key_id(bytes.fromhex(secret.secret)) if secret is not None else None
        keys: dict[int, list[np.ndarray]] = defaultdict(list)  # dataset → S32 pseudonyms
        weights: dict[int, list[np.ndarray]] = defaultdict(list)  # … and their units
        baseline: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for d, subj, units in s.execute(select(SubjectBaseline.dataset_id,
                                               SubjectBaseline.subject,
                                               SubjectBaseline.spent_units)):
            baseline[d].append((subj, int(units)))
        for d, rows in baseline.items():
            keys[d].append(_s32([r[0] for r in rows]))
            weights[d].append(np.asarray([r[1] for r in rows], dtype=np.int64))
        mdata = migration[1] if migration is not None else {}
        if migration is not None and mdata.get("subject_key") != kid:
            raise AuditFailed(f"audit entry {migration[0]}: the ledger secret of subject "
                              "pseudonyms is not the one the log recorded (secret replaced)")
        logged = mdata.get("subject_spend") or {}
        for d in sorted(set(baseline) | {int(k) for k in logged}):
            want = logged.get(str(d))
            if want is None or want.get("digest") != pseudonyms.spend_digest(baseline[d]):
                where = f"audit entry {migration[0]}" if migration else "the audit log"
                raise AuditFailed(f"{where}: the per-subject baseline of dataset {d} differs "
                                  "from what the log recorded (rows edited)")
        blobs = dict(s.execute(select(ChargeMembers.charge_id, ChargeMembers.members)).all())
        for cid, c in sorted(charges.items()):
            seq = charge_seq.get(cid, 0)
            if c.members_digest is None:
                if c.scope == "subjects" and c.subjects_accepted and (
                        migration is None or seq > migration[0]):
                    raise AuditFailed(f"audit entry {seq}: charge {cid} does not record which "
                                      "subjects it charged")
                continue
            blob = blobs.pop(cid, None)
            if blob is None or kid is None or \
                    pseudonyms.members_digest(kid, bytes(blob)) != c.members_digest:
                raise AuditFailed(f"audit entry {seq}: the subjects charged by charge {cid} "
                                  "differ from what the log recorded (rows edited, or the "
                                  "ledger secret replaced)")
            n = len(blob) // pseudonyms.PSEUDONYM_BYTES
            if n * pseudonyms.PSEUDONYM_BYTES != len(blob) or n != (c.subjects_accepted or 0):
                raise AuditFailed(f"audit entry {seq}: charge {cid} records "
                                  f"{c.subjects_accepted} subjects but stores {n}")
            keys[c.dataset_id].append(np.frombuffer(bytes(blob), dtype="S32"))
            weights[c.dataset_id].append(np.full(
                n, int((c.eps0 or Decimal(0)) / SUBJECT_UNIT), dtype=np.int64))
        if blobs:
            raise AuditFailed(f"charge_members of charge {min(blobs)} has no logged charge "
                              "(row inserted)")
        stored: dict[int, tuple[list[str], list[int]]] = defaultdict(lambda: ([], []))
        # 10⁶ rows: the DB-API cursor directly, without ORM row objects
        for d, subj, u in s.connection().exec_driver_sql(
                "SELECT dataset_id, subject, spent_units FROM subject_spend"):
            stored[d][0].append(subj)
            stored[d][1].append(int(u))
        for d in sorted(set(keys) | set(stored)):
            want_k, want_u = _sum_by_key(keys.get(d, []), weights.get(d, []))
            got_k, got_u = _sum_by_key([_s32(stored[d][0])] if d in stored else [],
                                       [np.asarray(stored[d][1], dtype=np.int64)]
                                       if d in stored else [])
            if got_k.shape == want_k.shape and (got_k == want_k).all() and \
                    (got_u == want_u).all() and len(stored[d][0]) == got_k.size:
                continue
            exp = dict(zip(want_k.tolist(), want_u.tolist(), strict=True))
            act = dict(zip(got_k.tolist(), got_u.tolist(), strict=True))
            # a subject the log knows first: its entries are the ones to name
            bad = sorted((k for k in set(act) | set(exp) if act.get(k, 0) != exp.get(k, 0)),
                         key=lambda k: (exp.get(k, 0) == 0, k))
            if not bad:  # the same subject stored twice (cannot happen with the primary key)
                raise AuditFailed(f"dataset {d}: a subject has two spend rows (rows edited)")
            k = bad[0]
            subj = bytes(k).ljust(pseudonyms.PSEUDONYM_BYTES, b"\x00").hex()
            name = datasets[d].name if d in datasets else "?"
            seqs = [charge_seq.get(cid, 0) for cid, c in sorted(charges.items())
                    if c.dataset_id == d and c.members_digest is not None
                    and subj in _members_hex(s, cid)]
            raise AuditFailed(
                f"dataset {d} ({name!r}): subject {subj[:16]}… has spent "
                f"{act.get(k, 0)} units in subject_spend but the log's charges "
                f"(entries {seqs or 'none'}) add up to {exp.get(k, 0)} "
                f"({len(bad)} subject row(s) differ: renamed, moved or edited)")

    @staticmethod
    def _check_totals(s: Session, datasets: dict[int, Dataset], charges: dict[int, Charge]) -> None:
        zero = Decimal(0)
        with localcontext() as ctx:
            ctx.prec = 80
            sums: dict[int, list[Decimal]] = defaultdict(lambda: [zero] * 5)
            counts: dict[int, int] = defaultdict(int)
            local_units: dict[int, Decimal] = defaultdict(lambda: zero)
            for c in charges.values():
                t = sums[c.dataset_id]
                counts[c.dataset_id] += 1
                if c.notion == "pure" and c.epsilon is not None:
                    t[0] += c.epsilon
                    t[1] += c.epsilon * c.epsilon / 2
                elif c.notion == "zcdp" and c.rho is not None:
                    t[2] += c.rho
                elif c.notion == "approx" and c.epsilon is not None and c.delta is not None:
                    t[3] += c.epsilon
                    t[4] += c.delta
                if c.eps0 is not None and c.subjects_accepted:
                    local_units[c.dataset_id] += c.eps0 / SUBJECT_UNIT * c.subjects_accepted
            stored_units = dict(
                s.execute(select(SubjectSpend.dataset_id, func.sum(SubjectSpend.spent_units))
                          .group_by(SubjectSpend.dataset_id)).all()
            )
            for ds in datasets.values():
                got = [ds.spent_pure_eps, ds.spent_pure_rho, ds.spent_zcdp_rho,
                       ds.spent_approx_eps, ds.spent_approx_delta]
                if got != sums[ds.id] or ds.charge_count != counts[ds.id]:
                    raise AuditFailed(f"dataset {ds.id} ({ds.name!r}): spent totals do not equal "
                                      "the sum of its logged charges (row edited)")
                if Decimal(int(stored_units.get(ds.id) or 0)) != local_units[ds.id]:
                    raise AuditFailed(f"dataset {ds.id} ({ds.name!r}): per-subject spends do not "
                                      "add up to its logged local-DP charges (rows edited)")
