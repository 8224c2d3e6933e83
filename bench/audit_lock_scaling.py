"""How far charges can scale on PostgreSQL with one hash-chained audit log: SQL only, no privcal.

    python bench/audit_lock_scaling.py [--seconds 3] [--rounds 2] [--pg URL]

Three write patterns, each one committed transaction per operation through the bare
``psycopg`` driver, with 1 and with 8 client processes (client i on dataset i), in a
scratch schema of --pg (default ``$PRIVCAL_TEST_DATABASE_URL``), dropped afterwards:

- **raw**: two INSERTs (a charge row, an audit row with a ``serial`` key) — no lock;
- **dataset lock**: ``SELECT … FOR UPDATE`` of the client's dataset row, the charge INSERT
  with the totals UPDATE (one statement), an audit INSERT with a ``serial`` key — per-dataset
  locks only, the audit rows unordered by hash;
- **dataset lock + chain**: the same, but the audit row is appended to the hash chain the
  way privcal does it (``storage.transactions._PG_APPEND``: ``SELECT … FOR UPDATE`` of the one
  head row, number and hash the entry, INSERT it, move the head) as the last statement.

A row lock in PostgreSQL is held until the transaction's COMMIT has flushed its WAL
record, so the chain's head lock makes the writers take turns, one WAL flush (``fsync``)
each, however little they do under the lock; unlocked writers share flushes (group
commit). This bounds what ``Accountant.charge`` can reach with a gap-free, fork-free
chain whose order is fixed at commit (issue 11).
Prints the aggregate operations/s (best of --rounds) and the 8-client / 1-client ratio.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import multiprocessing as mp
import os
import time
import uuid
from typing import Any

from _db import PG_DEFAULT  # bench/_db.py

_APPEND = (
    "WITH h AS (SELECT seq + 1 AS seq, entry_hash AS prev FROM audit_head WHERE id = 1 "
    "FOR UPDATE), "
    "e AS (SELECT h.seq, h.prev, %(p)s || h.seq::text || '}' AS payload FROM h), "
    "x AS (SELECT e.seq, e.prev, e.payload, encode(sha256('\\x01'::bytea || decode(e.prev, 'hex')"
    " || sha256('\\x00'::bytea || convert_to(e.payload, 'UTF8'))), 'hex') AS hash FROM e), "
    "i AS (INSERT INTO audit_log (seq, payload, prev_hash, entry_hash) "
    "SELECT x.seq, x.payload, x.prev, x.hash FROM x) "
    "UPDATE audit_head SET seq = x.seq, entry_hash = x.hash FROM x WHERE audit_head.id = 1"
)
_DDL = [
    "CREATE TABLE datasets (id serial PRIMARY KEY, name text UNIQUE NOT NULL, "
    "charge_count integer NOT NULL DEFAULT 0, spent numeric NOT NULL DEFAULT 0)",
    "CREATE TABLE charges (id serial PRIMARY KEY, dataset_id integer NOT NULL, "
    "rho numeric NOT NULL, created_at timestamptz NOT NULL)",
    "CREATE TABLE audit_raw (seq serial PRIMARY KEY, payload text NOT NULL, "
    "prev_hash varchar(64) NOT NULL, entry_hash varchar(64) NOT NULL)",
    "CREATE TABLE audit_log (seq integer PRIMARY KEY, payload text NOT NULL, "
    "prev_hash varchar(64) NOT NULL, entry_hash varchar(64) NOT NULL)",
    "CREATE TABLE audit_head (id integer PRIMARY KEY, seq integer NOT NULL, "
    "entry_hash varchar(64) NOT NULL)",
    "INSERT INTO audit_head VALUES (1, 0, repeat('0', 64))",
]
#: an audit payload of the size of a charge entry (~450 bytes of canonical JSON)
_BODY = '{"data":{"charge_id":%d,"pad":"' + "x" * 380 + '"},"kind":"charge","seq":'
PATTERNS = ("raw", "dataset lock", "dataset lock + chain")


def _connect(url: str, schema: str) -> Any:
    import psycopg

    return psycopg.connect(url, options=f"-csearch_path={schema}")


def _worker(url: str, schema: str, pattern: str, i: int, seconds: float, start: Any,
            out: Any) -> None:
    conn = _connect(url, schema)
    rho, ts = decimal.Decimal("0.001"), datetime.datetime.now(datetime.UTC)
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if pattern == "raw":
            conn.execute("INSERT INTO charges (dataset_id, rho, created_at) VALUES (%s, %s, %s)",
                         (i, rho, ts))
            conn.execute("INSERT INTO audit_raw (payload, prev_hash, entry_hash) "
                         "VALUES (%s, %s, %s)", (_BODY % n + "1}", "a" * 64, "b" * 64))
        else:
            ds_id, spent = conn.execute("SELECT id, spent FROM datasets WHERE name = %s "
                                        "FOR UPDATE", (f"d{i}",)).fetchone()
            cid = conn.execute(
                "WITH u AS (UPDATE datasets SET charge_count = charge_count + 1, spent = %s "
                "WHERE id = %s) INSERT INTO charges (dataset_id, rho, created_at) "
                "VALUES (%s, %s, %s) RETURNING id", (spent + rho, ds_id, ds_id, rho, ts)
            ).fetchone()[0]
            if pattern == "dataset lock":
                conn.execute("INSERT INTO audit_raw (payload, prev_hash, entry_hash) "
                             "VALUES (%s, %s, %s)", (_BODY % cid + "1}", "a" * 64, "b" * 64))
            else:
                conn.execute(_APPEND, {"p": _BODY % cid})
        conn.commit()
        n += 1
    out.put((n, time.perf_counter() - t0))
    conn.close()


def _rate(url: str, schema: str, pattern: str, clients: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    start, q = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, schema, pattern, i, seconds, start, q))
             for i in range(clients)]
    for p in procs:
        p.start()
    res = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        assert p.exitcode == 0
    return sum(n for n, _ in res) / max(dt for _, dt in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pg", default=PG_DEFAULT)
    args = ap.parse_args()
    if not args.pg:
        raise SystemExit("needs PostgreSQL: --pg URL or PRIVCAL_TEST_DATABASE_URL")
    import psycopg

    url = args.pg.replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"privcal_lockbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        with _connect(url, schema) as conn:
            for ddl in _DDL:
                conn.execute(ddl)
            for i in range(8):
                conn.execute("INSERT INTO datasets (name) VALUES (%s)", (f"d{i}",))
            conn.commit()
        best: dict[tuple[str, int], float] = {}
        for _ in range(args.rounds):  # rounds alternate over the patterns
            for clients in (1, 8):
                for pattern in PATTERNS:
                    r = _rate(url, schema, pattern, clients, args.seconds)
                    best[pattern, clients] = max(best.get((pattern, clients), 0.0), r)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    print(f"# load average at the end: {os.getloadavg()[0]:.1f}")
    print("| pattern | 1 client | 8 clients, 8 datasets | 8 / 1 |")
    print("|---|---|---|---|")
    for pattern in PATTERNS:
        one, eight = best[pattern, 1], best[pattern, 8]
        print(f"| {pattern} | {one:,.0f}/s | {eight:,.0f}/s | {eight / one:.2f} |")


if __name__ == "__main__":
    main()
