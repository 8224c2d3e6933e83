"""Time of loading a release checked against its audit entry, as the log grows (red team 17, R7).

    python bench/release_check_bench.py [--entries 100000,1000000] [--pg-entries 100000]
                                        [--repeats 30] [--pg URL]

For each size N: a ledger with three releases, then N entries of kind ``charge`` (a real
charge's payload, renumbered; bulk-inserted, so the chain past them does not verify — the
check being timed does not walk it), then the median wall time of ``Accountant.release(id)``
(checked: the row compared with the entry that recorded it,
:func:`privcal.storage.logged_rows.check_release_logged`) and of ``release(id,
checked=False)``, and their difference: the check's own cost. Before migration 0011 the
entry was found by a scan of the whole log; since, by an index probe. Run it against
another checkout with ``PYTHONPATH=<checkout>`` to compare.

PostgreSQL (``--pg`` or $PRIVCAL_TEST_DATABASE_URL) runs in a scratch schema, dropped
afterwards; the planner works from whatever statistics autovacuum has gathered (no ANALYZE).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
from _db import PG_DEFAULT, Row, print_table, run_backends  # bench/_db.py
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.storage import Ledger

_BATCH = 50_000


def _fill(ledger: Ledger, n: int) -> None:
    """Append ``n`` charge entries after the head (copies of the last charge's payload)."""
    with ledger.engine.begin() as conn:
        seq, payload, h = conn.execute(text(
            "SELECT seq, payload, entry_hash FROM audit_log WHERE kind = 'charge' "
            "ORDER BY seq DESC LIMIT 1")).one()
        head = conn.execute(text("SELECT seq FROM audit_head WHERE id = 1")).scalar_one()
        prefix = payload[: -len(f"{seq}}}")]
        for start in range(head + 1, head + n + 1, _BATCH):
            rows = [{"s": s, "p": f"{prefix}{s}}}", "h": h}
                    for s in range(start, min(start + _BATCH, head + n + 1))]
            conn.execute(text("INSERT INTO audit_log (seq, kind, payload, prev_hash, "
                              "entry_hash) VALUES (:s, 'charge', :p, :h, :h)"), rows)
        conn.execute(text("UPDATE audit_head SET seq = :s WHERE id = 1"), {"s": head + n})


def _median_ms(f: Any, repeats: int) -> float:
    f()  # warm
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _bench(url: str, backend: str, sizes: list[int], repeats: int) -> list[Row]:
    rows: list[Row] = []
    for n in sizes:
        ledger = Ledger(url)
        ledger.upgrade()
        acct = Accountant(ledger)
        name = f"d{n}"
        acct.create_dataset(name, rho=10, allow_nonprivate=True)
        scores = np.random.default_rng(0).random(1000)
        ids = [acct.calibrate("split", dataset=name, scores=scores, alpha=0.1).id
               for _ in range(3)]
        acct.charge(name, ZCDP(rho="0.001"))
        with ledger.engine.connect() as conn:
            head = conn.execute(text("SELECT seq FROM audit_head WHERE id = 1")).scalar_one()
        t = time.perf_counter()
        _fill(ledger, n)
        fill_s = time.perf_counter() - t
        rid = ids[1]
        checked = _median_ms(lambda: acct.release(rid), repeats)  # noqa: B023
        unchecked = _median_ms(lambda: acct.release(rid, checked=False), repeats)  # noqa: B023
        what = f"{n:.0e} entries (filled in {fill_s:.0f} s)"
        rows.append({"backend": backend, "measurement": f"release(id), {what}",
                     "result": f"{checked:.2f} ms (unchecked {unchecked:.2f} ms, check "
                               f"{checked - unchecked:.2f} ms)"})
        with ledger.engine.begin() as conn:  # the next size starts from the log before
            conn.execute(text("DELETE FROM audit_log WHERE seq > :s"), {"s": head})
            conn.execute(text("UPDATE audit_head SET seq = :s WHERE id = 1"), {"s": head})
        ledger.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", default="100000,1000000", help="SQLite log sizes")
    ap.add_argument("--pg-entries", default="100000", help="PostgreSQL log sizes")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--pg", default=PG_DEFAULT)
    a = ap.parse_args()
    sizes = {"sqlite": [int(x) for x in a.entries.split(",")],
             "postgresql": [int(x) for x in a.pg_entries.split(",")]}
    print_table(run_backends(lambda url, b: _bench(url, b, sizes[b], a.repeats), a.pg))


if __name__ == "__main__":
    main()
