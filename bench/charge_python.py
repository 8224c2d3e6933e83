"""The Python around a SQLite charge: ``Accountant.charge`` against its own SQL run bare.

    python bench/charge_python.py [--rounds 7] [--n 500]

Companion of ``charge_cpu.py`` (issue 11). On a shared machine the CPU time of one charge
moves by ±30 % from one minute to the next, more than the Python this measures; so both
sides run in the same process, on the same ledger file and driver connection, alternating
in rounds: a warm zCDP ``Accountant.charge`` and the *floor* — the charge's seven
statements (BEGIN IMMEDIATE, the dataset row with the audit head, the totals UPDATE, the
charge INSERT, the entry INSERT, the head UPDATE, COMMIT) with precomputed parameters and
one SHA-256, no other Python. The file is opened with ``PRAGMA synchronous=OFF`` so that
neither side waits for the disk. It prints the best round's CPU per operation of each
(``time.process_time``), their difference (the Python of a charge, in µs) and their ratio,
which stays put when the whole machine slows down.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.storage import Ledger

#: a charge entry's payload up to its seq (the floor's: its length is a real one's)
_PREFIX = ('{"data":{"charge_id":1,"created_at":"2026-01-01T00:00:00.000000Z","dataset":"z",'
           '"dataset_id":1,"delta":null,"eps0":null,"epsilon":null,"idempotency_key":null,'
           '"notion":"zcdp","purpose":null,"requester":null,"rho":"0.000001","scope":"dataset",'
           '"subjects_accepted":null,"subjects_rejected":null},"kind":"charge","seq":')


def _ledger(path: str) -> tuple[Accountant, Any]:
    """A warm ledger at ``path`` without fsync, and the driver connection its charges hold."""
    led = Ledger(f"sqlite:///{path}")
    led.upgrade()

    @event.listens_for(led.engine, "connect")
    def _no_sync(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA synchronous=OFF")

    led.engine.dispose()
    acct = Accountant(led)
    acct.create_dataset("z", rho=10**6)
    for _ in range(300):
        acct.charge("z", ZCDP(rho="0.000001"))
    (held,) = led.held_connections()
    drv = held.connection.driver_connection
    assert drv.execute("PRAGMA synchronous").fetchone()[0] == 0
    return acct, drv


def _floor(acct: Accountant, drv: Any) -> Callable[[], None]:
    """One charge's statements on ``drv``, bare (see the module docstring)."""
    q = acct.ledger.hot_sql
    n = len(q.dataset.names)
    row = [1, "dataset", "zcdp", None, None, "0.000001", None, None, None, None, None, None,
           "2026-01-01 00:00:00.000000", None, None]

    def run() -> None:
        drv.execute("BEGIN IMMEDIATE")
        got = drv.execute(q.lock_dataset, ("z",)).fetchone()
        seq, head = got[n], got[n + 1]
        drv.execute(q.count_spent, ("0", "0", "0.5", "0", "0", 1))
        drv.execute(q.insert_charge, row).fetchone()
        payload = f"{_PREFIX}{seq + 1}}}"
        new = hashlib.sha256(payload.encode()).hexdigest()
        drv.execute(q.entry, (seq + 1, "charge", payload, head, new))
        drv.execute(q.move_head, (seq + 1, new, seq, head))
        drv.commit()

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (best is kept)")
    ap.add_argument("--n", type=int, default=500, help="operations per round and side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        acct, drv = _ledger(f"{tmp}/ledger.sqlite")
        cost = ZCDP(rho="0.000001")
        sides: dict[str, Callable[[], Any]] = {
            "charge": lambda: acct.charge("z", cost), "floor": _floor(acct, drv)}
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(args.rounds):
            for name, op in sides.items():
                t0 = time.process_time()
                for _ in range(args.n):
                    op()
                best[name] = min(best[name], (time.process_time() - t0) / args.n)
        acct.ledger.close()
    charge, floor = best["charge"] * 1e6, best["floor"] * 1e6
    print(f"CPU per operation (best of {args.rounds} rounds of {args.n}): "
          f"Accountant.charge {charge:.1f} µs, its statements bare {floor:.1f} µs; "
          f"Python {charge - floor:.1f} µs, ratio {charge / floor:.2f}")


if __name__ == "__main__":
    main()
