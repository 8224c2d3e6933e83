"""The optimistic charge on PostgreSQL: one round trip when this process's snapshot of the
dataset row is current, proved by a compare-and-set inside the writing statement (issue 11).

A charge by the locked path (:meth:`~privcal.storage.Ledger.write_core`) costs three round
trips: ``BEGIN`` with ``SELECT … FOR UPDATE`` of the dataset row, the statement that writes,
``COMMIT``. But the process that made the last charge of a dataset knows that row as it
left it (the writing statement returns it). :class:`OptimisticCharges` keeps it per ledger,
process and dataset (:meth:`~OptimisticCharges.remember_dataset`); the accountant checks the
budget in Python against it and sends :func:`cas_charge_sql` — one message, two statements,
one implicit transaction (a multi-statement simple query: an error in either rolls back
both), so one round trip that *is* the commit:

1. ``UPDATE datasets SET <new totals>, charge_count = charge_count + 1 WHERE id = … AND
   <every other column> IS NOT DISTINCT FROM <the snapshot> AND NOT EXISTS <a charge under
   this idempotency key> RETURNING <the new row>``, the charge's INSERT hanging off it
   (``INSERT … SELECT … FROM upd``) and its id put in a transaction-local setting. Exact
   under concurrency: under READ COMMITTED an UPDATE that finds its row changed by a
   concurrent transaction waits for it to end and then re-evaluates its WHERE clause on the
   newest row version (PostgreSQL manual, 13.2.1 "Read Committed Isolation Level", the
   EvalPlanQual recheck), so the row it updates equals the snapshot *as committed*, and it
   holds the row lock from then to COMMIT — what the locked path's ``FOR UPDATE`` gives.
   Every column is compared (caps, notion, Rényi orders — as ``jsonb`` — totals, count,
   name, everything), so no writer of ``datasets`` rows, privcal's or an administrator's
   ``UPDATE``, can leave a snapshot that passes stale; a deleted or re-created dataset has
   no row with that id and those columns. When the row differs, nothing matches, so no
   charge is inserted and the second statement writes nothing.
2. The audit append (:func:`~privcal.storage.audit_queue.pg_append_with` with
   ``commit_now``) for the charge whose id statement 1 set — in a statement of its own so
   that its snapshot is taken *after* statement 1 holds the dataset row lock: every earlier
   writer of this dataset (the lock holders before it, charges, releases, session batches)
   has committed and its queued entries are visible, which is the audit sequencer's
   per-dataset order argument (:mod:`privcal.storage.audit_queue`). Granted the sequencer
   lock K with the queue empty, the entry is chained; otherwise it is queued (there is no
   "drain before COMMIT" here: the COMMIT is already on its way), and if K was granted
   behind queued entries the ledger's next charge takes the locked path, which drains them.

The CAS failing (or no snapshot, or a refusal against the snapshot, which is not
authoritative) sends the charge down the locked path, which refreshes the snapshot. After a
failure the dataset's next 1, 2, 4 … 64 charges in this process go the locked path at once
(:meth:`~OptimisticCharges.charge_snapshot`), and so do they after a locked charge that finds
another process charged the dataset since this one's last (:meth:`remember_dataset`); a
charge that finds no other writer halves the wait. So eight writers on one dataset do not
keep paying a failed round trip. A forked child starts with no snapshots (a stale one would only
cost a failed CAS, but a child's first charges should not all fail).

A connection lost while the statement ran (:data:`LOST`) leaves its outcome unknown —
the statement is its own COMMIT (the rule of :func:`~privcal.storage.transactions._commit_once`).
The accountant then takes the locked path on a fresh connection, which decides it under the
row lock: a keyed charge replays if it was recorded; an unkeyed one goes ahead only if the
row still equals the snapshot (had the lost statement committed, ``charge_count`` — which
only grows — would differ, and if it is still running its CAS fails behind our lock),
else it raises a one-line LedgerError.
"""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Integer, Numeric, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from privcal.storage.audit import charge_prefix
from privcal.storage.audit_queue import CHARGE_ID_HEAD, pg_append_with
from privcal.storage.charges import _ID_ZERO
from privcal.storage.models import Charge, Dataset
from privcal.storage.statements import SPENT_COLUMNS, Codec

__all__ = ["LOST", "OptimisticCharges", "cas_charge_sql"]

