"""Ledger throughput: charges/s and a 10⁶-subject local-DP batch, on SQLite and PostgreSQL.

    python bench/ledger_bench.py [--charges 500] [--subjects 1000000] [--pg URL]

PostgreSQL runs in a scratch schema of the database given by --pg (default:
$PRIVCAL_TEST_DATABASE_URL), dropped afterwards; without either it is skipped.
Prints one table row per (backend, measurement).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
from _db import PG_DEFAULT, Row, print_table, run_backends  # bench/_db.py

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.storage import Ledger


def _bench(url: str, backend: str, n_charges: int, n_subjects: int) -> list[Row]:
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("bench", rho=10**6, subject_epsilon=10)
    acct.charge("bench", ZCDP(rho=0.001))  # warm the pool and the schema check
    t = time.perf_counter()
    for _ in range(n_charges):
        acct.charge("bench", ZCDP(rho=0.001))
    dt = time.perf_counter() - t
    rows = [{"backend": backend, "measurement": f"{n_charges} sequential charges",
             "result": f"{n_charges / dt:.0f} charges/s ({1000 * dt / n_charges:.1f} ms each)"}]
    ids = np.arange(n_subjects)
    for label in ("new subjects", "existing subjects"):
        t = time.perf_counter()
        r = acct.charge_subjects("bench", 1, ids)
        dt = time.perf_counter() - t
        assert r.accepted == n_subjects
        rows.append({"backend": backend, "measurement": f"charge_subjects, {n_subjects:,} {label}",
                     "result": f"{dt:.1f} s"})
    t = time.perf_counter()
    v = led.verify()
    rows.append({"backend": backend, "measurement": f"audit verify ({v.entries} entries)",
                 "result": f"{time.perf_counter() - t:.2f} s"})
    led.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--charges", type=int, default=500)
    ap.add_argument("--subjects", type=int, default=1_000_000)
    ap.add_argument("--pg", default=PG_DEFAULT)
    args = ap.parse_args()
    print_table(run_backends(
        partial(_bench, n_charges=args.charges, n_subjects=args.subjects), args.pg))


if __name__ == "__main__":
    main()
