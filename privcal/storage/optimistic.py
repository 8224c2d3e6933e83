"""The optimistic charge on PostgreSQL: one round trip when this process knows the dataset's
policy, the budget checked by the writing statement itself on the row as committed (issue 11).

A charge by the locked path (:meth:`~privcal.storage.Ledger.write_core`) costs three round
trips: ``BEGIN`` with ``SELECT … FOR UPDATE`` of the dataset row, the statement that writes,
``COMMIT`` — and holds the dataset's row lock across them, so the charges of one dataset
queue behind each other's round trips and Python. But the process that made the last charge
of a dataset knows that row as it left it (the writing statement returns it).
:class:`OptimisticCharges` keeps it per ledger, process and dataset
(:meth:`~OptimisticCharges.remember_dataset`); the accountant checks the budget in Python
against it (a refusal there is not authoritative: the locked path decides) and sends
:func:`~privcal.storage.optimistic_sql.cas_charge_sql` — one message, two statements, one
implicit transaction (a multi-statement simple query: an error in either rolls back both), so
one round trip that *is* the commit:

1. ``UPDATE datasets SET <totals> = <totals> + <the cost's increments>, charge_count =
   charge_count + 1 WHERE id = … AND <every policy column> IS NOT DISTINCT FROM <the
   snapshot> AND <the cost fits the cap> AND NOT EXISTS <a charge under this idempotency
   key> RETURNING <the new row>``, the charge's INSERT hanging off it (``INSERT … SELECT …
   FROM upd``) and its id put in a transaction-local setting. The cap check is the filter of
   :func:`~privcal.accountant.privacy.filters.check_charge` written in SQL for pure-ε and
   ρ-zCDP caps (exact ``numeric`` sums of the row's totals and the increments, compared with
   the cap); under an (ε, δ) cap, whose Rényi filter stays in Python, it is a
   compare-and-set of the totals against the snapshot the Python check used. Exact under
   concurrency: under READ COMMITTED an UPDATE that finds its row changed by a
   concurrent transaction waits for it to end and then re-evaluates its WHERE clause on the
   newest row version, computing the new row from it (PostgreSQL manual, 13.2.1 "Read
   Committed Isolation Level", the EvalPlanQual recheck), so the cost is checked against the
   totals *as committed* and added to them, and the statement holds the row lock from then
   to COMMIT — what the locked path's ``FOR UPDATE`` gives. (Under a stricter isolation
   level set on the server, such an UPDATE fails with a serialization error instead: nothing
   is written and the locked path decides.) So concurrent charges of one
   dataset from many processes each take one round trip, serialised only by the server's
   row lock for the time of one statement, not by anyone's round trips. Every policy column
   is compared (caps, notion, Rényi orders — as ``jsonb`` — reporting δ, name, everything but
   the totals and the count), so no writer of ``datasets`` rows, privcal's or an
   administrator's ``UPDATE``, can leave a policy that passes stale; a deleted or re-created
   dataset has no row with that id and those columns. When nothing matches, no charge is
   inserted and the second statement writes nothing.
2. The audit append for the charge whose id statement 1 set — in a statement of its own so
   that its snapshot is taken *after* statement 1 holds the dataset row lock: every earlier
   writer of this dataset (the lock holders before it, charges, releases, session batches)
   has committed and its queued entries are visible, which is the audit sequencer's
   per-dataset order argument (:mod:`privcal.storage.audit_queue`). It tries the sequencer
   lock K; not granted, it queues the entry. Granted, the *plain* append
   (:func:`~privcal.storage.audit_queue.pg_append_with`) chains the entry if the queue is
   empty and queues it behind the queued ones otherwise; the *draining* append
   (:func:`~privcal.storage.audit_queue.pg_append_draining`) chains the queued entries and
   then its own. A process sends the plain one (≈ 0.08 ms less of the server's CPU) until
   one of its entries is queued, then the draining one until a drain finds nothing queued:
   a lone writer pays nothing for draining, and writers that contend for K — eight on one
   dataset, where 23 % of the charges had gone the locked path only to drain the queue
   (bench/charge_round_trips.py) — keep it empty in one round trip.

Nothing written (or no snapshot, or a refusal against the snapshot) sends the charge down
the locked path, which decides, explains a refusal and refreshes the snapshot. After that
the dataset's next 1, 2, 4 … 64 charges in this process go the locked path at once
(:meth:`~OptimisticCharges.charge_snapshot`); for an (ε, δ) cap, whose compare-and-set
fails whenever another process charged, so do they after a locked charge that finds another
process charged the dataset since this one's last (:meth:`remember_dataset`); a charge that
finds no other writer halves the wait. A forked child starts with no snapshots (a stale
one would only cost a failed statement, but a child's first charges should not all fail).

A connection lost while the statement ran leaves its outcome unknown — the statement is
its own COMMIT (the rule of :func:`~privcal.storage.transactions._commit_once`) — and the
statement may even still run, orphaned, on the server: waiting for the dataset's row lock,
say, to add its cost to whatever totals it then finds. So the server process that ran it is
first made to end (:meth:`~OptimisticCharges._fence`: terminated if still there, and waited
for). Once it has ended (:data:`LOST`), the accountant takes the locked path on a fresh
connection, which decides under the row lock: a keyed charge replays if it was recorded; an
unkeyed one goes ahead only if the row still equals the snapshot (had the lost statement
committed, ``charge_count`` — which only grows — would differ), else it raises a one-line
LedgerError. If the end cannot be confirmed (:data:`UNKNOWN`), an unkeyed charge raises that
error at once; a keyed one is safe either way (an orphan that commits after the locked
path's charge violates the key's unique constraint and rolls back).
"""