#: :meth:`OptimisticCharges.cas_record_charge`'s answer when the connection was lost while
#: the statement ran: it may or may not have committed
LOST = "lost"
#: the transaction-local setting that carries the charge id from statement 1 to statement 2
_SETTING = "privcal.cas_charge"
#: snapshots kept per ledger and process at most (cleared when full)
_MAX_SNAPSHOTS = 4096
#: the optimistic message's first statement: generic plans of its prepared statements, for
#: this implicit transaction only (a multi-statement message is one transaction block, where
#: SET LOCAL applies: :func:`prepared`)
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan"
#: most locked-path charges of a dataset after a failed CAS before trying again
_MAX_BACKOFF = 64


def _pg_type(t: TypeEngine[Any], dialect: Dialect) -> str:
    """The PostgreSQL type a parameter for a column of type ``t`` is cast to (the statement
    goes by the simple protocol, where psycopg binds values as literals)."""
    if isinstance(t, TypeDecorator):
        t = t.load_dialect_impl(dialect)
    for cls, name in ((JSON, "jsonb"), (Boolean, "boolean"), (Integer, "bigint"),
                      (Numeric, "numeric"), (DateTime, "timestamptz"), (String, "text")):
        if isinstance(t, cls):
            return name
    raise TypeError(f"no PostgreSQL cast for {t!r}")  # pragma: no cover - a new column type


def cas_charge_sql(dialect: Dialect, dataset: Codec, charge_cols: tuple[str, ...]) -> str:
    """The optimistic charge's two statements (module docstring). Parameters, in order: the
    new totals (:data:`~privcal.storage.statements.SPENT_COLUMNS`), the dataset id, the
    snapshot's every other column (:attr:`Codec.names` order), the idempotency key, the
    dataset id and the key again, the charge's columns (``charge_cols``), the entry's kind and its
    prefix after the charge id. Statement 1 returns the new dataset row and the charge id
    (no row: the CAS failed); statement 2 (granted, direct, head rows moved, charge id).

    The key's look-up is gated by ``key IS NOT NULL`` — a one-time filter of the plan: a
    prepared statement may run a generic plan, and one built on stale statistics scanned
    every charge of the dataset by ``ix_charges_dataset_id`` to find no row for a NULL key,
    so an unkeyed charge cost O(charges of the dataset) (1.0 → 2.2 ms per charge over
    12 000 charges); keyed look-ups go by ``uq_charge_idem``, the only index on
    ``charges.dataset_id`` since migration 0007.

    Statement 1 also requires the audit head row (a charge is not recorded without it, as
    on the locked path, which then refuses it with a one-line error)."""
    dcols = {c.name: c for c in Dataset.__table__.c}
    ccols = {c.name: c for c in Charge.__table__.c}
    same = []
    for n in dataset.names:
        if n == "id":
            continue
        ty = _pg_type(dcols[n].type, dialect)
        # JSON: compared as jsonb, SQL NULL as JSON null (both load as None)
        col = f"coalesce({n}::jsonb, 'null'::jsonb)" if ty == "jsonb" else n
        same.append(f"{col} IS NOT DISTINCT FROM %s::{ty}")
    sets = ", ".join(f"{c} = %s::numeric" for c in SPENT_COLUMNS)
    values = ", ".join(f"%s::{_pg_type(ccols[n].type, dialect)}" for n in charge_cols)
    upd_cols = ", ".join(f"upd.{n}" for n in dataset.names)
    first = (
        f"WITH upd AS (UPDATE datasets SET charge_count = charge_count + 1, {sets} "
        f"WHERE id = %s::bigint AND {' AND '.join(same)} AND NOT EXISTS (SELECT 1 FROM "
        "charges WHERE %s::text IS NOT NULL AND dataset_id = %s::bigint "
        "AND idempotency_key = %s::text) "
        "AND EXISTS (SELECT 1 FROM audit_head WHERE id = 1) "
        f"RETURNING {', '.join(dataset.names)}), "
        f"c AS (INSERT INTO charges ({', '.join(charge_cols)}) SELECT {values} FROM upd "
        "RETURNING id) "
        f"SELECT {upd_cols}, set_config('{_SETTING}', c.id::text, true) FROM upd, c")
    second = pg_append_with(
        f"p AS (SELECT x.id, %s::text AS kind, '{CHARGE_ID_HEAD}' || x.id::text || %s::text "
        f"AS prefix FROM (SELECT NULLIF(current_setting('{_SETTING}', true), '')::bigint "
        "AS id) AS x WHERE x.id IS NOT NULL)", commit_now=True)
    return f"{first}; {second}"


