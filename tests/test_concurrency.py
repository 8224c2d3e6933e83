"""8 processes racing 50 charges each against one dataset, on SQLite and on PostgreSQL."""

from __future__ import annotations

import multiprocessing as mp
from decimal import Decimal
from typing import Any

from sqlalchemy import text

PROCS = 8
PER_PROC = 50


def _worker(url: str, worker: int, keyed: bool, out: Any) -> None:
    # each process opens its own ledger: engines and pools must not cross a process boundary
    from privcal.accountant import Accountant
    from privcal.costs import ZCDP
    from privcal.errors import BudgetRefused

    acct = Accountant(url)
    accepted: list[int] = []
    refused = 0
    errors: list[str] = []
    for i in range(PER_PROC):
        key = f"job-{i % 10}" if keyed else None
        try:
            # a keyed job's retries are its own requester's, from any process
            r = acct.charge("race", ZCDP(rho="0.03"), idempotency_key=key,
                            requester="jobs" if keyed else f"w{worker}")
            if not r.replayed:
                accepted.append(r.charge_id)
        except BudgetRefused:
            refused += 1
        except Exception as exc:  # anything else is a failure of the test
            errors.append(f"{type(exc).__name__}: {exc}")
    acct.ledger.close()
    out.put((worker, accepted, refused, errors))


def _race(url: str, *, keyed: bool) -> list[tuple[int, list[int], int, list[str]]]:
    # fork (not spawn: 8 fresh interpreters importing numpy/scipy cost ~20 s on 2 cores); the
    # caller disposes of its pool first so no connection is inherited by a child
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, w, keyed, q)) for w in range(PROCS)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_racing_charges_never_exceed_the_cap(
    accountant: Any, ledger_url: str
) -> None:
    accountant.create_dataset("race", rho=1)
    accountant.ledger.engine.dispose()
    results = _race(ledger_url, keyed=False)
    assert all(not errs for *_, errs in results), [errs for *_, errs in results if errs]
    accepted = sorted(cid for _, ids, _, _ in results for cid in ids)
    refused = sum(r for _, _, r, _ in results)
    assert len(accepted) + refused == PROCS * PER_PROC
    # ⌊1 / 0.03⌋ = 33 charges fit; the ledger is serialised, so exactly those are accepted
    assert len(accepted) == 33 and len(set(accepted)) == 33
    rep = accountant.budget("race")
    assert rep.spent == {"rho": Decimal("0.99")} and rep.spent["rho"] <= rep.cap["rho"]
    with accountant.ledger.engine.connect() as conn:
        in_db = sorted(conn.execute(text("SELECT id FROM charges")).scalars())
    assert in_db == accepted
    v = accountant.ledger.verify()
    assert (v.entries, v.charges) == (34, 33)


def test_racing_retries_with_shared_keys_are_recorded_once(
    accountant: Any, ledger_url: str
) -> None:
    accountant.create_dataset("race", rho=10)
    accountant.ledger.engine.dispose()
    results = _race(ledger_url, keyed=True)
    assert all(not errs for *_, errs in results), [errs for *_, errs in results if errs]
    accepted = [cid for _, ids, _, _ in results for cid in ids]
    assert len(accepted) == 10 == len(set(accepted))  # 10 distinct keys, each charged once
    assert accountant.budget("race").spent == {"rho": Decimal("0.3")}
    assert accountant.ledger.verify().charges == 10


def _upgrader(url: str, out: Any) -> None:
    from privcal.storage import Ledger

    try:
        led = Ledger(url)
        out.put(led.upgrade())
        led.close()
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_upgrades_are_serialised(ledger_url: str) -> None:
    """Four processes upgrading one empty ledger: one migrates, the others find it done."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_upgrader, args=(ledger_url, q)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    from privcal.storage import Ledger

    led = Ledger(ledger_url)
    assert results == [led.head_revision()] * 4
    assert led.verify().entries == 0
    with led.engine.connect() as conn:  # the head row was inserted exactly once
        assert conn.execute(text("SELECT count(*) FROM audit_head")).scalar_one() == 1


def _dataset_worker(url: str, worker: int, out: Any) -> None:
    from privcal.accountant import Accountant
    from privcal.costs import ZCDP

    acct = Accountant(url)
    errors: list[str] = []
    ids: list[int] = []
    for _ in range(PER_PROC):
        try:
            ids.append(acct.charge(f"d{worker}", ZCDP(rho="0.01")).charge_id)
        except Exception as exc:  # anything is a failure of the test
            errors.append(f"{type(exc).__name__}: {exc}")
    acct.ledger.close()
    out.put((worker, ids, errors))


def test_charges_to_different_datasets_keep_one_gap_free_log(
    accountant: Any, ledger_url: str
) -> None:
    """8 processes, one dataset each: every charge lands, and the audit log (appended last,
    under the head lock only for the append and commit) is one verifiable sequence."""
    for w in range(PROCS):
        accountant.create_dataset(f"d{w}", rho=10)
    accountant.ledger.engine.dispose()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_dataset_worker, args=(ledger_url, w, q)) for w in range(PROCS)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(not errs for *_, errs in results), [errs for *_, errs in results if errs]
    ids = [cid for _, got, _ in results for cid in got]
    assert len(ids) == len(set(ids)) == PROCS * PER_PROC
    for w in range(PROCS):
        assert accountant.budget(f"d{w}").spent == {"rho": Decimal("0.5")}
    v = accountant.ledger.verify()
    assert (v.entries, v.charges) == (PROCS + PROCS * PER_PROC, PROCS * PER_PROC)
    with accountant.ledger.engine.connect() as conn:
        seqs = conn.execute(text("SELECT seq FROM audit_log ORDER BY seq")).scalars().all()
    assert seqs == list(range(1, PROCS + PROCS * PER_PROC + 1))
