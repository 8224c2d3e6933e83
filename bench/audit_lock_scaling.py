"""How far charges can scale on PostgreSQL with one hash-chained audit log: SQL only, no privcal.

    python bench/audit_lock_scaling.py [--seconds 3] [--rounds 2] [--clients 8] [--pg URL]

Four write patterns, each one committed transaction per operation through the bare
``psycopg`` driver, with 1 and with --clients client processes (client i on dataset i), in a
scratch schema of --pg (default ``$PRIVCAL_TEST_DATABASE_URL``), dropped afterwards:

- **raw**: two INSERTs (a charge row, an audit row with a ``serial`` key) — no lock;
- **dataset lock**: ``SELECT … FOR UPDATE`` of the client's dataset row, the charge INSERT
  with the totals UPDATE (one statement), an audit INSERT with a ``serial`` key — per-dataset
  locks only, the audit rows unordered by hash;
- **dataset lock + chain**: the same, but the audit row is appended to the hash chain the
  way privcal did before issue 11 (``SELECT … FOR UPDATE`` of the one head row, number and
  hash the entry, INSERT it, move the head) as the last statement;
- **dataset lock + queue + sequencer**: the way privcal does it now
  (``privcal/storage/audit_queue.py``): the last statement *tries* the sequencer's advisory
  lock K and, granted with an empty queue, appends to the chain as above; not granted, it
  queues the entry in ``audit_queue`` and the transaction commits; then a post-commit
  sequencer transaction waits for K, reads the queue, chains every queued entry (hashed in
  Python) in one statement, deletes them and moves the head.

A row lock in PostgreSQL is held until the transaction's COMMIT has flushed its WAL
record, so the chain's head lock makes the writers take turns, one WAL flush (``fsync``)
each, however little they do under the lock; unlocked writers share flushes (group
commit). The sequencer keeps one gap-free, fork-free chain while the writers' commits
share flushes, and one sequencer's commit chains many writers' entries.
Prints the aggregate operations/s (best of --rounds), the N-client / 1-client ratio, and for
the sequencer pattern at N clients (load-independent counts over all rounds): the share of
charges that queued, sequencer transactions per charge, and commits that wrote WAL (each one
flush, possibly shared) per charge — 1 for the charge's own commit plus the sequencers that
chained something.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import hashlib
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
    "CREATE TABLE audit_queue (id bigserial PRIMARY KEY, prefix text NOT NULL, "
    "created_at timestamptz NOT NULL DEFAULT now())",
]
#: an audit payload of the size of a charge entry (~450 bytes of canonical JSON)
_BODY = '{"data":{"charge_id":%d,"pad":"' + "x" * 380 + '"},"kind":"charge","seq":'
PATTERNS = ("raw", "dataset lock", "dataset lock + chain", "dataset lock + queue + sequencer")
#: the sequencer's advisory lock (privcal derives it from the audit_queue table's OID)
_K = f"({0x61756471 << 32} + 'audit_queue'::regclass::oid::bigint)"
_HASH = ("encode(sha256('\\x01'::bytea || decode(e.prev, 'hex') || "
         "sha256('\\x00'::bytea || convert_to(e.payload, 'UTF8'))), 'hex')")
_FIRST = (
    f"WITH k AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({_K}) AS got), "
    "d AS MATERIALIZED (SELECT k.got, k.got AND NOT EXISTS (SELECT 1 FROM audit_queue) "
    "AS direct FROM k), "
    "q AS (INSERT INTO audit_queue (prefix) SELECT %(p)s FROM d WHERE NOT d.got), "
    "h AS (SELECT a.seq + 1 AS seq, a.entry_hash AS prev FROM audit_head a, d "
    "WHERE a.id = 1 AND d.direct FOR UPDATE OF a), "
    "e AS (SELECT h.seq, h.prev, %(p)s || h.seq::text || '}' AS payload FROM h), "
    f"x AS (SELECT e.seq, e.prev, e.payload, {_HASH} AS hash FROM e), "
    "i AS (INSERT INTO audit_log (seq, payload, prev_hash, entry_hash) "
    "SELECT x.seq, x.payload, x.prev, x.hash FROM x), "
    "u AS (UPDATE audit_head SET seq = x.seq, entry_hash = x.hash FROM x "
    "WHERE audit_head.id = 1) SELECT d.got, d.direct FROM d"
)
_READ = ("SELECT h.seq, h.entry_hash, q.id, q.prefix FROM audit_head h "
         "LEFT JOIN audit_queue q ON true WHERE h.id = 1 ORDER BY q.id")
_WRITE = (
    "WITH i AS (INSERT INTO audit_log (seq, payload, prev_hash, entry_hash) "
    "SELECT * FROM unnest(%(seqs)s::int[], %(payloads)s::text[], %(prevs)s::text[], "
    "%(hashes)s::text[])), "
    "dq AS (DELETE FROM audit_queue WHERE id = ANY(%(ids)s::bigint[])) "
    "UPDATE audit_head SET seq = %(seq)s, entry_hash = %(hash)s WHERE id = 1"
)


def _connect(url: str, schema: str) -> Any:
    import psycopg

    return psycopg.connect(url, options=f"-csearch_path={schema}")


def _chain(prev: str, payload: str) -> str:
    """privcal.storage.audit.chain_hash: SHA-256(0x01 || prev || SHA-256(0x00 || payload))."""
    leaf = hashlib.sha256(b"\x00" + payload.encode()).digest()
    return hashlib.sha256(b"\x01" + bytes.fromhex(prev) + leaf).hexdigest()


def _drain(conn: Any, own: list[str]) -> bool:
    """Holding K: chain every queued entry (id order), then ``own``; whether it wrote."""
    rows = conn.execute(_READ).fetchall()
    seq, prev = rows[0][0], rows[0][1]
    queued = [(r[2], r[3]) for r in rows if r[2] is not None]
    prefixes = [p for _, p in queued] + own
    if not prefixes:
        return False
    cols: dict[str, list[Any]] = {"seqs": [], "payloads": [], "prevs": [], "hashes": []}
    for prefix in prefixes:
        seq += 1
        payload = f"{prefix}{seq}}}"
        h = _chain(prev, payload)
        for col, v in zip(cols, (seq, payload, prev, h), strict=True):
            cols[col].append(v)
        prev = h
    conn.execute(_WRITE, {**cols, "ids": [q[0] for q in queued], "seq": seq, "hash": prev})
    return True


def _sequence(conn: Any, stats: dict[str, int]) -> None:
    """The post-commit sequencer: wait for K, chain every queued entry, commit."""
    conn.execute(f"SELECT pg_advisory_xact_lock({_K})")
    stats["sequencer txs"] += 1
    stats["sequencer writes"] += _drain(conn, [])
    conn.commit()


def _worker(url: str, schema: str, pattern: str, i: int, seconds: float, start: Any,
            out: Any) -> None:
    conn = _connect(url, schema)
    rho, ts = decimal.Decimal("0.001"), datetime.datetime.now(datetime.UTC)
    stats = {"queued": 0, "sequencer txs": 0, "sequencer writes": 0}
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
            elif pattern == "dataset lock + chain":
                conn.execute(_APPEND, {"p": _BODY % cid})
            else:
                got, direct = conn.execute(_FIRST, {"p": _BODY % cid}).fetchone()
                if got and not direct:  # K granted, queue not empty: chain it, then this one
                    _drain(conn, [_BODY % cid])
                stats["queued"] += not got
                conn.commit()
                if not got:
                    _sequence(conn, stats)
                n += 1
                continue
        conn.commit()
        n += 1
    out.put((n, time.perf_counter() - t0, stats))
    conn.close()


def _rate(url: str, schema: str, pattern: str, clients: int, seconds: float,
          stats: dict[str, int]) -> float:
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
    for _, _, st in res:
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v
    stats["charges"] = stats.get("charges", 0) + sum(n for n, _, _ in res)
    return sum(n for n, _, _ in res) / max(dt for _, dt, _ in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8, help="the many-client case (≤ 64)")
    ap.add_argument("--pg", default=PG_DEFAULT)
    args = ap.parse_args()
    if not args.pg:
        raise SystemExit("needs PostgreSQL: --pg URL or PRIVCAL_TEST_DATABASE_URL")
    if not 2 <= args.clients <= 64:
        raise SystemExit("--clients must be in [2, 64]")
    import psycopg

    url = args.pg.replace("postgresql+psycopg://", "postgresql://", 1)
    schema = f"privcal_lockbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    many = args.clients
    stats: dict[str, int] = {}
    try:
        with _connect(url, schema) as conn:
            for ddl in _DDL:
                conn.execute(ddl)
            for i in range(many):
                conn.execute("INSERT INTO datasets (name) VALUES (%s)", (f"d{i}",))
            conn.commit()
        best: dict[tuple[str, int], float] = {}
        for _ in range(args.rounds):  # rounds alternate over the patterns
            for clients in (1, many):
                for pattern in PATTERNS:
                    st: dict[str, int] = {}
                    r = _rate(url, schema, pattern, clients, args.seconds, st)
                    best[pattern, clients] = max(best.get((pattern, clients), 0.0), r)
                    if pattern == PATTERNS[-1] and clients == many:
                        for k, v in st.items():
                            stats[k] = stats.get(k, 0) + v
        with _connect(url, schema) as conn:  # the chain the sequencer pattern built
            gaps = conn.execute("SELECT count(*) - coalesce(max(seq), 0) FROM audit_log"
                                ).fetchone()[0]
            left = conn.execute("SELECT count(*) FROM audit_queue").fetchone()[0]
        assert gaps == 0 and left == 0, (gaps, left)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    print(f"# load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"| pattern | 1 client | {many} clients, {many} datasets | {many} / 1 |")
    print("|---|---|---|---|")
    for pattern in PATTERNS:
        one, n = best[pattern, 1], best[pattern, many]
        print(f"| {pattern} | {one:,.0f}/s | {n:,.0f}/s | {n / one:.2f} |")
    c = stats["charges"]
    print(f"\nsequencer pattern, {many} clients, all rounds: {c} charges, "
          f"{stats['queued'] / c:.1%} queued; sequencer transactions per charge "
          f"{stats['sequencer txs'] / c:.3f}, of which chained entries (a WAL flush) "
          f"{stats['sequencer writes'] / c:.3f}; commits writing WAL per charge "
          f"{1 + stats['sequencer writes'] / c:.3f} (chain: 1.000, each flush its own turn)")


if __name__ == "__main__":
    main()
