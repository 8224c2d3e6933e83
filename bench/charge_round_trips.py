"""Round trips and commits per charge with N clients: a load-independent count (issue 11).

    python bench/charge_round_trips.py [--clients 8] [--charges 50] [--one-dataset] [--pg URL]

N client processes each make --charges ``Accountant.charge`` calls (client i on dataset i, or
all on one dataset) on a scratch PostgreSQL schema of --pg (default
``$PRIVCAL_TEST_DATABASE_URL``), counting in each client what it sends to the server (libpq's
protocol trace), its COMMITs, and the audit sequencer's transactions after a COMMIT
(``privcal.storage.audit_queue``). Wall-clock rates on a shared machine are noise; these
counts depend only on how often a writer finds the sequencer busy. Prints per charge:
round trips (``Sync`` and simple ``Query`` messages in libpq's protocol trace), COMMITs,
sequencer transactions, the share of charges made by the locked path (``write_core``:
BEGIN … COMMIT; the rest went the optimistic one-message path) and the share of entries
queued (by either path).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import uuid
from typing import Any
from urllib.parse import quote

from _db import PG_DEFAULT  # bench/_db.py


def _worker(url: str, dataset: str, n: int, start: Any, out: Any) -> None:
    from sqlalchemy import event

    from privcal.accountant import Accountant
    from privcal.costs import ZCDP

    acct = Accountant(url)
    counts = {"statements": 0, "commits": 0, "sequencer": 0, "queued": 0, "locked": 0}
    write_core = type(acct.ledger).write_core

    def locked(self: Any, *a: Any, **k: Any) -> Any:  # the locked path (BEGIN … COMMIT)
        counts["locked"] += 1
        return write_core(self, *a, **k)

    type(acct.ledger).write_core = locked  # type: ignore[method-assign]
    cas = getattr(type(acct.ledger), "cas_record_charge", None)
    if cas is not None:  # the optimistic charge: its entry queued when no head row moved
        def cas_queued(self: Any, *a: Any) -> Any:
            out = cas(self, *a)
            chained = getattr(self, "_last_chained", None)
            if isinstance(out, tuple) and chained is not None:
                counts["queued"] += not chained
            return out

        type(acct.ledger).cas_record_charge = cas_queued  # type: ignore[method-assign]
    seq = getattr(type(acct.ledger), "sequence_audit", None)
    if seq is not None:  # privcal with the audit sequencer
        def counting(self: Any, *a: Any, **k: Any) -> Any:
            counts["sequencer"] += 1
            return seq(self, *a, **k)

        type(acct.ledger).sequence_audit = counting  # type: ignore[method-assign]
        first = type(acct.ledger)._pg_append_pending

        def queued(self: Any, conn: Any, pending: Any) -> bool:
            q = first(self, conn, pending)
            counts["queued"] += q
            return q

        type(acct.ledger)._pg_append_pending = queued  # type: ignore[attr-defined]
        with_row = getattr(type(acct.ledger), "_pg_append_with_row", None)
        if with_row is not None:  # a charge's row and entry in one statement
            def queued_with_row(self: Any, *a: Any) -> Any:
                out = with_row(self, *a)  # (id, queued, ...)
                counts["queued"] += out[1]
                return out

            type(acct.ledger)._pg_append_with_row = queued_with_row  # type: ignore[attr-defined]
    acct.charge(dataset, ZCDP(rho="0.0001"))  # warm: schema checked, statements compiled
    # what goes on the wire, from libpq's protocol trace of every connection this client uses
    # (statements run on the driver are invisible to SQLAlchemy's events)
    trace = tempfile.TemporaryFile("w+")
    traced: list[Any] = []

    def checkout(dbapi_conn: Any, _rec: Any, _proxy: Any) -> None:
        if dbapi_conn not in traced:
            dbapi_conn.pgconn.trace(trace.fileno())
            traced.append(dbapi_conn)

    event.listen(acct.ledger.engine, "checkout", checkout)
    for c in acct.ledger.held_connections() if hasattr(acct.ledger, "held_connections") else []:
        checkout(c.connection.driver_connection, None, None)
    counts["sequencer"] = counts["queued"] = counts["locked"] = 0
    start.wait()
    for _ in range(n):
        acct.charge(dataset, ZCDP(rho="0.0001"))
    for c in traced:
        c.pgconn.untrace()
    trace.seek(0)
    for ln in trace.read().splitlines():
        f = ln.split("\t")
        if f[1:2] == ["F"] and len(f) > 3:
            msg = f[3].split(" ")[0]
            if msg in ("Sync", "Query"):
                counts["statements"] += 1
            if msg == "Query" and f[4:5] == [' "COMMIT"']:
                counts["commits"] += 1
    acct.ledger.close()
    out.put(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--charges", type=int, default=50, help="per client")
    ap.add_argument("--one-dataset", action="store_true", help="all clients on one dataset")
    ap.add_argument("--pg", default=PG_DEFAULT)
    args = ap.parse_args()
    if not args.pg:
        raise SystemExit("needs PostgreSQL: --pg URL or PRIVCAL_TEST_DATABASE_URL")
    import psycopg

    from privcal.accountant import Accountant

    admin = args.pg.replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"privcal_rt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in args.pg else "?"
    url = f"{args.pg}{sep}options={quote(f'-csearch_path={schema}')}"
    try:
        acct = Accountant(url)
        acct.ledger.upgrade()
        names = ["d0"] if args.one_dataset else [f"d{i}" for i in range(args.clients)]
        for name in names:
            acct.create_dataset(name, rho=1000)
        acct.ledger.close()
        ctx = mp.get_context("fork")
        start, q = ctx.Barrier(args.clients), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(url, names[i % len(names)], args.charges,
                                                   start, q)) for i in range(args.clients)]
        for p in procs:
            p.start()
        res = [q.get(timeout=900) for _ in procs]
        for p in procs:
            p.join()
        acct = Accountant(url)
        rep = acct.ledger.verify()
        acct.ledger.close()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    total = {k: sum(r[k] for r in res) for k in res[0]}
    n = args.clients * args.charges
    print(f"# load average at the end: {os.getloadavg()[0]:.1f}; {args.clients} clients on "
          f"{len(names)} dataset(s), {n} charges; the log verifies: {rep.entries} entries")
    print(f"per charge: {total['statements'] / n:.2f} round trips, {total['commits'] / n:.2f} "
          f"commits, {total['sequencer'] / n:.2f} sequencer transactions; "
          f"{total['locked'] / n:.1%} of the charges by the locked path (BEGIN … COMMIT), "
          f"{total['queued'] / n:.1%} of the entries queued")


if __name__ == "__main__":
    main()
