"""Collection-session ingestion: 10⁶ LDP-CP-S reports submitted in batches, SQLite and PostgreSQL.

    python bench/ingest_bench.py [--reports 1000000] [--batch 50000] [--pg URL]

An ldp-score session with T = 10 rounds of n' = reports/10 users; each batch is
``submit_reports`` (one transaction: filters, per-subject charge, bulk insert,
advance). Two extra batches measure rejection: one of already-reported subjects
(entirely rejected, nothing written) and one twice the size the round needs.
PostgreSQL runs in a scratch schema of --pg (default $PRIVCAL_TEST_DATABASE_URL).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
from _db import PG_DEFAULT, Row, print_table, run_backends  # bench/_db.py

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.storage import Ledger


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
    rows = []
    times = []
    t0 = time.perf_counter()
    status = info
    for start in range(0, n, batch):
        t = time.perf_counter()
        r = S.submit_reports(acct, info.id, ids[start:start + batch], bits[start:start + batch])
        times.append(time.perf_counter() - t)
        status = r.session
        if status.status != "open":
            break
    total = time.perf_counter() - t0
    stored = status.total_reports
    rows.append({"backend": backend,
                 "measurement": f"{stored:,} reports in {len(times)} batches of {batch:,}",
                 "result": f"{total:.1f} s ({stored / total:,.0f} reports/s; batch median "
                           f"{np.median(times):.2f} s, max {max(times):.2f} s; "
                           f"status {status.status})"})
    if status.status == "open":
        t = time.perf_counter()
        r = S.submit_reports(acct, info.id, ids[:batch], bits[:batch])
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
