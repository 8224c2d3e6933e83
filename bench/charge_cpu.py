"""CPU time of one ``Accountant.charge`` in this process, next to one raw committed insert.

    python bench/charge_cpu.py [--n 2000] [--pg URL] [--profile 25]

Load-independent companion of ``ledger_bench.py --part charges`` (issue 11): the wall
clock of a charge depends on what else runs on the machine, its CPU time in the client
process (``time.process_time``) much less. For each backend (a SQLite file; PostgreSQL in a
scratch schema of --pg, default $PRIVCAL_TEST_DATABASE_URL) it charges a warm ledger ``--n``
times with a zCDP cost and with a pure-ε cost, and runs the raw transaction of
``ledger_bench.py`` (a charge row and an audit row inserted and committed through the bare
DB-API driver) as many times; it prints the CPU (user + system, from ``getrusage``) and
wall time per operation, their ratios to raw, and what one charge sends to the database
(SQLite: statements, from its trace callback; PostgreSQL: round trips, from libpq's
protocol trace). On SQLite the CPU time includes the database's own work (it runs in the
process; the system share is mostly the WAL write and fsync of COMMIT); on PostgreSQL the
server's share is not in it. ``--profile K`` also prints the K functions
with the most cumulative time of the zCDP charges (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _db import PG_DEFAULT, Row, print_table, run_backends
from ledger_bench import _raw_setup, _raw_worker
from sqlalchemy import event

from privcal.accountant import Accountant
from privcal.costs import ZCDP, PureDP
from privcal.storage import Ledger


class _Now:
    """A barrier stand-in: ``_raw_worker`` waits on it, then runs."""

    def wait(self) -> None:
        return None


class _Box:
    """A queue stand-in collecting ``_raw_worker``'s (count, seconds)."""

    def __init__(self) -> None:
        self.got: Any = None

    def put(self, x: Any) -> None:
        self.got = x


def _raw_cpu(url: str, n: int) -> tuple[float, float, float]:
    """(user CPU s, system CPU s, wall s) per raw committed transaction, over about ``n``."""
    box = _Box()
    # _raw_worker runs for a time, not a count: estimate the time of n transactions first
    _raw_worker(url, 0.2, _Now(), box)
    k, dt = box.got
    (u0, s0) = _cpu()
    _raw_worker(url, max(0.5, n * dt / k), _Now(), box)
    (u1, s1) = _cpu()
    k, dt = box.got
    return (u1 - u0) / k, (s1 - s0) / k, dt / k


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _charges(acct: Accountant, dataset: str, cost: Any, n: int,
             prof: cProfile.Profile | None = None) -> tuple[float, float, float]:
    """(user CPU s, system CPU s, wall s) per charge over ``n`` charges."""
    acct.charge(dataset, cost)
    (u0, s0), t0 = _cpu(), time.perf_counter()
    if prof is not None:
        prof.enable()
    for _ in range(n):
        acct.charge(dataset, cost)
    if prof is not None:
        prof.disable()
    (u1, s1), t1 = _cpu(), time.perf_counter()
    return (u1 - u0) / n, (s1 - s0) / n, (t1 - t0) / n


def _wire(led: Ledger, acct: Accountant) -> str:
    """Statements (SQLite: its trace callback) or round trips (PostgreSQL: ``Sync`` and
    ``Query`` messages in libpq's protocol trace) of one warm zCDP charge."""
    sql: list[str] = []
    with tempfile.NamedTemporaryFile("w+", suffix=".trace") as fh:
        def checkout(dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
            if led.backend == "sqlite":
                dbapi_conn.set_trace_callback(sql.append)
            else:
                dbapi_conn.pgconn.trace(fh.fileno())
            conns.append(dbapi_conn)

        conns: list[Any] = []
        event.listen(led.engine, "checkout", checkout)
        for c in led.held_connections():  # kept from the last write: no checkout
            checkout(c.connection.driver_connection, None, None)
        acct.charge("z", ZCDP(rho="0.000001"))
        event.remove(led.engine, "checkout", checkout)
        for c in conns:
            c.set_trace_callback(None) if led.backend == "sqlite" else c.pgconn.untrace()
        if led.backend == "sqlite":
            return f"{len(sql)} statements"
        fh.seek(0)
        text = fh.read()
        trips = sum(1 for ln in text.splitlines() if ln.split("\t")[1:2] == ["F"]
                    and ln.split("\t")[3:4] and ln.split("\t")[3].split(" ")[0]
                    in ("Sync", "Query"))
        return f"{trips} round trips"


def _bench(url: str, backend: str, n: int, profile: int) -> list[Row]:
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("z", rho=10**6)
    acct.create_dataset("p", epsilon=10**6)
    _raw_setup(url)
    acct.charge("z", ZCDP(rho="0.000001"))
    wire = _wire(led, acct)
    raw_user, raw_sys, raw_wall = _raw_cpu(url, n)
    raw_cpu = raw_user + raw_sys
    rows: list[Row] = [{"backend": backend, "measurement": "raw committed insert (2 rows)",
                        "result": f"CPU {raw_cpu * 1e3:.3f} ms (user {raw_user * 1e3:.3f}, "
                                  f"system {raw_sys * 1e3:.3f}), wall {raw_wall * 1e3:.3f} ms"}]
    prof = cProfile.Profile() if profile else None
    for what, ds, cost in (("zCDP", "z", ZCDP(rho="0.000001")),
                           ("pure ε", "p", PureDP(eps="0.000001"))):
        user, sys_, wall = _charges(acct, ds, cost, n, prof if what == "zCDP" else None)
        cpu = user + sys_
        rows.append({"backend": backend, "measurement": f"Accountant.charge, {what} cost",
                     "result": f"CPU {cpu * 1e3:.3f} ms ({cpu / raw_cpu:.2f}× raw; user "
                               f"{user * 1e3:.3f}, system {sys_ * 1e3:.3f}), "
                               f"wall {wall * 1e3:.3f} ms ({wall / raw_wall:.2f}× raw)"})
    rows.append({"backend": backend, "measurement": "one charge on the wire (zCDP)",
                 "result": wire})
    led.close()
    if prof is not None:
        print(f"## {backend}: cProfile of {n} zCDP charges (cumulative)")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile)
        pstats.Stats(prof).sort_stats("tottime").print_stats(profile)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="charges per measurement")
    ap.add_argument("--pg", default=PG_DEFAULT,
                    help="PostgreSQL URL (default $PRIVCAL_TEST_DATABASE_URL; none: SQLite only)")
    ap.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="print the K costliest functions (cProfile) of the zCDP charges")
    args = ap.parse_args()
    rows = run_backends(lambda url, b: _bench(url, b, args.n, args.profile),
                        None if args.sqlite_only else args.pg)
    print_table(rows)


if __name__ == "__main__":
    main()