def prepared(sql: str) -> tuple[list[tuple[str, str]], str]:
    """``sql`` (statements with ``%s`` parameters, ``"; "`` between them) as server-side
    prepared statements: ``(name, PREPARE statement)`` for each, sent once per connection
    (ahead of its first charge, in the same message), and the message that executes them
    all with the same parameters. The server then parses and
    plans the charge once per connection, not once per charge (a simple-protocol message,
    which the one-round-trip transaction needs, cannot use the extended protocol's prepared
    statements). The message first sets ``plan_cache_mode`` to ``force_generic_plan`` for
    its own transaction only (:data:`_GENERIC`): left to ``auto``, the server kept choosing a
    custom plan — planning the two statements again at every charge, ≈ 0.3 ms of server
    time per charge, measured (1.24–1.33 → 0.89–0.93 ms per warm charge, one client). The
    generic plan reads no more than a custom one: every look-up is by primary key or by
    ``uq_charge_idem`` behind a ``key IS NOT NULL`` gate (tests/test_migration_0007.py
    checks the key look-up under a generic plan). Names carry a digest of the text: another
    version's statements never collide."""
    digest = hashlib.sha256(sql.encode()).hexdigest()[:16]
    prepares, executes = [], []
    for i, stmt in enumerate(sql.split("; WITH "), 1):
        stmt = stmt if i == 1 else f"WITH {stmt}"
        parts = stmt.split("%s")
        body = parts[0] + "".join(f"${j}{part}" for j, part in enumerate(parts[1:], 1))
        name = f"privcal_cas_{digest}_{i}"
        prepares.append((name, f"PREPARE {name} AS {body}"))
        executes.append(f"EXECUTE {name}({', '.join(['%s'] * (len(parts) - 1))})")
    return prepares, "; ".join([_GENERIC, *executes])


