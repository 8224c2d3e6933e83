"""Fencing a PostgreSQL server process whose client lost its connection: make sure it has
ended — terminated if it still runs — before anything decides what it did (issue 11).

A statement whose connection is lost may still run on the server: the server notices the
lost client only when it next writes to it, so a statement waiting for a row lock, say,
goes on when it gets the lock, and commits (the optimistic charge's message is its own
COMMIT). The optimistic charge (:mod:`privcal.storage.optimistic`) adds its cost to the
dataset's totals *as committed*, so such an orphan would record the charge on its own even
after the accountant, finding nothing recorded, has made the charge by the locked path:
two charges for one call (tests/test_optimistic_charge.py shows it happen with the fence
disabled). The compare-and-set of the whole row stopped an orphan (the count had moved);
the increment does not, so the caller fences first: :func:`end_backend` returns only once
the process is gone — its transaction committed or rolled back for good — and the locked
path then decides on the row as it will stay.

A process is named by its pid *and* its start time (:data:`IDENT_SQL`, asked in the same
message as the connection's first optimistic charge): a pid alone could name a later
process that reused it, and terminating that one would break another client's work.
Without the start time, no process with that pid at all is proof enough that ours has
ended, but a live one is only waited for, never terminated.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.engine import Engine

__all__ = ["FENCE_SECONDS", "IDENT_SQL", "end_backend"]

#: the server process running this connection: its pid and start time
IDENT_SQL = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
#: seconds :func:`end_backend` waits for the process to end
FENCE_SECONDS = 10.0


def end_backend(engine: Engine, ident: tuple[int, Any] | None) -> bool:
    """Make sure the server process ``ident`` (its pid and start time, the start None if
    unknown; None if nothing is known) has ended, terminating it (``pg_terminate_backend``,
    allowed for a process of the same role) if it still runs, through a new connection of
    ``engine``. True once it has ended; False if that cannot be confirmed: nothing known,
    the server unreachable, the process still there after :data:`FENCE_SECONDS` (the role
    may not terminate it, or only its start is unknown)."""
    if ident is None:
        return False
    if ident[1] is None:  # its start unknown: watched, not terminated (the pid may be another's)
        sql, args = "SELECT 1 FROM pg_stat_activity WHERE pid = %s", ident[:1]
    else:
        sql = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s "
               "AND backend_start = %s")
        args = tuple(ident)
    try:
        with engine.connect() as conn:
            drv: Any = conn.connection.driver_connection
            drv.autocommit = True  # each look is its own snapshot of pg_stat_activity
            try:
                gone = time.monotonic() + FENCE_SECONDS
                while time.monotonic() < gone:
                    if drv.execute(sql, args).fetchone() is None:
                        return True
                    time.sleep(0.01)
            finally:
                drv.autocommit = False
    except Exception:  # any failure: the end cannot be confirmed
        return False
    return False