from __future__ import annotations

import os
from typing import Any

from privcal.storage.backend_fence import IDENT_SQL, end_backend
from privcal.storage.charge_entry import charge_prefix
from privcal.storage.charges import _ID_ZERO
from privcal.storage.optimistic_sql import cas_charge_sql, cas_message, policy_columns, prepared
from privcal.storage.statements import SPENT_COLUMNS

__all__ = ["LOST", "UNKNOWN", "OptimisticCharges"]

#: :meth:`OptimisticCharges.cas_record_charge`'s answer when the connection was lost while
#: the statement ran: it may or may not have committed
LOST = "lost"
#: snapshots kept per ledger and process at most (cleared when full)
_MAX_SNAPSHOTS = 4096
#: most locked-path charges of a dataset after a failed CAS before trying again
_MAX_BACKOFF = 64


class OptimisticCharges:
    """The dataset snapshots and the one-round-trip charge of a
    :class:`~privcal.storage.ledger.Ledger` (see the module docstring)."""

    # ``backend``, ``hot_sql``, ``ensure_schema``, ``_hot_connect`` and ``_db_error`` are the
    # Ledger's; the state below is made on first use, per process
    _opt_pid: int = -1
    _snapshots: dict[str, Any]
    _backoff: dict[str, list[int]]
    _locked_next: bool
    _drain_mode: bool
    _last_chained: bool | None = None

    def _opt_state(self) -> None:
        """This process's snapshots: a forked child starts with none."""
        if self._opt_pid != os.getpid():
            self._snapshots, self._backoff = {}, {}
            self._locked_next = self._drain_mode = False
            self._opt_pid = os.getpid()

    def charge_snapshot(self, name: str) -> Any | None:
        """The dataset row ``name`` as this process's last charge left it, if it may be tried
        optimistically now (PostgreSQL; not while backing off after a failed statement, nor
        right after a charge that was granted K but found no audit head row: the locked path
        then refuses with a one-line error); else None."""
        if self.backend != "postgresql":  # type: ignore[attr-defined]
            return None
        self._opt_state()
        if self._locked_next:
            self._locked_next = False
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

        ``locked``: ``row`` is what a charge by the locked path left. Under an (ε, δ) cap
        (whose compare-and-set fails when another process charged), if another writer
        charged the dataset since this process's last charge (the count moved by more than
        this charge), the dataset is contended: back off from the optimistic path as after
        a failed CAS, without having paid for one; else halve the back-off. (Under a pure-ε
        or zCDP cap the statement adds to the totals as committed: contention costs it
        nothing.)"""
        self._opt_state()
        if len(self._snapshots) >= _MAX_SNAPSHOTS:
            self._snapshots.clear()
            self._backoff.clear()
        old = self._snapshots.get(row.name)
        if locked and old is not None and old.id == row.id and row.notion == "approx":
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

    def cas_record_charge(self, snap: Any, values: dict[str, Any], kind: str,
                          increments: dict[str, Any]) -> tuple[int, Any] | str | None:
        """Record a charge of the dataset whose row the caller checked it against (``snap``)
        in one round trip, if that dataset's policy is still the snapshot's and the cost
        (of ``kind``, adding ``increments`` to the totals: column → amount, every column of
        :data:`~privcal.storage.statements.SPENT_COLUMNS`) fits its cap as committed
        (:func:`~privcal.storage.optimistic_sql.cas_charge_sql`): the charge row (``values``:
        every column but ``id``), the dataset's new totals and the charge's audit entry, exactly as
        :meth:`~privcal.storage.charges.ChargeStore.record_charge` writes them. Returns the
        charge id and the dataset's new row; None if nothing was written (the cost does not
        fit the row as committed, the policy changed, the key is taken, or the server refused
        the statement: the caller takes the locked path, which decides and explains);
        :data:`LOST` if the connection was lost while the statement ran and the server
        process that ran it has ended, :data:`UNKNOWN` if that could not be confirmed for an
        unkeyed charge (module docstring)."""
        self.ensure_schema()  # type: ignore[attr-defined]
        self._opt_state()
        q = self.hot_sql  # type: ignore[attr-defined]
        cas = getattr(q, "cas_charge", None)
        if cas is None:  # written once per ledger, with its other hot statements
            cas = q.cas_charge = prepared(cas_charge_sql(  # type: ignore[attr-defined]
                self.engine.dialect, q.dataset, q.charge_cols))
            q.dump_policy = q.dataset.dumper(policy_columns(q.dataset))  # type: ignore[attr-defined]
        prepares, executes = cas
        drain = self._drain_mode
        sql = cas_message(executes, drain)
        prefix = charge_prefix(0, values, snap.name)
        if not prefix.startswith(_ID_ZERO):  # pragma: no cover - RFC 8785 key order
            raise AssertionError("a charge entry does not begin with its charge_id")
        ds = snap._asdict()
        key = values["idempotency_key"]
        params = ([increments[c] for c in SPENT_COLUMNS] + [kind, snap.id]
                  + q.dump_policy(ds)  # type: ignore[attr-defined]
                  + [ds[c] for c in SPENT_COLUMNS] + [key, snap.id, key]
                  + q.dump_charge(values) + ["charge", prefix[len(_ID_ZERO) - 1:]])
        ident = None
        with self._hot_connect() as conn:  # type: ignore[attr-defined]
            drv = conn.connection.driver_connection
            try:
                cur = conn.info.get(_CAS_CURSOR)
                if cur is None:
                    from psycopg import ClientCursor

                    cur = conn.info[_CAS_CURSOR] = ClientCursor(drv)
                drv.autocommit = True  # the message is its own (implicit) transaction
                ident = conn.info.get(_CAS_BACKEND)
                fresh = not conn.info.get(_CAS_PREPARED)
                if fresh:  # this connection's first: PREPARE in the same message
                    sql = "; ".join([*(p for _, p in prepares), sql])
                if ident is None:  # … and learn which server process runs it (_fence)
                    sql = f"{IDENT_SQL}; {sql}"
                    ident = (drv.info.backend_pid, None)
                cur.execute(sql, params)
                if ident[1] is None:
                    ident = conn.info[_CAS_BACKEND] = tuple(cur.fetchone())
                    cur.nextset()
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
                    return LOST if self._fence(ident) or key is not None else UNKNOWN
                return None  # the server refused it: the implicit transaction rolled back
            finally:
                if not conn.invalidated:
                    try:
                        drv.autocommit = False
                    except conn.dialect.loaded_dbapi.Error as exc:  # pragma: no cover
                        conn.invalidate(exc)
        back = self._backoff.setdefault(snap.name, [0, 1])
        if row is None:  # nothing written: back off, then try again (the stale snapshot is
            # kept: the locked path replaces it, and compares it to see if others still write)
            back[0], back[1] = back[1], min(2 * back[1], _MAX_BACKOFF)
            return None
        back[1] = max(1, back[1] // 2)  # (halved, not reset: one lucky CAS among many)
        n = len(q.dataset.names)
        new = q.dataset.load(row[:n])
        self.remember_dataset(new)
        got, _, moved = appended[:3]
        self._last_chained = bool(moved)  # (bench/charge_round_trips.py counts queued ones)
        if not moved:  # the entry was queued: the next charge sends the draining append
            if got and drain:  # … but K granted, no head row: the locked path says so
                self._locked_next = True
            self._drain_mode = True
        elif drain and not appended[4]:  # nothing was queued: the plain append will do
            self._drain_mode = False
        return int(row[n]), new

    def _fence(self, ident: tuple[int, Any] | None) -> bool:
        """After the connection was lost while the optimistic statement ran: True once the
        server process that ran it (``ident``) has ended, terminated if it still ran
        (:func:`~privcal.storage.backend_fence.end_backend`, which says why)."""
        return end_backend(self.engine, ident)  # type: ignore[attr-defined]


#: :meth:`OptimisticCharges.cas_record_charge`'s answer when the connection was lost while an
#: unkeyed statement ran and the server process that ran it could not be seen to end: the
#: charge may yet be recorded, so the caller must not make it again
UNKNOWN = "unknown"
#: ``Connection.info`` keys of the optimistic charge's client-side-binding cursor, of the
#: flag that its statements are prepared on that connection, and of its server process
_CAS_CURSOR, _CAS_PREPARED = "privcal_cas_cursor", "privcal_cas_prepared"
_CAS_BACKEND = "privcal_cas_backend"