class OptimisticCharges:
    """The dataset snapshots and the one-round-trip charge of a
    :class:`~privcal.storage.ledger.Ledger` (see the module docstring)."""

    # ``backend``, ``hot_sql``, ``ensure_schema``, ``_hot_connect`` and ``_db_error`` are the
    # Ledger's; the state below is made on first use, per process
    _opt_pid: int = -1
    _snapshots: dict[str, Any]
    _backoff: dict[str, list[int]]
    _drain_next: bool

    def _opt_state(self) -> None:
        """This process's snapshots: a forked child starts with none."""
        if self._opt_pid != os.getpid():
            self._snapshots, self._backoff = {}, {}
            self._drain_next = False
            self._opt_pid = os.getpid()

    def charge_snapshot(self, name: str) -> Any | None:
        """The dataset row ``name`` as this process's last charge left it, if it may be tried
        optimistically now (PostgreSQL; not while backing off after a failed CAS, nor when
        queued entries wait for the locked path's drain); else None."""
        if self.backend != "postgresql":  # type: ignore[attr-defined]
            return None
        self._opt_state()
        if self._drain_next:
            self._drain_next = False
            return None
        back = self._backoff.get(name)
        if back is not None and back[0] > 0:
            back[0] -= 1
            return None
        return self._snapshots.get(name)

    def remember_dataset(self, row: Any, *, locked: bool = False) -> None:
        """Keep ``row`` (a dataset row as :meth:`dataset_row` loads it) as the snapshot of its
        dataset. Any row will do for correctness — the CAS compares it with the committed
        row — but only one that is current saves a round trip.

        ``locked``: ``row`` is what a charge by the locked path left. If another writer
        charged the dataset since this process's last charge (the count moved by more than
        this charge), the dataset is contended: back off from the optimistic path as after
        a failed CAS, without having paid for one; else halve the back-off."""
        self._opt_state()
        if len(self._snapshots) >= _MAX_SNAPSHOTS:
            self._snapshots.clear()
            self._backoff.clear()
        old = self._snapshots.get(row.name)
        if locked and old is not None and old.id == row.id:
            back = self._backoff.setdefault(row.name, [0, 1])
            if row.charge_count != old.charge_count + 1:
                back[0], back[1] = max(back[0], back[1]), min(2 * back[1], _MAX_BACKOFF)
            else:
                back[1] = max(1, back[1] // 2)
        self._snapshots[row.name] = row

    def forget_dataset(self, name: str) -> None:
        """Drop the snapshot of dataset ``name`` (a write on it failed)."""
        self._opt_state()
        self._snapshots.pop(name, None)

    def cas_record_charge(self, snap: Any, values: dict[str, Any],
                          spent: dict[str, Any]) -> int | str | None:
        """Record a charge of the dataset whose row the caller checked it against (``snap``)
        in one round trip, if that row is still the committed one: the charge row
        (``values``: every column but ``id``), the dataset's new totals ``spent`` and the
        charge's audit entry, exactly as
        :meth:`~privcal.storage.charges.ChargeStore.record_charge` writes them. Returns the
        charge id; None if nothing was written (the CAS failed, or the server refused the
        statement: the caller takes the locked path); :data:`LOST` if the connection was
        lost while the statement ran (module docstring)."""
        self.ensure_schema()  # type: ignore[attr-defined]
        q = self.hot_sql  # type: ignore[attr-defined]
        cas = getattr(q, "cas_charge", None)
        if cas is None:  # written once per ledger, with its other hot statements
            cas = q.cas_charge = prepared(cas_charge_sql(  # type: ignore[attr-defined]
                self.engine.dialect, q.dataset, q.charge_cols))
        prepares, sql = cas
        prefix = charge_prefix(SimpleNamespace(id=0, **values), snap.name)
        if not prefix.startswith(_ID_ZERO):  # pragma: no cover - RFC 8785 key order
            raise AssertionError("a charge entry does not begin with its charge_id")
        ds = snap._asdict()
        same = q.dataset.dump(ds, [n for n in q.dataset.names if n != "id"])
        params = ([spent[c] for c in SPENT_COLUMNS] + [snap.id] + same
                  + [values["idempotency_key"], snap.id, values["idempotency_key"]]
                  + q.charge.dump(values, q.charge_cols)
                  + ["charge", prefix[len(_ID_ZERO) - 1:]])
        with self._hot_connect() as conn:  # type: ignore[attr-defined]
            drv = conn.connection.driver_connection
            try:
                cur = conn.info.get(_CAS_CURSOR)
                if cur is None:
                    from psycopg import ClientCursor

                    cur = conn.info[_CAS_CURSOR] = ClientCursor(drv)
                drv.autocommit = True  # the message is its own (implicit) transaction
                fresh = not conn.info.get(_CAS_PREPARED)
                if fresh:  # this connection's first: PREPARE in the same message
                    sql = "; ".join([*(p for _, p in prepares), sql])
                cur.execute(sql, params)
                for _ in range(len(prepares) if fresh else 0):
                    cur.nextset()
                cur.nextset()  # past SET LOCAL (_GENERIC)
                conn.info[_CAS_PREPARED] = True
                row = cur.fetchone()
                cur.nextset()
                appended = cur.fetchone()
            except conn.dialect.loaded_dbapi.Error as exc:
                err = self._db_error(conn, exc, "optimistic charge", ())  # type: ignore[attr-defined]
                state = getattr(exc, "sqlstate", None)
                server = state is not None
                self.forget_dataset(snap.name)
                if state == "26000":  # the prepared statements are gone (DEALLOCATE)
                    conn.info.pop(_CAS_PREPARED, None)
                elif state == "42P05":  # already prepared (by an earlier message)
                    conn.info[_CAS_PREPARED] = True
                if err.connection_invalidated or not server:
                    return LOST
                return None  # the server refused it: the implicit transaction rolled back
            finally:
                if not conn.invalidated:
                    try:
                        drv.autocommit = False
                    except conn.dialect.loaded_dbapi.Error as exc:  # pragma: no cover
                        conn.invalidate(exc)
        back = self._backoff.setdefault(snap.name, [0, 1])
        if row is None:  # the row changed: back off, then try again (the stale snapshot is
            # kept: the locked path replaces it, and compares it to see if others still write)
            back[0], back[1] = back[1], min(2 * back[1], _MAX_BACKOFF)
            return None
        back[1] = max(1, back[1] // 2)  # (halved, not reset: one lucky CAS among many)
        n = len(q.dataset.names)
        self.remember_dataset(q.dataset.load(row[:n]))
        got, direct, _moved, _cid = appended
        if got and not direct:  # queued behind queued entries: the next charge drains them
            self._drain_next = True
        return int(row[n])


#: ``Connection.info`` keys of the optimistic charge's client-side-binding cursor and of the
#: flag that its statements are prepared on that connection
_CAS_CURSOR, _CAS_PREPARED = "privcal_cas_cursor", "privcal_cas_prepared"
