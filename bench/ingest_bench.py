"""Collection-session ingestion: 10⁶ LDP-CP-S reports submitted in batches, SQLite and PostgreSQL.

    python bench/ingest_bench.py [--reports 1000000] [--batch 50000] [--pg URL]

An ldp-score session with T = 10 rounds of n' = reports/10 users; each batch is
``submit_reports`` (one transaction: filters, per-subject charge, bulk insert,
advance). One extra batch measures rejection: one of already-reported subjects
(entirely rejected, nothing written).
PostgreSQL runs in a scratch schema of --pg (default $PRIVCAL_TEST_DATABASE_URL).

**raw** (measured in the same run, right after privcal): the same batches written by the bare
driver, one committed transaction each — the accepted reports into a keyed copy of
``session_reports`` and one new per-subject spend row each into a keyed copy of
``subject_spend`` (PostgreSQL ``COPY``, SQLite ``executemany``), in the batch's order.
Two references, each with its ratio = privcal time / raw time:

- ``raw`` — **the same rows** privcal stores: the subject column holds each subject's
  pseudonym (64 hex characters; computed before the clock starts — hashing is privcal's
  work, not the driver's), and the reports carry their batch number;
- ``raw ids`` — the reference of the earlier runs: the ids themselves (``user-123``, 8–11
  characters, nearly in key order) in the subject column.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import Any

import numpy as np
from _db import PG_DEFAULT, Row, print_table, run_backends  # bench/_db.py

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.storage import Ledger

_RAW_DDL = [
    "CREATE TABLE raw_reports{t} (session_id INTEGER NOT NULL, subject VARCHAR(200) NOT NULL, "
    "round INTEGER NOT NULL, value VARCHAR(64) NOT NULL, received_at {ts} NOT NULL, "
    "batch INTEGER, PRIMARY KEY (session_id, subject))",
    "CREATE TABLE raw_spend{t} (dataset_id INTEGER NOT NULL, subject VARCHAR(200) NOT NULL, "
    "spent_units BIGINT NOT NULL, PRIMARY KEY (dataset_id, subject))",
]


def _raw(url: str, ids: np.ndarray, bits: np.ndarray, batch: int, suffix: str = "") -> float:
    """Seconds to write every batch's reports (subject column: ``ids``) and spend rows with the
    bare driver, into tables named with ``suffix``."""
    import datetime
    import sqlite3

    sqlite = url.startswith("sqlite")
    if sqlite:
        conn: Any = sqlite3.connect(url.split("///", 1)[1], timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # privcal's own setting
    else:
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(url)
        conn = psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database,
                               password=u.password, options=u.query.get("options"))
    for ddl in _RAW_DDL:
        conn.execute(ddl.format(t=suffix, ts="TIMESTAMPTZ" if not sqlite else "DATETIME"))
    conn.commit()
    ts = datetime.datetime.now(datetime.UTC).isoformat()
    t = time.perf_counter()
    for k, start in enumerate(range(0, ids.size, batch), start=1):
        subj = ids[start:start + batch].tolist()
        vals = bits[start:start + batch].astype(str).tolist()
        if sqlite:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO raw_reports{suffix} VALUES (1, ?, 0, ?, ?, {k})",
                             ((a, b, ts) for a, b in zip(subj, vals, strict=True)))
            conn.executemany(f"INSERT INTO raw_spend{suffix} VALUES (1, ?, 2000000000000)",
                             ((a,) for a in subj))
            conn.execute("COMMIT")
        else:
            with conn.cursor() as cur:
                with cur.copy(f"COPY raw_reports{suffix} FROM STDIN") as cp:
                    cp.write("".join(f"1\t{a}\t0\t{b}\t{ts}\t{k}\n"
                                     for a, b in zip(subj, vals, strict=True)))
                with cur.copy(f"COPY raw_spend{suffix} FROM STDIN") as cp:
                    cp.write("".join(f"1\t{a}\t2000000000000\n" for a in subj))
            conn.commit()
    dt = time.perf_counter() - t
    conn.close()
    return dt


def _bench(url: str, backend: str, n: int, batch: int) -> list[Row]:
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("bench", epsilon=1, subject_epsilon=10)
    rounds = 10
    info = S.open_session(acct, "ldp-score", dataset="bench", alpha=0.1, epsilon=2,
                          rounds=rounds, group_size=n // rounds, lower=0, upper=1)
    gen = np.random.default_rng(0)
    ids = np.char.add("user-", np.arange(n).astype(str))
    bits = gen.integers(0, 2, n)
    # the round each report answers: reports arrive in order, group_size to a round
    answers = np.arange(n) // (n // rounds)
    rows = []
    times = []
    t0 = time.perf_counter()
    status = info
    for start in range(0, n, batch):
        t = time.perf_counter()
        r = S.submit_reports(acct, info.id, ids[start:start + batch], bits[start:start + batch],
                             answers[start:start + batch])
        times.append(time.perf_counter() - t)
        status = r.session
        if status.status != "open":
            break
    total = time.perf_counter() - t0
    stored = status.total_reports
    pseud = led.pseudonyms(ids[:stored].tolist())  # what privcal stored (before the clock)
    raw = _raw(url, pseud, bits[:stored], batch)
    raw_ids = _raw(url, ids[:stored], bits[:stored], batch, "_ids")
    rows.append({"backend": backend,
                 "measurement": f"{stored:,} reports in {len(times)} batches of {batch:,}",
                 "result": f"{total:.1f} s ({stored / total:,.0f} reports/s; batch median "
                           f"{np.median(times):.2f} s, max {max(times):.2f} s; "
                           f"status {status.status}); raw {raw:.1f} s, ratio {total / raw:.2f}; "
                           f"raw ids {raw_ids:.1f} s, ratio {total / raw_ids:.2f}"})
    if status.status == "open":
        t = time.perf_counter()
        r = S.submit_reports(acct, info.id, ids[:batch], bits[:batch],
                             np.full(batch, status.round))
        rows.append({"backend": backend,
                     "measurement": f"batch of {batch:,} already-reported subjects",
                     "result": f"{time.perf_counter() - t:.2f} s (accepted {r.accepted})"})
    t = time.perf_counter()
    v = acct.verify()
    rows.append({"backend": backend, "measurement": f"audit verify ({v.entries} entries)",
                 "result": f"{time.perf_counter() - t:.2f} s"})
    led.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reports", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--pg", default=PG_DEFAULT)
    args = ap.parse_args()
    print_table(run_backends(partial(_bench, n=args.reports, batch=args.batch), args.pg))


if __name__ == "__main__":
    main()
